//! `spdl probe FILE [--json]` on real media: a PNG, a WAV, and (with the `ffmpeg` feature) an MP4 with an
//! H.264 video stream and an AAC audio stream made with the `ffmpeg` CLI.

use std::path::Path;
use std::process::Command;

fn spdl(args: &[&str], file: &Path) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_spdl")).args(args).arg(file).output().expect("run spdl");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn probe_json(file: &Path) -> serde_json::Value {
    let (ok, stdout, stderr) = spdl(&["probe", "--json"], file);
    assert!(ok, "spdl probe --json {} failed: {stderr}", file.display());
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {stdout}"))
}

#[test]
fn probe_png_and_wav() {
    let dir = tempfile::tempdir().unwrap();
    let png = dir.path().join("a.png");
    image_png(&png, 37, 21);
    let v = probe_json(&png);
    assert_eq!(v["prober"], "image");
    assert_eq!(v["streams"][0]["kind"], "image");
    assert_eq!(v["streams"][0]["width"], 37);
    assert_eq!(v["streams"][0]["height"], 21);

    let wav = dir.path().join("b.wav");
    // 0.25 s of stereo at 8 kHz.
    std::fs::write(&wav, spdl_io::audio::encode_wav_i16(&vec![0i16; 4000], 2, 8000)).unwrap();
    let v = probe_json(&wav);
    let s = &v["streams"][0];
    assert_eq!(s["kind"], "audio");
    assert_eq!(s["sample_rate"], 8000);
    assert_eq!(s["channels"], 2);
    assert!((s["duration_s"].as_f64().unwrap() - 0.25).abs() < 1e-6, "{v}");

    let (ok, text, _) = spdl(&["probe"], &wav);
    assert!(ok);
    assert!(text.contains("audio") && text.contains("8000 Hz") && text.contains("2 ch"), "{text}");
}

#[test]
fn probe_missing_and_garbage_files_fail_with_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope.mp4");
    let (ok, _, err) = spdl(&["probe"], &missing);
    assert!(!ok);
    assert!(err.contains("nope.mp4"), "{err}");

    let garbage = dir.path().join("garbage.bin");
    std::fs::write(&garbage, b"this is not a media file at all, just some text bytes").unwrap();
    let (ok, _, err) = spdl(&["probe"], &garbage);
    assert!(!ok);
    assert!(err.contains("garbage.bin"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

#[cfg(feature = "ffmpeg")]
#[test]
fn probe_video_with_audio() {
    if !Command::new("ffmpeg").arg("-version").output().is_ok_and(|o| o.status.success()) {
        panic!("the ffmpeg CLI is required for this test (cargo xtask test installs it)");
    }
    let dir = tempfile::tempdir().unwrap();
    let mp4 = dir.path().join("clip.mp4");
    let status = Command::new("ffmpeg")
        .args(["-hide_banner", "-loglevel", "error", "-y"])
        .args(["-f", "lavfi", "-i", "testsrc=size=160x120:rate=25:duration=2"])
        .args(["-f", "lavfi", "-i", "sine=frequency=440:sample_rate=22050:duration=2"])
        .args(["-c:v", "libx264", "-pix_fmt", "yuv420p", "-c:a", "aac", "-shortest"])
        .arg(&mp4)
        .status()
        .unwrap();
    assert!(status.success());
    let v = probe_json(&mp4);
    assert_eq!(v["prober"], "ffmpeg");
    let streams = v["streams"].as_array().unwrap();
    let video = streams.iter().find(|s| s["kind"] == "video").expect("a video stream");
    assert_eq!(video["codec"], "h264");
    assert_eq!((video["width"].as_u64(), video["height"].as_u64()), (Some(160), Some(120)));
    assert!((video["frame_rate"].as_f64().unwrap() - 25.0).abs() < 0.01, "{video}");
    let audio = streams.iter().find(|s| s["kind"] == "audio").expect("an audio stream");
    assert_eq!(audio["codec"], "aac");
    assert_eq!(audio["sample_rate"], 22050);
    let d = v["duration_s"].as_f64().unwrap();
    assert!((1.9..2.2).contains(&d), "duration {d}");

    let (ok, text, _) = spdl(&["probe"], &mp4);
    assert!(ok);
    assert!(text.contains("video h264, 160x120") && text.contains("audio aac"), "{text}");
}

/// A small photo-like PNG from spdl-io's synthetic generator.
fn image_png(path: &Path, w: u32, h: u32) {
    let rgb = spdl_io::synth::photo(7, w, h);
    let img = spdl_io::synth::encode(&rgb, w, h, spdl_io::image::ImageFormat::Png).expect("encode png");
    std::fs::write(path, img).unwrap();
}

#[test]
fn version_names_the_decoders_found() {
    for args in [&["--version"][..], &["probe", "--version"][..]] {
        let out = Command::new(env!("CARGO_BIN_EXE_spdl")).args(args).output().expect("run spdl");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "spdl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        assert!(text.starts_with(concat!("spdl ", env!("CARGO_PKG_VERSION"))), "{text}");
        let jpeg = text.lines().find_map(|l| l.strip_prefix("jpeg: ")).unwrap_or_default();
        assert!(jpeg.starts_with("libjpeg-turbo 3") || jpeg == "zune-jpeg", "{text}");
        let ffmpeg = text.lines().find_map(|l| l.strip_prefix("ffmpeg: ")).unwrap_or_default();
        if cfg!(feature = "ffmpeg") {
            // Built with FFmpeg linked in: the versions of the libraries it runs with.
            assert!(ffmpeg.contains("libavcodec ") && ffmpeg.contains("(linked)"), "{text}");
        } else {
            assert!(ffmpeg.starts_with("not built in"), "{text}");
        }
        assert!(text.lines().any(|l| l.starts_with("cuda: ")), "{text}");
    }
}
