#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]
//! Media decoding for spdl-rs: images, audio and video decoded straight into [`spdl_buffer::Buffer`]s.
//!
//! A data loader's decode stage: encoded bytes (a file, or bytes fetched from object storage) in, one
//! contiguous tensor out, written into memory from any [`spdl_buffer::HostAllocator`] (the system heap, or
//! `spdl_cuda`'s pinned pool, so a batch goes to the GPU with no intermediate copy). Every function is
//! synchronous and CPU-bound, safe to call from many threads at once, and bounded: limits on pixels,
//! samples, packets and frames stop hostile input, and every failure is an [`Error`] that names the item.
//!
//! Where to start:
//! - **Images** (feature `image`, default): [`image::decode_image_batch`] or a reusable
//!   [`image::BatchDecoder`]: N images, decoded in parallel and resized/cropped/normalized into one
//!   `[N, H, W, C]` or `[N, C, H, W]` buffer. Pure Rust (zune-jpeg, image, fast_image_resize).
//! - **Audio** (feature `audio`, default): [`audio::decode_audio`] (one clip, `[C, T]` or `[T, C]`, `f32`
//!   or `i16`, a time window, resampling, channel selection) and [`audio::decode_audio_batch`]
//!   (`[N, C, T]`, each clip padded or truncated). PCM WAV takes a fast path straight into the output;
//!   FLAC, MP3, Ogg Vorbis and AAC decode with symphonia (pure Rust); with `ffmpeg`, FFmpeg reads the rest.
//! - **Video** (feature `ffmpeg`): `video::decode_video`, or `video::demux_video` then
//!   `video::decode_packets` as two pipeline stages (I/O, then CPU): frames of a time window, sampled
//!   (every k-th, fps, uniform) and converted to RGB24/gray at any size into one `[N, H, W, C]` buffer.
//! - **Inspecting**: [`probe`] describes the streams of a media file without decoding it.
//! - Inputs are [`MediaInput`]s: a path (read with seeks, so a window reads only what it needs) or
//!   in-memory bytes with a name for errors.
//!
//! Features: `image` and `audio` (default, pure Rust); `ffmpeg` (video, and audio symphonia cannot read,
//! through the system's FFmpeg libraries, found at run time: the first call that needs FFmpeg loads a
//! backend built for the FFmpeg major the machine has, see [`media::ffmpeg_status`]); `ffmpeg-linked` (the
//! same, with FFmpeg linked at build time through ffmpeg-next: needs the FFmpeg development packages and
//! libclang; it is how the backends themselves are built); `synth` (synthetic photo-like test images, for tests, demos and `cargo xtask gen-data`);
//! `corrupt` (a corpus of broken media for reliability tests, `corrupt::write_corpus`).
//!
//! # Example
//! Decode a clip held in memory (here a WAV made on the spot; a loader passes file contents or a path):
//! ```
//! use spdl_buffer::{DType, system_allocator};
//! use spdl_io::audio::{AudioOptions, decode_audio, encode_wav_i16};
//! use spdl_io::{MediaInput, StreamKind, probe};
//!
//! // 0.5 s of a stereo 440 Hz tone at 16 kHz.
//! let samples: Vec<i16> = (0..8000)
//!     .flat_map(|i| {
//!         let s = ((i as f32 * 440.0 / 16000.0 * std::f32::consts::TAU).sin() * 8000.0) as i16;
//!         [s, -s]
//!     })
//!     .collect();
//! let wav = encode_wav_i16(&samples, 2, 16_000);
//! let input = MediaInput::bytes(&wav, "tone.wav");
//!
//! let info = probe(input)?;
//! assert_eq!(info.streams[0].kind, StreamKind::Audio);
//!
//! let audio = decode_audio(input, &AudioOptions::default(), &system_allocator())?;
//! assert_eq!(audio.buffer.shape(), &[2, 8000]); // [C, T], f32 in [-1, 1]
//! assert_eq!(audio.buffer.dtype(), DType::F32);
//! assert_eq!((audio.sample_rate, audio.source.codec.as_str()), (16_000, "pcm_s16le"));
//! let left = &audio.buffer.as_slice::<f32>()?[..8000];
//! assert!(left.iter().all(|x| x.abs() <= 8000.0 / 32768.0));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![deny(missing_docs)]

mod decode_memory;
mod error;
pub mod input;

#[cfg(feature = "audio")]
pub mod audio;
#[cfg(feature = "ffmpeg")]
mod backend;
#[cfg(feature = "corrupt")]
pub mod corrupt;
#[cfg(feature = "ffmpeg-linked")]
mod ffmpeg;
#[cfg(feature = "image")]
pub mod image;
#[cfg(feature = "ffmpeg")]
pub mod media;
#[cfg(feature = "audio")]
mod probe;
#[cfg(feature = "synth")]
pub mod synth;
mod types;
#[cfg(feature = "ffmpeg")]
pub mod video;

pub use decode_memory::{
    UNMETERED_BYTES, decode_memory_budget, default_decode_memory_budget, set_decode_memory_budget,
};
pub use error::{Error, Result};
pub use input::{DEFAULT_MAX_FILE_BYTES, MediaInput, ReadLimits, TimeWindow, read_file};

#[cfg(feature = "audio")]
pub use probe::{MediaInfo, StreamInfo, StreamKind, probe};
