//! The scheduler of SPDL's priority pool executors (`spdl_rs.pipeline.PriorityThreadPoolExecutor` and its
//! siblings): submitted calls wait in one heap ordered by `(priority, submission count)`, and at most
//! `slots` of them are handed to the underlying stdlib pool at a time, so that the pool's own FIFO queue never
//! decides the order.
//!
//! No Python code runs while the heap's lock is held (a callback could re-enter the scheduler on this
//! thread), and the lock is never held while waiting for the GIL.

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

/// How often a `shutdown(wait=True)` re-checks the heap (and lets Ctrl-C through).
const WAIT_SLICE: Duration = Duration::from_millis(100);

/// One waiting call.
#[derive(Debug)]
struct Waiting {
    /// `(priority, count)`: smaller first.
    key: (i64, i64),
    /// Submission order: FIFO among equal keys.
    seq: u64,
    future: Py<PyAny>,
    call: Py<PyAny>,
    args: Py<PyTuple>,
    kwargs: Option<Py<PyDict>>,
}

impl PartialEq for Waiting {
    fn eq(&self, other: &Self) -> bool {
        (self.key, self.seq) == (other.key, other.seq)
    }
}

impl Eq for Waiting {}

impl PartialOrd for Waiting {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Waiting {
    /// Reversed: [`BinaryHeap`] pops its greatest element, the scheduler wants the smallest key.
    fn cmp(&self, other: &Self) -> Ordering {
        (other.key, other.seq).cmp(&(self.key, self.seq))
    }
}

#[derive(Debug, Default)]
struct State {
    heap: BinaryHeap<Waiting>,
    seq: u64,
    running: usize,
    shutdown: bool,
    pool_closed: bool,
}

impl State {
    /// Whether the pool must be shut down now: shutdown was asked for and no call is left.
    fn take_pool_close(&mut self) -> bool {
        let close = self.shutdown && self.heap.is_empty() && self.running == 0 && !self.pool_closed;
        self.pool_closed |= close;
        close
    }
}

/// The waiting calls of one priority pool executor, in front of its stdlib pool `pool`, which runs at most
/// `slots` of them at a time.
#[pyclass(module = "spdl_rs._native.pipeline", frozen)]
#[derive(Debug)]
pub struct PriorityScheduler {
    pool: Py<PyAny>,
    slots: usize,
    state: Mutex<State>,
    changed: Condvar,
}

impl PriorityScheduler {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Hands the most urgent waiting calls to the pool while it has an idle worker.
    fn dispatch(slf: &Bound<'_, Self>) -> PyResult<()> {
        let py = slf.py();
        let this = slf.get();
        loop {
            let w = {
                let mut state = this.lock();
                let next = if state.running < this.slots { state.heap.pop() } else { None };
                let Some(w) = next else {
                    let close = state.take_pool_close();
                    drop(state);
                    if close {
                        this.pool.bind(py).call_method1("shutdown", (false,))?;
                    }
                    return Ok(());
                };
                state.running += 1;
                w
            };
            let future = w.future.bind(py);
            if !future.call_method0("set_running_or_notify_cancel")?.is_truthy()? {
                this.finish();
                continue;
            }
            let args: Vec<Bound<'_, PyAny>> =
                std::iter::once(w.call.bind(py).clone()).chain(w.args.bind(py).iter()).collect();
            let args = PyTuple::new(py, args)?;
            match this.pool.bind(py).call_method("submit", args, w.kwargs.as_ref().map(|k| k.bind(py))) {
                Ok(inner) => {
                    let callback =
                        py.import("functools")?.getattr("partial")?.call1((slf.getattr("_finished")?, future))?;
                    inner.call_method1("add_done_callback", (callback,))?;
                }
                // A broken pool fails this call, not the dispatcher.
                Err(e) => {
                    this.finish();
                    future.call_method1("set_exception", (e.value(py),))?;
                }
            }
        }
    }

