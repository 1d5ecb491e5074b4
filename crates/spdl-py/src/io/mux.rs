//! SPDL's encoding and muxing objects (feature `ffmpeg`), over spdl-io's `media` module: the encode
//! configurations, the `Muxer` and the `AudioEncoder` and
//! `VideoEncoder` it hands out. Every call that opens an encoder, encodes, writes or closes releases the GIL;
//! every object is safe to share between threads (calls on one object run one at a time, behind a lock that
//! is never held while Python runs).

use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard, PoisonError};

use pyo3::exceptions::{
    PyFileNotFoundError, PyIsADirectoryError, PyOSError, PyPermissionError, PyTypeError, PyValueError,
};
use pyo3::prelude::*;
use pyo3::types::PyMapping;
use spdl_io::media::{AudioEncodeConfig, AudioEncoder, EncoderChoice, Muxer, VideoEncodeConfig, VideoEncoder};

use super::io_err;
use super::media::{PyAudioFrames, PyVideoFrames, codec_from, frames_of, packets_object, packets_state};
use crate::args::{self, Int};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// spdl-io's error as Python's: an output that did not open is the `OSError` of its cause
/// (`FileNotFoundError`, `PermissionError`, ...), the rest as everywhere in `spdl_rs.io`.
fn mux_err(e: spdl_io::Error) -> PyErr {
    if let spdl_io::Error::Encode { cause, .. } = &e
        && let Some(io) = cause.downcast_ref::<std::io::Error>()
    {
        let msg = spdl_report::error_chain(&e);
        return match io.kind() {
            std::io::ErrorKind::NotFound => PyFileNotFoundError::new_err(msg),
            std::io::ErrorKind::PermissionDenied => PyPermissionError::new_err(msg),
            std::io::ErrorKind::IsADirectory => PyIsADirectoryError::new_err(msg),
            _ => PyOSError::new_err(msg),
        };
    }
    io_err(e)
}

/// The largest frame side an encoder is configured for.
const MAX_SIDE: u64 = 1 << 15;

fn i32_in(name: &str, v: &Int, min: i64) -> PyResult<i32> {
    Ok(args::int_in(name, v, min, i64::from(i32::MAX))? as i32)
}

fn opt_str(v: &Option<String>) -> String {
    v.as_ref().map_or_else(|| "None".to_owned(), |s| format!("{s:?}"))
}

/// How to encode audio (SPDL's ``AudioEncodeConfig``; made by :py:func:`spdl_rs.io.audio_encode_config`).
/// ``-1`` (or ``None``) leaves a setting to the encoder.
#[pyclass(name = "AudioEncodeConfig", module = "spdl_rs._native.io", frozen)]
#[derive(Debug)]
pub struct PyAudioEncodeConfig {
    config: AudioEncodeConfig,
}

#[pymethods]
impl PyAudioEncodeConfig {
    #[new]
    #[pyo3(signature = (
        *, num_channels, sample_rate, sample_fmt=None, bit_rate=Int::from(-1), compression_level=Int::from(-1),
        qscale=Int::from(-1)
    ))]
    pub(crate) fn new(
        num_channels: Int,
        sample_rate: Int,
        sample_fmt: Option<String>,
        bit_rate: Int,
        compression_level: Int,
        qscale: Int,
    ) -> PyResult<Self> {
        Ok(Self {
            config: AudioEncodeConfig {
                num_channels: args::count("num_channels", &num_channels, 1, 64)? as u32,
                sample_rate: args::count("sample_rate", &sample_rate, 1, i32::MAX as u64)? as u32,
                sample_fmt,
                bit_rate: args::int_in("bit_rate", &bit_rate, -1, i64::MAX)?,
                compression_level: i32_in("compression_level", &compression_level, i64::from(i32::MIN))?,
                qscale: i32_in("qscale", &qscale, -1)?,
            },
        })
    }
    /// Channels of the input frames.
    #[getter]
    fn num_channels(&self) -> u32 {
        self.config.num_channels
    }
    /// Samples per second of the input frames.
    #[getter]
    fn sample_rate(&self) -> u32 {
        self.config.sample_rate
    }
    /// The sample format of the input frames (``None``: the encoder's first).
    #[getter]
    fn sample_fmt(&self) -> Option<&str> {
        self.config.sample_fmt.as_deref()
    }
    /// Bits per second (``-1``: the encoder's).
    #[getter]
    fn bit_rate(&self) -> i64 {
        self.config.bit_rate
    }
    /// Compression level (``-1``: the encoder's).
    #[getter]
    fn compression_level(&self) -> i32 {
        self.config.compression_level
    }
    /// Fixed quantizer (``-1``: none).
    #[getter]
    fn qscale(&self) -> i32 {
        self.config.qscale
    }
    fn __repr__(&self) -> String {
        let c = &self.config;
        format!(
            "AudioEncodeConfig(num_channels={}, sample_rate={}, sample_fmt={}, bit_rate={}, compression_level={}, \
             qscale={})",
            c.num_channels,
            c.sample_rate,
            opt_str(&c.sample_fmt),
            c.bit_rate,
            c.compression_level,
            c.qscale
        )
    }
}

