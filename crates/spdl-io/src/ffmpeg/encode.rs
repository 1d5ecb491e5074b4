//! Encoding and muxing over FFmpeg (SPDL's `Muxer`, `AudioEncoder`, `VideoEncoder`): an output format
//! context that streams are added to before its header is written, and encoders whose packets go to one of
//! those streams ([`crate::media::Muxer`]'s backend).
//!
//! The encoder is opened when its stream is added (its codec parameters, extradata included, go into the
//! stream before the header), and owns its codec context: it never refers back to the muxer, so encoding
//! and writing can run on different threads. Its packets carry the encoder's time base; the muxer rescales
//! them to the stream's (which the header may have changed) as it writes them. Video frames in a pixel
//! format the encoder does not take are converted with swscale into the encoder's first format.

use std::ffi::{CStr, CString, c_int, c_void};
use std::ptr;

use ff::ffi;
use ff::packet::{Mut as _, Ref as _};
use ffmpeg_next as ff;

use super::media::{Params, codec_from_params, foreign, params_of, wrap_packet};
use crate::types::media::{
    AudioEncodeConfig, Codec, EncoderChoice, Fraction, Frame, MediaFrames, MediaPackets, MediaType, Packet,
    VideoEncodeConfig, stream_kind,
};
use crate::types::video::VideoLimits;
use crate::{Error, Result};

/// The largest frame side an encoder is configured for (FFmpeg's encoders stop at 16384 or below).
const MAX_SIDE: u32 = 1 << 15;
/// The most channels an audio encoder is configured for.
const MAX_CHANNELS: u32 = 64;

fn bad(msg: String) -> Error {
    Error::InvalidOptions(msg)
}

/// An FFmpeg error while `what` ("encoding with libx264", "writing the mp4 header", ...).
fn encode_error(item: &str, what: &str, code: c_int) -> Error {
    Error::Encode { item: item.to_owned(), what: what.to_owned(), cause: Box::new(ff::Error::from(code)) }
}

fn cstring(what: &str, s: &str) -> Result<CString> {
    CString::new(s).map_err(|_| bad(format!("{what} {s:?} contains a NUL character")))
}

