//! SPDL's demuxing and decoding objects (feature `ffmpeg`): a [`Demuxer`] kept open over one source
//! (demux audio, video or an image, or stream packets in bounded chunks), owned [`MediaPackets`] and
//! [`MediaFrames`], a streaming [`Decoder`] with an optional [`FilterGraph`], bitstream filters ([`Bsf`]) and
//! [`convert_frames`] into one buffer in SPDL's shapes; and the way back: a [`Muxer`] with streams encoded
//! by an [`AudioEncoder`]/[`VideoEncoder`] or copied from demuxed packets (`encode.rs`).
//!
//! These types are the API; the FFmpeg work behind them is done by a backend ([`ffmpeg_status`] tells which),
//! loaded on the first call that needs one. What FFmpeg owns (packet data, codec parameters, decoded frames)
//! is held opaquely; what callers read (timestamps, sizes, formats) is copied out when it is made, so that
//! reading it never calls FFmpeg.

mod backend;
mod encode;

use std::any::Any;
use std::collections::BTreeMap;
use std::sync::Arc;

use spdl_buffer::{Buffer, SharedAllocator};

#[doc(hidden)]
pub use backend::abi;
pub use backend::{BACKEND_DIR_ENV, FFMPEG_DIR_ENV, FfmpegStatus, ffmpeg_status};
// The backend (`crate::ffmpeg`, with `ffmpeg-linked`) implements these.
#[cfg_attr(not(feature = "ffmpeg-linked"), allow(unused_imports))]
pub(crate) use backend::{Backend, BsfOps, DecoderOps, DemuxerOps, FilterGraphOps, backend, seconds_ts, ts_seconds};
#[cfg_attr(not(feature = "ffmpeg-linked"), allow(unused_imports))]
pub(crate) use backend::{EncoderOps, MuxerOps};
#[cfg_attr(not(feature = "ffmpeg-linked"), allow(unused_imports))]
pub(crate) use encode::stream_kind;
pub use encode::{AudioEncodeConfig, AudioEncoder, EncoderChoice, Muxer, VideoEncodeConfig, VideoEncoder};

use crate::input::MediaInput;
use crate::video::VideoLimits;
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

    /// These packets as bytes: the codec parameters (extradata included), every packet's timing, flags,
    /// side data and data, and the window and limits, so that [`MediaPackets::deserialize`] (in this
    /// process or another) rebuilds packets that decode the same. Each packet's data is followed by FFmpeg's
    /// zeroed input padding, so that [`MediaPackets::deserialize_view`] can decode in place.
    ///
    /// ```no_run
    /// use std::path::Path;
    /// use spdl_io::media::{DemuxConfig, Demuxer, MediaPackets};
    /// let mut demuxer = Demuxer::open(Path::new("clip.mp4"), &DemuxConfig::default())?;
    /// let packets = demuxer.demux_video(None)?;
    /// let bytes = packets.serialize()?;
    /// let again = MediaPackets::deserialize(&bytes)?;
    /// assert_eq!(again.num_packets(), packets.num_packets());
    /// # Ok::<(), spdl_io::Error>(())
    /// ```
    pub fn serialize(&self) -> Result<Vec<u8>> {
        backend()?.serialize_packets(self)
    }

    /// Packets from bytes that [`MediaPackets::serialize`] wrote, their data copied out of `data`. Bytes
    /// that were not written so, truncated or damaged, are an error naming what is wrong.
    pub fn deserialize(data: &[u8]) -> Result<MediaPackets> {
        backend()?.deserialize_packets(data, None)
    }

    /// Like [`MediaPackets::deserialize`], without copying: the packets point into `bytes`' memory and
    /// keep it alive (SPDL's `deserialize_view`, for packets sent through shared memory).
    pub fn deserialize_view(bytes: SharedBytes) -> Result<MediaPackets> {
        let data: &[u8] = (*bytes).as_ref();
        backend()?.deserialize_packets(data, Some(&bytes))
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

/// The names of the filters of the FFmpeg in use, sorted (SPDL's `get_ffmpeg_filters`).
///
/// Errors: [`Error::Unavailable`] (no FFmpeg on this machine).
///
/// ```no_run
/// let filters = spdl_io::media::ffmpeg_filters()?;
/// assert!(filters.iter().any(|f| f == "scale"));
/// # Ok::<(), spdl_io::Error>(())
/// ```
pub fn ffmpeg_filters() -> Result<Vec<String>> {
    Ok(backend()?.filters())
}

/// FFmpeg's log level (`-8` quiet ... `56` trace; SPDL's `get_ffmpeg_log_level`). spdl-io keeps it at
/// `fatal` (8) unless `SPDL_FFMPEG_LOG` or [`set_ffmpeg_log_level`] says otherwise.
///
/// Errors: [`Error::Unavailable`] (no FFmpeg on this machine).
pub fn ffmpeg_log_level() -> Result<i32> {
    Ok(backend()?.log_level())
}

/// Sets FFmpeg's log level, process-wide (SPDL's `set_ffmpeg_log_level`): `-8` quiet, `16` error,
/// `24` warning, `32` info, `48` debug.
///
/// ```no_run
/// spdl_io::media::set_ffmpeg_log_level(16)?; // FFmpeg's errors on stderr
/// assert_eq!(spdl_io::media::ffmpeg_log_level()?, 16);
/// # Ok::<(), spdl_io::Error>(())
/// ```
pub fn set_ffmpeg_log_level(level: i32) -> Result<()> {
    backend()?.set_log_level(level);
    Ok(())
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

/// An open source: demux its audio, video or image, or stream its packets in bounded chunks (SPDL's
/// `Demuxer`). Not `Sync`: callers share it behind a lock.
///
/// ```no_run
/// use spdl_io::media::{DemuxConfig, Demuxer};
/// use std::path::Path;
///
/// let mut demuxer = Demuxer::open(Path::new("clip.mp4"), &DemuxConfig::default())?;
/// let packets = demuxer.demux_video(Some((1.0, 2.0)))?;
/// assert!(packets.len() > 0);
/// # Ok::<(), spdl_io::Error>(())
/// ```
pub struct Demuxer(Box<dyn DemuxerOps>);

impl std::fmt::Debug for Demuxer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Demuxer").field("item", &self.0.item()).finish_non_exhaustive()
    }
}

