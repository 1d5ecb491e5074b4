//! SPDL's decoding objects over FFmpeg: decoded frames ([`crate::media::MediaFrames`] holding FFmpeg
//! frames), a streaming decoder with an optional filter graph after it, [`convert_frames`] into one
//! [`spdl_buffer::Buffer`] (SPDL's shapes and dtypes), and frames made from arrays
//! ([`reference_video_frames`], [`reference_audio_frame`]).

use std::ffi::{CStr, CString, c_int};
use std::ptr;

use ff::ffi;
use ffmpeg_next as ff;
use spdl_buffer::{Buffer, DType, Layout, SharedAllocator};

use super::avio::ff_error;
use super::media::{ff_packet, foreign, params_of, pix_fmt, pix_fmt_name, sample_fmt, sample_fmt_name};
use crate::types::media::{Codec, DecodeConfig, Fraction, Frame, FrameInfo, MediaFrames, MediaPackets, MediaType};
use crate::types::video::VideoLimits;
use crate::{Error, Result};

/// A new, empty FFmpeg frame.
fn alloc_frame(item: &str) -> Result<ff::Frame> {
    // SAFETY: av_frame_alloc returns a new frame or null; a non-null one is owned by the wrapper.
    let p = unsafe { ffi::av_frame_alloc() };
    if p.is_null() {
        return Err(Error::Decode { item: item.to_owned(), format: "frame".into(), cause: "out of memory".into() });
    }
    // SAFETY: `p` is a valid, owned frame.
    Ok(unsafe { ff::Frame::wrap(p) })
}

/// A new reference to the data of `f`.
fn clone_ff(f: &ff::Frame, item: &str) -> Result<ff::Frame> {
    // SAFETY: `f` is a valid frame; av_frame_clone returns a new owned reference or null.
    let p = unsafe { ffi::av_frame_clone(f.as_ptr()) };
    if p.is_null() {
        return Err(Error::Decode { item: item.to_owned(), format: "frame".into(), cause: "out of memory".into() });
    }
    // SAFETY: `p` is a valid, owned frame.
    Ok(unsafe { ff::Frame::wrap(p) })
}

/// A new reference to the data of `f`, with its description.
pub(crate) fn clone_frame(f: &Frame, item: &str) -> Result<Frame> {
    Ok(Frame { info: f.info.clone(), raw: Box::new(clone_ff(ff_frame(f, item)?, item)?) })
}

/// The FFmpeg frame of `f`.
fn ff_frame<'f>(f: &'f Frame, item: &str) -> Result<&'f ff::Frame> {
    f.raw.downcast_ref::<ff::Frame>().ok_or_else(|| foreign(item))
}

/// The FFmpeg frames of `frames`.
fn ffs(frames: &MediaFrames) -> Result<Vec<&ff::Frame>> {
    frames.frames.iter().map(|f| ff_frame(f, &frames.item)).collect()
}

/// A decoded frame of `kind`, with what the API reads of it.
fn wrap_frame(f: ff::Frame, kind: MediaType) -> Frame {
    let i = info(&f);
    let planes = pix_fmt(i.format).map_or(0, |p| {
        // SAFETY: a valid pixel format.
        u32::try_from(unsafe { ffi::av_pix_fmt_count_planes(p) }).unwrap_or(0)
    });
    let info = FrameInfo {
        format: if kind == MediaType::Audio { sample_fmt_name(i.format) } else { pix_fmt_name(i.format) },
        planes: if kind == MediaType::Audio { 0 } else { planes },
        width: u32::try_from(i.width).unwrap_or(0),
        height: u32::try_from(i.height).unwrap_or(0),
        samples: usize::try_from(i.samples).unwrap_or(0),
        rate: u32::try_from(i.rate).unwrap_or(0),
        channels: u32::try_from(i.channels).unwrap_or(0),
        pts: i.pts,
    };
    Frame { info, raw: Box::new(f) }
}

/// Appends `f` to `out`, counted against the limits.
fn push(out: &mut MediaFrames, f: ff::Frame, counter: &mut Counter) -> Result<()> {
    counter.count(&f, out.kind, &out.item)?;
    out.frames.push(wrap_frame(f, out.kind));
    Ok(())
}

/// The metadata attached to `frame` (image).
pub(crate) fn metadata(frame: &Frame) -> Vec<(String, String)> {
    let Ok(f) = ff_frame(frame, "frame") else { return Vec::new() };
    let mut out = Vec::new();
    // SAFETY: iterating a frame's metadata dictionary with av_dict_iterate-style av_dict_get; entries
    // are valid C strings owned by the dictionary while the frame lives.
    unsafe {
        let dict = (*f.as_ptr()).metadata;
        let mut e: *mut ffi::AVDictionaryEntry = ptr::null_mut();
        loop {
            e = ffi::av_dict_get(dict, c"".as_ptr(), e, ffi::AV_DICT_IGNORE_SUFFIX);
            if e.is_null() {
                break;
            }
            out.push((
                CStr::from_ptr((*e).key).to_string_lossy().into_owned(),
                CStr::from_ptr((*e).value).to_string_lossy().into_owned(),
            ));
        }
    }
    out
}

