//! `spdl_rs.io` video (feature `ffmpeg`): `load_video`, and `demux_video` + `decode_packets` for pipelines
//! that demux (I/O) and decode (CPU) in separate stages, with their native ops. Every function releases the
//! GIL for its whole duration.

use std::sync::Arc;

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use spdl_buffer::system_allocator;
use spdl_io::media::MediaPackets;
use spdl_io::video::{
    DecodeOptions, DemuxOptions, FramePixelFormat, FrameSampling, Frames, ScaleFilter,
    decode_packets as decode_packets_rs, demux_video as demux_video_rs,
};

use super::audio::window;
use super::media::{PyVideoPackets, limits_from};
use super::options::KeywordOptions;
use super::{buffer_result, io_err, media_src, src_from_value};
use crate::error::Error;
use crate::pipeline::{NativeOp, PyNativeOp};
use crate::value::Value;

pub(super) fn pixel_format(name: &str) -> PyResult<FramePixelFormat> {
    match name.to_ascii_lowercase().as_str() {
        "rgb24" | "rgb" => Ok(FramePixelFormat::Rgb24),
        "gray" | "gray8" | "grey" => Ok(FramePixelFormat::Gray8),
        other => Err(PyValueError::new_err(format!("pix_fmt must be \"rgb24\" or \"gray\", got {other:?}"))),
    }
}

pub(super) fn scale_filter(name: &str) -> PyResult<ScaleFilter> {
    match name.to_ascii_lowercase().as_str() {
        "nearest" | "point" => Ok(ScaleFilter::Nearest),
        "bilinear" => Ok(ScaleFilter::Bilinear),
        "bicubic" => Ok(ScaleFilter::Bicubic),
        "area" => Ok(ScaleFilter::Area),
        other => Err(PyValueError::new_err(format!(
            "filter must be \"nearest\", \"bilinear\", \"bicubic\" or \"area\", got {other:?}"
        ))),
    }
}

keyword_options! {
    /// The options of `demux_video` and its op: the window and the bounds.
    struct DemuxArgs {
        start: Option<f64> = None,
        duration: Option<f64> = None,
        limits: Option<Py<PyDict>> as "dict[str, int] | None" = None,
    }
}

impl DemuxArgs {
    /// The spdl-io options (validated).
    fn options(&self, py: Python<'_>) -> PyResult<DemuxOptions> {
        let window = window(self.start, self.duration);
        if let Some(w) = &window {
            w.validate().map_err(io_err)?;
        }
        Ok(DemuxOptions { window, limits: limits_from(self.limits.as_ref().map(|l| l.bind(py)))? })
    }
}

keyword_options! {
    /// The options of `decode_packets` and its op: frame sampling, output size and format.
    struct DecodeArgs {
        fps: Option<f64> = None,
        every_k: Option<usize> = None,
        num_frames: Option<usize> = None,
        width: Option<u32> = None,
        height: Option<u32> = None,
        pix_fmt: String = "rgb24".to_owned(),
        filter: String = "bicubic".to_owned(),
        threads: usize = 1,
    }
}

impl DecodeArgs {
    /// The spdl-io options (validated).
    fn options(&self) -> PyResult<DecodeOptions> {
        let sampling = match (self.fps, self.every_k, self.num_frames) {
            (None, None, None) => FrameSampling::All,
            (Some(f), None, None) => FrameSampling::Fps(f),
            (None, Some(k), None) => FrameSampling::Every(k),
            (None, None, Some(n)) => FrameSampling::Uniform(n),
            _ => return Err(PyValueError::new_err("give at most one of fps, every_k and num_frames")),
        };
        let size = match (self.width, self.height) {
            (None, None) => None,
            (Some(w), Some(h)) => Some((w, h)),
            _ => return Err(PyValueError::new_err("give both width and height (or neither, for the coded size)")),
        };
        let opts = DecodeOptions {
            sampling,
            size,
            pixel_format: pixel_format(&self.pix_fmt)?,
            filter: scale_filter(&self.filter)?,
            threads: self.threads,
        };
        opts.validate().map_err(io_err)?;
        Ok(opts)
    }
}

keyword_options! {
    /// The options of `load_video` and its op: `demux_video`'s and `decode_packets`'.
    struct VideoArgs [demux: DemuxArgs, decode: DecodeArgs] {}
}

