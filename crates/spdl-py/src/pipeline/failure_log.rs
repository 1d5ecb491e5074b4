//! The record of a pipeline's Python exceptions: failed items, the source's failures, and the fatal
//! exception that stops the pipeline. The ops (`ops`), the asyncio bridge (`bridge`) and the pipeline
//! object all record into one [`FailureLog`].

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use pyo3::exceptions::{PyBaseException, PyException};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::error::Error;

/// Python exceptions kept per pipeline for `PipelineFailure` (the first ones; later ones are only logged).
const KEPT_EXCEPTIONS: usize = 32;

/// The log of a pipeline's Python exceptions: those of its failed items, its source's failures, the fatal
/// exception that stops it, and the logger they are written to. (The counts that a failure budget judges
/// are spdl-exec's; this keeps the exceptions themselves, for `PipelineFailure`.)
///
/// Every exception that escapes Python code on an engine thread or on the event loop comes here
/// ([`FailureLog::record`]). An ordinary `Exception` (and an op's own `asyncio.CancelledError`) fails the
/// item; any other `BaseException` (`KeyboardInterrupt`, `SystemExit`, `GeneratorExit`, a user's
/// `BaseException` subclass) is *fatal*: the first one is kept ([`FailureLog::fatal`]) and the consumer's
/// `get_item` stops the pipeline and raises it.
#[derive(Debug)]
pub(crate) struct FailureLog {
    /// The exceptions kept for `PipelineFailure` (the first [`KEPT_EXCEPTIONS`]), oldest first. Their
    /// tracebacks hold the frames of the ops that raised, and so whatever those refer to (the object that owns
    /// the pipeline, for a bound-method op): [`FailureLog::traverse`] shows them to the garbage collector.
    kept_list: std::sync::Mutex<Vec<(String, Py<PyBaseException>)>>,
    kept: AtomicUsize,
    logger: Py<PyAny>,
    /// `asyncio.CancelledError`: a `BaseException` that is not fatal (an op's own cancellation).
    cancelled: Py<PyAny>,
    /// The source raised: the pipeline ended early and must report it.
    source_error: std::sync::OnceLock<String>,
    /// How many times the source raised (a continuous source can be iterated again after one).
    source_failures: AtomicU64,
    /// The first fatal exception and the stage it was raised in.
    fatal: std::sync::OnceLock<(String, Py<PyBaseException>)>,
    /// The fatal exception was raised in the consumer once (later calls raise a `RuntimeError`).
    fatal_raised: AtomicBool,
}

impl FailureLog {
    pub(crate) fn new(py: Python<'_>) -> PyResult<Self> {
        let logger = py.import("logging")?.call_method1("getLogger", ("spdl_rs.pipeline",))?.unbind();
        let cancelled = py.import("asyncio")?.getattr("CancelledError")?.unbind();
        Ok(Self {
            kept_list: std::sync::Mutex::new(Vec::new()),
            kept: AtomicUsize::new(0),
            logger,
            cancelled,
            source_error: std::sync::OnceLock::new(),
            source_failures: AtomicU64::new(0),
            fatal: std::sync::OnceLock::new(),
            fatal_raised: AtomicBool::new(false),
        })
    }

    /// Whether `err` must stop the pipeline rather than fail one item: a `BaseException` that is not an
    /// `Exception` (nor an `asyncio.CancelledError`).
    pub(crate) fn is_fatal(&self, py: Python<'_>, err: &PyErr) -> bool {
        !err.is_instance_of::<PyException>(py) && !err.matches(py, self.cancelled.bind(py)).unwrap_or(false)
    }

    /// Logs a failed item's exception with its traceback, keeps it for `PipelineFailure`, and returns the
    /// error the engine counts. A fatal exception ([`FailureLog::is_fatal`]) is kept as the pipeline's fatal
    /// exception instead (the first one; it is not a `PipelineFailure` exception).
    pub(crate) fn record(&self, py: Python<'_>, stage: &str, err: PyErr) -> Error {
        if self.is_fatal(py, &err) {
            return self.record_fatal(py, stage, err);
        }
        let message = err.to_string();
        // `into_value` attaches the traceback to the exception object, for the log and for `PipelineFailure`.
        let exc = err.into_value(py);
        let logged = self.logger.call_method(
            py,
            "error",
            ("Stage `%s` failed on an item (the item is dropped): %s", stage, &message),
            Some(&exc_info(py, exc.bind(py))),
        );
        if let Err(e) = logged {
            // A broken logging setup must not hide the failure itself.
            e.write_unraisable(py, None);
        }
        if self.kept.fetch_add(1, Ordering::Relaxed) < KEPT_EXCEPTIONS {
            self.kept_list.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push((stage.to_owned(), exc));
        }
        Error::Python { stage: stage.to_owned(), message }
    }

