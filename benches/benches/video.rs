//! spdl-io video benchmarks (feature `ffmpeg`): decode frames per second at 1 and 2 decoder threads
//! (every frame converted to RGB24 at the coded size), and sampled decodes (8 frames of a window, resized
//! to 224x224), on testsrc clips made with the `ffmpeg` CLI and decoded from memory.
//!
//! `cargo bench -p spdl-benches --bench video --features ffmpeg` (results: docs/benchmarks.md, "spdl-io
//! audio and video").

use std::hint::black_box;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use spdl_buffer::{SharedAllocator, system_allocator};
use spdl_io::video::{DecodeOptions, FrameSampling, VideoOptions, decode_video};
use spdl_io::{MediaInput, TimeWindow};

const FRAMES: u64 = 250; // 10 s at 25 fps

fn media(name: &str, size: &str, codec: &[&str]) -> Vec<u8> {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("spdl-bench-video");
    std::fs::create_dir_all(&dir).expect("media dir");
    let out = dir.join(name);
    let src = format!("testsrc2=size={size}:rate=25:duration=10");
    let status = Command::new("ffmpeg")
        .args(["-y", "-hide_banner", "-loglevel", "error", "-nostdin", "-f", "lavfi", "-i", &src])
        .args(codec)
        .args(["-g", "50", "-pix_fmt", "yuv420p"])
        .arg(&out)
        .status()
        .expect("the `ffmpeg` CLI makes the bench media: run `cargo xtask test` once, or `apt-get install ffmpeg`");
    assert!(status.success(), "ffmpeg failed for {name}");
    std::fs::read(&out).expect("read media")
}

fn full_decode(c: &mut Criterion) {
    let alloc: SharedAllocator = system_allocator();
    let cases = [
        ("h264_640x360", media("h264_640x360.mp4", "640x360", &["-c:v", "libx264", "-preset", "fast"])),
        (
            "vp9_640x360",
            media("vp9_640x360.webm", "640x360", &["-c:v", "libvpx-vp9", "-deadline", "realtime", "-cpu-used", "8"]),
        ),
        ("mpeg4_640x360", media("mpeg4_640x360.mp4", "640x360", &["-c:v", "mpeg4", "-q:v", "4"])),
    ];
    let mut g = c.benchmark_group("video/decode_all_rgb24");
    g.sample_size(10).warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(4));
    g.throughput(Throughput::Elements(FRAMES));
    for (name, data) in &cases {
        for threads in [1usize, 2] {
            let opts = VideoOptions { decode: DecodeOptions { threads, ..Default::default() }, ..Default::default() };
            g.bench_with_input(BenchmarkId::new(*name, format!("threads={threads}")), &opts, |b, opts| {
                b.iter(|| decode_video(MediaInput::bytes(black_box(data), "v.mp4"), opts, &alloc).expect("decode"))
            });
        }
    }
    g.finish();
}

fn sampled_decode(c: &mut Criterion) {
    let alloc: SharedAllocator = system_allocator();
    let data = media("h264_640x360.mp4", "640x360", &["-c:v", "libx264", "-preset", "fast"]);
    let mut g = c.benchmark_group("video/h264_640x360_sampled");
    g.sample_size(10).warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(3));
    g.throughput(Throughput::Elements(1)); // clips per second
    let opts = VideoOptions {
        window: Some(TimeWindow::new(4.0, 2.0)),
        decode: DecodeOptions { sampling: FrameSampling::Uniform(8), size: Some((224, 224)), ..Default::default() },
        ..Default::default()
    };
    g.bench_function("window_2s_uniform8_224", |b| {
        b.iter(|| decode_video(MediaInput::bytes(black_box(&data), "v.mp4"), &opts, &alloc).expect("decode"))
    });
    g.finish();
}

criterion_group!(benches, full_decode, sampled_decode);
criterion_main!(benches);
