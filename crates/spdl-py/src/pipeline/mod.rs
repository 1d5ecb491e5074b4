//! The engine side of `spdl_rs.pipeline`: [`PipelineCore`] builds an [`spdl_exec::Pipeline`] over
//! [`Value`]s from the step list the Python `PipelineBuilder` collected, and serves the Python `Pipeline`
//! (start, stop, get_item, stats). Waiting for items, stopping and joining run with the GIL released.

mod bridge;
mod cache;
mod failure_log;
mod life;
pub(crate) mod observe;
mod ops;
mod priority;
pub(crate) mod spec;
pub(crate) mod tstate;
mod wiring;

use std::mem::ManuallyDrop;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use pyo3::exceptions::{PyRuntimeError, PyTimeoutError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use pyo3::{PyTraverseError, PyVisit};
use spdl_exec::autotune::Window;
use spdl_exec::{BuildOptions, FailureBudget, Item, Pipeline, PipelineBuilder, PipelineError, PipelineStats, state};

pub use bridge::{AsyncBridge, Reply};
pub use cache::{CacheIterator, cache_iterator};
use failure_log::FailureLog;
pub use ops::{NativeOp, PyNativeOp};
pub use priority::PriorityScheduler;
use wiring::Chain;
pub use wiring::RegionInputs;

use crate::error::Error;
use crate::value::Value;

/// Capacity used for SPDL's `add_sink(buffer_size=0)` ("unlimited"): the engine's queues are bounded.
const UNBOUNDED_SINK: usize = 4096;
/// How long a blocking wait runs before checking for Ctrl-C.
const SIGNAL_SLICE: Duration = Duration::from_millis(100);
/// How long dropping a `PipelineCore` (garbage collection, interpreter exit) waits for its threads; an op
/// still running then is left to finish on its own thread.
const DROP_WAIT: Duration = Duration::from_secs(1);
/// How long `get_item` waits for the engine's threads when a fatal exception stops the pipeline (the
/// Python layer's `stop` waits again).
const FATAL_STOP_WAIT: Duration = Duration::from_secs(5);
/// Default capacity of the queues between stages (SPDL's, which is fixed: `_BUFFER_SIZE = 2`), exported as
/// `_native.pipeline.DEFAULT_STAGE_BUFFER_SIZE`.
pub(crate) const DEFAULT_STAGE_BUFFER: usize = 2;

/// `PipelineFailure`'s arguments: `(stage, exception)` pairs, the message, the failing stage.
type Failure = (Vec<(String, Py<PyAny>)>, String, Option<String>);

/// Where the next [`PipelineCore`]'s id comes from (a [`StatsSnapshot`] names the pipeline it was taken on).
static NEXT_CORE_ID: AtomicU64 = AtomicU64::new(0);

/// Runs the body of a Python-facing method, turning a Rust panic into a `RuntimeError`. (PyO3 would raise
/// `pyo3_runtime.PanicException`, a `BaseException` that `except Exception` does not catch.)
pub(crate) fn no_panic<R>(what: &str, f: impl FnOnce() -> PyResult<R>) -> PyResult<R> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(payload) => {
            let msg = spdl_report::panic_message(&*payload);
            Err(PyRuntimeError::new_err(format!("spdl_rs internal error in {what}: {msg}")))
        }
    }
}

/// A timeout in seconds from Python. `None`, and values too large for a `Duration` (`inf`, `1e300`), mean
/// no limit; NaN and negative values are a `ValueError`.
pub(crate) fn timeout_arg(timeout: Option<f64>) -> PyResult<Option<Duration>> {
    match timeout {
        None => Ok(None),
        Some(t) if t.is_nan() || t < 0.0 => {
            Err(PyValueError::new_err(format!("timeout must be a non-negative number of seconds or None, got {t}")))
        }
        Some(t) => Ok(Duration::try_from_secs_f64(t).ok()),
    }
}

/// The instant `timeout` from now; `None` (no deadline) when there is no timeout or it is beyond what an
/// `Instant` can represent.
fn deadline(timeout: Option<Duration>) -> Option<Instant> {
    timeout.and_then(|t| Instant::now().checked_add(t))
}

/// The built engine pipeline; a batch sink yields `list`s.
enum Sink {
    One(Pipeline<Value>),
    Batch(Pipeline<Vec<Value>>),
}