/// The fields of a frame that the API reads.
#[derive(Debug, Clone, Copy)]
struct Info {
    format: i32,
    width: i32,
    height: i32,
    samples: i32,
    rate: i32,
    channels: i32,
    pts: i64,
}

fn info(f: &ff::Frame) -> Info {
    // SAFETY: `f` owns a valid AVFrame.
    unsafe {
        let p = f.as_ptr();
        Info {
            format: (*p).format,
            width: (*p).width,
            height: (*p).height,
            samples: (*p).nb_samples,
            rate: (*p).sample_rate,
            channels: (*p).ch_layout.nb_channels,
            pts: (*p).pts,
        }
    }
}

/// Bytes the data of a frame takes (at its tightest packing), or `None` if it states no valid format.
fn frame_bytes(f: &ff::Frame, kind: MediaType) -> Option<u64> {
    let i = info(f);
    // SAFETY: the size queries take any sizes and return a negative number for invalid ones.
    let n = unsafe {
        match kind {
            MediaType::Audio => {
                ffi::av_samples_get_buffer_size(ptr::null_mut(), i.channels, i.samples, sample_fmt(i.format)?, 1)
            }
            _ => ffi::av_image_get_buffer_size(pix_fmt(i.format)?, i.width, i.height, 1),
        }
    };
    u64::try_from(n).ok()
}

/// Bounds on what a decoder or filter graph outputs.
#[derive(Debug)]
struct Counter {
    limits: VideoLimits,
    frames: u64,
    bytes: u64,
}

impl Counter {
    fn new(limits: VideoLimits) -> Counter {
        Counter { limits, frames: 0, bytes: 0 }
    }

    fn count(&mut self, f: &ff::Frame, kind: MediaType, item: &str) -> Result<()> {
        let l = &self.limits;
        let i = info(f);
        if kind != MediaType::Audio {
            let pixels = u64::try_from(i.width).unwrap_or(0) * u64::try_from(i.height).unwrap_or(0);
            if pixels > l.max_pixels {
                return Err(limit(item, "pixels per frame", pixels, l.max_pixels));
            }
        }
        self.frames += 1;
        if self.frames > l.max_frames {
            return Err(limit(item, "decoded frames", self.frames, l.max_frames));
        }
        self.bytes = self.bytes.saturating_add(frame_bytes(f, kind).unwrap_or(0));
        if self.bytes > l.max_output_bytes {
            return Err(limit(item, "decoded bytes", self.bytes, l.max_output_bytes));
        }
        Ok(())
    }
}

fn limit(item: &str, what: &str, value: u64, limit: u64) -> Error {
    Error::LimitExceeded { item: item.to_owned(), what: what.into(), value, limit }
}

fn averr(item: &str, what: &str, code: c_int) -> Error {
    ff_error(item, what, ff::Error::from(code))
}

/// A configured filter graph (crate::media::FilterGraph's backend).
pub(crate) struct FfFilterGraph {
    graph: ff::filter::Graph,
    inputs: Vec<(String, *mut ffi::AVFilterContext)>,
    outputs: Vec<(String, *mut ffi::AVFilterContext)>,
    desc: String,
    counter: Counter,
}

// SAFETY: the filter contexts are owned by `graph`, which is `Send`; nothing else refers to them, and the
// graph is only used through `&mut self` (not `Sync`).
unsafe impl Send for FfFilterGraph {}

impl FfFilterGraph {
    /// The description it was made from.
    pub(crate) fn desc(&self) -> &str {
        &self.desc
    }

    /// Parses and configures the graph `desc`.
    ///
    /// Errors: [`Error::InvalidOptions`] for a description FFmpeg rejects or with unconnected pads.
    pub(crate) fn new(desc: &str) -> Result<FfFilterGraph> {
        super::avio::init();
        let bad = |m: String| Error::InvalidOptions(format!("filter graph {desc:?}: {m}"));
        let c = CString::new(desc).map_err(|_| bad("contains a NUL character".into()))?;
        let mut graph = ff::filter::Graph::new();
        let (mut ins, mut outs): (*mut ffi::AVFilterInOut, *mut ffi::AVFilterInOut) =
            (ptr::null_mut(), ptr::null_mut());
        // SAFETY: `graph` is a valid graph; `c` a NUL-terminated string; the in/out lists are freed below.
        let r = unsafe { ffi::avfilter_graph_parse2(graph.as_mut_ptr(), c.as_ptr(), &mut ins, &mut outs) };
        let dangling = !ins.is_null() || !outs.is_null();
        // SAFETY: both lists were returned by avfilter_graph_parse2 (or are null).
        unsafe {
            ffi::avfilter_inout_free(&mut ins);
            ffi::avfilter_inout_free(&mut outs);
        }
        if r < 0 {
            return Err(bad(ff::Error::from(r).to_string()));
        }
        if dangling {
            return Err(bad(
                "has unconnected pads (start it with buffer/abuffer and end it with buffersink/abuffersink)".into(),
            ));
        }
        // SAFETY: a parsed graph; a null log context is allowed.
        let r = unsafe { ffi::avfilter_graph_config(graph.as_mut_ptr(), ptr::null_mut()) };
        if r < 0 {
            return Err(bad(ff::Error::from(r).to_string()));
        }
        let (mut inputs, mut outputs) = (Vec::new(), Vec::new());
        // SAFETY: the graph's filter array holds `nb_filters` valid contexts, each with its filter and a name.
        unsafe {
            let g = graph.as_ptr();
            for i in 0..(*g).nb_filters as usize {
                let ctx = *(*g).filters.add(i);
                if ctx.is_null() || (*ctx).filter.is_null() {
                    continue;
                }
                let fname = CStr::from_ptr((*(*ctx).filter).name).to_string_lossy();
                let name = if (*ctx).name.is_null() {
                    String::new()
                } else {
                    CStr::from_ptr((*ctx).name).to_string_lossy().into_owned()
                };
                match fname.as_ref() {
                    "buffer" | "abuffer" => inputs.push((name, ctx)),
                    "buffersink" | "abuffersink" => outputs.push((name, ctx)),
                    _ => {}
                }
            }
        }
        if inputs.is_empty() || outputs.is_empty() {
            return Err(bad("needs at least one buffer/abuffer input and one buffersink/abuffersink output".into()));
        }
        Ok(FfFilterGraph {
            graph,
            inputs,
            outputs,
            desc: desc.to_owned(),
            counter: Counter::new(VideoLimits::default()),
        })
    }

