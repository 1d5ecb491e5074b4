//! Video decoding with libavcodec: demuxed packets into one `[N, H, W, C]` `u8` buffer. Frame sampling is
//! decided from the packet timestamps before decoding, so only the chosen frames are converted (swscale,
//! straight into their slot).
//!
//! A frame is matched to its slots by its identity, not by the order it arrives in: its presentation
//! timestamp and, among frames with the same timestamp, its place in decode order. Timestamps that go
//! backwards or zigzag (a remuxed or edited file) therefore fill every slot, in presentation order; the
//! earlier forward-only matching skipped every frame that came after a later one (1 of 20 frames out of a
//! file whose timestamps decrease, with no error).

use std::ffi::c_int;

use ff::software::scaling;
use ffmpeg_next as ff;
use spdl_buffer::{Buffer, DType, Layout, SharedAllocator};

use super::avio::{ff_error, ts_seconds};
use super::media::{ff_packet, params_of};
use crate::types::media::Packets;
use crate::types::sampling::select_keys;
use crate::types::video::{DecodeOptions, FramePixelFormat, FrameSampling, Frames, ScaleFilter, VideoLimits};
use crate::{Error, Result};

/// The swscale pixel format of `f`.
fn pixel(f: FramePixelFormat) -> ff::format::Pixel {
    match f {
        FramePixelFormat::Rgb24 => ff::format::Pixel::RGB24,
        FramePixelFormat::Gray8 => ff::format::Pixel::GRAY8,
    }
}

/// The swscale flags of `f`.
fn scale_flags(f: ScaleFilter) -> scaling::Flags {
    match f {
        ScaleFilter::Nearest => scaling::Flags::POINT,
        ScaleFilter::Bilinear => scaling::Flags::BILINEAR,
        ScaleFilter::Bicubic => scaling::Flags::BICUBIC,
        ScaleFilter::Area => scaling::Flags::AREA,
    }
}

/// A frame's identity: its presentation timestamp (or output ordinal) and how many frames with the same
/// timestamp came before it in decode order. Sorting identities gives presentation order.
type FrameKey = (i64, u32);

/// How decoded frames are matched to the selection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum KeyMode {
    /// By presentation timestamp.
    Pts,
    /// By output order (streams without timestamps, e.g. raw H.264).
    Ordinal,
}

/// Converts frames with swscale straight into a destination slot.
pub(super) struct Converter {
    ctx: Option<(scaling::Context, (ff::format::Pixel, u32, u32))>,
    dst: ff::format::Pixel,
    width: u32,
    height: u32,
    channels: usize,
    flags: scaling::Flags,
}

impl Converter {
    /// A converter to `width x height` in `format` (its swscale context is made for the first frame).
    pub(super) fn new(format: FramePixelFormat, width: u32, height: u32, filter: ScaleFilter) -> Converter {
        Converter {
            ctx: None,
            dst: pixel(format),
            width,
            height,
            channels: format.channels(),
            flags: scale_flags(filter),
        }
    }

    pub(super) fn convert(&mut self, frame: &ff::frame::Video, dst: &mut [u8], item: &str) -> Result<()> {
        let key = (frame.format(), frame.width(), frame.height());
        let ctx = match &mut self.ctx {
            Some((ctx, k)) if *k == key => ctx,
            slot => {
                let ctx = scaling::Context::get(key.0, key.1, key.2, self.dst, self.width, self.height, self.flags)
                    .map_err(|e| ff_error(item, "swscale", e))?;
                &mut slot.insert((ctx, key)).0
            }
        };
        let stride = self.width as usize * self.channels;
        if dst.len() < stride * self.height as usize {
            return Err(Error::InvalidOptions(format!("{item}: frame slot of {} bytes is too small", dst.len())));
        }
        let dst_data: [*mut u8; 4] =
            [dst.as_mut_ptr(), std::ptr::null_mut(), std::ptr::null_mut(), std::ptr::null_mut()];
        let dst_stride: [c_int; 4] = [stride as c_int, 0, 0, 0];
        // SAFETY: the context was made for this frame's format and size; the frame's data/linesize
        // describe its planes (owned by the frame for the call); the destination is one packed plane of
        // `height` rows of `stride` bytes, which `dst` holds (checked above) and which nothing else aliases.
        let rows = unsafe {
            let src = frame.as_ptr();
            ff::ffi::sws_scale(
                ctx.as_mut_ptr(),
                (*src).data.as_ptr() as *const *const u8,
                (*src).linesize.as_ptr(),
                0,
                (*src).height,
                dst_data.as_ptr(),
                dst_stride.as_ptr(),
            )
        };
        if rows != self.height as c_int {
            return Err(Error::Decode {
                item: item.to_owned(),
                format: "swscale".into(),
                cause: format!("wrote {rows} of {} rows", self.height).into(),
            });
        }
        Ok(())
    }
}

