//! `spdl_io::image::image_info` (header only) on arbitrary bytes: it must return, never panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = spdl_io::image::image_info(data, "fuzz");
});
