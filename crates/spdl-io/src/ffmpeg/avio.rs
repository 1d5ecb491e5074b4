//! Opening inputs with FFmpeg: files and in-memory bytes both go through a custom AVIO read/seek context
//! (`StreamIo`), so bytes fetched from S3 decode without a temp file, and a path is never interpreted as
//! an FFmpeg protocol URL (`concat:`, `http:`, ...).

use std::io::Cursor;
use std::sync::Once;

use ff::format::context::{Input, StreamIo};
use ffmpeg_next as ff;

use crate::input::MediaInput;
use crate::{Error, Result};

/// Initialises FFmpeg once and quiets its log: errors reach callers as typed [`Error`]s, and a loader that
/// meets millions of files should not print for each damaged one. Set `SPDL_FFMPEG_LOG` to `error`,
/// `warning`, `info` or `debug` to see FFmpeg's own messages.
pub(crate) fn init() {
    static INIT: Once = Once::new();
    INIT.call_once(|| {
        // Initialisation only registers devices in FFmpeg 5; it cannot fail there.
        let _ = ff::init();
        let level = match std::env::var("SPDL_FFMPEG_LOG").as_deref() {
            Ok("quiet") => ff::log::Level::Quiet,
            Ok("error") => ff::log::Level::Error,
            Ok("warning") => ff::log::Level::Warning,
            Ok("info") => ff::log::Level::Info,
            Ok("debug") => ff::log::Level::Debug,
            _ => ff::log::Level::Fatal,
        };
        ff::log::set_level(level);
    });
}

/// `(library, version)` of the FFmpeg libraries this process runs, and FFmpeg's own version (`"ffmpeg"`).
pub(crate) fn versions() -> Vec<(String, String)> {
    fn v(n: std::ffi::c_uint) -> String {
        format!("{}.{}.{}", n >> 16, (n >> 8) & 0xff, n & 0xff)
    }
    use ff::ffi;
    // SAFETY: the version queries take no arguments and return a number; av_version_info returns a
    // static C string (or null).
    unsafe {
        let info = ffi::av_version_info();
        let ffmpeg =
            if info.is_null() { String::new() } else { std::ffi::CStr::from_ptr(info).to_string_lossy().into_owned() };
        vec![
            ("ffmpeg".into(), ffmpeg),
            ("libavutil".into(), v(ffi::avutil_version())),
            ("libavcodec".into(), v(ffi::avcodec_version())),
            ("libavformat".into(), v(ffi::avformat_version())),
            ("libavfilter".into(), v(ffi::avfilter_version())),
            ("libswscale".into(), v(ffi::swscale_version())),
            ("libswresample".into(), v(ffi::swresample_version())),
        ]
    }
}

/// The names of libavfilter's filters, sorted.
pub(crate) fn filters() -> Vec<String> {
    init();
    let mut names = Vec::new();
    let mut opaque: *mut std::ffi::c_void = std::ptr::null_mut();
    loop {
        // SAFETY: `av_filter_iterate` walks FFmpeg's static filter table with `opaque` as its cursor (null to
        // start) and returns a pointer to a static `AVFilter`, or null at the end; its `name` is a static C
        // string.
        let f = unsafe { ff::ffi::av_filter_iterate(&mut opaque) };
        if f.is_null() {
            break;
        }
        // SAFETY: as above.
        let name = unsafe { (*f).name };
        if !name.is_null() {
            // SAFETY: a static NUL-terminated string.
            names.push(unsafe { std::ffi::CStr::from_ptr(name) }.to_string_lossy().into_owned());
        }
    }
    names.sort();
    names
}

/// An FFmpeg error as a decode error of `item`.
pub(crate) fn ff_error(item: &str, what: &str, e: ff::Error) -> Error {
    Error::Decode { item: item.to_owned(), format: what.to_owned(), cause: Box::new(e) }
}