fn cstr(p: *const std::ffi::c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: a non-null, NUL-terminated string owned by FFmpeg (static, or alive for the call).
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// An FFmpeg option dictionary, freed on drop.
struct Dict(*mut ffi::AVDictionary);

impl Drop for Dict {
    fn drop(&mut self) {
        // SAFETY: a dictionary made by av_dict_set (or null), freed once.
        unsafe { ffi::av_dict_free(&mut self.0) };
    }
}

impl Dict {
    fn new(options: &[(String, String)]) -> Result<Dict> {
        let mut d = Dict(ptr::null_mut());
        for (k, v) in options {
            d.set(k, v)?;
        }
        Ok(d)
    }

    fn set(&mut self, key: &str, value: &str) -> Result<()> {
        let (k, v) = (cstring("option", key)?, cstring("option value", value)?);
        // SAFETY: `self.0` is a dictionary or null (av_dict_set allocates it); both strings are copied.
        let r = unsafe { ffi::av_dict_set(&mut self.0, k.as_ptr(), v.as_ptr(), 0) };
        if r < 0 {
            return Err(bad(format!("option {key:?}: {}", ff::Error::from(r))));
        }
        Ok(())
    }

    fn has(&self, key: &str) -> bool {
        let Ok(k) = CString::new(key) else { return false };
        // SAFETY: a dictionary or null; the entry (if any) is only tested for null.
        !unsafe { ffi::av_dict_get(self.0, k.as_ptr(), ptr::null(), 0) }.is_null()
    }

    fn set_default(&mut self, key: &str, value: &str) -> Result<()> {
        if self.has(key) { Ok(()) } else { self.set(key, value) }
    }

    /// The keys left (options nobody took).
    fn keys(&self) -> Vec<String> {
        let mut out = Vec::new();
        let mut e: *mut ffi::AVDictionaryEntry = ptr::null_mut();
        loop {
            // SAFETY: iterating the dictionary with an empty key and IGNORE_SUFFIX visits every entry; each
            // entry's key is a valid C string while the dictionary lives.
            e = unsafe { ffi::av_dict_get(self.0, c"".as_ptr(), e, ffi::AV_DICT_IGNORE_SUFFIX) };
            if e.is_null() {
                return out;
            }
            // SAFETY: a live entry (above).
            out.push(cstr(unsafe { (*e).key }));
        }
    }
}

/// An `AVCodecContext`, freed on drop.
struct CodecCtx(*mut ffi::AVCodecContext);

impl Drop for CodecCtx {
    fn drop(&mut self) {
        // SAFETY: a context from avcodec_alloc_context3 (or null), freed once.
        unsafe { ffi::avcodec_free_context(&mut self.0) };
    }
}

/// A swscale context converting frames of one size from `src` to `dst`, freed on drop.
struct Scaler {
    ctx: *mut ffi::SwsContext,
    dst: ffi::AVPixelFormat,
    width: c_int,
    height: c_int,
}

impl Drop for Scaler {
    fn drop(&mut self) {
        // SAFETY: a context from sws_getContext, freed once.
        unsafe { ffi::sws_freeContext(self.ctx) };
    }
}

/// `*list` up to the element for which `end` holds (FFmpeg's terminated arrays); empty for a null list.
///
/// # Safety
/// `list` must be null or point at an array terminated by an element for which `end` is true.
unsafe fn terminated<T: Copy>(list: *const T, end: impl Fn(&T) -> bool) -> Vec<T> {
    let mut out = Vec::new();
    if list.is_null() {
        return out;
    }
    let mut p = list;
    // SAFETY: guaranteed by the caller: every element up to the terminator is readable.
    unsafe {
        while !end(&*p) {
            out.push(*p);
            p = p.add(1);
        }
    }
    out
}

fn pix_fmt_name(f: ffi::AVPixelFormat) -> String {
    // SAFETY: av_get_pix_fmt_name returns a static C string or null.
    cstr(unsafe { ffi::av_get_pix_fmt_name(f) })
}

fn sample_fmt_name(f: ffi::AVSampleFormat) -> String {
    // SAFETY: av_get_sample_fmt_name returns a static C string or null.
    cstr(unsafe { ffi::av_get_sample_fmt_name(f) })
}

fn pix_fmt_by_name(name: &str) -> Result<ffi::AVPixelFormat> {
    let c = cstring("pix_fmt", name)?;
    // SAFETY: a NUL-terminated name.
    let f = unsafe { ffi::av_get_pix_fmt(c.as_ptr()) };
    if f == ffi::AVPixelFormat::AV_PIX_FMT_NONE {
        return Err(bad(format!("unknown pixel format {name:?} (`ffmpeg -pix_fmts` lists them)")));
    }
    Ok(f)
}

fn sample_fmt_by_name(name: &str) -> Result<ffi::AVSampleFormat> {
    let c = cstring("sample_fmt", name)?;
    // SAFETY: a NUL-terminated name.
    let f = unsafe { ffi::av_get_sample_fmt(c.as_ptr()) };
    if f == ffi::AVSampleFormat::AV_SAMPLE_FMT_NONE {
        return Err(bad(format!(
            "unknown sample format {name:?} (u8, s16, s32, flt, dbl, each with a p suffix for planar)"
        )));
    }
    Ok(f)
}

fn is_rgb(f: ffi::AVPixelFormat) -> bool {
    // SAFETY: av_pix_fmt_desc_get returns a static descriptor or null.
    let d = unsafe { ffi::av_pix_fmt_desc_get(f) };
    // SAFETY: a non-null static descriptor.
    !d.is_null() && unsafe { (*d).flags } & ffi::AV_PIX_FMT_FLAG_RGB as u64 != 0
}

/// The encoder named `name` (of `kind`), or the default encoder of the container for `kind`.
fn find_encoder(
    oformat: *const ffi::AVOutputFormat,
    kind: MediaType,
    name: Option<&str>,
) -> Result<*const ffi::AVCodec> {
    let want = match kind {
        MediaType::Audio => ffi::AVMediaType::AVMEDIA_TYPE_AUDIO,
        _ => ffi::AVMediaType::AVMEDIA_TYPE_VIDEO,
    };
    let label = kind.name();
    if let Some(name) = name {
        let c = cstring("encoder", name)?;
        // SAFETY: a NUL-terminated name; the result is a static codec or null.
        let codec = unsafe { ffi::avcodec_find_encoder_by_name(c.as_ptr()) };
        if codec.is_null() {
            return Err(bad(format!("FFmpeg has no encoder named {name:?} (`ffmpeg -encoders` lists them)")));
        }
        // SAFETY: a static codec.
        if unsafe { (*codec).type_ } != want {
            let article = if kind == MediaType::Audio { "an" } else { "a" };
            return Err(bad(format!("{name:?} is not {article} {label} encoder")));
        }
        return Ok(codec);
    }
    // SAFETY: the muxer's static output format.
    let (id, fmt) = unsafe {
        (if kind == MediaType::Audio { (*oformat).audio_codec } else { (*oformat).video_codec }, cstr((*oformat).name))
    };
    if id == ffi::AVCodecID::AV_CODEC_ID_NONE {
        return Err(bad(format!("the {fmt} container holds no {label}")));
    }
    // SAFETY: a codec id; the result is a static codec or null.
    let codec = unsafe { ffi::avcodec_find_encoder(id) };
    if codec.is_null() {
        // SAFETY: avcodec_get_name returns a static string for any id.
        let codec_name = cstr(unsafe { ffi::avcodec_get_name(id) });
        return Err(bad(format!(
            "the {fmt} container's default {label} codec {codec_name} has no encoder in this FFmpeg; give encoder="
        )));
    }
    Ok(codec)
}

/// Opens `ctx` for `codec` with the caller's options (single-threaded unless `threads` is given); an option
/// the encoder does not take is an error, as in SPDL.
fn open_codec(ctx: &CodecCtx, codec: *const ffi::AVCodec, options: &[(String, String)], item: &str) -> Result<()> {
    let name = codec_name(codec);
    let mut dict = Dict::new(options)?;
    dict.set_default("threads", "1")?;
    // FFmpeg's own Vorbis and Opus encoders are experimental (libvorbis and libopus are not).
    if name == "vorbis" || name == "opus" {
        dict.set_default("strict", "experimental")?;
    }
    // SAFETY: `ctx` is an allocated, configured, unopened context for `codec`; the dictionary is updated to
    // hold the options the encoder did not take.
    let r = unsafe { ffi::avcodec_open2(ctx.0, codec, &mut dict.0) };
    if r < 0 {
        return Err(bad(format!(
            "{item}: the {name} encoder refused its configuration ({}; check the size, rates, formats and \
             options it takes: `ffmpeg -h encoder={name}`)",
            ff::Error::from(r)
        )));
    }
    let left = dict.keys();
    if !left.is_empty() {
        return Err(bad(format!(
            "{item}: the {name} encoder has no option {} (`ffmpeg -h encoder={name}` lists them)",
            left.join(", ")
        )));
    }
    Ok(())
}

fn codec_name(codec: *const ffi::AVCodec) -> String {
    // SAFETY: a static codec whose name is a static string.
    cstr(unsafe { (*codec).name })
}

/// What the frames given to an encoder must be.
#[derive(Debug, Clone)]
enum Input {
    Video { width: u32, height: u32, format: String },
    Audio { rate: u32, channels: u32, format: String },
}

/// An encoder of one stream (crate::media::AudioEncoder's and VideoEncoder's backend).
pub(crate) struct FfEncoder {
    item: String,
    kind: MediaType,
    ctx: CodecCtx,
    encoder: String,
    codec: Codec,
    index: usize,
    input: Input,
    scaler: Option<Scaler>,
    /// Audio: samples per frame the encoder requires (0: any).
    frame_size: usize,
    fixed_frame_size: bool,
    /// A frame shorter than `frame_size` was sent: it must have been the last.
    short_sent: bool,
    next_pts: i64,
    flushed: bool,
}

// SAFETY: the codec and swscale contexts are owned by this value alone and used only through `&mut self`.
unsafe impl Send for FfEncoder {}

impl FfEncoder {
    /// The codec of the packets, read from the opened context.
    fn output_codec(ctx: &CodecCtx, kind: MediaType, item: &str) -> Result<Codec> {
        let mut p = ff::codec::Parameters::new();
        // SAFETY: `ctx` is an opened codec context; `p` owns valid parameters that receive a copy.
        let (r, tb, fr) = unsafe {
            let r = ffi::avcodec_parameters_from_context(p.as_mut_ptr(), ctx.0);
            (r, (*ctx.0).time_base, (*ctx.0).framerate)
        };
        if r < 0 {
            return Err(encode_error(item, "reading the codec parameters", r));
        }
        Ok(codec_from_params(Params(p), kind, (tb.num, tb.den), (fr.num, fr.den)))
    }

    /// A video encoder for `config` (frames of `config.pix_fmt`, converted when `codec` does not take it).
    fn video(
        codec: *const ffi::AVCodec,
        config: &VideoEncodeConfig,
        options: &[(String, String)],
        global_header: bool,
        item: String,
        index: usize,
    ) -> Result<FfEncoder> {
        let name = codec_name(codec);
        let (w, h) = (config.width, config.height);
        if w == 0 || h == 0 || w > MAX_SIDE || h > MAX_SIDE {
            return Err(bad(format!("{item}: invalid frame size {w}x{h} (1 to {MAX_SIDE} pixels a side)")));
        }
        // SAFETY: the codec's pixel format list is terminated by AV_PIX_FMT_NONE (or null).
        let formats = unsafe { terminated((*codec).pix_fmts, |f| *f == ffi::AVPixelFormat::AV_PIX_FMT_NONE) };
        let input = match &config.pix_fmt {
            Some(n) => pix_fmt_by_name(n)?,
            None => *formats
                .first()
                .ok_or_else(|| bad(format!("{item}: the {name} encoder has no default pixel format; give pix_fmt")))?,
        };
        // The encoder's format: the input's when it takes it, else its first (converted with swscale).
        let target = if formats.is_empty() || formats.contains(&input) { input } else { formats[0] };
        let (mut hs, mut vs): (c_int, c_int) = (0, 0);
        // SAFETY: a valid pixel format; the shifts are written.
        unsafe { ffi::av_pix_fmt_get_chroma_sub_sample(target, &mut hs, &mut vs) };
        let (mw, mh) = (1u32 << hs.clamp(0, 4), 1u32 << vs.clamp(0, 4));
        if w % mw != 0 || h % mh != 0 {
            return Err(bad(format!(
                "{item}: the {name} encoder encodes {} frames, whose width must be a multiple of {mw} and height \
                 of {mh}; got {w}x{h}",
                pix_fmt_name(target)
            )));
        }
        // SAFETY: the codec's frame rate list is terminated by {0, 0} (or null).
        let rates = unsafe { terminated((*codec).supported_framerates, |r| r.num == 0 && r.den == 0) };
        let rate = match config.frame_rate {
            Some((n, d)) => {
                if n <= 0 || d <= 0 {
                    return Err(bad(format!("{item}: frame_rate must be positive, got {n}/{d}")));
                }
                let q = ffi::AVRational { num: n, den: d };
                // SAFETY: av_cmp_q compares two rationals.
                if !rates.is_empty() && !rates.iter().any(|r| unsafe { ffi::av_cmp_q(*r, q) } == 0) {
                    let list: Vec<String> = rates.iter().map(|r| format!("{}/{}", r.num, r.den)).collect();
                    return Err(bad(format!(
                        "{item}: the {name} encoder does not take the frame rate {n}/{d} (it takes {})",
                        list.join(", ")
                    )));
                }
                q
            }
            None => *rates
                .first()
                .ok_or_else(|| bad(format!("{item}: the {name} encoder has no default frame rate; give frame_rate")))?,
        };
        // SAFETY: the codec is a static encoder; the result is a new context or null.
        let ctx = CodecCtx(unsafe { ffi::avcodec_alloc_context3(codec) });
        if ctx.0.is_null() {
            return Err(encode_error(&item, &format!("allocating the {name} encoder"), ffi::AVERROR(ffi::ENOMEM)));
        }
        // SAFETY: `ctx` is a new, unopened context; its fields are set before avcodec_open2.
        unsafe {
            let c = ctx.0;
            (*c).pix_fmt = target;
            (*c).width = w as c_int;
            (*c).height = h as c_int;
            (*c).framerate = rate;
            (*c).time_base = ffi::AVRational { num: rate.den, den: rate.num };
            if config.bit_rate > 0 {
                (*c).bit_rate = config.bit_rate;
            }
            if config.compression_level != -1 {
                (*c).compression_level = config.compression_level;
            }
            if config.gop_size != -1 {
                (*c).gop_size = config.gop_size;
            }
            if config.max_b_frames != -1 {
                (*c).max_b_frames = config.max_b_frames;
            }
            if config.qscale >= 0 {
                (*c).flags |= ffi::AV_CODEC_FLAG_QSCALE as c_int;
                (*c).global_quality = config.qscale.saturating_mul(ffi::FF_QP2LAMBDA);
            }
            if global_header {
                (*c).flags |= ffi::AV_CODEC_FLAG_GLOBAL_HEADER as c_int;
            }
        }
        for (key, value) in [
            ("colorspace", &config.colorspace),
            ("color_primaries", &config.color_primaries),
            ("color_trc", &config.color_trc),
        ] {
            if let Some(v) = value {
                let (k, cv) = (cstring(key, key)?, cstring(key, v)?);
                // SAFETY: `ctx` is an AVOptions-enabled context; the option is one of AVCodecContext's own,
                // set from its named constants (or a number).
                let r = unsafe { ffi::av_opt_set(ctx.0 as *mut c_void, k.as_ptr(), cv.as_ptr(), 0) };
                if r < 0 {
                    return Err(bad(format!(
                        "{item}: unknown {key} {v:?} (e.g. \"bt709\", \"bt470bg\", \"smpte170m\")"
                    )));
                }
            }
        }
        open_codec(&ctx, codec, options, &item)?;
        let scaler = if target == input {
            None
        } else {
            // SAFETY: valid formats and sizes; the result is a new context or null.
            let s = unsafe {
                ffi::sws_getContext(
                    w as c_int,
                    h as c_int,
                    input,
                    w as c_int,
                    h as c_int,
                    target,
                    ffi::SWS_BICUBIC,
                    ptr::null_mut(),
                    ptr::null_mut(),
                    ptr::null(),
                )
            };
            if s.is_null() {
                return Err(bad(format!(
                    "{item}: cannot convert {} frames to {} for the {name} encoder",
                    pix_fmt_name(input),
                    pix_fmt_name(target)
                )));
            }
            let scaler = Scaler { ctx: s, dst: target, width: w as c_int, height: h as c_int };
            // SAFETY: reads the context's colorspace (set from the configuration, or unspecified).
            let space = unsafe { (*ctx.0).colorspace } as c_int;
            if is_rgb(input) && !is_rgb(target) && config.colorspace.is_some() {
                // RGB into YUV with the matrix the stream says it uses (swscale's default is BT.601).
                let (mut inv, mut table): (*mut c_int, *mut c_int) = (ptr::null_mut(), ptr::null_mut());
                let (mut src_range, mut dst_range, mut b, mut con, mut sat): (c_int, c_int, c_int, c_int, c_int) =
                    (0, 0, 0, 0, 0);
                // SAFETY: `s` is a new context; the details are read into the locals, then written back with
                // the colorspace's coefficients (a static table) in place of the destination's.
                unsafe {
                    if ffi::sws_getColorspaceDetails(
                        s,
                        &mut inv,
                        &mut src_range,
                        &mut table,
                        &mut dst_range,
                        &mut b,
                        &mut con,
                        &mut sat,
                    ) >= 0
                    {
                        ffi::sws_setColorspaceDetails(
                            s,
                            inv,
                            src_range,
                            ffi::sws_getCoefficients(space),
                            dst_range,
                            b,
                            con,
                            sat,
                        );
                    }
                }
            }
            Some(scaler)
        };
        let codec = Self::output_codec(&ctx, MediaType::Video, &item)?;
        Ok(FfEncoder {
            item,
            kind: MediaType::Video,
            ctx,
            encoder: name,
            codec,
            index,
            input: Input::Video { width: w, height: h, format: pix_fmt_name(input) },
            scaler,
            frame_size: 0,
            fixed_frame_size: false,
            short_sent: false,
            next_pts: 0,
            flushed: false,
        })
    }

    /// An audio encoder for `config` (the frames must be in a sample format the encoder takes).
    fn audio(
        codec: *const ffi::AVCodec,
        config: &AudioEncodeConfig,
        options: &[(String, String)],
        global_header: bool,
        item: String,
        index: usize,
    ) -> Result<FfEncoder> {
        let name = codec_name(codec);
        let (channels, rate) = (config.num_channels, config.sample_rate);
        if channels == 0 || channels > MAX_CHANNELS {
            return Err(bad(format!("{item}: num_channels must be 1 to {MAX_CHANNELS}, got {channels}")));
        }
        if rate == 0 || rate > i32::MAX as u32 {
            return Err(bad(format!("{item}: invalid sample_rate {rate}")));
        }
        // SAFETY: the codec's sample format list is terminated by AV_SAMPLE_FMT_NONE (or null).
        let formats = unsafe { terminated((*codec).sample_fmts, |f| *f == ffi::AVSampleFormat::AV_SAMPLE_FMT_NONE) };
        let format = match &config.sample_fmt {
            Some(n) => {
                let f = sample_fmt_by_name(n)?;
                if !formats.is_empty() && !formats.contains(&f) {
                    let list: Vec<String> = formats.iter().map(|f| sample_fmt_name(*f)).collect();
                    return Err(bad(format!(
                        "{item}: the {name} encoder does not take sample format {n:?} (it takes {})",
                        list.join(", ")
                    )));
                }
                f
            }
            None => *formats.first().ok_or_else(|| {
                bad(format!("{item}: the {name} encoder has no default sample format; give sample_fmt"))
            })?,
        };
        // SAFETY: the codec's sample rate list is terminated by 0 (or null).
        let rates = unsafe { terminated((*codec).supported_samplerates, |r| *r == 0) };
        if !rates.is_empty() && !rates.contains(&(rate as c_int)) {
            let list: Vec<String> = rates.iter().map(i32::to_string).collect();
            return Err(bad(format!(
                "{item}: the {name} encoder does not take the sample rate {rate} (it takes {})",
                list.join(", ")
            )));
        }
        // SAFETY: the codec is a static encoder; the result is a new context or null.
        let ctx = CodecCtx(unsafe { ffi::avcodec_alloc_context3(codec) });
        if ctx.0.is_null() {
            return Err(encode_error(&item, &format!("allocating the {name} encoder"), ffi::AVERROR(ffi::ENOMEM)));
        }
        // SAFETY: the codec's channel layout list is terminated by a layout of 0 channels (or null).
        let layouts = unsafe { terminated((*codec).ch_layouts, |l| l.nb_channels == 0) };
        // SAFETY: `ctx` is a new, unopened context; its fields are set before avcodec_open2. The layouts
        // listed by the codec are static; copying one into the context allocates what it needs.
        unsafe {
            let c = ctx.0;
            (*c).sample_fmt = format;
            (*c).sample_rate = rate as c_int;
            (*c).time_base = ffi::AVRational { num: 1, den: rate as c_int };
            if layouts.is_empty() {
                ffi::av_channel_layout_default(&mut (*c).ch_layout, channels as c_int);
            } else {
                let Some(l) = layouts.iter().find(|l| l.nb_channels == channels as c_int) else {
                    let counts: Vec<String> = layouts.iter().map(|l| l.nb_channels.to_string()).collect();
                    return Err(bad(format!(
                        "{item}: the {name} encoder does not take {channels} channels (it takes {})",
                        counts.join(", ")
                    )));
                };
                let r = ffi::av_channel_layout_copy(&mut (*c).ch_layout, l);
                if r < 0 {
                    return Err(encode_error(&item, "setting the channel layout", r));
                }
            }
            if config.bit_rate > 0 {
                (*c).bit_rate = config.bit_rate;
            }
            if config.compression_level != -1 {
                (*c).compression_level = config.compression_level;
            }
            if config.qscale >= 0 {
                (*c).flags |= ffi::AV_CODEC_FLAG_QSCALE as c_int;
                (*c).global_quality = config.qscale.saturating_mul(ffi::FF_QP2LAMBDA);
            }
            if global_header {
                (*c).flags |= ffi::AV_CODEC_FLAG_GLOBAL_HEADER as c_int;
            }
        }
        open_codec(&ctx, codec, options, &item)?;
        // SAFETY: an opened context and its static codec.
        let (frame_size, variable) =
            unsafe { ((*ctx.0).frame_size, (*codec).capabilities as u32 & ffi::AV_CODEC_CAP_VARIABLE_FRAME_SIZE != 0) };
        let frame_size = usize::try_from(frame_size).unwrap_or(0);
        let codec = Self::output_codec(&ctx, MediaType::Audio, &item)?;
        Ok(FfEncoder {
            item,
            kind: MediaType::Audio,
            ctx,
            encoder: name,
            codec,
            index,
            input: Input::Audio { rate, channels, format: sample_fmt_name(format) },
            scaler: None,
            frame_size,
            fixed_frame_size: frame_size > 0 && !variable,
            short_sent: false,
            next_pts: 0,
            flushed: false,
        })
    }

    pub(crate) fn item(&self) -> &str {
        &self.item
    }

    pub(crate) fn codec(&self) -> &Codec {
        &self.codec
    }

    pub(crate) fn stream_index(&self) -> usize {
        self.index
    }

    pub(crate) fn frame_size(&self) -> usize {
        self.frame_size
    }

    /// Checks every frame of `frames` against what the encoder takes, before any is sent.
    fn check(&self, frames: &MediaFrames) -> Result<()> {
        let item = &self.item;
        if stream_kind(frames.kind) != self.kind {
            return Err(bad(format!(
                "{item}: the {} encoder takes {} frames, got {} frames",
                self.encoder,
                self.kind.name(),
                frames.kind.name()
            )));
        }
        let mut short = self.short_sent;
        for (i, f) in frames.frames.iter().enumerate() {
            let info = &f.info;
            match &self.input {
                Input::Video { width, height, format } => {
                    if info.format != *format || info.width != *width || info.height != *height {
                        return Err(bad(format!(
                            "{item}: the encoder was configured for {format} frames of {width}x{height}, frame {i} \
                             is {} of {}x{}",
                            info.format, info.width, info.height
                        )));
                    }
                }
                Input::Audio { rate, channels, format } => {
                    if info.format != *format || info.channels != *channels || info.rate != *rate {
                        return Err(bad(format!(
                            "{item}: the encoder was configured for {format} audio of {channels} channels at {rate} \
                             Hz, frame {i} is {} of {} channels at {} Hz",
                            info.format, info.channels, info.rate
                        )));
                    }
                    if self.fixed_frame_size {
                        let (n, fs) = (info.samples, self.frame_size);
                        if n > fs {
                            return Err(bad(format!(
                                "{item}: a frame of {n} samples, but the {} encoder takes {fs} samples a frame \
                                 (AudioEncoder.frame_size): slice the samples into frames of {fs}",
                                self.encoder
                            )));
                        }
                        if short {
                            return Err(bad(format!(
                                "{item}: a frame shorter than {fs} samples was already given; only the last frame \
                                 may be shorter than the encoder's frame_size"
                            )));
                        }
                        short = n < fs;
                    }
                }
            }
        }
        Ok(())
    }

    /// The frame to send for `f` (a new reference, or a converted copy) with its pts in the encoder's time
    /// base.
    fn prepare(&self, f: &Frame, time_base: Fraction) -> Result<ff::Frame> {
        let src = f.raw.downcast_ref::<ff::Frame>().ok_or_else(|| foreign(&self.item))?;
        // SAFETY: reads the context's time base.
        let tb = unsafe { (*self.ctx.0).time_base };
        let pts = if f.info.pts == i64::MIN || time_base.0 <= 0 || time_base.1 <= 0 {
            if f.info.pts == i64::MIN { self.next_pts } else { f.info.pts }
        } else {
            // SAFETY: rescaling between two positive rationals.
            unsafe { ffi::av_rescale_q(f.info.pts, ffi::AVRational { num: time_base.0, den: time_base.1 }, tb) }
        };
        let out = match &self.scaler {
            None => {
                // SAFETY: `src` is a valid frame; av_frame_clone returns a new reference or null.
                let p = unsafe { ffi::av_frame_clone(src.as_ptr()) };
                if p.is_null() {
                    return Err(encode_error(&self.item, "allocating a frame", ffi::AVERROR(ffi::ENOMEM)));
                }
                // SAFETY: `p` is a valid, owned frame.
                unsafe { ff::Frame::wrap(p) }
            }
            Some(s) => {
                // SAFETY: av_frame_alloc returns a new frame or null.
                let p = unsafe { ffi::av_frame_alloc() };
                if p.is_null() {
                    return Err(encode_error(&self.item, "allocating a frame", ffi::AVERROR(ffi::ENOMEM)));
                }
                // SAFETY: `p` is a valid, owned frame.
                let dst = unsafe { ff::Frame::wrap(p) };
                // SAFETY: `p` gets the encoder's format and size and its planes; swscale reads the source's
                // planes (of the configured size and format, checked in `check`) and writes the new ones.
                unsafe {
                    (*p).format = s.dst as c_int;
                    (*p).width = s.width;
                    (*p).height = s.height;
                    let r = ffi::av_frame_get_buffer(p, 0);
                    if r < 0 {
                        return Err(encode_error(&self.item, "preparing a frame", r));
                    }
                    let sp = src.as_ptr();
                    let r = ffi::av_frame_copy_props(p, sp);
                    if r < 0 {
                        return Err(encode_error(&self.item, "preparing a frame", r));
                    }
                    ffi::sws_scale(
                        s.ctx,
                        (*sp).data.as_ptr() as *const *const u8,
                        (*sp).linesize.as_ptr(),
                        0,
                        s.height,
                        (*p).data.as_ptr(),
                        (*p).linesize.as_ptr(),
                    );
                }
                dst
            }
        };
        // SAFETY: `out` is an owned frame (a new reference or a new copy); only its own fields change. A
        // decoded frame's picture type would force the encoder's choice, so it is cleared. An audio frame
        // whose layout differs from the encoder's in form only gets the encoder's.
        unsafe {
            let p = out.as_ptr() as *mut ffi::AVFrame;
            (*p).pts = pts;
            if self.kind == MediaType::Video {
                (*p).pict_type = ffi::AVPictureType::AV_PICTURE_TYPE_NONE;
            } else if ffi::av_channel_layout_compare(&(*p).ch_layout, &(*self.ctx.0).ch_layout) != 0 {
                ffi::av_channel_layout_uninit(&mut (*p).ch_layout);
                let r = ffi::av_channel_layout_copy(&mut (*p).ch_layout, &(*self.ctx.0).ch_layout);
                if r < 0 {
                    return Err(encode_error(&self.item, "preparing a frame", r));
                }
            }
        }
        Ok(out)
    }

    /// Receives every packet ready.
    fn receive(&mut self, out: &mut Vec<Packet>) -> Result<()> {
        loop {
            let mut p = ff::Packet::empty();
            // SAFETY: an opened context; `p` is an owned empty packet that receives a reference.
            let r = unsafe { ffi::avcodec_receive_packet(self.ctx.0, p.as_mut_ptr()) };
            if r == ffi::AVERROR(ffi::EAGAIN) || r == ffi::AVERROR_EOF {
                return Ok(());
            }
            if r < 0 {
                return Err(encode_error(&self.item, &format!("encoding with {}", self.encoder), r));
            }
            // A video packet without a duration would leave the last frame without one in the container:
            // one frame, in the encoder's time base (1 / frame rate).
            if self.kind == MediaType::Video && p.duration() == 0 {
                p.set_duration(1);
            }
            out.push(wrap_packet(p));
        }
    }

    fn packets(&self, packets: Vec<Packet>) -> Option<MediaPackets> {
        (!packets.is_empty()).then(|| MediaPackets {
            item: self.item.clone(),
            codec: self.codec.clone(),
            packets,
            window: None,
            limits: VideoLimits::default(),
        })
    }

    /// Encodes `frames`: the packets ready, or `None`.
    pub(crate) fn encode(&mut self, frames: &MediaFrames) -> Result<Option<MediaPackets>> {
        if self.flushed {
            return Err(bad(format!("{}: the encoder was flushed; make a new one", self.item)));
        }
        self.check(frames)?;
        let mut out = Vec::new();
        for f in &frames.frames {
            let frame = self.prepare(f, frames.time_base)?;
            // SAFETY: reads the pts just set.
            let pts = unsafe { (*frame.as_ptr()).pts };
            // SAFETY: an opened context and a valid frame, which FFmpeg references (it stays ours).
            let r = unsafe { ffi::avcodec_send_frame(self.ctx.0, frame.as_ptr()) };
            if r < 0 {
                return Err(encode_error(&self.item, &format!("encoding with {}", self.encoder), r));
            }
            if self.kind == MediaType::Audio && self.fixed_frame_size && f.info.samples < self.frame_size {
                self.short_sent = true;
            }
            let step = if self.kind == MediaType::Audio { f.info.samples as i64 } else { 1 };
            self.next_pts = pts.saturating_add(step);
            self.receive(&mut out)?;
        }
        Ok(self.packets(out))
    }

    /// Ends the stream: the packets still held, or `None`.
    pub(crate) fn flush(&mut self) -> Result<Option<MediaPackets>> {
        if self.flushed {
            return Ok(None);
        }
        self.flushed = true;
        // SAFETY: an opened context; a null frame ends the stream.
        let r = unsafe { ffi::avcodec_send_frame(self.ctx.0, ptr::null()) };
        if r < 0 && r != ffi::AVERROR_EOF {
            return Err(encode_error(&self.item, &format!("encoding with {}", self.encoder), r));
        }
        let mut out = Vec::new();
        self.receive(&mut out)?;
        Ok(self.packets(out))
    }
}

/// Where a muxer is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Streams can be added.
    Setup,
    /// The header is written: packets can be.
    Open,
    /// The trailer is written (or the muxer was closed before opening).
    Closed,
}

