//! `spdl_rs.pipeline.SharedMemoryRingBuffer` and `SharedMemorySegmentPool`: shared memory that carries the
//! large binaries of items from a worker process to its parent without pickling them (SPDL's arenas).
//!
//! Each arena is one named segment ([`shm::Segment`]) that starts with a control block: two monotonic
//! counters (the ring's written/released bytes, the pool's published/reclaimed units), a shutdown flag and a
//! futex word. A writer that finds no space waits on the futex with the GIL released, waking every
//! [`WAIT_STEP`] to ask the worker whether a command came (then it gives up the item:
//! [`ArenaInterrupted`]). Nothing but the segment's name travels to the worker, so pickling an arena works
//! with every start method, and only the creating process removes the name.
//!
//! One item is one *unit*: the writer's `begin_unit`, `write_binary` per binary, then `commit_unit` (or
//! `abort_unit`); the reader's `read_binary` per binary, then `end_unit`. The ring's reader copies each binary
//! out and frees the unit's bytes at `end_unit`. The pool's reader hands out zero-copy `memoryview`s of the
//! unit's segment; the segment is reclaimed once every anchor (the restored objects that hold the views) has
//! been garbage-collected, through a `weakref.finalize` per anchor.
//!
//! The copies in and out go through `memoryview`s of the mapping (`PyMemoryView_FromMemory`, in the stable
//! ABI of every version), so the abi3 build for Python 3.10, which has no buffer protocol, takes the same path.

mod layout;
mod shm;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use pyo3::exceptions::{PyBufferError, PyException, PyOSError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes, PyMemoryView, PySlice};

use layout::Watermark;
use shm::{Control, Segment, Waited};

pyo3::create_exception!(
    spdl_rs.pipeline,
    ArenaInterrupted,
    PyException,
    "The writer stopped waiting for arena space because the parent sent a command (the item is dropped)."
);

/// How often a writer waiting for space checks for a command from the parent.
const WAIT_STEP: Duration = Duration::from_millis(100);
/// CPython's `PyBUF_WRITE` (a writable `PyMemoryView_FromMemory`; PyO3 exports the constant only with the
/// buffer protocol, which the abi3 build for Python 3.10 lacks).
const PY_BUF_WRITE: std::os::raw::c_int = 0x200;
/// Bytes of the unit-span header in front of an envelope.
const SPAN_SIZE: usize = 8;

/// What can go wrong with an arena.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ArenaError {
    /// The requested size does not fit this system's sizes.
    #[error("an arena of {bytes} bytes is too large for this system")]
    TooLarge {
        /// Bytes requested.
        bytes: usize,
    },
    /// A system call on the segment failed.
    #[error("cannot {what} the shared-memory segment `{name}`")]
    Os {
        /// `create`, `attach` or `unlink`.
        what: &'static str,
        /// The segment.
        name: String,
        /// The system's error.
        #[source]
        source: std::io::Error,
    },
    /// The segment is smaller than the arena it was pickled with.
    #[error("the shared-memory segment `{name}` has {size} bytes, expected at least {expected}")]
    Truncated {
        /// The segment.
        name: String,
        /// Its size.
        size: i64,
        /// The arena's size.
        expected: usize,
    },
    /// A segment name with a NUL byte.
    #[error("invalid shared-memory segment name {name:?}")]
    BadName {
        /// The name.
        name: String,
    },
    /// One binary is larger than the ring.
    #[error("binary of {n} bytes exceeds ring capacity {capacity}; increase SharedMemoryRingBuffer capacity")]
    BinaryExceedsRing {
        /// The binary's bytes.
        n: u64,
        /// The ring's.
        capacity: u64,
    },
    /// One unit's binaries together are larger than the ring.
    #[error(
        "unit would exceed ring capacity ({capacity}): {written} already written + {n} new > capacity. Increase \
         SharedMemoryRingBuffer capacity."
    )]
    UnitExceedsRing {
        /// Bytes of the unit so far.
        written: u64,
        /// The next binary's.
        n: u64,
        /// The ring's.
        capacity: u64,
    },
    /// One unit's binaries (aligned) are larger than a pool segment.
    #[error("unit exceeds segment_size ({segment_size}); increase SharedMemorySegmentPool segment_size")]
    UnitExceedsSegment {
        /// Bytes per segment.
        segment_size: usize,
    },
    /// A marker in an envelope points outside the arena (a corrupted or foreign envelope).
    #[error("arena marker (offset {offset}, {nbytes} bytes) is outside the arena's {size} bytes")]
    BadMarker {
        /// The marker's offset.
        offset: u64,
        /// The marker's size.
        nbytes: u64,
        /// The arena's (or segment's) size.
        size: u64,
    },
    /// An envelope shorter than its span header.
    #[error("arena envelope of {0} bytes has no unit span")]
    ShortEnvelope(usize),
    /// The ring is full and `acquire_timeout` is 0.
    #[error(
        "shared-memory arena full: need {n} more bytes and acquire_timeout=0; increase SharedMemoryRingBuffer \
         capacity or acquire_timeout"
    )]
    RingFullNow {
        /// Bytes needed.
        n: u64,
    },
    /// The ring stayed full for `acquire_timeout`.
    #[error(
        "shared-memory arena full: need {n} more bytes after waiting {}s; the consumer is releasing units too \
         slowly or has stalled. Increase SharedMemoryRingBuffer capacity or acquire_timeout, or check the consumer.",
        fmt_g(*.secs)
    )]
    RingFull {
        /// Bytes needed.
        n: u64,
        /// Seconds waited.
        secs: f64,
    },
    /// The ring was shut down while the writer waited.
    #[error("shared-memory ring shut down while waiting for free space")]
    RingShutDown,
    /// No pool segment is free and `acquire_timeout` is 0.
    #[error(
        "segment pool exhausted: no free segment and acquire_timeout=0. Increase SharedMemorySegmentPool \
         count/segment_size or acquire_timeout, or check the consumer."
    )]
    PoolExhaustedNow,
    /// No pool segment came free within `acquire_timeout`.
    #[error(
        "segment pool exhausted: no free segment after waiting {}s; the consumer is releasing views too slowly or \
         has stalled. Increase SharedMemorySegmentPool count/segment_size or acquire_timeout, or check the consumer.",
        fmt_g(*.secs)
    )]
    PoolExhausted {
        /// Seconds waited.
        secs: f64,
    },
    /// The pool was shut down while the writer waited.
    #[error("segment pool shut down while waiting for a free segment")]
    PoolShutDown,
}

