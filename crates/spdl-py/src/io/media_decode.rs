//! SPDL's decoding API (feature `ffmpeg`) with SPDL's names, signatures, defaults and errors: `Decoder` (an
//! `AudioDecoder` or `VideoDecoder`), `decode_packets`, `convert_frames`, `sample_decode_video` and frames made
//! from arrays, and the filter graphs SPDL's `filter_desc` stands for. The demuxing half is
//! [`super::media_api`].

use std::sync::Mutex;

use pyo3::exceptions::{PyIndexError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use spdl_buffer::system_allocator;
use spdl_io::media::{
    Codec, Decoder as MediaDecoder, MediaFrames, MediaType, convert_frames as convert_frames_rs, decode_all,
    reference_audio_frame as reference_audio_frame_rs, reference_video_frames,
};

use super::io_err;
use super::media::{
    PyAudioFrames, PyAudioPackets, PyImagePackets, PyVideoFrames, PyVideoPackets, codec_from, frames_cell,
    frames_object, limits_from, lock, packets_state,
};
use super::media_api::{FILTER_DESC_DEFAULT, PyDecodeConfig, default_filter};
use crate::args;
use crate::buffer::PyBuffer;

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
