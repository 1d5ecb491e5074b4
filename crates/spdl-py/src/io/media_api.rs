//! SPDL's demuxing and decoding API (feature `ffmpeg`) with SPDL's names, signatures, defaults and errors:
//! `DemuxConfig`/`DecodeConfig`, `Demuxer`, `demux_audio`/`demux_video`/`demux_image`, `BSF`/`apply_bsf`,
//! `Decoder` (an `AudioDecoder` or `VideoDecoder`), `decode_packets`, `convert_frames`,
//! `sample_decode_video` and frames made from arrays. The objects they take and return (codecs, packets,
//! frames) live in [`super::media`]; `spdl_rs.io` re-exports these items as they are, so no Python layer
//! sits between a caller and the GIL-free work.
//!
//! `demux_video` and `decode_packets` also take spdl_rs's own keywords (a `start`/`duration` window; the
//! frame sampler's `fps`, `width`, ... straight into one buffer): one function per name, whichever form a
//! call takes.

use std::collections::BTreeMap;
use std::sync::Mutex;

use pyo3::exceptions::{PyIndexError, PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyFloat, PyInt, PyList, PyString, PyTuple, PyType};
use spdl_buffer::system_allocator;
use spdl_io::media::{
    Bsf, Codec, DecodeConfig, Decoder as MediaDecoder, DemuxConfig, Demuxer, MediaFrames, MediaPackets, MediaType,
    convert_frames as convert_frames_rs, decode_all, reference_audio_frame as reference_audio_frame_rs,
    reference_video_frames,
};

use super::media::{
    PyAudioCodec, PyAudioFrames, PyAudioPackets, PyImageCodec, PyImagePackets, PyVideoCodec, PyVideoFrames,
    PyVideoPackets, codec_from, frames_cell, frames_object, limits_from, lock, packets_object, packets_state,
};
use super::{io_err, media_src};
use crate::args;
use crate::buffer::PyBuffer;

/// SPDL's default ``filter_desc``: ``rgb24`` pixels for video and images, ``fltp`` samples for audio
/// (trimmed to the packets' window).
const FILTER_DESC_DEFAULT: &str = "__PLACEHOLDER__";

fn default_filter() -> Option<String> {
    Some(FILTER_DESC_DEFAULT.to_owned())
}

/// ``{str(k): str(v)}`` of a mapping (``None``: empty), as SPDL's configs keep their options.
fn str_map(options: Option<&Bound<'_, PyAny>>) -> PyResult<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    let Some(options) = options.filter(|o| !o.is_none()) else { return Ok(out) };
    for pair in options.call_method0("items")?.try_iter()? {
        let (k, v): (Bound<'_, PyAny>, Bound<'_, PyAny>) = pair?.extract()?;
        out.insert(k.str()?.to_string(), v.str()?.to_string());
    }
    Ok(out)
}

/// Python's ``repr`` of `obj`, for messages that quote an argument as SPDL's do.
fn py_repr(obj: &Bound<'_, PyAny>) -> String {
    obj.repr().map(|r| r.to_string()).unwrap_or_else(|_| "<?>".to_owned())
}

/// Python's ``repr`` of a config's name and options (``'h264'`` or ``None``, and a ``dict``).
fn config_repr(py: Python<'_>, name: Option<&str>, options: &BTreeMap<String, String>) -> PyResult<(String, String)> {
    let name = match name {
        Some(n) => py_repr(PyString::new(py, n).as_any()),
        None => "None".to_owned(),
    };
    Ok((name, py_repr(options.clone().into_pyobject(py)?.as_any())))
}

fn kind_name(kind: MediaType) -> &'static str {
    match kind {
        MediaType::Audio => "audio",
        MediaType::Video => "video",
        MediaType::Image => "image",
    }
}

// --------------------------------------------------------------------------------------------- configs

/// How to open a source (SPDL's ``DemuxConfig``; see :py:func:`demux_config`).
///
/// ``format``: the container format, an FFmpeg demuxer name (``ffmpeg -demuxers``; e.g. ``"s16le"`` for raw
/// samples, with ``format_options={"sample_rate": ..., "ch_layout": ...}``); ``None``: detected from the
/// content. ``format_options``: options of the container's demuxer. ``buffer_size``: accepted for SPDL
/// compatibility; the read buffer size is spdl-io's.
#[pyclass(name = "DemuxConfig", module = "spdl_rs._native.io", frozen)]
#[derive(Debug)]
pub struct PyDemuxConfig {
    format: Option<String>,
    format_options: BTreeMap<String, String>,
    buffer_size: i64,
}

#[pymethods]
impl PyDemuxConfig {
    #[new]
    #[pyo3(signature = (format=None, format_options=None, buffer_size=8096))]
    fn new(format: Option<String>, format_options: Option<&Bound<'_, PyAny>>, buffer_size: i64) -> PyResult<Self> {
        if buffer_size <= 0 {
            return Err(PyValueError::new_err(format!("DemuxConfig: buffer_size must be positive, got {buffer_size}")));
        }
        Ok(Self { format, format_options: str_map(format_options)?, buffer_size })
    }
    /// The container format, or ``None`` (detected).
    #[getter]
    fn format(&self) -> Option<&str> {
        self.format.as_deref()
    }
    /// Options of the container's demuxer.
    #[getter]
    fn format_options(&self) -> BTreeMap<String, String> {
        self.format_options.clone()
    }
    /// SPDL's read buffer size (not used: spdl-io's is).
    #[getter]
    fn buffer_size(&self) -> i64 {
        self.buffer_size
    }
    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let (format, options) = config_repr(py, self.format.as_deref(), &self.format_options)?;
        Ok(format!("DemuxConfig(format={format}, format_options={options})"))
    }
}

/// Which decoder to use and its options (SPDL's ``DecodeConfig``; see :py:func:`decode_config`).
///
/// ``decoder``: a decoder by name (``ffmpeg -decoders``); default: the codec's. ``decoder_options``: e.g.
/// ``{"threads": "4"}`` (decoding is single-threaded without it).
#[pyclass(name = "DecodeConfig", module = "spdl_rs._native.io", frozen)]
#[derive(Debug)]
pub struct PyDecodeConfig {
    decoder: Option<String>,
    decoder_options: BTreeMap<String, String>,
}

impl PyDecodeConfig {
    fn config(config: Option<&Self>) -> DecodeConfig {
        match config {
            None => DecodeConfig { decoder: None, options: Default::default() },
            Some(c) => {
                DecodeConfig { decoder: c.decoder.clone(), options: c.decoder_options.clone().into_iter().collect() }
            }
        }
    }
}

