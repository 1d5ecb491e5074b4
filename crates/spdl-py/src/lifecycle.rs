//! The module's lifecycle across interpreter exit and `fork`: the one place that decides whether a thread
//! may (re-)enter the interpreter, and whether an object made before a fork may still be used.
//!
//! States of the process, as seen by every native object:
//!
//! - **Running**: GIL-free calls ([`detach`]) and engine threads ([`crate::pipeline::tstate::attach`]) enter
//!   and leave the interpreter freely.
//! - **Shutting down** (`threading._shutdown`, before non-daemon threads are joined): every live pipeline is
//!   told to stop (`spdl_rs.pipeline`'s hook), and the hook waits (bounded, Ctrl-C-able) for the engine threads that are running Python
//!   code to leave it; an op still running after the grace period gets `SystemExit` raised in it.
//! - **Exiting** (the module's `atexit` hook, which runs after the user's handlers, before finalization): a
//!   thread that finishes a GIL-free call, or an engine thread about to run Python code, parks for good
//!   instead of entering the interpreter. CPython kills a thread that takes the GIL while it finalizes with
//!   `pthread_exit`, whose forced unwind cannot cross Rust frames (the process aborts with "FATAL: exception
//!   not rethrown"); a parked thread ends with the process. The thread that runs the finalization is never
//!   parked.
//! - **Forked child**: the threads of the parent do not exist in the child. Objects that own threads or
//!   runtimes (pipelines, stores, loaders) record the [`generation`] they were made in; in a child they refuse
//!   to run with a `RuntimeError` that says so ([`check_not_forked`]) and are leaked, not torn down, when
//!   dropped ([`made_before_fork`]), because tearing them down would join threads that are gone.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::PyCFunction;

/// Set by the module's `atexit` hook: threads must not enter the interpreter any more.
static EXITING: AtomicBool = AtomicBool::new(false);
/// The thread that runs the interpreter's exit (the one that ran the `atexit` hook): never parked.
static EXIT_THREAD: AtomicU64 = AtomicU64::new(0);
/// Bumped in the child after every `fork`.
static GENERATION: AtomicU64 = AtomicU64::new(0);
/// The process id at import, updated in the child after a fork.
static PID: AtomicU64 = AtomicU64::new(0);
/// Engine threads (threads Rust made) that are running Python code now.
static IN_PYTHON: AtomicUsize = AtomicUsize::new(0);
/// Threads between "not exiting" and holding the interpreter again (waiting for the GIL inside a Rust
/// frame). The `atexit` hook lets them through before finalization starts: CPython would kill a thread that
/// takes the GIL during finalization, and the forced unwind cannot cross the Rust frame it waits in.
static IN_TRANSIT: AtomicUsize = AtomicUsize::new(0);
/// The engine threads running Python code now (their thread ids; 0 is a free slot), for the shutdown hook's
/// `SystemExit` (lock-free, so that a fork cannot leave it locked in the child).
static ENGINE_THREAD_IDS: [AtomicU64; 256] = [const { AtomicU64::new(0) }; 256];

fn this_thread() -> u64 {
    // SAFETY: pthread_self is always safe to call.
    unsafe { libc::pthread_self() as u64 }
}

/// Whether the interpreter is finalizing, asked of CPython itself (`Py_IsFinalizing` from 3.13,
/// `_Py_IsFinalizing` before), looked up at run time so that one abi3 build loads on every version.
fn interpreter_finalizing() -> bool {
    type IsFinalizing = unsafe extern "C" fn() -> std::os::raw::c_int;
    static FUNC: OnceLock<Option<IsFinalizing>> = OnceLock::new();
    let func = FUNC.get_or_init(|| {
        for name in [c"Py_IsFinalizing", c"_Py_IsFinalizing"] {
            // SAFETY: dlsym with RTLD_DEFAULT searches the symbols already loaded (the interpreter's).
            let p = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) };
            if !p.is_null() {
                // SAFETY: both symbols are `int (void)` functions in every CPython that exports them.
                return Some(unsafe { std::mem::transmute::<*mut libc::c_void, IsFinalizing>(p) });
            }
        }
        None
    });
    // SAFETY: the function reads the runtime's finalizing flag; it needs no attached thread.
    func.is_some_and(|f| unsafe { f() } != 0)
}

/// Whether threads must stay out of the interpreter now (it is exiting or finalizing).
pub(crate) fn exiting() -> bool {
    EXITING.load(Ordering::Acquire) || interpreter_finalizing()
}