/// How to encode video (SPDL's ``VideoEncodeConfig``; made by :py:func:`spdl_rs.io.video_encode_config`).
/// ``-1`` (or ``None``) leaves a setting to the encoder.
#[pyclass(name = "VideoEncodeConfig", module = "spdl_rs._native.io", frozen)]
#[derive(Debug)]
pub struct PyVideoEncodeConfig {
    config: VideoEncodeConfig,
}

#[pymethods]
impl PyVideoEncodeConfig {
    #[new]
    #[pyo3(signature = (
        *, height, width, frame_rate=None, pix_fmt=None, bit_rate=Int::from(-1), compression_level=Int::from(-1),
        qscale=Int::from(-1), gop_size=Int::from(-1), max_b_frames=Int::from(-1), colorspace=None,
        color_primaries=None, color_trc=None
    ))]
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        height: Int,
        width: Int,
        frame_rate: Option<(Int, Int)>,
        pix_fmt: Option<String>,
        bit_rate: Int,
        compression_level: Int,
        qscale: Int,
        gop_size: Int,
        max_b_frames: Int,
        colorspace: Option<String>,
        color_primaries: Option<String>,
        color_trc: Option<String>,
    ) -> PyResult<Self> {
        let frame_rate = match frame_rate {
            None => None,
            Some((n, d)) => Some((i32_in("frame_rate numerator", &n, 1)?, i32_in("frame_rate denominator", &d, 1)?)),
        };
        Ok(Self {
            config: VideoEncodeConfig {
                width: args::count("width", &width, 1, MAX_SIDE)? as u32,
                height: args::count("height", &height, 1, MAX_SIDE)? as u32,
                frame_rate,
                pix_fmt,
                bit_rate: args::int_in("bit_rate", &bit_rate, -1, i64::MAX)?,
                compression_level: i32_in("compression_level", &compression_level, i64::from(i32::MIN))?,
                qscale: i32_in("qscale", &qscale, -1)?,
                gop_size: i32_in("gop_size", &gop_size, -1)?,
                max_b_frames: i32_in("max_b_frames", &max_b_frames, -1)?,
                colorspace,
                color_primaries,
                color_trc,
            },
        })
    }
    /// Height of the frames in pixels.
    #[getter]
    fn height(&self) -> u32 {
        self.config.height
    }
    /// Width of the frames in pixels.
    #[getter]
    fn width(&self) -> u32 {
        self.config.width
    }
    /// Frames per second, ``(numerator, denominator)`` (``None``: the encoder's default).
    #[getter]
    fn frame_rate(&self) -> Option<(i32, i32)> {
        self.config.frame_rate
    }
    /// The pixel format of the input frames (``None``: the encoder's first).
    #[getter]
    fn pix_fmt(&self) -> Option<&str> {
        self.config.pix_fmt.as_deref()
    }
    /// Bits per second (``-1``: the encoder's).
    #[getter]
    fn bit_rate(&self) -> i64 {
        self.config.bit_rate
    }
    /// Compression level (``-1``: the encoder's).
    #[getter]
    fn compression_level(&self) -> i32 {
        self.config.compression_level
    }
    /// Fixed quantizer (``-1``: none).
    #[getter]
    fn qscale(&self) -> i32 {
        self.config.qscale
    }
    /// Frames between keyframes (``-1``: the encoder's).
    #[getter]
    fn gop_size(&self) -> i32 {
        self.config.gop_size
    }
    /// The most consecutive B-frames (``-1``: the encoder's).
    #[getter]
    fn max_b_frames(&self) -> i32 {
        self.config.max_b_frames
    }
    /// The color space written in the stream.
    #[getter]
    fn colorspace(&self) -> Option<&str> {
        self.config.colorspace.as_deref()
    }
    /// The color primaries written in the stream.
    #[getter]
    fn color_primaries(&self) -> Option<&str> {
        self.config.color_primaries.as_deref()
    }
    /// The transfer characteristics written in the stream.
    #[getter]
    fn color_trc(&self) -> Option<&str> {
        self.config.color_trc.as_deref()
    }
    fn __repr__(&self) -> String {
        let c = &self.config;
        format!(
            "VideoEncodeConfig(height={}, width={}, frame_rate={}, pix_fmt={}, bit_rate={}, compression_level={}, \
             qscale={}, gop_size={}, max_b_frames={}, colorspace={}, color_primaries={}, color_trc={})",
            c.height,
            c.width,
            c.frame_rate.map_or_else(|| "None".to_owned(), |(n, d)| format!("({n}, {d})")),
            opt_str(&c.pix_fmt),
            c.bit_rate,
            c.compression_level,
            c.qscale,
            c.gop_size,
            c.max_b_frames,
            opt_str(&c.colorspace),
            opt_str(&c.color_primaries),
            opt_str(&c.color_trc)
        )
    }
}

