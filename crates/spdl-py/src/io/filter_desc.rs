//! SPDL's FFmpeg filter-graph descriptions (`spdl_rs.io.get_audio_filter_desc`, `get_video_filter_desc`,
//! `get_filter_desc`, `get_abuffer_desc`, `get_buffer_desc`): strings for ``FilterGraph``, for SPDL's
//! ``filter_desc=`` keyword and for the ``ffmpeg -af``/``-vf`` options. The same arguments give the same strings
//! as SPDL 0.8.0: each value is written as Python's ``str()`` writes it (SPDL formats them with f-strings), and
//! an ``or`` default applies where the value is false in Python's sense.
//!
//! Pure string building: available in every build; only [`get_filter_desc`] needs the packet types (feature
//! `ffmpeg`).

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;

/// ``str(value)``.
fn show(value: &Bound<'_, PyAny>) -> PyResult<String> {
    Ok(value.str()?.to_string())
}

/// ``str(value or default)``.
fn show_or(value: Option<&Bound<'_, PyAny>>, default: &str) -> PyResult<String> {
    match value {
        Some(v) if v.is_truthy()? => show(v),
        _ => Ok(default.to_owned()),
    }
}

/// The two items of ``a, b = value`` (any iterable of two).
fn pair<'py>(value: &Bound<'py, PyAny>) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyAny>)> {
    let items = value.try_iter()?.collect::<PyResult<Vec<_>>>()?;
    match <[Bound<'py, PyAny>; 2]>::try_from(items) {
        Ok([a, b]) => Ok((a, b)),
        Err(items) => Err(PyValueError::new_err(format!("expected 2 values to unpack, got {}", items.len()))),
    }
}

/// ``name=start=..:end=..`` of a window, an infinite bound left out; `None` when both are.
fn trim(name: &str, timestamp: &Bound<'_, PyAny>) -> PyResult<Option<String>> {
    let (start, end) = pair(timestamp)?;
    let mut bounds = Vec::with_capacity(2);
    if !start.extract::<f64>()?.is_infinite() {
        bounds.push(format!("start={}", show(&start)?));
    }
    if !end.extract::<f64>()?.is_infinite() {
        bounds.push(format!("end={}", show(&end)?));
    }
    Ok((!bounds.is_empty()).then(|| format!("{name}={}", bounds.join(":"))))
}

fn joined(parts: Vec<String>) -> Option<String> {
    (!parts.is_empty()).then(|| parts.join(","))
}

/// An FFmpeg audio filter chain that converts decoded audio, or ``None`` when nothing is to be done.
///
/// The filters, in order: ``aformat=channel_layouts=<n>c`` (``num_channels``), ``aresample=<rate>``
/// (``sample_rate``), ``atrim=start=..:end=..`` (``timestamp``; an infinite bound is left out),
/// ``apad,atrim=end_sample=<n>`` (``num_frames``: pad with silence or cut), the caller's ``filter_desc``, and
/// ``aformat=sample_fmts=<fmt>`` (``sample_fmt``).
///
/// Args:
///     sample_rate: Resample to this rate.
///     num_channels: Mix to this many channels.
///     sample_fmt: The output sample format (``"u8"``, ``"s16"``, ``"s32"``, ``"flt"``, ``"s64"``, ``"dbl"``,
///         or planar with a ``"p"`` suffix); default ``"fltp"`` (planar ``float32``); ``None`` keeps the source's.
///     timestamp: ``(start, end)`` in seconds to trim to.
///     num_frames: Exactly this many samples out.
///     filter_desc: A custom filter chain, inserted before the sample format conversion.
///
/// Example:
///     >>> get_audio_filter_desc(sample_rate=16000, num_channels=1)
///     'aformat=channel_layouts=1c,aresample=16000,aformat=sample_fmts=fltp'
#[pyfunction]
#[pyo3(signature = (
    *, sample_rate=None, num_channels=None, sample_fmt=Some("fltp".to_owned()), timestamp=None, num_frames=None,
    filter_desc=None
))]
#[pyo3(text_signature = "(*, sample_rate=None, num_channels=None, sample_fmt='fltp', timestamp=None, \
    num_frames=None, filter_desc=None)")]
