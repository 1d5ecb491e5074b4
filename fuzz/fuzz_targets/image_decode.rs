//! `spdl_io::image::decode_image` on arbitrary bytes, without and with a resize: it must return (an image or
//! an error), never panic, hang or allocate past the pixel limit. The limit is lowered so that a header that
//! claims a large image is refused before the fuzzer's memory limit, as the default limit would in production.
#![no_main]

use libfuzzer_sys::fuzz_target;
use spdl_io::image::{ImageOptions, Transform, decode_image};

fuzz_target!(|data: &[u8]| {
    let alloc = spdl_buffer::system_allocator();
    let opts = ImageOptions { max_pixels: 4 << 20, ..ImageOptions::default() };
    let _ = decode_image(data, "fuzz", &opts, &Transform::None, &alloc);
    let opts = ImageOptions { allow_truncated: true, exif_orientation: true, ..opts };
    let _ = decode_image(data, "fuzz", &opts, &Transform::resize(17, 9), &alloc);
});