#[pymethods]
impl PyDecodeConfig {
    #[new]
    #[pyo3(signature = (decoder=None, decoder_options=None))]
    fn new(decoder: Option<String>, decoder_options: Option<&Bound<'_, PyAny>>) -> PyResult<Self> {
        Ok(Self { decoder, decoder_options: str_map(decoder_options)? })
    }
    /// The decoder's name, or ``None`` (the codec's).
    #[getter]
    fn decoder(&self) -> Option<&str> {
        self.decoder.as_deref()
    }
    /// The decoder's options.
    #[getter]
    fn decoder_options(&self) -> BTreeMap<String, String> {
        self.decoder_options.clone()
    }
    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let (decoder, options) = config_repr(py, self.decoder.as_deref(), &self.decoder_options)?;
        Ok(format!("DecodeConfig(decoder={decoder}, decoder_options={options})"))
    }
}

/// A :py:class:`DemuxConfig` (SPDL's factory).
#[pyfunction]
#[pyo3(signature = (format=None, format_options=None, buffer_size=8096))]
pub(crate) fn demux_config(
    format: Option<String>,
    format_options: Option<&Bound<'_, PyAny>>,
    buffer_size: i64,
) -> PyResult<PyDemuxConfig> {
    PyDemuxConfig::new(format, format_options, buffer_size)
}

/// A :py:class:`DecodeConfig` (SPDL's factory).
#[pyfunction]
#[pyo3(signature = (decoder=None, decoder_options=None))]
pub(crate) fn decode_config(
    decoder: Option<String>,
    decoder_options: Option<&Bound<'_, PyAny>>,
) -> PyResult<PyDecodeConfig> {
    PyDecodeConfig::new(decoder, decoder_options)
}

// -------------------------------------------------------------------------------------------- demuxing

/// A path or encoded bytes, as SPDL takes them (a CPU tensor is read through ``.numpy()``).
fn resolve_src<'py>(src: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    let py = src.py();
    let builtins = py.import("builtins")?;
    let (bytes, bytearray, memoryview) =
        (builtins.getattr("bytes")?, builtins.getattr("bytearray")?, builtins.getattr("memoryview")?);
    let is_text_or_bytes =
        |o: &Bound<'py, PyAny>| -> PyResult<bool> { Ok(o.is_instance_of::<PyString>() || o.is_instance(&bytes)?) };
    let mut src = src.clone();
    if src.hasattr("numpy")? && !is_text_or_bytes(&src)? {
        src = src.call_method0("numpy")?;
    }
    if is_text_or_bytes(&src)?
        || src.is_instance(&bytearray)?
        || src.is_instance(&memoryview)?
        || src.hasattr("__fspath__")?
    {
        return Ok(src);
    }
    memoryview.call1((&src,)).map_err(|_| {
        let name = src.get_type().name().map(|n| n.to_string()).unwrap_or_default();
        PyTypeError::new_err(format!("the source must be a path or a buffer of encoded bytes, got {name}"))
    })
}

/// Seconds of one of SPDL's time values (``float``, ``int``, ``Decimal``, ``Fraction``, ``str``).
fn seconds(value: &Bound<'_, PyAny>) -> PyResult<f64> {
    if let Ok(f) = value.cast::<PyFloat>() {
        return Ok(f.value());
    }
    value.py().import("fractions")?.getattr("Fraction")?.call1((value,))?.extract()
}

/// A ``(start, end)`` window in seconds. As in SPDL, an empty one (``(t, t)``, or end before start) is
/// allowed: it holds no packet.
fn window(window: Option<&Bound<'_, PyAny>>) -> PyResult<Option<(f64, f64)>> {
    let Some(w) = window.filter(|w| !w.is_none()) else { return Ok(None) };
    let invalid = || PyValueError::new_err(format!("the window must be (start, end) in seconds, got {}", py_repr(w)));
    let items: Vec<Bound<'_, PyAny>> = w.try_iter()?.collect::<PyResult<_>>()?;
    let [start, end] = items.as_slice() else { return Err(invalid()) };
    let (s, e) = (seconds(start)?, seconds(end)?);
    if s.is_nan() || e.is_nan() {
        return Err(invalid());
    }
    Ok(Some((s, e)))
}

/// `packets` through the bitstream filter chain `bsf` in one call.
fn filter_all(py: Python<'_>, packets: &MediaPackets, bsf: &str) -> PyResult<MediaPackets> {
    let out = crate::lifecycle::detach(py, || Bsf::new(&packets.codec, bsf)?.filter(packets, true)).map_err(io_err)?;
    out.ok_or_else(|| {
        PyRuntimeError::new_err(format!("{}: the bitstream filter '{bsf}' produced no packets", packets.item))
    })
}

/// Demuxes the audio, video or an image of one source, or streams its packets in bounded chunks (SPDL's
/// ``Demuxer``). The source stays open until :py:meth:`close` (or the end of a ``with`` block).
///
/// ``src``: a path (``str`` or ``os.PathLike``) or encoded bytes (``bytes``, a buffer, a 1-D ``uint8`` array
/// or CPU tensor). ``demux_config``: see :py:func:`demux_config`. ``name``: the name of ``src`` in error
/// messages when it is bytes. ``limits``: spdl_rs's bounds (``max_packets``, ``max_packet_bytes``,
/// ``max_frames``, ``max_pixels``, ``max_output_bytes``, ``max_bad_packets``).
///
/// Thread-safe: calls on one demuxer run one at a time, GIL released.
#[pyclass(name = "Demuxer", module = "spdl_rs._native.io", frozen)]
#[derive(Debug)]
pub struct PyDemuxer {
    inner: Mutex<Option<Demuxer>>,
    item: String,
}

