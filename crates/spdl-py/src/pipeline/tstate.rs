//! One Python thread state per engine thread, made on its first Python call and kept until the thread ends.
//!
//! `Python::attach` on a thread that has no Python thread state (every thread of the engine's pool) makes
//! one with `PyGILState_Ensure` and deletes it again on release. On a free-threaded CPython that is the
//! dominant cost of a trivial Python stage (a thread state owns per-thread allocator heaps and registers with
//! the stop-the-world machinery): a 3-stage pipeline of `x + 1` ran ~10x slower on 3.13t than on 3.11. With
//! the thread state kept (detached between calls), `Python::attach` only re-attaches it.

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};

use pyo3::ffi;
use pyo3::prelude::*;

use crate::lifecycle;

/// The engine threads running Python code now (their thread ids; 0 is a free slot), for the shutdown hook's
/// `SystemExit` (lock-free, so that a fork cannot leave it locked in the child).
static IN_PYTHON: [AtomicU64; 256] = [const { AtomicU64::new(0) }; 256];

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
/// runs Python code it is counted, for the shutdown hook.
pub(crate) fn attach<R>(f: impl for<'py> FnOnce(Python<'py>) -> R) -> R {
    lifecycle::park_if_exiting();
    keep();
    let _counted = lifecycle::InPython::enter();
    let _slot = Slot::take();
    lifecycle::enter_transit();
    Python::attach(|py| {
        lifecycle::leave_transit();
        f(py)
    })
}

/// This thread's entry in [`IN_PYTHON`] while it runs Python code (none if every slot is taken).
struct Slot(Option<usize>);

impl Slot {
    fn take() -> Self {
        // SAFETY: pthread_self is always safe to call.
        let me = unsafe { libc::pthread_self() } as u64;
        for (i, slot) in IN_PYTHON.iter().enumerate() {
            if slot.compare_exchange(0, me, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
                return Slot(Some(i));
            }
        }
        Slot(None)
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Some(i) = self.0 {
            IN_PYTHON[i].store(0, Ordering::Release);
        }
    }
}

/// Raises `SystemExit` in every engine thread that is running Python code (the shutdown hook's last resort
/// for an op that outlives the grace period: CPython raises it when that thread next runs bytecode).
pub(crate) fn interrupt_engine_threads(py: Python<'_>) {
    let exc = py.get_type::<pyo3::exceptions::PySystemExit>();
    for slot in &IN_PYTHON {
        let id = slot.load(Ordering::Acquire);
        if id != 0 {
            // SAFETY: the GIL is held (`py`); `id` is a thread id as `threading.get_ident` gives it, and
            // `exc` a live exception type.
            unsafe {
                ffi::PyThreadState_SetAsyncExc(id as std::os::raw::c_ulong as _, exc.as_ptr());
            }
        }
    }
}

/// After a fork: the parent's threads do not exist in the child.
pub(crate) fn after_fork_in_child() {
    for slot in &IN_PYTHON {
        slot.store(0, Ordering::Release);
    }
}