/// Encodes audio frames into the packets of one stream of a muxer (SPDL's ``AudioEncoder``; made by
/// ``Muxer.add_encode_stream``). Thread-safe: calls run one at a time.
#[pyclass(name = "AudioEncoder", module = "spdl_rs._native.io", frozen)]
#[derive(Debug)]
pub struct PyAudioEncoder {
    inner: Mutex<AudioEncoder>,
    frame_size: usize,
    item: String,
}

#[pymethods]
impl PyAudioEncoder {
    /// Encodes ``frames`` (``AudioFrames``, not consumed): the packets ready, or ``None``. Each frame must
    /// hold :py:attr:`frame_size` samples (only the last may hold fewer) when that is not ``0``.
    #[pyo3(signature = (frames, /))]
    fn encode(&self, py: Python<'_>, frames: &Bound<'_, PyAny>) -> PyResult<Option<Py<PyAny>>> {
        if !frames.is_instance_of::<PyAudioFrames>() {
            return Err(PyTypeError::new_err(format!(
                "AudioEncoder.encode takes AudioFrames, got {}",
                frames.get_type().name()?
            )));
        }
        let f = frames_of(frames)?;
        let out = crate::lifecycle::detach(py, || lock(&self.inner).encode(f)).map_err(io_err)?;
        out.map(|p| packets_object(py, p)).transpose()
    }
    /// Ends the stream: the packets the encoder still held, or ``None``.
    fn flush(&self, py: Python<'_>) -> PyResult<Option<Py<PyAny>>> {
        let out = crate::lifecycle::detach(py, || lock(&self.inner).flush()).map_err(io_err)?;
        out.map(|p| packets_object(py, p)).transpose()
    }
    /// Samples per channel each frame must hold (only the last may hold fewer): slice the samples into frames
    /// of this size. ``0``: frames of any size (PCM).
    #[getter]
    fn frame_size(&self) -> usize {
        self.frame_size
    }
    fn __repr__(&self) -> String {
        format!("AudioEncoder<{}, frame_size={}>", self.item, self.frame_size)
    }
}

