//! The plain data of [`crate::media`] and [`crate::video`]'s packets (feature `ffmpeg`): stream kinds, codecs,
//! packets, frames and the configurations of demuxers, decoders and encoders. What FFmpeg owns (codec
//! parameters, packet data, frames) is held opaquely for the backend; what callers read is copied out when it
//! is made. The methods that need FFmpeg (serializing packets, sharing frames) are [`crate::media`]'s.

use std::any::Any;
use std::sync::Arc;

use super::video::VideoLimits;
use crate::{Error, Result};

/// The kind of media a stream, packets or frames hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MediaType {
    /// Audio samples.
    Audio,
    /// Video frames.
    Video,
    /// One image (the first frame of a video stream, or an image file).
    Image,
}

impl MediaType {
    /// `"audio"`, `"video"` or `"image"`.
    pub fn name(self) -> &'static str {
        match self {
            MediaType::Audio => "audio",
            MediaType::Video => "video",
            MediaType::Image => "image",
        }
    }
}

/// A fraction `(numerator, denominator)`.
pub type Fraction = (i32, i32);

/// What FFmpeg owns, held for the backend that made it (codec parameters, packet data, frames).
pub(crate) type Opaque = Arc<dyn Any + Send + Sync>;

/// What a decoder needs to know about a stream, with its metadata (SPDL's `AudioCodec`/`VideoCodec`/
/// `ImageCodec`).
#[derive(Clone)]
pub struct Codec {
    /// The codec parameters, owned by the backend.
    #[cfg_attr(not(feature = "ffmpeg-linked"), allow(dead_code))]
    pub(crate) params: Opaque,
    /// What the stream holds.
    pub kind: MediaType,
    /// Codec short name (`"h264"`, `"aac"`, ...).
    pub name: String,
    /// Time base of the packets' timestamps.
    pub time_base: Fraction,
    /// Average frame rate (video; `(0, 1)` when unknown).
    pub frame_rate: Fraction,
    /// Coded width (video, image).
    pub width: u32,
    /// Coded height (video, image).
    pub height: u32,
    /// Pixel format name (`"yuv420p"`, ...; `""` when unknown).
    pub pix_fmt: String,
    /// Pixel aspect ratio (video, image).
    pub sample_aspect_ratio: Fraction,
    /// Sample rate (audio).
    pub sample_rate: u32,
    /// Channels (audio).
    pub num_channels: u32,
    /// Sample format name (`"fltp"`, ...; audio).
    pub sample_fmt: String,
    /// Channel layout description (`"stereo"`, `"1 channels"`, ...; audio).
    pub channel_layout: String,
    /// Bit rate, 0 when unknown.
    pub bit_rate: i64,
}

impl std::fmt::Debug for Codec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Codec").field("kind", &self.kind).field("name", &self.name).finish_non_exhaustive()
    }
}

impl Codec {
    /// This codec as another kind (a video stream's codec read as an image's).
    pub fn with_kind(&self, kind: MediaType) -> Codec {
        Codec { kind, ..self.clone() }
    }
}

/// One compressed packet: its timing and flags, read when it was demuxed, and its data, held by the backend.
#[derive(Clone)]
pub(crate) struct Packet {
    /// Presentation timestamp (stream time base).
    pub(crate) pts: Option<i64>,
    /// Decode timestamp (stream time base).
    pub(crate) dts: Option<i64>,
    /// A keyframe.
    pub(crate) key: bool,
    /// Bytes of data.
    pub(crate) size: usize,
    /// The packet itself.
    #[cfg_attr(not(feature = "ffmpeg-linked"), allow(dead_code))]
    pub(crate) raw: Opaque,
}

impl Packet {
    /// The presentation timestamp, else the decode timestamp.
    pub(crate) fn time(&self) -> Option<i64> {
        self.pts.or(self.dts)
    }
}

/// The owner of memory that [`MediaPackets::deserialize_view`] points packets into: the memory stays alive,
/// and must stay unmodified, while any of those packets (or a clone of them) is alive.
pub type SharedBytes = Arc<dyn AsRef<[u8]> + Send + Sync>;

/// Packets of one stream, owned and `Send + Sync` (SPDL's `AudioPackets`/`VideoPackets`/`ImagePackets`).
/// Cloning shares the packet data.
#[derive(Clone)]
pub struct MediaPackets {
    /// The item (path or name) and stream they came from.
    pub item: String,
    /// The stream's codec.
    pub codec: Codec,
    pub(crate) packets: Vec<Packet>,
    /// The window the caller asked for, in seconds.
    pub window: Option<(f64, f64)>,
    /// The bounds that applied when demuxing; decoding keeps to them too.
    pub limits: VideoLimits,
}

