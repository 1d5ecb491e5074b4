//! Audio decoding on WAV files written by the test itself (no external tools): the fast path, windows,
//! resampling, channel handling, batching, limits, hostile headers, and the fast path against symphonia.
#![cfg(feature = "audio")]

use std::sync::Arc;

use spdl_buffer::{DType, HostAllocator, Layout, SharedAllocator, SystemAllocator, system_allocator};
use spdl_io::audio::{
    AudioBackend, AudioBatchOptions, AudioLayout, AudioLimits, AudioOptions, ChannelSelect, SampleType, decode_audio,
    decode_audio_batch, encode_wav_i16,
};
use spdl_io::{Error, MediaInput, StreamKind, TimeWindow, probe};

/// Stereo ramp: left = i, right = -i (as i16), at `rate`.
fn ramp_wav(frames: usize, rate: u32) -> Vec<u8> {
    let s: Vec<i16> = (0..frames).flat_map(|i| [(i % 30000) as i16, -((i % 30000) as i16)]).collect();
    encode_wav_i16(&s, 2, rate)
}

fn sine_wav(freq: f64, seconds: f64, rate: u32) -> Vec<u8> {
    let n = (seconds * f64::from(rate)) as usize;
    let s: Vec<i16> = (0..n)
        .map(|i| ((2.0 * std::f64::consts::PI * freq * i as f64 / f64::from(rate)).sin() * 16384.0).round() as i16)
        .collect();
    encode_wav_i16(&s, 1, rate)
}

fn alloc() -> SharedAllocator {
    system_allocator()
}

#[test]
fn wav_fast_path_is_exact() {
    let wav = ramp_wav(1000, 8000);
    let a = decode_audio(MediaInput::bytes(&wav, "ramp.wav"), &AudioOptions::default(), &alloc()).unwrap();
    assert_eq!(a.buffer.shape(), &[2, 1000]);
    assert_eq!((a.buffer.layout(), a.buffer.dtype()), (Layout::Ct, DType::F32));
    assert_eq!((a.sample_rate, a.frames, a.start_s), (8000, 1000, 0.0));
    assert_eq!((a.source.codec.as_str(), a.source.container.as_str()), ("pcm_s16le", "wav"));
    let v = a.buffer.as_slice::<f32>().unwrap();
    assert_eq!(v[999] * 32768.0, 999.0);
    assert_eq!(v[1000 + 999] * 32768.0, -999.0);

    let opts = AudioOptions { sample_type: SampleType::I16, layout: AudioLayout::Interleaved, ..Default::default() };
    let b = decode_audio(MediaInput::bytes(&wav, "ramp.wav"), &opts, &alloc()).unwrap();
    assert_eq!((b.buffer.shape(), b.buffer.layout()), (&[1000, 2][..], Layout::Tc));
    assert_eq!(&b.buffer.as_slice::<i16>().unwrap()[..6], &[0, 0, 1, -1, 2, -2]);
}