/// Fills the output slots as frames arrive.
struct Sink<'b> {
    item: &'b str,
    mode: KeyMode,
    time_base: ff::Rational,
    frame_rate: Option<f64>,
    limits: VideoLimits,
    bytes: &'b mut [u8],
    frame_bytes: usize,
    /// The selected identities, sorted (an identity repeats when its frame fills several slots).
    selected: Vec<FrameKey>,
    /// Every identity the packets announce, sorted: a decoded frame outside it carries a timestamp no
    /// packet had (the decoder rewrote it), which is counted in `unknown`.
    known: Vec<FrameKey>,
    filled: Vec<bool>,
    pts_s: Vec<f64>,
    kept: usize,
    /// Frames seen so far per timestamp (the second part of [`FrameKey`]).
    seen: std::collections::HashMap<i64, u32>,
    ordinal: i64,
    decoded: u64,
    unknown: u64,
}

impl Sink<'_> {
    fn done(&self) -> bool {
        self.kept >= self.selected.len()
    }

    fn on_frame(&mut self, frame: &ff::frame::Video, conv: &mut Converter) -> Result<()> {
        let (item, limits) = (self.item, &self.limits);
        self.decoded += 1;
        if self.decoded > limits.max_frames {
            return Err(Error::LimitExceeded {
                item: item.to_owned(),
                what: "decoded frames".into(),
                value: self.decoded,
                limit: limits.max_frames,
            });
        }
        let key = match self.mode {
            // The packet's own timestamp, passed through the decoder: the best-effort timestamp is
            // replaced by the decode timestamp when presentation timestamps are not monotonic, and would
            // then match no packet.
            KeyMode::Pts => match frame.pts().or(frame.timestamp()) {
                Some(k) => k,
                None => return Ok(()),
            },
            KeyMode::Ordinal => {
                self.ordinal += 1;
                self.ordinal - 1
            }
        };
        let nth = self.seen.entry(key).or_insert(0);
        let id = (key, *nth);
        *nth = nth.saturating_add(1);
        if self.known.binary_search(&id).is_err() {
            self.unknown += 1;
            return Ok(());
        }
        let pixels = u64::from(frame.width()) * u64::from(frame.height());
        if pixels == 0 {
            return Ok(());
        }
        if pixels > limits.max_pixels {
            return Err(Error::LimitExceeded {
                item: item.to_owned(),
                what: "pixels per frame".into(),
                value: pixels,
                limit: limits.max_pixels,
            });
        }
        // The slots of this identity, wherever it arrives in the stream; slots whose frame never comes (a
        // damaged packet) stay unfilled.
        let first = self.selected.partition_point(|&k| k < id);
        let end = first + self.selected[first..].partition_point(|&k| k == id);
        if first == end || self.filled.get(first) != Some(&false) {
            return Ok(());
        }
        let fb = self.frame_bytes;
        let slot = self
            .bytes
            .get_mut(first * fb..(first + 1) * fb)
            .ok_or_else(|| Error::InvalidOptions(format!("{item}: frame slot {first} is outside the output buffer")))?;
        conv.convert(frame, slot, item)?;
        let t = match self.mode {
            KeyMode::Pts => ts_seconds(key, self.time_base),
            KeyMode::Ordinal => self.frame_rate.map_or(key as f64, |r| key as f64 / r),
        };
        self.kept += end - first;
        for i in first..end {
            if i > first {
                self.bytes.copy_within(first * fb..(first + 1) * fb, i * fb);
            }
            if let (Some(f), Some(p)) = (self.filled.get_mut(i), self.pts_s.get_mut(i)) {
                *f = true;
                *p = t;
            }
        }
        Ok(())
    }
}