impl From<ArenaError> for PyErr {
    fn from(e: ArenaError) -> Self {
        let msg = spdl_report::error_chain(&e);
        match &e {
            ArenaError::Os { source, .. } => match source.raw_os_error() {
                // OSError(errno, msg) is the errno's subclass (FileNotFoundError, ...).
                Some(errno) => PyOSError::new_err((errno, msg)),
                None => PyOSError::new_err(msg),
            },
            ArenaError::TooLarge { .. }
            | ArenaError::Truncated { .. }
            | ArenaError::BadName { .. }
            | ArenaError::BadMarker { .. }
            | ArenaError::ShortEnvelope(_) => PyValueError::new_err(msg),
            _ => PyBufferError::new_err(msg),
        }
    }
}

/// Seconds as Python's `f"{secs:g}"` writes the usual values (`60`, `0.3`).
fn fmt_g(secs: f64) -> String {
    if secs.fract() == 0.0 && secs.abs() < 1e15 { format!("{}", secs as i64) } else { format!("{secs}") }
}

/// Checks `acquire_timeout` as SPDL does.
fn check_timeout(acquire_timeout: f64) -> PyResult<()> {
    if acquire_timeout.is_nan() || acquire_timeout < 0.0 {
        return Err(PyValueError::new_err("acquire_timeout must be non-negative"));
    }
    Ok(())
}

/// A positive size from Python.
fn positive(value: i64, what: &str) -> PyResult<usize> {
    usize::try_from(value)
        .ok()
        .filter(|&v| v > 0)
        .ok_or_else(|| PyValueError::new_err(format!("{what} must be positive")))
}

/// One process's mapping of an arena's segment, shared by the arena object, its endpoints and the pool's
/// leases (the mapping outlives `close()` while a restored view still points into it).
#[derive(Debug)]
struct Mapped {
    seg: Segment,
    /// Set by `close()`: late releases no longer update the counters.
    closed: AtomicBool,
    /// Pool units whose views are still alive.
    live_units: AtomicUsize,
}

impl Mapped {
    fn control(&self) -> &Control {
        self.seg.control()
    }
}

/// An arena's segment as one process knows it: its name, whether this process created it, and the mapping,
/// made on first use (a worker maps it after unpickling the arena).
#[derive(Debug)]
struct Handle {
    name: String,
    data_len: usize,
    owner: bool,
    acquire_timeout: f64,
    mapped: Mutex<Option<Arc<Mapped>>>,
}