impl Sink {
    fn get_item(&self, timeout: Option<Duration>) -> Result<Option<Item<Value>>, PipelineError> {
        match self {
            Sink::One(p) => p.get_item(timeout),
            Sink::Batch(p) => p.get_item(timeout).map(|o| {
                o.map(|i| match i {
                    Item::Data(v) => Item::Data(Value::List(v)),
                    Item::EpochEnd { epoch } => Item::EpochEnd { epoch },
                })
            }),
        }
    }

    fn start(&self) -> Result<(), PipelineError> {
        match self {
            Sink::One(p) => p.start(),
            Sink::Batch(p) => p.start(),
        }
    }

    fn stop_timeout(&self, timeout: Duration) -> Result<(), spdl_exec::StopTimeout> {
        match self {
            Sink::One(p) => p.stop_timeout(timeout),
            Sink::Batch(p) => p.stop_timeout(timeout),
        }
    }

    fn stats(&self) -> spdl_exec::PipelineStats {
        match self {
            Sink::One(p) => p.stats(),
            Sink::Batch(p) => p.stats(),
        }
    }

    fn autotune(&self) -> Option<spdl_exec::autotune::AutotuneReport> {
        match self {
            Sink::One(p) => p.autotune(),
            Sink::Batch(p) => p.autotune(),
        }
    }
}

/// A built pipeline, driven by the Python `spdl_rs.pipeline.Pipeline` (which adds the Python-facing
/// behaviour: `auto_stop`, iterators, `PipelineFailure`); its stats reporter and the order of a shutdown are
/// here (`life.rs`).
///
/// Lifecycle (see `crate::lifecycle`): made in one process, it refuses to run in a forked child and is leaked
/// there rather than torn down (its threads stayed in the parent); while the interpreter exits, dropping it
/// only tells its threads to stop. It holds its step descriptions and reports them to the garbage collector,
/// so that a pipeline whose op refers back to the object that owns the pipeline is collected (and its threads
/// stopped) like any other cycle. Weak references to it are allowed: the Python `Pipeline`'s finalizer holds
/// one, so that the finalizer does not keep the pipeline's ops alive.
#[pyclass(module = "spdl_rs._native.pipeline", frozen, weakref)]
pub struct PipelineCore {
    sink: ManuallyDrop<Sink>,
    /// The source and steps it was built from: they own the Python objects the engine's stages call (shared
    /// with the stages, not copied), and `__traverse__` visits them.
    source: spec::Source,
    steps: Vec<spec::Step>,
    /// The fork generation it was built in (`crate::lifecycle::generation`).
    generation: u64,
    failures: Arc<FailureLog>,
    /// The error that ended iteration (a spent failure budget), kept for `stop()` to raise.
    error: Mutex<Option<String>>,
    error_stage: Mutex<Option<String>>,
    /// A bounded `stop` timed out: dropping does not wait again.
    abandoned: AtomicBool,
    /// This pipeline's id, kept by the [`StatsSnapshot`]s taken on it.
    id: u64,
    /// The failure was handed out (`take_failure`) or is not to be.
    failure_taken: AtomicBool,
    /// The stats reporter, while it runs (`start_reporter`).
    reporter: Mutex<Option<life::Reporter>>,
}

impl std::fmt::Debug for PipelineCore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PipelineCore").finish_non_exhaustive()
    }
}