/// What the muxer knows of one of its streams.
#[derive(Debug, Clone)]
struct OutStream {
    kind: MediaType,
    codec: String,
}

/// A muxer (crate::media::Muxer's backend).
pub(crate) struct FfMuxer {
    dst: String,
    ctx: *mut ffi::AVFormatContext,
    streams: Vec<OutStream>,
    state: State,
}

// SAFETY: the format context is owned by this value alone and used only through `&mut self`.
unsafe impl Send for FfMuxer {}

impl Drop for FfMuxer {
    fn drop(&mut self) {
        if self.state == State::Open {
            // An open muxer that was never closed: finish the file as well as can be (errors have nowhere to go).
            let _ = self.finish();
        }
        // SAFETY: the context from avformat_alloc_output_context2, whose I/O is closed; freed once.
        unsafe { ffi::avformat_free_context(self.ctx) };
    }
}

impl FfMuxer {
    /// A muxer for `dst` in container `format` (from `dst`'s name without one).
    ///
    /// Errors: [`Error::InvalidOptions`] when FFmpeg has no such container or cannot tell it from the name.
    pub(crate) fn new(dst: &str, format: Option<&str>) -> Result<FfMuxer> {
        super::avio::init();
        let url = cstring("destination", dst)?;
        let fmt = format.map(|f| cstring("format", f)).transpose()?;
        let mut ctx: *mut ffi::AVFormatContext = ptr::null_mut();
        // SAFETY: NUL-terminated strings (or null for the format); on success `ctx` is a new context owned by
        // the returned value.
        let r = unsafe {
            ffi::avformat_alloc_output_context2(
                &mut ctx,
                ptr::null_mut(),
                fmt.as_ref().map_or(ptr::null(), |f| f.as_ptr()),
                url.as_ptr(),
            )
        };
        if r < 0 || ctx.is_null() {
            return Err(bad(match format {
                Some(f) => format!("{dst}: FFmpeg has no muxer {f:?} (`ffmpeg -muxers` lists them)"),
                None => format!(
                    "{dst}: FFmpeg cannot tell the container from the name; give format= (`ffmpeg -muxers` lists them)"
                ),
            }));
        }
        Ok(FfMuxer { dst: dst.to_owned(), ctx, streams: Vec::new(), state: State::Setup })
    }