pub(crate) fn get_audio_filter_desc(
    sample_rate: Option<&Bound<'_, PyAny>>,
    num_channels: Option<&Bound<'_, PyAny>>,
    sample_fmt: Option<String>,
    timestamp: Option<&Bound<'_, PyAny>>,
    num_frames: Option<&Bound<'_, PyAny>>,
    filter_desc: Option<String>,
) -> PyResult<Option<String>> {
    let mut parts = Vec::new();
    if let Some(n) = num_channels {
        parts.push(format!("aformat=channel_layouts={}c", show(n)?));
    }
    if let Some(rate) = sample_rate {
        parts.push(format!("aresample={}", show(rate)?));
    }
    if let Some(t) = timestamp.map(|t| trim("atrim", t)).transpose()?.flatten() {
        parts.push(t);
    }
    if let Some(n) = num_frames {
        parts.push("apad".to_owned());
        parts.push(format!("atrim=end_sample={}", show(n)?));
    }
    parts.extend(filter_desc);
    if let Some(fmt) = sample_fmt {
        parts.push(format!("aformat=sample_fmts={fmt}"));
    }
    Ok(joined(parts))
}

/// An FFmpeg video/image filter chain, or ``None`` when nothing is to be done.
///
/// The filters, in order: ``fps=<num>/<den>`` (``frame_rate``), ``trim=start=..:end=..`` (``timestamp``),
/// ``scale`` (with ``pad`` or ``crop`` per ``scale_mode``), a center ``crop`` (``crop_width``/``crop_height``),
/// ``tpad`` + ``trim=end_frame=<n>`` (``num_frames``), the caller's ``filter_desc``, and
/// ``format=pix_fmts=<fmt>`` (``pix_fmt``).
///
/// Args:
///     frame_rate: ``(numerator, denominator)`` of the output frame rate.
///     timestamp: ``(start, end)`` in seconds to trim to (an infinite bound is left out).
///     scale_width, scale_height: Output size; ``0`` or ``None`` keeps that side, ``-n`` keeps the aspect ratio
///         with a multiple of ``n``.
///     scale_algo: The scaler (``"bicubic"``, ``"bilinear"``, ``"neighbor"``, ... see FFmpeg's scaler flags).
///     scale_mode: ``"pad"`` (fit inside, pad with ``pad_mode``'s color, default black), ``"crop"`` (cover,
///         crop the excess) or ``None`` (stretch).
///     crop_width, crop_height: Crop at the center after scaling.
///     pix_fmt: Output pixel format (default ``"rgb24"``; ``None`` keeps the source's).
///     num_frames: Exactly this many frames out: cut, or pad by repeating the last frame (or with
///         ``pad_mode``'s color). Needs FFmpeg's ``tpad`` filter (FFmpeg 4.2 or later).
///     pad_mode: The color of padding (frames with ``num_frames``, borders with ``scale_mode="pad"``).
///     filter_desc: A custom filter chain, inserted before the pixel format conversion.
///
/// Raises:
///     ValueError: ``scale_mode`` is not ``"pad"``, ``"crop"`` or ``None``.
///
/// Example:
///     >>> get_video_filter_desc(scale_width=64, scale_height=48, scale_mode=None)
///     'scale=w=64:h=48:flags=bicubic,format=pix_fmts=rgb24'
#[pyfunction]
#[pyo3(signature = (
    *, frame_rate=None, timestamp=None, scale_width=None, scale_height=None, scale_algo="bicubic".to_owned(),
    scale_mode=Some("pad".to_owned()), crop_width=None, crop_height=None, pix_fmt=Some("rgb24".to_owned()),
    num_frames=None, pad_mode=None, filter_desc=None
))]
#[pyo3(text_signature = "(*, frame_rate=None, timestamp=None, scale_width=None, scale_height=None, \
    scale_algo='bicubic', scale_mode='pad', crop_width=None, crop_height=None, pix_fmt='rgb24', num_frames=None, \
    pad_mode=None, filter_desc=None)")]
