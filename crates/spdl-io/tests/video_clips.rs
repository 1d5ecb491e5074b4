//! Clips decoded once per GOP (feature `ffmpeg`), on media made by the `ffmpeg` CLI: every clip frame equals
//! the same frame of a full decode, bit for bit, over several codecs and containers; shared GOPs are decoded
//! once; variable frame rates, backward and zigzag timestamps, and missing leading keyframes; past-the-end
//! policies; the limits refuse before allocating; samplers follow from the seed and the video alone.
#![cfg(feature = "ffmpeg")]

mod audio_video_util;

use std::path::{Path, PathBuf};

use audio_video_util::*;
use spdl_buffer::system_allocator;
use spdl_io::Error;
use spdl_io::video::{
    ClipOptions, ClipRequest, ClipSampler, ClipStarts, ClipStep, Clips, DecodeOptions, DemuxOptions, PastEnd,
    ScaleFilter, Timeline, VideoLimits, VideoOptions, decode_video, demux_video, load_clips, plan_clips,
};

const W: u32 = 96;
const H: u32 = 64;

fn dir() -> PathBuf {
    media_dir("video_clips")
}

/// 120 frames of moving testsrc at 30 fps (every frame differs), keyframe every `gop` frames.
fn make(name: &str, codec: &[&str], gop: &str) -> PathBuf {
    let src = format!("testsrc2=size={W}x{H}:rate=30");
    let mut args = vec!["-f", "lavfi", "-i", &src, "-frames:v", "120"];
    args.extend_from_slice(codec);
    args.extend_from_slice(&["-g", gop, "-sc_threshold", "0", "-pix_fmt", "yuv420p"]);
    generate(&dir(), name, &args)
}

fn h264_bframes() -> PathBuf {
    make("h264_b.mp4", &["-c:v", "libx264", "-preset", "veryfast", "-bf", "3", "-x264-params", "b-pyramid=none"], "40")
}

fn media() -> Vec<PathBuf> {
    vec![
        h264_bframes(),
        make("h264_pyramid.mkv", &["-c:v", "libx264", "-preset", "medium", "-bf", "3"], "30"),
        make("vp9.webm", &["-c:v", "libvpx-vp9", "-deadline", "realtime", "-cpu-used", "8"], "25"),
        make("mpeg4_b.mkv", &["-c:v", "mpeg4", "-q:v", "4", "-bf", "2"], "20"),
        make("mpeg4.avi", &["-c:v", "mpeg4", "-q:v", "4"], "12"),
        // A raw Annex B stream: no container timestamps, frames matched by output order.
        make("raw_b.h264", &["-c:v", "libx264", "-preset", "veryfast", "-bf", "2", "-f", "h264"], "30"),
    ]
}

fn request(starts: ClipStarts, num_frames: usize, step: ClipStep) -> ClipRequest {
    ClipRequest { starts, num_frames, step, past_end: PastEnd::Error }
}

