//! The bridge between the pipeline's scheduler (tokio, no GIL) and the asyncio event loop that runs a
//! pipeline's async Python ops (on a Python thread the pipeline owns).
//!
//! The scheduler never takes the GIL to start a coroutine: it pushes a [`Job`] into a channel and writes
//! one byte to a socket the event loop watches (`loop.add_reader`). The loop wakes, takes the jobs
//! ([`AsyncBridge::take_jobs`], with the GIL, on the loop thread), starts one task per job, and each task's
//! done-callback ([`Reply::done`]) sends the outcome back through a oneshot channel the scheduler awaits.

use std::io::{ErrorKind, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::sync::Mutex;

use crossbeam_channel::{Receiver, Sender, unbounded};
use pyo3::exceptions::{PyRuntimeError, PyStopAsyncIteration};
use pyo3::prelude::*;
use tokio::sync::oneshot;

use super::failure_log::FailureLog;
use crate::error::Error;
use crate::value::Value;

/// What an async job produced, already in Rust form (converted on the loop thread, which holds the GIL).
#[derive(Debug)]
pub(crate) enum Produced {
    /// The outputs of one call (empty for `None`).
    Items(Vec<Value>),
    /// The async iterator is exhausted (or raised, which was recorded as a source failure).
    End,
    /// The object a [`JobKind::Start`] made (an async generator), as it is.
    Object(Py<PyAny>),
}

/// What the stage waiting for a job receives.
pub(crate) type Outcome = Result<Produced, Error>;

/// What the event loop is asked to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum JobKind {
    /// `await op(arg)`.
    Call,
    /// `[x async for x in op(arg)]` (an async generator function).
    CollectGen,
    /// `await op.__anext__()` (`op` is an async iterator; `arg` is ignored). `StopAsyncIteration` ends it.
    Next,
    /// `op(arg)`, called on the loop thread and returned as it is (an async generator function's generator).
    Start,
    /// `await op.__anext__()` for a stage's async generator: its value is an output (`None`: none), an
    /// exception fails the stage's item.
    GenNext,
    /// `await op.aclose()` for a stage's async generator whose stream was dropped before its end, so that
    /// the generator is finalized, and its last reference dropped, on the loop thread.
    Close,
}

/// One coroutine to start on the loop.
#[derive(Debug)]
pub(crate) struct Job {
    pub(crate) kind: JobKind,
    pub(crate) op: Arc<Py<PyAny>>,
    pub(crate) arg: Value,
    pub(crate) reply: oneshot::Sender<Outcome>,
    pub(crate) context: Arc<JobContext>,
}

/// What the loop thread needs to turn a finished task into an [`Outcome`]: shared by every job of a stage.
#[derive(Debug)]
pub(crate) struct JobContext {
    pub(crate) stage: String,
    /// Split `list`/`tuple` results for a following `disaggregate`.
    pub(crate) split: bool,
    pub(crate) failures: Arc<FailureLog>,
}

/// The scheduler's end of the bridge: cheap to clone, never touches Python.
#[derive(Debug, Clone)]
pub(crate) struct Submitter {
    jobs: Sender<Job>,
    wake: Arc<UnixStream>,
}

impl Submitter {
    /// Queues a job and wakes the loop. Returns the receiver of its outcome, or `None` if the loop is gone.
    pub(crate) fn submit(
        &self,
        kind: JobKind,
        op: &Arc<Py<PyAny>>,
        arg: Value,
        context: &Arc<JobContext>,
    ) -> Option<oneshot::Receiver<Outcome>> {
        self.submit_owned(kind, Arc::clone(op), arg, context)
    }