impl Handle {
    fn create(data_len: usize, acquire_timeout: f64) -> Result<Self, ArenaError> {
        let (name, seg) = Segment::create(data_len)?;
        let mapped = Arc::new(Mapped { seg, closed: AtomicBool::new(false), live_units: AtomicUsize::new(0) });
        Ok(Self { name, data_len, owner: true, acquire_timeout, mapped: Mutex::new(Some(mapped)) })
    }

    fn attached(name: String, data_len: usize, acquire_timeout: f64) -> Self {
        Self { name, data_len, owner: false, acquire_timeout, mapped: Mutex::new(None) }
    }

    fn mapped(&self) -> Result<Arc<Mapped>, ArenaError> {
        let mut slot = self.mapped.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(m) = &*slot {
            return Ok(Arc::clone(m));
        }
        let seg = Segment::attach(&self.name, self.data_len)?;
        let m = Arc::new(Mapped { seg, closed: AtomicBool::new(false), live_units: AtomicUsize::new(0) });
        *slot = Some(Arc::clone(&m));
        Ok(m)
    }

    fn shutdown(&self) {
        // An arena already unlinked here cannot be mapped: nobody waits on it then.
        if let Ok(m) = self.mapped() {
            m.control().shut_down();
        }
    }

    /// Shuts down and drops this object's mapping; returns the mapping's units still viewed.
    fn close(&self) -> usize {
        self.shutdown();
        let taken = self.mapped.lock().unwrap_or_else(PoisonError::into_inner).take();
        taken.map_or(0, |m| {
            m.closed.store(true, Ordering::Release);
            m.live_units.load(Ordering::Acquire)
        })
    }

    fn unlink(&self) -> Result<(), ArenaError> {
        if self.owner { shm::unlink_owned(&self.name) } else { Ok(()) }
    }

    fn counter(&self, tail: bool) -> PyResult<u64> {
        let m = self.mapped()?;
        let c = m.control();
        Ok(if tail { c.tail.load(Ordering::Acquire) } else { c.head.load(Ordering::Acquire) })
    }

    fn set_counter(&self, tail: bool, value: u64) -> PyResult<()> {
        let m = self.mapped()?;
        let c = m.control();
        if tail {
            c.tail.store(value, Ordering::Release);
            c.notify();
        } else {
            c.head.store(value, Ordering::Release);
        }
        Ok(())
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        // The creator's arena collected without `unlink()`: remove the name (a no-op in a forked child).
        let _ = self.unlink();
    }
}

/// Waits on `ctrl` until `ready`, `acquire_timeout` seconds (`inf`: no limit) or shutdown, with the GIL
/// released; between steps `interrupt()` (the worker has a command waiting) ends the wait.
fn wait_for_space(
    py: Python<'_>,
    ctrl: &Control,
    ready: impl Fn(&Control) -> bool,
    acquire_timeout: f64,
    interrupt: Option<&Py<PyAny>>,
    timed_out: ArenaError,
    shut_down: ArenaError,
) -> PyResult<()> {
    let waited = ctrl.wait_until(
        ready,
        Duration::try_from_secs_f64(acquire_timeout).ok(),
        WAIT_STEP,
        || match interrupt {
            Some(f) => f.bind(py).call0()?.is_truthy(),
            None => Ok(false),
        },
        |sleep| crate::lifecycle::detach(py, sleep),
    )?;
    match waited {
        Waited::Ready => Ok(()),
        Waited::Shutdown => Err(shut_down.into()),
        Waited::TimedOut => Err(timed_out.into()),
        Waited::Interrupted => Err(ArenaInterrupted::new_err(())),
    }
}

/// A writable `memoryview` of `len` bytes of a mapping at `ptr` (no owner: the caller keeps the mapping).
fn raw_view<'py>(py: Python<'py>, ptr: *mut u8, len: usize) -> PyResult<Bound<'py, PyAny>> {
    let len = isize::try_from(len).map_err(|_| ArenaError::TooLarge { bytes: len })?;
    // SAFETY: `ptr..ptr + len` lies in a live shared mapping (the callers check the range against the arena's
    // size); the result is a new reference or NULL with an exception set.
    unsafe { Bound::from_owned_ptr_or_err(py, pyo3::ffi::PyMemoryView_FromMemory(ptr.cast(), len, PY_BUF_WRITE)) }
}

/// `memoryview(data).cast("B")` and its size.
fn byte_view<'py>(data: &Bound<'py, PyAny>) -> PyResult<(Bound<'py, PyAny>, usize)> {
    let view = PyMemoryView::from(data)?.call_method1("cast", ("B",))?;
    let n = view.getattr("nbytes")?.extract()?;
    Ok((view, n))
}