    pub(crate) fn dst(&self) -> &str {
        &self.dst
    }

    pub(crate) fn num_streams(&self) -> usize {
        self.streams.len()
    }

    // The field is `*mut` in FFmpeg 4's headers, `*const` from FFmpeg 5: the cast is not a no-op there.
    #[allow(clippy::unnecessary_cast)]
    fn oformat(&self) -> *const ffi::AVOutputFormat {
        // SAFETY: an allocated output context always has its output format.
        unsafe { (*self.ctx).oformat as *const ffi::AVOutputFormat }
    }

    fn format_name(&self) -> String {
        // SAFETY: the static output format and its static name.
        cstr(unsafe { (*self.oformat()).name })
    }

    fn check_setup(&self) -> Result<()> {
        match self.state {
            State::Setup => Ok(()),
            State::Open => Err(bad(format!("{}: streams are added before open()", self.dst))),
            State::Closed => Err(bad(format!("{}: the muxer was closed", self.dst))),
        }
    }

    /// A new stream with the encoder's time base and parameters.
    fn new_stream(&mut self, kind: MediaType, codec: &Codec, frame_rate: Fraction) -> Result<usize> {
        // SAFETY: a context in setup; the new stream is owned by it.
        let s = unsafe { ffi::avformat_new_stream(self.ctx, ptr::null()) };
        if s.is_null() {
            return Err(encode_error(&self.dst, "adding a stream", ffi::AVERROR(ffi::ENOMEM)));
        }
        let params = params_of(codec)?;
        // SAFETY: `s` is the context's new stream with its own parameters, which receive a copy.
        let r = unsafe {
            let r = ffi::avcodec_parameters_copy((*s).codecpar, params.0.as_ptr());
            // The source container's tag need not be this one's: the muxer picks its own.
            (*(*s).codecpar).codec_tag = 0;
            (*s).time_base = ffi::AVRational { num: codec.time_base.0, den: codec.time_base.1 };
            if frame_rate.0 > 0 && frame_rate.1 > 0 {
                (*s).avg_frame_rate = ffi::AVRational { num: frame_rate.0, den: frame_rate.1 };
            }
            r
        };
        if r < 0 {
            return Err(encode_error(&self.dst, "copying the stream parameters", r));
        }
        self.streams.push(OutStream { kind, codec: codec.name.clone() });
        Ok(self.streams.len() - 1)
    }