    /// Sets the bounds on what the graph outputs.
    pub(crate) fn set_limits(&mut self, limits: VideoLimits) {
        self.counter = Counter::new(limits);
    }

    /// The names of the input (`buffer`/`abuffer`) filters.
    pub(crate) fn inputs(&self) -> Vec<String> {
        self.inputs.iter().map(|(n, _)| n.clone()).collect()
    }

    /// The names of the output (`buffersink`/`abuffersink`) filters.
    pub(crate) fn outputs(&self) -> Vec<String> {
        self.outputs.iter().map(|(n, _)| n.clone()).collect()
    }

    fn pick(
        list: &[(String, *mut ffi::AVFilterContext)],
        key: Option<&str>,
        what: &str,
        desc: &str,
    ) -> Result<*mut ffi::AVFilterContext> {
        match key {
            None if list.len() == 1 => Ok(list[0].1),
            None => Err(Error::InvalidOptions(format!(
                "filter graph {desc:?} has {} {what}s ({}): give key=",
                list.len(),
                list.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>().join(", ")
            ))),
            Some(k) => list.iter().find(|(n, _)| n == k).map(|(_, c)| *c).ok_or_else(|| {
                Error::InvalidOptions(format!(
                    "filter graph {desc:?} has no {what} named {k:?} ({})",
                    list.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>().join(", ")
                ))
            }),
        }
    }

    /// Feeds `frames` to the input `key` (required when there are several).
    pub(crate) fn add_frames(&mut self, frames: &MediaFrames, key: Option<&str>) -> Result<()> {
        let ctx = Self::pick(&self.inputs, key, "input", &self.desc)?;
        for f in ffs(frames)? {
            // SAFETY: `ctx` is a buffer source of this graph; KEEP_REF makes FFmpeg take its own reference
            // and leave `f` untouched.
            let r = unsafe {
                ffi::av_buffersrc_add_frame_flags(ctx, f.as_ptr() as *mut _, ffi::AV_BUFFERSRC_FLAG_KEEP_REF as c_int)
            };
            if r < 0 {
                return Err(averr(&frames.item, "filter graph input", r));
            }
        }
        Ok(())
    }

    /// Tells every input that its stream ended.
    pub(crate) fn flush(&mut self) -> Result<()> {
        for (name, ctx) in &self.inputs {
            // SAFETY: `ctx` is a buffer source of this graph; a null frame marks the end of its stream.
            let r = unsafe { ffi::av_buffersrc_add_frame_flags(*ctx, ptr::null_mut(), 0) };
            if r < 0 && r != ffi::AVERROR_EOF {
                return Err(averr(name, "filter graph flush", r));
            }
        }
        Ok(())
    }

    /// The frames ready at output `key` (required when there are several); `None` if none is ready.
    pub(crate) fn get_frames(&mut self, key: Option<&str>, item: &str) -> Result<Option<MediaFrames>> {
        let ctx = Self::pick(&self.outputs, key, "output", &self.desc)?;
        // SAFETY: `ctx` is a configured buffer sink of this graph.
        let (tb, media) = unsafe { (ffi::av_buffersink_get_time_base(ctx), ffi::av_buffersink_get_type(ctx)) };
        let kind = if media == ffi::AVMediaType::AVMEDIA_TYPE_AUDIO { MediaType::Audio } else { MediaType::Video };
        let mut out = MediaFrames::empty(kind, (tb.num, tb.den), item);
        loop {
            let f = alloc_frame(item)?;
            // SAFETY: `ctx` is a buffer sink; `f` an empty owned frame that receives a reference.
            let r = unsafe { ffi::av_buffersink_get_frame(ctx, f.as_ptr() as *mut _) };
            if r == ffi::AVERROR(ffi::EAGAIN) || r == ffi::AVERROR_EOF {
                break;
            }
            if r < 0 {
                return Err(averr(item, "filter graph output", r));
            }
            push(&mut out, f, &mut self.counter)?;
        }
        Ok((!out.frames.is_empty()).then_some(out))
    }

