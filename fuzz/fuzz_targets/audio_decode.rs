//! `spdl_io::audio::decode_audio` on arbitrary bytes (native rate, then mono resampled to 16 kHz with a time
//! window): it must return, never panic or hang. The sample limit is lowered to stay under the fuzzer's memory
//! limit, as the default would in production.
#![no_main]

use libfuzzer_sys::fuzz_target;
use spdl_io::MediaInput;
use spdl_io::TimeWindow;
use spdl_io::audio::{AudioLimits, AudioOptions, ChannelSelect, decode_audio};

fuzz_target!(|data: &[u8]| {
    let alloc = spdl_buffer::system_allocator();
    let limits = AudioLimits { max_samples: 1 << 22, max_packets: 1 << 16, ..AudioLimits::default() };
    let opts = AudioOptions { limits: limits.clone(), ..AudioOptions::default() };
    let _ = decode_audio(MediaInput::bytes(data, "fuzz"), &opts, &alloc);
    let opts = AudioOptions {
        window: Some(TimeWindow::new(0.01, 0.2)),
        sample_rate: Some(16_000),
        channels: ChannelSelect::Mono,
        limits,
        ..AudioOptions::default()
    };
    let _ = decode_audio(MediaInput::bytes(data, "fuzz.wav"), &opts, &alloc);
});
