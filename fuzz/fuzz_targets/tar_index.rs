//! `spdl_source::tar_index::index` (the in-memory TAR index behind `spdl_rs.io.iter_tarfile`) on arbitrary bytes:
//! it returns, every member it lists lies inside the input, and a member count is bounded by the headers there
//! is room for. The same bytes fed header by header to `TarParser` (as a stream reader does) never panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use spdl_source::tar_index::{BLOCK, HeaderStep, TarParser, index, is_zero};

fuzz_target!(|data: &[u8]| {
    let scanned = index(data);
    assert!(scanned.members.len() <= data.len() / BLOCK);
    for member in &scanned.members {
        let end = member.offset.checked_add(member.size).expect("member range overflows");
        assert!(end <= data.len(), "member {:?} ends at {end}, past {}", member.name, data.len());
        assert!(member.offset % BLOCK == 0, "member data starts inside a block");
    }
    let mut parser = TarParser::new();
    for (i, block) in data.chunks_exact(BLOCK).enumerate() {
        if is_zero(block) {
            continue;
        }
        if let Ok(HeaderStep::Meta { kind, .. }) = parser.header(block, (i * BLOCK) as u64) {
            let _ = parser.metadata(kind, block, (i * BLOCK) as u64);
        }
    }
});