    /// FFmpeg's drawing of the graph.
    pub(crate) fn dump(&self) -> String {
        self.graph.dump()
    }

    fn run(&mut self, f: &ff::Frame, item: &str, out: &mut MediaFrames, counter: &mut Counter) -> Result<()> {
        let ctx = self.inputs[0].1;
        // SAFETY: as in `add_frames`.
        let r = unsafe {
            ffi::av_buffersrc_add_frame_flags(ctx, f.as_ptr() as *mut _, ffi::AV_BUFFERSRC_FLAG_KEEP_REF as c_int)
        };
        if r < 0 {
            return Err(averr(item, "filter graph input", r));
        }
        self.drain(item, out, counter)
    }

    fn drain(&mut self, item: &str, out: &mut MediaFrames, counter: &mut Counter) -> Result<()> {
        let ctx = self.outputs[0].1;
        loop {
            let f = alloc_frame(item)?;
            // SAFETY: as in `get_frames`.
            let r = unsafe { ffi::av_buffersink_get_frame(ctx, f.as_ptr() as *mut _) };
            if r == ffi::AVERROR(ffi::EAGAIN) || r == ffi::AVERROR_EOF {
                return Ok(());
            }
            if r < 0 {
                return Err(averr(item, "filter graph output", r));
            }
            push(out, f, counter)?;
        }
    }

    fn output_time_base(&self) -> Fraction {
        // SAFETY: the output is a configured buffer sink.
        let tb = unsafe { ffi::av_buffersink_get_time_base(self.outputs[0].1) };
        (tb.num, tb.den)
    }
}

/// A streaming decoder (crate::media::Decoder's backend).
pub(crate) struct FfDecoder {
    item: String,
    kind: MediaType,
    codec_name: String,
    dec: ff::decoder::Opened,
    filter: Option<FfFilterGraph>,
    time_base: Fraction,
    counter: Counter,
    bad: u32,
    flushed: bool,
}

impl FfDecoder {
    /// The item it decodes.
    pub(crate) fn item(&self) -> &str {
        &self.item
    }

    /// A decoder for packets of `codec`, whose frames go through `filter_desc` (a complete graph, from a
    /// `buffer`/`abuffer` input to a `buffersink`/`abuffersink` output) when given.
    pub(crate) fn new(
        codec: &Codec,
        config: &DecodeConfig,
        filter_desc: Option<&str>,
        item: &str,
        limits: VideoLimits,
    ) -> Result<FfDecoder> {
        super::avio::init();
        let ctx = ff::codec::Context::from_parameters(params_of(codec)?.0.clone())
            .map_err(|e| ff_error(item, &codec.name, e))?;
        let tb = ff::Rational::new(codec.time_base.0, codec.time_base.1);
        let mut opts = ff::Dictionary::new();
        let mut threads = false;
        for (k, v) in &config.options {
            threads |= k == "threads";
            opts.set(k, v);
        }
        if !threads {
            opts.set("threads", "1");
        }
        let mut d = ctx.decoder();
        d.set_packet_time_base(tb);
        let dec = match &config.decoder {
            Some(name) => {
                let c = ff::decoder::find_by_name(name)
                    .ok_or_else(|| Error::InvalidOptions(format!("{item}: FFmpeg has no decoder named {name:?}")))?;
                d.open_as_with(c, opts)
            }
            None => {
                let c = ff::decoder::find(params_of(codec)?.0.id()).ok_or_else(|| Error::UnknownFormat {
                    item: item.to_owned(),
                    detail: format!("ffmpeg has no decoder for {}", codec.name),
                })?;
                d.open_as_with(c, opts)
            }
        }
        .map_err(|e| ff_error(item, &codec.name, e))?;
        let filter = match filter_desc {
            Some(desc) => {
                let mut g = FfFilterGraph::new(desc)?;
                if g.inputs.len() != 1 || g.outputs.len() != 1 {
                    return Err(Error::InvalidOptions(format!(
                        "{item}: a decoder's filter graph needs one input and one output, {desc:?} has {} and {}",
                        g.inputs.len(),
                        g.outputs.len()
                    )));
                }
                g.set_limits(limits);
                Some(g)
            }
            None => None,
        };
        Ok(FfDecoder {
            item: item.to_owned(),
            kind: codec.kind,
            codec_name: codec.name.clone(),
            dec,
            filter,
            time_base: codec.time_base,
            counter: Counter::new(limits),
            bad: 0,
            flushed: false,
        })
    }

    fn out_time_base(&self) -> Fraction {
        self.filter.as_ref().map_or(self.time_base, |g| g.output_time_base())
    }

