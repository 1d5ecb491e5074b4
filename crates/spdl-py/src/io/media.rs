//! SPDL's media objects (feature `ffmpeg`), over spdl-io's `media` module: the codecs, packets and frames
//! classes, `FilterGraph`, and the helpers that turn them into Python objects and back. The functions and
//! classes that demux, decode and convert them with SPDL's signatures are in [`super::media_api`] and
//! [`super::media_decode`]. Every call
//! that demuxes, decodes, filters or copies releases the GIL; every object is safe to share between threads
//! (its mutable state sits behind a lock that is never held while Python runs).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use pyo3::exceptions::{PyIndexError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PySlice, PyString};
use spdl_io::media::{Codec, FilterGraph, MediaFrames, MediaPackets, MediaType};
use spdl_io::video::VideoLimits;

use super::io_err;
use crate::args::{self, Int};

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn fmt_window(w: Option<(f64, f64)>) -> String {
    match w {
        None => "None".into(),
        Some((s, e)) => format!("({s}, {e})"),
    }
}

/// `None` or a dict overriding some of [`VideoLimits`]' fields.
pub(super) fn limits_from(spec: Option<&Bound<'_, PyDict>>) -> PyResult<VideoLimits> {
    let mut l = VideoLimits::default();
    let Some(spec) = spec else { return Ok(l) };
    for (key, value) in spec.iter() {
        let key: String = key.extract()?;
        // Caps, checked as they are reached: never allocated from.
        let cap = |max: u64| -> PyResult<u64> {
            args::size_bytes(&format!("limits[{key:?}]"), &value.extract::<Int>()?, 0, max)
        };
        match key.as_str() {
            "max_packets" => l.max_packets = cap(u64::MAX)?,
            "max_packet_bytes" => l.max_packet_bytes = cap(u64::MAX)?,
            "max_frames" => l.max_frames = cap(u64::MAX)?,
            "max_pixels" => l.max_pixels = cap(u64::MAX)?,
            "max_output_bytes" => l.max_output_bytes = cap(u64::MAX)?,
            "max_bad_packets" => l.max_bad_packets = cap(u64::from(u32::MAX))? as u32,
            other => {
                return Err(PyValueError::new_err(format!(
                    "unknown limit {other:?} (max_packets, max_packet_bytes, max_frames, max_pixels, \
                     max_output_bytes, max_bad_packets)"
                )));
            }
        }
    }
    Ok(l)
}

// ---------------------------------------------------------------------------------------------- codecs

/// The codec of an audio stream (SPDL's ``AudioCodec``).
#[pyclass(name = "AudioCodec", module = "spdl_rs._native.io", frozen)]
#[derive(Debug)]
pub struct PyAudioCodec {
    pub(crate) codec: Codec,
}

#[pymethods]
impl PyAudioCodec {
    /// The codec's name (``"aac"``, ...).
    #[getter]
    fn name(&self) -> &str {
        &self.codec.name
    }
    /// Samples per second.
    #[getter]
    fn sample_rate(&self) -> u32 {
        self.codec.sample_rate
    }
    /// Channels.
    #[getter]
    fn num_channels(&self) -> u32 {
        self.codec.num_channels
    }
    /// The sample format (``"fltp"``, ...).
    #[getter]
    fn sample_fmt(&self) -> &str {
        &self.codec.sample_fmt
    }
    /// Time base of the timestamps, ``(numerator, denominator)``.
    #[getter]
    fn time_base(&self) -> (i32, i32) {
        self.codec.time_base
    }
    /// The channel layout (``"mono"``, ``"stereo"``, ...).
    #[getter]
    fn channel_layout(&self) -> &str {
        &self.codec.channel_layout
    }
    fn __repr__(&self) -> String {
        format!(
            "AudioCodec<name={}, sample_rate={}, num_channels={}, sample_fmt={}>",
            self.codec.name, self.codec.sample_rate, self.codec.num_channels, self.codec.sample_fmt
        )
    }
}

/// The codec of a video stream (SPDL's ``VideoCodec``).
#[pyclass(name = "VideoCodec", module = "spdl_rs._native.io", frozen)]
#[derive(Debug)]
pub struct PyVideoCodec {
    pub(crate) codec: Codec,
}

/// The codec of an image (SPDL's ``ImageCodec``).
#[pyclass(name = "ImageCodec", module = "spdl_rs._native.io", frozen)]
#[derive(Debug)]
pub struct PyImageCodec {
    pub(crate) codec: Codec,
}

