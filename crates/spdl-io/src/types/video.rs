//! The video API's options and output, independent of the decoder that fills them.

use spdl_buffer::Buffer;

use crate::input::TimeWindow;
use crate::{Error, Result};

/// Upper bounds on the work and memory one video may cost ([`Error::LimitExceeded`] beyond them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct VideoLimits {
    /// Packets read from the container, every stream counted (default 2^20).
    pub max_packets: u64,
    /// Bytes of video packets kept (default 1 GiB).
    pub max_packet_bytes: u64,
    /// Frames decoded (default 2^20).
    pub max_frames: u64,
    /// Pixels per frame of the source (default 2^26, 8192 x 8192).
    pub max_pixels: u64,
    /// Bytes of the output buffer (default 4 GiB).
    pub max_output_bytes: u64,
    /// Consecutive damaged packets before the input is declared corrupt (default 64).
    pub max_bad_packets: u32,
}

impl Default for VideoLimits {
    fn default() -> Self {
        VideoLimits {
            max_packets: 1 << 20,
            max_packet_bytes: 1 << 30,
            max_frames: 1 << 20,
            max_pixels: 1 << 26,
            max_output_bytes: 4 << 30,
            max_bad_packets: 64,
        }
    }
}

/// How to demux.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct DemuxOptions {
    /// Time range in presentation-timestamp seconds (`None`: the whole stream). Demuxing seeks to the
    /// keyframe at or before its start and stops once the decode timestamps pass its end.
    pub window: Option<TimeWindow>,
    /// Bounds on work and memory.
    pub limits: VideoLimits,
}

/// Which frames of the window come out.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
#[non_exhaustive]
pub enum FrameSampling {
    /// Every frame (default).
    #[default]
    All,
    /// Every k-th frame: frames 0, k, 2k, ... of the window (`k >= 1`).
    Every(usize),
    /// A constant rate in frames per second: at each tick `start + i / fps` the frame on screen then
    /// (the last one at or before it). Frames repeat when `fps` exceeds the source rate.
    Fps(f64),
    /// `n` frames spread uniformly over the window (`linspace(0, count - 1, n)`, rounded); frames repeat
    /// when the window has fewer than `n`.
    Uniform(usize),
}

/// Pixel format of the output video frames (FFmpeg's `rgb24` or `gray8`, made by swscale); not to be
/// confused with `spdl_io::image::PixelFormat`, the format of decoded still images.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum FramePixelFormat {
    /// 8-bit RGB, `C = 3` (default).
    #[default]
    Rgb24,
    /// 8-bit luma, `C = 1`.
    Gray8,
}

impl FramePixelFormat {
    /// Channels per pixel.
    pub fn channels(self) -> usize {
        match self {
            FramePixelFormat::Rgb24 => 3,
            FramePixelFormat::Gray8 => 1,
        }
    }
}

/// Interpolation of swscale when the size changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum ScaleFilter {
    /// Nearest neighbour.
    Nearest,
    /// Bilinear (torchvision's default).
    Bilinear,
    /// Bicubic (FFmpeg's `scale` filter default, and SPDL's). Default.
    #[default]
    Bicubic,
    /// Area averaging (good for large downscales).
    Area,
}

/// How to decode packets into frames.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DecodeOptions {
    /// Which frames come out.
    pub sampling: FrameSampling,
    /// Output `(width, height)`; `None` keeps the coded size.
    pub size: Option<(u32, u32)>,
    /// RGB or gray.
    pub pixel_format: FramePixelFormat,
    /// Interpolation when resizing.
    pub filter: ScaleFilter,
    /// Decoder threads (frame threading); `0` lets FFmpeg pick one per core. Default 1: a loader
    /// usually decodes many videos at once, one per worker.
    pub threads: usize,
}

impl Default for DecodeOptions {
    fn default() -> Self {
        DecodeOptions {
            sampling: FrameSampling::All,
            size: None,
            pixel_format: FramePixelFormat::Rgb24,
            filter: ScaleFilter::Bicubic,
            threads: 1,
        }
    }
}

impl DecodeOptions {
    /// Checks the options that do not depend on the input.
    pub fn validate(&self) -> Result<()> {
        match self.sampling {
            FrameSampling::Every(0) => return Err(Error::InvalidOptions("FrameSampling::Every(0)".into())),
            FrameSampling::Uniform(0) => return Err(Error::InvalidOptions("FrameSampling::Uniform(0)".into())),
            FrameSampling::Fps(f) if !(f.is_finite() && f > 0.0) => {
                return Err(Error::InvalidOptions(format!("FrameSampling::Fps({f}) must be finite and > 0")));
            }
            _ => {}
        }
        if let Some((w, h)) = self.size
            && (w == 0 || h == 0 || w > 16384 || h > 16384)
        {
            return Err(Error::InvalidOptions(format!("output size {w}x{h} must be within 1..=16384")));
        }
        if self.threads > 64 {
            return Err(Error::InvalidOptions(format!("{} decoder threads (at most 64)", self.threads)));
        }
        Ok(())
    }
}

/// Demux and decode options together, for [`crate::video::decode_video`].
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct VideoOptions {
    /// Time range in presentation-timestamp seconds (`None`: the whole video).
    pub window: Option<TimeWindow>,
    /// Decoding options.
    pub decode: DecodeOptions,
    /// Bounds on work and memory.
    pub limits: VideoLimits,
}

/// Decoded frames.
#[derive(Debug)]
#[non_exhaustive]
pub struct Frames {
    /// `[N, H, W, C]` `u8` ([`spdl_buffer::Layout::Nhwc`]).
    pub buffer: Buffer,
    /// Presentation time of each frame, in seconds.
    pub pts_s: Vec<f64>,
    /// Average frame rate of the source, if stated.
    pub frame_rate: Option<f64>,
    /// Codec short name.
    pub codec: String,
    /// The item (path or name).
    pub item: String,
}
