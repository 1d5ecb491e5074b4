//! `spdl_rs.io` audio: `load_audio`, `load_audio_batch`, `probe` and their native ops, over spdl-io's
//! pure-Rust audio decoders (symphonia, with FFmpeg as the fallback in a build with the `ffmpeg` feature).
//! Every function releases the GIL for the whole decode.

use std::sync::Arc;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use spdl_buffer::system_allocator;
use spdl_io::audio::{
    Audio, AudioBackend, AudioBatch, AudioBatchOptions, AudioLayout, AudioLimits, AudioOptions, ChannelSelect,
    SampleType, decode_audio, decode_audio_batch,
};
use spdl_io::{MediaInput, TimeWindow};

use super::options::{KeywordOptions, missing};
use super::{Src, buffer_result, io_err, log_failures, media_src, src_from_value};
use crate::error::Error;
use crate::pipeline::{NativeOp, PyNativeOp};
use crate::value::Value;

impl Src {
    /// The spdl-io view of this source.
    pub(super) fn media(&self) -> MediaInput<'_> {
        match self {
            Src::Path(p) => MediaInput::Path(p.as_path()),
            Src::Bytes(name, data) => MediaInput::bytes(data, name),
        }
    }
}

/// `start`/`duration` in seconds as a window (`None` when both are `None`).
pub(super) fn window(start: Option<f64>, duration: Option<f64>) -> Option<TimeWindow> {
    match (start, duration) {
        (None, None) => None,
        (start, duration) => Some(TimeWindow { start_s: start.unwrap_or(0.0), duration_s: duration }),
    }
}

/// `None`/`"all"`, `"mono"`, or a sequence of source channel indices.
fn channels(spec: Option<&Bound<'_, PyAny>>) -> PyResult<ChannelSelect> {
    let Some(spec) = spec.filter(|s| !s.is_none()) else { return Ok(ChannelSelect::All) };
    if let Ok(name) = spec.extract::<String>() {
        return match name.to_ascii_lowercase().as_str() {
            "all" => Ok(ChannelSelect::All),
            "mono" => Ok(ChannelSelect::Mono),
            other => Err(PyValueError::new_err(format!(
                "channels must be None, \"mono\" or a list of channel indices, got {other:?}"
            ))),
        };
    }
    spec.extract::<Vec<usize>>().map(ChannelSelect::Pick).map_err(|_| {
        PyValueError::new_err(format!("channels must be None, \"mono\" or a list of channel indices, got {spec}"))
    })
}

fn sample_type(dtype: &str) -> PyResult<SampleType> {
    match dtype.to_ascii_lowercase().as_str() {
        "float32" | "f32" => Ok(SampleType::F32),
        "int16" | "i16" => Ok(SampleType::I16),
        other => Err(PyValueError::new_err(format!("dtype must be \"float32\" or \"int16\", got {other:?}"))),
    }
}

fn audio_layout(name: &str) -> PyResult<AudioLayout> {
    match name.to_ascii_lowercase().as_str() {
        "channels_first" | "ct" => Ok(AudioLayout::ChannelsFirst),
        "interleaved" | "channels_last" | "tc" => Ok(AudioLayout::Interleaved),
        other => {
            Err(PyValueError::new_err(format!("layout must be \"channels_first\" or \"interleaved\", got {other:?}")))
        }
    }
}

fn backend(name: &str) -> PyResult<AudioBackend> {
    match name.to_ascii_lowercase().as_str() {
        "auto" => Ok(AudioBackend::Auto),
        "symphonia" => Ok(AudioBackend::Symphonia),
        "ffmpeg" => Ok(AudioBackend::Ffmpeg),
        other => {
            Err(PyValueError::new_err(format!("backend must be \"auto\", \"symphonia\" or \"ffmpeg\", got {other:?}")))
        }
    }
}

/// `None` or a dict overriding some of [`AudioLimits`]' fields (unknown keys are an error).
fn limits(spec: Option<&Bound<'_, PyDict>>) -> PyResult<AudioLimits> {
    let mut l = AudioLimits::default();
    let Some(spec) = spec else { return Ok(l) };
    for (key, value) in spec.iter() {
        let key: String = key.extract()?;
        match key.as_str() {
            "max_samples" => l.max_samples = value.extract()?,
            "max_packets" => l.max_packets = value.extract()?,
            "max_channels" => l.max_channels = value.extract()?,
            "max_sample_rate" => l.max_sample_rate = value.extract()?,
            "max_bad_packets" => l.max_bad_packets = value.extract()?,
            other => {
                return Err(PyValueError::new_err(format!(
                    "unknown audio limit {other:?} (max_samples, max_packets, max_channels, max_sample_rate, \
                     max_bad_packets)"
                )));
            }
        }
    }
    Ok(l)
}