/// Copies `src[from..from + len]` (a flat byte view) to `len` bytes of a mapping at `dst`.
fn copy_in(py: Python<'_>, dst: *mut u8, src: &Bound<'_, PyAny>, from: usize, len: usize) -> PyResult<()> {
    let target = raw_view(py, dst, len)?;
    let part = src.get_item(PySlice::new(py, from as isize, (from + len) as isize, 1))?;
    target.set_item(PySlice::full(py), part)?;
    target.call_method0("release")?;
    Ok(())
}

/// A pointer `offset` bytes into the mapping's data area. Callers keep `offset` within the data area.
fn data_at(m: &Mapped, offset: usize) -> *mut u8 {
    debug_assert!(offset <= m.seg.data_len());
    m.seg.data().wrapping_add(offset)
}

/// `<8-byte little-endian unit span><body>`: the envelope an item crosses the pipe in.
#[pyfunction]
pub(crate) fn _arena_envelope<'py>(py: Python<'py>, span: u64, body: &[u8]) -> PyResult<Bound<'py, PyBytes>> {
    PyBytes::new_with(py, SPAN_SIZE + body.len(), |out| {
        out[..SPAN_SIZE].copy_from_slice(&span.to_le_bytes());
        out[SPAN_SIZE..].copy_from_slice(body);
        Ok(())
    })
}

/// The unit span of an envelope made by `_arena_envelope`, and a view of its body.
#[pyfunction]
pub(crate) fn _arena_open_envelope<'py>(blob: &Bound<'py, PyBytes>) -> PyResult<(u64, Bound<'py, PyAny>)> {
    let bytes = blob.as_bytes();
    let head: [u8; SPAN_SIZE] =
        bytes.get(..SPAN_SIZE).and_then(|h| h.try_into().ok()).ok_or(ArenaError::ShortEnvelope(bytes.len()))?;
    let body =
        PyMemoryView::from(blob.as_any())?.get_item(PySlice::new(blob.py(), SPAN_SIZE as isize, isize::MAX, 1))?;
    Ok((u64::from_le_bytes(head), body))
}

////////////////////////////////////////////////////////////////////////////////
// Ring
////////////////////////////////////////////////////////////////////////////////

/// **[Experimental]** One shared-memory segment used as a ring for the binaries of the items of
/// :py:func:`iterate_in_subprocess` (``arena=``); the parent copies each payload out.
///
/// Args:
///     capacity: Bytes of payload space; at least the largest item's offloaded binaries together (about
///         ``(buffer_size + 2) * largest item`` for a writer that never waits).
///     acquire_timeout: Seconds the writer waits for free space before :py:exc:`BufferError` (``0``: fail at
///         once when full).
///
/// The segment is created here and removed by :py:meth:`unlink` (done by the iterable that owns it).
#[pyclass(module = "spdl_rs.pipeline", name = "SharedMemoryRingBuffer", frozen)]
#[derive(Debug)]
pub struct SharedMemoryRingBuffer {
    h: Handle,
}

impl SharedMemoryRingBuffer {
    fn capacity_u64(&self) -> u64 {
        self.h.data_len as u64
    }
}

#[pymethods]
impl SharedMemoryRingBuffer {
    #[new]
    #[pyo3(signature = (capacity, *, acquire_timeout = 60.0))]
    fn new(capacity: i64, acquire_timeout: f64) -> PyResult<Self> {
        let capacity = positive(capacity, "capacity")?;
        check_timeout(acquire_timeout)?;
        Ok(Self { h: Handle::create(capacity, acquire_timeout)? })
    }

    /// The arena of an unpickled ring: maps the segment on first use, never removes it.
    #[classmethod]
    fn _attach(_cls: &Bound<'_, pyo3::types::PyType>, name: String, capacity: usize, acquire_timeout: f64) -> Self {
        Self { h: Handle::attached(name, capacity, acquire_timeout) }
    }

    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<(Bound<'py, PyAny>, (String, usize, f64))> {
        let me = slf.get();
        Ok((slf.get_type().getattr("_attach")?, (me.h.name.clone(), me.h.data_len, me.h.acquire_timeout)))
    }

    /// Bytes of payload space.
    #[getter]
    fn capacity(&self) -> usize {
        self.h.data_len
    }

    /// The shared-memory segment's name.
    #[getter]
    fn name(&self) -> &str {
        &self.h.name
    }