/// Encodes video frames into the packets of one stream of a muxer (SPDL's ``VideoEncoder``; made by
/// ``Muxer.add_encode_stream``). Thread-safe: calls run one at a time.
#[pyclass(name = "VideoEncoder", module = "spdl_rs._native.io", frozen)]
#[derive(Debug)]
pub struct PyVideoEncoder {
    inner: Mutex<VideoEncoder>,
    item: String,
}

#[pymethods]
impl PyVideoEncoder {
    /// Encodes ``frames`` (``VideoFrames``, not consumed; converted with swscale when the encoder does not
    /// take their pixel format): the packets ready, or ``None`` while the encoder holds them back.
    #[pyo3(signature = (frames, /))]
    fn encode(&self, py: Python<'_>, frames: &Bound<'_, PyAny>) -> PyResult<Option<Py<PyAny>>> {
        if !frames.is_instance_of::<PyVideoFrames>() {
            return Err(PyTypeError::new_err(format!(
                "VideoEncoder.encode takes VideoFrames, got {}",
                frames.get_type().name()?
            )));
        }
        let f = frames_of(frames)?;
        let out = crate::lifecycle::detach(py, || lock(&self.inner).encode(f)).map_err(io_err)?;
        out.map(|p| packets_object(py, p)).transpose()
    }
    /// Ends the stream: the packets the encoder still held, or ``None``.
    fn flush(&self, py: Python<'_>) -> PyResult<Option<Py<PyAny>>> {
        let out = crate::lifecycle::detach(py, || lock(&self.inner).flush()).map_err(io_err)?;
        out.map(|p| packets_object(py, p)).transpose()
    }
    fn __repr__(&self) -> String {
        format!("VideoEncoder<{}>", self.item)
    }
}

/// The options of an encoder, a muxer or an output protocol: a mapping whose keys and values are taken as
/// ``str(key)``/``str(value)``; ``None``: none.
fn str_options(what: &str, options: Option<&Bound<'_, PyAny>>) -> PyResult<Vec<(String, String)>> {
    let Some(options) = options.filter(|o| !o.is_none()) else { return Ok(Vec::new()) };
    let mapping = options.cast::<PyMapping>().map_err(|_| {
        PyTypeError::new_err(format!(
            "{what} must be a mapping of option names to values, got {}",
            options.get_type().name().map(|n| n.to_string()).unwrap_or_default()
        ))
    })?;
    let mut out = std::collections::BTreeMap::new();
    for item in mapping.items()?.iter() {
        let (k, v): (Bound<'_, PyAny>, Bound<'_, PyAny>) = item.extract()?;
        out.insert(k.str()?.to_string(), v.str()?.to_string());
    }
    Ok(out.into_iter().collect())
}

/// How to encode audio (SPDL's factory of :py:class:`AudioEncodeConfig`).
///
/// Args:
///     num_channels: Channels of the frames to encode.
///     sample_rate: Their sample rate (Hz).
///     sample_fmt: Their sample format, which the encoder must take: ``"u8"``, ``"s16"``, ``"s32"``,
///         ``"flt"``, ``"dbl"`` for samples interleaved by channel (arrays ``[N, C]``), the same with a ``p``
///         suffix for one plane per channel (``"fltp"``, arrays ``[C, N]``). ``pcm_s16le`` (WAV) takes
///         ``"s16"``, FLAC ``"s16"``/``"s32"``, AAC and Vorbis ``"fltp"``.
///     bit_rate: Bits per second (``-1``: the encoder's default).
///     compression_level: The encoder's compression level (``-1``: its default).
///     qscale: A fixed quantizer on the encoder's scale (``-1``: none).
#[pyfunction]
#[pyo3(signature = (
    *, num_channels, sample_rate, sample_fmt="fltp".to_owned(), bit_rate=Int::from(-1),
    compression_level=Int::from(-1), qscale=Int::from(-1)
), text_signature = "(*, num_channels, sample_rate, sample_fmt='fltp', bit_rate=-1, compression_level=-1, qscale=-1)")]
pub(crate) fn audio_encode_config(
    num_channels: Int,
    sample_rate: Int,
    sample_fmt: String,
    bit_rate: Int,
    compression_level: Int,
    qscale: Int,
) -> PyResult<PyAudioEncodeConfig> {
    PyAudioEncodeConfig::new(num_channels, sample_rate, Some(sample_fmt), bit_rate, compression_level, qscale)
}

