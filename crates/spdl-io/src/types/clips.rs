//! A clip plan and what decoding one takes and tells (feature `ffmpeg`): made by [`crate::video::plan_clips`],
//! decoded by the FFmpeg backend.

use super::media::Packets;
use super::video::{DecodeOptions, FramePixelFormat, FrameSampling, ScaleFilter, VideoLimits};
use crate::{Error, Result};

/// How clip frames are decoded and converted.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ClipOptions {
    /// Output `(width, height)`; `None` keeps the coded size. Resizing is fused with the conversion.
    pub size: Option<(u32, u32)>,
    /// RGB or gray.
    pub pixel_format: FramePixelFormat,
    /// Interpolation when resizing.
    pub filter: ScaleFilter,
    /// Decoder threads (frame threading); `0` lets FFmpeg pick. Default 1.
    pub threads: usize,
    /// Skip decoding frames no clip keeps where the codec can tell nothing references them (default on).
    pub skip_unused: bool,
    /// Bounds on work and memory.
    pub limits: VideoLimits,
}

impl Default for ClipOptions {
    fn default() -> Self {
        ClipOptions {
            size: None,
            pixel_format: FramePixelFormat::Rgb24,
            filter: ScaleFilter::Bicubic,
            threads: 1,
            skip_unused: true,
            limits: VideoLimits::default(),
        }
    }
}

impl ClipOptions {
    /// Checks the options that do not depend on the video.
    pub fn validate(&self) -> Result<()> {
        DecodeOptions {
            sampling: FrameSampling::All,
            size: self.size,
            pixel_format: self.pixel_format,
            filter: self.filter,
            threads: self.threads,
        }
        .validate()
    }

    /// `(width, height)` of the output frames of `packets`.
    pub fn output_size(&self, packets: &Packets) -> Result<(u32, u32)> {
        let (w, h) = self.size.unwrap_or((packets.width(), packets.height()));
        if w == 0 || h == 0 {
            return Err(Error::Decode {
                item: packets.item().to_owned(),
                format: packets.codec().to_owned(),
                cause: "the container gives no frame size (set the output size)".into(),
            });
        }
        Ok((w, h))
    }
}

/// What decoding a plan did, for telling how much work sharing saved.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ClipStats {
    /// Frames the video has (from the first keyframe).
    pub frames_in_video: u64,
    /// Distinct frames the clips keep.
    pub frames_kept: u64,
    /// Frames the decoder produced.
    pub frames_decoded: u64,
    /// Frames converted (each kept frame once).
    pub frames_converted: u64,
    /// Packets sent to the decoder.
    pub packets_sent: u64,
    /// Packets sent marked skippable (frames no clip keeps).
    pub packets_skippable: u64,
    /// Runs of packets decoded (each from a keyframe; the decoder is flushed between runs).
    pub runs: u64,
}

/// How decoded frames are matched to the plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FrameMatch {
    /// By presentation timestamp.
    Pts,
    /// By output order (streams without timestamps): one run from the first packet.
    Ordinal,
}

/// A frame the clips keep.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct KeptFrame {
    /// Its timestamp (stream units; the output ordinal for [`FrameMatch::Ordinal`]).
    pub(crate) ts: i64,
    /// Its index in presentation order.
    pub(crate) index: u64,
    /// Its presentation time, seconds.
    pub(crate) pts_s: f64,
}

/// The frames a set of clips keeps and the packet runs that hold them ([`crate::video::plan_clips`]).
#[derive(Debug, Clone)]
pub struct ClipPlan {
    pub(crate) item: String,
    pub(crate) num_clips: usize,
    pub(crate) num_frames: usize,
    #[cfg_attr(not(feature = "ffmpeg-linked"), allow(dead_code))]
    pub(crate) matching: FrameMatch,
    /// Distinct kept frames, sorted by `(ts, index)`.
    pub(crate) kept: Vec<KeptFrame>,
    /// For each output slot (clip-major), its entry of `kept`.
    pub(crate) slots: Vec<u32>,
    /// Packet ranges `[start, end]` (decode order) to decode, ascending and disjoint.
    pub(crate) runs: Vec<(usize, usize)>,
    /// Per packet: its frame is kept (packets of other frames may be skipped by the decoder).
    #[cfg_attr(not(feature = "ffmpeg-linked"), allow(dead_code))]
    pub(crate) keep_packet: Vec<bool>,
    /// Every timestamp the packets announce, sorted (a decoded frame outside it is unknown).
    #[cfg_attr(not(feature = "ffmpeg-linked"), allow(dead_code))]
    pub(crate) known_ts: Vec<i64>,
    pub(crate) frames_in_video: u64,
}

impl ClipPlan {
    /// Number of clips.
    pub fn num_clips(&self) -> usize {
        self.num_clips
    }

    /// Frames per clip.
    pub fn num_frames(&self) -> usize {
        self.num_frames
    }

    /// Frames the video has (from its first keyframe).
    pub fn frames_in_video(&self) -> u64 {
        self.frames_in_video
    }

    /// Distinct frames the clips keep.
    pub fn frames_kept(&self) -> usize {
        self.kept.len()
    }

    /// Runs of packets decoded (each from a keyframe).
    pub fn runs(&self) -> usize {
        self.runs.len()
    }

    /// Packets decoded, over all runs.
    pub fn packets_to_decode(&self) -> usize {
        self.runs.iter().map(|(s, e)| e + 1 - s).sum()
    }

    /// The frame index (presentation order) of each slot, clip-major (`[clips * frames]`).
    pub fn frame_indices(&self) -> Vec<u64> {
        self.slots.iter().map(|&k| self.kept[k as usize].index).collect()
    }

    /// The presentation time (seconds) of each slot, clip-major.
    pub fn pts_s(&self) -> Vec<f64> {
        self.slots.iter().map(|&k| self.kept[k as usize].pts_s).collect()
    }
}