impl PipelineCore {
    /// See the `stop` method.
    fn stop_engine(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<()> {
        if crate::lifecycle::made_before_fork(self.generation) {
            return Ok(()); // a forked child's copy: its threads are in the parent, nothing runs here
        }
        if let Some(r) = self.reporter.lock().unwrap_or_else(PoisonError::into_inner).as_ref() {
            r.signal(); // no report once stopping (`shutdown` logs the final one)
        }
        no_panic("Pipeline.stop", || {
            let deadline = deadline(timeout_arg(timeout)?);
            loop {
                let slice =
                    deadline.map_or(SIGNAL_SLICE, |d| d.saturating_duration_since(Instant::now()).min(SIGNAL_SLICE));
                if crate::lifecycle::detach(py, || self.sink.stop_timeout(slice)).is_ok() {
                    return Ok(());
                }
                py.check_signals()?;
                if deadline.is_some_and(|d| Instant::now() >= d) {
                    self.abandoned.store(true, Ordering::Relaxed);
                    return Err(PyTimeoutError::new_err(format!(
                        "the pipeline did not stop within {} s: an op is still running (the pipeline is stopped; the \
                         op's thread is left to finish on its own)",
                        timeout.unwrap_or_default()
                    )));
                }
            }
        })
    }

    fn set_error(&self, message: String, stage: Option<String>) {
        let mut e = self.error.lock().unwrap_or_else(PoisonError::into_inner);
        if e.is_none() {
            *e = Some(message);
            *self.error_stage.lock().unwrap_or_else(PoisonError::into_inner) = stage;
        }
    }
}

/// The whole pipeline's options (`spdl_rs._native.pipeline.CoreOptions`): the boundary where the Python
/// builder's pipeline-wide values are checked, once (the builder reads the checked values back).
#[pyclass(module = "spdl_rs._native.pipeline", frozen, from_py_object)]
#[derive(Debug, Clone)]
pub struct CoreOptions {
    /// The sink's buffer (0: a large one).
    #[pyo3(get)]
    buffer_size: usize,
    /// The size of the pool that runs sync ops.
    #[pyo3(get)]
    num_threads: usize,
    failure_budget: FailureBudget,
    /// Each queue's capacity, in items.
    #[pyo3(get)]
    stage_buffer_size: usize,
    autotune: bool,
    max_memory_bytes: Option<u64>,
}

#[pymethods]
impl CoreOptions {
    /// `buffer_size`: the sink's, which also holds the `stage_buffer_size` of the queue SPDL has before its
    /// sink (0: a large one); `num_threads`: the pool of sync ops; `max_failures` (SPDL's:
    /// `None`, a count with -1 for none, or a `fractions.Fraction` of the calls): the pipeline's failure budget; `stage_buffer_size`: each queue's
    /// capacity (`None`: [`DEFAULT_STAGE_BUFFER`]); `autotune`: tune the concurrency of the stages left at 1
    /// and the pool while running (`spdl_exec::BuildOptions::autotune`); `max_memory_bytes`: the auto-tuner's
    /// memory budget (`None`: half of the memory available at start). Each is checked here, once: a count of
    /// threads within the module's limit, sizes within `2**48` ([`crate::args::pipeline_size`]).
    #[new]
    #[pyo3(signature = (
        *,
        buffer_size: "int",
        num_threads: "int",
        max_failures=None,
        stage_buffer_size: "int | None" = None,
        autotune=false,
        max_memory_bytes: "int | None" = None,
    ))]
    fn new(
        buffer_size: &Bound<'_, PyAny>,
        num_threads: &Bound<'_, PyAny>,
        max_failures: Option<&Bound<'_, PyAny>>,
        stage_buffer_size: Option<&Bound<'_, PyAny>>,
        autotune: bool,
        max_memory_bytes: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        if !crate::args::is_plain_int(num_threads) {
            let shown = num_threads.repr()?;
            return Err(PyValueError::new_err(format!("num_threads must be a positive integer, got {shown}")));
        }
        let threads = crate::args::count("num_threads", &num_threads.extract()?, 1, crate::args::MAX_THREADS)?;
        let stage_buffer_size = match stage_buffer_size {
            Some(v) => crate::args::pipeline_size("stage_buffer_size", v, 1)? as usize,
            None => DEFAULT_STAGE_BUFFER,
        };
        let buffer_size = crate::args::pipeline_size("buffer_size", buffer_size, 0)? as usize;
        let max_memory_bytes =
            max_memory_bytes.map(|v| crate::args::pipeline_size("max_memory_bytes", v, 1)).transpose()?;
        Ok(Self {
            buffer_size,
            num_threads: threads,
            failure_budget: match max_failures {
                Some(m) => spec::pipeline_budget(m)?,
                None => FailureBudget::Unlimited,
            },
            stage_buffer_size,
            autotune,
            max_memory_bytes,
        })
    }
}