/// Parks this thread for good if the interpreter is exiting (see the module doc); returns otherwise. The
/// thread that runs the exit is never parked.
pub(crate) fn park_if_exiting() {
    if !exiting() || EXIT_THREAD.load(Ordering::Acquire) == this_thread() {
        return;
    }
    loop {
        std::thread::park();
    }
}

/// `py.detach(f)`: runs `f` without the GIL and, when it returns while the interpreter exits, parks the
/// thread instead of re-attaching it. Every GIL-free call of the module goes through this.
pub(crate) fn detach<T, F>(py: Python<'_>, f: F) -> T
where
    F: Send + FnOnce() -> T,
    T: Send,
{
    let out = py.detach(move || {
        let out = f();
        enter_transit();
        out
    });
    leave_transit();
    out
}

/// Counts this thread as on its way back into the interpreter, or parks it if the interpreter exits (see
/// [`IN_TRANSIT`]). The caller decrements [`IN_TRANSIT`] once it holds the interpreter.
pub(crate) fn enter_transit() {
    if !try_enter_transit() {
        loop {
            std::thread::park();
        }
    }
}

/// [`enter_transit`] that returns `false` instead of parking, for a thread that can simply not enter (a
/// thread-local destructor that would only delete the thread's state).
pub(crate) fn try_enter_transit() -> bool {
    // SeqCst with the `atexit` hook's store of EXITING and its loads of IN_TRANSIT: either the hook sees this
    // thread in transit and waits for it, or this thread sees EXITING.
    IN_TRANSIT.fetch_add(1, Ordering::SeqCst);
    if EXITING.load(Ordering::SeqCst) && EXIT_THREAD.load(Ordering::Acquire) != this_thread() {
        IN_TRANSIT.fetch_sub(1, Ordering::SeqCst);
        return false;
    }
    if interpreter_finalizing() {
        IN_TRANSIT.fetch_sub(1, Ordering::SeqCst);
        return false;
    }
    true
}

/// The other half of [`enter_transit`], once the thread holds the interpreter.
pub(crate) fn leave_transit() {
    IN_TRANSIT.fetch_sub(1, Ordering::SeqCst);
}

/// Counts an engine thread as running Python code while the guard lives (the shutdown hook waits for
/// these to leave), and holds its entry in [`ENGINE_THREAD_IDS`] (none if every slot is taken), so that the
/// hook can raise `SystemExit` in it.
pub(crate) struct InPython {
    slot: Option<usize>,
}

impl InPython {
    pub(crate) fn enter() -> Self {
        IN_PYTHON.fetch_add(1, Ordering::AcqRel);
        // SAFETY: pthread_self is always safe to call.
        let me = unsafe { libc::pthread_self() } as u64;
        let slot = ENGINE_THREAD_IDS
            .iter()
            .position(|slot| slot.compare_exchange(0, me, Ordering::AcqRel, Ordering::Relaxed).is_ok());
        InPython { slot }
    }
}

impl Drop for InPython {
    fn drop(&mut self) {
        if let Some(i) = self.slot {
            ENGINE_THREAD_IDS[i].store(0, Ordering::Release);
        }
        IN_PYTHON.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Raises `SystemExit` in every engine thread that is running Python code (the shutdown hook's last resort
/// for an op that outlives the grace period: CPython raises it when that thread next runs bytecode).
fn interrupt_engine_threads(py: Python<'_>) {
    let exc = py.get_type::<pyo3::exceptions::PySystemExit>();
    for slot in &ENGINE_THREAD_IDS {
        let id = slot.load(Ordering::Acquire);
        if id != 0 {
            // SAFETY: the GIL is held (`py`); `id` is a thread id as `threading.get_ident` gives it, and
            // `exc` a live exception type.
            unsafe {
                pyo3::ffi::PyThreadState_SetAsyncExc(id as std::os::raw::c_ulong as _, exc.as_ptr());
            }
        }
    }
}

/// The fork generation of this process: 0 in the process that imported the module, +1 per fork since.
pub(crate) fn generation() -> u64 {
    GENERATION.load(Ordering::Acquire)
}

/// Whether an object made in fork generation `made_in` is in a forked child now (its threads are gone).
pub(crate) fn made_before_fork(made_in: u64) -> bool {
    made_in != generation()
}

/// `Ok` if an object made in fork generation `made_in` may run here; otherwise a `RuntimeError` that says
/// what was inherited and what to do instead.
pub(crate) fn check_not_forked(made_in: u64, what: &str) -> PyResult<()> {
    if made_before_fork(made_in) {
        return Err(PyRuntimeError::new_err(format!(
            "this {what} was made in the parent process before a fork; its threads do not exist in the child \
             (pid {}): make a new one in the child",
            PID.load(Ordering::Relaxed)
        )));
    }
    Ok(())
}

/// `os.register_at_fork(after_in_child=...)`.
#[pyfunction]
#[pyo3(name = "_after_fork_in_child")]
pub(crate) fn after_fork_in_child() {
    GENERATION.fetch_add(1, Ordering::AcqRel);
    PID.store(u64::from(std::process::id()), Ordering::Relaxed);
    // Threads of the parent that were counted do not exist here.
    IN_PYTHON.store(0, Ordering::Release);
    IN_TRANSIT.store(0, Ordering::Release);
    EXITING.store(false, Ordering::Release);
    for slot in &ENGINE_THREAD_IDS {
        slot.store(0, Ordering::Release);
    }
}

/// The `atexit` hook: from now on, threads park instead of entering the interpreter.
///
/// Threads already on their way back into the interpreter are let through first (the GIL is released for
/// at most [`TRANSIT_WAIT`]); they run Python code until they next leave it, and park then.
#[pyfunction]
#[pyo3(name = "_mark_exiting")]
pub(crate) fn mark_exiting(py: Python<'_>) {
    EXIT_THREAD.store(this_thread(), Ordering::Release);
    EXITING.store(true, Ordering::SeqCst);
    let deadline = Instant::now() + TRANSIT_WAIT;
    while IN_TRANSIT.load(Ordering::SeqCst) > 0 && Instant::now() < deadline {
        py.detach(|| std::thread::sleep(Duration::from_millis(1)));
    }
}

/// How long the `atexit` hook waits for threads on their way back into the interpreter.
const TRANSIT_WAIT: Duration = Duration::from_secs(2);

/// How long the shutdown hook waits for engine threads to leave Python code before it raises `SystemExit`
/// in them, and how long after that.
const GRACE: Duration = Duration::from_secs(5);
const AFTER_ASYNC_EXC: Duration = Duration::from_secs(2);

/// Called by the `threading._register_atexit` hook of `spdl_rs.pipeline` (which runs in `threading._shutdown`,
/// before non-daemon threads are joined and before `atexit` handlers) once it has told every live pipeline
/// to stop: waits for the engine threads that run Python code to leave it, raising `SystemExit` in those
/// still there after [`GRACE`]. Returns how many are still in Python code.
#[pyfunction]
pub(crate) fn _wait_engine_threads(py: Python<'_>) -> PyResult<usize> {
    let deadline = Instant::now() + GRACE;
    while IN_PYTHON.load(Ordering::Acquire) > 0 && Instant::now() < deadline {
        py.detach(|| std::thread::sleep(Duration::from_millis(10)));
        py.check_signals()?;
    }
    if IN_PYTHON.load(Ordering::Acquire) > 0 {
        interrupt_engine_threads(py);
        let deadline = Instant::now() + AFTER_ASYNC_EXC;
        while IN_PYTHON.load(Ordering::Acquire) > 0 && Instant::now() < deadline {
            py.detach(|| std::thread::sleep(Duration::from_millis(10)));
            py.check_signals()?;
        }
    }
    Ok(IN_PYTHON.load(Ordering::Acquire))
}

/// Installs the `atexit` and `os.register_at_fork` hooks (`_wait_engine_threads`, which the module exports, is
/// for the Python package's `threading._register_atexit` hook, SPDL's way of stopping pipelines at exit).
pub(crate) fn install_hooks(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    PID.store(u64::from(std::process::id()), Ordering::Relaxed);
    let exiting: Bound<'_, PyCFunction> = wrap_pyfunction!(mark_exiting, m)?;
    py.import("atexit")?.call_method1("register", (exiting,))?;
    let child = wrap_pyfunction!(after_fork_in_child, m)?;
    let kwargs = pyo3::types::PyDict::new(py);
    kwargs.set_item("after_in_child", child)?;
    py.import("os")?.getattr("register_at_fork")?.call((), Some(&kwargs))?;
    Ok(())
}