    /// Bytes published by the writer (a monotonic count).
    #[getter]
    fn get_head(&self) -> PyResult<u64> {
        self.h.counter(false)
    }

    #[setter]
    fn set_head(&self, value: u64) -> PyResult<()> {
        self.h.set_counter(false, value)
    }

    /// Bytes released by the reader (a monotonic count).
    #[getter]
    fn get_tail(&self) -> PyResult<u64> {
        self.h.counter(true)
    }

    #[setter]
    fn set_tail(&self, value: u64) -> PyResult<()> {
        self.h.set_counter(true, value)
    }

    /// Wakes a writer waiting for space (it raises :py:exc:`BufferError`). Idempotent, from either side.
    fn shutdown_arena(&self) {
        self.h.shutdown();
    }

    /// The writer endpoint (in the worker).
    fn open_writer(&self) -> PyResult<RingWriter> {
        Ok(RingWriter {
            m: self.h.mapped()?,
            capacity: self.capacity_u64(),
            acquire_timeout: self.h.acquire_timeout,
            start: 0,
            pos: 0,
            interrupt: None,
        })
    }

    /// The reader endpoint (in the parent).
    fn open_reader(&self) -> PyResult<RingReader> {
        Ok(RingReader { m: self.h.mapped()?, capacity: self.capacity_u64() })
    }

    /// Releases this process's mapping (after waking a waiting writer).
    fn close(&self) {
        self.h.close();
    }

    /// Removes the segment from the system (by the process that created it; elsewhere a no-op).
    fn unlink(&self) -> PyResult<()> {
        Ok(self.h.unlink()?)
    }
}

/// The ring's writer endpoint (in the worker).
#[pyclass(module = "spdl_rs._native.pipeline")]
#[derive(Debug)]
pub struct RingWriter {
    m: Arc<Mapped>,
    capacity: u64,
    acquire_timeout: f64,
    start: u64,
    pos: u64,
    /// Set by the worker: whether a command is waiting (ends a wait for space).
    #[pyo3(get, set)]
    interrupt: Option<Py<PyAny>>,
}

#[pymethods]
impl RingWriter {
    /// A new iteration: the parent is waiting for it to start, so all space is free.
    fn reset(&mut self) {
        let c = self.m.control();
        c.head.store(0, Ordering::Release);
        c.tail.store(0, Ordering::Release);
        c.notify();
        self.start = 0;
        self.pos = 0;
    }

    /// Starts a unit at the published head.
    fn begin_unit(&mut self) {
        self.pos = self.m.control().head.load(Ordering::Acquire);
        self.start = self.pos;
    }

    /// Copies `data` (a C-contiguous buffer) into the ring, waiting for space; returns `(offset, nbytes)`.
    fn write_binary(&mut self, py: Python<'_>, data: &Bound<'_, PyAny>) -> PyResult<(u64, u64)> {
        let (src, len) = byte_view(data)?;
        let (cap, pos, n) = (self.capacity, self.pos, len as u64);
        layout::ring_check(cap, self.start, pos, n)?;
        let ctrl = self.m.control();
        let fits = |c: &Control| layout::ring_free(cap, pos, c.tail.load(Ordering::Acquire)) >= n;
        if !fits(ctrl) {
            if self.acquire_timeout == 0.0 {
                return Err(ArenaError::RingFullNow { n }.into());
            }
            let secs = self.acquire_timeout;
            wait_for_space(
                py,
                ctrl,
                fits,
                secs,
                self.interrupt.as_ref(),
                ArenaError::RingFull { n, secs },
                ArenaError::RingShutDown,
            )?;
        }
        // n <= cap, and at + first <= cap: both pieces lie in the data area.
        let (at, first) = layout::ring_place(cap, pos, n);
        copy_in(py, data_at(&self.m, at as usize), &src, 0, first as usize)?;
        if first < n {
            copy_in(py, data_at(&self.m, 0), &src, first as usize, (n - first) as usize)?;
        }
        self.pos = pos + n;
        Ok((at, n))
    }

    /// Publishes the unit; returns its span (bytes).
    fn commit_unit(&mut self) -> u64 {
        self.m.control().head.store(self.pos, Ordering::Release);
        self.pos - self.start
    }

    /// Forgets the unit's binaries.
    fn abort_unit(&mut self) {
        self.pos = self.start;
    }
}

/// The ring's reader endpoint (in the parent): copies each binary out.
#[pyclass(module = "spdl_rs._native.pipeline", frozen)]
#[derive(Debug)]
pub struct RingReader {
    m: Arc<Mapped>,
    capacity: u64,
}