impl PipelineCore {
    fn build(
        py: Python<'_>,
        source: &Bound<'_, PyAny>,
        steps: &Bound<'_, PyAny>,
        options: &CoreOptions,
        bridge: Option<Bound<'_, AsyncBridge>>,
    ) -> PyResult<Self> {
        let CoreOptions { buffer_size, num_threads, failure_budget, stage_buffer_size, autotune, max_memory_bytes } =
            *options;
        let failures = Arc::new(FailureLog::new(py)?);
        let submitter = bridge.as_ref().map(|b| b.get().submitter());
        let ctx = wiring::Ctx { failures: &failures, submitter: submitter.as_ref(), chunk: stage_buffer_size };
        let (source, steps) = (spec::source(source)?, spec::steps(steps)?);
        let chain = wiring::steps_on(py, Chain::One(wiring::source(py, &source, &ctx)?), &steps, &ctx)?;

        // SPDL's consumer reads `buffer_size` items buffered by its sink coroutine, which reads them from the
        // last stage's output queue (of `_BUFFER_SIZE`, 2): that queue and the sink's buffer are what runs ahead
        // of the consumer. The engine's last stage pushes straight into the sink, so the sink holds both.
        let buffer_size = if buffer_size == 0 { UNBOUNDED_SINK } else { buffer_size.saturating_add(stage_buffer_size) };
        let opts = BuildOptions {
            num_threads,
            queue_capacity: stage_buffer_size,
            batch_queue_capacity: stage_buffer_size,
            failure_budget,
            // Stats are reported through Python's `logging` (`start_reporter`), not by the engine's hook.
            report_interval: None,
            autotune,
            max_memory_bytes,
            ..BuildOptions::default()
        };
        let sink = match chain {
            Chain::One(b) => Sink::One(build(b.sink(buffer_size), opts)?),
            Chain::Batch(b) => Sink::Batch(build(b.sink(buffer_size), opts)?),
        };
        Ok(Self {
            sink: ManuallyDrop::new(sink),
            source,
            steps,
            generation: crate::lifecycle::generation(),
            failures,
            error: Mutex::new(None),
            error_stage: Mutex::new(None),
            abandoned: AtomicBool::new(false),
            id: NEXT_CORE_ID.fetch_add(1, Ordering::Relaxed),
            failure_taken: AtomicBool::new(false),
            reporter: Mutex::new(None),
        })
    }
}

#[pymethods]
impl PipelineCore {
    /// Builds the pipeline from its configs (`spdl_rs.pipeline.defs`, read by [`spec`]): `source` is a
    /// `SourceConfig` or a `MergeConfig`; `steps` are `PipeConfig`, `AggregateConfig`, `DisaggregateConfig`,
    /// `PathVariantsConfig` or `ThroughStep` objects. `bridge` is required when an op, a router or the source
    /// is async.
    #[new]
    #[pyo3(signature = (source, steps, options, *, bridge=None))]
    fn new(
        py: Python<'_>,
        source: Bound<'_, PyAny>,
        steps: Bound<'_, PyAny>,
        options: CoreOptions,
        bridge: Option<Bound<'_, AsyncBridge>>,
    ) -> PyResult<Self> {
        no_panic("PipelineCore()", || Self::build(py, &source, &steps, &options, bridge))
    }

    /// Starts the scheduler and the thread pool.
    fn start(&self, py: Python<'_>) -> PyResult<()> {
        crate::lifecycle::check_not_forked(self.generation, "pipeline")?;
        no_panic("Pipeline.start", || {
            crate::lifecycle::detach(py, || self.sink.start()).map_err(|e| Error::from(e).into())
        })
    }

