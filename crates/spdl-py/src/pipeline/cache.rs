//! `spdl_rs.pipeline.cache_iterator`: yields a source's first items while keeping some, then replays the
//! kept ones (SPDL's way to measure a training loop as if data loading cost nothing).

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::{PyTraverseError, PyVisit};

/// Where a [`CacheIterator`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Not iterated yet: the arguments are checked on the first `next()`.
    Start,
    /// Yielding the source's items.
    Source,
    /// Replaying the cache.
    Replay,
    /// Exhausted.
    Done,
}

/// The iterator `cache_iterator` returns.
#[pyclass(module = "spdl_rs._native.pipeline")]
#[derive(Debug)]
pub struct CacheIterator {
    src: Option<Py<PyAny>>,
    /// The source's iterator, while [`Phase::Source`].
    it: Option<Py<PyAny>>,
    cache: Vec<Py<PyAny>>,
    num_caches: i64,
    return_caches_after: Option<i64>,
    stop_after: Option<i64>,
    delete_src: bool,
    count: i64,
    replayed: usize,
    phase: Phase,
}

impl CacheIterator {
    /// SPDL's argument checks, with its messages.
    fn check(&self) -> PyResult<()> {
        let (num_caches, after, stop) = (self.num_caches, self.return_caches_after, self.stop_after);
        let err = |msg: String| Err(PyValueError::new_err(msg));
        if num_caches <= 0 {
            return err(format!("`num_caches` must be greater than zero. Found: {num_caches}"));
        }
        let pair = |a: &str, x: i64, b: &str, y: i64| format!("{a}={x}, {b}={y}");
        if let Some(after) = after.filter(|&a| a < num_caches) {
            return err(format!(
                "When provided, `return_caches_after` must be greater than or equal to `num_caches`. {}",
                pair("num_caches", num_caches, "return_caches_after", after)
            ));
        }
        if let Some(stop) = stop {
            if stop < num_caches {
                return err(format!(
                    "When provided, `stop_after` must be greater than or equal to `num_caches`. {}",
                    pair("num_caches", num_caches, "stop_after", stop)
                ));
            }
            if let Some(after) = after.filter(|&a| stop < a) {
                return err(format!(
                    "When provided, `stop_after` must be greater than or equal to `return_caches_after`. {}",
                    pair("return_caches_after", after, "stop_after", stop)
                ));
            }
        }
        Ok(())
    }

    /// Leaves the source: closes its iterator now (e.g. a data loader's background pipeline) rather than when
    /// it is collected; an iterator the caller passed in is theirs to close.
    fn leave_source(&mut self, py: Python<'_>) -> PyResult<()> {
        let it = self.it.take();
        let src = if self.delete_src { self.src.take() } else { self.src.as_ref().map(|s| s.clone_ref(py)) };
        if let Some(it) = it.map(|it| it.into_bound(py))
            && src.as_ref().is_none_or(|s| !s.bind(py).is(&it))
            && let Ok(close) = it.getattr("close")
            && close.is_callable()
        {
            close.call0()?;
        }
        Ok(())
    }

    fn step(&mut self, py: Python<'_>) -> PyResult<Option<Py<PyAny>>> {
        let limit = self.stop_after.unwrap_or(i64::MAX);
        if self.phase == Phase::Start {
            self.check()?;
            let src = self.src.as_ref().map(|s| s.bind(py).try_iter()).transpose()?;
            self.it = src.map(|it| it.into_any().unbind());
            self.phase = Phase::Source;
        }
        if self.phase == Phase::Source {
            let next = match &self.it {
                Some(it) => it.bind(py).call_method0("__next__").map(Some),
                None => Ok(None),
            };
            match next {
                Ok(Some(item)) => {
                    self.count += 1;
                    if self.cache.len() < usize::try_from(self.num_caches).unwrap_or(usize::MAX) {
                        self.cache.push(item.clone().unbind());
                    }
                    if self.count >= limit {
                        self.phase = Phase::Done;
                        self.leave_source(py)?;
                    } else if self.count >= self.return_caches_after.unwrap_or(self.num_caches) {
                        self.phase = Phase::Replay;
                        self.leave_source(py)?;
                    }
                    return Ok(Some(item.unbind()));
                }
                Err(e) if !e.is_instance_of::<pyo3::exceptions::PyStopIteration>(py) => {
                    self.phase = Phase::Done;
                    self.leave_source(py)?;
                    return Err(e);
                }
                _ => {
                    self.phase = Phase::Replay;
                    self.leave_source(py)?;
                }
            }
        }
        if self.phase == Phase::Replay && !self.cache.is_empty() && self.count < limit {
            let item = self.cache[self.replayed % self.cache.len()].clone_ref(py);
            self.replayed += 1;
            self.count += 1;
            return Ok(Some(item));
        }
        self.phase = Phase::Done;
        Ok(None)
    }
}

#[pymethods]
impl CacheIterator {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__(&mut self, py: Python<'_>) -> PyResult<Option<Py<PyAny>>> {
        let out = self.step(py);
        if out.is_err() {
            self.phase = Phase::Done;
        }
        out
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        for obj in self.src.iter().chain(self.it.iter()).chain(self.cache.iter()) {
            visit.call(obj)?;
        }
        Ok(())
    }

    fn __clear__(&mut self) {
        self.src = None;
        self.it = None;
        self.cache.clear();
    }
}

/// Yields the items of ``src`` while keeping the first ``num_caches``, then yields the kept ones over and
/// over: to measure how fast the training loop would run if data loading cost nothing.
///
/// Args:
///     src: The source (typically a data loader).
///     num_caches: How many items to keep (positive).
///     return_caches_after: After how many items of ``src`` the cache takes over (default: ``num_caches``;
///         at least ``num_caches``).
///     stop_after: Stop after this many items in all (at least ``num_caches``); default: never.
///     delete_src: Drop the reference to ``src`` once the cache takes over, so its resources can be freed.
///
/// The arguments are checked when iteration starts (the first ``next()``). An empty ``src`` ends at once.
#[pyfunction]
#[pyo3(signature = (src, num_caches, *, return_caches_after=None, stop_after=None, delete_src=true))]
pub fn cache_iterator(
    src: Py<PyAny>,
    num_caches: i64,
    return_caches_after: Option<i64>,
    stop_after: Option<i64>,
    delete_src: bool,
) -> CacheIterator {
    CacheIterator {
        src: Some(src),
        it: None,
        cache: Vec::new(),
        num_caches,
        return_caches_after,
        stop_after,
        delete_src,
        count: 0,
        replayed: 0,
        phase: Phase::Start,
    }
}