macro_rules! picture_codec {
    ($ty:ident, $label:literal { $($extra:tt)* }) => {
        #[pymethods]
        impl $ty {
            $($extra)*
            /// The codec's name (``"h264"``, ...).
            #[getter]
            fn name(&self) -> &str {
                &self.codec.name
            }
            /// Width in pixels.
            #[getter]
            fn width(&self) -> u32 {
                self.codec.width
            }
            /// Height in pixels.
            #[getter]
            fn height(&self) -> u32 {
                self.codec.height
            }
            /// The pixel format (``"yuv420p"``, ...).
            #[getter]
            fn pix_fmt(&self) -> &str {
                &self.codec.pix_fmt
            }
            /// Time base of the timestamps, ``(numerator, denominator)``.
            #[getter]
            fn time_base(&self) -> (i32, i32) {
                self.codec.time_base
            }
            /// Aspect ratio of one pixel, ``(width, height)``.
            #[getter]
            fn sample_aspect_ratio(&self) -> (i32, i32) {
                self.codec.sample_aspect_ratio
            }
            fn __repr__(&self) -> String {
                format!(
                    "{}<name={}, width={}, height={}, pix_fmt={}>",
                    $label, self.codec.name, self.codec.width, self.codec.height, self.codec.pix_fmt
                )
            }
        }
    };
}
picture_codec!(PyVideoCodec, "VideoCodec" {
    /// Average frame rate, ``(numerator, denominator)``.
    #[getter]
    fn frame_rate(&self) -> (i32, i32) {
        self.codec.frame_rate
    }
});
picture_codec!(PyImageCodec, "ImageCodec" {});

pub(super) fn codec_object(py: Python<'_>, codec: Codec) -> PyResult<Py<PyAny>> {
    Ok(match codec.kind {
        MediaType::Audio => Py::new(py, PyAudioCodec { codec })?.into_any(),
        MediaType::Video => Py::new(py, PyVideoCodec { codec })?.into_any(),
        MediaType::Image => Py::new(py, PyImageCodec { codec })?.into_any(),
    })
}

/// The codec behind any of the three codec classes.
pub(super) fn codec_from(obj: &Bound<'_, PyAny>) -> PyResult<Codec> {
    if let Ok(c) = obj.cast::<PyAudioCodec>() {
        return Ok(c.get().codec.clone());
    }
    if let Ok(c) = obj.cast::<PyVideoCodec>() {
        return Ok(c.get().codec.clone());
    }
    if let Ok(c) = obj.cast::<PyImageCodec>() {
        return Ok(c.get().codec.clone());
    }
    Err(PyTypeError::new_err(format!("expected AudioCodec, VideoCodec or ImageCodec, got {}", obj.get_type().name()?)))
}

// --------------------------------------------------------------------------------------------- packets

/// What every packets class holds: the packets (taken out by a decode) and their metadata.
#[derive(Debug)]
pub(crate) struct PacketsState {
    packets: Mutex<Option<MediaPackets>>,
    item: String,
    codec: Codec,
    len: usize,
    nbytes: usize,
    window: Option<(f64, f64)>,
}

impl PacketsState {
    fn new(p: MediaPackets) -> Self {
        Self {
            item: p.item.clone(),
            codec: p.codec.clone(),
            len: p.len(),
            nbytes: p.bytes(),
            window: p.window,
            packets: Mutex::new(Some(p)),
        }
    }

    /// The error of packets used after a decode consumed them: a `TypeError`, as SPDL raises.
    fn spent(&self) -> PyErr {
        pyo3::exceptions::PyTypeError::new_err(format!(
            "{}: these packets were already decoded (decoding consumes them; use .clone() to decode twice)",
            self.item
        ))
    }

    /// Takes the packets out (a decode consumes them).
    pub(crate) fn take(&self) -> PyResult<MediaPackets> {
        lock(&self.packets).take().ok_or_else(|| self.spent())
    }

    pub(crate) fn cloned(&self) -> PyResult<MediaPackets> {
        lock(&self.packets).as_ref().cloned().ok_or_else(|| self.spent())
    }

    fn timestamps(&self, raw: bool) -> PyResult<Vec<f64>> {
        Ok(lock(&self.packets).as_ref().ok_or_else(|| self.spent())?.timestamps(raw))
    }
}

/// CPython's `Py_buffer` (the same layout in every CPython 3), and the two calls that fill and release it:
/// exported by every CPython 3, declared here because the stable ABI this module builds against has them
/// only from Python 3.11.
mod raw_buffer {
    use std::ffi::{c_char, c_int, c_void};

    use pyo3::ffi::PyObject;

    #[repr(C)]
    pub(super) struct PyBufferView {
        pub(super) buf: *mut c_void,
        obj: *mut PyObject,
        pub(super) len: isize,
        itemsize: isize,
        readonly: c_int,
        ndim: c_int,
        format: *mut c_char,
        shape: *mut isize,
        strides: *mut isize,
        suboffsets: *mut isize,
        internal: *mut c_void,
    }

