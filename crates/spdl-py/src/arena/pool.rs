//! `SharedMemorySegmentPool`: `count` segments used in turn, one per unit; the parent gets zero-copy views,
//! and a segment is reused once every view of its unit has been collected.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use pyo3::prelude::*;
use pyo3::types::{PyMemoryView, PySlice};

use super::layout::Watermark;
use super::shm::Control;
use super::{ArenaError, Handle, Mapped, byte_view, check_timeout, copy_in, data_at, layout, positive, wait_for_space};

/// **[Experimental]** ``count`` shared-memory segments of ``segment_size`` bytes, one per item in turn, for
/// :py:func:`iterate_in_subprocess` (``arena=``); the parent gets zero-copy views into them.
///
/// A segment is reused once every view restored from it is garbage-collected, so holding many restored items
/// makes the writer wait (at most ``acquire_timeout`` seconds, then :py:exc:`BufferError`; ``0``: fail at once).
/// Restored ``bytes``/``bytearray`` come back as ``memoryview`` (the zero-copy view itself). A view, and any slice of
/// it, keeps the memory it points to mapped; a slice kept after its restored item is collected may see the segment
/// reused by a later item.
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
        // count > 0 (checked at construction); `checked_rem` keeps this free of a panic path regardless.
        unit.checked_rem(self.count as u64).unwrap_or(0) as usize * self.stride + offset
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
        segment_size: i64,
        count: i64,
        acquire_timeout: f64,
    ) -> PyResult<Self> {
        let segment_size = positive(segment_size, "segment_size")?;
        let count = positive(count, "count")?;
        check_timeout(acquire_timeout)?;
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
    ///
    /// The views it hands out are slices of a Python `mmap` of the segment, made here: each view, and each slice
    /// of one, holds that mapping (Python's buffer protocol), so no view can outlive the memory it points to,
    /// whatever happens to the pool. (A native object cannot export a buffer in the stable ABI of Python 3.10.)
    fn open_reader(&self, py: Python<'_>) -> PyResult<PoolReader> {
        use std::os::fd::AsRawFd;
        let m = self.h.mapped()?;
        let fd = super::shm::Segment::open_fd(&self.h.name)?;
        let len = self.h.data_len + super::shm::CTRL_SIZE;
        let map = py.import("mmap")?.getattr("mmap")?.call1((fd.as_raw_fd(), len))?;
        drop(fd);
        let view = PyMemoryView::from(&map)?.into_any().unbind();
        let shared = PoolShared { m, geometry: self.geometry, watermark: Mutex::new(Watermark::default()) };
        Ok(PoolReader { shared: Arc::new(shared), next: 0, view })
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
    /// A `memoryview` of the whole segment over a Python `mmap` (see `open_reader`).
    view: Py<PyAny>,
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

    /// A writable `memoryview` of `nbytes` bytes at `offset` of the current unit's segment (no copy), which
    /// keeps the segment mapped while it (or a slice of it) lives.
    fn read_binary<'py>(&self, py: Python<'py>, offset: u64, nbytes: u64) -> PyResult<Bound<'py, PyAny>> {
        let g = self.shared.geometry;
        layout::pool_check_marker(g.segment_size, offset, nbytes)?;
        let start = super::shm::CTRL_SIZE + g.at(self.next, offset as usize);
        let end = start.checked_add(nbytes as usize).ok_or(ArenaError::TooLarge { bytes: nbytes as usize })?;
        let (start, end) = (isize::try_from(start)?, isize::try_from(end)?);
        self.view.bind(py).get_item(PySlice::new(py, start, end, 1))
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
