//! `spdl_source::dataset::ShardReader` (WebDataset tar shards) on arbitrary bytes: every sample or error is
//! returned, the iteration ends, nothing panics.
#![no_main]

use libfuzzer_sys::fuzz_target;
use spdl_source::dataset::ShardReader;

fuzz_target!(|data: &[u8]| {
    let mut reader = ShardReader::new(data, "fuzz.tar");
    if let Ok(samples) = reader.samples() {
        // A shard of n bytes holds at most n / 512 members: the iteration must end well before this bound.
        for sample in samples.take(data.len() / 512 + 2) {
            if let Ok(s) = sample {
                assert!(!s.files.is_empty());
            }
        }
    }
});