impl PyDemuxer {
    fn open(
        py: Python<'_>,
        src: &Bound<'_, PyAny>,
        demux_config: Option<&PyDemuxConfig>,
        name: Option<&str>,
        limits: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Self> {
        let config = DemuxConfig {
            format: demux_config.and_then(|c| c.format.clone()),
            format_options: demux_config.map(|c| c.format_options.clone()).unwrap_or_default().into_iter().collect(),
            limits: limits_from(limits)?,
        };
        let src = media_src(&resolve_src(src)?, name)?;
        let item = src.name();
        let d = crate::lifecycle::detach(py, || Demuxer::open(src.media(), &config)).map_err(io_err)?;
        Ok(Self { inner: Mutex::new(Some(d)), item })
    }

    fn with<T: Send>(&self, py: Python<'_>, f: impl FnOnce(&mut Demuxer) -> spdl_io::Result<T> + Send) -> PyResult<T> {
        crate::lifecycle::detach(py, || {
            let mut g = lock(&self.inner);
            let d = g
                .as_mut()
                .ok_or_else(|| spdl_io::Error::InvalidOptions(format!("{}: the demuxer was closed", self.item)))?;
            f(d)
        })
        .map_err(io_err)
    }

    /// The packets of `kind` in `window`, through `bsf` when given.
    fn demux(
        &self,
        py: Python<'_>,
        kind: MediaType,
        window: Option<(f64, f64)>,
        bsf: Option<&str>,
    ) -> PyResult<Py<PyAny>> {
        let p = self.with(py, |d| match kind {
            MediaType::Audio => d.demux_audio(window),
            MediaType::Video => d.demux_video(window),
            MediaType::Image => d.demux_image(),
        })?;
        let p = match bsf {
            Some(bsf) => filter_all(py, &p, bsf)?,
            None => p,
        };
        packets_object(py, p)
    }

    fn index(&self, py: Python<'_>, kind: MediaType) -> PyResult<usize> {
        self.with(py, |d| Ok(d.stream_index(kind)))?
            .ok_or_else(|| PyRuntimeError::new_err(format!("{}: no {} stream", self.item, kind_name(kind))))
    }

    fn close_now(&self, py: Python<'_>) {
        let d = lock(&self.inner).take();
        crate::lifecycle::detach(py, || drop(d));
    }
}

#[pymethods]
impl PyDemuxer {
    #[new]
    #[pyo3(signature = (src, *, demux_config=None, name=None, limits=None))]
    fn new(
        py: Python<'_>,
        src: &Bound<'_, PyAny>,
        demux_config: Option<PyRef<'_, PyDemuxConfig>>,
        name: Option<&str>,
        limits: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Self> {
        Self::open(py, src, demux_config.as_deref(), name, limits)
    }

    /// The path or name of the source.
    #[getter]
    fn item(&self) -> &str {
        &self.item
    }

    /// The packets of the audio stream in ``window`` (``(start, end)`` seconds; ``None``: all), through the
    /// bitstream filter chain ``bsf`` when given.
    #[pyo3(signature = (window=None, *, bsf=None) -> "AudioPackets")]
    fn demux_audio(&self, py: Python<'_>, window: Option<&Bound<'_, PyAny>>, bsf: Option<&str>) -> PyResult<Py<PyAny>> {
        self.demux(py, MediaType::Audio, self::window(window)?, bsf)
    }

    /// The packets of the video stream that ``window`` needs (from the keyframe before its start).
    #[pyo3(signature = (window=None, *, bsf=None) -> "VideoPackets")]
    fn demux_video(&self, py: Python<'_>, window: Option<&Bound<'_, PyAny>>, bsf: Option<&str>) -> PyResult<Py<PyAny>> {
        self.demux(py, MediaType::Video, self::window(window)?, bsf)
    }

    /// The packet of the image (the first frame of the video stream).
    #[pyo3(signature = (*, bsf=None) -> "ImagePackets")]
    fn demux_image(&self, py: Python<'_>, bsf: Option<&str>) -> PyResult<Py<PyAny>> {
        self.demux(py, MediaType::Image, None, bsf)
    }

    /// Streams the packets of the streams ``indices`` from the start in chunks of ``num_packets`` packets or
    /// ``duration`` seconds (exactly one of them): one packets object per chunk for ``None`` (stream 0) or an
    /// ``int``, a ``{index: packets}`` dict for a set or sequence. Only one chunk is held at a time.
    #[pyo3(signature = (indices=None, *, duration=-1.0, num_packets=-1))]
    fn streaming_demux(
        slf: &Bound<'_, Self>,
        indices: Option<&Bound<'_, PyAny>>,
        duration: f64,
        num_packets: i64,
    ) -> PyResult<PyStreamingDemux> {
        if duration <= 0.0 && num_packets <= 0 {
            return Err(PyValueError::new_err("Either `duration` or `num_packets` must be specified."));
        }
        if duration > 0.0 && num_packets > 0 {
            return Err(PyValueError::new_err(format!(
                "Only one of `duration` or `num_packets` can be specified. Found: duration={duration:?}, \
                 num_packets={num_packets}."
            )));
        }
        let indices = indices.filter(|i| !i.is_none());
        let unwrap = indices.is_none_or(|i| i.is_instance_of::<PyInt>());
        let mut idxs: Vec<usize> = match indices {
            None => vec![0],
            Some(i) if i.is_instance_of::<PyInt>() => vec![i.extract()?],
            Some(i) => i.try_iter()?.map(|x| x?.extract()).collect::<PyResult<_>>()?,
        };
        idxs.sort_unstable();
        idxs.dedup();
        let num_packets = if num_packets > 0 {
            Some(args::count("num_packets", &args::Int::from(i128::from(num_packets)), 1, args::MAX_FRAMES)?)
        } else {
            None
        };
        let duration = if duration > 0.0 {
            args::duration_secs("duration", duration, f64::MIN_POSITIVE, args::MAX_SECONDS)?;
            Some(duration)
        } else {
            None
        };
        slf.get().with(slf.py(), |d| d.start_streaming(&idxs, num_packets, duration))?;
        Ok(PyStreamingDemux { demuxer: slf.clone().unbind(), unwrap })
    }

    /// Whether the source has an audio stream.
    fn has_audio(&self, py: Python<'_>) -> PyResult<bool> {
        Ok(self.with(py, |d| Ok(d.stream_index(MediaType::Audio)))?.is_some())
    }

    /// The index of the default video stream.
    #[getter]
    fn video_stream_index(&self, py: Python<'_>) -> PyResult<usize> {
        self.index(py, MediaType::Video)
    }

    /// The index of the default audio stream.
    #[getter]
    fn audio_stream_index(&self, py: Python<'_>) -> PyResult<usize> {
        self.index(py, MediaType::Audio)
    }

    /// The codec of the default audio stream (an ``AudioCodec``).
    #[getter]
    fn audio_codec(&self, py: Python<'_>) -> PyResult<PyAudioCodec> {
        Ok(PyAudioCodec { codec: self.with(py, |d| d.codec(MediaType::Audio))? })
    }

    /// The codec of the default video stream (a ``VideoCodec``).
    #[getter]
    fn video_codec(&self, py: Python<'_>) -> PyResult<PyVideoCodec> {
        Ok(PyVideoCodec { codec: self.with(py, |d| d.codec(MediaType::Video))? })
    }

    /// The codec of the image (the default video stream; an ``ImageCodec``).
    #[getter]
    fn image_codec(&self, py: Python<'_>) -> PyResult<PyImageCodec> {
        Ok(PyImageCodec { codec: self.with(py, |d| d.codec(MediaType::Image))? })
    }

    /// Closes the source; later calls raise.
    fn close(&self, py: Python<'_>) {
        self.close_now(py);
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, PyTuple>) {
        self.close_now(py);
    }
}

/// The chunks of :py:meth:`Demuxer.streaming_demux`, demuxed as they are asked for.
#[pyclass(name = "StreamingDemux", module = "spdl_rs._native.io", frozen)]
#[derive(Debug)]
pub struct PyStreamingDemux {
    demuxer: Py<PyDemuxer>,
    unwrap: bool,
}

#[pymethods]
impl PyStreamingDemux {
    fn __iter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __next__(&self, py: Python<'_>) -> PyResult<Option<Py<PyAny>>> {
        let Some(chunk) = self.demuxer.get().with(py, |d| d.next_chunk())? else { return Ok(None) };
        if self.unwrap {
            return chunk.into_values().next().map(|p| packets_object(py, p)).transpose();
        }
        let out = PyDict::new(py);
        for (i, p) in chunk {
            out.set_item(i, packets_object(py, p)?)?;
        }
        Ok(Some(out.into_any().unbind()))
    }
}

/// Opens `src` once and demuxes `kind` from it (the module-level ``demux_*`` functions).
#[allow(clippy::too_many_arguments, reason = "SPDL's keywords, passed through")]
fn demux_once(
    py: Python<'_>,
    src: &Bound<'_, PyAny>,
    kind: MediaType,
    timestamp: Option<&Bound<'_, PyAny>>,
    demux_config: Option<&PyDemuxConfig>,
    bsf: Option<&str>,
    name: Option<&str>,
    limits: Option<&Bound<'_, PyDict>>,
) -> PyResult<Py<PyAny>> {
    let w = window(timestamp)?;
    let d = PyDemuxer::open(py, src, demux_config, name, limits)?;
    let out = d.demux(py, kind, w, bsf);
    d.close_now(py);
    out
}

/// The packets of the audio stream of ``src`` in ``timestamp`` (``(start, end)`` seconds), through the
/// bitstream filter chain ``bsf`` when given. Arguments as :py:class:`Demuxer`.
#[pyfunction]
#[pyo3(signature = (src, *, timestamp=None, demux_config=None, bsf=None, name=None, limits=None) -> "AudioPackets")]
pub(crate) fn demux_audio(
    py: Python<'_>,
    src: &Bound<'_, PyAny>,
    timestamp: Option<&Bound<'_, PyAny>>,
    demux_config: Option<PyRef<'_, PyDemuxConfig>>,
    bsf: Option<&str>,
    name: Option<&str>,
    limits: Option<&Bound<'_, PyDict>>,
) -> PyResult<Py<PyAny>> {
    demux_once(py, src, MediaType::Audio, timestamp, demux_config.as_deref(), bsf, name, limits)
}

/// The packet of the image ``src``. Arguments as :py:class:`Demuxer`.
#[pyfunction]
#[pyo3(signature = (src, *, demux_config=None, bsf=None, name=None, limits=None) -> "ImagePackets")]
pub(crate) fn demux_image(
    py: Python<'_>,
    src: &Bound<'_, PyAny>,
    demux_config: Option<PyRef<'_, PyDemuxConfig>>,
    bsf: Option<&str>,
    name: Option<&str>,
    limits: Option<&Bound<'_, PyDict>>,
) -> PyResult<Py<PyAny>> {
    demux_once(py, src, MediaType::Image, None, demux_config.as_deref(), bsf, name, limits)
}

/// What spdl_rs says instead of SPDL's keywords that ``demux_video`` takes only as ``None``.
const NOT_FOR_DEMUX: [(&str, &str); 4] = [
    ("decode_config", "decoding runs with its own threads, see the function's keywords"),
    ("device_config", "move the result with torch.from_dlpack(...).cuda(non_blocking=True) or spdl-cuda"),
    ("storage", "the result owns its memory (numpy/DLPack views keep it alive)"),
    ("filter_desc", ""),
];

/// Reads the packets of the best video stream that the window needs (from the keyframe before its start),
/// GIL released, into a :py:class:`VideoPackets` object, to decode with :py:func:`decode_packets`, possibly
/// in another thread or pipeline stage.
///
/// The window is SPDL's ``timestamp=(start, end)`` or spdl_rs's ``start``/``duration`` (seconds; not both).
/// ``bsf``: a bitstream filter chain (see :py:func:`apply_bsf`). ``demux_config``: see
/// :py:func:`demux_config`. ``limits``, ``name``: as :py:class:`Demuxer`. SPDL's ``filter_desc``,
/// ``decode_config``, ``device_config`` and ``storage`` are accepted as ``None`` only.
#[pyfunction]
#[pyo3(signature = (src, *, timestamp=None, demux_config=None, bsf=None, name=None, start=None, duration=None, limits=None, **spdl) -> "VideoPackets")]
#[allow(clippy::too_many_arguments, reason = "SPDL's keywords and spdl_rs's window, one function")]
pub(crate) fn demux_video(
    py: Python<'_>,
    src: &Bound<'_, PyAny>,
    timestamp: Option<&Bound<'_, PyAny>>,
    demux_config: Option<PyRef<'_, PyDemuxConfig>>,
    bsf: Option<&str>,
    name: Option<&str>,
    start: Option<f64>,
    duration: Option<f64>,
    limits: Option<&Bound<'_, PyDict>>,
    spdl: Option<&Bound<'_, PyDict>>,
) -> PyResult<Py<PyAny>> {
    for (key, value) in spdl.into_iter().flat_map(|d| d.iter()) {
        let key: String = key.extract()?;
        let Some((_, instead)) = NOT_FOR_DEMUX.iter().find(|(k, _)| *k == key) else {
            return Err(PyTypeError::new_err(format!("demux_video() got an unexpected keyword argument '{key}'")));
        };
        if value.is_none() {
            continue;
        }
        return Err(PyValueError::new_err(if key == "filter_desc" {
            "demux_video: filter_desc (an FFmpeg filter graph) is not taken here; use start=/duration= instead, or \
             spdl_rs.io.load_image/load_audio/load_video, which take it"
                .to_owned()
        } else {
            format!("demux_video: SPDL's {key} is not supported by spdl_rs ({instead})")
        }));
    }
    let timestamp = timestamp.filter(|t| !t.is_none());
    if timestamp.is_some() && (start.is_some() || duration.is_some()) {
        return Err(PyValueError::new_err("give either timestamp=(start, end) or start/duration, not both"));
    }
    if demux_config.is_some() || timestamp.is_some() {
        // SPDL's form: any window, an empty one ((t, t)) included, which holds no packet.
        let w = match (timestamp, start, duration) {
            (Some(t), _, _) => window(Some(t))?,
            (None, None, None) => None,
            (None, s, d) => {
                let s = s.unwrap_or(0.0);
                Some((s, d.map_or(f64::INFINITY, |d| s + d)))
            }
        };
        let d = PyDemuxer::open(py, src, demux_config.as_deref(), name, limits)?;
        let out = d.demux(py, MediaType::Video, w, bsf);
        d.close_now(py);
        return out;
    }
    let options = PyDict::new(py);
    options.set_item("start", start)?;
    options.set_item("duration", duration)?;
    options.set_item("limits", limits)?;
    let packets = super::video::demux_packets(py, &resolve_src(src)?, name, Some(&options))?;
    match bsf {
        Some(bsf) => {
            let p = filter_all(py, &packets.state.cloned()?, bsf)?;
            packets_object(py, p)
        }
        None => Ok(Py::new(py, packets)?.into_any()),
    }
}

// ----------------------------------------------------------------------------------- bitstream filters

/// A bitstream filter chain for the packets of one stream (SPDL's ``BSF``), e.g. ``"h264_mp4toannexb"``
/// (see ``ffmpeg -bsfs``). Filtered packets carry the filter's output codec.
///
/// ``codec``: the codec of the incoming packets (``Demuxer.video_codec``, ``packets.codec``, ...).
/// ``bsf``: the filter chain (``"name"`` or ``"name1=opt=value,name2"``). Thread-safe: calls run one at a
/// time.
#[pyclass(name = "BSF", module = "spdl_rs._native.io", frozen)]
#[derive(Debug)]
pub struct PyBsf {
    inner: Mutex<Bsf>,
    item: String,
}

#[pymethods]
impl PyBsf {
    #[new]
    fn new(py: Python<'_>, codec: &Bound<'_, PyAny>, bsf: String) -> PyResult<Self> {
        let codec = codec_from(codec)?;
        let item = format!("<{} packets>", codec.name);
        let b = crate::lifecycle::detach(py, || Bsf::new(&codec, &bsf)).map_err(io_err)?;
        Ok(Self { inner: Mutex::new(b), item })
    }