#[pymethods]
impl RingReader {
    /// Whether `read_binary` returns views into shared memory (no: copies).
    #[getter]
    fn zero_copy(&self) -> bool {
        false
    }

    /// Nothing to do: the writer resets both counters.
    fn reset(&self) {}

    /// A copy of `nbytes` bytes at ring offset `offset` (wrapping), as a `memoryview` of a `bytearray`.
    fn read_binary<'py>(&self, py: Python<'py>, offset: u64, nbytes: u64) -> PyResult<Bound<'py, PyAny>> {
        layout::ring_check_marker(self.capacity, offset, nbytes)?;
        let (_, first) = layout::ring_place(self.capacity, offset, nbytes);
        let (first, n) = (first as usize, nbytes as usize);
        let src = data_at(&self.m, offset as usize);
        let base = data_at(&self.m, 0);
        let out = PyByteArray::new_with(py, n, |dst| {
            // SAFETY: the marker check keeps `offset + first` and `n - first` within the data area, which the
            // writer does not touch until `end_unit` releases these bytes; `dst` is a fresh buffer of `n` bytes.
            unsafe {
                std::ptr::copy_nonoverlapping(src, dst.as_mut_ptr(), first);
                std::ptr::copy_nonoverlapping(base, dst.as_mut_ptr().add(first), n - first);
            }
            Ok(())
        })?;
        Ok(PyMemoryView::from(out.as_any())?.into_any())
    }

    /// Frees the unit's `span` bytes.
    #[pyo3(signature = (span, pinned))]
    fn end_unit(&self, span: u64, pinned: &Bound<'_, PyAny>) {
        let _ = pinned;
        let c = self.m.control();
        c.tail.fetch_add(span, Ordering::AcqRel);
        c.notify();
    }
}

////////////////////////////////////////////////////////////////////////////////
// Segment pool
////////////////////////////////////////////////////////////////////////////////

/// **[Experimental]** ``count`` shared-memory segments of ``segment_size`` bytes, one per item in turn, for
/// :py:func:`iterate_in_subprocess` (``arena=``); the parent gets zero-copy views into them.
///
/// A segment is reused once every view restored from it is garbage-collected, so holding many restored items
/// makes the writer wait (at most ``acquire_timeout`` seconds, then :py:exc:`BufferError`; ``0``: fail at once).
/// Restored ``bytes``/``bytearray`` come back as ``memoryview`` (the zero-copy view itself).
///
/// Args:
///     segment_size: Bytes per segment; at least one item's offloaded binaries (each aligned to 64 bytes).
///     count: Number of segments.
///     acquire_timeout: Seconds the writer waits for a free segment.
#[pyclass(module = "spdl_rs.pipeline", name = "SharedMemorySegmentPool", frozen)]
#[derive(Debug)]
pub struct SharedMemorySegmentPool {
    h: Handle,
    geometry: PoolGeometry,
}

/// Where the pool's segments lie in its one shared-memory segment: `count` of them, `stride` bytes apart
/// (`segment_size` rounded up to the alignment).
#[derive(Debug, Clone, Copy)]
struct PoolGeometry {
    segment_size: usize,
    count: usize,
    stride: usize,
}

impl PoolGeometry {
    fn new(segment_size: usize, count: usize) -> Result<(Self, usize), ArenaError> {
        let too_large = ArenaError::TooLarge { bytes: segment_size.saturating_mul(count) };
        let Some(stride) = layout::align_up(segment_size) else { return Err(too_large) };
        let Some(total) = stride.checked_mul(count) else { return Err(too_large) };
        Ok((Self { segment_size, count, stride }, total))
    }

    /// The data-area offset of `offset` in the segment of `unit`.
    fn at(&self, unit: u64, offset: usize) -> usize {
        (unit % self.count as u64) as usize * self.stride + offset
    }
}

#[pymethods]
impl SharedMemorySegmentPool {
    #[new]
    #[pyo3(signature = (segment_size, count, *, acquire_timeout = 60.0))]
    fn new(segment_size: i64, count: i64, acquire_timeout: f64) -> PyResult<Self> {
        let segment_size = positive(segment_size, "segment_size")?;
        let count = positive(count, "count")?;
        check_timeout(acquire_timeout)?;
        let (geometry, total) = PoolGeometry::new(segment_size, count)?;
        Ok(Self { h: Handle::create(total, acquire_timeout)?, geometry })
    }