    impl PyBufferView {
        pub(super) fn empty() -> Self {
            // SAFETY: every field is a pointer or an integer, for which all-zero is a valid value.
            unsafe { std::mem::zeroed() }
        }
    }

    unsafe extern "C" {
        pub(super) fn PyObject_GetBuffer(obj: *mut PyObject, view: *mut PyBufferView, flags: c_int) -> c_int;
        pub(super) fn PyBuffer_Release(view: *mut PyBufferView);
    }
}

/// Memory of a Python buffer (``bytes``, a ``memoryview`` of shared memory, ...) that packets made by
/// ``deserialize_view`` point into: holding it keeps the buffer exported, so its memory stays put.
struct ViewedBuffer(Box<raw_buffer::PyBufferView>);

// SAFETY: the view only holds the exporter's memory and a reference to it; the memory is read from any thread
// (it is not written while exported: the caller's contract), and the export is released with the GIL held.
unsafe impl Send for ViewedBuffer {}
// SAFETY: as above: shared references only read the memory.
unsafe impl Sync for ViewedBuffer {}

impl AsRef<[u8]> for ViewedBuffer {
    fn as_ref(&self) -> &[u8] {
        if self.0.len == 0 || self.0.buf.is_null() {
            return &[];
        }
        // SAFETY: a simple (C-contiguous) export of `len` bytes at `buf`, held while `self` lives.
        unsafe { std::slice::from_raw_parts(self.0.buf.cast::<u8>(), self.0.len as usize) }
    }
}

impl Drop for ViewedBuffer {
    fn drop(&mut self) {
        // Without an interpreter to attach to (it has finalized), its memory is gone with it: nothing to release.
        let _ = Python::try_attach(|_| {
            // SAFETY: the view was filled by `PyObject_GetBuffer` and not released yet; the GIL is held.
            unsafe { raw_buffer::PyBuffer_Release(&raw mut *self.0) }
        });
    }
}

/// The contiguous bytes of Python buffer `data`, held exported.
fn viewed(data: &Bound<'_, PyAny>) -> PyResult<ViewedBuffer> {
    let mut view = Box::new(raw_buffer::PyBufferView::empty());
    // SAFETY: `data` is a live object and the GIL is held; flags 0 (PyBUF_SIMPLE) asks for contiguous bytes.
    if unsafe { raw_buffer::PyObject_GetBuffer(data.as_ptr(), &raw mut *view, 0) } != 0 {
        let cause = PyErr::take(data.py()).map(|e| e.to_string()).unwrap_or_default();
        return Err(PyTypeError::new_err(format!(
            "serialized packets must be bytes-like (bytes, bytearray, a contiguous memoryview), got {}: {cause}",
            data.get_type().name().map(|n| n.to_string()).unwrap_or_default()
        )));
    }
    Ok(ViewedBuffer(view))
}

/// Packets of `kind` from the bytes of `data` (what ``__getstate__`` returned): copied, or (``view``)
/// pointing into `data`, which they keep alive.
fn packets_from_state(py: Python<'_>, data: &Bound<'_, PyAny>, kind: MediaType, view: bool) -> PyResult<MediaPackets> {
    let buf = viewed(data)?;
    let packets = if view {
        let keeper: spdl_io::media::SharedBytes = std::sync::Arc::new(buf);
        crate::lifecycle::detach(py, move || MediaPackets::deserialize_view(keeper))
    } else {
        crate::lifecycle::detach(py, || MediaPackets::deserialize(buf.as_ref()))
    }
    .map_err(io_err)?;
    if packets.codec.kind != kind {
        return Err(pyo3::exceptions::PyRuntimeError::new_err(format!(
            "Media type mismatch during deserialization: {} holds serialized {} packets, not {} packets",
            packets.item,
            packets.codec.kind.name(),
            kind.name()
        )));
    }
    Ok(packets)
}