/// How to encode video (SPDL's factory of :py:class:`VideoEncodeConfig`).
///
/// Args:
///     height: Height of the frames to encode.
///     width: Their width.
///     frame_rate: Frames per second, ``(numerator, denominator)`` (each taken as ``int(...)``); ``None``: the
///         encoder's default rate, which most encoders (``libx264``, ``mpeg4``) do not have.
///     pix_fmt: The pixel format of the frames given to the encoder (the default ``"rgb24"`` is an
///         ``[N, H, W, 3]`` ``uint8`` array). When the encoder does not take it (``libx264`` and ``mpeg4`` do
///         not take ``rgb24``), each frame is converted with swscale to the encoder's first format
///         (``yuv420p`` for both); SPDL 0.8.0 refuses such a configuration instead.
///     bit_rate: Bits per second (``-1``: the encoder's default).
///     compression_level: The encoder's compression level (``-1``: its default).
///     qscale: A fixed quantizer on the encoder's scale (``-1``: none).
///     gop_size: Frames from one keyframe to the next (``-1``: the encoder's default).
///     max_b_frames: The most consecutive B-frames (``-1``: the encoder's default).
///     colorspace: The color matrix written in the stream, e.g. ``"bt709"``; an RGB input is converted with
///         it (swscale's default otherwise: BT.601).
///     color_primaries: The color primaries written in the stream, e.g. ``"bt709"``.
///     color_trc: The transfer characteristics written in the stream, e.g. ``"bt709"``.
#[pyfunction]
#[pyo3(signature = (
    *, height, width, frame_rate=None, pix_fmt="rgb24".to_owned(), bit_rate=Int::from(-1),
    compression_level=Int::from(-1), qscale=Int::from(-1), gop_size=Int::from(-1), max_b_frames=Int::from(-1),
    colorspace=None, color_primaries=None, color_trc=None
), text_signature = "(*, height, width, frame_rate=None, pix_fmt='rgb24', bit_rate=-1, compression_level=-1, \
    qscale=-1, gop_size=-1, max_b_frames=-1, colorspace=None, color_primaries=None, color_trc=None)")]
#[allow(clippy::too_many_arguments)]
pub(crate) fn video_encode_config(
    height: Int,
    width: Int,
    #[pyo3(from_py_with = int_pair)] frame_rate: Option<(Int, Int)>,
    pix_fmt: String,
    bit_rate: Int,
    compression_level: Int,
    qscale: Int,
    gop_size: Int,
    max_b_frames: Int,
    colorspace: Option<String>,
    color_primaries: Option<String>,
    color_trc: Option<String>,
) -> PyResult<PyVideoEncodeConfig> {
    PyVideoEncodeConfig::new(
        height,
        width,
        frame_rate,
        Some(pix_fmt),
        bit_rate,
        compression_level,
        qscale,
        gop_size,
        max_b_frames,
        colorspace,
        color_primaries,
        color_trc,
    )
}

/// ``(int(a), int(b))`` of a pair ``(a, b)``, or ``None``.
fn int_pair(obj: &Bound<'_, PyAny>) -> PyResult<Option<(Int, Int)>> {
    if obj.is_none() {
        return Ok(None);
    }
    let (a, b): (Bound<'_, PyAny>, Bound<'_, PyAny>) = obj.extract()?;
    let int = obj.py().get_type::<pyo3::types::PyInt>();
    Ok(Some((int.call1((a,))?.extract()?, int.call1((b,))?.extract()?)))
}