    /// ``BSF[Codec, Packets]``: SPDL's class is generic; the parameters are for type checkers only.
    #[classmethod]
    fn __class_getitem__<'py>(cls: &Bound<'py, PyType>, _params: &Bound<'py, PyAny>) -> Bound<'py, PyType> {
        cls.clone()
    }

    /// Filters ``packets`` (not consumed); ``flush`` ends the stream. The packets ready, or ``None``.
    #[pyo3(signature = (packets, flush=false))]
    fn filter(&self, py: Python<'_>, packets: &Bound<'_, PyAny>, flush: bool) -> PyResult<Option<Py<PyAny>>> {
        let p = packets_state(packets)?.cloned()?;
        let out = crate::lifecycle::detach(py, || lock(&self.inner).filter(&p, flush)).map_err(io_err)?;
        out.map(|p| packets_object(py, p)).transpose()
    }

    /// Ends the stream: the packets the filter still held, or ``None``.
    fn flush(&self, py: Python<'_>) -> PyResult<Option<Py<PyAny>>> {
        let out = crate::lifecycle::detach(py, || lock(&self.inner).flush(&self.item)).map_err(io_err)?;
        out.map(|p| packets_object(py, p)).transpose()
    }
}

/// ``packets`` (not consumed) through the bitstream filter chain ``bsf`` in one call (SPDL's
/// ``apply_bsf``): packets of the same class.
#[pyfunction]
pub(crate) fn apply_bsf(py: Python<'_>, packets: &Bound<'_, PyAny>, bsf: &str) -> PyResult<Py<PyAny>> {
    let p = packets_state(packets)?.cloned()?;
    packets_object(py, filter_all(py, &p, bsf)?)
}

// -------------------------------------------------------------------------------- filter descriptions

fn abuffer_desc(c: &Codec) -> String {
    let layout = if c.channel_layout.is_empty() || c.channel_layout.contains(' ') {
        format!("{}c", c.num_channels)
    } else {
        c.channel_layout.clone()
    };
    let (n, d) = c.time_base;
    format!(
        "abuffer=time_base={n}/{d}:sample_rate={}:sample_fmt={}:channel_layout={layout}",
        c.sample_rate, c.sample_fmt
    )
}

fn buffer_desc(c: &Codec) -> String {
    let (n, d) = c.time_base;
    let (sn, sd) =
        if c.sample_aspect_ratio.0 <= 0 || c.sample_aspect_ratio.1 <= 0 { (1, 1) } else { c.sample_aspect_ratio };
    format!("buffer=video_size={}x{}:pix_fmt={}:time_base={n}/{d}:pixel_aspect={sn}/{sd}", c.width, c.height, c.pix_fmt)
}

/// The complete graph of ``filter_desc`` (SPDL's default when it is the placeholder) for frames of `codec`:
/// the input described from the codec, the filters, the sink. Audio's default trims to `window`.
fn filter_graph(filter_desc: &str, codec: &Codec, window: Option<(f64, f64)>) -> String {
    match codec.kind {
        MediaType::Audio => {
            let desc = if filter_desc == FILTER_DESC_DEFAULT {
                let mut parts = Vec::with_capacity(2);
                if let Some((start, end)) = window {
                    let mut trim = Vec::with_capacity(2);
                    if start != f64::NEG_INFINITY {
                        trim.push(format!("start={start:?}"));
                    }
                    if end != f64::INFINITY {
                        trim.push(format!("end={end:?}"));
                    }
                    if !trim.is_empty() {
                        parts.push(format!("atrim={}", trim.join(":")));
                    }
                }
                parts.push("aformat=sample_fmts=fltp".to_owned());
                parts.join(",")
            } else {
                filter_desc.to_owned()
            };
            format!("{},{desc},abuffersink", abuffer_desc(codec))
        }
        MediaType::Video | MediaType::Image => {
            let desc = if filter_desc == FILTER_DESC_DEFAULT { "format=pix_fmts=rgb24" } else { filter_desc };
            format!("{},{desc},buffersink", buffer_desc(codec))
        }
    }
}

// -------------------------------------------------------------------------------------------- decoding

/// Decodes a stream of audio packets chunk by chunk (made by :py:func:`Decoder`). Thread-safe: calls run
/// one at a time.
#[pyclass(name = "AudioDecoder", module = "spdl_rs._native.io", frozen)]
#[derive(Debug)]
pub struct PyAudioDecoder {
    inner: Mutex<MediaDecoder>,
}

/// Frames as a one-item iterator, or an empty one.
fn frames_iter(py: Python<'_>, frames: Vec<MediaFrames>) -> PyResult<Py<PyAny>> {
    let list = PyList::empty(py);
    for f in frames {
        list.append(frames_object(py, f)?)?;
    }
    Ok(list.try_iter()?.into_any().unbind())
}

/// `frames`, or nothing when they hold no frame.
fn some_frames(frames: MediaFrames) -> Vec<MediaFrames> {
    if frames.num_frame_objects() == 0 { Vec::new() } else { vec![frames] }
}

#[pymethods]
impl PyAudioDecoder {
    /// Decodes ``packets`` (consumed): the frames ready now, or ``None``.
    fn decode(&self, py: Python<'_>, packets: &Bound<'_, PyAny>) -> PyResult<Option<Py<PyAny>>> {
        let p = packets_state(packets)?.take()?;
        let frames = crate::lifecycle::detach(py, || lock(&self.inner).decode(&p)).map_err(io_err)?;
        some_frames(frames).pop().map(|f| frames_object(py, f)).transpose()
    }