macro_rules! packets_class {
    ($ty:ident, $name:literal, $kind:expr, $doc:literal { $($extra:tt)* }) => {
        #[doc = $doc]
        #[pyclass(name = $name, module = "spdl_rs._native.io", frozen, weakref)]
        #[derive(Debug)]
        pub struct $ty {
            pub(crate) state: PacketsState,
        }

        impl $ty {
            pub(crate) fn from_packets(p: MediaPackets) -> Self {
                Self { state: PacketsState::new(p) }
            }
        }

        #[pymethods]
        impl $ty {
            $($extra)*
            /// The path or name they came from.
            #[getter]
            fn item(&self) -> &str {
                &self.state.item
            }
            /// The stream's codec.
            #[getter]
            fn codec(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
                codec_object(py, self.state.codec.clone())
            }
            /// Bytes of packet data.
            #[getter]
            fn nbytes(&self) -> usize {
                self.state.nbytes
            }
            /// True until a decode consumed them.
            #[getter]
            fn decodable(&self) -> bool {
                lock(&self.state.packets).is_some()
            }
            /// A copy that can be decoded separately (the packet data are shared, not copied).
            fn clone(&self) -> PyResult<Self> {
                Ok(Self::from_packets(self.state.cloned()?))
            }
            /// The packets as bytes (what pickling sends): codec parameters with extradata, every
            /// packet's timing, flags, side data and data (each followed by FFmpeg's zeroed padding).
            /// ``deserialize`` and ``deserialize_view`` read them back.
            fn __getstate__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, pyo3::types::PyBytes>> {
                // Attached, not through `lifecycle::detach`: serializing is a copy, and pickling often runs on
                // a thread that exits code joins (a `multiprocessing.Queue`'s feeder), which a GIL-free call
                // would park for good once the interpreter started to exit.
                let bytes = self.state.cloned()?.serialize().map_err(io_err)?;
                Ok(pyo3::types::PyBytes::new(py, &bytes))
            }
            fn __reduce__<'py>(
                slf: &Bound<'py, Self>,
            ) -> PyResult<(Bound<'py, PyAny>, (Bound<'py, pyo3::types::PyBytes>,))> {
                let state = slf.get().__getstate__(slf.py())?;
                Ok((slf.get_type().getattr("deserialize")?, (state,)))
            }
            /// Packets from the bytes that ``__getstate__`` returned (copied).
            #[staticmethod]
            fn deserialize(py: Python<'_>, data: &Bound<'_, PyAny>) -> PyResult<Self> {
                Ok(Self::from_packets(packets_from_state(py, data, $kind, false)?))
            }
            /// Packets from the bytes that ``__getstate__`` returned, without copying: they point into
            /// ``data`` (a ``memoryview`` of shared memory, say), which they keep alive; it must not be
            /// modified while they, or clones of them, are alive.
            #[staticmethod]
            fn deserialize_view(py: Python<'_>, data: &Bound<'_, PyAny>) -> PyResult<Self> {
                Ok(Self::from_packets(packets_from_state(py, data, $kind, true)?))
            }
            fn __len__(&self) -> usize {
                self.state.len
            }
            fn __repr__(&self) -> String {
                format!(
                    "{}<item={:?}, codec={:?}, num_packets={}, timestamp={}>",
                    $name,
                    self.state.item,
                    self.state.codec.name,
                    self.state.len,
                    fmt_window(self.state.window)
                )
            }
        }
    };
}

packets_class!(
    PyAudioPackets,
    "AudioPackets",
    MediaType::Audio,
    "Packets of an audio stream (SPDL's ``AudioPackets``), owned by Rust; a decode consumes them." {
    /// The window asked for when demuxing, ``(start, end)`` in seconds, or ``None``.
    #[getter]
    fn timestamp(&self) -> Option<(f64, f64)> {
        self.state.window
    }
    /// Samples per second.
    #[getter]
    fn sample_rate(&self) -> u32 {
        self.state.codec.sample_rate
    }
    /// Channels.
    #[getter]
    fn num_channels(&self) -> u32 {
        self.state.codec.num_channels
    }
    }
);
packets_class!(
    PyVideoPackets,
    "VideoPackets",
    MediaType::Video,
    "Packets of a video stream (SPDL's ``VideoPackets``; ``spdl_rs.io.Packets`` is the same class), owned by \
     Rust; a decode consumes them." {
    /// The window asked for when demuxing, ``(start, end)`` in seconds, or ``None``.
    #[getter]
    fn timestamp(&self) -> Option<(f64, f64)> {
        self.state.window
    }
    /// Presentation times (seconds) of the frames in the window, sorted (``raw``: of every packet, in
    /// packet order).
    #[pyo3(signature = (*, raw=false))]
    fn get_timestamps(&self, raw: bool) -> PyResult<Vec<f64>> {
        self.state.timestamps(raw)
    }
    /// Presentation times (seconds) of the frames in the window, sorted.
    #[getter(timestamps)]
    fn timestamps_attr(&self) -> PyResult<Vec<f64>> {
        self.state.timestamps(false)
    }
    /// The pixel format (``"yuv420p"``, ...).
    #[getter]
    fn pix_fmt(&self) -> &str {
        &self.state.codec.pix_fmt
    }
    /// Width in pixels.
    #[getter]
    fn width(&self) -> u32 {
        self.state.codec.width
    }
    /// Height in pixels.
    #[getter]
    fn height(&self) -> u32 {
        self.state.codec.height
    }
    /// Average frame rate, ``(numerator, denominator)``.
    #[getter]
    fn frame_rate(&self) -> (i32, i32) {
        self.state.codec.frame_rate
    }
    }
);
packets_class!(
    PyImagePackets,
    "ImagePackets",
    MediaType::Image,
    "The packet of an image (SPDL's ``ImagePackets``), owned by Rust; a decode consumes it." {
    /// The pixel format (``"yuvj420p"``, ...).
    #[getter]
    fn pix_fmt(&self) -> &str {
        &self.state.codec.pix_fmt
    }
    /// Width in pixels.
    #[getter]
    fn width(&self) -> u32 {
        self.state.codec.width
    }
    /// Height in pixels.
    #[getter]
    fn height(&self) -> u32 {
        self.state.codec.height
    }
    }
);