/// Writes streams of packets into one container (SPDL's ``Muxer``): a video file, an audio file, or any
/// output FFmpeg writes to.
///
/// Add the streams first (:py:meth:`add_encode_stream`, :py:meth:`add_remux_stream`; stream ``i`` is the
/// ``i``-th added), then :py:meth:`open` the output, :py:meth:`write` packets to each stream, and end with
/// :py:meth:`flush` and :py:meth:`close` (a ``with muxer.open():`` block does both). Thread-safe: calls run
/// one at a time.
///
/// Args:
///     dst: Where to write: a path, or a URL of an FFmpeg protocol (``pipe:1``, ``rtmp://...``).
///     format: The container, an FFmpeg muxer name (``ffmpeg -muxers``; the ``-f`` of the ``ffmpeg`` CLI),
///         for a destination whose extension does not tell it, or an output device. ``None``: from the
///         extension of ``dst``.
#[pyclass(name = "Muxer", module = "spdl_rs._native.io", frozen)]
#[derive(Debug)]
pub struct PyMuxer {
    inner: Mutex<Muxer>,
    dst: String,
}

impl PyMuxer {
    fn with<T: Send>(&self, py: Python<'_>, f: impl FnOnce(&mut Muxer) -> spdl_io::Result<T> + Send) -> PyResult<T> {
        crate::lifecycle::detach(py, || f(&mut lock(&self.inner))).map_err(mux_err)
    }
}

#[pymethods]
impl PyMuxer {
    #[new]
    #[pyo3(signature = (dst, /, *, format=None))]
    fn new(py: Python<'_>, dst: PathBuf, format: Option<String>) -> PyResult<Self> {
        let dst = dst
            .to_str()
            .ok_or_else(|| PyValueError::new_err(format!("the destination {dst:?} is not valid UTF-8")))?
            .to_owned();
        let m = crate::lifecycle::detach(py, || Muxer::new(&dst, format.as_deref())).map_err(io_err)?;
        Ok(Self { inner: Mutex::new(m), dst })
    }

    /// Where it writes.
    #[getter]
    fn dst(&self) -> &str {
        &self.dst
    }

    /// Streams added so far.
    #[getter]
    fn num_streams(&self) -> usize {
        lock(&self.inner).num_streams()
    }

    /// Adds a stream that is encoded from frames, and returns its encoder.
    ///
    /// Args:
    ///     config: What the frames are (:py:func:`audio_encode_config`, :py:func:`video_encode_config`).
    ///     encoder: An encoder by name (``ffmpeg -encoders``: ``"libx264"``, ``"mpeg4"``, ``"aac"``,
    ///         ``"flac"``, ...); ``None``: the container's default encoder for the medium.
    ///     encoder_config: The encoder's options (``ffmpeg -h encoder=NAME``; e.g. ``{"crf": "18"}``).
    ///         Encoding is single-threaded unless ``"threads"`` is given; an option the encoder does not take
    ///         is an error.
    ///
    /// Returns:
    ///     The encoder: ``encoder.encode(frames)`` gives packets (or ``None`` while it holds them back) to
    ///     :py:meth:`write`, ``encoder.flush()`` the rest at the end.
    #[pyo3(signature = (config, *, encoder=None, encoder_config=None))]
    fn add_encode_stream(
        &self,
        py: Python<'_>,
        config: &Bound<'_, PyAny>,
        encoder: Option<String>,
        encoder_config: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        let audio = config.cast::<PyAudioEncodeConfig>().ok();
        let video = config.cast::<PyVideoEncodeConfig>().ok();
        let choice = || -> PyResult<EncoderChoice> {
            Ok(EncoderChoice { encoder: encoder.clone(), options: str_options("encoder_config", encoder_config)? })
        };
        match (audio, video) {
            (Some(c), _) => {
                let (config, choice) = (c.get().config.clone(), choice()?);
                let enc = self.with(py, |m| m.add_audio_encode_stream(&config, &choice))?;
                let (frame_size, item) = (enc.frame_size(), enc.item().to_owned());
                Ok(Py::new(py, PyAudioEncoder { inner: Mutex::new(enc), frame_size, item })?.into_any())
            }
            (None, Some(c)) => {
                let (config, choice) = (c.get().config.clone(), choice()?);
                let enc = self.with(py, |m| m.add_video_encode_stream(&config, &choice))?;
                let item = enc.item().to_owned();
                Ok(Py::new(py, PyVideoEncoder { inner: Mutex::new(enc), item })?.into_any())
            }
            (None, None) => Err(PyTypeError::new_err(format!(
                "add_encode_stream takes the result of audio_encode_config(...) or video_encode_config(...), got {}",
                config.get_type().name()?
            ))),
        }
    }