keyword_options! {
    /// The options of `load_audio` and its op.
    struct AudioArgs {
        start: Option<f64> = None,
        duration: Option<f64> = None,
        sample_rate: Option<u32> = None,
        channels: Option<Py<PyAny>> as "str | Sequence[int] | None" = None,
        dtype: String as "Literal[\"float32\", \"int16\"]" = "float32".to_owned(),
        layout: String as "Literal[\"channels_first\", \"interleaved\"]" = "channels_first".to_owned(),
        num_samples: Option<usize> = None,
        backend: String as "Literal[\"auto\", \"symphonia\", \"ffmpeg\"]" = "auto".to_owned(),
        limits: Option<Py<PyDict>> as "dict[str, int] | None" = None,
    }
}

impl AudioArgs {
    /// The spdl-io options (validated).
    fn options(&self, py: Python<'_>) -> PyResult<AudioOptions> {
        let opts = AudioOptions {
            window: window(self.start, self.duration),
            sample_rate: self.sample_rate,
            channels: channels(self.channels.as_ref().map(|c| c.bind(py)))?,
            sample_type: sample_type(&self.dtype)?,
            layout: audio_layout(&self.layout)?,
            num_frames: self.num_samples,
            backend: backend(&self.backend)?,
            limits: limits(self.limits.as_ref().map(|l| l.bind(py)))?,
        };
        opts.validate().map_err(io_err)?;
        Ok(opts)
    }

    /// The options of a call of `func` with keyword `options`, as spdl-io options.
    fn from_call(py: Python<'_>, func: &str, options: Option<&Bound<'_, PyDict>>) -> PyResult<AudioOptions> {
        Self::from_kwargs(func, options)?.options(py)
    }
}

keyword_options! {
    /// The options of `load_audio_batch` and its op: a clip's (`num_samples` required) and the batch's.
    struct AudioBatchArgs [audio: AudioArgs] {
        strict: bool = true,
        num_threads: Option<usize> = None,
    }
}

impl AudioBatchArgs {
    /// The spdl-io options of a call of `func` with keyword `options`; `num_threads=None` means
    /// `default_threads`.
    fn from_call(
        py: Python<'_>,
        func: &str,
        options: Option<&Bound<'_, PyDict>>,
        default_threads: Option<usize>,
    ) -> PyResult<AudioBatchOptions> {
        let args = Self::from_kwargs(func, options)?;
        let num_samples = args.audio.num_samples.ok_or_else(|| missing(func, "num_samples"))?;
        let threads = args.num_threads.or(default_threads);
        if threads == Some(0) {
            return Err(PyValueError::new_err("num_threads must be at least 1"));
        }
        // Validated with the clip length; each clip is decoded whole, then padded or truncated.
        let mut audio = args.audio.options(py)?;
        audio.num_frames = None;
        Ok(AudioBatchOptions { audio, num_frames: num_samples, strict: args.strict, threads })
    }
}

fn clip_info<'py>(py: Python<'py>, a: &Audio) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("sample_rate", a.sample_rate)?;
    d.set_item("num_samples", a.frames)?;
    d.set_item("start", a.start_s)?;
    d.set_item("codec", &a.source.codec)?;
    d.set_item("container", &a.source.container)?;
    d.set_item("source_sample_rate", a.source.sample_rate)?;
    d.set_item("source_channels", a.source.channels)?;
    Ok(d)
}

fn failure_list<'py>(py: Python<'py>, failures: &[(usize, String, String)]) -> PyResult<Bound<'py, PyList>> {
    PyList::new(py, failures)
}

fn batch_failures(batch: &AudioBatch) -> super::FailedItems {
    batch.failures.iter().map(crate::error::batch_failure).collect()
}