impl Demuxer {
    /// Opens `input` (headers and stream info read).
    ///
    /// Errors: [`Error::UnknownFormat`], [`Error::Decode`] (a damaged header), [`Error::Io`],
    /// [`Error::Unavailable`] (no FFmpeg).
    pub fn open<'a>(input: impl Into<MediaInput<'a>>, config: &DemuxConfig) -> Result<Demuxer> {
        let input = input.into();
        Ok(Demuxer(backend()?.open_demuxer(&input, config)?))
    }

    /// The item (path or name) it reads.
    pub fn item(&self) -> &str {
        self.0.item()
    }

    /// The index of the best stream of `kind`, if there is one.
    pub fn stream_index(&self, kind: MediaType) -> Option<usize> {
        self.0.stream_index(kind)
    }

    /// The codec of the best stream of `kind`.
    pub fn codec(&self, kind: MediaType) -> Result<Codec> {
        self.0.codec(kind)
    }

    /// The audio packets of `window` (seconds, `[start, end)`; the whole stream without one).
    pub fn demux_audio(&mut self, window: Option<(f64, f64)>) -> Result<MediaPackets> {
        self.0.demux(MediaType::Audio, window)
    }

    /// The video packets `window` needs (from the keyframe before it).
    pub fn demux_video(&mut self, window: Option<(f64, f64)>) -> Result<MediaPackets> {
        self.0.demux(MediaType::Video, window)
    }

    /// The packets of the first frame of the best video stream (an image).
    pub fn demux_image(&mut self) -> Result<MediaPackets> {
        self.0.demux(MediaType::Image, None)
    }

    /// Starts streaming the packets of the streams `indices` from the start, in chunks of `num_packets`
    /// packets (of any one stream) or of `duration` seconds (exactly one of them). Call
    /// [`Demuxer::next_chunk`] for each chunk.
    pub fn start_streaming(
        &mut self,
        indices: &[usize],
        num_packets: Option<usize>,
        duration: Option<f64>,
    ) -> Result<()> {
        self.0.start_streaming(indices, num_packets, duration)
    }

    /// The next chunk of the streaming demux: packets per stream index (streams without packets in the
    /// chunk are absent). `None` at the end.
    pub fn next_chunk(&mut self) -> Result<Option<BTreeMap<usize, MediaPackets>>> {
        self.0.next_chunk()
    }
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

    /// A copy that shares the frame data (reference counted).
    pub fn try_clone(&self) -> Result<MediaFrames> {
        let all: Vec<usize> = (0..self.frames.len()).collect();
        self.select(&all, self.kind)
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

    /// The frames at `indices` (video), as new frames sharing the data.
    pub fn select(&self, indices: &[usize], kind: MediaType) -> Result<MediaFrames> {
        let n = self.frames.len();
        let picked = indices
            .iter()
            .map(|&i| {
                self.frames.get(i).ok_or_else(|| Error::InvalidOptions(format!("frame index {i} is outside [0, {n})")))
            })
            .collect::<Result<Vec<&Frame>>>()?;
        let frames = if picked.is_empty() { Vec::new() } else { backend()?.clone_frames(&picked, &self.item)? };
        Ok(MediaFrames { kind, frames, time_base: self.time_base, item: self.item.clone() })
    }

    /// The frames of `self` then those of `other` (same kind), as new frames sharing the data.
    pub fn concat(&self, other: &MediaFrames) -> Result<MediaFrames> {
        let mut out = self.try_clone()?;
        if !other.frames.is_empty() {
            let theirs: Vec<&Frame> = other.frames.iter().collect();
            out.frames.extend(backend()?.clone_frames(&theirs, &self.item)?);
        }
        Ok(out)
    }

    /// The metadata attached to the first frame (image).
    pub fn metadata(&self) -> Vec<(String, String)> {
        match (self.frames.first(), backend()) {
            (Some(f), Ok(b)) => b.frame_metadata(f),
            _ => Vec::new(),
        }
    }
}

