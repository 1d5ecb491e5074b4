//! SPDL's demuxing objects over FFmpeg: a demuxer that stays open over one source (demux the audio, the
//! video or an image from it, or stream its packets in bounded chunks), the [`Codec`] of a stream, and the
//! packets ([`crate::media::MediaPackets`]) that the decoder decodes.

use std::collections::BTreeMap;
use std::sync::Arc;

use ff::format::context::Input;
use ffmpeg_next as ff;

use super::avio::{ff_error, open_input_with, seconds_ts, ts_seconds};
use crate::input::MediaInput;
use crate::types::media::{Codec, DemuxConfig, Fraction, MediaPackets, MediaType, Packet};
use crate::types::video::VideoLimits;
use crate::{Error, Result};

/// The FFmpeg media type of `kind`.
fn ff_kind(kind: MediaType) -> ff::media::Type {
    match kind {
        MediaType::Audio => ff::media::Type::Audio,
        MediaType::Video | MediaType::Image => ff::media::Type::Video,
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

/// `r` as a fraction.
pub(crate) fn frac(r: ff::Rational) -> Fraction {
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
    let name = unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) }.to_string_lossy().into_owned();
    // An unspecified order is described as "N channels", which `abuffer`'s `channel_layout=` does not parse;
    // "Nc" (SPDL's spelling) is the same layout in the form the option takes.
    match name.strip_suffix(" channels").and_then(|n| n.parse::<u32>().ok()) {
        Some(n) => format!("{n}c"),
        None => name,
    }
}

/// The codec of `stream`, for `kind`.
pub(crate) fn codec_of_stream(stream: &ff::format::stream::Stream<'_>, kind: MediaType) -> Codec {
    let params = stream.parameters().clone();
    let frame_rate = {
        let r = stream.avg_frame_rate();
        if r.numerator() > 0 && r.denominator() > 0 { frac(r) } else { frac(stream.rate()) }
    };
    codec_from_params(Params(params), kind, frac(stream.time_base()), frame_rate)
}

/// The codec of owned parameters `params`.
pub(crate) fn codec_from_params(params: Params, kind: MediaType, time_base: Fraction, frame_rate: Fraction) -> Codec {
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
        params: Arc::new(params),
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

/// The FFmpeg parameters of `codec`.
pub(crate) fn params_of(codec: &Codec) -> Result<&Params> {
    codec.params.downcast_ref::<Params>().ok_or_else(|| foreign(&codec.name))
}

/// The error for a value that another FFmpeg backend made (there is one per process, so this is a bug).
pub(crate) fn foreign(what: &str) -> Error {
    Error::InvalidOptions(format!("{what}: made by another FFmpeg backend than the one loaded"))
}

/// A demuxed packet, with what the API reads of it.
pub(crate) fn wrap_packet(p: ff::Packet) -> Packet {
    Packet { pts: p.pts(), dts: p.dts(), key: p.is_key(), size: p.size(), raw: Arc::new(p) }
}

/// The FFmpeg packet of `p`.
pub(crate) fn ff_packet<'p>(p: &'p Packet, item: &str) -> Result<&'p ff::Packet> {
    p.raw.downcast_ref::<ff::Packet>().ok_or_else(|| foreign(item))
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

/// An open source (crate::media::Demuxer's backend). Not `Sync`: callers share it behind a lock.
pub(crate) struct FfDemuxer {
    item: String,
    ictx: Input,
    limits: VideoLimits,
    /// No packet was read yet: the demuxer stands at the start.
    fresh: bool,
    /// The current streaming demux.
    stream: Option<StreamState>,
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

impl FfDemuxer {
    /// Opens `input` (headers and stream info read).
    ///
    /// Errors: [`Error::UnknownFormat`], [`Error::Decode`] (a damaged header), [`Error::Io`].
    pub(crate) fn open(input: &MediaInput<'_>, config: &DemuxConfig) -> Result<FfDemuxer> {
        let item = input.name().into_owned();
        let ictx = open_input_with(input, &item, &config.format_options, config.format.as_deref())?;
        Ok(FfDemuxer { item, ictx, limits: config.limits, fresh: true, stream: None })
    }

    /// The item (path or name).
    pub(crate) fn item(&self) -> &str {
        &self.item
    }

    /// The index of the best stream of `kind`, if there is one.
    pub(crate) fn stream_index(&self, kind: MediaType) -> Option<usize> {
        self.ictx.streams().best(ff_kind(kind)).map(|s| s.index())
    }

    /// The codec of the best stream of `kind`.
    pub(crate) fn codec(&self, kind: MediaType) -> Result<Codec> {
        let stream = self.ictx.streams().best(ff_kind(kind)).ok_or_else(|| self.no_stream(kind))?;
        Ok(codec_of_stream(&stream, kind))
    }

    /// The codecs of every stream, by index (`None` for streams that are neither audio nor video).
    fn codec_of_index(&self, index: usize) -> Option<Codec> {
        let stream = self.ictx.stream(index)?;
        let kind = match stream.parameters().medium() {
            ff::media::Type::Audio => MediaType::Audio,
            ff::media::Type::Video => MediaType::Video,
            _ => return None,
        };
        Some(codec_of_stream(&stream, kind))
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

    /// The packets of the best stream of `kind` that `window` needs (video: from the keyframe before its
    /// start; image: the first packet).
    pub(crate) fn demux(&mut self, kind: MediaType, window: Option<(f64, f64)>) -> Result<MediaPackets> {
        if let Some((s, e)) = window
            && (s.is_nan() || e.is_nan())
        {
            return Err(Error::InvalidOptions(format!(
                "{}: the window must be (start, end) in seconds, got ({s}, {e})",
                self.item
            )));
        }
        let (index, codec) = {
            let stream = self.ictx.streams().best(ff_kind(kind)).ok_or_else(|| self.no_stream(kind))?;
            (stream.index(), codec_of_stream(&stream, kind))
        };
        // An empty window (`end <= start`, SPDL's `(t, t)`) holds no packet, as in SPDL: its frames are none.
        if let Some((s, e)) = window
            && kind != MediaType::Image
            && e <= s
        {
            return Ok(MediaPackets {
                item: self.item.clone(),
                codec,
                packets: Vec::new(),
                window,
                limits: self.limits,
            });
        }
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
        let mut packets: Vec<Packet> = Vec::new();
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
            packets.push(wrap_packet(packet));
            if kind == MediaType::Image {
                break;
            }
        }
        // A window past the end holds no packet (SPDL's result too); a whole stream without one is an error.
        if packets.is_empty() && (window.is_none() || kind == MediaType::Image) {
            return Err(Error::Decode {
                item: self.item.clone(),
                format: codec.name,
                cause: format!("the {} stream has no readable packets in the window", kind.name()).into(),
            });
        }
        Ok(MediaPackets { item: self.item.clone(), codec, packets, window, limits: self.limits })
    }

    /// Starts streaming the packets of the streams `indices` from the start, in chunks of `num_packets`
    /// packets (of any one stream) or of `duration` seconds (exactly one of them).
    pub(crate) fn start_streaming(
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
    pub(crate) fn next_chunk(&mut self) -> Result<Option<BTreeMap<usize, MediaPackets>>> {
        let Some(mut st) = self.stream.take() else {
            return Err(Error::InvalidOptions("streaming_demux was not started on this demuxer".into()));
        };
        if st.done {
            self.stream = Some(st);
            return Ok(None);
        }
        let mut chunk: BTreeMap<usize, Vec<Packet>> = BTreeMap::new();
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
            list.push(wrap_packet(packet));
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