    /// Decodes ``packets`` (consumed) and yields the frames ready.
    fn streaming_decode_packets(&self, py: Python<'_>, packets: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        let p = packets_state(packets)?.take()?;
        let frames = crate::lifecycle::detach(py, || lock(&self.inner).decode(&p)).map_err(io_err)?;
        frames_iter(py, some_frames(frames))
    }

    /// Ends the stream and yields the frames the decoder still held.
    fn flush(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let frames = crate::lifecycle::detach(py, || lock(&self.inner).flush()).map_err(io_err)?;
        frames_iter(py, some_frames(frames))
    }
}

/// A video decoder and the frames it holds back to yield chunks of a fixed size.
#[derive(Debug)]
struct VideoDecoderState {
    decoder: MediaDecoder,
    buffer_size: usize,
    held: Vec<MediaFrames>,
    held_count: usize,
}

impl VideoDecoderState {
    fn hold(&mut self, frames: MediaFrames) {
        if frames.num_frame_objects() > 0 {
            self.held_count += frames.num_frames();
            self.held.push(frames);
        }
    }

    /// The chunks ready: everything held without a buffer size; else chunks of exactly the buffer size, and
    /// at the end (`last`) the rest.
    fn chunks(&mut self, last: bool) -> spdl_io::Result<Vec<MediaFrames>> {
        let n = self.buffer_size;
        if n == 0 {
            self.held_count = 0;
            return Ok(std::mem::take(&mut self.held));
        }
        let mut out = Vec::new();
        while self.held_count >= n || (last && self.held_count > 0) {
            let take = n.min(self.held_count);
            let mut need = take;
            let mut chunk: Option<MediaFrames> = None;
            while need > 0 && !self.held.is_empty() {
                let head_len = self.held[0].num_frames();
                let part = if head_len <= need {
                    self.held.remove(0)
                } else {
                    let head = &self.held[0];
                    let part = head.select(&(0..need).collect::<Vec<_>>(), MediaType::Video)?;
                    let rest = head.select(&(need..head_len).collect::<Vec<_>>(), MediaType::Video)?;
                    self.held[0] = rest;
                    part
                };
                need -= part.num_frames().min(need);
                chunk = Some(match chunk {
                    None => part,
                    Some(c) => c.concat(&part)?,
                });
            }
            self.held_count -= take;
            out.extend(chunk);
        }
        Ok(out)
    }
}

/// Decodes a stream of video packets chunk by chunk (made by :py:func:`Decoder`), in chunks of a fixed
/// number of frames after :py:meth:`set_buffer_size`. Thread-safe: calls run one at a time.
#[pyclass(name = "VideoDecoder", module = "spdl_rs._native.io", frozen)]
#[derive(Debug)]
pub struct PyVideoDecoder {
    inner: Mutex<VideoDecoderState>,
}

#[pymethods]
impl PyVideoDecoder {
    /// Decodes ``packets`` (consumed): the frames ready now, or ``None`` (the buffer size does not apply).
    fn decode(&self, py: Python<'_>, packets: &Bound<'_, PyAny>) -> PyResult<Option<Py<PyAny>>> {
        let p = packets_state(packets)?.take()?;
        let frames = crate::lifecycle::detach(py, || lock(&self.inner).decoder.decode(&p)).map_err(io_err)?;
        some_frames(frames).pop().map(|f| frames_object(py, f)).transpose()
    }

