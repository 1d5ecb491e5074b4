//! Audio codecs and containers on media made by the `ffmpeg` CLI (a stereo tone: 440 Hz left, 1000 Hz
//! right, 3 s at 44.1 kHz): sample values, windows with seeking, resampling, probing, and damaged files.
//! Needs the `ffmpeg` CLI (`cargo xtask test` installs it); fails, never skips, without it.
#![cfg(feature = "cli-media-tests")]

mod audio_video_util;

use std::path::{Path, PathBuf};

use audio_video_util::*;
use spdl_buffer::system_allocator;
use spdl_io::audio::{
    AudioBackend, AudioBatchOptions, AudioLimits, AudioOptions, ChannelSelect, decode_audio, decode_audio_batch,
};
use spdl_io::{Error, MediaInput, StreamKind, TimeWindow, probe};

struct Case {
    name: &'static str,
    args: &'static [&'static str],
    lossless: bool,
    /// Decoded frames may exceed the source by encoder priming/padding (ADTS AAC keeps its priming; M4A skips
    /// it, as its edit list says, and keeps the end padding, as FFmpeg does).
    extra_frames: usize,
}

const CASES: &[Case] = &[
    Case { name: "s16.wav", args: &["-c:a", "pcm_s16le"], lossless: true, extra_frames: 0 },
    Case { name: "s24.wav", args: &["-c:a", "pcm_s24le"], lossless: true, extra_frames: 0 },
    Case { name: "s32.wav", args: &["-c:a", "pcm_s32le"], lossless: true, extra_frames: 0 },
    Case { name: "f32.wav", args: &["-c:a", "pcm_f32le"], lossless: true, extra_frames: 0 },
    Case { name: "u8.wav", args: &["-c:a", "pcm_u8"], lossless: false, extra_frames: 0 },
    Case { name: "tone.flac", args: &["-c:a", "flac"], lossless: true, extra_frames: 0 },
    Case { name: "tone.mp3", args: &["-c:a", "libmp3lame", "-b:a", "192k"], lossless: false, extra_frames: 1152 },
    Case { name: "tone.ogg", args: &["-c:a", "libvorbis", "-q:a", "6"], lossless: false, extra_frames: 0 },
    Case { name: "tone.aac", args: &["-c:a", "aac", "-b:a", "192k"], lossless: false, extra_frames: 3072 },
    Case { name: "tone.m4a", args: &["-c:a", "aac", "-b:a", "192k"], lossless: false, extra_frames: 3072 },
];

fn media(name: &str) -> PathBuf {
    let case = CASES.iter().find(|c| c.name == name).expect("known case");
    tone_file(&media_dir("audio_codecs"), case.name, case.args)
}