    /// The Python objects the pipeline holds (its step descriptions), for the garbage collector.
    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        self.source.traverse(&visit)?;
        spec::traverse_steps(&self.steps, &visit)?;
        self.failures.traverse(&visit)
    }

    /// Stops the pipeline and joins its threads, with the GIL released so that running Python ops finish.
    /// Waits at most `timeout` seconds (`None`: until they end), checking for Ctrl-C every 100 ms; raises
    /// `TimeoutError` if an op is still running then (the pipeline is stopped all the same, and the op's
    /// thread is left to finish on its own).
    #[pyo3(signature = (timeout=None))]
    fn stop(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<()> {
        self.stop_engine(py, timeout)
    }

    /// Stops everything a pipeline started, within `timeout` seconds in all (`None`: no limit): tells the
    /// `resources` (`.to()` regions, custom merges: `signal_stop()`, `close()`) to stop, stops the engine,
    /// then, even when that timed out or Ctrl-C came, exits the stage hooks (`extensions.finish`, whose
    /// failure is logged), logs the final stats, stops the `event_loop` (`stop(seconds left) -> bool`) and
    /// the stats reporter, and closes the resources (a failure to close one is logged).
    ///
    /// Raises:
    ///     TimeoutError: An op (or an async op blocking the event loop) is still running at the deadline;
    ///         everything is stopped all the same (what runs is left to finish on its own thread).
    #[pyo3(signature = (timeout=None, *, event_loop=None, resources=Vec::new(), extensions=None))]
    fn shutdown(
        slf: &Bound<'_, Self>,
        timeout: Option<Bound<'_, PyAny>>,
        event_loop: Option<Bound<'_, PyAny>>,
        resources: Vec<Bound<'_, PyAny>>,
        extensions: Option<Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        Self::shutdown_all(slf, timeout.as_ref(), event_loop.as_ref(), &resources, extensions.as_ref())
    }

    /// Starts a thread that logs the stats table (through `logging`, logger `spdl_rs.pipeline`) every
    /// `interval` seconds, and calls `extensions.report_native_interval(core)` after each; `shutdown`
    /// stops it and logs the final table.
    #[pyo3(signature = (interval, extensions=None))]
    fn start_reporter(slf: &Bound<'_, Self>, interval: f64, extensions: Option<Py<PyAny>>) -> PyResult<()> {
        // An interval too long for a `Duration` (inf) reports only at the end.
        let interval = Duration::try_from_secs_f64(interval).unwrap_or(Duration::from_secs(1 << 32));
        let reporter = life::Reporter::start(slf, interval, extensions)?;
        *slf.get().reporter.lock().unwrap_or_else(PoisonError::into_inner) = Some(reporter);
        Ok(())
    }

    /// The next item: `(0, item)`, `(1, epoch)` at the end of an epoch of a continuous source, or
    /// `(2, None)` at the end (also when the pipeline failed: see `error()`). Raises `TimeoutError`; a
    /// timeout too large for a deadline (`inf`, `1e300`) waits as long as it takes, NaN or a negative one
    /// is a `ValueError`.
    #[pyo3(signature = (timeout=None))]
    fn get_item(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<(u8, Py<PyAny>)> {
        crate::lifecycle::check_not_forked(self.generation, "pipeline")?;
        no_panic("Pipeline.get_item", || self.next_item(py, timeout))
    }

    /// Why the pipeline ended early, if it did: `(message, stage or None)`.
    fn error(&self) -> Option<(String, Option<String>)> {
        let e = self.error.lock().unwrap_or_else(PoisonError::into_inner).clone()?;
        let stage = self.error_stage.lock().unwrap_or_else(PoisonError::into_inner).clone();
        Some((e, stage))
    }

    /// The fatal exception that stopped the pipeline (a `KeyboardInterrupt`, `SystemExit` or other
    /// `BaseException` raised by an op, the source, an aggregator, a router or a hook), as
    /// `(stage, exception)`; `None` if none was raised.
    fn fatal(&self, py: Python<'_>) -> Option<(String, Py<PyAny>)> {
        self.failures.fatal().map(|(s, e)| (s.clone(), e.clone_ref(py).into_any()))
    }

    /// The Python exceptions of failed items kept so far (the first 32), as `(stage, exception)`, oldest
    /// first; each is returned once.
    fn take_exceptions(&self) -> Vec<(String, Py<PyAny>)> {
        self.failures.take().into_iter().map(|(s, e)| (s, e.into_any())).collect()
    }

    /// Why the pipeline failed, once: `(exceptions, message, stage)`, the arguments of `PipelineFailure`
    /// (SPDL's words, then the budget or the stage; the exceptions of the failing stage if it has any, else
    /// all kept), or `None` (no failure, or handed out already). `discard`: it is never to be handed out (a
    /// fatal exception was raised instead).
    #[pyo3(signature = (*, discard=false))]
    fn take_failure(&self, discard: bool) -> Option<Failure> {
        if discard {
            self.failure_taken.store(true, Ordering::Relaxed);
            return None;
        }
        let (message, stage) = self.error()?;
        if self.failure_taken.swap(true, Ordering::Relaxed) {
            return None;
        }
        let mut excs = self.take_exceptions();
        if let Some(stage) = &stage
            && excs.iter().any(|(s, _)| s == stage)
        {
            excs.retain(|(s, _)| s == stage);
        }
        Some((excs, format!("pipeline stages failed: {message}"), stage))
    }

    /// A stats snapshot: one dict per stage (source first, sink last).
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        no_panic("Pipeline.get_stats", || self.stats_list(py))
    }

    /// The auto-tuner's changes so far, oldest first, as dicts (`at` in seconds, `stage`, `knob`
    /// (`concurrency`, `queue_capacity` of the queue after the stage, or `threads` for stage `pool`), `from`,
    /// `to`, `reason`); `None` unless the pipeline was built with `autotune`.
    fn autotune_decisions<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyList>>> {
        let Some(report) = crate::lifecycle::detach(py, || self.sink.autotune()) else {
            return Ok(None);
        };
        decision_list(py, &report).map(Some)
    }

    /// The auto-tuner's state: a dict with `decisions` (as `autotune_decisions`), `settled_at` (seconds
    /// from the start when it first settled, or `None`), `settled` (whether it is settled now), `rounds`
    /// (rounds of search started), `threads` (the pool's thread count now) and `max_memory_bytes` (the
    /// memory budget in force, or `None`); `None` unless the pipeline was built with `autotune`.
    fn autotune_report<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        let Some(report) = crate::lifecycle::detach(py, || self.sink.autotune()) else {
            return Ok(None);
        };
        let out = PyDict::new(py);
        out.set_item("decisions", decision_list(py, &report)?)?;
        out.set_item("settled_at", report.settled_at.map(|d| d.as_secs_f64()))?;
        out.set_item("settled", report.settled)?;
        out.set_item("rounds", report.rounds)?;
        out.set_item("threads", report.threads)?;
        out.set_item("max_memory_bytes", report.max_memory_bytes)?;
        Ok(Some(out))
    }

    /// The stats as the engine's text table (one row per stage; the bottleneck is marked).
    fn stats_table(&self, py: Python<'_>) -> PyResult<String> {
        no_panic("Pipeline.stats_table", || Ok(crate::lifecycle::detach(py, || self.snapshot().to_string())))
    }

    /// A snapshot of the stats to measure a window from (`stats_window(anchor)`).
    fn stats_anchor(&self, py: Python<'_>) -> StatsSnapshot {
        StatsSnapshot { pipeline: self.id, stats: crate::lifecycle::detach(py, || self.snapshot()) }
    }

    /// What happened since `anchor` (`None`: since the start), measured as the auto-tuner measures it
    /// (`spdl_exec::autotune::Window::between`): a dict with `duration` (s), `items` (items out of the
    /// source), `throughput` (source items/s) and `stages`, one dict per stats row (source first, sink
    /// last) with `name`, `kind`, `concurrency`, `rate` (items put out per second), `busy`, `starved`,
    /// `blocked` (shares, 0.0 to 1.0) and `task_mean` (s). The sink row's `starved` is the share of the
    /// window the consumer waited in `get_item` for an item.
    #[pyo3(signature = (anchor=None))]
    fn stats_window<'py>(
        &self,
        py: Python<'py>,
        anchor: Option<PyRef<'py, StatsSnapshot>>,
    ) -> PyResult<Bound<'py, PyDict>> {
        no_panic("Pipeline.stats_window", || {
            if let Some(a) = &anchor
                && a.pipeline != self.id
            {
                return Err(PyValueError::new_err(
                    "stats_window: the anchor was taken on another pipeline (take it with this pipeline's \
                     stats_anchor())",
                ));
            }
            let after = crate::lifecycle::detach(py, || self.snapshot());
            let window = match &anchor {
                Some(a) => Window::between(&a.stats, &after),
                None => {
                    // The state before the start: no time, no rows (every counter from zero).
                    let mut start = after.clone();
                    start.elapsed = Duration::ZERO;
                    start.stages.clear();
                    Window::between(&start, &after)
                }
            };
            window_dict(py, &window)
        })
    }
}