pub(super) fn packets_object(py: Python<'_>, p: MediaPackets) -> PyResult<Py<PyAny>> {
    Ok(match p.codec.kind {
        MediaType::Audio => Py::new(py, PyAudioPackets::from_packets(p))?.into_any(),
        MediaType::Video => Py::new(py, PyVideoPackets::from_packets(p))?.into_any(),
        MediaType::Image => Py::new(py, PyImagePackets::from_packets(p))?.into_any(),
    })
}

/// The state behind any of the three packets classes.
pub(super) fn packets_state<'a>(obj: &'a Bound<'_, PyAny>) -> PyResult<&'a PacketsState> {
    if let Ok(p) = obj.cast::<PyAudioPackets>() {
        return Ok(&p.get().state);
    }
    if let Ok(p) = obj.cast::<PyVideoPackets>() {
        return Ok(&p.get().state);
    }
    if let Ok(p) = obj.cast::<PyImagePackets>() {
        return Ok(&p.get().state);
    }
    Err(PyTypeError::new_err(format!(
        "expected AudioPackets, VideoPackets or ImagePackets, got {}",
        obj.get_type().name()?
    )))
}

// ---------------------------------------------------------------------------------------------- frames

/// Decoded audio frames (SPDL's ``AudioFrames``).
#[pyclass(name = "AudioFrames", module = "spdl_rs._native.io", frozen)]
#[derive(Debug)]
pub struct PyAudioFrames {
    pub(super) frames: MediaFrames,
    consumed: AtomicBool,
    /// The array reference frames were made from, kept alive with them (SPDL's reference frames do).
    #[allow(dead_code, reason = "held only to keep the array alive")]
    source: Option<Py<PyAny>>,
}

/// Decoded video frames (SPDL's ``VideoFrames``).
#[pyclass(name = "VideoFrames", module = "spdl_rs._native.io", frozen)]
#[derive(Debug)]
pub struct PyVideoFrames {
    pub(super) frames: MediaFrames,
    consumed: AtomicBool,
    /// As [`PyAudioFrames::source`].
    #[allow(dead_code, reason = "held only to keep the array alive")]
    source: Option<Py<PyAny>>,
}

/// One decoded image (SPDL's ``ImageFrames``).
#[pyclass(name = "ImageFrames", module = "spdl_rs._native.io", frozen)]
#[derive(Debug)]
pub struct PyImageFrames {
    frames: MediaFrames,
    pts: Option<f64>,
    consumed: AtomicBool,
}

/// Frames objects that `convert_frames` consumes: afterwards every use raises a `TypeError`, as in SPDL (whose
/// conversion relinquishes them). The data stay until the object is dropped.
pub(super) trait Consumable {
    fn consumed_flag(&self) -> &AtomicBool;
    fn item(&self) -> &str;
    /// `Ok` while not consumed.
    fn live(&self) -> PyResult<()> {
        if self.consumed_flag().load(Ordering::Acquire) {
            return Err(PyTypeError::new_err(format!(
                "{}: these frames were consumed by convert_frames (clone them before converting to use them again)",
                self.item()
            )));
        }
        Ok(())
    }
}

macro_rules! consumable {
    ($($ty:ty),*) => {$(
        impl Consumable for $ty {
            fn consumed_flag(&self) -> &AtomicBool {
                &self.consumed
            }
            fn item(&self) -> &str {
                &self.frames.item
            }
        }
    )*};
}
consumable!(PyAudioFrames, PyVideoFrames, PyImageFrames);

impl PyAudioFrames {
    pub(super) fn new(frames: MediaFrames) -> Self {
        Self { frames, consumed: AtomicBool::new(false), source: None }
    }