    fn global_header(&self) -> bool {
        // SAFETY: the static output format.
        unsafe { (*self.oformat()).flags & ffi::AVFMT_GLOBALHEADER != 0 }
    }

    fn stream_item(&self, codec: *const ffi::AVCodec) -> String {
        format!("{} stream {} ({})", self.dst, self.streams.len(), codec_name(codec))
    }

    /// Adds an audio stream and returns its encoder.
    pub(crate) fn add_audio_stream(&mut self, config: &AudioEncodeConfig, choice: &EncoderChoice) -> Result<FfEncoder> {
        self.check_setup()?;
        let codec = find_encoder(self.oformat(), MediaType::Audio, choice.encoder.as_deref())?;
        let item = self.stream_item(codec);
        let enc = FfEncoder::audio(codec, config, &choice.options, self.global_header(), item, self.streams.len())?;
        self.new_stream(MediaType::Audio, &enc.codec, (0, 1))?;
        Ok(enc)
    }

    /// Adds a video stream and returns its encoder.
    pub(crate) fn add_video_stream(&mut self, config: &VideoEncodeConfig, choice: &EncoderChoice) -> Result<FfEncoder> {
        self.check_setup()?;
        let codec = find_encoder(self.oformat(), MediaType::Video, choice.encoder.as_deref())?;
        let item = self.stream_item(codec);
        let enc = FfEncoder::video(codec, config, &choice.options, self.global_header(), item, self.streams.len())?;
        let rate = enc.codec.frame_rate;
        self.new_stream(MediaType::Video, &enc.codec, rate)?;
        Ok(enc)
    }

