//! The intact files every corruption starts from: images drawn by [`crate::synth`], a WAV written here, and
//! compressed audio/video made from it with the `ffmpeg` command-line tool when it is installed.

use std::path::Path;
use std::process::Command;

use super::{CorpusError, Family, Result};
use crate::image::ImageFormat;

/// One intact file of a format.
#[derive(Debug)]
pub(crate) struct Seed {
    /// Short format name, also the corpus sub-directory (`"jpeg"`, `"flac"`, `"mp4"`, ...).
    pub format: &'static str,
    /// The usual extension, without the dot.
    pub ext: &'static str,
    /// Which decoders read it.
    pub family: Family,
    /// The encoded bytes.
    pub bytes: Vec<u8>,
}

/// Side of the seed images: small, so that the corpus decodes fast, but several JPEG MCUs and PNG rows.
const IMAGE_W: u32 = 96;
const IMAGE_H: u32 = 72;

/// Audio seed: 0.5 s of stereo 16 kHz, 16-bit.
const RATE: u32 = 16_000;
const CHANNELS: u16 = 2;
const FRAMES: u32 = RATE / 2;

/// One seed image per format, two for JPEG (baseline and progressive decode differently).
pub(crate) fn images(seed: u64) -> Result<Vec<Seed>> {
    let px = crate::synth::photo(seed, IMAGE_W, IMAGE_H);
    let enc = |f: ImageFormat| {
        crate::synth::encode(&px, IMAGE_W, IMAGE_H, f).map_err(|source| CorpusError::Seed { format: f.name(), source })
    };
    let mut out = vec![
        Seed { format: "jpeg", ext: "jpg", family: Family::Image, bytes: enc(ImageFormat::Jpeg)? },
        Seed {
            format: "jpeg-progressive",
            ext: "jpg",
            family: Family::Image,
            bytes: crate::synth::encode_jpeg(&px, IMAGE_W, IMAGE_H, 90, true)
                .map_err(|source| CorpusError::Seed { format: "progressive JPEG", source })?,
        },
    ];
    for (format, f) in [
        ("png", ImageFormat::Png),
        ("webp", ImageFormat::Webp),
        ("gif", ImageFormat::Gif),
        ("bmp", ImageFormat::Bmp),
        ("tiff", ImageFormat::Tiff),
    ] {
        out.push(Seed { format, ext: f.extension(), family: Family::Image, bytes: enc(f)? });
    }
    Ok(out)
}

/// A 16-bit PCM WAV: a 440 Hz tone on the left, 660 Hz on the right, with a fixed 44-byte header (the
/// header patches in `headers.rs` rely on that layout).
pub(crate) fn wav() -> Seed {
    let data_len = FRAMES * u32::from(CHANNELS) * 2;
    let mut b = Vec::with_capacity(44 + data_len as usize);
    b.extend_from_slice(b"RIFF");
    b.extend_from_slice(&(36 + data_len).to_le_bytes());
    b.extend_from_slice(b"WAVEfmt ");
    b.extend_from_slice(&16u32.to_le_bytes());
    b.extend_from_slice(&1u16.to_le_bytes()); // PCM
    b.extend_from_slice(&CHANNELS.to_le_bytes());
    b.extend_from_slice(&RATE.to_le_bytes());
    b.extend_from_slice(&(RATE * u32::from(CHANNELS) * 2).to_le_bytes());
    b.extend_from_slice(&(CHANNELS * 2).to_le_bytes());
    b.extend_from_slice(&16u16.to_le_bytes());
    b.extend_from_slice(b"data");
    b.extend_from_slice(&data_len.to_le_bytes());
    for i in 0..FRAMES {
        let t = i as f32 / RATE as f32;
        for hz in [440.0f32, 660.0] {
            let s = ((t * hz * std::f32::consts::TAU).sin() * 12_000.0) as i16;
            b.extend_from_slice(&s.to_le_bytes());
        }
    }
    Seed { format: "wav", ext: "wav", family: Family::Audio, bytes: b }
}