/// The identities of the packets' frames, sorted: their timestamps (each with its place among the packets
/// of the same timestamp, in decode order), or their ordinals.
fn packet_keys(packets: &[&ff::Packet], mode: KeyMode) -> Vec<FrameKey> {
    match mode {
        KeyMode::Pts => {
            let mut seen = std::collections::HashMap::<i64, u32>::new();
            let mut keys: Vec<FrameKey> = packets
                .iter()
                .filter_map(|p| p.pts().or(p.dts()))
                .map(|t| {
                    let nth = seen.entry(t).or_insert(0);
                    let id = (t, *nth);
                    *nth = nth.saturating_add(1);
                    id
                })
                .collect();
            keys.sort_unstable();
            keys
        }
        KeyMode::Ordinal => (0..packets.len() as i64).map(|k| (k, 0)).collect(),
    }
}

/// An opened video decoder for `params` with `threads` frame threads (0: FFmpeg picks).
pub(super) fn open_decoder(
    params: ff::codec::Parameters,
    time_base: ff::Rational,
    threads: usize,
    item: &str,
    codec: &str,
) -> Result<ff::decoder::Video> {
    let mut ctx = ff::codec::Context::from_parameters(params).map_err(|e| ff_error(item, codec, e))?;
    ctx.set_threading(ff::threading::Config { kind: ff::threading::Type::Frame, count: threads, ..Default::default() });
    let mut opened = ctx.decoder();
    opened.set_packet_time_base(time_base);
    opened.video().map_err(|e| match e {
        ff::Error::DecoderNotFound => {
            Error::UnknownFormat { item: item.to_owned(), detail: format!("ffmpeg has no decoder for {codec}") }
        }
        other => ff_error(item, codec, other),
    })
}

