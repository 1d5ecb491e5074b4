//! The pipeline's bounded pool of OS threads for blocking work (the iterator source and
//! blocking stage functions). Jobs never wait on a queue for long: a worker loop that
//! would stall hands its state back to its async driver and frees the thread, so a pool
//! smaller than the number of blocking workers still makes progress.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::thread::JoinHandle;

use crossbeam_channel as cb;

use crate::error::PipelineError;

type Job = Box<dyn FnOnce() + Send + 'static>;

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

/// The pool's threads and job queue.
#[derive(Debug)]
pub(crate) struct Pool {
    handle: PoolHandle,
    rx: cb::Receiver<PoolMsg>,
    threads: Vec<JoinHandle<()>>,
}

impl Pool {
    /// Creates the job queue; threads start with [`Pool::start`].
    pub(crate) fn new() -> Self {
        let (tx, rx) = cb::unbounded();
        Self { handle: PoolHandle { tx }, rx, threads: Vec::new() }
    }

    pub(crate) fn handle(&self) -> PoolHandle {
        self.handle.clone()
    }

    /// Starts `n` threads named `spdl-exec-N`.
    pub(crate) fn start(&mut self, n: usize) -> Result<(), PipelineError> {
        for i in 0..n {
            let rx = self.rx.clone();
            let spawned = std::thread::Builder::new().name(format!("spdl-exec-{i}")).spawn(move || worker(&rx));
            match spawned {
                Ok(h) => self.threads.push(h),
                Err(source) => {
                    self.shutdown();
                    return Err(PipelineError::Spawn { what: "pool", source });
                }
            }
        }
        Ok(())
    }

    /// Lets queued jobs run, then stops and joins every thread.
    pub(crate) fn shutdown(&mut self) {
        for _ in 0..self.threads.len() {
            let _ = self.handle.tx.send(PoolMsg::Exit);
        }
        for t in self.threads.drain(..) {
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
    }
}
