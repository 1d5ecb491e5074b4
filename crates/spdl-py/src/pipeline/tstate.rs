//! One Python thread state per engine thread, made on its first Python call and kept until the thread ends.
//!
//! `Python::attach` on a thread that has no Python thread state (every thread of the engine's pool) makes
//! one with `PyGILState_Ensure` and deletes it again on release. On a free-threaded CPython that is the
//! dominant cost of a trivial Python stage (a thread state owns per-thread allocator heaps and registers with
//! the stop-the-world machinery): a 3-stage pipeline of `x + 1` ran ~10x slower on 3.13t than on 3.11. With
//! the thread state kept (detached between calls), `Python::attach` only re-attaches it.

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, Ordering};

use pyo3::ffi;
use pyo3::prelude::*;

/// Set by an `atexit` hook: from then on, threads that end leave their thread state to the interpreter's
/// own teardown instead of re-attaching (attaching during finalization can hang or kill the thread).
static FINALIZING: AtomicBool = AtomicBool::new(false);

/// The kept thread state of this thread, detached.
struct Kept {
    gstate: ffi::PyGILState_STATE,
    saved: *mut ffi::PyThreadState,
}

impl Drop for Kept {
    fn drop(&mut self) {
        // SAFETY: always safe to call.
        if FINALIZING.load(Ordering::Acquire) || unsafe { ffi::Py_IsInitialized() } == 0 {
            return; // the interpreter clears its remaining thread states itself
        }
        #[cfg(Py_3_13)]
        // SAFETY: always safe to call.
        if unsafe { ffi::Py_IsFinalizing() } != 0 {
            return;
        }
        // SAFETY: `saved` is this thread's own thread state, detached by `PyEval_SaveThread` in `keep` and
        // not attached since (every `Python::attach` on this thread has been released: the thread is ending).
        // Re-attaching it and releasing the `PyGILState_Ensure` of `keep` deletes it.
        unsafe {
            ffi::PyEval_RestoreThread(self.saved);
            ffi::PyGILState_Release(self.gstate);
        }
    }
}

thread_local! {
    static KEPT: RefCell<Option<Kept>> = const { RefCell::new(None) };
}

/// Gives this thread a Python thread state that lives as long as the thread, if it has none (threads that
/// Python made, or that are attached now, are left alone). Cheap after the first call on a thread.
pub(crate) fn keep() {
    let _ = KEPT.try_with(|kept| {
        let Ok(mut kept) = kept.try_borrow_mut() else { return };
        if kept.is_some() {
            return;
        }
        // SAFETY: these only read interpreter and thread-local state; none needs an attached thread.
        let ready = unsafe { ffi::Py_IsInitialized() != 0 && ffi::PyGILState_GetThisThreadState().is_null() };
        if !ready || FINALIZING.load(Ordering::Acquire) {
            return;
        }
        #[cfg(Py_3_13)]
        // SAFETY: always safe to call.
        if unsafe { ffi::Py_IsFinalizing() } != 0 {
            return;
        }
        // SAFETY: the interpreter is initialized and not finalizing, and this thread has no thread state:
        // `PyGILState_Ensure` makes one and attaches it; `PyEval_SaveThread` detaches it again (keeping it),
        // so the thread holds no GIL when this returns.
        let gstate = unsafe { ffi::PyGILState_Ensure() };
        // SAFETY: the thread is attached (just above).
        let saved = unsafe { ffi::PyEval_SaveThread() };
        *kept = Some(Kept { gstate, saved });
    });
}

/// `Python::attach`, keeping this thread's thread state for the next call (see the module doc).
pub(crate) fn attach<R>(f: impl for<'py> FnOnce(Python<'py>) -> R) -> R {
    keep();
    Python::attach(f)
}

/// Registered with `atexit` when the module loads (see [`register`]).
#[pyfunction]
#[pyo3(name = "_mark_finalizing")]
fn mark_finalizing() {
    FINALIZING.store(true, Ordering::Release);
}

/// Registers the `atexit` hook that stops ending threads from touching a finalizing interpreter.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let hook = wrap_pyfunction!(mark_finalizing, m)?;
    m.py().import("atexit")?.call_method1("register", (hook,))?;
    Ok(())
}