impl std::fmt::Debug for MediaPackets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MediaPackets")
            .field("item", &self.item)
            .field("codec", &self.codec)
            .field("packets", &self.packets.len())
            .finish_non_exhaustive()
    }
}

impl MediaPackets {
    /// Packets held (those before the window that decoding needs included).
    pub fn num_packets(&self) -> usize {
        self.packets.len()
    }

    /// Bytes of packet data.
    pub fn bytes(&self) -> usize {
        self.packets.iter().map(|p| p.size).sum()
    }

    fn in_window(&self, t: f64) -> bool {
        self.window.is_none_or(|(s, e)| t >= s && t < e)
    }

    /// Presentation times in seconds: of all packets in packet order (`raw`), or of those inside the window
    /// sorted by presentation time (what a decode yields).
    pub fn timestamps(&self, raw: bool) -> Vec<f64> {
        let tb = self.codec.time_base;
        let ts = self.packets.iter().filter_map(Packet::time).map(|t| ts_seconds(t, tb));
        if raw {
            return ts.collect();
        }
        let mut v: Vec<f64> = ts.filter(|&t| self.in_window(t)).collect();
        v.sort_by(f64::total_cmp);
        v.dedup();
        v
    }

    /// Packets inside the window (all of them without one): the frames a decode yields (SPDL's `len`).
    pub fn len(&self) -> usize {
        if self.window.is_none() { self.packets.len() } else { self.timestamps(false).len() }
    }

    /// True if there is no packet.
    pub fn is_empty(&self) -> bool {
        self.packets.is_empty()
    }

    /// The packets for the frame-sampling decoder of [`crate::video`].
    pub fn into_video_packets(self) -> Packets {
        let tb = self.codec.time_base;
        let window = match self.window {
            None => (i64::MIN, i64::MAX),
            Some((s, e)) => (seconds_ts(s, tb), if e.is_finite() { seconds_ts(e, tb) } else { i64::MAX }),
        };
        let (n, d) = self.codec.frame_rate;
        Packets {
            item: self.item,
            frame_rate: (n > 0 && d > 0).then(|| f64::from(n) / f64::from(d)),
            width: self.codec.width,
            height: self.codec.height,
            codec: self.codec,
            packets: self.packets,
            window,
            limits: self.limits,
        }
    }

    /// The packets of the frame-sampling decoder as these (no copy of the data).
    pub fn from_video_packets(p: Packets) -> MediaPackets {
        let tb = p.codec.time_base;
        let window = if p.window == (i64::MIN, i64::MAX) {
            None
        } else {
            Some((
                if p.window.0 == i64::MIN { 0.0 } else { ts_seconds(p.window.0, tb) },
                if p.window.1 == i64::MAX { f64::INFINITY } else { ts_seconds(p.window.1, tb) },
            ))
        };
        MediaPackets { item: p.item, codec: p.codec, packets: p.packets, window, limits: p.limits }
    }

    /// Splits the packets (no window) at keyframes so that each of the sorted, distinct frame `indices`
    /// (in presentation order) is decoded from the nearest keyframe before it: `(packets, indices within
    /// them)`, in order. Errors on an index out of range.
    pub fn split_at_indices(&self, indices: &[usize]) -> Result<Vec<(MediaPackets, Vec<usize>)>> {
        let tb = self.codec.time_base;
        // Presentation order of the packets in the window.
        let mut order: Vec<(i64, usize)> = self
            .packets
            .iter()
            .enumerate()
            .filter_map(|(i, p)| p.time().map(|t| (t, i)))
            .filter(|&(t, _)| self.in_window(ts_seconds(t, tb)))
            .collect();
        order.sort_unstable();
        let n = order.len();
        if let Some(&bad) = indices.iter().find(|&&i| i >= n) {
            return Err(Error::InvalidOptions(format!("{}: frame index {bad} is outside [0, {n})", self.item)));
        }
        // Keyframe packet positions (decode order).
        let keys: Vec<usize> = self.packets.iter().enumerate().filter(|(_, p)| p.key).map(|(i, _)| i).collect();
        let start_of = |pos: usize| keys.iter().rev().find(|&&k| k <= pos).copied().unwrap_or(0);
        let mut out: Vec<(MediaPackets, Vec<usize>)> = Vec::new();
        let mut groups: Vec<(usize, usize, Vec<i64>)> = Vec::new(); // (start, end exclusive, pts wanted)
        for &i in indices {
            let (pts, pos) = order[i];
            let start = start_of(pos);
            // The group ends at the next keyframe after `pos` (frames reorder only within a GOP).
            let end = keys.iter().find(|&&k| k > pos).copied().unwrap_or(self.packets.len());
            match groups.last_mut() {
                Some(g) if g.0 == start => {
                    g.1 = g.1.max(end);
                    g.2.push(pts);
                }
                _ => groups.push((start, end, vec![pts])),
            }
        }
        for (start, end, wanted) in groups {
            let packets: Vec<Packet> = self.packets[start..end].to_vec();
            let mut present: Vec<i64> = packets.iter().filter_map(Packet::time).collect();
            present.sort_unstable();
            present.dedup();
            // Frames before the wanted ones that are outside the window are decoded but not counted.
            let lo = self.window.map(|(s, _)| seconds_ts(s, tb));
            let present: Vec<i64> = present.into_iter().filter(|&t| lo.is_none_or(|l| t >= l)).collect();
            let idx: Vec<usize> = wanted.iter().filter_map(|w| present.iter().position(|p| p == w)).collect();
            let window = self.window.map(|(s, _)| (s, f64::INFINITY));
            out.push((
                MediaPackets {
                    item: self.item.clone(),
                    codec: self.codec.clone(),
                    packets,
                    window,
                    limits: self.limits,
                },
                idx,
            ));
        }
        Ok(out)
    }
}