    fn receive(&mut self, out: &mut MediaFrames) -> Result<()> {
        loop {
            let mut f = alloc_frame(&self.item)?;
            if self.dec.receive_frame(&mut f).is_err() {
                return Ok(());
            }
            // Presentation time: the decoder's best estimate (containers without pts have dts only).
            // SAFETY: `f` holds a decoded frame.
            unsafe {
                let p = f.as_mut_ptr();
                (*p).pts = (*p).best_effort_timestamp;
            }
            match &mut self.filter {
                Some(g) => g.run(&f, &self.item, out, &mut self.counter)?,
                None => push(out, f, &mut self.counter)?,
            }
        }
    }

    /// Decodes `packets` (and what the decoder held back from earlier ones): the frames ready now, at most
    /// `max`. A damaged packet is skipped (bounded by the limits' `max_bad_packets` in a row).
    pub(crate) fn decode_until(&mut self, packets: &MediaPackets, max: Option<usize>) -> Result<MediaFrames> {
        if self.flushed {
            return Err(Error::InvalidOptions(format!("{}: the decoder was flushed; make a new one", self.item)));
        }
        let mut out = MediaFrames::empty(self.kind, self.out_time_base(), &self.item);
        for p in &packets.packets {
            if let Err(e) = self.dec.send_packet(ff_packet(p, &self.item)?) {
                self.bad += 1;
                if self.bad > self.counter.limits.max_bad_packets {
                    return Err(ff_error(&self.item, &self.codec_name, e));
                }
                continue;
            }
            self.bad = 0;
            self.receive(&mut out)?;
            if max.is_some_and(|m| out.frames.len() >= m) {
                break;
            }
        }
        out.time_base = self.out_time_base();
        Ok(out)
    }

    /// Ends the stream: the frames the decoder (and filter graph) still held. The decoder is then spent.
    pub(crate) fn flush(&mut self) -> Result<MediaFrames> {
        let mut out = MediaFrames::empty(self.kind, self.out_time_base(), &self.item);
        if self.flushed {
            return Ok(out);
        }
        self.flushed = true;
        if self.dec.send_eof().is_ok() {
            self.receive(&mut out)?;
        }
        if let Some(g) = &mut self.filter {
            g.flush()?;
            g.drain(&self.item, &mut out, &mut self.counter)?;
        }
        out.time_base = self.out_time_base();
        Ok(out)
    }
}

/// How a pixel format is laid out in a converted buffer.
enum PixLayout {
    /// One plane of `c` bytes per pixel: `[H, W, C]`.
    Packed(usize),
    /// Three full-size planes: `[3, H, W]`.
    Planar3,
    /// 4:2:0 (`yuv420p`, `nv12`): `[1, H * 3 / 2, W]`.
    Yuv420,
}

fn pix_layout(name: &str) -> Option<PixLayout> {
    Some(match name {
        "rgb24" | "bgr24" => PixLayout::Packed(3),
        "rgba" | "bgra" | "argb" | "abgr" | "rgb0" | "bgr0" => PixLayout::Packed(4),
        "gray" | "gray8" => PixLayout::Packed(1),
        "yuv444p" | "yuvj444p" | "gbrp" => PixLayout::Planar3,
        "yuv420p" | "yuvj420p" | "nv12" | "nv21" => PixLayout::Yuv420,
        _ => return None,
    })
}

fn audio_dtype(name: &str) -> Option<(DType, bool)> {
    let planar = name.ends_with('p');
    let base = name.strip_suffix('p').unwrap_or(name);
    let dtype = match base {
        "u8" => DType::U8,
        "s16" => DType::I16,
        "s32" => DType::I32,
        "s64" => DType::I64,
        "flt" => DType::F32,
        "dbl" => DType::F64,
        _ => return None,
    };
    Some((dtype, planar))
}

/// The shape (without a batch axis) and dtype `frames` convert to.
fn shape_of(frames: &MediaFrames) -> Result<(Vec<usize>, DType, Layout)> {
    let item = &frames.item;
    let all = ffs(frames)?;
    let Some(first) = all.first().map(|f| info(f)) else {
        // SPDL's RuntimeError (a decode that gave no frame, e.g. of an empty window), not a bad option.
        return Err(Error::Decode {
            item: item.clone(),
            format: "frames".into(),
            cause: "No frame to convert to buffer (the frames are empty)".into(),
        });
    };
    let name = frames.format_name();
    for f in all {
        let i = info(f);
        let same = match frames.kind {
            MediaType::Audio => (i.format, i.channels) == (first.format, first.channels),
            _ => (i.format, i.width, i.height) == (first.format, first.width, first.height),
        };
        if !same {
            return Err(Error::InvalidOptions(format!(
                "{item}: the frames differ in format or size; convert them separately"
            )));
        }
    }
    match frames.kind {
        MediaType::Audio => {
            let (dtype, planar) = audio_dtype(&name).ok_or_else(|| {
                Error::InvalidOptions(format!("{item}: cannot convert audio in sample format {name:?}"))
            })?;
            let c = usize::try_from(first.channels).unwrap_or(0);
            let n = frames.num_frames();
            Ok((if planar { vec![c, n] } else { vec![n, c] }, dtype, Layout::Plain))
        }
        kind => {
            let (h, w) = (usize::try_from(first.height).unwrap_or(0), usize::try_from(first.width).unwrap_or(0));
            let layout = pix_layout(&name).ok_or_else(|| {
                Error::InvalidOptions(format!(
                    "{item}: cannot convert frames in pixel format {name:?} (convert with a filter, e.g. \
                     format=pix_fmts=rgb24)"
                ))
            })?;
            let mut shape = match layout {
                PixLayout::Packed(c) => vec![h, w, c],
                PixLayout::Planar3 => vec![3, h, w],
                PixLayout::Yuv420 => {
                    if h % 2 == 1 || w % 2 == 1 {
                        return Err(Error::InvalidOptions(format!(
                            "{item}: {name} frames of odd size {w}x{h} cannot be packed; convert to rgb24 first"
                        )));
                    }
                    vec![1, h + h / 2, w]
                }
            };
            let lay = match (&layout, kind) {
                (PixLayout::Packed(_), MediaType::Image) => Layout::Hwc,
                (PixLayout::Packed(_), _) => Layout::Nhwc,
                (_, MediaType::Image) => Layout::Chw,
                _ => Layout::Nchw,
            };
            if kind == MediaType::Video {
                shape.insert(0, frames.frames.len());
            }
            Ok((shape, DType::U8, lay))
        }
    }
}

