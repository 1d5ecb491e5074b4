//! SPDL's demuxing API (feature `ffmpeg`) with SPDL's names, signatures, defaults and errors:
//! `DemuxConfig`/`DecodeConfig`, `Demuxer`, `demux_audio`/`demux_video`/`demux_image` and `BSF`/`apply_bsf`;
//! the decoding half (`Decoder`, `decode_packets`, `convert_frames`, ...) is [`super::media_decode`]. The objects they take and return (codecs, packets,
//! frames) live in [`super::media`]; `spdl_rs.io` re-exports these items as they are, so no Python layer
//! sits between a caller and the GIL-free work.
//!
//! `demux_video` and `decode_packets` also take spdl_rs's own keywords (a `start`/`duration` window; the
//! frame sampler's `fps`, `width`, ... straight into one buffer): one function per name, whichever form a
//! call takes.

use std::collections::BTreeMap;
use std::sync::Mutex;

use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyFloat, PyInt, PyString, PyTuple, PyType};
use spdl_io::media::{Bsf, DecodeConfig, DemuxConfig, Demuxer, MediaPackets, MediaType};

use super::media::{
    PyAudioCodec, PyImageCodec, PyVideoCodec, codec_from, limits_from, lock, packets_object, packets_state,
};
use super::{io_err, media_src};
use crate::args;

/// SPDL's default ``filter_desc``: ``rgb24`` pixels for video and images, ``fltp`` samples for audio
/// (trimmed to the packets' window).
pub(super) const FILTER_DESC_DEFAULT: &str = "__PLACEHOLDER__";

pub(super) fn default_filter() -> Option<String> {
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
    /// spdl-io's decode configuration of `config` (`None`: the codec's decoder, no options).
    pub(super) fn config(config: Option<&Self>) -> DecodeConfig {
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
