//! Video decoding (feature `ffmpeg`): frames of a time window into one `[N, H, W, C]` `u8` buffer.
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
//! This module holds the API; its options, sampling and output types are `crate::types`' (the FFmpeg backend
//! names them too), and the demuxing and decoding themselves are the backend's, which the audio API and
//! [`crate::probe`] use too.

mod clips;

use spdl_buffer::SharedAllocator;

use crate::Result;
use crate::input::MediaInput;

pub use crate::types::media::Packets;
pub use crate::types::video::{
    DecodeOptions, DemuxOptions, FramePixelFormat, FrameSampling, Frames, ScaleFilter, VideoLimits, VideoOptions,
};
pub use clips::{
    ClipOptions, ClipPlan, ClipRequest, ClipSampler, ClipStarts, ClipStats, ClipStep, Clips, MAX_SAMPLED_CLIPS,
    PastEnd, Timeline, decode_clips, decode_clips_into, load_clips, load_sampled_clips, plan_clips, plan_on,
    sample_starts,
};

/// Reads the packets of the best video stream of `input` that `opts.window` needs (from the keyframe
/// before it).
///
/// Errors: [`crate::Error::UnknownFormat`] (no demuxer recognises it, no video stream), [`crate::Error::Decode`]
/// (corrupt container, e.g. an MP4 without its `moov` atom), [`crate::Error::LimitExceeded`],
/// [`crate::Error::Io`], [`crate::Error::Unavailable`] (no FFmpeg on this machine).
pub fn demux_video<'a>(input: impl Into<MediaInput<'a>>, opts: &DemuxOptions) -> Result<Packets> {
    let input = input.into();
    crate::media::backend()?.demux_video(&input, opts)
}

/// Decodes `packets` into one `[N, H, W, C]` `u8` buffer from `allocator`, sampled by `opts.sampling` and
/// converted to `opts.pixel_format` at `opts.size`. Frames that are not selected are decoded (later frames
/// may depend on them) but never converted. A frame that cannot be decoded leaves out its slot (the buffer
/// is then compacted; `pts_s` tells which frames came out).
pub fn decode_packets(packets: Packets, opts: &DecodeOptions, allocator: &SharedAllocator) -> Result<Frames> {
    crate::media::backend()?.decode_packets(packets, opts, allocator)
}

/// Demuxes and decodes `input` in one call ([`demux_video`] + [`decode_packets`]).
///
/// ```no_run
/// use spdl_buffer::system_allocator;
/// use spdl_io::TimeWindow;
/// use spdl_io::video::{DecodeOptions, FrameSampling, VideoOptions, decode_video};
/// use std::path::Path;
///
/// let opts = VideoOptions {
///     window: Some(TimeWindow::new(2.0, 4.0)),
///     decode: DecodeOptions { sampling: FrameSampling::Uniform(8), size: Some((224, 224)), ..Default::default() },
///     ..Default::default()
/// };
/// let frames = decode_video(Path::new("clip.mp4"), &opts, &system_allocator())?;
/// assert_eq!(frames.buffer.shape(), &[8, 224, 224, 3]);
/// # Ok::<(), spdl_io::Error>(())
/// ```
pub fn decode_video<'a>(
    input: impl Into<MediaInput<'a>>,
    opts: &VideoOptions,
    allocator: &SharedAllocator,
) -> Result<Frames> {
    opts.decode.validate()?;
    let packets = demux_video(input, &DemuxOptions { window: opts.window, limits: opts.limits })?;
    decode_packets(packets, &opts.decode, allocator)
}

#[cfg(test)]
mod tests {
    #[test]
    fn packets_are_send() {
        fn send<T: Send>() {}
        send::<super::Packets>();
        send::<super::Frames>();
    }
}