    /// [`Submitter::submit`], handing the caller's reference to `op` to the job: when it was the last one,
    /// the object is then released on the loop thread (with the GIL), not wherever the caller drops it.
    pub(crate) fn submit_owned(
        &self,
        kind: JobKind,
        op: Arc<Py<PyAny>>,
        arg: Value,
        context: &Arc<JobContext>,
    ) -> Option<oneshot::Receiver<Outcome>> {
        let (reply, rx) = oneshot::channel();
        let job = Job { kind, op, arg, reply, context: Arc::clone(context) };
        self.jobs.send(job).ok()?;
        // One byte per job; a full socket buffer means the loop has plenty of wake-ups pending already.
        match (&*self.wake).write(&[1]) {
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::WouldBlock => {}
            Err(_) => return None,
        }
        Some(rx)
    }
}

/// The event loop's end of the bridge (`spdl_rs._native.pipeline.AsyncBridge`), created by the pipeline's Python
/// layer together with its loop thread.
#[pyclass(module = "spdl_rs._native.pipeline", frozen)]
#[derive(Debug)]
pub struct AsyncBridge {
    submitter: Submitter,
    jobs: Receiver<Job>,
    wake_rx: Mutex<UnixStream>,
}

impl AsyncBridge {
    pub(crate) fn submitter(&self) -> Submitter {
        self.submitter.clone()
    }
}

#[pymethods]
impl AsyncBridge {
    /// A new bridge; register `fileno()` with `loop.add_reader` and call `take_jobs` when it is readable.
    #[new]
    fn new() -> PyResult<Self> {
        let (wake_tx, wake_rx) = UnixStream::pair()
            .map_err(|e| PyRuntimeError::new_err(format!("creating the async bridge's socket pair: {e}")))?;
        for s in [&wake_tx, &wake_rx] {
            s.set_nonblocking(true)
                .map_err(|e| PyRuntimeError::new_err(format!("making the async bridge's socket non-blocking: {e}")))?;
        }
        let (tx, rx) = unbounded();
        Ok(Self { submitter: Submitter { jobs: tx, wake: Arc::new(wake_tx) }, jobs: rx, wake_rx: Mutex::new(wake_rx) })
    }

    /// The file descriptor that becomes readable when jobs are waiting.
    fn fileno(&self) -> i32 {
        self.wake_rx.lock().map(|s| s.as_raw_fd()).unwrap_or(-1)
    }

    /// Drains the wake-up bytes and returns the waiting jobs as `(kind, op, arg, reply)` tuples, kind being
    /// `"call"`, `"gen"` or `"next"`. The loop starts one task per job and adds `reply.done` as its
    /// done-callback.
    fn take_jobs(&self, py: Python<'_>) -> PyResult<Vec<JobTuple>> {
        super::no_panic("the async bridge", || self.jobs_now(py))
    }
}

impl AsyncBridge {
    fn jobs_now(&self, py: Python<'_>) -> PyResult<Vec<JobTuple>> {
        if let Ok(mut s) = self.wake_rx.lock() {
            let mut sink = [0u8; 256];
            while matches!(s.read(&mut sink), Ok(n) if n > 0) {}
        }
        let mut out = Vec::new();
        while let Ok(job) = self.jobs.try_recv() {
            let kind = match job.kind {
                JobKind::Call => "call",
                JobKind::CollectGen => "gen",
                JobKind::Next | JobKind::GenNext => "next",
                JobKind::Start => "start",
                JobKind::Close => "close",
            };
            let arg = job.arg.into_py(py)?;
            let reply = Reply { kind: job.kind, slot: Mutex::new(Some((job.reply, job.context))) };
            out.push((kind, job.op.clone_ref(py), arg, reply));
        }
        Ok(out)
    }
}