/// Decodes one audio clip (a path or encoded bytes) into a :py:class:`spdl_rs.Buffer` (GIL released), no copy:
/// ``[C, T]`` (``layout="channels_first"``) or ``[T, C]`` (``"interleaved"``), ``float32`` in ``[-1, 1]`` or
/// ``int16``.
///
/// WAV (PCM/float, read straight from the file), FLAC, MP3, Ogg Vorbis, AAC (ADTS, MP4/M4A) and MKV/WebM
/// audio decode in Rust (symphonia); in a build with video support FFmpeg reads the rest (audio tracks of
/// videos, Opus, ...).
///
/// Args:
///     src: A path (``str`` or ``os.PathLike``) or encoded bytes (``bytes``, ``bytearray``, ``memoryview``).
///     start: Window start in seconds (the decoder seeks to it when the container allows).
///     duration: Window length in seconds (``None``: to the end).
///     sample_rate: Output rate in Hz (``None``: the source's); FFT resampling, output length
///         ``ceil(frames * out / in)``.
///     channels: ``None`` (all, in order), ``"mono"`` (mean of all channels) or a list of source channel
///         indices (repeats allowed, e.g. ``[0, 0]``).
///     dtype: ``"float32"`` or ``"int16"``.
///     layout: ``"channels_first"`` or ``"interleaved"``.
///     num_samples: Pad with zeros or truncate to exactly this many samples per channel.
///     backend: ``"auto"``, ``"symphonia"`` or ``"ffmpeg"`` (video builds only).
///     limits: Overrides of the decoding bounds (``max_samples``, ``max_packets``, ``max_channels``,
///         ``max_sample_rate``, ``max_bad_packets``).
///     name: The name of ``src`` in error messages when it is bytes (its extension is a format hint).
///     return_info: Also return a dict: ``sample_rate``, ``num_samples`` (samples decoded, before padding),
///         ``start`` (seconds), ``codec``, ``container``, ``source_sample_rate``, ``source_channels``.
///
/// Raises:
///     OSError: The file cannot be read.
///     ValueError: Invalid options (e.g. a channel the file does not have).
///     RuntimeError: The input is empty, corrupt, in an unknown format or over a limit; the message names it.
pub(crate) fn load_audio(
    py: Python<'_>,
    src: &Bound<'_, PyAny>,
    name: Option<&str>,
    return_info: bool,
    options: Option<&Bound<'_, PyDict>>,
) -> PyResult<Py<PyAny>> {
    let opts = AudioArgs::from_call(py, "load_audio", options)?;
    let src = media_src(src, name)?;
    let audio =
        super::interruptible(py, move || decode_audio(src.media(), &opts, &system_allocator()))?.map_err(io_err)?;
    let info = if return_info { Some(clip_info(py, &audio)?) } else { None };
    buffer_result(py, audio.buffer, info)
}

/// Decodes a batch of clips into one :py:class:`spdl_rs.Buffer` ``[N, C, T]`` (or ``[N, T, C]``), each clip padded with
/// zeros or truncated to ``num_samples``, in parallel, GIL released. Keyword arguments as
/// :py:func:`load_audio`.
///
/// The channel count is fixed by ``channels`` (``"mono"``, a list) or by the first clip that decodes; the rate
/// by ``sample_rate`` or the first clip. A clip that does not match fails.
///
/// Args:
///     srcs: Paths or encoded bytes (bytes are named ``<bytes #i>`` in errors).
///     num_samples: Samples per channel of every clip.
///     strict: ``True``: any failed clip raises (the message names its index and file). ``False``: failed
///         slots stay zero, each failure is logged on the ``spdl_rs.io`` logger and listed in the info.
///     num_threads: Decoding threads (``None``: all cores).
///     return_info: Also return a dict: ``sample_rate``, ``num_samples`` (per clip, samples decoded before
///         padding) and ``failures`` (``(index, item, message)`` tuples).
#[pyfunction]
#[pyo3(signature = (srcs, *, return_info=false, **options: "Unpack[AudioBatchArgs]") -> "Buffer | tuple[Buffer, dict[str, Any]]")]
pub(crate) fn load_audio_batch(
    py: Python<'_>,
    srcs: Vec<Bound<'_, PyAny>>,
    return_info: bool,
    options: Option<&Bound<'_, PyDict>>,
) -> PyResult<Py<PyAny>> {
    let opts = AudioBatchArgs::from_call(py, "load_audio_batch", options, None)?;
    let srcs = srcs.iter().enumerate().map(|(i, s)| super::src_from_py(s, i)).collect::<PyResult<Vec<_>>>()?;
    let batch = super::interruptible(py, move || {
        let inputs: Vec<MediaInput<'_>> = srcs.iter().map(Src::media).collect();
        decode_audio_batch(&inputs, &opts, &system_allocator())
    })?
    .map_err(io_err)?;
    let failures = batch_failures(&batch);
    log_failures(py, "load_audio_batch", &failures);
    let info = if return_info {
        let info = PyDict::new(py);
        info.set_item("sample_rate", batch.sample_rate)?;
        info.set_item("num_samples", &batch.frames)?;
        info.set_item("failures", failure_list(py, &failures)?)?;
        Some(info)
    } else {
        None
    };
    buffer_result(py, batch.buffer, info)
}