fn decode(path: &Path, opts: &AudioOptions) -> spdl_io::audio::Audio {
    decode_audio(path, opts, &system_allocator()).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn channel(a: &spdl_io::audio::Audio, ch: usize) -> Vec<f32> {
    let v = a.buffer.as_slice::<f32>().unwrap();
    let t = a.buffer.shape()[1];
    v[ch * t..(ch + 1) * t].to_vec()
}

/// Max |decoded - analytic| over the middle of the clip, where `start_s` is the time of frame 0.
fn max_error(x: &[f32], ch: usize, start_s: f64, rate: u32) -> f64 {
    let margin = x.len() / 10;
    (margin..x.len() - margin)
        .map(|i| (f64::from(x[i]) - tone(ch, start_s + i as f64 / f64::from(rate))).abs())
        .fold(0.0, f64::max)
}

#[test]
fn every_format_decodes_the_tone() {
    let total = (SECONDS * f64::from(RATE)) as usize;
    for case in CASES {
        let path = media(case.name);
        let a = decode(&path, &AudioOptions::default());
        assert_eq!(a.buffer.shape()[0], 2, "{}", case.name);
        assert_eq!(a.sample_rate, RATE, "{}", case.name);
        assert!(
            a.frames >= total - 1152 && a.frames <= total + case.extra_frames,
            "{}: {} frames, expected about {total}",
            case.name,
            a.frames
        );
        for ch in 0..2 {
            let x = channel(&a, ch);
            let freq = if ch == 0 { LEFT_HZ } else { RIGHT_HZ };
            // Frequency from zero crossings over the middle second, level from the RMS.
            let mid = &x[RATE as usize..2 * RATE as usize];
            let zc = zero_crossings(mid) as f64;
            assert!((zc - 2.0 * freq).abs() <= 4.0, "{} ch{ch}: {zc} zero crossings", case.name);
            let level = rms(mid);
            assert!((level - AMP / 2f64.sqrt()).abs() < 0.01, "{} ch{ch}: rms {level}", case.name);
            if case.lossless {
                let err = max_error(&x, ch, a.start_s, RATE);
                assert!(err < 1e-4, "{} ch{ch}: max error {err}", case.name);
            }
        }
    }
}

#[test]
fn windows_seek_and_land_on_the_right_samples() {
    let window = TimeWindow::new(1.25, 0.5);
    let opts = AudioOptions { window: Some(window), ..Default::default() };
    for case in CASES.iter().filter(|c| c.name != "tone.aac") {
        let path = media(case.name);
        let a = decode(&path, &opts);
        assert_eq!(a.frames, 22_050, "{}", case.name);
        assert!((a.start_s - 1.25).abs() < 1e-9, "{}: start {}", case.name, a.start_s);
        if case.lossless {
            for ch in 0..2 {
                let err = max_error(&channel(&a, ch), ch, 1.25, RATE);
                assert!(err < 1e-4, "{} ch{ch}: max error {err}", case.name);
            }
        }
        if ["tone.mp3", "tone.ogg", "tone.m4a"].contains(&case.name) {
            // Gapless codecs keep their timing, and M4A skips the AAC priming its edit list records: the
            // window's phase matches the analytic tone.
            let err = max_error(&channel(&a, 0), 0, 1.25, RATE);
            assert!(err < 0.01, "{}: max error {err}", case.name);
        }
    }
    // ADTS has no index: the window is found by decoding from the start, and still has its length.
    let a = decode(&media("tone.aac"), &opts);
    assert_eq!(a.frames, 22_050);
}

/// Whole-file f32 samples `[T, 2]` interleaved, as the `ffmpeg` CLI decodes them.
fn ffmpeg_decode(path: &Path) -> Vec<f32> {
    let out = std::process::Command::new(ffmpeg_cli())
        .args(["-v", "error", "-i"])
        .arg(path)
        .args(["-f", "f32le", "-ac", "2", "-"])
        .output()
        .expect("run ffmpeg");
    assert!(out.status.success(), "ffmpeg: {}", String::from_utf8_lossy(&out.stderr));
    out.stdout.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()
}

#[test]
fn m4a_skips_the_aac_priming_as_ffmpeg_does() {
    let path = media("tone.m4a");
    let a = decode(&path, &AudioOptions::default());
    let reference = ffmpeg_decode(&path);
    assert_eq!(a.frames, reference.len() / 2, "frame count against FFmpeg's");
    for ch in 0..2 {
        let x = channel(&a, ch);
        // Two AAC decoders: the same samples within rounding, and no 1024-frame shift.
        let err = x.iter().enumerate().map(|(i, v)| (v - reference[2 * i + ch]).abs()).fold(0.0, f32::max);
        assert!(err < 1e-3, "ch{ch}: max |spdl-io - ffmpeg| = {err}");
        let err = max_error(&x, ch, 0.0, RATE);
        assert!(err < 0.01, "ch{ch}: max error against the analytic tone {err}");
    }
}

#[test]
fn resample_mix_and_pick() {
    for name in ["tone.flac", "tone.mp3", "tone.ogg", "tone.m4a"] {
        let path = media(name);
        let opts = AudioOptions {
            window: Some(TimeWindow::new(0.5, 2.0)),
            sample_rate: Some(16_000),
            channels: ChannelSelect::Pick(vec![1]),
            ..Default::default()
        };
        let a = decode(&path, &opts);
        assert_eq!((a.buffer.shape(), a.sample_rate), (&[1, 32_000][..], 16_000), "{name}");
        let x = channel(&a, 0);
        let zc = zero_crossings(&x[8000..24_000]) as f64;
        assert!((zc - 2.0 * RIGHT_HZ).abs() <= 4.0, "{name}: {zc}");
        if name == "tone.flac" {
            let err = max_error(&x, 1, 0.5, 16_000);
            assert!(err < 0.002, "{name}: resampled max error {err}");
            let mono = AudioOptions { channels: ChannelSelect::Mono, ..opts };
            let m = decode(&path, &mono);
            let x = channel(&m, 0);
            let margin = 1600;
            let err = (margin..x.len() - margin)
                .map(|i| {
                    let t = 0.5 + i as f64 / 16_000.0;
                    (f64::from(x[i]) - (tone(0, t) + tone(1, t)) / 2.0).abs()
                })
                .fold(0.0, f64::max);
            assert!(err < 0.002, "mono mix max error {err}");
        }
    }
}

#[test]
fn bytes_and_path_give_the_same_samples() {
    for name in ["tone.flac", "tone.mp3", "tone.m4a", "s24.wav"] {
        let path = media(name);
        let data = std::fs::read(&path).unwrap();
        let opts = AudioOptions { window: Some(TimeWindow::new(1.0, 0.25)), ..Default::default() };
        let a = decode(&path, &opts);
        let b = decode_audio(MediaInput::bytes(&data, name), &opts, &system_allocator()).unwrap();
        assert_eq!(a.buffer.as_bytes(), b.buffer.as_bytes(), "{name}");
    }
}

#[test]
fn batch_of_mixed_formats() {
    let paths: Vec<PathBuf> = CASES.iter().map(|c| media(c.name)).collect();
    let inputs: Vec<MediaInput<'_>> = paths.iter().map(MediaInput::from).collect();
    let opts = AudioBatchOptions {
        audio: AudioOptions { sample_rate: Some(16_000), channels: ChannelSelect::Mono, ..Default::default() },
        num_frames: 40_000,
        threads: Some(2),
        ..Default::default()
    };
    let b = decode_audio_batch(&inputs, &opts, &system_allocator()).unwrap();
    assert_eq!(b.buffer.shape(), &[CASES.len(), 1, 40_000]);
    for (i, f) in b.frames.iter().enumerate() {
        assert_eq!(*f, 40_000, "{}", CASES[i].name);
    }
}

#[test]
fn probe_describes_each_format() {
    for case in CASES {
        let info = probe(media(case.name).as_path()).unwrap_or_else(|e| panic!("{}: {e}", case.name));
        let audio: Vec<_> = info.streams.iter().filter(|s| s.kind == StreamKind::Audio).collect();
        assert_eq!(audio.len(), 1, "{}: {info:?}", case.name);
        assert_eq!((audio[0].sample_rate, audio[0].channels), (Some(RATE), Some(2)), "{}", case.name);
        if let Some(d) = info.duration_s.or(audio[0].duration_s) {
            assert!((d - SECONDS).abs() < 0.1, "{}: duration {d}", case.name);
        }
    }
}

#[test]
fn damaged_files_give_errors_or_shorter_audio_never_a_crash() {
    for case in CASES {
        let data = std::fs::read(media(case.name)).unwrap();
        let mut variants: Vec<(String, Vec<u8>)> = vec![
            ("cut-half".into(), data[..data.len() / 2].to_vec()),
            ("cut-head".into(), data[..data.len().min(100)].to_vec()),
            ("cut-12".into(), data[..12].to_vec()),
        ];
        let mut flipped = data.clone();
        flip_bytes(&mut flipped, 200, 64);
        variants.push(("flipped".into(), flipped));
        let mut header = data.clone();
        flip_bytes(&mut header[..64.min(data.len())], 0, 16);
        variants.push(("bad-header".into(), header));
        for (what, bytes) in variants {
            let name = format!("{}:{what}", case.name);
            let result = within(120, &name.clone(), move || {
                decode_audio(MediaInput::bytes(&bytes, &name), &AudioOptions::default(), &system_allocator())
                    .map(|a| a.frames)
            });
            match result {
                Ok(frames) => assert!(frames <= (SECONDS * f64::from(RATE)) as usize + 4096, "{}:{what}", case.name),
                Err(e) => {
                    assert!(
                        matches!(e, Error::Decode { .. } | Error::UnknownFormat { .. } | Error::LimitExceeded { .. }),
                        "{}:{what}: {e:?}",
                        case.name
                    );
                    assert!(e.to_string().contains(case.name), "{}:{what}: {e}", case.name);
                }
            }
        }
    }
}

#[test]
fn decompression_bomb_is_bounded() {
    // Ten minutes of silence compress to a few kB of FLAC.
    let path = generate(
        &media_dir("audio_codecs"),
        "silence.flac",
        &["-f", "lavfi", "-i", "anullsrc=r=48000:cl=stereo", "-t", "600", "-c:a", "flac"],
    );
    assert!(std::fs::metadata(&path).unwrap().len() < 2_000_000);
    let limits = AudioLimits { max_samples: 48_000 * 2 * 60, ..Default::default() };
    let e =
        decode_audio(path.as_path(), &AudioOptions { limits, ..Default::default() }, &system_allocator()).unwrap_err();
    assert!(matches!(&e, Error::LimitExceeded { what, .. } if what == "decoded samples"), "{e}");
    // A window inside the limit decodes fine.
    let opts = AudioOptions { limits, window: Some(TimeWindow::new(300.0, 1.0)), ..Default::default() };
    assert_eq!(decode_audio(path.as_path(), &opts, &system_allocator()).unwrap().frames, 48_000);
}

#[test]
fn symphonia_backend_is_selectable() {
    let a = decode(&media("s16.wav"), &AudioOptions { backend: AudioBackend::Symphonia, ..Default::default() });
    let b = decode(&media("s16.wav"), &AudioOptions::default());
    assert_eq!(a.buffer.as_bytes(), b.buffer.as_bytes());
}

/// MP3 and Ogg go to FFmpeg first and to symphonia if it fails: when both fail, the error names the file and
/// gives both decoders' reasons (it used to give FFmpeg's alone, e.g. "cannot decode container: Invalid
/// argument").
#[cfg(feature = "ffmpeg")]
#[test]
fn when_both_decoders_fail_the_error_gives_both_reasons() {
    let mut id3_garbage = b"ID3\x04\x00\x00\x00\x00\x00\x0a".to_vec();
    id3_garbage.extend((0..4000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8));
    let mut ogg_garbage = b"OggS".to_vec();
    ogg_garbage.extend((0..4000u32).map(|i| (i.wrapping_mul(40_503) >> 5) as u8));
    for (name, data) in [("garbage.mp3", id3_garbage), ("garbage.ogg", ogg_garbage)] {
        let e = decode_audio(MediaInput::bytes(&data, name), &AudioOptions::default(), &system_allocator())
            .expect_err(name);
        let msg = spdl_report::error_chain(&e);
        assert!(matches!(e, Error::Decode { .. } | Error::UnknownFormat { .. }), "{name}: {e:?}");
        assert!(msg.contains(name) && msg.contains("FFmpeg") && msg.contains("symphonia"), "{name}: {msg}");
    }
}