    /// Yield frames in chunks of exactly ``buffer_size`` frames from :py:meth:`streaming_decode_packets`
    /// (the rest at :py:meth:`flush`); ``0``: as they come.
    fn set_buffer_size(&self, buffer_size: i64) -> PyResult<()> {
        let n = usize::try_from(buffer_size)
            .map_err(|_| PyValueError::new_err(format!("buffer_size must be >= 0, got {buffer_size}")))?;
        let n = args::count("buffer_size", &args::Int::from(n as i128), 0, args::MAX_FRAMES)?;
        lock(&self.inner).buffer_size = n;
        Ok(())
    }

    /// Decodes ``packets`` (consumed) and yields the frames ready (in chunks of the buffer size, if set).
    fn streaming_decode_packets(&self, py: Python<'_>, packets: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        let p = packets_state(packets)?.take()?;
        let chunks = crate::lifecycle::detach(py, || {
            let mut s = lock(&self.inner);
            let frames = s.decoder.decode(&p)?;
            s.hold(frames);
            s.chunks(false)
        })
        .map_err(io_err)?;
        frames_iter(py, chunks)
    }

    /// Ends the stream and yields the frames still held.
    fn flush(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let chunks = crate::lifecycle::detach(py, || {
            let mut s = lock(&self.inner);
            let frames = s.decoder.flush()?;
            s.hold(frames);
            s.chunks(true)
        })
        .map_err(io_err)?;
        frames_iter(py, chunks)
    }
}

pub(crate) use factory::Decoder;

/// SPDL's ``Decoder``, a function spelled as the class it stands for (the names PyO3 derives from it are
/// not snake case either).
#[allow(non_snake_case, reason = "SPDL's name")]
mod factory {
    use super::*;

    /// A decoder that decodes the packets of one stream chunk by chunk (SPDL's ``Decoder``): an
    /// :py:class:`AudioDecoder` for an ``AudioCodec``, a :py:class:`VideoDecoder` for a video or image codec.
    ///
    /// ``codec``: the stream's codec (``Demuxer.audio_codec``, ``.video_codec``, ``.image_codec``).
    /// ``filter_desc``: the filters applied after decoding (without the ``buffer``/``abuffer`` input and the
    /// sink, which are added); default: SPDL's (``rgb24`` pixels, ``fltp`` samples); ``None``: no filter.
    /// ``decode_config``: see :py:func:`decode_config`.
    #[pyfunction]
    #[pyo3(
        signature = (codec, *, filter_desc=default_filter(), decode_config=None) -> "AudioDecoder | VideoDecoder",
        text_signature = "(codec, *, filter_desc='__PLACEHOLDER__', decode_config=None)"
    )]
    pub fn Decoder(
        py: Python<'_>,
        codec: &Bound<'_, PyAny>,
        filter_desc: Option<String>,
        decode_config: Option<PyRef<'_, PyDecodeConfig>>,
    ) -> PyResult<Py<PyAny>> {
        let codec = codec_from(codec)?;
        let desc = filter_desc.map(|f| filter_graph(&f, &codec, None));
        let config = PyDecodeConfig::config(decode_config.as_deref());
        let item = format!("<{} decoder>", codec.name);
        let limits = limits_from(None)?;
        let d = crate::lifecycle::detach(py, || MediaDecoder::new(&codec, &config, desc.as_deref(), &item, limits))
            .map_err(io_err)?;
        Ok(match codec.kind {
            MediaType::Audio => Py::new(py, PyAudioDecoder { inner: Mutex::new(d) })?.into_any(),
            MediaType::Video | MediaType::Image => {
                let state = VideoDecoderState { decoder: d, buffer_size: 0, held: Vec::new(), held_count: 0 };
                Py::new(py, PyVideoDecoder { inner: Mutex::new(state) })?.into_any()
            }
        })
    }
}