    /// Adds a stream for packets of `codec`, copied as they are.
    pub(crate) fn add_remux_stream(&mut self, codec: &Codec) -> Result<usize> {
        self.check_setup()?;
        let kind = stream_kind(codec.kind);
        // SAFETY: the static output format.
        let none = unsafe {
            let o = self.oformat();
            if kind == MediaType::Audio { (*o).audio_codec } else { (*o).video_codec }
        } == ffi::AVCodecID::AV_CODEC_ID_NONE;
        if none {
            return Err(bad(format!("{}: the {} container holds no {}", self.dst, self.format_name(), kind.name())));
        }
        if codec.time_base.0 <= 0 || codec.time_base.1 <= 0 {
            return Err(bad(format!(
                "{}: the {} codec has no valid time base ({}/{})",
                self.dst, codec.name, codec.time_base.0, codec.time_base.1
            )));
        }
        self.new_stream(kind, codec, codec.frame_rate)
    }

    /// Opens the output and writes the header.
    pub(crate) fn open(&mut self, options: &[(String, String)]) -> Result<()> {
        self.check_setup().map_err(|_| bad(format!("{}: the muxer was already opened", self.dst)))?;
        if self.streams.is_empty() {
            return Err(bad(format!("{}: add a stream before open()", self.dst)));
        }
        let mut dict = Dict::new(options)?;
        let oformat = self.oformat();
        if self.format_name() == "image2" {
            // One image, not a numbered sequence.
            dict.set_default("update", "1")?;
        }
        // SAFETY: the static output format.
        let needs_file = unsafe { (*oformat).flags } & ffi::AVFMT_NOFILE == 0;
        if needs_file {
            // SAFETY: the context's URL (copied from `dst`); the I/O context is the format context's, closed
            // by `finish` or on drop's `finish`; the dictionary keeps the options the protocol did not take.
            let r = unsafe {
                ffi::avio_open2(&mut (*self.ctx).pb, (*self.ctx).url, ffi::AVIO_FLAG_WRITE, ptr::null(), &mut dict.0)
            };
            if r < 0 {
                let source = if (-4095..0).contains(&r) {
                    std::io::Error::from_raw_os_error(-r)
                } else {
                    std::io::Error::other(ff::Error::from(r).to_string())
                };
                return Err(Error::Encode {
                    item: self.dst.clone(),
                    what: "opening the output for writing".into(),
                    cause: Box::new(source),
                });
            }
        }
        // SAFETY: a context with its streams and (unless the format needs none) its open I/O.
        let r = unsafe { ffi::avformat_write_header(self.ctx, &mut dict.0) };
        if r < 0 {
            self.close_io();
            self.state = State::Closed;
            return Err(encode_error(&self.dst, &format!("writing the {} header", self.format_name()), r));
        }
        self.state = State::Open;
        let left = dict.keys();
        if !left.is_empty() {
            let _ = self.finish();
            return Err(bad(format!(
                "{}: neither the output nor the {} muxer takes the option {} (`ffmpeg -h muxer={}` lists them)",
                self.dst,
                self.format_name(),
                left.join(", "),
                self.format_name()
            )));
        }
        Ok(())
    }