/// A filter graph (SPDL's `FilterGraph`): frames go in at named `buffer`/`abuffer` inputs and come out of
/// named `buffersink`/`abuffersink` outputs.
///
/// ```no_run
/// use spdl_io::media::FilterGraph;
///
/// let graph = FilterGraph::new(
///     "buffer=video_size=320x240:pix_fmt=yuv420p:time_base=1/25:pixel_aspect=1/1,hflip,buffersink",
/// )?;
/// assert_eq!(graph.inputs(), vec!["Parsed_buffer_0".to_owned()]);
/// # Ok::<(), spdl_io::Error>(())
/// ```
pub struct FilterGraph(Box<dyn FilterGraphOps>);

impl std::fmt::Debug for FilterGraph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FilterGraph").field("desc", &self.0.desc()).finish_non_exhaustive()
    }
}

impl FilterGraph {
    /// Parses and configures the graph `desc`.
    ///
    /// Errors: [`Error::InvalidOptions`] for a description FFmpeg rejects or with unconnected pads,
    /// [`Error::Unavailable`] (no FFmpeg).
    pub fn new(desc: &str) -> Result<FilterGraph> {
        Ok(FilterGraph(backend()?.new_filter_graph(desc)?))
    }

    /// Bounds on the frames the graph outputs.
    pub fn set_limits(&mut self, limits: VideoLimits) {
        self.0.set_limits(limits);
    }

    /// The names of the graph's inputs.
    pub fn inputs(&self) -> Vec<String> {
        self.0.inputs()
    }

    /// The names of the graph's outputs.
    pub fn outputs(&self) -> Vec<String> {
        self.0.outputs()
    }

    /// Sends `frames` into the input `key` (the only one when `None`).
    pub fn add_frames(&mut self, frames: &MediaFrames, key: Option<&str>) -> Result<()> {
        self.0.add_frames(frames, key)
    }

    /// Ends every input.
    pub fn flush(&mut self) -> Result<()> {
        self.0.flush()
    }

    /// The frames ready at the output `key` (the only one when `None`), or `None` when the graph is done.
    pub fn get_frames(&mut self, key: Option<&str>, item: &str) -> Result<Option<MediaFrames>> {
        self.0.get_frames(key, item)
    }

    /// FFmpeg's description of the configured graph.
    pub fn dump(&self) -> String {
        self.0.dump()
    }
}