    /// Adds a stream whose packets are written as they are, without decoding them: demuxed packets of another
    /// source (``Demuxer.audio_codec``, ``.video_codec``, or ``packets.codec``).
    ///
    /// Example::
    ///
    ///     demuxer = spdl_rs.io.Demuxer("source.mp4")
    ///     muxer = spdl_rs.io.Muxer("audio_only.m4a")
    ///     muxer.add_remux_stream(demuxer.audio_codec)
    ///     with muxer.open():
    ///         for packets in demuxer.streaming_demux(demuxer.audio_stream_index, num_packets=64):
    ///             muxer.write(0, packets)
    fn add_remux_stream(&self, py: Python<'_>, codec: &Bound<'_, PyAny>) -> PyResult<()> {
        let codec = codec_from(codec)?;
        self.with(py, |m| m.add_remux_stream(&codec)).map(drop)
    }

    /// Opens the output and writes the container's header; returns the muxer (for ``with muxer.open():``).
    ///
    /// Args:
    ///     muxer_config: Options of the output protocol and of the muxer (``ffmpeg -h muxer=NAME``; e.g.
    ///         ``{"movflags": "+faststart"}`` for MP4, ``{"listen": "1"}`` for an RTMP server). An option
    ///         neither takes is an error.
    #[pyo3(signature = (muxer_config=None))]
    fn open<'py>(slf: &Bound<'py, Self>, muxer_config: Option<&Bound<'py, PyAny>>) -> PyResult<Bound<'py, Self>> {
        let options = str_options("muxer_config", muxer_config)?;
        slf.get().with(slf.py(), |m| m.open(&options))?;
        Ok(slf.clone())
    }

    /// Writes packets to one stream (the packets stay usable).
    ///
    /// Args:
    ///     stream_index: The stream, in the order the streams were added (from 0).
    ///     packets: Packets of that stream's codec: from its encoder, or demuxed (remux streams). Their
    ///         timestamps are rescaled from their codec's time base to the stream's.
    fn write(&self, py: Python<'_>, stream_index: Int, packets: &Bound<'_, PyAny>) -> PyResult<()> {
        let index = args::int_in("stream_index", &stream_index, 0, i64::from(u32::MAX))? as usize;
        let p = packets_state(packets)?.cloned()?;
        self.with(py, |m| m.write(index, &p))
    }

    /// Writes the packets FFmpeg still holds to interleave the streams (after the last :py:meth:`write`).
    fn flush(&self, py: Python<'_>) -> PyResult<()> {
        self.with(py, |m| m.flush())
    }

    /// Writes the container's trailer and closes the output. Closing again does nothing.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        self.with(py, |m| m.close())
    }

    fn __enter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    /// Flushes and closes; when the block raised, closes without masking its exception.
    #[pyo3(signature = (exc_type, _exc=None, _tb=None))]
    fn __exit__(
        &self,
        py: Python<'_>,
        exc_type: Option<&Bound<'_, PyAny>>,
        _exc: Option<&Bound<'_, PyAny>>,
        _tb: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        if exc_type.is_none_or(|t| t.is_none()) {
            self.flush(py)?;
            return self.close(py);
        }
        // The block's exception is the one to see.
        let _ = self.close(py);
        Ok(())
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let dst = pyo3::types::PyString::new(py, &self.dst).repr()?;
        Ok(format!("Muxer({dst}, num_streams={})", lock(&self.inner).num_streams()))
    }
}
