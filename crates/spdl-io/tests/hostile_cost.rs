//! Inputs and arguments whose cost comes from a header or a number rather than from the data: each is
//! refused from what it claims, before anything of that size is allocated, with an error naming the item,
//! and the limit itself is exact (at the limit passes, one above fails).
#![cfg(all(feature = "image", feature = "audio"))]

use spdl_buffer::{SharedAllocator, system_allocator};
use spdl_io::audio::{AudioBatchOptions, AudioOptions, decode_audio, decode_audio_batch, encode_wav_i16};
use spdl_io::image::{BatchDecoder, BatchOptions, ImageOptions, Transform, decode_image, load_image};
use spdl_io::{Error, MediaInput, ReadLimits, probe, read_file};

fn alloc() -> SharedAllocator {
    system_allocator()
}

/// A gray PNG of `w` x `h` zeros (deflates to almost nothing: an aspect-ratio bomb costs a few KB).
fn gray_png(w: u32, h: u32) -> Vec<u8> {
    let mut out = Vec::new();
    {
        let mut enc = png::Encoder::new(&mut out, w, h);
        enc.set_color(png::ColorType::Grayscale);
        enc.set_compression(png::Compression::Fast);
        let mut writer = enc.write_header().unwrap_or_else(|e| panic!("{e}"));
        let data = vec![0u8; (w as usize) * (h as usize)];
        writer.write_image_data(&data).unwrap_or_else(|e| panic!("{e}"));
    }
    out
}

fn limit_of(e: &Error) -> Option<(&str, u64, u64)> {
    match e {
        Error::LimitExceeded { what, value, limit, .. } => Some((what.as_str(), *value, *limit)),
        Error::BatchItem { source, .. } => limit_of(source),
        _ => None,
    }
}

#[test]
fn aspect_ratio_bomb_is_refused_before_the_resize() {
    // 10,000,000 x 1: within the pixel limit, but resizing it to 224 x 224 would hold 10 M x 224 pixels
    // between the resampler's passes (6.7 GB).
    let png = gray_png(10_000_000, 1);
    assert!(png.len() < 100_000, "{}", png.len());
    let err = decode_image(&png, "wide.png", &ImageOptions::default(), &Transform::resize(224, 224), &alloc())
        .err()
        .unwrap_or_else(|| panic!("the bomb decoded"));
    let (what, value, _) = limit_of(&err).unwrap_or_else(|| panic!("{err}"));
    assert_eq!((what, value), ("resize intermediate pixels", 2_240_000_000));
    assert!(err.to_string().contains("wide.png"), "{err}");

    // In a non-strict batch it is one failed item; its neighbour decodes.
    let dec = BatchDecoder::new(BatchOptions { strict: false, threads: Some(2), ..BatchOptions::default() }, alloc())
        .unwrap_or_else(|e| panic!("{e}"));
    let good = gray_png(300, 200);
    let out =
        dec.decode(&[("wide.png", png.as_slice()), ("ok.png", good.as_slice())]).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(out.failures.len(), 1);
    assert_eq!((out.failures[0].batch_item().map(|(i, _)| i), out.failures[0].item()), (Some(0), Some("wide.png")));
}

#[test]
fn resize_intermediate_limit_is_exact() {
    let opts = ImageOptions { max_pixels: 10_000, ..ImageOptions::default() };
    // 1000 x 1 to 10 x 10: the intermediate is 1000 x 10 = 10,000 pixels: at the limit.
    let at = gray_png(1000, 1);
    let buf = decode_image(&at, "at.png", &opts, &Transform::resize(10, 10), &alloc());
    assert_eq!(buf.map(|b| b.shape().to_vec()).ok(), Some(vec![10, 10, 3]));
    let above = gray_png(1001, 1);
    let err = decode_image(&above, "above.png", &opts, &Transform::resize(10, 10), &alloc()).err();
    let err = err.unwrap_or_else(|| panic!("decoded above the limit"));
    assert_eq!(limit_of(&err), Some(("resize intermediate pixels", 10_010, 10_000)));
}

#[test]
fn requested_output_size_is_bounded() {
    let png = gray_png(64, 48);
    // 65535 x 65535 is 4.3 G pixels (12.9 GB of RGB): refused as an argument, before decoding.
    let err = decode_image(&png, "small.png", &ImageOptions::default(), &Transform::resize(65535, 65535), &alloc());
    assert!(matches!(err, Err(Error::InvalidOptions(ref m)) if m.contains("65535x65535")), "{err:?}");
    assert!(
        BatchDecoder::new(BatchOptions { transform: Transform::resize(65535, 65535), ..Default::default() }, alloc())
            .is_err()
    );
    // At the limit it is allowed.
    let opts = ImageOptions { max_pixels: 100 * 100, ..ImageOptions::default() };
    assert!(decode_image(&png, "small.png", &opts, &Transform::resize(100, 100), &alloc()).is_ok());
    assert!(decode_image(&png, "small.png", &opts, &Transform::resize(101, 100), &alloc()).is_err());
}