/// The packets of one video stream, from the keyframe before the window to the window's end, with what is
/// needed to decode them. Owned and `Send`: hand it to another thread (or pipeline stage) for
/// [`crate::video::decode_packets`].
pub struct Packets {
    pub(crate) item: String,
    pub(crate) codec: Codec,
    pub(crate) packets: Vec<Packet>,
    /// Window in stream time base units, `[start, end)`.
    pub(crate) window: (i64, i64),
    pub(crate) frame_rate: Option<f64>,
    pub(crate) width: u32,
    pub(crate) height: u32,
    pub(crate) limits: VideoLimits,
}

impl std::fmt::Debug for Packets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Packets")
            .field("item", &self.item)
            .field("codec", &self.codec.name)
            .field("width", &self.width)
            .field("height", &self.height)
            .field("frame_rate", &self.frame_rate)
            .field("packets", &self.packets.len())
            .field("bytes", &self.bytes())
            .finish()
    }
}

impl Packets {
    /// The item (path or name) they came from.
    pub fn item(&self) -> &str {
        &self.item
    }

    /// Codec short name (`"h264"`, `"vp9"`, `"mpeg4"`, ...).
    pub fn codec(&self) -> &str {
        &self.codec.name
    }

    /// Coded width in pixels.
    pub fn width(&self) -> u32 {
        self.width
    }

    /// Coded height in pixels.
    pub fn height(&self) -> u32 {
        self.height
    }

    /// Average frame rate, if the container states it.
    pub fn frame_rate(&self) -> Option<f64> {
        self.frame_rate
    }

    /// Number of packets kept (including those before the window that decoding needs).
    pub fn len(&self) -> usize {
        self.packets.len()
    }

    /// True if no packet was kept.
    pub fn is_empty(&self) -> bool {
        self.packets.is_empty()
    }

    /// Bytes of packet data kept.
    pub fn bytes(&self) -> usize {
        self.packets.iter().map(|p| p.size).sum()
    }

    /// Presentation timestamps (seconds) of the packets inside the window, in presentation order: the
    /// frames a full decode of the window yields.
    pub fn timestamps(&self) -> Vec<f64> {
        self.window_pts().into_iter().map(|t| ts_seconds(t, self.codec.time_base)).collect()
    }

    /// Presentation timestamps (stream units) of the packets in the window, sorted and deduplicated.
    pub(crate) fn window_pts(&self) -> Vec<i64> {
        let mut pts: Vec<i64> =
            self.packets.iter().filter_map(Packet::time).filter(|&t| t >= self.window.0 && t < self.window.1).collect();
        pts.sort_unstable();
        pts.dedup();
        pts
    }
}

/// How to open a source.
#[derive(Debug, Clone, Default)]
pub struct DemuxConfig {
    /// The container format (an FFmpeg demuxer name, e.g. `"s16le"` for raw samples, `"mjpeg"`); `None`:
    /// detected from the content.
    pub format: Option<String>,
    /// Options for the container's demuxer (FFmpeg's `AVFormatContext` options).
    pub format_options: Vec<(String, String)>,
    /// Bounds on what demuxing reads and keeps.
    pub limits: VideoLimits,
}

