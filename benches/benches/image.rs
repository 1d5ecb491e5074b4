//! spdl-io image benchmarks on synthetic photo-like JPEGs (quality 90, 4:2:0, ~500x375 like ImageNet):
//! single-image decode, decode + resize, reduced-scale (DCT-domain) JPEG decode vs full decode + resize,
//! and batch decode of 32 images.
//!
//! `cargo bench -p spdl-benches --bench image` (results: docs/benchmarks.md, "spdl-io images").

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use spdl_buffer::{Layout, SharedAllocator, system_allocator};
use spdl_io::image::{BatchOptions, ImageOptions, Normalize, Transform, decode_image, decode_image_batch};
use spdl_io::synth;

fn jpeg(seed: u64, w: u32, h: u32) -> Vec<u8> {
    synth::encode_jpeg(&synth::photo(seed, w, h), w, h, synth::JPEG_QUALITY, false).expect("encode")
}

fn opts(reduced: bool) -> ImageOptions {
    ImageOptions { reduced_scale_jpeg: reduced, ..ImageOptions::default() }
}

fn single(c: &mut Criterion) {
    let alloc: SharedAllocator = system_allocator();
    let img = jpeg(1, 500, 375);
    let mut g = c.benchmark_group("image/single_500x375");
    g.throughput(Throughput::Elements(1));
    g.bench_function("decode", |b| {
        b.iter(|| decode_image(black_box(&img), "x.jpg", &opts(true), &Transform::None, &alloc).expect("decode"))
    });
    for (name, t) in
        [("decode_resize_224", Transform::resize(224, 224)), ("decode_imagenet_eval", Transform::imagenet_eval())]
    {
        g.bench_function(name, |b| {
            b.iter(|| decode_image(black_box(&img), "x.jpg", &opts(true), &t, &alloc).expect("decode"))
        });
    }
    g.finish();
}

/// Reduced-scale decode (jpeg-decoder's 1/2, 1/4 IDCT) + resize vs full zune-jpeg decode + resize.
fn reduced_scale(c: &mut Criterion) {
    let alloc: SharedAllocator = system_allocator();
    let mut g = c.benchmark_group("image/reduced_scale");
    g.throughput(Throughput::Elements(1));
    // The first two shrink at least 4x and use a 1/2 decode, the third 8x (1/4); the last shrinks 3.3x,
    // below the threshold, so both runs take the same full-decode path.
    let cases = [
        ("2000x1500_to_224", 2000, 1500, Transform::resize(224, 224)),
        ("1000x750_to_112", 1000, 750, Transform::resize(112, 112)),
        ("2000x1500_to_112", 2000, 1500, Transform::resize(112, 112)),
        ("1000x750_to_224", 1000, 750, Transform::resize(224, 224)),
    ];
    for (name, w, h, t) in cases {
        let img = jpeg(2, w, h);
        for reduced in [false, true] {
            let id = BenchmarkId::new(if reduced { "reduced" } else { "full" }, name);
            g.bench_with_input(id, &img, |b, img| {
                b.iter(|| decode_image(black_box(img), "x.jpg", &opts(reduced), &t, &alloc).expect("decode"))
            });
        }
    }
    g.finish();
}

fn batch(c: &mut Criterion) {
    let alloc: SharedAllocator = system_allocator();
    let items: Vec<(String, Vec<u8>)> = (0..32u64)
        .map(|i| {
            let (w, h) = synth::photo_size(i);
            (format!("img_{i}.jpg"), jpeg(i, w, h))
        })
        .collect();
    let mut g = c.benchmark_group("image/batch32_224");
    g.throughput(Throughput::Elements(items.len() as u64));
    for threads in [1usize, 2] {
        let o =
            BatchOptions { transform: Transform::resize(224, 224), threads: Some(threads), ..BatchOptions::default() };
        g.bench_function(format!("nhwc_u8_threads{threads}"), |b| {
            b.iter(|| decode_image_batch(black_box(&items), &o, &alloc).expect("batch"))
        });
    }
    let o = BatchOptions {
        transform: Transform::imagenet_eval(),
        layout: Layout::Nchw,
        normalize: Some(Normalize::imagenet()),
        threads: Some(1),
        ..BatchOptions::default()
    };
    g.bench_function("nchw_f32_imagenet_eval_threads1", |b| {
        b.iter(|| decode_image_batch(black_box(&items), &o, &alloc).expect("batch"))
    });
    g.finish();
}

fn config() -> Criterion {
    Criterion::default()
        .sample_size(20)
        .warm_up_time(std::time::Duration::from_secs(1))
        .measurement_time(std::time::Duration::from_secs(4))
}

criterion_group! { name = benches; config = config(); targets = single, reduced_scale, batch }
criterion_main!(benches);
