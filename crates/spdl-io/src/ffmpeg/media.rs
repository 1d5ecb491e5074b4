//! SPDL's demuxing objects: a [`Demuxer`] that stays open over one source (demux the audio, the video or an
//! image from it, or stream its packets in bounded chunks), the [`Codec`] of a stream, and owned
//! [`MediaPackets`] that [`super::frames::Decoder`] decodes.

use std::collections::BTreeMap;

use ff::format::context::Input;
use ffmpeg_next as ff;

use super::avio::{ff_error, open_input_with, seconds_ts, ts_seconds};
use super::demux::Packets;
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

    fn ff(self) -> ff::media::Type {
        match self {
            MediaType::Audio => ff::media::Type::Audio,
            MediaType::Video | MediaType::Image => ff::media::Type::Video,
        }
    }
}

/// Codec parameters owned by a [`Codec`]; only read after construction.
pub(crate) struct Params(pub(crate) ff::codec::Parameters);

// SAFETY: the wrapped AVCodecParameters is owned (a deep copy) and never mutated after construction: shared
// references only read it (`as_ptr`) or deep-copy it (`clone`), which FFmpeg does without side effects.
unsafe impl Sync for Params {}

impl Clone for Params {
    fn clone(&self) -> Self {
        Params(self.0.clone())
    }
}

/// A fraction `(numerator, denominator)`.
pub type Fraction = (i32, i32);

/// What a decoder needs to know about a stream, with its metadata (SPDL's `AudioCodec`/`VideoCodec`/
/// `ImageCodec`).
#[derive(Clone)]
pub struct Codec {
    pub(crate) params: Params,
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

fn frac(r: ff::Rational) -> Fraction {
    (r.numerator(), r.denominator())
}

fn channel_layout_name(layout: &ff::ffi::AVChannelLayout) -> String {
    let mut buf = [0 as std::ffi::c_char; 128];
    // SAFETY: `layout` is a valid channel layout; FFmpeg writes at most `buf.len()` bytes, NUL-terminated.
    let n = unsafe { ff::ffi::av_channel_layout_describe(layout, buf.as_mut_ptr(), buf.len()) };
    if n < 0 {
        return String::new();
    }
    // SAFETY: FFmpeg NUL-terminated the description inside `buf`.
    unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) }.to_string_lossy().into_owned()
}

impl Codec {
    /// The codec of `stream`, for `kind`.
    pub(crate) fn of_stream(stream: &ff::format::stream::Stream<'_>, kind: MediaType) -> Codec {
        let params = stream.parameters().clone();
        let frame_rate = {
            let r = stream.avg_frame_rate();
            if r.numerator() > 0 && r.denominator() > 0 { frac(r) } else { frac(stream.rate()) }
        };
        Codec::from_params(Params(params), kind, frac(stream.time_base()), frame_rate)
    }

    pub(crate) fn from_params(params: Params, kind: MediaType, time_base: Fraction, frame_rate: Fraction) -> Codec {
        // SAFETY: `params` owns a valid AVCodecParameters.
        let (width, height, format, sar, rate, channels, bit_rate, layout) = unsafe {
            let p = params.0.as_ptr();
            (
                (*p).width,
                (*p).height,
                (*p).format,
                (*p).sample_aspect_ratio,
                (*p).sample_rate,
                (*p).ch_layout.nb_channels,
                (*p).bit_rate,
                channel_layout_name(&(*p).ch_layout),
            )
        };
        let (pix_fmt, sample_fmt) = match kind {
            MediaType::Audio => (String::new(), sample_fmt_name(format)),
            _ => (pix_fmt_name(format), String::new()),
        };
        Codec {
            name: params.0.id().name().to_owned(),
            params,
            kind,
            time_base,
            frame_rate,
            width: u32::try_from(width).unwrap_or(0),
            height: u32::try_from(height).unwrap_or(0),
            pix_fmt,
            sample_aspect_ratio: (sar.num, sar.den),
            sample_rate: u32::try_from(rate).unwrap_or(0),
            num_channels: u32::try_from(channels).unwrap_or(0),
            sample_fmt,
            channel_layout: if kind == MediaType::Audio { layout } else { String::new() },
            bit_rate,
        }
    }

    /// This codec as another kind (a video stream's codec read as an image's).
    pub fn with_kind(&self, kind: MediaType) -> Codec {
        Codec { kind, ..self.clone() }
    }
}