    /// The arena of an unpickled pool: maps the segment on first use, never removes it.
    #[classmethod]
    fn _attach(
        _cls: &Bound<'_, pyo3::types::PyType>,
        name: String,
        segment_size: usize,
        count: usize,
        acquire_timeout: f64,
    ) -> PyResult<Self> {
        let (geometry, total) = PoolGeometry::new(segment_size, count)?;
        Ok(Self { h: Handle::attached(name, total, acquire_timeout), geometry })
    }

    #[allow(clippy::type_complexity)]
    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<(Bound<'py, PyAny>, (String, usize, usize, f64))> {
        let me = slf.get();
        let g = me.geometry;
        Ok((slf.get_type().getattr("_attach")?, (me.h.name.clone(), g.segment_size, g.count, me.h.acquire_timeout)))
    }

    /// Bytes per segment.
    #[getter]
    fn segment_size(&self) -> usize {
        self.geometry.segment_size
    }

    /// Number of segments.
    #[getter]
    fn count(&self) -> usize {
        self.geometry.count
    }

    /// Units published by the writer.
    #[getter]
    fn get_published(&self) -> PyResult<u64> {
        self.h.counter(false)
    }

    #[setter]
    fn set_published(&self, value: u64) -> PyResult<()> {
        self.h.set_counter(false, value)
    }

    /// Units whose segments are free again.
    #[getter]
    fn get_reclaimed(&self) -> PyResult<u64> {
        self.h.counter(true)
    }

    #[setter]
    fn set_reclaimed(&self, value: u64) -> PyResult<()> {
        self.h.set_counter(true, value)
    }

    /// Wakes a writer waiting for a segment (it raises :py:exc:`BufferError`). Idempotent.
    fn shutdown_arena(&self) {
        self.h.shutdown();
    }

    /// The writer endpoint (in the worker).
    fn open_writer(&self) -> PyResult<PoolWriter> {
        Ok(PoolWriter {
            m: self.h.mapped()?,
            geometry: self.geometry,
            acquire_timeout: self.h.acquire_timeout,
            cursor: 0,
            interrupt: None,
        })
    }

    /// The reader endpoint (in the parent).
    fn open_reader(&self) -> PyResult<PoolReader> {
        let shared =
            PoolShared { m: self.h.mapped()?, geometry: self.geometry, watermark: Mutex::new(Watermark::default()) };
        Ok(PoolReader { shared: Arc::new(shared), next: 0 })
    }

    /// Releases this process's mapping. While a restored item still views a segment, the memory stays mapped
    /// until that item is collected (a warning says so); :py:meth:`unlink` removes the name regardless.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        let stuck = self.h.close().min(self.geometry.count);
        if stuck > 0 {
            py.import("logging")?.call_method1("getLogger", ("spdl_rs.pipeline._arena",))?.call_method1(
                "warning",
                (
                    "SharedMemorySegmentPool: %d of %d segments are still viewed by restored items at close(); \
                     their memory is released when those are garbage-collected.",
                    stuck,
                    self.geometry.count,
                ),
            )?;
        }
        Ok(())
    }

    /// Removes the segments from the system (by the process that created them; elsewhere a no-op).
    fn unlink(&self) -> PyResult<()> {
        Ok(self.h.unlink()?)
    }
}

/// The pool's writer endpoint (in the worker).
#[pyclass(module = "spdl_rs._native.pipeline")]
#[derive(Debug)]
pub struct PoolWriter {
    m: Arc<Mapped>,
    geometry: PoolGeometry,
    acquire_timeout: f64,
    cursor: usize,
    /// Set by the worker: whether a command is waiting (ends a wait for a segment).
    #[pyo3(get, set)]
    interrupt: Option<Py<PyAny>>,
}

#[pymethods]
impl PoolWriter {
    /// Units still viewed from an earlier iteration keep their segments: the counters are not reset.
    fn reset(&mut self) {
        self.cursor = 0;
    }

    /// Waits for a free segment.
    fn begin_unit(&mut self, py: Python<'_>) -> PyResult<()> {
        let count = self.geometry.count as u64;
        let free =
            |c: &Control| layout::pool_has_free(count, c.head.load(Ordering::Acquire), c.tail.load(Ordering::Acquire));
        let ctrl = self.m.control();
        if !free(ctrl) {
            if self.acquire_timeout == 0.0 {
                return Err(ArenaError::PoolExhaustedNow.into());
            }
            let secs = self.acquire_timeout;
            wait_for_space(
                py,
                ctrl,
                free,
                secs,
                self.interrupt.as_ref(),
                ArenaError::PoolExhausted { secs },
                ArenaError::PoolShutDown,
            )?;
        }
        self.cursor = 0;
        Ok(())
    }