#[test]
fn batch_buffer_larger_than_the_budget_is_refused() {
    // 2^20 slots of 224 x 224 x 3 f32 is 630 GB: refused before the buffer is allocated.
    let dec = BatchDecoder::new(
        BatchOptions { normalize: Some(spdl_io::image::Normalize::imagenet()), ..BatchOptions::default() },
        alloc(),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let items: Vec<(String, Vec<u8>)> = (0..1 << 20).map(|i| (format!("{i}.png"), Vec::new())).collect();
    let err = dec.decode(&items).err().unwrap_or_else(|| panic!("allocated the batch"));
    assert_eq!(limit_of(&err).map(|l| l.0), Some("batch buffer bytes"), "{err}");
}

fn mkfifo(path: &std::path::Path) {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap_or_default();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
}

#[test]
fn special_files_are_refused_at_every_path_entry_point() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let fifo = dir.path().join("pipe.jpg");
    mkfifo(&fifo);
    let zero = dir.path().join("zero.wav");
    std::os::unix::fs::symlink("/dev/zero", &zero).unwrap_or_else(|e| panic!("{e}"));
    let t = Transform::resize(8, 8);
    for path in [&fifo, &zero] {
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        let errs = [
            load_image(path, &ImageOptions::default(), &t, &alloc()).err(),
            BatchDecoder::new(BatchOptions { strict: true, ..Default::default() }, alloc())
                .and_then(|d| d.load(&[path]))
                .err(),
            decode_audio(path.as_path(), &AudioOptions::default(), &alloc()).err(),
            probe(MediaInput::from(path)).err(),
        ];
        for e in errs {
            let msg = e.map(|e| e.to_string()).unwrap_or_else(|| panic!("{name} was accepted"));
            assert!(msg.contains(name) && msg.contains("not a regular file"), "{msg}");
            assert!(!msg.contains("empty input"), "{msg}");
        }
    }
    // Opted in with a byte limit, /dev/zero is read up to it and refused.
    let opt_in = ReadLimits { max_bytes: 1 << 20, allow_special_files: true };
    let err = read_file(&zero, &opt_in).err().map(|e| e.to_string()).unwrap_or_default();
    assert!(err.contains("file bytes"), "{err}");
}

#[test]
fn resample_bomb_is_refused_from_the_header() {
    // 16 frames declared at 1 Hz, resampled to 44.1 kHz: rubato's FFT would be 45 M points per chunk.
    let wav = encode_wav_i16(&[0i16; 16], 1, 1);
    assert!(wav.len() < 100);
    let opts = AudioOptions { sample_rate: Some(44_100), ..AudioOptions::default() };
    let err = decode_audio(MediaInput::bytes(&wav, "one-hz.wav"), &opts, &alloc()).err();
    let err = err.unwrap_or_else(|| panic!("resampled the bomb"));
    assert!(limit_of(&err).is_some_and(|l| l.0.starts_with("resampler bytes")), "{err}");
    assert!(err.to_string().contains("one-hz.wav"), "{err}");
    // Ordinary conversions stay far inside the limit.
    for (from, to) in [(8_000, 768_000), (44_100, 48_000), (48_000, 16_000), (44_099, 44_100)] {
        let wav = encode_wav_i16(&vec![0i16; 2000], 1, from);
        let opts = AudioOptions { sample_rate: Some(to), ..AudioOptions::default() };
        let r = decode_audio(MediaInput::bytes(&wav, "ok.wav"), &opts, &alloc());
        assert!(r.is_ok(), "{from} -> {to}: {:?}", r.err());
    }
}

#[test]
fn audio_batch_length_is_bounded_before_the_buffer() {
    let wav = encode_wav_i16(&[0i16; 800], 2, 8000);
    let inputs = [MediaInput::bytes(&wav, "a.wav"), MediaInput::bytes(&wav, "b.wav")];
    let opts = AudioBatchOptions { num_frames: 1_000_000_000, strict: false, ..AudioBatchOptions::default() };
    let err = decode_audio_batch(&inputs, &opts, &alloc()).err();
    assert!(matches!(err, Some(Error::InvalidOptions(ref m)) if m.contains("max_samples")), "{err:?}");
}