/// What a media file holds, from its headers only (no decoding): a dict with ``item``, ``format``
/// (container), ``prober`` (``"ffmpeg"``, ``"symphonia"`` or ``"image"``), ``size_bytes``, ``duration_s``,
/// ``bit_rate`` and ``streams`` (one dict per stream: ``index``, ``kind`` (``"audio"``, ``"video"``,
/// ``"image"``, ``"subtitle"``, ``"other"``), ``codec``, and where known ``duration_s``, ``start_s``,
/// ``num_frames``, ``bit_rate``, ``width``, ``height``, ``frame_rate``, ``pixel_format``, ``sample_rate``,
/// ``channels``, ``sample_format``). Keys the file does not state are absent. GIL released.
///
/// Without video support only images and audio formats are recognised.
#[pyfunction]
#[pyo3(signature = (src, *, name=None) -> "dict[str, Any]")]
pub(crate) fn probe(py: Python<'_>, src: &Bound<'_, PyAny>, name: Option<&str>) -> PyResult<Py<PyAny>> {
    let src = media_src(src, name)?;
    let info = crate::lifecycle::detach(py, || spdl_io::probe(src.media())).map_err(io_err)?;
    let json = serde_json::to_string(&info)
        .map_err(|e| PyValueError::new_err(format!("{}: cannot describe the media info: {e}", info.item)))?;
    Ok(py.import("json")?.call_method1("loads", (json,))?.unbind())
}

const AUDIO_INPUT: &str = "a path (str) or encoded bytes";
const AUDIO_BATCH_INPUT: &str = "a list of paths or encoded bytes (aggregate first)";

#[derive(Debug)]
struct LoadAudioOp {
    opts: AudioOptions,
}

impl NativeOp for LoadAudioOp {
    fn name(&self) -> &str {
        "load_audio"
    }
    fn expects(&self) -> &'static str {
        AUDIO_INPUT
    }
    fn call(&self, stage: &str, input: Value) -> Result<Vec<Value>, Error> {
        let src = src_from_value(input, stage, self.name(), AUDIO_INPUT, 0)?;
        let audio = decode_audio(src.media(), &self.opts, &system_allocator())
            .map_err(|e| Error::native(stage, self.name(), src.name(), e))?;
        Ok(vec![Value::Buffer(Arc::new(audio.buffer))])
    }
}

#[derive(Debug)]
struct AudioBatchOp {
    opts: AudioBatchOptions,
}

impl NativeOp for AudioBatchOp {
    fn name(&self) -> &str {
        "load_audio_batch"
    }
    fn expects(&self) -> &'static str {
        AUDIO_BATCH_INPUT
    }
    fn call(&self, stage: &str, input: Value) -> Result<Vec<Value>, Error> {
        let Value::List(items) = input else {
            return Err(Error::wrong_input(stage, self.name(), input.describe(), AUDIO_BATCH_INPUT));
        };
        let n = items.len();
        let srcs = items
            .into_iter()
            .enumerate()
            .map(|(i, v)| src_from_value(v, stage, self.name(), AUDIO_BATCH_INPUT, i))
            .collect::<Result<Vec<_>, _>>()?;
        let inputs: Vec<MediaInput<'_>> = srcs.iter().map(Src::media).collect();
        let batch = decode_audio_batch(&inputs, &self.opts, &system_allocator())
            .map_err(|e| Error::native(stage, self.name(), format!("a batch of {n}"), e))?;
        let failures = batch_failures(&batch);
        if !failures.is_empty() {
            // Rare (non-strict batches only): the GIL is taken just to log them.
            crate::pipeline::tstate::attach(|py| log_failures(py, stage, &failures));
        }
        Ok(vec![Value::Buffer(Arc::new(batch.buffer))])
    }
}

/// Native op: decodes each item (a path or encoded bytes) into a ``[C, T]`` (or ``[T, C]``) buffer, without
/// the GIL. Arguments as :py:func:`spdl_rs.io.load_audio`.
#[pyfunction]
#[pyo3(signature = (**options: "Unpack[AudioArgs]"))]
pub(crate) fn load_audio_op(py: Python<'_>, options: Option<&Bound<'_, PyDict>>) -> PyResult<PyNativeOp> {
    let opts = AudioArgs::from_call(py, "load_audio_op", options)?;
    Ok(PyNativeOp { op: Arc::new(LoadAudioOp { opts }) })
}

/// Native op: decodes each item (a list of paths or encoded bytes, e.g. after ``aggregate(16)``) into one
/// ``[N, C, T]`` buffer, without the GIL. Arguments as :py:func:`spdl_rs.io.load_audio_batch`;
/// ``num_threads`` (``None``) means 1 here (the stage's ``concurrency`` gives the parallelism).
#[pyfunction]
#[pyo3(signature = (**options: "Unpack[AudioBatchArgs]"))]
pub(crate) fn load_audio_batch_op(py: Python<'_>, options: Option<&Bound<'_, PyDict>>) -> PyResult<PyNativeOp> {
    let opts = AudioBatchArgs::from_call(py, "load_audio_batch_op", options, Some(1))?;
    Ok(PyNativeOp { op: Arc::new(AudioBatchOp { opts }) })
}