/// `format` as an `AVPixelFormat`, if it is one of this FFmpeg's.
pub(crate) fn pix_fmt(format: i32) -> Option<ff::ffi::AVPixelFormat> {
    if !(0..ff::ffi::AVPixelFormat::AV_PIX_FMT_NB as i32).contains(&format) {
        return None;
    }
    // SAFETY: `AVPixelFormat` is a `repr(i32)` enum whose values are 0..AV_PIX_FMT_NB without gaps
    // (FFmpeg's pixel format table), and `format` is in that range.
    Some(unsafe { std::mem::transmute::<i32, ff::ffi::AVPixelFormat>(format) })
}

/// `format` as an `AVSampleFormat`, if it is one of this FFmpeg's.
pub(crate) fn sample_fmt(format: i32) -> Option<ff::ffi::AVSampleFormat> {
    if !(0..ff::ffi::AVSampleFormat::AV_SAMPLE_FMT_NB as i32).contains(&format) {
        return None;
    }
    // SAFETY: `AVSampleFormat` is a `repr(i32)` enum whose values are 0..AV_SAMPLE_FMT_NB without gaps, and
    // `format` is in that range.
    Some(unsafe { std::mem::transmute::<i32, ff::ffi::AVSampleFormat>(format) })
}

/// The name of pixel format `format` (an `AVPixelFormat` value), `""` if none.
pub(crate) fn pix_fmt_name(format: i32) -> String {
    let Some(f) = pix_fmt(format) else { return String::new() };
    // SAFETY: av_get_pix_fmt_name returns a static C string or null.
    cstr(unsafe { ff::ffi::av_get_pix_fmt_name(f) })
}

/// The name of sample format `format` (an `AVSampleFormat` value), `""` if none.
pub(crate) fn sample_fmt_name(format: i32) -> String {
    let Some(f) = sample_fmt(format) else { return String::new() };
    // SAFETY: av_get_sample_fmt_name returns a static C string or null.
    cstr(unsafe { ff::ffi::av_get_sample_fmt_name(f) })
}