    /// Frames made from `source` (an array), which they keep alive.
    pub(super) fn with_source(frames: MediaFrames, source: Py<PyAny>) -> Self {
        Self { frames, consumed: AtomicBool::new(false), source: Some(source) }
    }
}

impl PyVideoFrames {
    pub(super) fn new(frames: MediaFrames) -> Self {
        Self { frames, consumed: AtomicBool::new(false), source: None }
    }

    /// Frames made from `source` (an array), which they keep alive.
    pub(super) fn with_source(frames: MediaFrames, source: Py<PyAny>) -> Self {
        Self { frames, consumed: AtomicBool::new(false), source: Some(source) }
    }
}

impl PyImageFrames {
    fn new(frames: MediaFrames, pts: Option<f64>) -> Self {
        Self { frames, pts, consumed: AtomicBool::new(false) }
    }
}

/// Attribute access on consumed frames: the `TypeError` of [`Consumable::live`], else the usual lookup.
fn getattr_live<'py, T: Consumable>(
    this: &T,
    slf: &Bound<'py, PyAny>,
    name: &Bound<'py, PyString>,
) -> PyResult<Bound<'py, PyAny>> {
    this.live()?;
    // SAFETY: both pointers are live Python objects held by the bound references for the call; the generic
    // lookup returns a new reference or null with an exception set, which `from_owned_ptr_or_err` takes over.
    unsafe { Bound::from_owned_ptr_or_err(slf.py(), pyo3::ffi::PyObject_GenericGetAttr(slf.as_ptr(), name.as_ptr())) }
}

pub(super) fn frames_object(py: Python<'_>, frames: MediaFrames) -> PyResult<Py<PyAny>> {
    Ok(match frames.kind {
        MediaType::Audio => Py::new(py, PyAudioFrames::new(frames))?.into_any(),
        MediaType::Video => Py::new(py, PyVideoFrames::new(frames))?.into_any(),
        MediaType::Image => Py::new(py, PyImageFrames::new(frames, None))?.into_any(),
    })
}

pub(super) fn frames_of<'a>(obj: &'a Bound<'_, PyAny>) -> PyResult<&'a MediaFrames> {
    Ok(frames_cell(obj)?.0.frames)
}

/// The frames of a frames object, and its consumed flag; a `TypeError` if it is not one or was consumed.
pub(super) fn frames_cell<'a>(obj: &'a Bound<'_, PyAny>) -> PyResult<(FramesRef<'a>, &'a AtomicBool)> {
    fn of<'a, T: Consumable>(t: &'a T, frames: &'a MediaFrames) -> PyResult<(FramesRef<'a>, &'a AtomicBool)> {
        t.live()?;
        Ok((FramesRef { frames }, t.consumed_flag()))
    }
    if let Ok(f) = obj.cast::<PyAudioFrames>() {
        let f = f.get();
        return of(f, &f.frames);
    }
    if let Ok(f) = obj.cast::<PyVideoFrames>() {
        let f = f.get();
        return of(f, &f.frames);
    }
    if let Ok(f) = obj.cast::<PyImageFrames>() {
        let f = f.get();
        return of(f, &f.frames);
    }
    Err(PyTypeError::new_err(format!(
        "expected AudioFrames, VideoFrames or ImageFrames, got {}",
        obj.get_type().name()?
    )))
}

/// Borrowed frames of a frames object.
pub(super) struct FramesRef<'a> {
    pub(super) frames: &'a MediaFrames,
}

fn ts_range(f: &MediaFrames) -> String {
    let t = f.timestamps();
    match (t.first(), t.last()) {
        (Some(a), Some(b)) => format!("[{a:.3}, {b:.3}]"),
        _ => "[]".into(),
    }
}

#[pymethods]
impl PyAudioFrames {
    fn __getattribute__<'py>(slf: &Bound<'py, Self>, name: &Bound<'py, PyString>) -> PyResult<Bound<'py, PyAny>> {
        getattr_live(slf.get(), slf.as_any(), name)
    }
    /// Samples per channel (SPDL counts an audio "frame" as one sample of every channel).
    #[getter]
    fn num_frames(&self) -> usize {
        self.frames.num_frames()
    }
    /// Samples per second.
    #[getter]
    fn sample_rate(&self) -> u32 {
        self.frames.sample_rate()
    }
    /// Channels.
    #[getter]
    fn num_channels(&self) -> u32 {
        self.frames.num_channels()
    }
    /// The sample format (``"fltp"``, ``"s16"``, ...; a ``p`` suffix: planar, converted as ``[C, N]``).
    #[getter]
    fn sample_fmt(&self) -> String {
        self.frames.format_name()
    }
    /// A copy sharing the data.
    fn clone(&self) -> PyResult<Self> {
        self.live()?;
        Ok(Self::new(self.frames.try_clone().map_err(io_err)?))
    }
    fn __len__(&self) -> PyResult<usize> {
        self.live()?;
        Ok(self.frames.num_frames())
    }
    fn __repr__(&self) -> PyResult<String> {
        self.live()?;
        Ok(format!(
            "AudioFrames<num_frames={}, sample_format={:?}, sample_rate={}, num_channels={}, timestamp={}>",
            self.frames.num_frames(),
            self.frames.format_name(),
            self.frames.sample_rate(),
            self.frames.num_channels(),
            ts_range(&self.frames)
        ))
    }
}

