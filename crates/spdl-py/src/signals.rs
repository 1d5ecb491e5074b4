//! Blocking waits that let Python run its signal handlers: a wait in Rust never returns to the interpreter's
//! signal check by itself, so without this Ctrl-C would not reach Python until the wait ended.

use std::time::Duration;

use pyo3::prelude::*;

/// How often a blocking wait wakes to run Python's signal handlers.
pub(crate) const SIGNAL_POLL: Duration = Duration::from_millis(50);

/// Calls `step` without the GIL until it returns `Some`, running Python's signal handlers between calls. Each
/// call should wait at most about [`SIGNAL_POLL`]: Ctrl-C then raises `KeyboardInterrupt` within about that
/// long (the error of a handler is returned as is).
pub(crate) fn wait_with_signals<T: Send>(py: Python<'_>, mut step: impl FnMut() -> Option<T> + Send) -> PyResult<T> {
    loop {
        if let Some(v) = crate::lifecycle::detach(py, &mut step) {
            return Ok(v);
        }
        py.check_signals()?;
    }
}