/// A snapshot of a pipeline's stats (`spdl_rs._native.pipeline.StatsSnapshot`), from `PipelineCore.stats_anchor()`:
/// the start of a window measured by `PipelineCore.stats_window(anchor)`. Opaque to Python but for the time
/// it was taken at.
#[pyclass(module = "spdl_rs._native.pipeline", frozen)]
#[derive(Debug)]
pub struct StatsSnapshot {
    /// The id of the [`PipelineCore`] it was taken on.
    pipeline: u64,
    stats: PipelineStats,
}

#[pymethods]
impl StatsSnapshot {
    /// Seconds since the pipeline started when the snapshot was taken (0.0 before the start).
    #[getter]
    fn elapsed(&self) -> f64 {
        self.stats.elapsed.as_secs_f64()
    }

    fn __repr__(&self) -> String {
        format!(
            "<spdl_rs StatsSnapshot at {:.3} s, {} rows>",
            self.stats.elapsed.as_secs_f64(),
            self.stats.stages.len()
        )
    }
}

/// A [`Window`] as the dict `PipelineCore.stats_window` returns.
fn window_dict<'py>(py: Python<'py>, w: &Window) -> PyResult<Bound<'py, PyDict>> {
    let stages = PyList::empty(py);
    for s in &w.stages {
        let d = PyDict::new(py);
        d.set_item("name", &s.name)?;
        d.set_item("kind", format!("{:?}", s.kind).to_lowercase())?;
        d.set_item("concurrency", s.concurrency)?;
        d.set_item("rate", s.rate)?;
        d.set_item("busy", s.busy)?;
        d.set_item("starved", s.starved)?;
        d.set_item("blocked", s.blocked)?;
        d.set_item("task_mean", s.task_mean.as_secs_f64())?;
        stages.append(d)?;
    }
    let out = PyDict::new(py);
    out.set_item("duration", w.duration.as_secs_f64())?;
    out.set_item("items", w.items)?;
    out.set_item("throughput", w.throughput)?;
    out.set_item("stages", stages)?;
    Ok(out)
}