/// SPDL's form of ``decode_packets``: every frame of the packets' window (audio trimmed to it), at most
/// `num_frames` video frames when it is not negative.
fn decode_frames(
    py: Python<'_>,
    packets: &Bound<'_, PyAny>,
    filter_desc: Option<&str>,
    decode_config: Option<&PyDecodeConfig>,
    num_frames: i64,
) -> PyResult<Py<PyAny>> {
    if !(packets.is_instance_of::<PyAudioPackets>()
        || packets.is_instance_of::<PyVideoPackets>()
        || packets.is_instance_of::<PyImagePackets>())
    {
        return Err(PyTypeError::new_err(format!(
            "expected AudioPackets, VideoPackets or ImagePackets, got {}",
            packets.get_type().name()?
        )));
    }
    let num_frames =
        args::int_in("num_frames", &args::Int::from(i128::from(num_frames)), i64::MIN, args::MAX_FRAMES as i64)?;
    let p = packets_state(packets)?.take()?;
    let desc = filter_desc.map(|f| {
        let window = if matches!(p.codec.kind, MediaType::Audio) { p.window } else { None };
        filter_graph(f, &p.codec, window)
    });
    let config = PyDecodeConfig::config(decode_config);
    let n = usize::try_from(num_frames).ok();
    let frames = crate::lifecycle::detach(py, || decode_all(&p, &config, desc.as_deref(), n)).map_err(io_err)?;
    frames_object(py, frames)
}

/// Decodes packets (consumed; ``.clone()`` them to decode twice), GIL released. Two forms:
///
/// - SPDL's: ``decode_packets(packets, filter_desc, decode_config, *, num_frames=-1)`` returns frames
///   (``AudioFrames``, ``VideoFrames`` or ``ImageFrames``), to copy into a buffer with
///   :py:func:`convert_frames`: every frame of the packets' window (audio trimmed to it), at most
///   ``num_frames`` video frames when ``num_frames >= 0``. ``filter_desc``: filters applied after decoding
///   (see :py:func:`Decoder`); default: SPDL's (``rgb24`` pixels, ``fltp`` samples); ``None``: the decoder's
///   own format. ``decode_config``: see :py:func:`decode_config`.
/// - spdl_rs's frame sampler, used as soon as one of ``fps``, ``every_k``, ``width``, ``height``,
///   ``pix_fmt``, ``filter``, ``threads`` or ``return_info`` is given: video packets straight into one
///   ``uint8`` :py:class:`spdl_rs.Buffer` ``[N, H, W, C]``, only the selected frames converted; there
///   ``num_frames`` is a count spread uniformly over the window. Arguments as :py:func:`load_video`.
#[pyfunction]
#[pyo3(signature = (
    packets, filter_desc=default_filter(), decode_config=None, *, num_frames=Some(-1), fps=None, every_k=None,
    width=None, height=None, pix_fmt=None, filter=None, threads=None, return_info=false
), text_signature = "(packets, filter_desc='__PLACEHOLDER__', decode_config=None, *, num_frames=-1, fps=None, \
    every_k=None, width=None, height=None, pix_fmt=None, filter=None, threads=None, return_info=False)")]
#[allow(clippy::too_many_arguments, reason = "SPDL's arguments and the frame sampler's, one function")]
pub(crate) fn decode_packets(
    py: Python<'_>,
    packets: &Bound<'_, PyAny>,
    filter_desc: Option<String>,
    decode_config: Option<PyRef<'_, PyDecodeConfig>>,
    num_frames: Option<i64>,
    fps: Option<f64>,
    every_k: Option<&Bound<'_, PyAny>>,
    width: Option<&Bound<'_, PyAny>>,
    height: Option<&Bound<'_, PyAny>>,
    pix_fmt: Option<&str>,
    filter: Option<&str>,
    threads: Option<&Bound<'_, PyAny>>,
    return_info: bool,
) -> PyResult<Py<PyAny>> {
    let sampler = return_info
        || fps.is_some()
        || [every_k, width, height, threads].iter().any(Option::is_some)
        || pix_fmt.is_some()
        || filter.is_some();
    if !sampler {
        return decode_frames(py, packets, filter_desc.as_deref(), decode_config.as_deref(), num_frames.unwrap_or(-1));
    }
    if filter_desc.as_deref() != Some(FILTER_DESC_DEFAULT) || decode_config.is_some() {
        return Err(PyValueError::new_err(
            "decode_packets: filter_desc/decode_config (SPDL's form) cannot be combined with the frame sampler's \
             keywords (fps, every_k, width, height, pix_fmt, filter, threads, return_info)",
        ));
    }
    let options = PyDict::new(py);
    options.set_item("fps", fps)?;
    options.set_item("every_k", every_k)?;
    options.set_item("num_frames", num_frames.filter(|n| *n >= 0))?;
    options.set_item("width", width)?;
    options.set_item("height", height)?;
    options.set_item("pix_fmt", pix_fmt.unwrap_or("rgb24"))?;
    options.set_item("filter", filter.unwrap_or("bicubic"))?;
    match threads {
        Some(t) => options.set_item("threads", t)?,
        None => options.set_item("threads", 1)?,
    }
    let packets = packets.cast::<PyVideoPackets>().map_err(|_| {
        PyTypeError::new_err("decode_packets: the frame sampler's keywords take VideoPackets (from demux_video)")
    })?;
    super::video::sample_packets(py, packets.get(), return_info, Some(&options))
}