#[pymethods]
impl PyVideoFrames {
    fn __getattribute__<'py>(slf: &Bound<'py, Self>, name: &Bound<'py, PyString>) -> PyResult<Bound<'py, PyAny>> {
        getattr_live(slf.get(), slf.as_any(), name)
    }
    /// The number of frames.
    #[getter]
    fn num_frames(&self) -> usize {
        self.frames.num_frames()
    }
    /// Planes per frame (``yuv420p``: 3, ``rgb24``: 1).
    #[getter]
    fn num_planes(&self) -> u32 {
        self.frames.num_planes()
    }
    /// Width in pixels.
    #[getter]
    fn width(&self) -> u32 {
        self.frames.width()
    }
    /// Height in pixels.
    #[getter]
    fn height(&self) -> u32 {
        self.frames.height()
    }
    /// The pixel format.
    #[getter]
    fn pix_fmt(&self) -> String {
        self.frames.format_name()
    }
    /// Presentation times in seconds.
    fn get_timestamps(&self) -> Vec<f64> {
        self.frames.timestamps()
    }
    /// Presentation timestamps in time base units.
    fn get_pts(&self) -> Vec<i64> {
        self.frames.pts()
    }
    /// Time base of the timestamps, ``(numerator, denominator)``.
    #[getter]
    fn time_base(&self) -> (i32, i32) {
        self.frames.time_base
    }
    /// A copy sharing the data.
    fn clone(&self) -> PyResult<Self> {
        self.live()?;
        Ok(Self::new(self.frames.try_clone().map_err(io_err)?))
    }
    fn __len__(&self) -> PyResult<usize> {
        self.live()?;
        Ok(self.frames.num_frames())
    }
    /// An ``int`` gives one frame as :py:class:`ImageFrames`; a slice or a sequence of ints the frames as
    /// :py:class:`VideoFrames`.
    fn __getitem__(&self, py: Python<'_>, key: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        self.live()?;
        let n = self.frames.num_frames();
        if let Ok(i) = key.extract::<isize>() {
            let j = if i < 0 { i + n as isize } else { i };
            if j < 0 || j as usize >= n {
                return Err(PyIndexError::new_err(format!("frame index {i} is out of range for {n} frames")));
            }
            let frames = self.frames.select(&[j as usize], MediaType::Image).map_err(io_err)?;
            let pts = self.frames.timestamps().get(j as usize).copied();
            return Ok(Py::new(py, PyImageFrames::new(frames, pts))?.into_any());
        }
        let idx: Vec<usize> = if let Ok(s) = key.cast::<PySlice>() {
            let ind = s.indices(n as isize)?;
            let mut v = Vec::with_capacity(ind.slicelength);
            let mut i = ind.start;
            for _ in 0..ind.slicelength {
                v.push(i as usize);
                i += ind.step;
            }
            v
        } else {
            let raw: Vec<isize> = key
                .extract()
                .map_err(|_| PyTypeError::new_err("VideoFrames index must be an int, a slice or a sequence of ints"))?;
            raw.into_iter()
                .map(|i| {
                    let j = if i < 0 { i + n as isize } else { i };
                    if j < 0 || j as usize >= n {
                        Err(PyIndexError::new_err(format!("frame index {i} is out of range for {n} frames")))
                    } else {
                        Ok(j as usize)
                    }
                })
                .collect::<PyResult<_>>()?
        };
        let frames = self.frames.select(&idx, MediaType::Video).map_err(io_err)?;
        Ok(Py::new(py, PyVideoFrames::new(frames))?.into_any())
    }
    fn __repr__(&self) -> PyResult<String> {
        self.live()?;
        Ok(format!(
            "VideoFrames<num_frames={}, pixel_format={:?}, num_planes={}, width={}, height={}, timestamp={}>",
            self.frames.num_frames(),
            self.frames.format_name(),
            self.frames.num_planes(),
            self.frames.width(),
            self.frames.height(),
            ts_range(&self.frames)
        ))
    }
}