/// One job as the loop sees it: `(kind, op, arg, reply)`.
type JobTuple = (&'static str, Py<PyAny>, Py<PyAny>, Reply);

/// The done-callback of one async job: sends the task's outcome to the stage waiting for it.
#[pyclass(module = "spdl_rs._native.pipeline", frozen)]
#[derive(Debug)]
pub struct Reply {
    kind: JobKind,
    /// Taken by the first outcome (the others are ignored). Nothing of the job is kept after it: a traceback
    /// kept for `PipelineFailure` may hold the frame that holds this reply, and a context kept here would
    /// close a cycle through native objects (reply, context, failure record, exception) that the garbage
    /// collector cannot see.
    slot: Mutex<Option<(oneshot::Sender<Outcome>, Arc<JobContext>)>>,
}

#[pymethods]
impl Reply {
    /// Called with the finished task (or future): forwards `task.result()` or its exception. A cancelled
    /// task (the pipeline is stopping) is dropped quietly: nobody waits for it, and its `CancelledError` is
    /// not an op's failure.
    fn done(&self, task: Bound<'_, PyAny>) -> PyResult<()> {
        super::no_panic("the async bridge", || {
            if task.call_method0("cancelled").and_then(|c| c.is_truthy()).unwrap_or(false) {
                drop(self.take());
                return Ok(());
            }
            let result = task.call_method0("result");
            self.finish(task.py(), result);
            Ok(())
        })
    }

    /// Fails the job with `exc` (the op raised before it returned a coroutine).
    fn fail(&self, exc: Bound<'_, PyAny>) -> PyResult<()> {
        super::no_panic("the async bridge", || {
            let py = exc.py();
            self.finish(py, Err(PyErr::from_value(exc)));
            Ok(())
        })
    }
}

impl Reply {
    /// Converts the task's result (with the GIL, on the loop thread) and sends it.
    fn finish(&self, py: Python<'_>, result: PyResult<Bound<'_, PyAny>>) {
        let Some((tx, ctx)) = self.take() else {
            return; // the job's outcome was given already (`fail` from the guard, then `done`)
        };
        let outcome = match (self.kind, result) {
            (JobKind::Call, Ok(obj)) if obj.is_none() => Ok(Produced::Items(Vec::new())),
            (JobKind::Call, Ok(obj)) => Ok(Produced::Items(vec![Value::from_op_output(obj, ctx.split)])),
            (JobKind::CollectGen, Ok(obj)) => {
                collect(obj, ctx.split).map(Produced::Items).map_err(|e| ctx.failures.record(py, &ctx.stage, e))
            }
            (JobKind::Next, Ok(obj)) => Ok(Produced::Items(vec![Value::from_py(obj)])),
            (JobKind::Start, Ok(obj)) => Ok(Produced::Object(obj.unbind())),
            (JobKind::GenNext, Ok(obj)) if obj.is_none() => Ok(Produced::Items(Vec::new())),
            (JobKind::GenNext, Ok(obj)) => Ok(Produced::Items(vec![Value::from_op_output(obj, ctx.split)])),
            (JobKind::Next | JobKind::GenNext, Err(e)) if e.is_instance_of::<PyStopAsyncIteration>(py) => {
                Ok(Produced::End)
            }
            // An abandoned generator's `aclose()`: its outcome has no item to fail; only a fatal exception
            // (Ctrl-C while it closes) still stops the pipeline.
            (JobKind::Close, Ok(_)) => Ok(Produced::End),
            (JobKind::Close, Err(e)) if !ctx.failures.is_fatal(py, &e) => Ok(Produced::End),
            (JobKind::Next, Err(e)) => {
                ctx.failures.record_source(py, e);
                Ok(Produced::End)
            }
            (_, Err(e)) => Err(ctx.failures.record(py, &ctx.stage, e)),
        };
        // The stage may have been cancelled (pipeline stopped): then nobody waits, and that is fine.
        let _ = tx.send(outcome);
    }

    fn take(&self) -> Option<(oneshot::Sender<Outcome>, Arc<JobContext>)> {
        self.slot.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take()
    }
}

/// The non-`None` elements of an iterable (an async generator's collected outputs).
fn collect(obj: Bound<'_, PyAny>, split: bool) -> PyResult<Vec<Value>> {
    let mut out = Vec::new();
    for item in obj.try_iter()? {
        let item = item?;
        if !item.is_none() {
            out.push(Value::from_op_output(item, split));
        }
    }
    Ok(out)
}
