//! One Python thread state per engine thread, made on its first Python call and kept until the thread ends.
//!
//! `Python::attach` on a thread that has no Python thread state (every thread of the engine's pool) makes
//! one with `PyGILState_Ensure` and deletes it again on release. On a free-threaded CPython that is the
//! dominant cost of a trivial Python stage (a thread state owns per-thread allocator heaps and registers with
//! the stop-the-world machinery): a 3-stage pipeline of `x + 1` ran ~10x slower on 3.13t than on 3.11. With
//! the thread state kept (detached between calls), `Python::attach` only re-attaches it.

use std::cell::RefCell;

use pyo3::ffi;
use pyo3::prelude::*;

use crate::lifecycle;

/// The kept thread state of this thread, detached.
struct Kept {
    gstate: ffi::PyGILState_STATE,
    saved: *mut ffi::PyThreadState,
}

impl Drop for Kept {
    fn drop(&mut self) {
        // SAFETY: always safe to call.
        if lifecycle::exiting() || unsafe { ffi::Py_IsInitialized() } == 0 {
            return; // the interpreter clears its remaining thread states itself
        }
        // Counted in transit while it waits for the GIL, so that the `atexit` hook lets it through before
        // finalization starts (CPython would end it mid-destructor, which aborts the process).
        if !lifecycle::try_enter_transit() {
            return;
        }
        // SAFETY: `saved` is this thread's own thread state, detached by `PyEval_SaveThread` in `keep` and
        // not attached since (every `Python::attach` on this thread has been released: the thread is ending).
        // Re-attaching it and releasing the `PyGILState_Ensure` of `keep` deletes it.
        unsafe {
            ffi::PyEval_RestoreThread(self.saved);
        }
        lifecycle::leave_transit();
        // SAFETY: as above: the thread is attached with the state `keep` made.
        unsafe {
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
        if !ready || lifecycle::exiting() {
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

/// `Python::attach` on an engine thread, keeping this thread's thread state for the next call (see the
/// module doc). While the interpreter exits, the thread parks instead (see [`crate::lifecycle`]); while it
/// runs Python code it is counted ([`lifecycle::InPython`]), for the shutdown hook.
pub(crate) fn attach<R>(f: impl for<'py> FnOnce(Python<'py>) -> R) -> R {
    lifecycle::park_if_exiting();
    keep();
    let _counted = lifecycle::InPython::enter();
    lifecycle::enter_transit();
    Python::attach(|py| {
        lifecycle::leave_transit();
        f(py)
    })
}