fn clips(path: &Path, req: &ClipRequest, opts: &ClipOptions) -> Clips {
    load_clips(path, req, opts, &system_allocator()).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every frame of `path`, decoded in full at the size and filter `opts` asks for.
fn full(path: &Path, opts: &ClipOptions) -> spdl_io::video::Frames {
    let v = VideoOptions {
        decode: DecodeOptions { size: opts.size, filter: opts.filter, ..Default::default() },
        ..Default::default()
    };
    decode_video(path, &v, &system_allocator()).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Each clip slot equals the full decode's frame at the slot's index, and its pts too.
fn assert_matches_full(path: &Path, got: &Clips, full: &spdl_io::video::Frames) {
    let shape = got.buffer.shape();
    let fb: usize = shape[2..].iter().product();
    let all = full.buffer.as_bytes();
    for (slot, (&i, &t)) in got.indices.iter().zip(&got.pts_s).enumerate() {
        let i = i as usize;
        assert!((full.pts_s[i] - t).abs() < 1e-9, "{}: slot {slot} pts {t} vs {}", path.display(), full.pts_s[i]);
        assert!(
            got.buffer.as_bytes()[slot * fb..(slot + 1) * fb] == all[i * fb..(i + 1) * fb],
            "{}: slot {slot} (frame {i}) differs from the full decode",
            path.display()
        );
    }
}

#[test]
fn clips_equal_a_full_decode_bit_for_bit_over_codecs_and_containers() {
    for path in media() {
        for opts in [
            ClipOptions::default(),
            ClipOptions { size: Some((48, 40)), filter: ScaleFilter::Bilinear, ..Default::default() },
        ] {
            let reference = full(&path, &opts);
            assert_eq!(reference.buffer.shape()[0], 120, "{}", path.display());
            for (starts, n, step) in [
                (vec![0, 5, 33, 47, 100], 8, ClipStep::Stride(1)),
                (vec![3, 3, 60], 16, ClipStep::Stride(3)),
                (vec![119], 1, ClipStep::Stride(1)),
            ] {
                let req = request(ClipStarts::Indices(starts.clone()), n, step);
                let got = clips(&path, &req, &opts);
                let (w, h) = opts.size.unwrap_or((W, H));
                assert_eq!(got.buffer.shape(), &[starts.len(), n, h as usize, w as usize, 3]);
                let want: Vec<u64> = starts
                    .iter()
                    .flat_map(|&s| {
                        let k = match step {
                            ClipStep::Stride(k) => k as u64,
                            ClipStep::Fps(_) => unreachable!(),
                        };
                        (0..n as u64).map(move |f| s + f * k)
                    })
                    .collect();
                assert_eq!(got.indices, want, "{}", path.display());
                assert_matches_full(&path, &got, &reference);
            }
        }
    }
}

#[test]
fn shared_gops_are_decoded_once_and_shared_frames_converted_once() {
    let path = h264_bframes();
    // Three overlapping clips in the first GOP (40 frames), one in the third.
    let req = request(ClipStarts::Indices(vec![2, 6, 10, 90]), 16, ClipStep::Stride(1));
    let got = clips(&path, &req, &ClipOptions::default());
    let s = got.stats;
    assert_eq!(s.frames_kept, 24 + 16, "{s:?}");
    assert_eq!(s.frames_converted, s.frames_kept, "{s:?}");
    assert_eq!(s.runs, 2, "{s:?}");
    // Each clip alone would decode from its GOP's keyframe to its end: 18 + 22 + 26 + (106 - 80).
    let per_clip: u64 = [2u64 + 16, 6 + 16, 10 + 16, 90 + 16 - 80].iter().sum();
    assert!(s.packets_sent < per_clip, "{s:?} vs {per_clip} packets for one decode per clip");
    // Non-reference B-frames that no clip keeps (frames 80..90) are dropped by the decoder.
    assert!(s.packets_skippable > 0, "{s:?}");
    assert!(s.frames_decoded < s.packets_sent, "{s:?}");
    // The same frames without skipping.
    let no_skip = clips(&path, &req, &ClipOptions { skip_unused: false, ..Default::default() });
    assert_eq!(no_skip.buffer.as_bytes(), got.buffer.as_bytes());
    assert!(no_skip.stats.frames_decoded > s.frames_decoded, "{:?} vs {s:?}", no_skip.stats);
    // Two decoder threads give the same frames.
    let two = clips(&path, &req, &ClipOptions { threads: 2, ..Default::default() });
    assert_eq!(two.buffer.as_bytes(), got.buffer.as_bytes());
}

#[test]
fn starts_by_time_and_steps_by_fps_follow_the_frames_on_screen() {
    let path = h264_bframes();
    let reference = full(&path, &ClipOptions::default());
    // 30 fps: 1.0 s is frame 30, 2.51 s is frame 75 (shown from 2.5 s).
    let req = request(ClipStarts::Times(vec![1.0, 2.51]), 4, ClipStep::Stride(2));
    let got = clips(&path, &req, &ClipOptions::default());
    assert_eq!(got.indices, vec![30, 32, 34, 36, 75, 77, 79, 81]);
    assert_matches_full(&path, &got, &reference);
    // 10 fps from frame 3: every third frame; 60 fps: frames repeat.
    let got = clips(&path, &request(ClipStarts::Indices(vec![3]), 4, ClipStep::Fps(10.0)), &ClipOptions::default());
    assert_eq!(got.indices, vec![3, 6, 9, 12]);
    let got = clips(&path, &request(ClipStarts::Indices(vec![3]), 4, ClipStep::Fps(60.0)), &ClipOptions::default());
    assert_eq!(got.indices, vec![3, 3, 4, 4]);
    assert_matches_full(&path, &got, &reference);
}

#[test]
fn variable_frame_rate_files_keep_every_frame_by_time() {
    // Frame intervals alternate between 1/30 s and 3/30 s (the first 60 frames of testsrc2, retimed).
    let path = generate(
        &dir(),
        "vfr.mkv",
        &[
            "-f",
            "lavfi",
            "-i",
            "testsrc2=size=96x64:rate=30",
            "-frames:v",
            "60",
            "-vf",
            "setpts='(N+2*floor(N/2))/30/TB'",
            "-fps_mode",
            "vfr",
            "-c:v",
            "libx264",
            "-preset",
            "veryfast",
            "-bf",
            "2",
            "-g",
            "20",
        ],
    );
    let reference = full(&path, &ClipOptions::default());
    assert_eq!(reference.buffer.shape()[0], 60);
    // Starts by time land on the frame on screen; every frame of each clip is a full-decode frame.
    let times: Vec<f64> = vec![0.0, 0.5, 1.234, 2.0];
    let got = clips(&path, &request(ClipStarts::Times(times.clone()), 6, ClipStep::Stride(1)), &ClipOptions::default());
    for (c, &t) in times.iter().enumerate() {
        let i = got.indices[c * 6] as usize;
        assert!(reference.pts_s[i] <= t + 1e-6 && reference.pts_s.get(i + 1).is_none_or(|&n| n > t), "{t}: {i}");
    }
    assert_matches_full(&path, &got, &reference);
    // A clip at 15 fps over a VFR stretch: frame i is the one on screen at start + i / 15.
    let got = clips(&path, &request(ClipStarts::Times(vec![0.5]), 8, ClipStep::Fps(15.0)), &ClipOptions::default());
    for (f, &i) in got.indices.iter().enumerate() {
        let t = 0.5 + f as f64 / 15.0;
        let on = reference.pts_s.partition_point(|&x| x <= t + 1e-6) - 1;
        assert_eq!(i as usize, on, "tick {f} at {t}");
    }
    assert_matches_full(&path, &got, &reference);
}

/// 20 frames of 64x48 testsrc at 10 fps (MPEG-4 part 2) whose timestamps `setts` rewrites with `expr`.
fn retimed(name: &str, expr: &str) -> PathBuf {
    let bsf = format!("setts=pts={expr}");
    generate(
        &dir(),
        name,
        &[
            "-f",
            "lavfi",
            "-i",
            "testsrc=size=64x48:rate=10",
            "-frames:v",
            "20",
            "-c:v",
            "mpeg4",
            "-g",
            "6",
            "-bsf:v",
            &bsf,
        ],
    )
}

#[test]
fn backward_and_zigzag_timestamps_lose_no_frame() {
    for (name, expr) in [("backwards.mkv", "(19-N)*100"), ("zigzag.mkv", "if(mod(N\\,2)\\,PTS-100\\,PTS+100)")] {
        let path = retimed(name, expr);
        let reference = full(&path, &ClipOptions::default());
        assert_eq!(reference.buffer.shape()[0], 20, "{name}");
        let req = request(ClipStarts::Indices(vec![0, 7, 12, 16]), 4, ClipStep::Stride(1));
        let got = clips(&path, &req, &ClipOptions::default());
        assert_matches_full(&path, &got, &reference);
        let distinct = got.buffer.as_bytes().chunks_exact(64 * 48 * 3).collect::<std::collections::HashSet<_>>();
        assert_eq!(distinct.len(), 16, "{name}: every clip frame is a distinct picture");
    }
}

#[test]
fn frames_before_the_first_keyframe_are_not_indexed() {
    // An H.264 stream whose first 5 packets (its keyframe among them) are dropped: it starts mid-GOP.
    let path = generate(
        &dir(),
        "headless.mkv",
        &[
            "-f",
            "lavfi",
            "-i",
            "testsrc2=size=96x64:rate=30",
            "-frames:v",
            "90",
            "-c:v",
            "libx264",
            "-preset",
            "veryfast",
            "-bf",
            "0",
            "-g",
            "30",
            "-bsf:v",
            "noise=drop=lt(n\\,5)",
        ],
    );
    let packets = demux_video(path.as_path(), &DemuxOptions::default()).expect("demux");
    let timeline = Timeline::new(&packets);
    // 85 packets, of which the first keyframe is the 26th (frame 30 of the source).
    assert_eq!(timeline.len(), 60, "{:?}", timeline.times().first());
    let got = clips(&path, &request(ClipStarts::Indices(vec![0, 40]), 5, ClipStep::Stride(1)), &ClipOptions::default());
    assert_eq!(got.buffer.shape()[0], 2);
    assert!((got.pts_s[0] - 1.0).abs() < 1e-6, "{:?}", got.pts_s);
}

#[test]
fn clips_past_the_end_are_refused_or_padded_as_asked() {
    let path = h264_bframes();
    let mut req = request(ClipStarts::Indices(vec![115]), 8, ClipStep::Stride(1));
    let err = load_clips(path.as_path(), &req, &ClipOptions::default(), &system_allocator()).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, Error::InvalidOptions(_)) && msg.contains("clip 0") && msg.contains("5 of its 8"), "{msg}");
    assert!(msg.contains("h264_b.mp4"), "{msg}");
    req.past_end = PastEnd::RepeatLast;
    assert_eq!(clips(&path, &req, &ClipOptions::default()).indices, vec![115, 116, 117, 118, 119, 119, 119, 119]);
    req.past_end = PastEnd::Wrap;
    assert_eq!(clips(&path, &req, &ClipOptions::default()).indices, vec![115, 116, 117, 118, 119, 115, 116, 117]);
    // A start past the end is refused under every policy.
    req.starts = ClipStarts::Indices(vec![120]);
    let err = load_clips(path.as_path(), &req, &ClipOptions::default(), &system_allocator()).unwrap_err();
    assert!(err.to_string().contains("past the end"), "{err}");
    req.starts = ClipStarts::Times(vec![4.0]);
    assert!(load_clips(path.as_path(), &req, &ClipOptions::default(), &system_allocator()).is_err());
}

