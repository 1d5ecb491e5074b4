//! What [`crate::probe`] finds in a media file: its streams and their codecs, sizes and rates (feature
//! `audio`), filled by every prober (images, symphonia, the FFmpeg backend).

use serde::Serialize;

/// What kind of data a stream carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum StreamKind {
    /// Video frames.
    Video,
    /// Audio samples.
    Audio,
    /// A still image (the whole file is one picture).
    Image,
    /// Subtitles.
    Subtitle,
    /// Anything else (data, attachments, unknown).
    Other,
}

/// One stream of a media file. Fields that do not apply to the stream's kind, or that the container does
/// not state, are `None`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct StreamInfo {
    /// Position of the stream in the container.
    pub index: usize,
    /// Video, audio, image, ...
    pub kind: StreamKind,
    /// Codec short name (`"h264"`, `"aac"`, `"flac"`, `"jpeg"`, ...).
    pub codec: String,
    /// Duration in seconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub duration_s: Option<f64>,
    /// Start time in seconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub start_s: Option<f64>,
    /// Number of frames (video frames, or audio sample frames), as the container states it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub num_frames: Option<u64>,
    /// Bits per second.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bit_rate: Option<u64>,
    /// Width in pixels.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub width: Option<u32>,
    /// Height in pixels.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub height: Option<u32>,
    /// Average frame rate in frames per second.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub frame_rate: Option<f64>,
    /// Pixel format (`"yuv420p"`, ...).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pixel_format: Option<String>,
    /// Sample rate in Hz.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sample_rate: Option<u32>,
    /// Audio channels.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub channels: Option<u32>,
    /// Sample format (`"fltp"`, `"s16"`, ...).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sample_format: Option<String>,
}

impl StreamInfo {
    /// A stream with only its index, kind and codec known.
    pub fn new(index: usize, kind: StreamKind, codec: impl Into<String>) -> StreamInfo {
        StreamInfo {
            index,
            kind,
            codec: codec.into(),
            duration_s: None,
            start_s: None,
            num_frames: None,
            bit_rate: None,
            width: None,
            height: None,
            frame_rate: None,
            pixel_format: None,
            sample_rate: None,
            channels: None,
            sample_format: None,
        }
    }
}

/// What [`probe`](crate::probe()) found in a media file.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct MediaInfo {
    /// The item (path or name).
    pub item: String,
    /// Container short name (`"mov,mp4,m4a,3gp,3g2,mj2"`, `"wav"`, `"ogg"`, `"png"`, ...).
    pub format: String,
    /// Which reader answered: `"ffmpeg"`, `"symphonia"` or `"image"`.
    pub prober: String,
    /// Size of the input in bytes.
    pub size_bytes: u64,
    /// Duration in seconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub duration_s: Option<f64>,
    /// Overall bits per second.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bit_rate: Option<u64>,
    /// The streams, in container order.
    pub streams: Vec<StreamInfo>,
}
