//! `spdl_io::image::BatchDecoder` (non-strict, normalized NCHW) on a batch of a good image, the fuzzed bytes
//! and the fuzzed bytes again: it must return a batch whose good slot is intact, never panic.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use spdl_buffer::{Layout, system_allocator};
use spdl_io::image::{BatchDecoder, BatchOptions, ImageOptions, Normalize, Transform};

/// A valid 2x2 gray PNG (the good neighbour).
const GOOD: &[u8] = &[
    0x89, 0x50, 0x4E, 0x47, 0x0D, 0x0A, 0x1A, 0x0A, 0x00, 0x00, 0x00, 0x0D, 0x49, 0x48, 0x44, 0x52, 0x00, 0x00, 0x00,
    0x02, 0x00, 0x00, 0x00, 0x02, 0x08, 0x00, 0x00, 0x00, 0x00, 0x57, 0xDD, 0x52, 0xF8, 0x00, 0x00, 0x00, 0x0E, 0x49,
    0x44, 0x41, 0x54, 0x78, 0x9C, 0x63, 0x10, 0x50, 0x60, 0x30, 0x70, 0x00, 0x00, 0x01, 0x76, 0x00, 0xA1, 0xEC, 0x30,
    0x8A, 0xF4, 0x00, 0x00, 0x00, 0x00, 0x49, 0x45, 0x4E, 0x44, 0xAE, 0x42, 0x60, 0x82,
];

fn decoder() -> &'static BatchDecoder {
    static DEC: OnceLock<BatchDecoder> = OnceLock::new();
    DEC.get_or_init(|| {
        let opts = BatchOptions {
            transform: Transform::random_resized_crop(8, 6, 1),
            layout: Layout::Nchw,
            normalize: Some(Normalize::imagenet()),
            strict: false,
            threads: Some(1),
            image: ImageOptions { max_pixels: 4 << 20, ..ImageOptions::default() },
        };
        BatchDecoder::new(opts, system_allocator()).unwrap_or_else(|e| panic!("valid options: {e}"))
    })
}

fuzz_target!(|data: &[u8]| {
    let items = [("good", GOOD), ("fuzz-a", data), ("fuzz-b", data)];
    if let Ok(out) = decoder().decode(&items) {
        let good_failed = out.failures.iter().any(|f| f.batch_item().map(|(i, _)| i) == Some(0));
        assert!(!good_failed, "the good image failed: {:?}", out.failures);
    }
});