/// Which decoder to use and its options.
#[derive(Debug, Clone, Default)]
pub struct DecodeConfig {
    /// A decoder by name (`ffmpeg -decoders`); default: the codec's.
    pub decoder: Option<String>,
    /// Decoder options (`threads`, ...); decoding is single-threaded unless `threads` is given.
    pub options: Vec<(String, String)>,
}

/// What a decoded frame says about itself, read when it was decoded.
#[derive(Debug, Clone, Default)]
pub(crate) struct FrameInfo {
    /// Pixel or sample format name.
    pub(crate) format: String,
    /// Planes (video, image).
    pub(crate) planes: u32,
    pub(crate) width: u32,
    pub(crate) height: u32,
    /// Samples per channel (audio).
    pub(crate) samples: usize,
    pub(crate) rate: u32,
    pub(crate) channels: u32,
    /// Presentation timestamp (`i64::MIN` when it has none).
    pub(crate) pts: i64,
}

/// One decoded frame: what it says about itself, and the frame, held by the backend.
pub(crate) struct Frame {
    pub(crate) info: FrameInfo,
    #[cfg_attr(not(feature = "ffmpeg-linked"), allow(dead_code))]
    pub(crate) raw: Box<dyn Any + Send + Sync>,
}

/// Decoded frames of one stream, owned and `Send + Sync` (SPDL's `AudioFrames`/`VideoFrames`/`ImageFrames`).
pub struct MediaFrames {
    /// What they hold.
    pub kind: MediaType,
    pub(crate) frames: Vec<Frame>,
    /// Time base of the frames' timestamps.
    pub time_base: Fraction,
    /// The item they were decoded from.
    pub item: String,
}

impl std::fmt::Debug for MediaFrames {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MediaFrames")
            .field("kind", &self.kind)
            .field("frames", &self.frames.len())
            .field("item", &self.item)
            .finish_non_exhaustive()
    }
}

impl MediaFrames {
    /// No frames of `kind`.
    pub fn empty(kind: MediaType, time_base: Fraction, item: &str) -> MediaFrames {
        MediaFrames { kind, frames: Vec::new(), time_base, item: item.to_owned() }
    }

    /// Frame objects held (video frames; audio frames of many samples each).
    pub fn num_frame_objects(&self) -> usize {
        self.frames.len()
    }

    /// Video: the frames; audio: the samples per channel (SPDL's `num_frames`); image: 1 (0 if empty).
    pub fn num_frames(&self) -> usize {
        match self.kind {
            MediaType::Audio => self.frames.iter().map(|f| f.info.samples).sum(),
            _ => self.frames.len(),
        }
    }

    fn first(&self) -> Option<&FrameInfo> {
        self.frames.first().map(|f| &f.info)
    }

    /// Pixel format (video, image) or sample format (audio) name; `""` if empty.
    pub fn format_name(&self) -> String {
        self.first().map(|i| i.format.clone()).unwrap_or_default()
    }

    /// Width of the frames (0 if empty or audio).
    pub fn width(&self) -> u32 {
        self.first().map_or(0, |i| i.width)
    }

    /// Height of the frames (0 if empty or audio).
    pub fn height(&self) -> u32 {
        self.first().map_or(0, |i| i.height)
    }

    /// Sample rate (audio).
    pub fn sample_rate(&self) -> u32 {
        self.first().map_or(0, |i| i.rate)
    }

    /// Channels (audio).
    pub fn num_channels(&self) -> u32 {
        self.first().map_or(0, |i| i.channels)
    }

    /// Planes per frame (video, image).
    pub fn num_planes(&self) -> u32 {
        self.first().map_or(0, |i| i.planes)
    }

    /// Presentation timestamps in time base units (`i64::MIN` where a frame has none).
    pub fn pts(&self) -> Vec<i64> {
        self.frames.iter().map(|f| f.info.pts).collect()
    }

    /// Presentation times in seconds.
    pub fn timestamps(&self) -> Vec<f64> {
        let (n, d) = self.time_base;
        self.pts()
            .into_iter()
            .map(|p| if d == 0 || p == i64::MIN { 0.0 } else { p as f64 * f64::from(n) / f64::from(d) })
            .collect()
    }
}

/// How to encode audio (SPDL's `AudioEncodeConfig`). `-1` (or `None`) leaves a setting to the encoder.
///
/// ```
/// let config = spdl_io::media::AudioEncodeConfig::new(2, 44_100);
/// assert_eq!((config.num_channels, config.sample_rate, config.bit_rate), (2, 44_100, -1));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AudioEncodeConfig {
    /// Channels of the input frames (and of the stream).
    pub num_channels: u32,
    /// Samples per second of the input frames (and of the stream).
    pub sample_rate: u32,
    /// The sample format of the input frames (`"fltp"`, `"s16"`, ...), which the encoder must take; `None`:
    /// the encoder's first.
    pub sample_fmt: Option<String>,
    /// Bits per second (set when positive).
    pub bit_rate: i64,
    /// The encoder's compression level (set unless `-1`).
    pub compression_level: i32,
    /// A fixed quantizer (set when `>= 0`; the encoder's own scale).
    pub qscale: i32,
}