    fn check_open(&self, what: &str) -> Result<()> {
        match self.state {
            State::Open => Ok(()),
            State::Setup => Err(bad(format!("{}: call open() before {what}", self.dst))),
            State::Closed => Err(bad(format!("{}: the muxer was closed", self.dst))),
        }
    }

    /// Writes `packets` to stream `index`.
    pub(crate) fn write(&mut self, index: usize, packets: &MediaPackets) -> Result<()> {
        self.check_open("write()")?;
        let n = self.streams.len();
        let Some(stream) = self.streams.get(index) else {
            return Err(bad(format!("{}: stream index {index} is out of range (the muxer has {n} streams)", self.dst)));
        };
        let kind = stream_kind(packets.codec.kind);
        if kind != stream.kind || packets.codec.name != stream.codec {
            return Err(bad(format!(
                "{}: stream {index} holds {} {}, these packets are {} {}",
                self.dst,
                stream.kind.name(),
                stream.codec,
                kind.name(),
                packets.codec.name
            )));
        }
        let src = ff::Rational::new(packets.codec.time_base.0, packets.codec.time_base.1);
        if src.numerator() <= 0 || src.denominator() <= 0 {
            return Err(bad(format!("{}: the packets have no valid time base", self.dst)));
        }
        // SAFETY: `index` is one of the context's streams (they are added with `self.streams`).
        let dst = unsafe { (**(*self.ctx).streams.add(index)).time_base };
        let dst = ff::Rational::new(dst.num, dst.den);
        for p in &packets.packets {
            let original = p.raw.downcast_ref::<ff::Packet>().ok_or_else(|| foreign(&packets.item))?;
            let mut pkt = ff::Packet::empty();
            // SAFETY: `pkt` is empty; it receives a new reference to the data of `original`.
            let r = unsafe { ffi::av_packet_ref(pkt.as_mut_ptr(), original.as_ptr()) };
            if r < 0 {
                return Err(encode_error(&self.dst, "referencing a packet", r));
            }
            pkt.rescale_ts(src, dst);
            pkt.set_stream(index);
            pkt.set_position(-1);
            // SAFETY: an open context; FFmpeg takes the packet's reference and leaves it blank.
            let r = unsafe { ffi::av_interleaved_write_frame(self.ctx, pkt.as_mut_ptr()) };
            if r < 0 {
                return Err(encode_error(&self.dst, &format!("writing a packet of stream {index}"), r));
            }
        }
        Ok(())
    }