#[pymethods]
impl PyImageFrames {
    fn __getattribute__<'py>(slf: &Bound<'py, Self>, name: &Bound<'py, PyString>) -> PyResult<Bound<'py, PyAny>> {
        getattr_live(slf.get(), slf.as_any(), name)
    }
    /// Planes of the frame.
    #[getter]
    fn num_planes(&self) -> u32 {
        self.frames.num_planes()
    }
    /// Width in pixels.
    #[getter]
    fn width(&self) -> u32 {
        self.frames.width()
    }
    /// Height in pixels.
    #[getter]
    fn height(&self) -> u32 {
        self.frames.height()
    }
    /// The pixel format.
    #[getter]
    fn pix_fmt(&self) -> String {
        self.frames.format_name()
    }
    /// Metadata attached to the frame.
    #[getter]
    fn metadata(&self) -> std::collections::HashMap<String, String> {
        self.frames.metadata().into_iter().collect()
    }
    /// Presentation time (seconds) in the source video, for a frame taken out of :py:class:`VideoFrames`.
    #[getter]
    fn pts(&self) -> PyResult<f64> {
        self.pts.ok_or_else(|| PyValueError::new_err("this image was not taken out of VideoFrames: it has no pts"))
    }
    /// A copy sharing the data.
    fn clone(&self) -> PyResult<Self> {
        self.live()?;
        Ok(Self::new(self.frames.try_clone().map_err(io_err)?, self.pts))
    }
    fn __repr__(&self) -> PyResult<String> {
        self.live()?;
        Ok(format!(
            "ImageFrames<pixel_format={:?}, num_planes={}, width={}, height={}>",
            self.frames.format_name(),
            self.frames.num_planes(),
            self.frames.width(),
            self.frames.height()
        ))
    }
}

/// An FFmpeg filter graph (SPDL's ``FilterGraph``): its inputs are ``buffer``/``abuffer`` filters and its
/// outputs ``buffersink``/``abuffersink`` filters, named in the description. Thread-safe: calls run one
/// at a time.
#[pyclass(name = "FilterGraph", module = "spdl_rs._native.io", frozen)]
#[derive(Debug)]
pub struct PyFilterGraph {
    inner: Mutex<FilterGraph>,
}

#[pymethods]
impl PyFilterGraph {
    #[new]
    fn new(py: Python<'_>, filter_desc: String) -> PyResult<Self> {
        let g = crate::lifecycle::detach(py, || FilterGraph::new(&filter_desc)).map_err(io_err)?;
        Ok(Self { inner: Mutex::new(g) })
    }

    /// Feeds frames to the input ``key`` (needed when the graph has several inputs).
    #[pyo3(signature = (frames, *, key=None))]
    fn add_frames(&self, py: Python<'_>, frames: &Bound<'_, PyAny>, key: Option<String>) -> PyResult<()> {
        let f = frames_of(frames)?;
        crate::lifecycle::detach(py, || lock(&self.inner).add_frames(f, key.as_deref())).map_err(io_err)
    }

    /// Tells every input that its stream ended.
    fn flush(&self, py: Python<'_>) -> PyResult<()> {
        crate::lifecycle::detach(py, || lock(&self.inner).flush()).map_err(io_err)
    }

    /// The frames ready at output ``key`` (needed when the graph has several outputs), or ``None``.
    #[pyo3(signature = (*, key=None))]
    fn get_frames(&self, py: Python<'_>, key: Option<String>) -> PyResult<Option<Py<PyAny>>> {
        let f = crate::lifecycle::detach(py, || lock(&self.inner).get_frames(key.as_deref(), "<filter graph>"))
            .map_err(io_err)?;
        f.map(|f| frames_object(py, f)).transpose()
    }

    /// FFmpeg's drawing of the graph.
    fn dump(&self) -> String {
        lock(&self.inner).dump()
    }
}

/// Splits video ``packets`` (not consumed) so that each of the sorted, distinct frame ``indices`` decodes
/// from the keyframe before it: a list of ``(packets, indices within their decoded frames)``.
#[pyfunction]
pub(crate) fn split_packets_at_indices(
    py: Python<'_>,
    packets: &PyVideoPackets,
    indices: Vec<usize>,
) -> PyResult<Vec<(PyVideoPackets, Vec<usize>)>> {
    let p = packets.state.cloned()?;
    let parts = crate::lifecycle::detach(py, || p.split_at_indices(&indices)).map_err(io_err)?;
    Ok(parts.into_iter().map(|(p, i)| (PyVideoPackets::from_packets(p), i)).collect())
}
