//! SPDL's encoding and muxing objects (feature `ffmpeg`), over spdl-io's `media` module: the encode
//! configurations, a native `MediaMuxer` (which `spdl_rs.io.Muxer` wraps) and the `AudioEncoder` and
//! `VideoEncoder` it hands out. Every call that opens an encoder, encodes, writes or closes releases the GIL;
//! every object is safe to share between threads (calls on one object run one at a time, behind a lock that
//! is never held while Python runs).

use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard, PoisonError};

use pyo3::exceptions::{
    PyFileNotFoundError, PyIsADirectoryError, PyOSError, PyPermissionError, PyTypeError, PyValueError,
};
use pyo3::prelude::*;
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
    fn new(
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
    fn new(
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

/// A container being written (``spdl_rs.io.Muxer`` wraps it): streams are added, then it is opened,
/// written, flushed and closed. Thread-safe: calls run one at a time.
#[pyclass(name = "MediaMuxer", module = "spdl_rs._native.io", frozen)]
#[derive(Debug)]
pub struct PyMediaMuxer {
    inner: Mutex<Muxer>,
    dst: String,
}

impl PyMediaMuxer {
    fn with<T: Send>(&self, py: Python<'_>, f: impl FnOnce(&mut Muxer) -> spdl_io::Result<T> + Send) -> PyResult<T> {
        crate::lifecycle::detach(py, || f(&mut lock(&self.inner))).map_err(mux_err)
    }
}

#[pymethods]
impl PyMediaMuxer {
    /// A muxer writing ``dst`` (a path, or a URL FFmpeg writes to) in container ``format`` (an FFmpeg muxer
    /// name; ``None``: from ``dst``'s extension). Nothing is written before :py:meth:`open`.
    #[new]
    #[pyo3(signature = (dst, *, format=None))]
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

    /// Adds a stream encoded from frames: an ``AudioEncoder`` for an ``AudioEncodeConfig``, a
    /// ``VideoEncoder`` for a ``VideoEncodeConfig``. ``encoder``: by name (``ffmpeg -encoders``; default:
    /// the container's); ``encoder_config``: its options (``ffmpeg -h encoder=NAME``).
    #[pyo3(signature = (config, *, encoder=None, encoder_config=None))]
    fn add_encode_stream(
        &self,
        py: Python<'_>,
        config: &Bound<'_, PyAny>,
        encoder: Option<String>,
        encoder_config: Option<std::collections::BTreeMap<String, String>>,
    ) -> PyResult<Py<PyAny>> {
        let choice = EncoderChoice { encoder, options: encoder_config.unwrap_or_default().into_iter().collect() };
        if let Ok(c) = config.cast::<PyAudioEncodeConfig>() {
            let config = c.get().config.clone();
            let enc = self.with(py, |m| m.add_audio_encode_stream(&config, &choice))?;
            let (frame_size, item) = (enc.frame_size(), enc.item().to_owned());
            return Ok(Py::new(py, PyAudioEncoder { inner: Mutex::new(enc), frame_size, item })?.into_any());
        }
        if let Ok(c) = config.cast::<PyVideoEncodeConfig>() {
            let config = c.get().config.clone();
            let enc = self.with(py, |m| m.add_video_encode_stream(&config, &choice))?;
            let item = enc.item().to_owned();
            return Ok(Py::new(py, PyVideoEncoder { inner: Mutex::new(enc), item })?.into_any());
        }
        Err(PyTypeError::new_err(format!(
            "add_encode_stream takes an AudioEncodeConfig or a VideoEncodeConfig (audio_encode_config(...), \
             video_encode_config(...)), got {}",
            config.get_type().name()?
        )))
    }

    /// Adds a stream for packets of ``codec`` copied as they are (no re-encoding): its index.
    fn add_remux_stream(&self, py: Python<'_>, codec: &Bound<'_, PyAny>) -> PyResult<usize> {
        let codec = codec_from(codec)?;
        self.with(py, |m| m.add_remux_stream(&codec))
    }

    /// Opens the output and writes the header; ``muxer_config``: options of the output protocol and the muxer.
    #[pyo3(signature = (muxer_config=None))]
    fn open(&self, py: Python<'_>, muxer_config: Option<std::collections::BTreeMap<String, String>>) -> PyResult<()> {
        let options: Vec<(String, String)> = muxer_config.unwrap_or_default().into_iter().collect();
        self.with(py, |m| m.open(&options))
    }

    /// Writes ``packets`` (not consumed) to stream ``stream_index``, their timestamps rescaled to the stream's.
    fn write(&self, py: Python<'_>, stream_index: Int, packets: &Bound<'_, PyAny>) -> PyResult<()> {
        let index = args::int_in("stream_index", &stream_index, 0, i64::from(u32::MAX))? as usize;
        let p = packets_state(packets)?.cloned()?;
        self.with(py, |m| m.write(index, &p))
    }

    /// Writes what the interleaving still holds.
    fn flush(&self, py: Python<'_>) -> PyResult<()> {
        self.with(py, |m| m.flush())
    }

    /// Writes the trailer and closes the output (later calls do nothing; later writes raise).
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        self.with(py, |m| m.close())
    }

    fn __repr__(&self) -> String {
        format!("MediaMuxer<dst={:?}, num_streams={}>", self.dst, lock(&self.inner).num_streams())
    }
}