    /// One running call ended.
    fn finish(&self) {
        self.lock().running -= 1;
        self.changed.notify_all();
    }
}

#[pymethods]
impl PriorityScheduler {
    /// A scheduler in front of `pool` (a stdlib executor) running at most `slots` calls at a time.
    #[new]
    fn new(pool: Py<PyAny>, slots: usize) -> Self {
        Self { pool, slots: slots.max(1), state: Mutex::new(State::default()), changed: Condvar::new() }
    }

    /// Queues `call(*args, **kwargs)` with `priority` (`(priority, count)`, smaller first) and returns its
    /// `concurrent.futures.Future`.
    #[pyo3(signature = (priority, call, args, kwargs=None))]
    fn submit(
        slf: &Bound<'_, Self>,
        priority: (i64, i64),
        call: Py<PyAny>,
        args: Py<PyTuple>,
        kwargs: Option<Py<PyDict>>,
    ) -> PyResult<Py<PyAny>> {
        let py = slf.py();
        let future = py.import("concurrent.futures")?.getattr("Future")?.call0()?.unbind();
        {
            let mut state = slf.get().lock();
            if state.shutdown {
                return Err(PyRuntimeError::new_err("cannot schedule new futures after shutdown"));
            }
            let seq = state.seq;
            state.seq += 1;
            state.heap.push(Waiting { key: priority, seq, future: future.clone_ref(py), call, args, kwargs });
        }
        Self::dispatch(slf)?;
        Ok(future)
    }

    /// The pool's callback when a call it ran is `done`: passes its outcome to `future`, then dispatches.
    fn _finished(slf: &Bound<'_, Self>, future: &Bound<'_, PyAny>, done: &Bound<'_, PyAny>) -> PyResult<()> {
        slf.get().finish();
        if done.call_method0("cancelled")?.is_truthy()? {
            let e = PyRuntimeError::new_err("the call was cancelled by the pool's shutdown");
            future.call_method1("set_exception", (e.value(slf.py()),))?;
        } else {
            let exc = done.call_method0("exception")?;
            if exc.is_none() {
                future.call_method1("set_result", (done.call_method0("result")?,))?;
            } else {
                future.call_method1("set_exception", (exc,))?;
            }
        }
        Self::dispatch(slf)
    }

    /// Accepts no more calls; runs (or, with `cancel_futures`, cancels) the waiting ones; with `wait`,
    /// returns once every call is done and the pool's workers have exited. Without `wait`, the pool is shut
    /// down when its last call ends.
    #[pyo3(signature = (wait=true, cancel_futures=false))]
    fn shutdown(&self, py: Python<'_>, wait: bool, cancel_futures: bool) -> PyResult<()> {
        let cancelled: Vec<Waiting> = {
            let mut state = self.lock();
            state.shutdown = true;
            if cancel_futures { state.heap.drain().collect() } else { Vec::new() }
        };
        for w in cancelled {
            w.future.bind(py).call_method0("cancel")?;
        }
        if wait {
            loop {
                let idle = crate::lifecycle::detach(py, || {
                    let state = self.lock();
                    let (state, _) = self
                        .changed
                        .wait_timeout_while(state, WAIT_SLICE, |s| !s.heap.is_empty() || s.running > 0)
                        .unwrap_or_else(PoisonError::into_inner);
                    state.heap.is_empty() && state.running == 0
                });
                if idle {
                    break;
                }
                py.check_signals()?;
            }
        }
        let close = {
            let mut state = self.lock();
            let close = state.heap.is_empty() && state.running == 0 && !state.pool_closed;
            state.pool_closed |= close;
            close
        };
        if close {
            let kwargs = PyDict::new(py);
            kwargs.set_item("wait", wait)?;
            kwargs.set_item("cancel_futures", cancel_futures)?;
            self.pool.bind(py).call_method("shutdown", (), Some(&kwargs))?;
        }
        Ok(())
    }
}
