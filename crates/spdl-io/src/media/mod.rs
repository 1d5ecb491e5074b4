//! SPDL's demuxing and decoding objects (feature `ffmpeg`): a [`Demuxer`] kept open over one source
//! (demux audio, video or an image, or stream packets in bounded chunks), owned [`MediaPackets`] and
//! [`MediaFrames`], a streaming [`Decoder`] with an optional [`FilterGraph`], bitstream filters ([`Bsf`]) and
//! [`convert_frames`] into one buffer in SPDL's shapes; and the way back: a [`Muxer`] with streams encoded
//! by an [`AudioEncoder`]/[`VideoEncoder`] or copied from demuxed packets (`encode.rs`).
//!
//! These types are the API (their plain data is `crate::types::media`'s); the FFmpeg work behind them is
//! done by a backend ([`ffmpeg_status`] tells which), loaded on the first call that needs one (`load.rs`).
//! What FFmpeg owns (packet data, codec parameters, decoded frames) is held opaquely; what callers read
//! (timestamps, sizes, formats) is copied out when it is made, so that reading it never calls FFmpeg.

mod encode;
mod load;

use std::collections::BTreeMap;

use spdl_buffer::{Buffer, SharedAllocator};

pub use encode::{AudioEncoder, Muxer, VideoEncoder};
pub use load::{BACKEND_DIR_ENV, FFMPEG_DIR_ENV, FfmpegStatus, ffmpeg_status};
// The entry points of audio, video and probing call the backend through this.
pub(crate) use load::backend;

pub use crate::types::media::{
    AudioEncodeConfig, Codec, DecodeConfig, DemuxConfig, EncoderChoice, Fraction, MediaFrames, MediaPackets, MediaType,
    Packets, SharedBytes, VideoEncodeConfig,
};

use crate::backend::{BsfOps, DecoderOps, DemuxerOps, FilterGraphOps};
use crate::input::MediaInput;
use crate::types::media::Frame;
use crate::types::video::VideoLimits;
use crate::{Error, Result};

/// The boundary between a loading library and a backend (not an API: both sides are this crate, from one
/// build): `crate::backend::abi`, and the entry point a backend exports (`crate::ffmpeg::entry`).
#[doc(hidden)]
pub mod abi {
    pub use crate::backend::abi::*;
    #[cfg(feature = "ffmpeg-linked")]
    pub use crate::ffmpeg::entry;
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

/// Serializing packets: FFmpeg writes the codec parameters and side data.
impl MediaPackets {
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
}

/// Sharing and reading frames: FFmpeg holds their data.
impl MediaFrames {
    /// A copy that shares the frame data (reference counted).
    pub fn try_clone(&self) -> Result<MediaFrames> {
        let all: Vec<usize> = (0..self.frames.len()).collect();
        self.select(&all, self.kind)
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