/// How one compressed seed is made with `ffmpeg` from the WAV seed (and a test pattern for video).
struct Recipe {
    format: &'static str,
    ext: &'static str,
    family: Family,
    /// Codec and muxer options, between the inputs and the output file.
    args: &'static [&'static str],
}

const RECIPES: &[Recipe] = &[
    Recipe { format: "flac", ext: "flac", family: Family::Audio, args: &["-c:a", "flac"] },
    Recipe { format: "mp3", ext: "mp3", family: Family::Audio, args: &["-c:a", "libmp3lame", "-b:a", "48k"] },
    Recipe { format: "ogg", ext: "ogg", family: Family::Audio, args: &["-c:a", "libvorbis", "-q:a", "2"] },
    Recipe { format: "m4a", ext: "m4a", family: Family::Audio, args: &["-c:a", "aac", "-b:a", "48k"] },
    Recipe { format: "aac", ext: "aac", family: Family::Audio, args: &["-c:a", "aac", "-b:a", "48k", "-f", "adts"] },
    Recipe {
        format: "mp4",
        ext: "mp4",
        family: Family::Video,
        args: &["-c:v", "libx264", "-preset", "ultrafast", "-pix_fmt", "yuv420p", "-c:a", "aac", "-b:a", "48k"],
    },
    Recipe {
        format: "mkv",
        ext: "mkv",
        family: Family::Video,
        args: &["-c:v", "libx264", "-preset", "ultrafast", "-pix_fmt", "yuv420p", "-c:a", "libvorbis"],
    },
    Recipe {
        format: "webm",
        ext: "webm",
        family: Family::Video,
        args: &["-c:v", "libvpx", "-b:v", "200k", "-c:a", "libvorbis"],
    },
];

/// Whether the `ffmpeg` command runs.
pub(crate) fn ffmpeg_available() -> bool {
    Command::new("ffmpeg").arg("-version").output().is_ok_and(|o| o.status.success())
}

/// Encodes the compressed audio and video seeds with `ffmpeg` from the WAV at `wav_path`, in `work`.
/// Returns the seeds made and, for each one that could not be made, why.
pub(crate) fn compressed(wav_path: &Path, work: &Path) -> (Vec<Seed>, Vec<String>) {
    let mut seeds = Vec::new();
    let mut skipped = Vec::new();
    for r in RECIPES {
        match encode(r, wav_path, work) {
            Ok(bytes) => seeds.push(Seed { format: r.format, ext: r.ext, family: r.family, bytes }),
            Err(e) => skipped.push(format!("{}: {e}", r.format)),
        }
    }
    (seeds, skipped)
}

/// The seed of recipe `r`, or why it could not be made.
fn encode(r: &Recipe, wav_path: &Path, work: &Path) -> std::result::Result<Vec<u8>, String> {
    let out = work.join(format!("seed.{}", r.ext));
    let mut cmd = Command::new("ffmpeg");
    cmd.args(["-hide_banner", "-loglevel", "error", "-nostdin", "-y", "-threads", "1"]);
    if r.family == Family::Video {
        cmd.args(["-f", "lavfi", "-i", "testsrc=size=64x48:rate=10:duration=0.5"]);
    }
    cmd.arg("-i").arg(wav_path).args(r.args).args(["-map_metadata", "-1", "-fflags", "+bitexact"]);
    if r.family == Family::Video {
        cmd.arg("-shortest");
    }
    let output = cmd.arg(&out).output().map_err(|e| format!("cannot run ffmpeg: {e}"))?;
    if !output.status.success() {
        return Err(format!("ffmpeg failed: {}", String::from_utf8_lossy(&output.stderr).trim()));
    }
    let bytes = std::fs::read(&out).map_err(|e| format!("cannot read {}: {e}", out.display()))?;
    // Best effort: the work directory is removed by the caller anyway.
    let _ = std::fs::remove_file(&out);
    if bytes.is_empty() {
        return Err("ffmpeg wrote an empty file".into());
    }
    Ok(bytes)
}
