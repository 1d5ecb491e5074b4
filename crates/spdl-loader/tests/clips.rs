//! The clip recipe end to end on videos made here with the `ffmpeg` CLI: every good video comes out once per
//! epoch with its clips' shape, a corrupt one is a failed item of `decode`, the run ends; options are checked.
//!
//! Decoding needs FFmpeg: linked in (`--features video,spdl-io/ffmpeg-linked`) or a `libspdl_ffmpeg{M}.so`
//! backend beside the test binary. Without either, the decoding tests fail saying so.
#![cfg(feature = "video")]

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;

use spdl_loader::{ClipLoader, ClipLoaderOptions, ClipSampling, ListOptions, Listing, LoaderError, VIDEO_EXTENSIONS};

/// Fails (never skips) where this build cannot decode video.
fn ffmpeg_available() -> bool {
    let status = spdl_io::media::ffmpeg_status();
    assert!(
        status.available,
        "no FFmpeg in this build (run with --features video,spdl-io/ffmpeg-linked, as `cargo xtask test` does): {}",
        status.error.unwrap_or_default()
    );
    true
}

fn make_video(path: &Path, seconds_frames: u32) {
    let status = Command::new("ffmpeg")
        .args(["-y", "-hide_banner", "-loglevel", "error", "-nostdin", "-f", "lavfi", "-i"])
        .arg("testsrc2=size=96x64:rate=30")
        .args(["-frames:v", &seconds_frames.to_string(), "-c:v", "libx264", "-g", "30", "-pix_fmt", "yuv420p"])
        .arg(path)
        .status()
        .expect("the `ffmpeg` CLI is needed to make the test videos (apt-get install ffmpeg)");
    assert!(status.success(), "ffmpeg failed to make {}", path.display());
}

/// 6 good videos and one corrupt `bad.mp4` (plus a file the listing skips).
fn corpus() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for i in 0..6 {
        make_video(&dir.path().join(format!("v{i}.mp4")), 60);
    }
    let mut x = 0x1234_5678_9abc_def0u64;
    let junk: Vec<u8> = (0..4096)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    std::fs::write(dir.path().join("bad.mp4"), junk).unwrap();
    std::fs::write(dir.path().join("notes.txt"), b"not a video").unwrap();
    dir
}

fn listing(dir: &Path) -> Listing {
    Listing::open_with_extensions(dir.to_str().unwrap(), &ListOptions::default(), VIDEO_EXTENSIONS).unwrap()
}

#[test]
fn every_good_video_comes_out_once_per_epoch_and_the_bad_one_is_a_failed_decode() {
    if !ffmpeg_available() {
        return;
    }
    let dir = corpus();
    let listing = listing(dir.path());
    assert_eq!(listing.samples.len(), 7);
    let opts = ClipLoaderOptions { batch_size: 3, threads: 2, epochs: 2, ..ClipLoaderOptions::default() };
    let loader = ClipLoader::new(listing, opts).unwrap();
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut clips = 0;
    for batch in loader.pipeline() {
        let batch = batch.expect("batch");
        assert_eq!(batch.clips.len(), batch.labels.len());
        assert_eq!(batch.items.len(), batch.len());
        for (buf, item) in batch.clips.iter().zip(&batch.items) {
            assert_eq!(buf.shape(), &[4, 16, 112, 112, 3], "{item}");
            assert!(buf.as_bytes().iter().any(|&b| b != 0), "{item}: decoded frames are not all black");
            *seen.entry(Path::new(item).file_name().unwrap().to_string_lossy().into_owned()).or_default() += 1;
        }
        clips += batch.num_clips();
    }
    let mut names: Vec<_> = seen.keys().cloned().collect();
    names.sort();
    assert_eq!(names, (0..6).map(|i| format!("v{i}.mp4")).collect::<Vec<_>>());
    assert!(seen.values().all(|&n| n == 2), "{seen:?}");
    assert_eq!(clips, 6 * 2 * 4);
    let stats = loader.pipeline().stats();
    let decode = stats.stage("decode").expect("a decode stage");
    assert_eq!(decode.items_failed, 2, "bad.mp4 fails once per epoch");
    assert_eq!(stats.stage("read").map_or(0, |s| s.items_failed), 0);
    assert_eq!(loader.failed_videos(), 2);
    assert_eq!(loader.videos_per_epoch(), 7);
}

#[test]
fn regular_clips_at_the_coded_size_are_the_same_every_run() {
    if !ffmpeg_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    make_video(&dir.path().join("a.mp4"), 60);
    let run = || {
        let opts = ClipLoaderOptions {
            num_clips: 3,
            num_frames: 5,
            size: None,
            sampling: ClipSampling::Regular,
            threads: 1,
            ..ClipLoaderOptions::default()
        };
        let loader = ClipLoader::new(listing(dir.path()), opts).unwrap();
        let batches: Vec<_> = loader.pipeline().into_iter().map(|b| b.unwrap()).collect();
        assert_eq!(batches.len(), 1);
        let buf = &batches[0].clips[0];
        assert_eq!(buf.shape(), &[3, 5, 64, 96, 3]);
        buf.as_bytes().to_vec()
    };
    assert_eq!(run(), run());
}

#[test]
fn out_of_range_options_are_refused_before_anything_runs() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a.mp4"), b"x").unwrap();
    let cases = [
        ("num_clips", ClipLoaderOptions { num_clips: 0, ..Default::default() }),
        ("num_frames", ClipLoaderOptions { num_clips: 1024, num_frames: 1024, ..Default::default() }),
        ("size", ClipLoaderOptions { size: Some((0, 112)), ..Default::default() }),
        ("size", ClipLoaderOptions { size: Some((100_000, 112)), ..Default::default() }),
        ("size", ClipLoaderOptions { num_frames: 4096, size: Some((8192, 8192)), ..Default::default() }),
        ("batch_size", ClipLoaderOptions { batch_size: 0, ..Default::default() }),
        ("threads", ClipLoaderOptions { threads: 0, ..Default::default() }),
        ("epochs", ClipLoaderOptions { epochs: 0, ..Default::default() }),
    ];
    for (option, opts) in cases {
        match ClipLoader::new(listing(dir.path()), opts) {
            Err(LoaderError::InvalidOption { option: o, .. }) => assert_eq!(o, option),
            other => panic!("{option}: expected InvalidOption, got {other:?}"),
        }
    }
}

#[test]
fn a_directory_without_videos_is_empty() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a.jpg"), b"x").unwrap();
    let err = Listing::open_with_extensions(dir.path().to_str().unwrap(), &ListOptions::default(), VIDEO_EXTENSIONS)
        .unwrap_err();
    assert!(matches!(err, LoaderError::Empty { .. }), "{err}");
    assert!(err.to_string().contains("mp4"), "{err}");
}