/// Copies `rows` rows of `row` bytes from a plane with `stride` into `dst` (tightly packed).
///
/// # Safety
/// `src` must point at a plane holding `rows` rows of at least `row` bytes, `stride` bytes apart.
unsafe fn copy_plane(dst: &mut [u8], src: *const u8, stride: isize, row: usize, rows: usize) {
    for r in 0..rows {
        // SAFETY: guaranteed by the caller for each of the `rows` rows.
        let s = unsafe { std::slice::from_raw_parts(src.offset(stride * r as isize), row) };
        if let Some(d) = dst.get_mut(r * row..(r + 1) * row) {
            d.copy_from_slice(s);
        }
    }
}

/// Writes the data of one frame object into `dst` (its slot of the output).
fn write_frame(f: &ff::Frame, kind: MediaType, name: &str, dst: &mut [u8]) {
    let i = info(f);
    // SAFETY: the frame's data/linesize describe planes of its format and size (checked equal for all
    // frames by `shape_of`); every copy reads within them.
    unsafe {
        let p = f.as_ptr();
        let data = (*p).data;
        let ls = (*p).linesize;
        let (h, w) = (usize::try_from(i.height).unwrap_or(0), usize::try_from(i.width).unwrap_or(0));
        match kind {
            MediaType::Audio => {}
            _ => match pix_layout(name) {
                Some(PixLayout::Packed(c)) => copy_plane(dst, data[0], ls[0] as isize, w * c, h),
                Some(PixLayout::Planar3) => {
                    for k in 0..3 {
                        copy_plane(&mut dst[k * h * w..], data[k], ls[k] as isize, w, h);
                    }
                }
                Some(PixLayout::Yuv420) => {
                    copy_plane(dst, data[0], ls[0] as isize, w, h);
                    let rest = &mut dst[h * w..];
                    if name.starts_with("nv") {
                        copy_plane(rest, data[1], ls[1] as isize, w, h / 2);
                    } else {
                        // U and V side by side on each row of W bytes.
                        let (cw, ch) = (w / 2, h / 2);
                        for r in 0..ch {
                            let row = &mut rest[r * w..(r + 1) * w];
                            let u = std::slice::from_raw_parts(data[1].offset(ls[1] as isize * r as isize), cw);
                            let v = std::slice::from_raw_parts(data[2].offset(ls[2] as isize * r as isize), cw);
                            row[..cw].copy_from_slice(u);
                            row[cw..].copy_from_slice(v);
                        }
                    }
                }
                None => {}
            },
        }
    }
}

/// Writes the samples of audio `frames` into `dst` (`[C, N]` planar or `[N, C]` packed).
fn write_audio(frames: &MediaFrames, dtype: DType, planar: bool, dst: &mut [u8]) -> Result<()> {
    let bps = dtype.size();
    let total = frames.num_frames();
    let mut offset = 0usize;
    for f in ffs(frames)? {
        let i = info(f);
        let (n, c) = (usize::try_from(i.samples).unwrap_or(0), usize::try_from(i.channels).unwrap_or(0));
        // SAFETY: a planar audio frame has `c` planes of `n` samples; a packed one plane of `n * c`.
        unsafe {
            let p = f.as_ptr();
            if planar {
                for ch in 0..c {
                    let plane = if ch < 8 { (*p).data[ch] } else { *(*p).extended_data.add(ch) };
                    let src = std::slice::from_raw_parts(plane, n * bps);
                    let at = (ch * total + offset) * bps;
                    if let Some(d) = dst.get_mut(at..at + n * bps) {
                        d.copy_from_slice(src);
                    }
                }
            } else {
                let src = std::slice::from_raw_parts((*p).data[0], n * c * bps);
                let at = offset * c * bps;
                if let Some(d) = dst.get_mut(at..at + n * c * bps) {
                    d.copy_from_slice(src);
                }
            }
        }
        offset += n;
    }
    Ok(())
}