#[test]
fn oversized_requests_are_refused_before_anything_is_allocated() {
    let path = h264_bframes();
    let packets = demux_video(path.as_path(), &DemuxOptions::default()).expect("demux");
    // 10^6 clips of 10^6 frames: refused from the arguments, before a 10^12-slot plan is built.
    let huge = request(ClipStarts::Indices(vec![0; 1_000_000]), 1_000_000, ClipStep::Stride(1));
    let err = plan_clips(&packets, &huge, &ClipOptions::default()).unwrap_err();
    assert!(matches!(err, Error::LimitExceeded { .. }), "{err}");
    // Output bytes: 64 clips of 64 frames at 8192x8192 are 824 GB.
    let big = ClipOptions { size: Some((8192, 8192)), ..Default::default() };
    let req = request(ClipStarts::Indices(vec![0; 64]), 64, ClipStep::Stride(1));
    let err = plan_clips(&packets, &req, &big).unwrap_err();
    assert!(matches!(&err, Error::LimitExceeded { what, .. } if what.contains("output bytes")), "{err}");
    // A smaller limit applies as set.
    let small =
        ClipOptions { limits: VideoLimits { max_output_bytes: 1 << 20, ..Default::default() }, ..Default::default() };
    let req = request(ClipStarts::Indices(vec![0, 10]), 64, ClipStep::Stride(1));
    assert!(matches!(plan_clips(&packets, &req, &small), Err(Error::LimitExceeded { .. })));
    // Bad requests.
    for bad in [
        request(ClipStarts::Indices(vec![0]), 0, ClipStep::Stride(1)),
        request(ClipStarts::Indices(vec![0]), 4, ClipStep::Stride(0)),
        request(ClipStarts::Indices(vec![0]), 4, ClipStep::Fps(f64::NAN)),
        request(ClipStarts::Times(vec![-1.0]), 4, ClipStep::Stride(1)),
    ] {
        assert!(
            matches!(plan_clips(&packets, &bad, &ClipOptions::default()), Err(Error::InvalidOptions(_))),
            "{bad:?}"
        );
    }
}