/// Opens `input` for demuxing (headers and stream info read).
pub(crate) fn open_input(input: &MediaInput<'_>, item: &str) -> Result<Input> {
    open_input_with(input, item, &[], None)
}

/// Opens `input` for demuxing with demuxer `options` (FFmpeg's format-context options), as the container
/// `format` (an FFmpeg demuxer name, e.g. `"s16le"` for raw samples) or, without one, as the content says.
pub(crate) fn open_input_with(
    input: &MediaInput<'_>,
    item: &str,
    options: &[(String, String)],
    format: Option<&str>,
) -> Result<Input> {
    init();
    input.check_not_empty()?;
    let (io, hint) = match *input {
        MediaInput::Path(p) => {
            let file = MediaInput::open_file(p)?;
            (StreamIo::from_read_seek(file), p.to_str())
        }
        // FFmpeg's custom I/O needs an owned, 'static stream: one copy of the encoded bytes (cheap next to
        // decoding them), no temp file.
        MediaInput::Bytes { data, name } => (StreamIo::from_read_seek(Cursor::new(data.to_vec())), Some(name)),
    };
    let io = io.map_err(|e| ff_error(item, "avio", e))?;
    // The name is only a format hint (by extension); an interior NUL would be rejected.
    let hint = hint.filter(|h| !h.contains('\0'));
    let options = (!options.is_empty()).then(|| {
        let mut d = ff::Dictionary::new();
        for (k, v) in options {
            d.set(k, v);
        }
        d
    });
    if let Some(format) = format {
        return open_as(io, hint, options, format, item);
    }
    ff::format::input_from_stream(io, hint, options).map_err(|e| match e {
        ff::Error::InvalidData | ff::Error::DemuxerNotFound => {
            // Tell "not a format FFmpeg knows" from "a known format whose header or index is damaged"
            // (e.g. an MP4 cut before its moov atom) by probing the first bytes' content alone.
            let head = input.read_at(None, 0, 4096).unwrap_or_default();
            match recognised_format(&head) {
                Some(format) => Error::Decode {
                    item: item.to_owned(),
                    format,
                    cause: format!("{e}: the header or index is missing or damaged (a cut or corrupt file)").into(),
                },
                None => Error::UnknownFormat {
                    item: item.to_owned(),
                    detail: format!("no FFmpeg demuxer recognises the content ({e})"),
                },
            }
        }
        other => ff_error(item, "container", other),
    })
}

/// Opens `io` with the named demuxer (ffmpeg-next's `input_from_stream` has no format argument: the same
/// steps, with `av_find_input_format`'s demuxer given to `avformat_open_input`).
fn open_as(
    mut io: StreamIo,
    hint: Option<&str>,
    options: Option<ff::Dictionary<'_>>,
    format: &str,
    item: &str,
) -> Result<Input> {
    use ff::ffi;
    let bad = |m: String| Error::InvalidOptions(format!("{item}: demux format {format:?}: {m}"));
    let name = std::ffi::CString::new(format).map_err(|_| bad("contains a NUL byte".into()))?;
    let hint = hint.and_then(|h| std::ffi::CString::new(h).ok());
    // SAFETY: `name` is a NUL-terminated string that outlives the call; the result is a static FFmpeg table
    // entry or null.
    let iformat = unsafe { ffi::av_find_input_format(name.as_ptr()) };
    if iformat.is_null() {
        return Err(bad("FFmpeg has no demuxer of that name (`ffmpeg -demuxers` lists them)".into()));
    }
    // SAFETY: the context is allocated here and either handed to `Input` (which frees it and owns `io`) or
    // freed by `avformat_open_input` on failure (FFmpeg frees a user-supplied context when opening fails) or
    // by `avformat_close_input`. `io`'s AVIO context is set as the context's `pb` with the custom-I/O flag, so
    // FFmpeg does not close it; `io` outlives the context because `Input` keeps it. The options dictionary is
    // disowned for the call and owned again after it (FFmpeg replaces it with the unused entries).
    unsafe {
        let mut ps = ffi::avformat_alloc_context();
        if ps.is_null() {
            return Err(bad("cannot allocate a format context".into()));
        }
        (*ps).pb = io.as_mut_ptr();
        (*ps).flags |= ffi::AVFMT_FLAG_CUSTOM_IO;
        let url = hint.as_ref().map_or(std::ptr::null(), |h| h.as_ptr());
        let r = match options {
            Some(opts) => {
                let mut raw = opts.disown();
                let r = ffi::avformat_open_input(&mut ps, url, iformat, &mut raw);
                drop(ff::Dictionary::own(raw));
                r
            }
            None => ffi::avformat_open_input(&mut ps, url, iformat, std::ptr::null_mut()),
        };
        if r < 0 {
            return Err(ff_error(item, format, ff::Error::from(r)));
        }
        let r = ffi::avformat_find_stream_info(ps, std::ptr::null_mut());
        if r < 0 {
            ffi::avformat_close_input(&mut ps);
            return Err(ff_error(item, format, ff::Error::from(r)));
        }
        Ok(Input::wrap_with_custom_io(ps, io))
    }
}