/// Converts frames into one buffer (SPDL's `convert_frames`): video `[N, H, W, C]` (packed formats),
/// `[N, 3, H, W]` (`yuv444p`), `[N, 1, H * 3 / 2, W]` (`yuv420p`, `nv12`); images the same without `N`;
/// audio `[C, N]` (planar) or `[N, C]` (packed) in the sample format's dtype. With `batch`, every item
/// must have the same shape, and the result has a leading batch axis.
pub(crate) fn convert_frames(items: &[&MediaFrames], batch: bool, allocator: &SharedAllocator) -> Result<Buffer> {
    let Some(first) = items.first() else {
        return Err(Error::InvalidOptions("convert_frames: no frames given".into()));
    };
    let (shape, dtype, layout) = shape_of(first)?;
    for f in &items[1..] {
        let (s, d, _) = shape_of(f)?;
        if s != shape || d != dtype {
            return Err(Error::InvalidOptions(format!(
                "convert_frames: frames of shape {s:?} ({}) and {shape:?} cannot be batched",
                f.item
            )));
        }
    }
    let mut full = shape.clone();
    if batch {
        full.insert(0, items.len());
    }
    let bytes = full.iter().try_fold(dtype.size() as u64, |a, &d| a.checked_mul(d as u64)).unwrap_or(u64::MAX);
    crate::decode_memory::check_fits(&first.item, "converted frames bytes", bytes)?;
    let layout = if batch { Layout::Plain } else { layout };
    let mut buf = Buffer::zeros(dtype, &full, layout, allocator)?;
    let per_item = usize::try_from(bytes).unwrap_or(usize::MAX) / items.len().max(1);
    let out = buf.as_bytes_mut();
    for (k, frames) in items.iter().enumerate() {
        let slot = &mut out[k * per_item..(k + 1) * per_item];
        let name = frames.format_name();
        match frames.kind {
            MediaType::Audio => {
                let planar = audio_dtype(&name).is_some_and(|(_, p)| p);
                write_audio(frames, dtype, planar, slot)?;
            }
            kind => {
                let n = if kind == MediaType::Video { frames.frames.len() } else { 1 };
                let fb = per_item / n.max(1);
                for (j, f) in ffs(frames)?.into_iter().take(n).enumerate() {
                    write_frame(f, kind, &name, &mut slot[j * fb..(j + 1) * fb]);
                }
            }
        }
    }
    Ok(buf)
}

fn pix_fmt_id(name: &str) -> Option<ffi::AVPixelFormat> {
    let c = CString::new(name).ok()?;
    // SAFETY: `c` is a NUL-terminated string.
    let f = unsafe { ffi::av_get_pix_fmt(c.as_ptr()) };
    (f != ffi::AVPixelFormat::AV_PIX_FMT_NONE).then_some(f)
}

fn sample_fmt_id(name: &str) -> Option<ffi::AVSampleFormat> {
    let c = CString::new(name).ok()?;
    // SAFETY: `c` is a NUL-terminated string.
    let f = unsafe { ffi::av_get_sample_fmt(c.as_ptr()) };
    (f != ffi::AVSampleFormat::AV_SAMPLE_FMT_NONE).then_some(f)
}

