//! The FFmpeg backend (feature `ffmpeg`; ffmpeg-next over the system's FFmpeg 5.1+ libraries): every call
//! into libav* lives here, behind crate-private functions that [`crate::video`], [`crate::audio`] and
//! [`crate::probe`] call. `audio` and `video` share this backend and never call each other.
//!
//! - `avio`: FFmpeg set-up, errors, and opening a [`crate::MediaInput`] (a path or in-memory bytes)
//!   through a custom AVIO read/seek context, so bytes fetched from object storage need no temp file and
//!   a path is never read as an FFmpeg protocol URL.
//! - `demux`: the packets of a video stream that a time window needs ([`Packets`], owned and `Send`).
//! - `video`: libavcodec video decoding and swscale conversion into one `[N, H, W, C]` buffer.
//! - `audio`: libavcodec audio decoding into the audio API's planar `f32` scratch (what symphonia cannot
//!   read, and MP3/Vorbis, which libavcodec decodes faster).
//! - `probe`: every stream of any container FFmpeg reads.
//! - `media`, `frames`: SPDL's streaming objects ([`crate::media`]): a `Demuxer` kept open over a source,
//!   owned packets and frames, a streaming `Decoder` with an optional filter graph, `convert_frames`.
//!
//! FFmpeg's own log is quiet unless `SPDL_FFMPEG_LOG` is set (`error`, `warning`, `info`, `debug`).

mod audio;
mod avio;
mod bsf;
mod demux;
mod frames;
mod media;
mod probe;
mod video;

pub use demux::{Packets, demux_video};
pub use video::decode_packets;

/// SPDL's demuxing and decoding objects (see [`crate::media`]).
pub mod objects {
    pub use super::bsf::Bsf;
    pub use super::frames::{
        DecodeConfig, Decoder, FilterGraph, MediaFrames, convert_frames, decode_all, reference_audio_frame,
        reference_video_frames,
    };
    pub use super::media::{Codec, DemuxConfig, Demuxer, Fraction, MediaPackets, MediaType};
}

pub(crate) use audio::decode_audio_track;
pub(crate) use probe::probe_ffmpeg;
