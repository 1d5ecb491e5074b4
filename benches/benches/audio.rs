//! spdl-io audio benchmarks: decode throughput per format in seconds of audio per second (criterion's
//! `elem/s`), resampling, and a batch of WAV clips at 1 and 2 threads (the WAV fast path's scaling).
//!
//! Media: a 10 s stereo 44.1 kHz tone made with the `ffmpeg` CLI (WAV is also made in Rust), decoded
//! from memory. `cargo bench -p spdl-benches --bench audio` (results: docs/benchmarks.md, "spdl-io audio
//! and video").

use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use spdl_buffer::{SharedAllocator, system_allocator};
use spdl_io::MediaInput;
use spdl_io::audio::{AudioBackend, AudioBatchOptions, AudioOptions, ChannelSelect, decode_audio, decode_audio_batch};

const SECONDS: u64 = 10;

fn media(name: &str, codec: &[&str]) -> Vec<u8> {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("spdl-bench-audio");
    std::fs::create_dir_all(&dir).expect("media dir");
    let out: PathBuf = dir.join(name);
    let filter = format!("sine=f=440:r=44100:d={SECONDS}[l];sine=f=1000:r=44100:d={SECONDS}[r];[l][r]amerge=inputs=2");
    let status = Command::new("ffmpeg")
        .args(["-y", "-hide_banner", "-loglevel", "error", "-nostdin", "-filter_complex", &filter])
        .args(codec)
        .arg(&out)
        .status()
        .expect("the `ffmpeg` CLI makes the bench media: run `cargo xtask test` once, or `apt-get install ffmpeg`");
    assert!(status.success(), "ffmpeg failed for {name}");
    std::fs::read(&out).expect("read media")
}

fn configure(g: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>) {
    g.sample_size(10).warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(3));
}

fn decode_per_format(c: &mut Criterion) {
    let alloc: SharedAllocator = system_allocator();
    let cases: [(&str, &str, &[&str], AudioBackend); 8] = [
        ("wav_fast_path", "tone.wav", &["-c:a", "pcm_s16le"], AudioBackend::Auto),
        ("wav_symphonia", "tone.wav", &["-c:a", "pcm_s16le"], AudioBackend::Symphonia),
        ("flac", "tone.flac", &["-c:a", "flac"], AudioBackend::Auto),
        ("mp3_192k", "tone.mp3", &["-c:a", "libmp3lame", "-b:a", "192k"], AudioBackend::Auto),
        ("vorbis_q6", "tone.ogg", &["-c:a", "libvorbis", "-q:a", "6"], AudioBackend::Auto),
        ("aac_adts_192k", "tone.aac", &["-c:a", "aac", "-b:a", "192k"], AudioBackend::Auto),
        ("aac_m4a_192k", "tone.m4a", &["-c:a", "aac", "-b:a", "192k"], AudioBackend::Auto),
        ("opus_ffmpeg", "tone.opus", &["-c:a", "libopus", "-b:a", "128k"], AudioBackend::Ffmpeg),
    ];
    let mut g = c.benchmark_group("audio/decode_10s_stereo_44k1");
    configure(&mut g);
    // One element = one second of audio: criterion's elem/s is seconds of audio decoded per second.
    g.throughput(Throughput::Elements(SECONDS));
    for (id, file, codec, backend) in cases {
        let opts = AudioOptions { backend, ..Default::default() };
        if opts.validate().is_err() {
            continue; // the FFmpeg backend in a build without spdl-io's `ffmpeg` feature
        }
        let data = media(file, codec);
        g.bench_function(id, |b| {
            b.iter(|| decode_audio(MediaInput::bytes(black_box(&data), file), &opts, &alloc).expect("decode"))
        });
    }
    g.finish();
}

fn resample(c: &mut Criterion) {
    let alloc: SharedAllocator = system_allocator();
    let wav = media("tone.wav", &["-c:a", "pcm_s16le"]);
    let mut g = c.benchmark_group("audio/wav_10s_resample");
    configure(&mut g);
    g.throughput(Throughput::Elements(SECONDS));
    for (id, channels) in [("stereo_to_16k", ChannelSelect::All), ("mono_to_16k", ChannelSelect::Mono)] {
        let opts = AudioOptions { sample_rate: Some(16_000), channels, ..Default::default() };
        g.bench_function(id, |b| {
            b.iter(|| decode_audio(MediaInput::bytes(black_box(&wav), "x.wav"), &opts, &alloc).expect("decode"))
        });
    }
    g.finish();
}

/// 64 one-second WAV clips (2 s files, a 1 s window of each) into one [64, 2, 44100] batch.
fn batch(c: &mut Criterion) {
    let alloc: SharedAllocator = system_allocator();
    let clips: Vec<Vec<u8>> = (0..64)
        .map(|k| {
            let s: Vec<i16> =
                (0..88_200).flat_map(|i| [((i * (k + 1)) % 20_000) as i16, -((i % 20_000) as i16)]).collect();
            spdl_io::audio::encode_wav_i16(&s, 2, 44_100)
        })
        .collect();
    let inputs: Vec<MediaInput<'_>> = clips.iter().map(|c| MediaInput::bytes(c, "clip.wav")).collect();
    let mut g = c.benchmark_group("audio/batch_64_wav_clips_1s");
    configure(&mut g);
    g.throughput(Throughput::Elements(inputs.len() as u64));
    for threads in [1usize, 2] {
        let opts = AudioBatchOptions {
            audio: AudioOptions { window: Some(spdl_io::TimeWindow::new(0.5, 1.0)), ..Default::default() },
            num_frames: 44_100,
            threads: Some(threads),
            ..Default::default()
        };
        g.bench_with_input(BenchmarkId::new("threads", threads), &opts, |b, opts| {
            b.iter(|| decode_audio_batch(black_box(&inputs), opts, &alloc).expect("batch"))
        });
    }
    g.finish();
}

criterion_group!(benches, decode_per_format, resample, batch);
criterion_main!(benches);