/// The name of the demuxer whose content probe (not the file name) recognises `head`, if any.
fn recognised_format(head: &[u8]) -> Option<String> {
    if head.is_empty() {
        return None;
    }
    let mut buf = Vec::with_capacity(head.len() + ff::ffi::AVPROBE_PADDING_SIZE as usize);
    buf.extend_from_slice(head);
    buf.resize(head.len() + ff::ffi::AVPROBE_PADDING_SIZE as usize, 0);
    let probe = ff::ffi::AVProbeData {
        filename: c"".as_ptr(),
        buf: buf.as_mut_ptr(),
        buf_size: head.len() as std::ffi::c_int,
        mime_type: std::ptr::null(),
    };
    // Only detections at least as confident as FFmpeg's own retry threshold count.
    let mut score: std::ffi::c_int = ff::ffi::AVPROBE_SCORE_MAX / 4;
    // SAFETY: `probe` points at `buf`, which holds `buf_size` bytes plus the zeroed padding FFmpeg reads
    // past the end, and an empty NUL-terminated file name; both outlive the call. The returned format is
    // a static FFmpeg table entry (or null), whose `name` is a static C string.
    unsafe {
        let format = ff::ffi::av_probe_input_format2(&probe, 1, &mut score);
        if format.is_null() || (*format).name.is_null() {
            return None;
        }
        Some(std::ffi::CStr::from_ptr((*format).name).to_string_lossy().into_owned())
    }
}

/// Seconds of `ts` in time base `tb`.
pub(crate) fn ts_seconds(ts: i64, tb: ff::Rational) -> f64 {
    crate::types::media::ts_seconds(ts, (tb.numerator(), tb.denominator()))
}

/// The first timestamp in time base `tb` at or after `seconds` (float noise of a millionth of a tick is
/// ignored, so `1.0` s in 1/12800 is 12800, not 12801).
pub(crate) fn seconds_ts(seconds: f64, tb: ff::Rational) -> i64 {
    crate::types::media::seconds_ts(seconds, (tb.numerator(), tb.denominator()))
}

/// A rational as `f64`, `None` when it is 0/x or x/0.
pub(crate) fn rational(r: ff::Rational) -> Option<f64> {
    (r.numerator() > 0 && r.denominator() > 0).then(|| f64::from(r.numerator()) / f64::from(r.denominator()))
}

/// Seeks `ictx` to the keyframe at or before `start_s` (all streams). `false` if the container cannot.
pub(crate) fn seek_before(ictx: &mut Input, start_s: f64) -> bool {
    let ts = (start_s * f64::from(ff::ffi::AV_TIME_BASE)) as i64;
    ictx.seek(ts, ..ts).is_ok()
}