impl PipelineCore {
    /// The engine's stats (the sink row's `starved` is the consumer's wait in `get_item`). Every stats
    /// view of the Python side (`stats`, `stats_table`, `stats_anchor`, `stats_window`) reads this one.
    fn snapshot(&self) -> PipelineStats {
        self.sink.stats()
    }

    fn stats_list<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let snap = crate::lifecycle::detach(py, || self.snapshot());
        let list = PyList::empty(py);
        for (i, s) in snap.stages.iter().enumerate() {
            let d = PyDict::new(py);
            d.set_item("name", &s.name)?;
            d.set_item("kind", format!("{:?}", s.kind).to_lowercase())?;
            d.set_item("concurrency", s.concurrency)?;
            d.set_item("concurrency_bounds", s.concurrency_bounds)?;
            d.set_item("tune_reason", s.tune_reason.as_deref())?;
            d.set_item("items_in", s.items_in)?;
            d.set_item("items_out", s.items_out)?;
            // The source's exceptions are not the engine's failures (its source is infallible): added here.
            let source_failures = if i == 0 { self.failures.source_failures() } else { 0 };
            d.set_item("items_failed", s.items_failed + source_failures)?;
            d.set_item("task_time_total", s.task_time_total.as_secs_f64())?;
            d.set_item("task_mean", s.task_mean.as_secs_f64())?;
            d.set_item("task_p50", s.task_p50.as_secs_f64())?;
            d.set_item("task_p90", s.task_p90.as_secs_f64())?;
            d.set_item("task_p99", s.task_p99.as_secs_f64())?;
            d.set_item("starved", s.starved.as_secs_f64())?;
            d.set_item("blocked", s.blocked.as_secs_f64())?;
            d.set_item("queue_len", s.queue_len)?;
            d.set_item("queue_capacity", s.queue_capacity)?;
            d.set_item("busy", s.busy)?;
            d.set_item("item_bytes", s.item_bytes)?;
            d.set_item("elapsed", snap.elapsed.as_secs_f64())?;
            list.append(d)?;
        }
        Ok(list)
    }

    fn next_item(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<(u8, Py<PyAny>)> {
        // A fatal exception (`KeyboardInterrupt`, `SystemExit`, ...) raised on an engine thread or on the
        // event loop stops the pipeline, whatever the sink holds: the engine is stopped (its threads
        // joined, bounded) and the exception raised here, once; later calls raise a `RuntimeError`.
        let fatal = |py: Python<'_>| -> PyResult<()> {
            if self.failures.fatal().is_none() {
                return Ok(());
            }
            if crate::lifecycle::detach(py, || self.sink.stop_timeout(FATAL_STOP_WAIT)).is_err() {
                self.abandoned.store(true, Ordering::Relaxed);
            }
            self.failures.fatal_error(py).map_or(Ok(()), Err)
        };
        fatal(py)?;
        let deadline = deadline(timeout_arg(timeout)?);
        // An item that is ready is taken without letting go of the GIL: releasing it hands it to an engine
        // thread that waits for it, and taking it back waits for that thread's turn, per item.
        let mut ready = Some(self.sink.get_item(Some(Duration::ZERO)));
        loop {
            // Wait in slices so that Ctrl-C reaches the consumer even with no timeout.
            let slice = match deadline {
                Some(d) => d.saturating_duration_since(Instant::now()).min(SIGNAL_SLICE),
                None => SIGNAL_SLICE,
            };
            // The wait is timed without the GIL: reacquiring it is not the sink's queue being empty.
            let got = match ready.take() {
                Some(got) if !matches!(&got, Err(e) if e.is_timeout()) => got,
                _ => crate::lifecycle::detach(py, || self.sink.get_item(Some(slice))),
            };
            fatal(py)?;
            match got {
                Ok(Some(Item::Data(v))) => return Ok((0, v.into_py(py)?)),
                // A source that raised ends the pipeline, a continuous one too (at the end of the epoch it
                // cut short), as in SPDL.
                Ok(Some(Item::EpochEnd { .. })) | Ok(None) if self.failures.source_error().is_some() => {
                    if let Some(msg) = self.failures.source_error() {
                        self.set_error(msg.to_owned(), Some("source".to_owned()));
                    }
                    return Ok((2, py.None()));
                }
                Ok(Some(Item::EpochEnd { epoch })) => return Ok((1, epoch.into_pyobject(py)?.into_any().unbind())),
                Ok(None) => return Ok((2, py.None())),
                Err(e) if e.is_timeout() => {
                    py.check_signals()?;
                    if deadline.is_some_and(|d| Instant::now() >= d) {
                        let waited = timeout.unwrap_or_default();
                        return Err(PyTimeoutError::new_err(format!("no item within {waited} s")));
                    }
                }
                Err(e) => {
                    let stage = e.stage().map(str::to_owned);
                    self.set_error(spdl_report::error_chain(&e), stage);
                    return Ok((2, py.None()));
                }
            }
        }
    }
}