fn cstr(p: *const std::ffi::c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: a non-null static, NUL-terminated C string from FFmpeg.
    unsafe { std::ffi::CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// Packets of one stream, owned and `Send + Sync` (SPDL's `AudioPackets`/`VideoPackets`/`ImagePackets`).
#[derive(Clone)]
pub struct MediaPackets {
    /// The item (path or name) and stream they came from.
    pub item: String,
    /// The stream's codec.
    pub codec: Codec,
    pub(crate) packets: Vec<ff::Packet>,
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
        self.packets.iter().map(|p| p.size()).sum()
    }

    fn in_window(&self, t: f64) -> bool {
        self.window.is_none_or(|(s, e)| t >= s && t < e)
    }

    /// Presentation times in seconds: of all packets in packet order (`raw`), or of those inside the window
    /// sorted by presentation time (what a decode yields).
    pub fn timestamps(&self, raw: bool) -> Vec<f64> {
        let tb = ff::Rational::new(self.codec.time_base.0, self.codec.time_base.1);
        let ts = self.packets.iter().filter_map(|p| p.pts().or(p.dts())).map(|t| ts_seconds(t, tb));
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
        let tb = ff::Rational::new(self.codec.time_base.0, self.codec.time_base.1);
        let window = match self.window {
            None => (i64::MIN, i64::MAX),
            Some((s, e)) => (seconds_ts(s, tb), if e.is_finite() { seconds_ts(e, tb) } else { i64::MAX }),
        };
        let (n, d) = self.codec.frame_rate;
        Packets {
            item: self.item,
            params: self.codec.params.0,
            time_base: tb,
            packets: self.packets,
            window,
            frame_rate: (n > 0 && d > 0).then(|| f64::from(n) / f64::from(d)),
            width: self.codec.width,
            height: self.codec.height,
            codec: self.codec.name,
            limits: self.limits,
        }
    }

    /// The packets of the frame-sampling decoder as these (no copy of the data).
    pub fn from_video_packets(p: Packets) -> MediaPackets {
        let tb = p.time_base;
        let window = if p.window == (i64::MIN, i64::MAX) {
            None
        } else {
            Some((
                if p.window.0 == i64::MIN { 0.0 } else { ts_seconds(p.window.0, tb) },
                if p.window.1 == i64::MAX { f64::INFINITY } else { ts_seconds(p.window.1, tb) },
            ))
        };
        let frame_rate = p.frame_rate.map_or((0, 1), |r| {
            let r = ff::Rational::from(r);
            frac(r)
        });
        let codec = Codec::from_params(Params(p.params), MediaType::Video, frac(tb), frame_rate);
        MediaPackets { item: p.item, codec, packets: p.packets, window, limits: p.limits }
    }

    /// Splits the packets (no window) at keyframes so that each of the sorted, distinct frame `indices`
    /// (in presentation order) is decoded from the nearest keyframe before it: `(packets, indices within
    /// them)`, in order. Errors on an index out of range.
    pub fn split_at_indices(&self, indices: &[usize]) -> Result<Vec<(MediaPackets, Vec<usize>)>> {
        let tb = ff::Rational::new(self.codec.time_base.0, self.codec.time_base.1);
        // Presentation order of the packets in the window.
        let mut order: Vec<(i64, usize)> = self
            .packets
            .iter()
            .enumerate()
            .filter_map(|(i, p)| p.pts().or(p.dts()).map(|t| (t, i)))
            .filter(|&(t, _)| self.in_window(ts_seconds(t, tb)))
            .collect();
        order.sort_unstable();
        let n = order.len();
        if let Some(&bad) = indices.iter().find(|&&i| i >= n) {
            return Err(Error::InvalidOptions(format!("{}: frame index {bad} is outside [0, {n})", self.item)));
        }
        // Keyframe packet positions (decode order).
        let keys: Vec<usize> = self.packets.iter().enumerate().filter(|(_, p)| p.is_key()).map(|(i, _)| i).collect();
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
            let packets: Vec<ff::Packet> = self.packets[start..end].to_vec();
            let mut present: Vec<i64> = packets.iter().filter_map(|p| p.pts().or(p.dts())).collect();
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

/// How to open a source.
#[derive(Debug, Clone, Default)]
pub struct DemuxConfig {
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
pub struct Demuxer {
    item: String,
    ictx: Input,
    limits: VideoLimits,
    /// No packet was read yet: the demuxer stands at the start.
    fresh: bool,
    /// The current streaming demux.
    stream: Option<StreamState>,
}

impl std::fmt::Debug for Demuxer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Demuxer").field("item", &self.item).finish_non_exhaustive()
    }
}

struct StreamState {
    indices: Vec<usize>,
    num_packets: Option<usize>,
    duration: Option<f64>,
    /// A packet read past the previous chunk's end, which starts the next.
    pending: Option<ff::Packet>,
    done: bool,
    read: u64,
}

impl Demuxer {
    /// Opens `input` (headers and stream info read).
    ///
    /// Errors: [`Error::UnknownFormat`], [`Error::Decode`] (a damaged header), [`Error::Io`].
    pub fn open<'a>(input: impl Into<MediaInput<'a>>, config: &DemuxConfig) -> Result<Demuxer> {
        let input = input.into();
        let item = input.name().into_owned();
        let ictx = open_input_with(&input, &item, &config.format_options)?;
        Ok(Demuxer { item, ictx, limits: config.limits, fresh: true, stream: None })
    }

    /// The item (path or name).
    pub fn item(&self) -> &str {
        &self.item
    }

    /// The index of the best stream of `kind`, if there is one.
    pub fn stream_index(&self, kind: MediaType) -> Option<usize> {
        self.ictx.streams().best(kind.ff()).map(|s| s.index())
    }

    /// The codec of the best stream of `kind`.
    pub fn codec(&self, kind: MediaType) -> Result<Codec> {
        let stream = self.ictx.streams().best(kind.ff()).ok_or_else(|| self.no_stream(kind))?;
        Ok(Codec::of_stream(&stream, kind))
    }

    /// The codecs of every stream, by index (`None` for streams that are neither audio nor video).
    fn codec_of_index(&self, index: usize) -> Option<Codec> {
        let stream = self.ictx.stream(index)?;
        let kind = match stream.parameters().medium() {
            ff::media::Type::Audio => MediaType::Audio,
            ff::media::Type::Video => MediaType::Video,
            _ => return None,
        };
        Some(Codec::of_stream(&stream, kind))
    }

    fn no_stream(&self, kind: MediaType) -> Error {
        Error::UnknownFormat {
            item: self.item.clone(),
            detail: format!("{}: no {} stream", self.ictx.format().name(), kind.name()),
        }
    }

    /// Reads the next packet (bounded counts of damaged and total packets); `None` at the end.
    fn read_packet(&mut self, read: &mut u64, have_some: bool) -> Result<Option<ff::Packet>> {
        let mut bad = 0u32;
        loop {
            let mut packet = ff::Packet::empty();
            match packet.read(&mut self.ictx) {
                Ok(()) => {}
                Err(ff::Error::Eof) => return Ok(None),
                Err(e @ ff::Error::InvalidData) => {
                    bad += 1;
                    if bad > self.limits.max_bad_packets {
                        return Err(ff_error(&self.item, "container", e));
                    }
                    continue;
                }
                // A cut file ends with an I/O error on most demuxers: keep what was read.
                Err(_) if have_some => return Ok(None),
                Err(e) => return Err(ff_error(&self.item, "container", e)),
            }
            self.fresh = false;
            *read += 1;
            if *read > self.limits.max_packets {
                return Err(Error::LimitExceeded {
                    item: self.item.clone(),
                    what: "packets".into(),
                    value: *read,
                    limit: self.limits.max_packets,
                });
            }
            return Ok(Some(packet));
        }
    }

    /// Positions the demuxer at the keyframe before `start_s` (the start when `0`).
    fn rewind(&mut self, start_s: f64) -> Result<()> {
        self.stream = None;
        if self.fresh && start_s <= 0.0 {
            return Ok(());
        }
        let ts = (start_s.max(0.0) * f64::from(ff::ffi::AV_TIME_BASE)) as i64;
        match self.ictx.seek(ts, ..ts) {
            Ok(()) => Ok(()),
            Err(_) if self.fresh => Ok(()),
            Err(e) => Err(ff_error(&self.item, "container (seek)", e)),
        }
    }

    /// The packets of the best audio stream in `window` (seconds, `[start, end)`; all without one).
    pub fn demux_audio(&mut self, window: Option<(f64, f64)>) -> Result<MediaPackets> {
        self.demux(MediaType::Audio, window)
    }

    /// The packets of the best video stream that `window` needs, from the keyframe before its start.
    pub fn demux_video(&mut self, window: Option<(f64, f64)>) -> Result<MediaPackets> {
        self.demux(MediaType::Video, window)
    }

    /// The first packet of the best video stream (an image file's only one).
    pub fn demux_image(&mut self) -> Result<MediaPackets> {
        self.demux(MediaType::Image, None)
    }

    fn demux(&mut self, kind: MediaType, window: Option<(f64, f64)>) -> Result<MediaPackets> {
        if let Some((s, e)) = window
            && (s.is_nan() || e.is_nan() || s == f64::INFINITY || e <= s)
        {
            return Err(Error::InvalidOptions(format!(
                "{}: the window must be (start, end) with start < end, got ({s}, {e})",
                self.item
            )));
        }
        let (index, codec) = {
            let stream = self.ictx.streams().best(kind.ff()).ok_or_else(|| self.no_stream(kind))?;
            (stream.index(), Codec::of_stream(&stream, kind))
        };
        let pixels = u64::from(codec.width) * u64::from(codec.height);
        if pixels > self.limits.max_pixels {
            return Err(Error::LimitExceeded {
                item: self.item.clone(),
                what: "pixels per frame".into(),
                value: pixels,
                limit: self.limits.max_pixels,
            });
        }
        self.rewind(window.map_or(0.0, |w| w.0.max(0.0)))?;
        let tb = ff::Rational::new(codec.time_base.0, codec.time_base.1);
        let end = window.and_then(|(_, e)| e.is_finite().then(|| seconds_ts(e, tb))).unwrap_or(i64::MAX);
        let mut packets: Vec<ff::Packet> = Vec::new();
        let (mut read, mut bytes) = (0u64, 0u64);
        while let Some(packet) = self.read_packet(&mut read, !packets.is_empty())? {
            if packet.stream() != index {
                continue;
            }
            let t = match kind {
                // Decode order: once a decode timestamp reaches the end, every later presentation time does.
                MediaType::Video => packet.dts().or(packet.pts()),
                _ => packet.pts().or(packet.dts()),
            };
            if t.is_some_and(|t| t >= end) {
                break;
            }
            bytes += packet.size() as u64;
            if bytes > self.limits.max_packet_bytes {
                return Err(Error::LimitExceeded {
                    item: self.item.clone(),
                    what: "packet bytes".into(),
                    value: bytes,
                    limit: self.limits.max_packet_bytes,
                });
            }
            packets.push(packet);
            if kind == MediaType::Image {
                break;
            }
        }
        if packets.is_empty() {
            return Err(Error::Decode {
                item: self.item.clone(),
                format: codec.name,
                cause: format!("the {} stream has no readable packets in the window", kind.name()).into(),
            });
        }
        Ok(MediaPackets { item: self.item.clone(), codec, packets, window, limits: self.limits })
    }

    /// Starts streaming the packets of the streams `indices` from the start, in chunks of `num_packets`
    /// packets (of any one stream) or of `duration` seconds (exactly one of them). Call [`Demuxer::next_chunk`] for each chunk.
    pub fn start_streaming(
        &mut self,
        indices: &[usize],
        num_packets: Option<usize>,
        duration: Option<f64>,
    ) -> Result<()> {
        match (num_packets, duration) {
            (Some(n), None) if n > 0 => {}
            (None, Some(d)) if d > 0.0 && d.is_finite() => {}
            _ => {
                return Err(Error::InvalidOptions(
                    "give exactly one of num_packets (> 0) and duration (> 0 seconds)".into(),
                ));
            }
        }
        let n = self.ictx.streams().count();
        if let Some(&bad) = indices.iter().find(|&&i| i >= n || self.codec_of_index(i).is_none()) {
            return Err(Error::InvalidOptions(format!(
                "{}: stream {bad} is not an audio or video stream of this source ({n} streams)",
                self.item
            )));
        }
        if indices.is_empty() {
            return Err(Error::InvalidOptions("give at least one stream index".into()));
        }
        self.rewind(0.0)?;
        self.stream =
            Some(StreamState { indices: indices.to_vec(), num_packets, duration, pending: None, done: false, read: 0 });
        Ok(())
    }

    /// The next chunk of the streaming demux: packets per stream index (streams without packets in the
    /// chunk are absent). `None` at the end.
    pub fn next_chunk(&mut self) -> Result<Option<BTreeMap<usize, MediaPackets>>> {
        let Some(mut st) = self.stream.take() else {
            return Err(Error::InvalidOptions("streaming_demux was not started on this demuxer".into()));
        };
        if st.done {
            self.stream = Some(st);
            return Ok(None);
        }
        let mut chunk: BTreeMap<usize, Vec<ff::Packet>> = BTreeMap::new();
        let (mut count, mut bytes) = (0usize, 0u64);
        let mut first_t: Option<f64> = None;
        loop {
            let packet = match st.pending.take() {
                Some(p) => p,
                None => {
                    let mut read = st.read;
                    let next = self.read_packet(&mut read, count > 0);
                    st.read = read;
                    match next {
                        Ok(Some(p)) => p,
                        Ok(None) => {
                            st.done = true;
                            break;
                        }
                        Err(e) => {
                            st.done = true;
                            self.stream = Some(st);
                            return Err(e);
                        }
                    }
                }
            };
            let index = packet.stream();
            if !st.indices.contains(&index) {
                continue;
            }
            if let Some(d) = st.duration {
                let tb = self.ictx.stream(index).map(|s| s.time_base()).unwrap_or(ff::Rational::new(0, 1));
                if let Some(t) = packet.dts().or(packet.pts()).map(|t| ts_seconds(t, tb)) {
                    match first_t {
                        None => first_t = Some(t),
                        Some(f) if t >= f + d && count > 0 => {
                            st.pending = Some(packet);
                            break;
                        }
                        _ => {}
                    }
                }
            }
            bytes += packet.size() as u64;
            if bytes > self.limits.max_packet_bytes {
                self.stream = Some(StreamState { done: true, ..st });
                return Err(Error::LimitExceeded {
                    item: self.item.clone(),
                    what: "packet bytes in one chunk".into(),
                    value: bytes,
                    limit: self.limits.max_packet_bytes,
                });
            }
            let list = chunk.entry(index).or_default();
            list.push(packet);
            count += 1;
            // As SPDL: a chunk ends once one of the streams has `num_packets` packets in it.
            if st.num_packets.is_some_and(|n| list.len() >= n) {
                break;
            }
        }
        self.stream = Some(st);
        if chunk.is_empty() {
            return Ok(None);
        }
        let mut out = BTreeMap::new();
        for (index, packets) in chunk {
            if let Some(codec) = self.codec_of_index(index) {
                out.insert(
                    index,
                    MediaPackets { item: self.item.clone(), codec, packets, window: None, limits: self.limits },
                );
            }
        }
        Ok(Some(out))
    }
}
