//! `SharedMemoryRingBuffer`: one segment used as a ring; the parent copies each binary out, so its bytes are
//! free again at the unit's end.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyMemoryView};

use super::shm::Control;
use super::{ArenaError, Handle, Mapped, byte_view, check_timeout, copy_in, data_at, layout, positive, wait_for_space};

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
    fn _attach(
        _cls: &Bound<'_, pyo3::types::PyType>,
        name: String,
        capacity: i64,
        acquire_timeout: f64,
    ) -> PyResult<Self> {
        let capacity = positive(capacity, "capacity")?;
        check_timeout(acquire_timeout)?;
        Ok(Self { h: Handle::attached(name, capacity, acquire_timeout) })
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