/// Which decoder to use and its options.
#[derive(Debug, Clone, Default)]
pub struct DecodeConfig {
    /// A decoder by name (`ffmpeg -decoders`); default: the codec's.
    pub decoder: Option<String>,
    /// Decoder options (`threads`, ...); decoding is single-threaded unless `threads` is given.
    pub options: Vec<(String, String)>,
}

/// Decodes the packets of one stream, chunk after chunk, through an optional filter graph (SPDL's
/// `AudioDecoder`/`VideoDecoder`).
///
/// ```no_run
/// use spdl_io::media::{DecodeConfig, Decoder, Demuxer, DemuxConfig, MediaType};
/// use std::path::Path;
///
/// let mut demuxer = Demuxer::open(Path::new("clip.mp4"), &DemuxConfig::default())?;
/// let codec = demuxer.codec(MediaType::Video)?;
/// let mut decoder = Decoder::new(&codec, &DecodeConfig::default(), None, "clip.mp4", Default::default())?;
/// let frames = decoder.decode(&demuxer.demux_video(None)?)?;
/// let rest = decoder.flush()?;
/// assert!(frames.num_frames() + rest.num_frames() > 0);
/// # Ok::<(), spdl_io::Error>(())
/// ```
pub struct Decoder(Box<dyn DecoderOps>);

impl std::fmt::Debug for Decoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Decoder").field("item", &self.0.item()).finish_non_exhaustive()
    }
}

impl Decoder {
    /// A decoder for packets of `codec`, whose frames go through `filter_desc` (a complete graph, from a
    /// `buffer`/`abuffer` input to a `buffersink`/`abuffersink` output) when given.
    pub fn new(
        codec: &Codec,
        config: &DecodeConfig,
        filter_desc: Option<&str>,
        item: &str,
        limits: VideoLimits,
    ) -> Result<Decoder> {
        Ok(Decoder(backend()?.new_decoder(codec, config, filter_desc, item, limits)?))
    }

    /// Decodes `packets` (and filters them, with a graph): the frames ready so far.
    pub fn decode(&mut self, packets: &MediaPackets) -> Result<MediaFrames> {
        self.0.decode_until(packets, None)
    }

    /// Decodes `packets`, stopping once `max` frames are out (all of them without one).
    pub(crate) fn decode_until(&mut self, packets: &MediaPackets, max: Option<usize>) -> Result<MediaFrames> {
        self.0.decode_until(packets, max)
    }

    /// Ends the stream: the frames the decoder (and graph) still held.
    pub fn flush(&mut self) -> Result<MediaFrames> {
        self.0.flush()
    }
}

/// Decodes every packet of `packets` (SPDL's `decode_packets`): the frames of the window (the first one for
/// an image; the first `num_frames` of a video when given), through `filter_desc` when given.
pub fn decode_all(
    packets: &MediaPackets,
    config: &DecodeConfig,
    filter_desc: Option<&str>,
    num_frames: Option<usize>,
) -> Result<MediaFrames> {
    let mut dec = Decoder::new(&packets.codec, config, filter_desc, &packets.item, packets.limits)?;
    // Stop early only when every decoded frame counts (no window drops frames afterwards).
    let early = num_frames.filter(|_| packets.codec.kind == MediaType::Video && packets.window.is_none());
    let early = if packets.codec.kind == MediaType::Image { Some(1) } else { early };
    let mut out = dec.decode_until(packets, early)?;
    let rest = dec.flush()?;
    out.frames.extend(rest.frames);
    out.time_base = rest.time_base;
    if packets.codec.kind != MediaType::Audio
        && let Some((s, e)) = packets.window
    {
        let (n, d) = out.time_base;
        let sec = |p: i64| if d == 0 { 0.0 } else { p as f64 * f64::from(n) / f64::from(d) };
        out.frames.retain(|f| {
            let p = f.info.pts;
            p == i64::MIN || (sec(p) >= s - 1e-9 && sec(p) < e)
        });
    }
    if packets.codec.kind == MediaType::Image {
        out.frames.truncate(1);
    } else if let Some(n) = num_frames.filter(|_| packets.codec.kind == MediaType::Video) {
        out.frames.truncate(n);
    }
    // A window that holds no frame (an empty one, or past the end) decodes to no frame, as in SPDL; an image,
    // or a whole stream, without one is an error.
    if out.frames.is_empty() && (packets.window.is_none() || packets.codec.kind == MediaType::Image) {
        return Err(Error::Decode {
            item: packets.item.clone(),
            format: packets.codec.name.clone(),
            cause: "no frame decoded".into(),
        });
    }
    Ok(out)
}

