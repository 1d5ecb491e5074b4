//! `spdl_io::probe` on arbitrary bytes: it must return, never panic or hang.
#![no_main]

use libfuzzer_sys::fuzz_target;
use spdl_io::MediaInput;

fuzz_target!(|data: &[u8]| {
    let _ = spdl_io::probe(MediaInput::bytes(data, "fuzz"));
});
