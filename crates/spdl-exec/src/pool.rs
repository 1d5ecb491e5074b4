//! The pipeline's bounded pool of OS threads for blocking work (the iterator source and
//! blocking stage functions). Jobs never wait on a queue for long: a worker loop that
//! would stall hands its state back to its async driver and frees the thread, so a pool
//! smaller than the number of blocking workers still makes progress.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::thread::JoinHandle;

use crossbeam_channel as cb;

use crate::error::PipelineError;

type Job = Box<dyn FnOnce() + Send + 'static>;

/// The process's hook that pool threads call before they may block: see [`set_before_block_hook`].
static BEFORE_BLOCK: OnceLock<fn()> = OnceLock::new();

/// Installs a function that every pool thread calls before it may block: before it waits on a
/// queue (for input or for room), before it waits for a contended lock of a stage, and after each job,
/// before it waits for the next. Once per process; returns `false` (and keeps the first) if a hook
/// is installed already.
///
/// This is for an embedding runtime with a per-thread lock that a stage function may keep across
/// the consecutive items of a run, to save taking it per item: an interpreter lock (CPython's GIL)
/// is the case. The hook must release such a lock if this thread holds it, and must itself be
/// cheap and never block: it runs on every wait of every pool thread.
///
/// ```
/// fn release_this_threads_lock() {}
/// spdl_exec::set_before_block_hook(release_this_threads_lock);
/// ```
pub fn set_before_block_hook(hook: fn()) -> bool {
    BEFORE_BLOCK.set(hook).is_ok()
}

/// Calls the hook of [`set_before_block_hook`], if any.
#[inline]
pub(crate) fn before_block() {
    if let Some(hook) = BEFORE_BLOCK.get() {
        hook();
    }
}

enum PoolMsg {
    Run(Job),
    Exit,
}

/// Submits jobs to the pool. Cheap to clone.
#[derive(Clone)]
pub(crate) struct PoolHandle {
    tx: cb::Sender<PoolMsg>,
}

impl std::fmt::Debug for PoolHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PoolHandle").field("pending", &self.pending()).finish()
    }
}

impl PoolHandle {
    /// Queues a job; it runs once a pool thread is free (jobs queued before `start` wait).
    pub(crate) fn spawn(&self, job: impl FnOnce() + Send + 'static) {
        // The pool's receiver lives until `shutdown`, after every driver is gone.
        let _ = self.tx.send(PoolMsg::Run(Box::new(job)));
    }

    /// Jobs waiting for a thread: when non-zero, every pool thread is busy.
    pub(crate) fn pending(&self) -> usize {
        self.tx.len()
    }
}

/// The pool's threads: every handle ever started (joined at shutdown) and how many of them
/// have not been asked to exit.
#[derive(Debug, Default)]
struct Threads {
    handles: Vec<JoinHandle<()>>,
    live: usize,
    /// Numbers the next thread's name.
    next: usize,
    /// Set by `shutdown`: no thread starts after it.
    closed: bool,
}

/// The pool's threads and job queue.
#[derive(Debug)]
pub(crate) struct Pool {
    handle: PoolHandle,
    rx: cb::Receiver<PoolMsg>,
    threads: Arc<Mutex<Threads>>,
}

/// Changes the number of a pool's threads while it runs (the auto-tuner's handle).
#[derive(Debug, Clone)]
pub(crate) struct PoolResizer {
    tx: cb::Sender<PoolMsg>,
    rx: cb::Receiver<PoolMsg>,
    threads: Arc<Mutex<Threads>>,
}

impl PoolResizer {
    /// Threads now running (not asked to exit).
    pub(crate) fn threads(&self) -> usize {
        self.threads.lock().unwrap_or_else(PoisonError::into_inner).live
    }

    /// Starts or retires threads until `n` (at least 1) are live. A retired thread ends
    /// after the jobs queued before its exit message. After shutdown, does nothing.
    pub(crate) fn resize(&self, n: usize) -> Result<(), PipelineError> {
        let n = n.max(1);
        let mut threads = self.threads.lock().unwrap_or_else(PoisonError::into_inner);
        if threads.closed {
            return Ok(());
        }
        while threads.live > n {
            let _ = self.tx.send(PoolMsg::Exit);
            threads.live -= 1;
        }
        while threads.live < n {
            spawn_one(&mut threads, &self.rx)?;
        }
        Ok(())
    }
}

fn spawn_one(threads: &mut Threads, rx: &cb::Receiver<PoolMsg>) -> Result<(), PipelineError> {
    let rx = rx.clone();
    let name = format!("spdl-exec-{}", threads.next);
    let h = std::thread::Builder::new()
        .name(name)
        .spawn(move || worker(&rx))
        .map_err(|source| PipelineError::Spawn { what: "pool", source })?;
    threads.next += 1;
    threads.live += 1;
    threads.handles.push(h);
    Ok(())
}

impl Pool {
    /// Creates the job queue; threads start with [`Pool::start`].
    pub(crate) fn new() -> Self {
        let (tx, rx) = cb::unbounded();
        Self { handle: PoolHandle { tx }, rx, threads: Arc::new(Mutex::new(Threads::default())) }
    }

    pub(crate) fn handle(&self) -> PoolHandle {
        self.handle.clone()
    }

    /// A handle that changes the number of threads while the pool runs.
    pub(crate) fn resizer(&self) -> PoolResizer {
        PoolResizer { tx: self.handle.tx.clone(), rx: self.rx.clone(), threads: Arc::clone(&self.threads) }
    }

    /// Starts `n` threads named `spdl-exec-N`.
    pub(crate) fn start(&mut self, n: usize) -> Result<(), PipelineError> {
        let started = {
            let mut threads = self.threads.lock().unwrap_or_else(PoisonError::into_inner);
            (0..n).try_for_each(|_| spawn_one(&mut threads, &self.rx))
        };
        if started.is_err() {
            self.shutdown();
        }
        started
    }

    /// Lets queued jobs run, then stops and joins every thread.
    pub(crate) fn shutdown(&mut self) {
        let handles = {
            let mut threads = self.threads.lock().unwrap_or_else(PoisonError::into_inner);
            threads.closed = true;
            for _ in 0..threads.live {
                let _ = self.handle.tx.send(PoolMsg::Exit);
            }
            threads.live = 0;
            std::mem::take(&mut threads.handles)
        };
        for t in handles {
            let _ = t.join();
        }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn worker(rx: &cb::Receiver<PoolMsg>) {
    while let Ok(PoolMsg::Run(job)) = rx.recv() {
        // Jobs catch the user's panics themselves; this keeps the thread alive if one slips.
        if catch_unwind(AssertUnwindSafe(job)).is_err() {
            tracing::error!(target: "spdl_exec", "a pool job panicked outside a stage function");
        }
        before_block();
    }
}
