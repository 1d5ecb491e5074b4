//! The life of a running pipeline beyond the engine: the stats reporter thread (`report_stats_interval`),
//! and the shutdown that stops, in order, what the Python layer runs beside the engine (`.to()` regions and
//! custom merges, stage hooks and background tasks, the event loop) within one deadline.

use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use pyo3::exceptions::{PyException, PyTimeoutError};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString, PyTuple, PyWeakrefMethods, PyWeakrefReference};

use super::{PipelineCore, tstate};

/// `logging.getLogger("spdl_rs.pipeline").<level>(msg, arg, exc_info=exc)` (`arg`, `exc` if given).
fn log(py: Python<'_>, level: &str, msg: &str, arg: Option<&Bound<'_, PyAny>>, exc: Option<&PyErr>) -> PyResult<()> {
    let logger = py.import(intern!(py, "logging"))?.call_method1(intern!(py, "getLogger"), ("spdl_rs.pipeline",))?;
    let kwargs = PyDict::new(py);
    if let Some(e) = exc {
        kwargs.set_item("exc_info", e.value(py))?;
    }
    let mut args = vec![PyString::new(py, msg).into_any()];
    args.extend(arg.cloned());
    logger.getattr(level)?.call(PyTuple::new(py, args)?, Some(&kwargs))?;
    Ok(())
}

/// The stats reporter: a thread that logs the stats table (and the extensions' interval reports) every
/// `interval` seconds until told to stop. It holds the pipeline only weakly (the reporter must not keep
/// the pipeline, and the objects its ops refer to, alive).
#[derive(Debug)]
pub(super) struct Reporter {
    done: Arc<(Mutex<bool>, Condvar)>,
    thread: JoinHandle<()>,
}

impl Reporter {
    pub(super) fn start(
        core: &Bound<'_, PipelineCore>,
        interval: Duration,
        extensions: Option<Py<PyAny>>,
    ) -> PyResult<Self> {
        let weak = PyWeakrefReference::new(core.as_any())?.unbind();
        let done = Arc::new((Mutex::new(false), Condvar::new()));
        let flag = Arc::clone(&done);
        let thread = std::thread::Builder::new()
            .name("spdl_rs-stats".into())
            .spawn(move || {
                loop {
                    let (lock, cv) = &*flag;
                    let guard = lock.lock().unwrap_or_else(PoisonError::into_inner);
                    let (guard, _) =
                        cv.wait_timeout_while(guard, interval, |done| !*done).unwrap_or_else(PoisonError::into_inner);
                    if *guard {
                        return;
                    }
                    drop(guard);
                    let alive = tstate::attach(|py| {
                        let Some(core) = weak.bind(py).upgrade() else { return false };
                        if let Err(e) = report(py, &core, extensions.as_ref()) {
                            e.write_unraisable(py, Some(&core));
                        }
                        true
                    });
                    if !alive {
                        return;
                    }
                }
            })
            .map_err(|e| pyo3::exceptions::PyRuntimeError::new_err(format!("could not start the stats thread: {e}")))?;
        Ok(Self { done, thread })
    }

    /// Tells the thread to stop (without waiting).
    pub(super) fn signal(&self) {
        let (lock, cv) = &*self.done;
        *lock.lock().unwrap_or_else(PoisonError::into_inner) = true;
        cv.notify_all();
    }

    /// Stops the thread and waits for it; `false` when called on the thread itself (a finalizer run
    /// there), which cannot wait for itself.
    fn stop(self, py: Python<'_>) -> bool {
        self.signal();
        if self.thread.thread().id() == std::thread::current().id() {
            return false;
        }
        let thread = self.thread;
        crate::lifecycle::detach(py, move || thread.join().is_ok());
        true
    }
}

/// One report: the stats table, then the default hooks' and queues' interval reports, in SPDL's words.
fn report(py: Python<'_>, core: &Bound<'_, PyAny>, extensions: Option<&Py<PyAny>>) -> PyResult<()> {
    let table = core.call_method0(intern!(py, "stats_table"))?;
    log(py, "info", "Pipeline stats:\n%s", Some(&table), None)?;
    if let Some(ext) = extensions {
        ext.bind(py).call_method1(intern!(py, "report_native_interval"), (core,))?;
    }
    Ok(())
}

impl PipelineCore {
    /// Stops the reporter, if one runs, and logs the final stats table.
    pub(super) fn stop_reporter(&self, py: Python<'_>) -> PyResult<()> {
        let reporter = self.reporter.lock().unwrap_or_else(PoisonError::into_inner).take();
        if let Some(r) = reporter
            && r.stop(py)
        {
            let table = PyString::new(py, &self.stats_table(py)?).into_any();
            log(py, "info", "Pipeline stats (final):\n%s", Some(&table), None)?;
        }
        Ok(())
    }

    /// See the `shutdown` method.
    pub(super) fn shutdown_all(
        slf: &Bound<'_, Self>,
        timeout: Option<&Bound<'_, PyAny>>,
        event_loop: Option<&Bound<'_, PyAny>>,
        resources: &[Bound<'_, PyAny>],
        extensions: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let py = slf.py();
        let core = slf.get();
        let shown = timeout.map_or_else(|| Ok("None".to_owned()), |t| t.str().map(|s| s.to_string()))?;
        let timeout = timeout.map(|t| t.extract::<f64>()).transpose()?;
        let deadline =
            timeout.filter(|t| !t.is_nan() && *t <= 1e9).map(|t| Instant::now() + Duration::from_secs_f64(t.max(0.0)));
        let mut stuck: Vec<&str> = Vec::new();
        for r in resources {
            r.call_method0(intern!(py, "signal_stop"))?;
        }
        let stopped = core.stop_engine(py, timeout);
        let stopped = match stopped {
            Err(e) if e.is_instance_of::<PyTimeoutError>(py) => {
                stuck.push("an op on the pipeline's threads");
                Ok(())
            }
            other => other,
        };
        // The rest is stopped even when the engine timed out or Ctrl-C came.
        if let Some(ext) = extensions {
            // Stage hooks exit and background tasks stop on the loop, before it stops.
            let kwargs = PyDict::new(py);
            kwargs.set_item("stopped", true)?;
            if let Err(e) = ext.call_method(intern!(py, "finish"), (core.error(),), Some(&kwargs)) {
                if !e.is_instance_of::<PyException>(py) {
                    return Err(e);
                }
                log(py, "warning", "Failed to finish the pipeline's stage hooks", None, Some(&e))?;
            }
            ext.call_method1(intern!(py, "report_native_stats"), (slf,))?;
            ext.call_method0(intern!(py, "close"))?;
        }
        if let Some(lp) = event_loop {
            let left = deadline.map(|d| d.saturating_duration_since(Instant::now()).as_secs_f64());
            if !lp.call_method1(intern!(py, "stop"), (left,))?.is_truthy()? {
                stuck.push("an async op blocking the pipeline's event loop");
            }
        }
        core.stop_reporter(py)?;
        for r in resources {
            if let Err(e) = r.call_method0(intern!(py, "close")) {
                if !e.is_instance_of::<PyException>(py) {
                    return Err(e);
                }
                log(py, "warning", "Failed to shut down %r", Some(r), Some(&e))?;
            }
        }
        stopped?;
        if stuck.is_empty() {
            return Ok(());
        }
        Err(PyTimeoutError::new_err(format!(
            "the pipeline did not stop within {shown} s: {} still running (the pipeline is stopped; what is still \
             running is left to finish on its own thread)",
            stuck.join(" and ")
        )))
    }
}