/// Copies frames into one :py:class:`spdl_rs.Buffer` (SPDL's ``convert_frames``), GIL released.
///
/// Shapes: video ``[N, H, W, C]`` (``rgb24``, ``rgba``, ``gray``, ...), ``[N, 3, H, W]`` (``yuv444p``),
/// ``[N, 1, H * 3 / 2, W]`` (``yuv420p``, ``nv12``); images the same without ``N``; audio ``[C, N]``
/// (planar sample formats) or ``[N, C]`` (packed), in the sample format's dtype. A sequence of frames gives
/// a leading batch axis (all items must have the same shape). The frames are consumed, as in SPDL.
/// ``storage``: SPDL's pre-allocated storage; only ``None`` is accepted (the buffer is allocated here,
/// within the decode memory budget).
#[pyfunction]
#[pyo3(signature = (frames, storage=None))]
pub(crate) fn convert_frames(
    py: Python<'_>,
    frames: &Bound<'_, PyAny>,
    storage: Option<&Bound<'_, PyAny>>,
) -> PyResult<PyBuffer> {
    if storage.is_some_and(|s| !s.is_none()) {
        return Err(PyValueError::new_err(
            "convert_frames: storage= is not supported by spdl_rs (the buffer is allocated here)",
        ));
    }
    let (items, batch): (Vec<Bound<'_, PyAny>>, bool) = if frames_cell(frames).is_ok() {
        (vec![frames.clone()], false)
    } else if frames.is_instance_of::<PyAudioFrames>()
        || frames.is_instance_of::<PyVideoFrames>()
        || frames.is_instance_of::<super::media::PyImageFrames>()
    {
        // Consumed frames: their `TypeError`.
        return Err(frames_cell(frames).err().unwrap_or_else(|| PyTypeError::new_err("consumed frames")));
    } else {
        let items: Vec<Bound<'_, PyAny>> = frames
            .try_iter()
            .map_err(|_| PyTypeError::new_err("convert_frames takes frames or a sequence of frames"))?
            .collect::<PyResult<_>>()?;
        if items.is_empty() {
            return Err(PyValueError::new_err("convert_frames: the sequence of frames is empty"));
        }
        (items, true)
    };
    let cells = items.iter().map(|o| frames_cell(o)).collect::<PyResult<Vec<_>>>()?;
    let refs: Vec<&MediaFrames> = cells.iter().map(|(f, _)| f.frames).collect();
    let buf = crate::lifecycle::detach(py, || convert_frames_rs(&refs, batch, &system_allocator()));
    // As in SPDL, a conversion (even one that failed) consumes the frames.
    for (_, consumed) in &cells {
        consumed.store(true, std::sync::atomic::Ordering::Release);
    }
    Ok(PyBuffer::new(buf.map_err(io_err)?))
}

/// The frames at ``indices`` (positions among the frames of the packets' window, sorted and distinct), each
/// an ``ImageFrames``, decoding only from the keyframe before each (SPDL's ``sample_decode_video``).
/// ``packets`` is not consumed. ``decode_config``, ``filter_desc``: as :py:func:`decode_packets`.
#[pyfunction]
#[pyo3(
    signature = (packets, indices, *, decode_config=None, filter_desc=default_filter()) -> "list[ImageFrames]",
    text_signature = "(packets, indices, *, decode_config=None, filter_desc='__PLACEHOLDER__')"
)]
pub(crate) fn sample_decode_video(
    py: Python<'_>,
    packets: &Bound<'_, PyVideoPackets>,
    indices: Vec<i64>,
    decode_config: Option<PyRef<'_, PyDecodeConfig>>,
    filter_desc: Option<String>,
) -> PyResult<Vec<Py<PyAny>>> {
    if indices.is_empty() {
        return Err(PyValueError::new_err("Frame indices must be non-empty."));
    }
    let num_packets = packets.len()?;
    let mut checked = Vec::with_capacity(indices.len());
    for &i in &indices {
        match usize::try_from(i) {
            Ok(i) if i < num_packets => checked.push(i),
            _ => return Err(PyIndexError::new_err(format!("Frame index must be [0, {num_packets})."))),
        }
    }
    if checked.windows(2).any(|w| w[0] > w[1]) {
        return Err(PyValueError::new_err("Frame indices must be sorted in ascending order."));
    }
    if checked.windows(2).any(|w| w[0] == w[1]) {
        return Err(PyValueError::new_err("Frame indices must be unique."));
    }
    let p = packets.get().state.cloned()?;
    let parts = crate::lifecycle::detach(py, || p.split_at_indices(&checked)).map_err(io_err)?;
    let mut out = Vec::with_capacity(checked.len());
    for (split, idxes) in parts {
        let Some(&last) = idxes.iter().max() else { continue };
        let split = Py::new(py, PyVideoPackets::from_packets(split))?.into_bound(py).into_any();
        let n = i64::try_from(last + 1).map_err(|_| PyIndexError::new_err("frame index too large"))?;
        let frames = decode_frames(py, &split, filter_desc.as_deref(), decode_config.as_deref(), n)?;
        let frames = frames.bind(py);
        for i in idxes {
            out.push(frames.get_item(i)?.unbind());
        }
    }
    Ok(out)
}

// ------------------------------------------------------------------------------------ frames from arrays

/// The bytes of `array` (C-contiguous; a CPU tensor through ``.numpy()``), its shape and element size.
fn array_bytes(array: &Bound<'_, PyAny>) -> PyResult<(Vec<u8>, Vec<usize>, usize)> {
    let mut array = array.clone();
    if array.hasattr("numpy")? && !array.hasattr("__array_interface__")? {
        array = array.call_method0("numpy")?;
    }
    let arr = array.py().import("numpy")?.call_method1("ascontiguousarray", (array,))?;
    let data: Vec<u8> = arr.call_method0("tobytes")?.extract()?;
    let shape: Vec<usize> = arr.getattr("shape")?.extract()?;
    let itemsize: usize = arr.getattr("dtype")?.getattr("itemsize")?.extract()?;
    Ok((data, shape, itemsize))
}

/// Video frames made from an array (SPDL's ``create_reference_video_frame``): ``[N, H, W, 3]``
/// (``"rgb24"``, ``"bgr24"``), ``[N, H, W, 4]`` (``"rgba"``, ...), ``[N, H, W]`` (``"gray8"``; ``"gray16"``
/// with 16-bit elements) or ``[N, 3, H, W]`` (``"yuv444p"``); ``pts`` is the first frame's time in frames at
/// ``frame_rate``. The data are copied; the frames keep ``array`` alive, as SPDL's do.
#[pyfunction]
pub(crate) fn create_reference_video_frame(
    array: &Bound<'_, PyAny>,
    pix_fmt: &str,
    frame_rate: (i32, i32),
    pts: i64,
) -> PyResult<PyVideoFrames> {
    if frame_rate.0 <= 0 || frame_rate.1 <= 0 {
        return Err(PyValueError::new_err(format!("frame_rate must be positive, got {frame_rate:?}")));
    }
    let (data, shape, itemsize) = array_bytes(array)?;
    let f = reference_video_frames(&data, &shape, itemsize, pix_fmt, frame_rate, pts).map_err(io_err)?;
    Ok(PyVideoFrames::with_source(f, array.clone().unbind()))
}

/// Audio frames made from a 2-D array (SPDL's ``create_reference_audio_frame``): ``[C, N]`` for planar
/// ``sample_fmt`` (``"fltp"``, ``"s16p"``, ...) or ``[N, C]`` for packed ones (``"flt"``, ``"s16"``, ...),
/// whose dtype matches it; ``pts`` is the first sample's time in samples. The data are copied; the frames
/// keep ``array`` alive, as SPDL's do.
#[pyfunction]
pub(crate) fn create_reference_audio_frame(
    array: &Bound<'_, PyAny>,
    sample_fmt: &str,
    sample_rate: u32,
    pts: i64,
) -> PyResult<PyAudioFrames> {
    let (data, shape, itemsize) = array_bytes(array)?;
    let f = reference_audio_frame_rs(&data, &shape, itemsize, sample_fmt, sample_rate, pts).map_err(io_err)?;
    Ok(PyAudioFrames::with_source(f, array.clone().unbind()))
}