/// A bitstream filter chain (`"h264_mp4toannexb"`, `"filter1,filter2=opt=value"`) for packets of one codec
/// (SPDL's `BSF`).
///
/// ```no_run
/// use spdl_io::media::{Bsf, DemuxConfig, Demuxer};
/// use std::path::Path;
///
/// let mut demuxer = Demuxer::open(Path::new("clip.mp4"), &DemuxConfig::default())?;
/// let packets = demuxer.demux_video(None)?;
/// let mut bsf = Bsf::new(&packets.codec, "h264_mp4toannexb")?;
/// let annexb = bsf.filter(&packets, true)?;
/// assert!(annexb.is_some());
/// # Ok::<(), spdl_io::Error>(())
/// ```
pub struct Bsf(Box<dyn BsfOps>);

impl std::fmt::Debug for Bsf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bsf").field("desc", &self.0.desc()).finish_non_exhaustive()
    }
}

impl Bsf {
    /// The filter chain `desc` for packets of `codec`.
    ///
    /// Errors: [`Error::InvalidOptions`] for an unknown filter or one that does not take this codec,
    /// [`Error::Unavailable`] (no FFmpeg).
    pub fn new(codec: &Codec, desc: &str) -> Result<Bsf> {
        Ok(Bsf(backend()?.new_bsf(codec, desc)?))
    }

    /// The codec of the filtered packets.
    pub fn output_codec(&self) -> &Codec {
        self.0.output_codec()
    }

    /// Filters `packets` (ending the stream when `flush`): the packets ready, or `None`.
    pub fn filter(&mut self, packets: &MediaPackets, flush: bool) -> Result<Option<MediaPackets>> {
        self.0.filter(packets, flush)
    }

    /// Ends the stream: the packets the filter still held, or `None`.
    pub fn flush(&mut self, item: &str) -> Result<Option<MediaPackets>> {
        self.0.flush(item)
    }
}

/// Converts frames into one buffer (SPDL's `convert_frames`): video `[N, H, W, C]` (packed formats),
/// `[N, 3, H, W]` (`yuv444p`), `[N, 1, H * 3 / 2, W]` (`yuv420p`, `nv12`); images the same without `N`;
/// audio `[C, N]` (planar) or `[N, C]` (packed) in the sample format's dtype. With `batch`, every item
/// must have the same shape, and the result has a leading batch axis.
pub fn convert_frames(items: &[&MediaFrames], batch: bool, allocator: &SharedAllocator) -> Result<Buffer> {
    if items.is_empty() {
        return Err(Error::InvalidOptions("convert_frames: no frames given".into()));
    }
    backend()?.convert_frames(items, batch, allocator)
}

/// Video frames made from `[N, H, W, C]` (packed formats: `rgb24`, `bgr24`, `rgba`, ...), `[N, H, W]`
/// (`gray8`, `gray16`) or `[N, 3, H, W]` (`yuv444p`) pixel data (SPDL's `create_reference_video_frame`; the
/// data are copied). Frame `i` has pts `pts + i` in time base `1 / frame_rate`.
pub fn reference_video_frames(
    data: &[u8],
    shape: &[usize],
    itemsize: usize,
    pix_fmt: &str,
    frame_rate: Fraction,
    pts: i64,
) -> Result<MediaFrames> {
    backend()?.reference_video_frames(data, shape, itemsize, pix_fmt, frame_rate, pts)
}

/// An audio frame made from `[C, N]` (planar `sample_fmt`, suffix `p`) or `[N, C]` (packed) samples (SPDL's
/// `create_reference_audio_frame`; the data are copied), with pts `pts` in time base `1 / sample_rate`.
pub fn reference_audio_frame(
    data: &[u8],
    shape: &[usize],
    itemsize: usize,
    sample_fmt: &str,
    sample_rate: u32,
    pts: i64,
) -> Result<MediaFrames> {
    backend()?.reference_audio_frame(data, shape, itemsize, sample_fmt, sample_rate, pts)
}