impl VideoArgs {
    /// The spdl-io options of a call of `func` with keyword `options`.
    fn from_call(
        py: Python<'_>,
        func: &str,
        options: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<(DemuxOptions, DecodeOptions)> {
        let args = Self::from_kwargs(func, options)?;
        Ok((args.demux.options(py)?, args.decode.options()?))
    }
}

/// The frames as a :py:class:`spdl_rs.Buffer`, with `(buffer, info)` when asked.
fn frames_result(py: Python<'_>, frames: Frames, return_info: bool) -> PyResult<Py<PyAny>> {
    let info = if return_info {
        let d = PyDict::new(py);
        d.set_item("pts", &frames.pts_s)?;
        d.set_item("frame_rate", frames.frame_rate)?;
        d.set_item("codec", &frames.codec)?;
        d.set_item("item", &frames.item)?;
        Some(d)
    } else {
        None
    };
    buffer_result(py, frames.buffer, info)
}

/// Demuxes and decodes a video (a path or encoded bytes) into a ``uint8`` :py:class:`spdl_rs.Buffer`
/// ``[N, H, W, C]`` (GIL released), without a copy. FFmpeg seeks to the keyframe before ``start``; frames that are not
/// selected are decoded but never converted.
///
/// Args:
///     src: A path (``str`` or ``os.PathLike``) or encoded bytes.
///     start: Window start in seconds (presentation time).
///     duration: Window length in seconds (``None``: to the end).
///     fps: Output frame rate: at each tick the frame on screen then (frames repeat above the source rate).
///     every_k: Every k-th frame of the window.
///     num_frames: Exactly this many frames, spread uniformly over the window (repeats if it has fewer).
///         At most one of ``fps``, ``every_k``, ``num_frames``; none: every frame.
///     width, height: Output size (both or neither; neither keeps the coded size).
///     pix_fmt: ``"rgb24"`` (``C = 3``) or ``"gray"`` (``C = 1``).
///     filter: Scaling filter: ``"bicubic"``, ``"bilinear"``, ``"nearest"`` or ``"area"``.
///     threads: Decoder threads (``0``: FFmpeg picks one per core).
///     limits: Overrides of the bounds (``max_packets``, ``max_packet_bytes``, ``max_frames``, ``max_pixels``,
///         ``max_output_bytes``, ``max_bad_packets``).
///     name: The name of ``src`` in error messages when it is bytes.
///     return_info: Also return a dict: ``pts`` (seconds, per frame), ``frame_rate``, ``codec``, ``item``.
///
/// Raises:
///     OSError: The file cannot be read.
///     ValueError: Invalid options.
///     RuntimeError: The input is corrupt, has no video stream or is over a limit; the message names it.
pub(crate) fn load_video(
    py: Python<'_>,
    src: &Bound<'_, PyAny>,
    name: Option<&str>,
    return_info: bool,
    options: Option<&Bound<'_, PyDict>>,
) -> PyResult<Py<PyAny>> {
    let (demux, decode) = VideoArgs::from_call(py, "load_video", options)?;
    let src = media_src(src, name)?;
    let frames = py
        .detach(|| {
            let packets = demux_video_rs(src.media(), &demux)?;
            decode_packets_rs(packets, &decode, &system_allocator())
        })
        .map_err(io_err)?;
    frames_result(py, frames, return_info)
}

/// spdl_rs's form of `spdl_rs.io.demux_video` ([`super::media_api::demux_video`]): the packets of the best
/// video stream that the `start`/`duration` window of `options` needs (from the keyframe before `start`), GIL
/// released.
pub(crate) fn demux_packets(
    py: Python<'_>,
    src: &Bound<'_, PyAny>,
    name: Option<&str>,
    options: Option<&Bound<'_, PyDict>>,
) -> PyResult<PyVideoPackets> {
    let demux = DemuxArgs::from_kwargs("demux_video", options)?.options(py)?;
    let src = media_src(src, name)?;
    let packets = crate::lifecycle::detach(py, || demux_video_rs(src.media(), &demux)).map_err(io_err)?;
    Ok(PyVideoPackets::from_packets(MediaPackets::from_video_packets(packets)))
}

/// The frame sampler's form of `spdl_rs.io.decode_packets` ([`super::media_decode::decode_packets`]): video
/// `packets` (consumed) into a `uint8` buffer `[N, H, W, C]`, GIL released.
pub(crate) fn sample_packets(
    py: Python<'_>,
    packets: &PyVideoPackets,
    return_info: bool,
    options: Option<&Bound<'_, PyDict>>,
) -> PyResult<Py<PyAny>> {
    let decode = DecodeArgs::from_kwargs("decode_packets", options)?.options()?;
    let packets = packets.state.take()?.into_video_packets();
    let frames =
        crate::lifecycle::detach(py, || decode_packets_rs(packets, &decode, &system_allocator())).map_err(io_err)?;
    frames_result(py, frames, return_info)
}

const VIDEO_INPUT: &str = "a path (str) or encoded bytes";
const PACKETS_INPUT: &str = "spdl_rs.io.Packets (from demux_video)";

/// `load_video` as an op: demux and decode each item.
#[derive(Debug)]
struct LoadVideoOp {
    demux: DemuxOptions,
    decode: DecodeOptions,
}

impl NativeOp for LoadVideoOp {
    fn name(&self) -> &str {
        "load_video"
    }
    fn expects(&self) -> &'static str {
        VIDEO_INPUT
    }
    fn call(&self, stage: &str, input: Value) -> Result<Vec<Value>, Error> {
        let src = src_from_value(input, stage, self.name(), VIDEO_INPUT, 0)?;
        let frames = demux_video_rs(src.media(), &self.demux)
            .and_then(|p| decode_packets_rs(p, &self.decode, &system_allocator()))
            .map_err(|e| Error::native(stage, self.name(), src.name(), e))?;
        Ok(vec![Value::Buffer(Arc::new(frames.buffer))])
    }
}