/// Decodes demuxed packets into one `[N, H, W, C]` `u8` buffer from `allocator`.
///
/// `N` is decided before decoding, from the packet timestamps and `opts.sampling`; frames that are not
/// selected are decoded (later frames may depend on them) but never converted. A frame that cannot be
/// decoded leaves out its slot (the buffer is then compacted; `pts_s` tells which frames came out).
pub(crate) fn decode_packets(packets: Packets, opts: &DecodeOptions, allocator: &SharedAllocator) -> Result<Frames> {
    opts.validate()?;
    let Packets { item, codec: stream, packets: owned, window, frame_rate, width, height, limits } = packets;
    let params = params_of(&stream)?.0.clone();
    let time_base = ff::Rational::new(stream.time_base.0, stream.time_base.1);
    let codec = stream.name;
    let packets: Vec<&ff::Packet> = owned.iter().map(|p| ff_packet(p, &item)).collect::<Result<_>>()?;
    let (out_w, out_h) = opts.size.unwrap_or((width, height));
    if out_w == 0 || out_h == 0 {
        return Err(Error::Decode {
            item,
            format: codec,
            cause: "the container gives no frame size (set DecodeOptions::size)".into(),
        });
    }
    let channels = opts.pixel_format.channels();

    // Selection from the packet timestamps (or, for streams without them, from the output order).
    let with_ts = packets.iter().filter(|p| p.pts().or(p.dts()).is_some()).count();
    let mode = if with_ts * 2 >= packets.len() { KeyMode::Pts } else { KeyMode::Ordinal };
    let win_s = (
        if window.0 == i64::MIN { 0.0 } else { ts_seconds(window.0, time_base) },
        (window.1 != i64::MAX).then(|| ts_seconds(window.1, time_base)),
    );
    // The selection's length comes from an argument (`Uniform(n)`, `Fps(f)`): it is held to the output
    // limits before the selection, the buffer or the bookkeeping below is allocated.
    let frame_bytes = out_w as usize * out_h as usize * channels;
    // All and Every select from the packets (bounded by max_packets) and stay under the limits below.
    let max_out = match opts.sampling {
        FrameSampling::Uniform(_) | FrameSampling::Fps(_) => {
            (limits.max_output_bytes / (frame_bytes as u64).max(1)).min(limits.max_frames)
        }
        _ => u64::MAX,
    };
    let known = packet_keys(&packets, mode);
    let in_window: Vec<FrameKey> = match mode {
        KeyMode::Pts => known.iter().copied().filter(|&(t, _)| t >= window.0 && t < window.1).collect(),
        KeyMode::Ordinal => known.clone(),
    };
    let time = |k: FrameKey| match mode {
        KeyMode::Pts => ts_seconds(k.0, time_base),
        KeyMode::Ordinal => frame_rate.map_or(k.0 as f64, |r| k.0 as f64 / r),
    };
    let sel_window = if mode == KeyMode::Pts { win_s } else { (0.0, None) };
    let selected = select_keys(&in_window, time, opts.sampling, sel_window, max_out).map_err(|len| {
        Error::InvalidOptions(format!(
            "{item}: {:?} selects {len} frames of {out_w}x{out_h}x{channels} ({} bytes), above the limits of \
             {} output bytes and {} frames (VideoLimits::max_output_bytes, max_frames)",
            opts.sampling,
            len.saturating_mul(frame_bytes as u64),
            limits.max_output_bytes,
            limits.max_frames
        ))
    })?;
    drop(in_window);
    let n = selected.len();
    let total = (n as u64).saturating_mul(frame_bytes as u64);
    if total > limits.max_output_bytes {
        return Err(Error::LimitExceeded {
            item,
            what: "output bytes".into(),
            value: total,
            limit: limits.max_output_bytes,
        });
    }
    let shape = [n, out_h as usize, out_w as usize, channels];
    let mut buffer = Buffer::zeros(DType::U8, &shape, Layout::Nhwc, allocator)?;
    let mut sink = Sink {
        item: &item,
        mode,
        time_base,
        frame_rate,
        limits,
        bytes: buffer.as_bytes_mut(),
        frame_bytes,
        selected,
        known,
        filled: vec![false; n],
        pts_s: vec![0.0; n],
        kept: 0,
        seen: std::collections::HashMap::new(),
        ordinal: 0,
        decoded: 0,
        unknown: 0,
    };
    if n > 0 {
        let mut conv = Converter::new(opts.pixel_format, out_w, out_h, opts.filter);
        let mut decoder = open_decoder(params, time_base, opts.threads, &item, &codec)?;
        let mut frame = ff::frame::Video::empty();
        let mut bad = 0u32;
        'packets: for packet in &packets {
            if let Err(e) = decoder.send_packet(*packet) {
                // A damaged packet: skip it (bounded), as FFmpeg's CLI does.
                bad += 1;
                if bad > limits.max_bad_packets {
                    return Err(ff_error(&item, &codec, e));
                }
                continue;
            }
            bad = 0;
            while decoder.receive_frame(&mut frame).is_ok() {
                sink.on_frame(&frame, &mut conv)?;
                if sink.done() {
                    break 'packets;
                }
            }
        }
        if !sink.done() && decoder.send_eof().is_ok() {
            while decoder.receive_frame(&mut frame).is_ok() {
                sink.on_frame(&frame, &mut conv)?;
                if sink.done() {
                    break;
                }
            }
        }
    }
    let Sink { filled, pts_s, unknown, .. } = sink;
    let kept = filled.iter().filter(|&&f| f).count();
    if kept == n {
        return Ok(Frames { buffer, pts_s, frame_rate, codec, item });
    }
    if unknown > 0 {
        // Not damage: frames came out under timestamps no packet had, so which frame is which is unknown.
        return Err(Error::Decode {
            item,
            format: codec,
            cause: format!(
                "{} of the {n} selected frames did not come out: {unknown} decoded frames carry presentation \
                 timestamps that no packet has",
                n - kept
            )
            .into(),
        });
    }
    if kept == 0 {
        return Err(Error::Decode {
            item,
            format: codec,
            cause: format!("none of the {n} selected frames decoded").into(),
        });
    }
    // Some frames were lost to damage: compact the frames that decoded into a smaller buffer.
    let mut out = Buffer::zeros(DType::U8, &[kept, out_h as usize, out_w as usize, channels], Layout::Nhwc, allocator)?;
    let src = buffer.as_bytes();
    let mut pts = Vec::with_capacity(kept);
    for ((dst, (_, src)), t) in out
        .outer_slots_mut()
        .into_iter()
        .zip(src.chunks_exact(frame_bytes).enumerate().filter(|(i, _)| filled.get(*i) == Some(&true)))
        .zip(pts_s.iter().enumerate().filter(|(i, _)| filled.get(*i) == Some(&true)).map(|(_, t)| *t))
    {
        dst.copy_from_slice(src);
        pts.push(t);
    }
    Ok(Frames { buffer: out, pts_s: pts, frame_rate, codec, item })
}
