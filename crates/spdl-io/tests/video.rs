//! Video (feature `ffmpeg`) on media made by the `ffmpeg` CLI: frame counts and timestamps for windows and
//! sampling, pixel values against the CLI's own rgb24 output, demux/decode split across threads, in-memory
//! input, audio inside video containers, probe, damaged files and limits.
//! Needs the `ffmpeg` CLI (`cargo xtask test` installs it); fails, never skips, without it.
#![cfg(feature = "ffmpeg")]

mod audio_video_util;

use std::path::{Path, PathBuf};
use std::process::Command;

use audio_video_util::*;
use spdl_buffer::{Layout, system_allocator};
use spdl_io::audio::{AudioOptions, decode_audio};
use spdl_io::video::{
    DecodeOptions, DemuxOptions, FramePixelFormat, FrameSampling, VideoLimits, VideoOptions, decode_packets,
    decode_video, demux_video,
};
use spdl_io::{Error, MediaInput, StreamKind, TimeWindow, probe};

const W: u32 = 160;
const H: u32 = 120;
const FPS: u32 = 25;
const SECS: u32 = 4;

fn dir() -> PathBuf {
    media_dir("video")
}

/// testsrc, 160x120, 25 fps, 4 s, keyframe every second.
fn testsrc(name: &str, codec: &[&str]) -> PathBuf {
    let src = format!("testsrc=size={W}x{H}:rate={FPS}:duration={SECS}");
    let mut args = vec!["-f", "lavfi", "-i", &src];
    args.extend_from_slice(codec);
    args.extend_from_slice(&["-g", "25", "-pix_fmt", "yuv420p"]);
    generate(&dir(), name, &args)
}

fn h264() -> PathBuf {
    testsrc("testsrc.mp4", &["-c:v", "libx264", "-preset", "veryfast", "-bf", "2"])
}

fn vp9() -> PathBuf {
    testsrc("testsrc.webm", &["-c:v", "libvpx-vp9", "-deadline", "realtime", "-cpu-used", "8"])
}

fn mpeg4() -> PathBuf {
    testsrc("testsrc.avi", &["-c:v", "mpeg4", "-q:v", "3"])
}

/// Video + AAC audio in MP4, and video + Opus audio in MKV (Opus is FFmpeg-only).
fn with_audio(name: &str, audio_codec: &[&str]) -> PathBuf {
    let v = format!("testsrc=size={W}x{H}:rate={FPS}:duration=2");
    let mut args = vec!["-f", "lavfi", "-i", &v, "-f", "lavfi", "-i", "sine=f=440:r=48000:d=2"];
    args.extend_from_slice(&["-c:v", "libx264", "-preset", "veryfast", "-pix_fmt", "yuv420p"]);
    args.extend_from_slice(audio_codec);
    args.push("-shortest");
    generate(&dir(), name, &args)
}