/// `demux_video` as an op: each item becomes a `Packets` Python object (the GIL is taken once per item, to
/// make it; the demuxing runs without it).
#[derive(Debug)]
struct DemuxVideoOp {
    demux: DemuxOptions,
}

impl NativeOp for DemuxVideoOp {
    fn name(&self) -> &str {
        "demux_video"
    }
    fn expects(&self) -> &'static str {
        VIDEO_INPUT
    }
    fn call(&self, stage: &str, input: Value) -> Result<Vec<Value>, Error> {
        let src = src_from_value(input, stage, self.name(), VIDEO_INPUT, 0)?;
        let packets =
            demux_video_rs(src.media(), &self.demux).map_err(|e| Error::native(stage, self.name(), src.name(), e))?;
        let obj = crate::pipeline::tstate::attach(|py| {
            Py::new(py, PyVideoPackets::from_packets(MediaPackets::from_video_packets(packets)))
        })
        .map_err(|e| Error::native(stage, self.name(), src.name(), PyTypeError::new_err(e.to_string())))?;
        Ok(vec![Value::Py(obj.into_any())])
    }
}

/// `decode_packets` as an op: each item is a `Packets` object.
#[derive(Debug)]
struct DecodePacketsOp {
    decode: DecodeOptions,
}

impl NativeOp for DecodePacketsOp {
    fn name(&self) -> &str {
        "decode_packets"
    }
    fn expects(&self) -> &'static str {
        PACKETS_INPUT
    }
    fn call(&self, stage: &str, input: Value) -> Result<Vec<Value>, Error> {
        let wrong = |item: String| Error::wrong_input(stage, self.name(), item, PACKETS_INPUT);
        let Value::Py(obj) = input else { return Err(wrong(input.describe())) };
        // The GIL is held only to take the packets out of their Python object.
        let packets = crate::pipeline::tstate::attach(|py| match obj.bind(py).cast::<PyVideoPackets>() {
            Ok(p) => p
                .get()
                .state
                .take()
                .map(MediaPackets::into_video_packets)
                .map_err(|e| wrong(format!("spent packets ({e})"))),
            Err(_) => Err(wrong("a Python object".to_owned())),
        })?;
        let item = packets.item().to_owned();
        let frames = decode_packets_rs(packets, &self.decode, &system_allocator())
            .map_err(|e| Error::native(stage, self.name(), item, e))?;
        Ok(vec![Value::Buffer(Arc::new(frames.buffer))])
    }
}

/// Native op: demuxes and decodes each item (a path or encoded bytes) into a ``[N, H, W, C]`` ``uint8``
/// buffer, without the GIL. Arguments as :py:func:`spdl_rs.io.load_video`.
#[pyfunction]
#[pyo3(signature = (**options: "Unpack[VideoArgs]"))]
pub(crate) fn load_video_op(py: Python<'_>, options: Option<&Bound<'_, PyDict>>) -> PyResult<PyNativeOp> {
    let (demux, decode) = VideoArgs::from_call(py, "load_video_op", options)?;
    Ok(PyNativeOp { op: Arc::new(LoadVideoOp { demux, decode }) })
}

/// Native op: demuxes each item (a path or encoded bytes) into a :py:class:`Packets` object. Arguments as
/// :py:func:`spdl_rs.io.demux_video`.
#[pyfunction]
#[pyo3(signature = (**options: "Unpack[DemuxArgs]"))]
pub(crate) fn demux_video_op(py: Python<'_>, options: Option<&Bound<'_, PyDict>>) -> PyResult<PyNativeOp> {
    let demux = DemuxArgs::from_kwargs("demux_video_op", options)?.options(py)?;
    Ok(PyNativeOp { op: Arc::new(DemuxVideoOp { demux }) })
}

/// Native op: decodes each item (a :py:class:`Packets`) into a ``[N, H, W, C]`` ``uint8`` buffer, without the
/// GIL. Arguments as :py:func:`spdl_rs.io.decode_packets`.
#[pyfunction]
#[pyo3(signature = (**options: "Unpack[DecodeArgs]"))]
pub(crate) fn decode_packets_op(options: Option<&Bound<'_, PyDict>>) -> PyResult<PyNativeOp> {
    let decode = DecodeArgs::from_kwargs("decode_packets_op", options)?.options()?;
    Ok(PyNativeOp { op: Arc::new(DecodePacketsOp { decode }) })
}