impl AudioEncodeConfig {
    /// `num_channels` channels at `sample_rate`, every other setting the encoder's.
    pub fn new(num_channels: u32, sample_rate: u32) -> AudioEncodeConfig {
        AudioEncodeConfig {
            num_channels,
            sample_rate,
            sample_fmt: None,
            bit_rate: -1,
            compression_level: -1,
            qscale: -1,
        }
    }
}

/// How to encode video (SPDL's `VideoEncodeConfig`). `-1` (or `None`) leaves a setting to the encoder.
///
/// `pix_fmt` is the format of the frames given to the encoder. When the encoder does not take it (`rgb24`
/// frames into `libx264` or `mpeg4`), the encoder converts each frame with swscale into its own first
/// format (`yuv420p` for both).
///
/// ```
/// let mut config = spdl_io::media::VideoEncodeConfig::new(640, 480);
/// config.frame_rate = Some((30, 1));
/// config.pix_fmt = Some("rgb24".into());
/// assert_eq!(config.gop_size, -1);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VideoEncodeConfig {
    /// Width of the frames in pixels.
    pub width: u32,
    /// Height of the frames in pixels.
    pub height: u32,
    /// Frames per second `(numerator, denominator)`; `None`: the encoder's first supported rate (an error
    /// for encoders without a list, such as `libx264`).
    pub frame_rate: Option<Fraction>,
    /// The pixel format of the input frames; `None`: the encoder's first.
    pub pix_fmt: Option<String>,
    /// Bits per second (set when positive).
    pub bit_rate: i64,
    /// The encoder's compression level (set unless `-1`).
    pub compression_level: i32,
    /// A fixed quantizer (set when `>= 0`).
    pub qscale: i32,
    /// Frames between keyframes (set unless `-1`).
    pub gop_size: i32,
    /// The most consecutive B-frames (set unless `-1`).
    pub max_b_frames: i32,
    /// The color space written in the stream (`"bt709"`, ...); an RGB input is converted with its matrix.
    pub colorspace: Option<String>,
    /// The color primaries written in the stream (`"bt709"`, ...).
    pub color_primaries: Option<String>,
    /// The transfer characteristics written in the stream (`"bt709"`, ...).
    pub color_trc: Option<String>,
}

impl VideoEncodeConfig {
    /// Frames of `width` x `height`, every other setting the encoder's.
    pub fn new(width: u32, height: u32) -> VideoEncodeConfig {
        VideoEncodeConfig {
            width,
            height,
            frame_rate: None,
            pix_fmt: None,
            bit_rate: -1,
            compression_level: -1,
            qscale: -1,
            gop_size: -1,
            max_b_frames: -1,
            colorspace: None,
            color_primaries: None,
            color_trc: None,
        }
    }
}

/// An encoder and the options it is opened with (`ffmpeg -h encoder=NAME` lists them).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EncoderChoice {
    /// An encoder by name (`ffmpeg -encoders`); `None`: the container's default for the medium.
    pub encoder: Option<String>,
    /// Encoder options; encoding is single-threaded unless `threads` is given. An option the encoder does
    /// not take is an error.
    pub options: Vec<(String, String)>,
}

/// Seconds of `ts` in time base `tb`.
pub(crate) fn ts_seconds(ts: i64, tb: Fraction) -> f64 {
    if tb.1 == 0 { 0.0 } else { ts as f64 * f64::from(tb.0) / f64::from(tb.1) }
}

/// The first timestamp in time base `tb` at or after `seconds` (float noise of a millionth of a tick is
/// ignored, so `1.0` s in 1/12800 is 12800, not 12801).
pub(crate) fn seconds_ts(seconds: f64, tb: Fraction) -> i64 {
    if tb.0 == 0 {
        return 0;
    }
    (seconds * f64::from(tb.1) / f64::from(tb.0) - 1e-6).ceil() as i64
}

/// The kind of stream a codec's packets go to (an image is one frame of a video stream).
#[cfg_attr(not(feature = "ffmpeg-linked"), allow(dead_code))]
pub(crate) fn stream_kind(kind: MediaType) -> MediaType {
    if kind == MediaType::Image { MediaType::Video } else { kind }
}