fn decode(path: &Path, opts: &VideoOptions) -> spdl_io::video::Frames {
    decode_video(path, opts, &system_allocator()).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn opts(window: Option<TimeWindow>, sampling: FrameSampling) -> VideoOptions {
    VideoOptions { window, decode: DecodeOptions { sampling, ..Default::default() }, ..Default::default() }
}

fn assert_pts(got: &[f64], want: &[f64]) {
    assert_eq!(got.len(), want.len(), "{got:?} vs {want:?}");
    for (g, w) in got.iter().zip(want) {
        assert!((g - w).abs() < 1e-6, "{got:?} vs {want:?}");
    }
}

#[test]
fn all_frames_of_each_codec() {
    for path in [h264(), vp9(), mpeg4()] {
        let f = decode(&path, &opts(None, FrameSampling::All));
        let n = (FPS * SECS) as usize;
        assert_eq!(f.buffer.shape(), &[n, H as usize, W as usize, 3], "{}", path.display());
        assert_eq!(f.buffer.layout(), Layout::Nhwc);
        let want: Vec<f64> = (0..n).map(|i| i as f64 / f64::from(FPS)).collect();
        let first = f.pts_s[0];
        assert_pts(&f.pts_s.iter().map(|t| t - first).collect::<Vec<_>>(), &want);
        assert_eq!(f.frame_rate, Some(25.0));
    }
}

#[test]
fn windows_and_sampling() {
    let path = h264();
    let w = Some(TimeWindow::new(1.5, 1.0));
    let f = decode(&path, &opts(w, FrameSampling::All));
    assert_pts(&f.pts_s, &(0..25).map(|i| 1.52 + f64::from(i) * 0.04).collect::<Vec<_>>()[..25]);
    assert!((f.pts_s[0] - 1.52).abs() < 1e-6 && (f.pts_s[24] - 2.48).abs() < 1e-6);
    let every = decode(&path, &opts(w, FrameSampling::Every(5)));
    assert_pts(&every.pts_s, &[1.52, 1.72, 1.92, 2.12, 2.32]);
    let fps = decode(&path, &opts(Some(TimeWindow::new(1.0, 2.0)), FrameSampling::Fps(5.0)));
    assert_pts(&fps.pts_s, &(0..10).map(|i| 1.0 + f64::from(i) * 0.2).collect::<Vec<_>>());
    let uniform = decode(&path, &opts(Some(TimeWindow::new(0.0, 4.0)), FrameSampling::Uniform(4)));
    assert_pts(&uniform.pts_s, &[0.0, 1.32, 2.64, 3.96]);
    // Sampled frames are the same pixels as the same frames of a full decode.
    let all = decode(&path, &opts(None, FrameSampling::All));
    for (k, t) in every.pts_s.iter().enumerate() {
        let i = (t * 25.0).round() as usize;
        assert_eq!(every.buffer.outer_slot(k).unwrap(), all.buffer.outer_slot(i).unwrap(), "frame at {t}");
    }
    // A window past the end is empty.
    let past = decode(&path, &opts(Some(TimeWindow::new(10.0, 1.0)), FrameSampling::All));
    assert_eq!(past.buffer.shape()[0], 0);
}

fn cli_rgb24(path: &Path, extra: &[&str]) -> Vec<u8> {
    let out = Command::new(ffmpeg_cli())
        .args(["-hide_banner", "-loglevel", "error", "-nostdin", "-i"])
        .arg(path)
        .args(extra)
        .args(["-f", "rawvideo", "-pix_fmt", "rgb24", "-"])
        .output()
        .expect("run ffmpeg");
    assert!(out.status.success());
    out.stdout
}

#[test]
fn pixels_match_the_ffmpeg_cli() {
    for path in [h264(), vp9()] {
        let f = decode(&path, &opts(None, FrameSampling::All));
        let reference = cli_rgb24(&path, &[]);
        let ours = f.buffer.as_bytes();
        assert_eq!(ours.len(), reference.len(), "{}", path.display());
        let diffs: Vec<u32> = ours.iter().zip(&reference).map(|(&a, &b)| u32::from(a.abs_diff(b))).collect();
        let mean = diffs.iter().sum::<u32>() as f64 / diffs.len() as f64;
        let big = diffs.iter().filter(|&&d| d > 8).count() as f64 / diffs.len() as f64;
        assert!(mean < 1.0 && big < 0.01, "{}: mean diff {mean}, {big} over 8", path.display());
    }
}

#[test]
fn solid_red_scaled_and_gray() {
    let path = generate(
        &dir(),
        "red.mp4",
        &["-f", "lavfi", "-i", "color=c=red:size=64x48:rate=10:duration=1", "-c:v", "libx264", "-pix_fmt", "yuv420p"],
    );
    let f = decode(&path, &opts(None, FrameSampling::All));
    assert_eq!(f.buffer.shape(), &[10, 48, 64, 3]);
    for px in f.buffer.as_bytes().chunks_exact(3) {
        assert!(px[0] >= 250 && px[1] <= 5 && px[2] <= 5, "{px:?}");
    }
    let small = VideoOptions {
        decode: DecodeOptions { size: Some((32, 20)), pixel_format: FramePixelFormat::Gray8, ..Default::default() },
        ..Default::default()
    };
    let g = decode(&path, &small);
    assert_eq!(g.buffer.shape(), &[10, 20, 32, 1]);
    // Luma of pure red (BT.601): 0.299 * 255.
    assert!(g.buffer.as_bytes().iter().all(|&v| (70..=82).contains(&v)), "{:?}", &g.buffer.as_bytes()[..8]);
}

#[test]
fn demux_on_one_thread_decode_on_another_from_bytes() {
    let path = h264();
    let data = std::fs::read(&path).unwrap();
    let packets = demux_video(
        MediaInput::bytes(&data, "s3://bucket/testsrc.mp4"),
        &DemuxOptions { window: Some(TimeWindow::new(2.0, 1.0)), ..Default::default() },
    )
    .unwrap();
    assert_eq!((packets.codec(), packets.width(), packets.height()), ("h264", W, H));
    assert_eq!(packets.timestamps().len(), 25);
    assert!(packets.len() >= 25);
    let frames = std::thread::spawn(move || {
        decode_packets(packets, &DecodeOptions { threads: 2, ..Default::default() }, &system_allocator())
    })
    .join()
    .unwrap()
    .unwrap();
    assert_eq!(frames.item, "s3://bucket/testsrc.mp4");
    let from_path = decode(&path, &opts(Some(TimeWindow::new(2.0, 1.0)), FrameSampling::All));
    assert_eq!(frames.buffer.as_bytes(), from_path.buffer.as_bytes());
    assert_eq!(frames.pts_s, from_path.pts_s);
}

#[test]
fn audio_inside_video_containers() {
    let mp4 = with_audio("av.mp4", &["-c:a", "aac"]);
    let mkv = with_audio("av.mkv", &["-c:a", "libopus"]);
    for path in [&mp4, &mkv] {
        let a = decode_audio(path.as_path(), &AudioOptions::default(), &system_allocator())
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert_eq!(a.sample_rate, 48_000, "{}", path.display());
        let v = a.buffer.as_slice::<f32>().unwrap();
        let zc = zero_crossings(&v[24_000..72_000]) as f64;
        assert!((zc - 880.0).abs() <= 4.0, "{}: {zc}", path.display());
        let w =
            AudioOptions { window: Some(TimeWindow::new(0.5, 1.0)), sample_rate: Some(16_000), ..Default::default() };
        let a = decode_audio(path.as_path(), &w, &system_allocator()).unwrap();
        assert_eq!(a.frames, 16_000, "{}", path.display());
    }
    let opus = decode_audio(mkv.as_path(), &AudioOptions::default(), &system_allocator()).unwrap();
    assert_eq!(opus.source.codec, "opus");
    // The FFmpeg backend on a plain WAV agrees with the fast path.
    let wav = generate(&dir(), "sine.wav", &["-f", "lavfi", "-i", "sine=f=300:r=16000:d=1", "-c:a", "pcm_s16le"]);
    let fast = decode_audio(wav.as_path(), &AudioOptions::default(), &system_allocator()).unwrap();
    let ff = AudioOptions { backend: spdl_io::audio::AudioBackend::Ffmpeg, ..Default::default() };
    let slow = decode_audio(wav.as_path(), &ff, &system_allocator()).unwrap();
    assert_eq!(fast.buffer.as_bytes(), slow.buffer.as_bytes());
}

#[test]
fn probe_video_files() {
    let info = probe(with_audio("av.mp4", &["-c:a", "aac"]).as_path()).unwrap();
    assert_eq!(info.prober, "ffmpeg");
    assert!((info.duration_s.unwrap() - 2.0).abs() < 0.1, "{info:?}");
    let v = info.streams.iter().find(|s| s.kind == StreamKind::Video).unwrap();
    assert_eq!((v.codec.as_str(), v.width, v.height, v.frame_rate), ("h264", Some(W), Some(H), Some(25.0)));
    assert_eq!(v.pixel_format.as_deref(), Some("yuv420p"));
    let a = info.streams.iter().find(|s| s.kind == StreamKind::Audio).unwrap();
    assert_eq!((a.codec.as_str(), a.sample_rate, a.channels), ("aac", Some(48_000), Some(1)));
    let data = std::fs::read(vp9()).unwrap();
    let info = probe(MediaInput::bytes(&data, "x.webm")).unwrap();
    assert_eq!(info.streams[0].codec, "vp9");
}

#[test]
fn damaged_videos_give_typed_errors_never_a_crash_or_hang() {
    let data = std::fs::read(h264()).unwrap();
    let mut cases: Vec<(&str, Vec<u8>)> = vec![
        ("cut-half", data[..data.len() / 2].to_vec()),
        ("cut-1k", data[..1024].to_vec()),
        ("garbage", (0..5000u32).map(|i| (i * 7919 % 251) as u8).collect()),
    ];
    let mut flipped = data.clone();
    flip_bytes(&mut flipped, 2000, 200);
    cases.push(("flipped", flipped));
    // An MP4 cut just before its moov atom (the CLI writes it at the end).
    let at = data.windows(4).position(|w| w == b"moov").expect("moov");
    let no_moov = data[..at - 4].to_vec();
    let e = decode_video(MediaInput::bytes(&no_moov, "no-moov.mp4"), &VideoOptions::default(), &system_allocator());
    assert!(matches!(&e, Err(Error::Decode { format, .. }) if format.contains("mp4")), "{e:?}");
    for (what, bytes) in cases {
        let name = format!("broken-{what}.mp4");
        let result = within(120, &name.clone(), move || {
            decode_video(MediaInput::bytes(&bytes, &name), &VideoOptions::default(), &system_allocator())
                .map(|f| f.buffer.shape()[0])
        });
        match result {
            Ok(n) => assert!(n <= 100, "{what}: {n} frames"),
            Err(e) => {
                assert!(matches!(e, Error::Decode { .. } | Error::UnknownFormat { .. }), "{what}: {e:?}");
                assert!(e.to_string().contains(what), "{what}: {e}");
            }
        }
    }
    let e = decode_video(MediaInput::bytes(b"", "empty.mp4"), &VideoOptions::default(), &system_allocator());
    assert!(matches!(e, Err(Error::Empty { .. })));
    let e = decode_video(Path::new("/nonexistent/x.mp4"), &VideoOptions::default(), &system_allocator());
    assert!(matches!(e, Err(Error::Io { .. })), "{e:?}");
    let e = decode_video(
        with_audio("av.m4a", &["-vn", "-c:a", "aac"]).as_path(),
        &VideoOptions::default(),
        &system_allocator(),
    );
    assert!(matches!(&e, Err(Error::UnknownFormat { detail, .. }) if detail.contains("no video")), "{e:?}");
}

#[test]
fn limits_bound_the_work() {
    let path = h264();
    let limited = |limits: VideoLimits| VideoOptions { limits, ..Default::default() };
    let e = decode_video(
        path.as_path(),
        &limited(VideoLimits { max_frames: 10, ..Default::default() }),
        &system_allocator(),
    );
    assert!(matches!(&e, Err(Error::LimitExceeded { what, .. }) if what == "decoded frames"), "{e:?}");
    let e = decode_video(
        path.as_path(),
        &limited(VideoLimits { max_output_bytes: 1 << 20, ..Default::default() }),
        &system_allocator(),
    );
    assert!(matches!(&e, Err(Error::LimitExceeded { what, .. }) if what == "output bytes"), "{e:?}");
    let e = decode_video(
        path.as_path(),
        &limited(VideoLimits { max_pixels: 1000, ..Default::default() }),
        &system_allocator(),
    );
    assert!(matches!(&e, Err(Error::LimitExceeded { what, .. }) if what == "pixels per frame"), "{e:?}");
    let e = decode_video(
        path.as_path(),
        &limited(VideoLimits { max_packets: 10, ..Default::default() }),
        &system_allocator(),
    );
    assert!(matches!(&e, Err(Error::LimitExceeded { what, .. }) if what == "packets"), "{e:?}");
    let bad = VideoOptions {
        decode: DecodeOptions { sampling: FrameSampling::Every(0), ..Default::default() },
        ..Default::default()
    };
    assert!(matches!(decode_video(path.as_path(), &bad, &system_allocator()), Err(Error::InvalidOptions(_))));
}

#[test]
fn one_and_two_decoder_threads_agree() {
    let path = h264();
    let one = decode(&path, &opts(None, FrameSampling::All));
    let two = VideoOptions { decode: DecodeOptions { threads: 2, ..Default::default() }, ..Default::default() };
    assert_eq!(one.buffer.as_bytes(), decode(&path, &two).buffer.as_bytes());
}

/// 20 frames of 64x48 testsrc at 10 fps (MPEG-4 part 2: no reordering) whose timestamps are rewritten by
/// `setts` with `pts_expr` (in the Matroska time base, ms).
fn retimed(name: &str, pts_expr: &str) -> PathBuf {
    let bsf = format!("setts=pts={pts_expr}");
    generate(
        &dir(),
        name,
        &["-f", "lavfi", "-i", "testsrc=size=64x48:rate=10", "-frames:v", "20", "-c:v", "mpeg4", "-bsf:v", &bsf],
    )
}

#[test]
fn frames_with_backward_or_zigzag_timestamps_all_come_out() {
    // 1900, 1800, ..., 0; and 100, 1, 300, 201, ...: each used to give 1-2 of 20 frames, with no error.
    for (name, expr) in [("backwards.mkv", "(19-N)*100"), ("zigzag.mkv", "if(mod(N\\,2)\\,PTS-100\\,PTS+100)")] {
        let path = retimed(name, expr);
        let frames = decode_video(path.as_path(), &VideoOptions::default(), &system_allocator())
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(frames.buffer.shape(), &[20, 48, 64, 3], "{name}");
        // Presentation order: the timestamps increase.
        assert!(frames.pts_s.windows(2).all(|w| w[0] < w[1]), "{name}: {:?}", frames.pts_s);
        // Every frame is a distinct picture (testsrc moves every frame).
        let slots: Vec<&[u8]> = frames.buffer.as_bytes().chunks_exact(64 * 48 * 3).collect();
        let distinct = slots.iter().collect::<std::collections::HashSet<_>>().len();
        assert_eq!(distinct, 20, "{name}");
        // Sampling works on presentation order too.
        let opts = VideoOptions {
            decode: DecodeOptions { sampling: FrameSampling::Uniform(5), ..DecodeOptions::default() },
            ..VideoOptions::default()
        };
        let five = decode_video(path.as_path(), &opts, &system_allocator()).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(five.buffer.shape()[0], 5, "{name}");
    }
    // Reversed timestamps: frames come out in presentation order, not decode order.
    let back = retimed("backwards.mkv", "(19-N)*100");
    let frames =
        decode_video(back.as_path(), &VideoOptions::default(), &system_allocator()).unwrap_or_else(|e| panic!("{e}"));
    let plain = generate(
        &dir(),
        "plain20.mkv",
        &["-f", "lavfi", "-i", "testsrc=size=64x48:rate=10", "-frames:v", "20", "-c:v", "mpeg4"],
    );
    let fwd =
        decode_video(plain.as_path(), &VideoOptions::default(), &system_allocator()).unwrap_or_else(|e| panic!("{e}"));
    let fb = 64 * 48 * 3;
    let (got, want) = (frames.buffer.as_bytes(), fwd.buffer.as_bytes());
    let matches: Vec<Option<usize>> =
        (0..20).map(|i| (0..20).find(|&j| got[i * fb..(i + 1) * fb] == want[j * fb..(j + 1) * fb])).collect();
    // Every source frame once, the one shown first decoded last (the muxer keeps the timestamps
    // decreasing over the first half, and nudges those of the second half: 1.9, ..., 1.0, 0.910, ..., 0.901).
    let mut seen = matches.clone();
    seen.sort_unstable();
    assert_eq!(seen, (0..20).map(Some).collect::<Vec<_>>(), "{matches:?}");
    assert_eq!(matches.last(), Some(&Some(0)), "{matches:?} {:?}", frames.pts_s);
}

#[test]
fn huge_frame_counts_are_refused_before_anything_is_allocated() {
    let path = retimed("plain_for_count.mkv", "PTS");
    for sampling in [FrameSampling::Uniform(1_000_000_000), FrameSampling::Fps(1e12)] {
        let opts =
            VideoOptions { decode: DecodeOptions { sampling, ..DecodeOptions::default() }, ..VideoOptions::default() };
        let t = std::time::Instant::now();
        let err = decode_video(path.as_path(), &opts, &system_allocator()).err();
        assert!(t.elapsed().as_secs_f64() < 2.0, "{:?}", t.elapsed());
        match err {
            Some(Error::InvalidOptions(m)) => {
                assert!(m.contains("plain_for_count.mkv") && m.contains("max_output_bytes"), "{m}")
            }
            other => panic!("{sampling:?}: {other:?}"),
        }
    }
    // Within the limits, a count larger than the video repeats frames.
    let opts = VideoOptions {
        decode: DecodeOptions { sampling: FrameSampling::Uniform(40), ..DecodeOptions::default() },
        ..VideoOptions::default()
    };
    let out = decode_video(path.as_path(), &opts, &system_allocator()).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(out.buffer.shape()[0], 40);
}