    /// Copies `data` into the unit's segment (aligned); returns `(offset, nbytes)`.
    fn write_binary(&mut self, py: Python<'_>, data: &Bound<'_, PyAny>) -> PyResult<(usize, usize)> {
        let (src, n) = byte_view(data)?;
        let at = layout::pool_place(self.geometry.segment_size, self.cursor, n)?;
        let unit = self.m.control().head.load(Ordering::Acquire);
        copy_in(py, data_at(&self.m, self.geometry.at(unit, at)), &src, 0, n)?;
        self.cursor = at + n;
        Ok((at, n))
    }

    /// Publishes the unit; returns its span (bytes used in the segment).
    fn commit_unit(&mut self) -> usize {
        self.m.control().head.fetch_add(1, Ordering::AcqRel);
        self.cursor
    }

    /// Forgets the unit's binaries.
    fn abort_unit(&mut self) {
        self.cursor = 0;
    }
}

/// What the pool's reader shares with the leases of the units it handed out.
#[derive(Debug)]
struct PoolShared {
    m: Arc<Mapped>,
    geometry: PoolGeometry,
    watermark: Mutex<Watermark>,
}

impl PoolShared {
    fn released(&self, unit: u64) {
        let moved = self.watermark.lock().unwrap_or_else(PoisonError::into_inner).release(unit);
        // After close() (a view outlived it) the counters are nobody's any more.
        if let Some(reclaimed) = moved
            && !self.m.closed.load(Ordering::Acquire)
        {
            let c = self.m.control();
            c.tail.store(reclaimed, Ordering::Release);
            c.notify();
        }
    }
}

/// The pool's reader endpoint (in the parent): zero-copy views, reclaimed when their anchors are collected.
#[pyclass(module = "spdl_rs._native.pipeline")]
#[derive(Debug)]
pub struct PoolReader {
    shared: Arc<PoolShared>,
    next: u64,
}

#[pymethods]
impl PoolReader {
    /// Whether `read_binary` returns views into shared memory (yes).
    #[getter]
    fn zero_copy(&self) -> bool {
        true
    }

    /// Nothing to do: the counters run on across iterations.
    fn reset(&self) {}

    /// A writable `memoryview` of `nbytes` bytes at `offset` of the current unit's segment (no copy). Each view
    /// has a buffer of its own, so views may be used and dropped on any thread.
    fn read_binary<'py>(&self, py: Python<'py>, offset: u64, nbytes: u64) -> PyResult<Bound<'py, PyAny>> {
        let g = self.shared.geometry;
        layout::pool_check_marker(g.segment_size, offset, nbytes)?;
        raw_view(py, data_at(&self.shared.m, g.at(self.next, offset as usize)), nbytes as usize)
    }

    /// Ends the current unit: its segment is reclaimed once each of `pinned` (the objects holding its views)
    /// is garbage-collected, at once when there is none.
    #[pyo3(signature = (span, pinned))]
    fn end_unit(&mut self, py: Python<'_>, span: u64, pinned: Vec<Bound<'_, PyAny>>) -> PyResult<()> {
        let _ = span;
        let unit = self.next;
        self.next += 1;
        if pinned.is_empty() {
            self.shared.released(unit);
            return Ok(());
        }
        self.shared.m.live_units.fetch_add(1, Ordering::AcqRel);
        let lease =
            Py::new(py, ArenaLease { shared: Arc::clone(&self.shared), unit, left: AtomicUsize::new(pinned.len()) })?;
        let release = lease.bind(py).getattr("release_one")?;
        let finalize = py.import("weakref")?.getattr("finalize")?;
        for anchor in pinned {
            finalize.call1((anchor, &release))?;
        }
        Ok(())
    }
}

/// Frees a pool unit's segment once each of its anchors is collected (its `release_one`, by one `weakref.finalize` per anchor). It
/// holds the mapping, which the views of the unit point into.
#[pyclass(module = "spdl_rs._native.pipeline", frozen)]
#[derive(Debug)]
pub struct ArenaLease {
    shared: Arc<PoolShared>,
    unit: u64,
    left: AtomicUsize,
}

#[pymethods]
impl ArenaLease {
    /// One anchor of the unit was collected; the last one frees the segment.
    fn release_one(&self) {
        let last = self.left.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1)) == Ok(1);
        if last {
            self.shared.m.live_units.fetch_sub(1, Ordering::AcqRel);
            self.shared.released(self.unit);
        }
    }
}