    /// Writes what the interleaving queue holds.
    pub(crate) fn flush(&mut self) -> Result<()> {
        if self.state == State::Closed {
            return Ok(());
        }
        self.check_open("flush()")?;
        // SAFETY: an open context; a null packet flushes the interleaving queue.
        let r = unsafe { ffi::av_interleaved_write_frame(self.ctx, ptr::null_mut()) };
        if r < 0 {
            return Err(encode_error(&self.dst, "flushing the interleaved packets", r));
        }
        Ok(())
    }

    fn close_io(&mut self) {
        // SAFETY: the static output format; `pb` was opened by avio_open2 (or is null) and is closed once.
        unsafe {
            if (*self.oformat()).flags & ffi::AVFMT_NOFILE == 0 {
                ffi::avio_closep(&mut (*self.ctx).pb);
            }
        }
    }

    /// Writes the trailer and closes the output (the muxer is closed even when the trailer fails).
    fn finish(&mut self) -> Result<()> {
        self.state = State::Closed;
        // SAFETY: a context whose header was written.
        let r = unsafe { ffi::av_write_trailer(self.ctx) };
        self.close_io();
        if r < 0 {
            return Err(encode_error(&self.dst, &format!("writing the {} trailer", self.format_name()), r));
        }
        Ok(())
    }

    /// Writes the trailer and closes the output; a no-op when closed.
    pub(crate) fn close(&mut self) -> Result<()> {
        match self.state {
            State::Open => self.finish(),
            State::Setup => {
                self.state = State::Closed;
                Ok(())
            }
            State::Closed => Ok(()),
        }
    }
}
