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

/// The kept thread state of this thread: detached, or attached and held across calls ([`attach_held`]).
struct Kept {
    gstate: ffi::PyGILState_STATE,
    saved: *mut ffi::PyThreadState,
    /// Attached by [`attach_held`] and not released since ([`release_held`]).
    held: bool,
}

impl Drop for Kept {
    fn drop(&mut self) {
        // SAFETY: always safe to call.
        if lifecycle::exiting() || unsafe { ffi::Py_IsInitialized() } == 0 {
            return; // the interpreter clears its remaining thread states itself
        }
        if self.held {
            // Every pool thread releases a held state before it waits, so a thread cannot end holding one;
            // if it did, it is attached already, and releasing the `PyGILState_Ensure` deletes it.
            // SAFETY: the thread is attached with the state `keep` made.
            unsafe { ffi::PyGILState_Release(self.gstate) };
            return;
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
    /// Calls of [`attach_held`] running on this thread: the hook leaves the thread alone inside one (an op
    /// that waits on a queue of its own, a nested pipeline's consumer, detaches through PyO3 itself).
    static IN_CALL: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
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
        *kept = Some(Kept { gstate, saved, held: false });
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

/// [`attach`] for a blocking stage's Python op, which keeps this thread attached after the call: the next item
/// of the same run calls the op without taking the GIL again. One GIL hand-off per item per stage was most of
/// what a trivial Python stage cost (a futex wake and a context switch for the thread that waited for it).
///
/// The thread stays attached until [`release_held`], which the engine calls through its before-block hook
/// (installed at import) whenever a pool thread may block: before it waits on a queue or a contended lock,
/// and after every job. So a thread never waits while holding the GIL, and another thread that wants it
/// (the consumer, another stage) gets it when this run runs out of input or room, or from CPython's
/// switch interval while the op runs. On a free-threaded build there is no GIL to save: this is [`attach`].
pub(crate) fn attach_held<R>(f: impl for<'py> FnOnce(Python<'py>) -> R) -> R {
    #[cfg(Py_GIL_DISABLED)]
    {
        attach(f)
    }
    #[cfg(not(Py_GIL_DISABLED))]
    {
        if lifecycle::exiting() {
            release_held(); // the thread parks in `attach` below: never holding the GIL
            return attach(f);
        }
        keep();
        let attached = KEPT.try_with(|kept| {
            let Ok(mut kept) = kept.try_borrow_mut() else { return false };
            let Some(kept) = kept.as_mut() else { return false };
            if !kept.held {
                if !lifecycle::try_enter_transit() {
                    return false;
                }
                // SAFETY: `saved` is this thread's own thread state, detached (by `keep` or `release_held`).
                unsafe { ffi::PyEval_RestoreThread(kept.saved) };
                lifecycle::leave_transit();
                kept.held = true;
            }
            true
        });
        if attached != Ok(true) {
            return attach(f);
        }
        let _counted = lifecycle::InPython::enter();
        let _call = InCall::enter();
        // The thread holds the GIL: PyO3's attach sees its thread state current and takes nothing.
        Python::attach(f)
    }
}

/// Counts a call of [`attach_held`] on this thread while it runs (unwinding too).
#[cfg(not(Py_GIL_DISABLED))]
struct InCall;

#[cfg(not(Py_GIL_DISABLED))]
impl InCall {
    fn enter() -> Self {
        let _ = IN_CALL.try_with(|n| n.set(n.get() + 1));
        InCall
    }
}

#[cfg(not(Py_GIL_DISABLED))]
impl Drop for InCall {
    fn drop(&mut self) {
        let _ = IN_CALL.try_with(|n| n.set(n.get().saturating_sub(1)));
    }
}

/// Detaches this thread's thread state if [`attach_held`] left it attached: the engine's before-block hook
/// (`spdl_exec::set_before_block_hook`). Cheap when it holds nothing; never blocks.
pub(crate) fn release_held() {
    if IN_CALL.try_with(std::cell::Cell::get).unwrap_or(0) > 0 {
        return;
    }
    let _ = KEPT.try_with(|kept| {
        let Ok(mut kept) = kept.try_borrow_mut() else { return };
        if let Some(kept) = kept.as_mut()
            && kept.held
        {
            kept.held = false;
            // SAFETY: the thread is attached with its kept state (`held`), and no `Python::attach` of this
            // thread is live: the hook runs from the engine's own code, outside every stage call.
            kept.saved = unsafe { ffi::PyEval_SaveThread() };
        }
    });
}