#[test]
fn window_reads_the_right_samples_from_a_file() {
    let dir = std::env::temp_dir().join(format!("spdl-io-audio-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("ramp.wav");
    std::fs::write(&path, ramp_wav(20_000, 10_000)).unwrap();
    let opts = AudioOptions { window: Some(TimeWindow::new(1.25, 0.5)), ..Default::default() };
    let a = decode_audio(path.as_path(), &opts, &alloc()).unwrap();
    assert_eq!((a.frames, a.start_s), (5000, 1.25));
    let v = a.buffer.as_slice::<f32>().unwrap();
    assert_eq!(v[0] * 32768.0, 12_500.0);
    assert_eq!(v[4999] * 32768.0, 17_499.0);
    // A window past the end is empty, one across the end is cut.
    let past = AudioOptions { window: Some(TimeWindow::new(5.0, 1.0)), ..Default::default() };
    assert_eq!(decode_audio(path.as_path(), &past, &alloc()).unwrap().frames, 0);
    let across = AudioOptions { window: Some(TimeWindow::from_start(1.5)), ..Default::default() };
    assert_eq!(decode_audio(path.as_path(), &across, &alloc()).unwrap().frames, 5000);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn pad_truncate_channels_and_mixdown() {
    let wav = ramp_wav(100, 8000);
    let input = MediaInput::bytes(&wav, "ramp.wav");
    let pad = AudioOptions { num_frames: Some(150), channels: ChannelSelect::Pick(vec![1]), ..Default::default() };
    let a = decode_audio(input, &pad, &alloc()).unwrap();
    assert_eq!((a.buffer.shape(), a.frames), (&[1, 150][..], 100));
    let v = a.buffer.as_slice::<f32>().unwrap();
    assert_eq!((v[99] * 32768.0, v[100], v[149]), (-99.0, 0.0, 0.0));
    let mono = AudioOptions { channels: ChannelSelect::Mono, num_frames: Some(10), ..Default::default() };
    let m = decode_audio(input, &mono, &alloc()).unwrap();
    assert_eq!(m.buffer.shape(), &[1, 10]);
    assert!(m.buffer.as_slice::<f32>().unwrap().iter().all(|&x| x == 0.0)); // (i + -i) / 2
    let dup = AudioOptions { channels: ChannelSelect::Pick(vec![0, 0, 1]), ..Default::default() };
    assert_eq!(decode_audio(input, &dup, &alloc()).unwrap().buffer.shape(), &[3, 100]);
    let bad = AudioOptions { channels: ChannelSelect::Pick(vec![2]), ..Default::default() };
    let e = decode_audio(input, &bad, &alloc()).unwrap_err();
    assert!(matches!(&e, Error::InvalidOptions(m) if m.contains("ramp.wav")), "{e}");
}

#[test]
fn resampled_length_is_exact_and_the_tone_survives() {
    let wav = sine_wav(440.0, 2.0, 44_100);
    for (rate, window) in [(16_000u32, None), (48_000, Some(TimeWindow::new(0.5, 1.0))), (8_000, None)] {
        let opts = AudioOptions { sample_rate: Some(rate), window, ..Default::default() };
        let a = decode_audio(MediaInput::bytes(&wav, "sine.wav"), &opts, &alloc()).unwrap();
        let seconds = window.map_or(2.0, |w| w.duration_s.unwrap());
        assert_eq!(a.frames, (seconds * f64::from(rate)) as usize, "{rate} Hz");
        assert_eq!(a.sample_rate, rate);
        let start = window.map_or(0.0, |w| w.start_s);
        let v = a.buffer.as_slice::<f32>().unwrap();
        // Compare with the analytic tone away from the edges (filter warm-up).
        let margin = rate as usize / 20;
        let err = (margin..v.len() - margin)
            .map(|i| {
                let t = start + i as f64 / f64::from(rate);
                (f64::from(v[i]) - 0.5 * (2.0 * std::f64::consts::PI * 440.0 * t).sin()).abs()
            })
            .fold(0.0, f64::max);
        assert!(err < 0.002, "{rate} Hz: max error {err}");
    }
}

#[test]
fn batch_pads_truncates_and_matches_single_decodes() {
    let wavs: Vec<Vec<u8>> = (1..=9).map(|k| ramp_wav(k * 300, 8000)).collect();
    let names: Vec<String> = (1..=9).map(|k| format!("clip{k}.wav")).collect();
    let inputs: Vec<MediaInput<'_>> = wavs.iter().zip(&names).map(|(w, n)| MediaInput::bytes(w, n)).collect();
    for threads in [Some(1), Some(3)] {
        let opts = AudioBatchOptions { num_frames: 1500, threads, ..Default::default() };
        let batch = decode_audio_batch(&inputs, &opts, &alloc()).unwrap();
        assert_eq!((batch.buffer.shape(), batch.buffer.layout()), (&[9, 2, 1500][..], Layout::Nct));
        assert_eq!(batch.frames, vec![300, 600, 900, 1200, 1500, 1500, 1500, 1500, 1500]);
        assert_eq!(batch.sample_rate, 8000);
        for (i, input) in inputs.iter().enumerate() {
            let single = AudioOptions { num_frames: Some(1500), ..Default::default() };
            let one = decode_audio(*input, &single, &alloc()).unwrap();
            assert_eq!(batch.buffer.outer_slot(i).unwrap(), one.buffer.as_bytes(), "clip {i}");
        }
    }
}

#[test]
fn batch_failures_strict_and_lenient() {
    let good = ramp_wav(100, 8000);
    let bad = b"RIFF\x10\0\0\0WAVEjunk".to_vec();
    let stereo_at_16k = ramp_wav(100, 16_000);
    let inputs = [
        MediaInput::bytes(&bad, "bad.wav"),
        MediaInput::bytes(&good, "good.wav"),
        MediaInput::bytes(&stereo_at_16k, "16k.wav"),
    ];
    let strict = AudioBatchOptions { num_frames: 50, ..Default::default() };
    let e = decode_audio_batch(&inputs, &strict, &alloc()).unwrap_err();
    assert!(matches!(&e, Error::BatchItem { index: 0, .. }), "{e}");
    assert!(spdl_report::error_chain(&e).contains("bad.wav"), "{e}");
    let lenient = AudioBatchOptions { strict: false, ..strict };
    let b = decode_audio_batch(&inputs, &lenient, &alloc()).unwrap();
    assert_eq!(b.sample_rate, 8000);
    assert_eq!(b.failures.iter().filter_map(|f| f.batch_item().map(|(i, _)| i)).collect::<Vec<_>>(), vec![0, 2]);
    let why = spdl_report::error_chain(&b.failures[1]);
    assert!(why.contains("16000 Hz"), "{why}");
    assert!(b.buffer.outer_slot(0).unwrap().iter().all(|&x| x == 0));
    assert!(b.buffer.outer_slot(1).unwrap().iter().any(|&x| x != 0));
    // With a target rate, the 16 kHz clip is resampled instead.
    let resampled =
        AudioBatchOptions { audio: AudioOptions { sample_rate: Some(8000), ..Default::default() }, ..lenient };
    let b = decode_audio_batch(&inputs, &resampled, &alloc()).unwrap();
    assert_eq!(b.failures.len(), 1);
    assert_eq!(b.frames[2], 50);
}

#[derive(Debug)]
struct Counting(std::sync::atomic::AtomicUsize);
impl HostAllocator for Counting {
    fn allocate(&self, layout: std::alloc::Layout) -> Result<spdl_buffer::Block, spdl_buffer::BufferError> {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        SystemAllocator.allocate(layout)
    }
    fn release(&self, block: spdl_buffer::Block) {
        SystemAllocator.release(block)
    }
    fn name(&self) -> &str {
        "counting"
    }
}

#[test]
fn batch_is_one_allocation_from_the_given_allocator() {
    let counting = Arc::new(Counting(Default::default()));
    let a: SharedAllocator = counting.clone();
    let wavs: Vec<Vec<u8>> = (0..4).map(|_| ramp_wav(1000, 8000)).collect();
    let inputs: Vec<MediaInput<'_>> = wavs.iter().map(|w| MediaInput::bytes(w, "x.wav")).collect();
    let b = decode_audio_batch(&inputs, &AudioBatchOptions { num_frames: 800, ..Default::default() }, &a).unwrap();
    assert_eq!(b.buffer.allocator().name(), "counting");
    assert_eq!(counting.0.load(std::sync::atomic::Ordering::SeqCst), 1);
}

#[test]
fn hostile_headers_and_limits() {
    let opts = AudioOptions::default();
    let e = decode_audio(MediaInput::bytes(b"", "empty.wav"), &opts, &alloc()).unwrap_err();
    assert!(matches!(e, Error::Empty { .. }), "{e}");
    let e = decode_audio(MediaInput::bytes(b"hello, not audio at all", "x.bin"), &opts, &alloc()).unwrap_err();
    assert!(matches!(e, Error::UnknownFormat { .. } | Error::Decode { .. }), "{e}");
    assert!(e.to_string().contains("x.bin"));
    // A WAV header claiming 0 channels, or a data chunk before fmt.
    let mut zero = ramp_wav(10, 8000);
    zero[22] = 0;
    let e = decode_audio(MediaInput::bytes(&zero, "zero.wav"), &opts, &alloc()).unwrap_err();
    assert!(matches!(&e, Error::Decode { item, .. } if item == "zero.wav"), "{e}");
    // A data chunk that claims 4 GiB in a 64-byte file: only what is there is read.
    let mut huge = ramp_wav(5, 8000);
    huge[40..44].copy_from_slice(&u32::MAX.to_le_bytes());
    assert_eq!(decode_audio(MediaInput::bytes(&huge, "huge.wav"), &opts, &alloc()).unwrap().frames, 5);
    // Limits name the item and the quantity.
    let small = AudioOptions { limits: AudioLimits { max_samples: 100, ..Default::default() }, ..Default::default() };
    let wav = ramp_wav(1000, 8000);
    let e = decode_audio(MediaInput::bytes(&wav, "long.wav"), &small, &alloc()).unwrap_err();
    assert!(matches!(&e, Error::LimitExceeded { item, what, .. } if item == "long.wav" && what == "samples"), "{e}");
    let e = decode_audio(
        MediaInput::bytes(&wav, "long.wav"),
        &AudioOptions { backend: AudioBackend::Symphonia, ..small },
        &alloc(),
    )
    .unwrap_err();
    assert!(matches!(&e, Error::LimitExceeded { what, .. } if what == "decoded samples"), "{e}");
    // Options that cannot work.
    let bad_window = AudioOptions { window: Some(TimeWindow::new(-1.0, 1.0)), ..Default::default() };
    assert!(matches!(decode_audio(MediaInput::bytes(&wav, "w"), &bad_window, &alloc()), Err(Error::InvalidOptions(_))));
    let bad_rate = AudioOptions { sample_rate: Some(0), ..Default::default() };
    assert!(matches!(decode_audio(MediaInput::bytes(&wav, "w"), &bad_rate, &alloc()), Err(Error::InvalidOptions(_))));
}

#[test]
fn fast_path_matches_symphonia() {
    let wav = sine_wav(1000.0, 0.5, 22_050);
    let input = MediaInput::bytes(&wav, "sine.wav");
    for window in [None, Some(TimeWindow::new(0.1, 0.2))] {
        let fast = decode_audio(input, &AudioOptions { window, ..Default::default() }, &alloc()).unwrap();
        let sym = AudioOptions { window, backend: AudioBackend::Symphonia, ..Default::default() };
        let slow = decode_audio(input, &sym, &alloc()).unwrap();
        assert!(slow.source.container.starts_with("wav"), "{}", slow.source.container);
        assert_eq!((fast.frames, fast.start_s), (slow.frames, slow.start_s), "{window:?}");
        assert_eq!(fast.buffer.as_bytes(), slow.buffer.as_bytes(), "{window:?}");
    }
}

#[test]
fn probe_reads_wav_headers() {
    let wav = ramp_wav(8000, 16_000);
    let info = probe(MediaInput::bytes(&wav, "p.wav")).unwrap();
    assert_eq!(info.streams.len(), 1);
    let s = &info.streams[0];
    assert_eq!(
        (s.kind, s.sample_rate, s.channels, s.duration_s),
        (StreamKind::Audio, Some(16_000), Some(2), Some(0.5))
    );
    assert_eq!(info.size_bytes, wav.len() as u64);
    assert!(matches!(probe(MediaInput::bytes(b"", "e")), Err(Error::Empty { .. })));
}

#[cfg(feature = "image")]
#[test]
fn probe_recognises_images_from_their_magic_bytes() {
    let mut png = Vec::new();
    image::RgbImage::new(7, 5).write_to(&mut std::io::Cursor::new(&mut png), image::ImageFormat::Png).unwrap();
    let info = probe(MediaInput::bytes(&png, "pic.bin")).unwrap();
    assert_eq!((info.format.as_str(), info.prober.as_str()), ("png", "image"));
    let s = &info.streams[0];
    assert_eq!((s.kind, s.width, s.height), (StreamKind::Image, Some(7), Some(5)));
}