#[test]
fn samplers_follow_from_the_seed_and_the_video_alone() {
    let path = h264_bframes();
    let packets = demux_video(path.as_path(), &DemuxOptions::default()).expect("demux");
    let timeline = Timeline::new(&packets);
    let make = |s: ClipSampler| s.request(&timeline, 16, ClipStep::Stride(2), PastEnd::Error).expect("sample");
    let a = make(ClipSampler::RandomIndices { num_clips: 6, seed: 11 });
    assert_eq!(a, make(ClipSampler::RandomIndices { num_clips: 6, seed: 11 }));
    assert_ne!(a.starts, make(ClipSampler::RandomIndices { num_clips: 6, seed: 12 }).starts);
    let ClipStarts::Indices(v) = &a.starts else { panic!("{a:?}") };
    assert!(v.windows(2).all(|w| w[0] <= w[1]) && v.iter().all(|&i| i + 30 < 120), "{v:?}");
    // The same draws whatever the run: pinned values.
    let pinned = ClipSampler::RandomIndices { num_clips: 3, seed: 0 };
    assert_eq!(make(pinned).starts, ClipStarts::Indices(vec![2, 38, 79]));
    let r = make(ClipSampler::RegularIndices { num_clips: 4 });
    assert_eq!(r.starts, ClipStarts::Indices(vec![0, 30, 59, 89]));
    let t = make(ClipSampler::RandomTimes { num_clips: 5, seed: 3 });
    let ClipStarts::Times(ts) = &t.starts else { panic!("{t:?}") };
    assert!(ts.iter().all(|&x| (0.0..=4.0).contains(&x)), "{ts:?}");
    assert_eq!(t, make(ClipSampler::RandomTimes { num_clips: 5, seed: 3 }));
    // Every sampled request decodes (the clips fit).
    for s in [
        ClipSampler::RandomIndices { num_clips: 6, seed: 11 },
        ClipSampler::RegularIndices { num_clips: 4 },
        ClipSampler::RandomTimes { num_clips: 5, seed: 3 },
        ClipSampler::RegularTimes { num_clips: 3 },
    ] {
        let req = make(s);
        let got = clips(&path, &req, &ClipOptions::default());
        assert_eq!(got.buffer.shape()[..2], [req.starts.len(), 16], "{s:?}");
    }
    // The whole video at 10 fps in clips of 8: 4 s -> 40 ticks -> 5 clips, none past the end.
    let all = ClipSampler::AllAtFps { fps: 10.0 }.request(&timeline, 8, ClipStep::Stride(1), PastEnd::Error).unwrap();
    assert_eq!(all.starts.len(), 5);
    let got = clips(&path, &all, &ClipOptions::default());
    assert_eq!(got.indices.iter().step_by(3).copied().collect::<Vec<_>>()[..4], [0, 9, 18, 27]);
    assert_eq!(got.indices.last(), Some(&117));
}