impl Drop for PipelineCore {
    fn drop(&mut self) {
        // Joining the engine's threads while holding the GIL would deadlock with a Python op waiting for
        // it: release it for the join (a no-op when the pipeline is already stopped). The wait is bounded:
        // this runs in the garbage collector or at interpreter exit, and an op that never returns is left
        // to finish on its own thread.
        if crate::lifecycle::made_before_fork(self.generation) {
            // A forked child's copy: its threads, locks and runtime belong to the parent. Tearing it down here
            // would wait for threads that do not exist; it is left as it is (`sink` is never dropped).
            return;
        }
        if let Some(r) = self.reporter.get_mut().unwrap_or_else(PoisonError::into_inner).as_ref() {
            r.signal(); // it holds the pipeline weakly: it ends on its own
        }
        if crate::lifecycle::exiting() {
            // The interpreter exits: tell the threads to stop without waiting (an engine thread that needs the
            // interpreter now parks instead), and leave what still runs to end with the process. The GIL is
            // not released: a thread that took it now would be killed by CPython mid-Rust.
            let _ = self.sink.stop_timeout(Duration::ZERO);
            return;
        }
        let wait = if self.abandoned.load(Ordering::Relaxed) { Duration::ZERO } else { DROP_WAIT };
        Python::attach(|py| crate::lifecycle::detach(py, || self.sink.stop_timeout(wait).is_ok()));
        // SAFETY: `sink` is dropped once, here, and not used after.
        unsafe { ManuallyDrop::drop(&mut self.sink) };
    }
}

fn build<T: Send + 'static>(b: PipelineBuilder<T, state::Sunk>, opts: BuildOptions) -> Result<Pipeline<T>, Error> {
    Ok(b.build(opts)?)
}

/// The auto-tuner's changes as dicts (`at`, `stage`, `knob`, `from`, `to`, `reason`), oldest first.
fn decision_list<'py>(py: Python<'py>, report: &spdl_exec::autotune::AutotuneReport) -> PyResult<Bound<'py, PyList>> {
    let list = PyList::empty(py);
    for d in &report.decisions {
        let item = PyDict::new(py);
        item.set_item("at", d.at.as_secs_f64())?;
        item.set_item("stage", &d.stage)?;
        item.set_item("knob", d.knob.as_str())?;
        item.set_item("from", d.from)?;
        item.set_item("to", d.to)?;
        item.set_item("reason", &d.reason)?;
        list.append(item)?;
    }
    Ok(list)
}