/// Video frames made from `[N, H, W, C]` (packed formats: `rgb24`, `bgr24`, `rgba`, ...), `[N, H, W]`
/// (`gray8`, `gray16`) or `[N, 3, H, W]` (`yuv444p`) pixel data (SPDL's `create_reference_video_frame`; the
/// data are copied). Frame `i` has pts `pts + i` in time base `1 / frame_rate`.
pub(crate) fn reference_video_frames(
    data: &[u8],
    shape: &[usize],
    itemsize: usize,
    pix_fmt: &str,
    frame_rate: Fraction,
    pts: i64,
) -> Result<MediaFrames> {
    let bad = |m: String| Error::InvalidOptions(format!("create_reference_video_frame: {m}"));
    let fmt = match pix_fmt {
        "gray8" | "gray" => "gray",
        "gray16" => "gray16le",
        other => other,
    };
    let (n, h, w, planar, bytes_pp) = match (fmt, shape) {
        ("rgb24" | "bgr24", &[n, h, w, 3]) => (n, h, w, false, 3),
        ("rgba" | "bgra" | "argb" | "abgr", &[n, h, w, 4]) => (n, h, w, false, 4),
        ("gray", &[n, h, w]) => (n, h, w, false, 1),
        ("gray16le" | "gray16be", &[n, h, w]) => (n, h, w, false, 2),
        ("yuv444p", &[n, 3, h, w]) => (n, h, w, true, 1),
        _ => return Err(bad(format!("an array of shape {shape:?} does not match pix_fmt {pix_fmt:?}"))),
    };
    let expect_item = if fmt.starts_with("gray16") { 2 } else { 1 };
    if itemsize != expect_item {
        return Err(bad(format!("pix_fmt {pix_fmt:?} needs {expect_item}-byte elements, got {itemsize}-byte")));
    }
    let id = pix_fmt_id(fmt).ok_or_else(|| bad(format!("unknown pix_fmt {pix_fmt:?}")))?;
    if w == 0 || h == 0 || n == 0 || w > 1 << 15 || h > 1 << 15 {
        return Err(bad(format!("invalid size {w}x{h} x {n} frames")));
    }
    let frame_len = h * w * bytes_pp * if planar { 3 } else { 1 };
    if data.len() != frame_len * n {
        return Err(bad(format!("{} bytes of data for {n} frames of {frame_len} bytes", data.len())));
    }
    crate::decode_memory::check_fits("create_reference_video_frame", "frame bytes", data.len() as u64)?;
    let mut frames = Vec::with_capacity(n);
    for k in 0..n {
        let f = alloc_frame("create_reference_video_frame")?;
        // SAFETY: `f` is an empty frame; its fields are set, then av_frame_get_buffer allocates its planes,
        // which are written row by row within their linesize.
        unsafe {
            let p = f.as_ptr() as *mut ffi::AVFrame;
            (*p).format = id as c_int;
            (*p).width = w as c_int;
            (*p).height = h as c_int;
            (*p).pts = pts + k as i64;
            let r = ffi::av_frame_get_buffer(p, 0);
            if r < 0 {
                return Err(averr("create_reference_video_frame", "frame", r));
            }
            let src = &data[k * frame_len..(k + 1) * frame_len];
            let planes = if planar { 3 } else { 1 };
            let row = w * bytes_pp;
            for pl in 0..planes {
                for y in 0..h {
                    let s = &src[(pl * h + y) * row..(pl * h + y + 1) * row];
                    let d = (*p).data[pl].offset((*p).linesize[pl] as isize * y as isize);
                    ptr::copy_nonoverlapping(s.as_ptr(), d, row);
                }
            }
        }
        frames.push(wrap_frame(f, MediaType::Video));
    }
    Ok(MediaFrames {
        kind: MediaType::Video,
        frames,
        time_base: (frame_rate.1, frame_rate.0),
        item: "<reference frame>".into(),
    })
}

/// An audio frame made from `[C, N]` (planar `sample_fmt`, suffix `p`) or `[N, C]` (packed) samples (SPDL's
/// `create_reference_audio_frame`; the data are copied), with pts `pts` in time base `1 / sample_rate`.
pub(crate) fn reference_audio_frame(
    data: &[u8],
    shape: &[usize],
    itemsize: usize,
    sample_fmt: &str,
    sample_rate: u32,
    pts: i64,
) -> Result<MediaFrames> {
    let bad = |m: String| Error::InvalidOptions(format!("create_reference_audio_frame: {m}"));
    let (dtype, planar) = audio_dtype(sample_fmt).ok_or_else(|| bad(format!("unknown sample_fmt {sample_fmt:?}")))?;
    if itemsize != dtype.size() {
        return Err(bad(format!(
            "sample_fmt {sample_fmt:?} needs {}-byte elements, got {itemsize}-byte",
            dtype.size()
        )));
    }
    let &[a, b] = shape else { return Err(bad(format!("the array must be 2D, got shape {shape:?}"))) };
    let (c, n) = if planar { (a, b) } else { (b, a) };
    if c == 0 || c > 64 || n == 0 || n > i32::MAX as usize || sample_rate == 0 {
        return Err(bad(format!("invalid audio: {c} channels, {n} samples at {sample_rate} Hz")));
    }
    if data.len() != c * n * itemsize {
        return Err(bad(format!("{} bytes of data for {c} x {n} samples", data.len())));
    }
    let id = sample_fmt_id(sample_fmt).ok_or_else(|| bad(format!("unknown sample_fmt {sample_fmt:?}")))?;
    let f = alloc_frame("create_reference_audio_frame")?;
    // SAFETY: `f` is an empty frame; after its fields are set av_frame_get_buffer allocates `c` planes of
    // `n` samples (planar) or one of `n * c`, which are filled within their size.
    unsafe {
        let p = f.as_ptr() as *mut ffi::AVFrame;
        (*p).format = id as c_int;
        (*p).nb_samples = n as c_int;
        (*p).sample_rate = sample_rate as c_int;
        (*p).pts = pts;
        ffi::av_channel_layout_default(&mut (*p).ch_layout, c as c_int);
        let r = ffi::av_frame_get_buffer(p, 0);
        if r < 0 {
            return Err(averr("create_reference_audio_frame", "frame", r));
        }
        if planar {
            for ch in 0..c {
                let d = if ch < 8 { (*p).data[ch] } else { *(*p).extended_data.add(ch) };
                let s = &data[ch * n * itemsize..(ch + 1) * n * itemsize];
                ptr::copy_nonoverlapping(s.as_ptr(), d, s.len());
            }
        } else {
            ptr::copy_nonoverlapping(data.as_ptr(), (*p).data[0], data.len());
        }
    }
    Ok(MediaFrames {
        kind: MediaType::Audio,
        frames: vec![wrap_frame(f, MediaType::Audio)],
        time_base: (1, sample_rate as i32),
        item: "<reference frame>".into(),
    })
}
