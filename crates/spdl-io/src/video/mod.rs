//! Video decoding through FFmpeg (feature `ffmpeg`; ffmpeg-next over the system's FFmpeg 5.1+ libraries).
//!
//! Demuxing and decoding are separate steps, so a pipeline can run them as separate stages (demuxing is
//! I/O, decoding is CPU): [`demux_video`] reads the packets a time window needs (from the keyframe before
//! it) into an owned, `Send` [`Packets`]; [`decode_packets`] decodes them into one `[N, H, W, C]` `u8`
//! buffer from any [`spdl_buffer::HostAllocator`]. [`decode_video`] does both.
//!
//! Inputs are paths or in-memory bytes ([`crate::MediaInput`]); both go through a custom AVIO read/seek
//! context, so bytes fetched from object storage decode without a temp file.
//!
//! Frame sampling ([`FrameSampling`]: every frame, every k-th, a target fps, or N spread uniformly) is
//! decided from the packet timestamps before decoding; frames that are not selected are decoded (later
//! frames may reference them) but never converted. The selected ones are scaled and converted to RGB24
//! or gray by swscale straight into their slot of the output buffer.
//!
//! Bounded work: [`VideoLimits`] caps packets, packet bytes, decoded frames, frame size and output size;
//! corrupt input (a cut file, flipped bytes, an MP4 without its `moov` atom) gives a typed
//! [`crate::Error`] naming the item. FFmpeg's own log is quiet unless `SPDL_FFMPEG_LOG` is set (`error`,
//! `warning`, `info`, `debug`).
//!
//! The audio API ([`crate::audio`]) falls back to FFmpeg for audio that symphonia cannot read, and
//! [`crate::probe`] uses FFmpeg when this feature is on.

mod audio;
mod decode;
mod demux;
mod ffio;
mod probe;

pub use decode::{
    DecodeOptions, FrameSampling, Frames, PixelFormat, ScaleFilter, VideoOptions, decode_packets, decode_video,
};
pub use demux::{DemuxOptions, Packets, VideoLimits, demux_video};

pub(crate) use audio::decode_audio_track;
pub(crate) use probe::probe_ffmpeg;

#[cfg(test)]
mod tests {
    #[test]
    fn packets_are_send() {
        fn send<T: Send>() {}
        send::<super::Packets>();
        send::<super::Frames>();
    }
}
