//! `spdl probe FILE`: streams, codecs, duration, size, frame rate and sample rate of an image, audio or
//! video file, as a table or as JSON.
//!
//! Images are read from their headers, audio through symphonia, and with the `ffmpeg` feature every
//! container FFmpeg knows (video, audio inside MP4/MKV, ...).

use std::path::Path;

use anyhow::{Context, Result};
use spdl_io::{MediaInfo, MediaInput, StreamInfo, StreamKind};

/// Prints what the file holds.
pub fn run(file: &Path, json: bool) -> Result<()> {
    let info = spdl_io::probe(MediaInput::from(file)).with_context(|| {
        if cfg!(feature = "ffmpeg") {
            format!("cannot probe {}", file.display())
        } else {
            format!(
                "cannot probe {} (this build reads images and audio; build with `--features ffmpeg` for video)",
                file.display()
            )
        }
    })?;
    if json {
        println!("{}", serde_json::to_string_pretty(&info)?);
    } else {
        print!("{}", render(&info));
    }
    Ok(())
}

/// The human-readable form: one header line, then one line per stream.
fn render(info: &MediaInfo) -> String {
    let mut out = format!("{}: {} ({} bytes", info.item, info.format, info.size_bytes);
    if let Some(d) = info.duration_s {
        out.push_str(&format!(", {d:.3} s"));
    }
    if let Some(b) = info.bit_rate {
        out.push_str(&format!(", {} kb/s", b / 1000));
    }
    out.push_str(&format!(", read by {})\n", info.prober));
    for s in &info.streams {
        out.push_str(&format!("  #{} {}\n", s.index, stream_line(s)));
    }
    out
}

fn stream_line(s: &StreamInfo) -> String {
    let kind = match s.kind {
        StreamKind::Video => "video",
        StreamKind::Audio => "audio",
        StreamKind::Image => "image",
        StreamKind::Subtitle => "subtitle",
        _ => "other",
    };
    let mut parts = vec![format!("{kind} {}", s.codec)];
    if let (Some(w), Some(h)) = (s.width, s.height) {
        parts.push(format!("{w}x{h}"));
    }
    if let Some(p) = &s.pixel_format {
        parts.push(p.clone());
    }
    if let Some(f) = s.frame_rate {
        parts.push(format!("{f:.3} fps"));
    }
    if let Some(r) = s.sample_rate {
        parts.push(format!("{r} Hz"));
    }
    if let Some(c) = s.channels {
        parts.push(format!("{c} ch"));
    }
    if let Some(f) = &s.sample_format {
        parts.push(f.clone());
    }
    if let Some(d) = s.duration_s {
        parts.push(format!("{d:.3} s"));
    }
    if let Some(n) = s.num_frames {
        parts.push(format!("{n} frames"));
    }
    if let Some(b) = s.bit_rate {
        parts.push(format!("{} kb/s", b / 1000));
    }
    parts.join(", ")
}