    fn record_fatal(&self, py: Python<'_>, stage: &str, err: PyErr) -> Error {
        let message = err.to_string();
        let type_name = err.get_type(py).name().map_or_else(|_| "BaseException".to_owned(), |n| n.to_string());
        let exc = err.into_value(py);
        let first = self.fatal.set((stage.to_owned(), exc.clone_ref(py))).is_ok();
        let logged = self.logger.call_method1(
            py,
            if first { "error" } else { "warning" },
            ("Stage `%s` raised %s: the pipeline stops and the consumer re-raises it", stage, &type_name),
        );
        if let Err(e) = logged {
            e.write_unraisable(py, None);
        }
        Error::Python { stage: stage.to_owned(), message: format!("{type_name}: {message}") }
    }

    /// Records an exception of the source, which ends the pipeline (also a continuous one: see
    /// `ops::PyIterable`); it counts as a failure of the source's stats row.
    pub(crate) fn record_source(&self, py: Python<'_>, err: PyErr) {
        self.source_failures.fetch_add(1, Ordering::Relaxed);
        let e = self.record(py, "source", err);
        let _ = self.source_error.set(e.to_string());
    }

    /// The source's failure, if it raised.
    pub(crate) fn source_error(&self) -> Option<&str> {
        self.source_error.get().map(String::as_str)
    }

    /// How many times the source raised.
    pub(crate) fn source_failures(&self) -> u64 {
        self.source_failures.load(Ordering::Relaxed)
    }

    /// Visits the Python objects this holds (the kept exceptions and the fatal one), for the pipeline's
    /// `__traverse__`. Skips the kept ones while another thread is adding one (the collector then sees them
    /// as referenced from outside, which only delays collection).
    pub(crate) fn traverse(&self, visit: &pyo3::PyVisit<'_>) -> Result<(), pyo3::PyTraverseError> {
        if let Ok(kept) = self.kept_list.try_lock() {
            for (_, exc) in kept.iter() {
                visit.call(exc)?;
            }
        }
        if let Some((_, exc)) = self.fatal.get() {
            visit.call(exc)?;
        }
        Ok(())
    }

    /// The fatal exception and its stage, if one was raised.
    pub(crate) fn fatal(&self) -> Option<&(String, Py<PyBaseException>)> {
        self.fatal.get()
    }

    /// The error the consumer gets now that the pipeline was stopped by a fatal exception: the exception
    /// itself the first time, then a `RuntimeError` that names it. `None` if there was none.
    pub(crate) fn fatal_error(&self, py: Python<'_>) -> Option<PyErr> {
        let (stage, exc) = self.fatal.get()?;
        if !self.fatal_raised.swap(true, Ordering::AcqRel) {
            return Some(PyErr::from_value(exc.bind(py).clone().into_any()));
        }
        let type_name = exc.bind(py).get_type().name().map_or_else(|_| "BaseException".to_owned(), |n| n.to_string());
        Some(pyo3::exceptions::PyRuntimeError::new_err(format!(
            "the pipeline was stopped by {type_name} raised in stage `{stage}`; it cannot be iterated again (build \
             a new pipeline)"
        )))
    }

    /// The kept exceptions, oldest first.
    pub(crate) fn take(&self) -> Vec<(String, Py<PyBaseException>)> {
        std::mem::take(&mut *self.kept_list.lock().unwrap_or_else(std::sync::PoisonError::into_inner))
    }
}

fn exc_info<'py>(py: Python<'py>, exc: &Bound<'py, PyBaseException>) -> Bound<'py, PyDict> {
    let d = PyDict::new(py);
    // Setting a key of a fresh dict only fails on memory exhaustion; the log line then has no traceback.
    let _ = d.set_item("exc_info", exc);
    d
}