#[allow(clippy::too_many_arguments)]
pub(crate) fn get_video_filter_desc(
    frame_rate: Option<&Bound<'_, PyAny>>,
    timestamp: Option<&Bound<'_, PyAny>>,
    scale_width: Option<&Bound<'_, PyAny>>,
    scale_height: Option<&Bound<'_, PyAny>>,
    scale_algo: String,
    scale_mode: Option<String>,
    crop_width: Option<&Bound<'_, PyAny>>,
    crop_height: Option<&Bound<'_, PyAny>>,
    pix_fmt: Option<String>,
    num_frames: Option<&Bound<'_, PyAny>>,
    pad_mode: Option<&Bound<'_, PyAny>>,
    filter_desc: Option<String>,
) -> PyResult<Option<String>> {
    let mut parts = Vec::new();
    if let Some(rate) = frame_rate {
        parts.push(format!("fps={}/{}", show(&rate.get_item(0)?)?, show(&rate.get_item(1)?)?));
    }
    if let Some(t) = timestamp.map(|t| trim("trim", t)).transpose()?.flatten() {
        parts.push(t);
    }
    if scale_width.is_some() || scale_height.is_some() {
        let (w, h) = (show_or(scale_width, "0")?, show_or(scale_height, "0")?);
        let scale = format!("scale=w={w}:h={h}:flags={scale_algo}");
        match scale_mode.as_deref() {
            None => parts.push(scale),
            Some("pad") => {
                parts.push(format!("{scale}:force_original_aspect_ratio=decrease"));
                parts.push(format!("pad=w={w}:h={h}:x=-1:y=-1:color={}", show_or(pad_mode, "black")?));
            }
            Some("crop") => {
                parts.push(format!("{scale}:force_original_aspect_ratio=increase"));
                parts.push(format!("crop=w={w}:h={h}"));
            }
            Some(other) => {
                return Err(PyValueError::new_err(format!(
                    "Unexpected `scale_mode` value ({other}). Expected values are \"pad\", \"crop\", or None."
                )));
            }
        }
    }
    if crop_width.is_some() || crop_height.is_some() {
        parts.push(format!("crop=w={}:h={}", show_or(crop_width, "0")?, show_or(crop_height, "0")?));
    }
    if let Some(n) = num_frames {
        parts.push(match pad_mode {
            None => "tpad=stop=-1:stop_mode=clone".to_owned(),
            Some(color) => format!("tpad=stop=-1:stop_mode=add:color={}", show(color)?),
        });
        parts.push(format!("trim=end_frame={}", show(n)?));
    }
    parts.extend(filter_desc);
    if let Some(fmt) = pix_fmt {
        parts.push(format!("format=pix_fmts={fmt}"));
    }
    Ok(joined(parts))
}

