//! The training transform: random resized crop plus horizontal flip, seeded by the item's key.
#![cfg(feature = "synth")]

use spdl_buffer::system_allocator;
use spdl_io::image::{BatchDecoder, BatchOptions, ImageFormat, Transform};

fn jpeg(w: u32, h: u32) -> Vec<u8> {
    spdl_io::synth::encode(&spdl_io::synth::photo(5, w, h), w, h, ImageFormat::Jpeg).unwrap_or_else(|e| panic!("{e}"))
}

fn with_flip(p: f64, seed: u64) -> Transform {
    match Transform::random_resized_crop(48, 40, seed) {
        Transform::RandomResizedCrop { width, height, scale, ratio, seed, filter, .. } => {
            Transform::RandomResizedCrop { width, height, scale, ratio, seed, hflip: p, filter }
        }
        other => other,
    }
}

#[test]
fn flip_mirrors_the_same_crop() {
    let img = jpeg(320, 240);
    let run = |t: Transform| {
        let dec = BatchDecoder::new(
            BatchOptions { transform: t, threads: Some(1), ..Default::default() },
            system_allocator(),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let out = dec.decode_keyed(&[("a.jpg", &img)], &[42]).unwrap_or_else(|e| panic!("{e}"));
        out.buffer.as_bytes().to_vec()
    };
    let (plain, flipped) = (run(with_flip(0.0, 9)), run(with_flip(1.0, 9)));
    assert_ne!(plain, flipped);
    for y in 0..40 {
        for x in 0..48 {
            let a = &plain[(y * 48 + x) * 3..][..3];
            let b = &flipped[(y * 48 + 47 - x) * 3..][..3];
            assert_eq!(a, b, "pixel ({x}, {y})");
        }
    }
    assert!(
        BatchDecoder::new(BatchOptions { transform: with_flip(1.5, 0), ..Default::default() }, system_allocator())
            .is_err()
    );
}

#[test]
fn keys_decide_the_crop_whatever_the_batch_and_threads() {
    let imgs: Vec<Vec<u8>> = (0..6).map(|i| jpeg(200 + 40 * i, 300 - 20 * i)).collect();
    let items: Vec<(String, &[u8])> =
        imgs.iter().enumerate().map(|(i, b)| (format!("{i}.jpg"), b.as_slice())).collect();
    let keys: Vec<u64> = (100..106).collect();
    let opts = |threads| BatchOptions {
        transform: Transform::imagenet_train(32, 3),
        threads: Some(threads),
        ..Default::default()
    };
    let whole = BatchDecoder::new(opts(3), system_allocator())
        .and_then(|d| d.decode_keyed(&items, &keys))
        .unwrap_or_else(|e| panic!("{e}"));
    // The same samples one by one, in reverse order, on one thread.
    let one = BatchDecoder::new(opts(1), system_allocator()).unwrap_or_else(|e| panic!("{e}"));
    for i in (0..6).rev() {
        let single = one.decode_keyed(&items[i..=i], &keys[i..=i]).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(single.buffer.outer_slot(0), whole.buffer.outer_slot(i), "item {i}");
    }
    assert!(one.decode_keyed(&items, &keys[..2]).is_err());
}
