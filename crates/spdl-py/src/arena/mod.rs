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
mod pool;
mod ring;
mod shm;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use pyo3::exceptions::{PyBufferError, PyException, PyOSError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyMemoryView, PySlice};

pub use pool::{ArenaLease, PoolReader, PoolWriter, SharedMemorySegmentPool};
pub use ring::{RingReader, RingWriter, SharedMemoryRingBuffer};
use shm::{Control, Segment, Waited};

pyo3::create_exception!(
    spdl_rs._native.pipeline,
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
    /// The shared-memory filesystem has less free space than the arena needs.
    #[error("an arena of {needed} bytes does not fit the {free} bytes free for shared memory (/dev/shm)")]
    NoSpace {
        /// Bytes the segment needs.
        needed: usize,
        /// Bytes free.
        free: u64,
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
            ArenaError::NoSpace { .. } => PyOSError::new_err((libc::ENOSPC, msg)),
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