/// ``"audio"``, ``"video"`` or ``"image"`` for spdl_rs's packet types, `None` for anything else.
#[cfg(feature = "ffmpeg")]
fn packet_kind(packets: &Bound<'_, PyAny>) -> PyResult<Option<&'static str>> {
    use super::media::{PyAudioPackets, PyImagePackets, PyVideoPackets};
    Ok(if packets.is_instance_of::<PyAudioPackets>() {
        Some("audio")
    } else if packets.is_instance_of::<PyVideoPackets>() {
        Some("video")
    } else if packets.is_instance_of::<PyImagePackets>() {
        Some("image")
    } else {
        None
    })
}

/// A build without FFmpeg has no packet types: what needs them raises the `ImportError` of the demuxing objects.
#[cfg(not(feature = "ffmpeg"))]
fn packet_kind(_packets: &Bound<'_, PyAny>) -> PyResult<Option<&'static str>> {
    Err(pyo3::exceptions::PyImportError::new_err(
        "spdl_rs was built without the `ffmpeg` feature: the demuxing and decoding objects need FFmpeg",
    ))
}

/// The filter chain for decoding ``packets``: :py:func:`get_audio_filter_desc` with the packets'
/// ``timestamp`` for audio packets (trimmed by ``atrim``), :py:func:`get_video_filter_desc` without a timestamp
/// for video and image packets (their window is applied while decoding).
///
/// Args:
///     packets: ``AudioPackets``, ``VideoPackets``/``Packets`` or ``ImagePackets``.
///     filter_args: Passed to the audio or video function.
///
/// Raises:
///     TypeError: ``packets`` is not a packets object.
#[pyfunction]
#[pyo3(signature = (packets, **filter_args))]
pub(crate) fn get_filter_desc(
    packets: &Bound<'_, PyAny>,
    filter_args: Option<&Bound<'_, PyDict>>,
) -> PyResult<Option<String>> {
    let py = packets.py();
    let (function, timestamp) = match packet_kind(packets)? {
        Some("audio") => (wrap_pyfunction!(get_audio_filter_desc, py)?, packets.getattr_opt("timestamp")?),
        Some(_) => (wrap_pyfunction!(get_video_filter_desc, py)?, None),
        None => return Err(PyTypeError::new_err(format!("Unexpected type: {}", packets.get_type().repr()?))),
    };
    let kwargs = PyDict::new(py);
    kwargs.set_item("timestamp", timestamp)?;
    if let Some(args) = filter_args {
        for (key, value) in args {
            if key.extract::<&str>()? == "timestamp" {
                return Err(PyTypeError::new_err(format!(
                    "{}() got multiple values for keyword argument 'timestamp'",
                    function.getattr("__name__")?
                )));
            }
            kwargs.set_item(key, value)?;
        }
    }
    function.call((), Some(&kwargs))?.extract()
}

/// The ``abuffer`` source filter that feeds frames of an audio ``codec`` into a filter graph:
/// ``abuffer[@label]=time_base=N/D:sample_rate=R:sample_fmt=F:channel_layout=L``.
///
/// Args:
///     codec: An audio codec description: ``time_base`` (``(num, den)``), ``sample_rate``, ``sample_fmt`` and
///         ``channel_layout`` are read from it.
///     label: Names the node ``abuffer@<label>`` (to refer to it in a graph with several inputs).
///     sample_fmt: Overrides the codec's sample format.
///
/// Example:
///     >>> from types import SimpleNamespace as C
///     >>> get_abuffer_desc(C(time_base=(1, 16000), sample_rate=16000, sample_fmt="s16", channel_layout="mono"))
///     'abuffer=time_base=1/16000:sample_rate=16000:sample_fmt=s16:channel_layout=mono'
#[pyfunction]
#[pyo3(signature = (codec, *, label=None, sample_fmt=None))]
pub(crate) fn get_abuffer_desc(
    codec: &Bound<'_, PyAny>,
    label: Option<&Bound<'_, PyAny>>,
    sample_fmt: Option<&Bound<'_, PyAny>>,
) -> PyResult<String> {
    let name = label.map_or_else(|| Ok("abuffer".to_owned()), |l| Ok::<_, PyErr>(format!("abuffer@{}", show(l)?)))?;
    let (num, den) = pair(&codec.getattr("time_base")?)?;
    let fmt = match sample_fmt {
        Some(f) if f.is_truthy()? => show(f)?,
        _ => show(&codec.getattr("sample_fmt")?)?,
    };
    Ok(format!(
        "{name}=time_base={}/{}:sample_rate={}:sample_fmt={fmt}:channel_layout={}",
        show(&num)?,
        show(&den)?,
        show(&codec.getattr("sample_rate")?)?,
        show(&codec.getattr("channel_layout")?)?
    ))
}

/// The ``buffer`` source filter that feeds frames of a video or image ``codec`` into a filter graph:
/// ``buffer[@label]=video_size=WxH:pix_fmt=F:time_base=N/D:pixel_aspect=N/D``.
///
/// Args:
///     codec: A video/image codec description: ``width``, ``height``, ``pix_fmt``, ``time_base`` and
///         ``sample_aspect_ratio`` (both ``(num, den)``) are read from it.
///     label: Names the node ``buffer@<label>``.
///     pix_fmt: Overrides the codec's pixel format.
///
/// Example:
///     >>> from types import SimpleNamespace as C
///     >>> get_buffer_desc(C(width=64, height=48, pix_fmt="yuv420p", time_base=(1, 25), sample_aspect_ratio=(1, 1)))
///     'buffer=video_size=64x48:pix_fmt=yuv420p:time_base=1/25:pixel_aspect=1/1'
#[pyfunction]
#[pyo3(signature = (codec, label=None, pix_fmt=None))]
pub(crate) fn get_buffer_desc(
    codec: &Bound<'_, PyAny>,
    label: Option<&Bound<'_, PyAny>>,
    pix_fmt: Option<&Bound<'_, PyAny>>,
) -> PyResult<String> {
    let name = label.map_or_else(|| Ok("buffer".to_owned()), |l| Ok::<_, PyErr>(format!("buffer@{}", show(l)?)))?;
    let (tb_num, tb_den) = pair(&codec.getattr("time_base")?)?;
    let (sar_num, sar_den) = pair(&codec.getattr("sample_aspect_ratio")?)?;
    let fmt = match pix_fmt {
        Some(f) if f.is_truthy()? => show(f)?,
        _ => show(&codec.getattr("pix_fmt")?)?,
    };
    Ok(format!(
        "{name}=video_size={}x{}:pix_fmt={fmt}:time_base={}/{}:pixel_aspect={}/{}",
        show(&codec.getattr("width")?)?,
        show(&codec.getattr("height")?)?,
        show(&tb_num)?,
        show(&tb_den)?,
        show(&sar_num)?,
        show(&sar_den)?
    ))
}
