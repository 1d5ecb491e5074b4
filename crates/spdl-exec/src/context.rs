//! State shared by the pipeline, its scheduler and every driver: cancellation, the final
//! outcome, and failure accounting with budgets.

use std::pin::pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use crate::error::PipelineError;
use crate::failure::{FailureBudget, PartReport};
use crate::stats::StageCell;

/// The outcome of one call of a stage function.
pub(crate) struct Done<U> {
    pub(crate) index: u64,
    pub(crate) item: Option<String>,
    pub(crate) elapsed: Duration,
    pub(crate) result: Result<U, String>,
    /// The failed parts of a call that returned a [`crate::Partial`].
    pub(crate) parts: Option<PartReport>,
}

#[derive(Default)]
pub(crate) struct Shared {
    cancel: AtomicBool,
    cancel_notify: Notify,
    outcome: Mutex<Option<PipelineError>>,
    pub(crate) budget: FailureBudget,
    /// Every stats row, set once the pipeline is wired (for the pipeline-wide budget).
    pub(crate) cells: OnceLock<Vec<Arc<StageCell>>>,
    pub(crate) started: OnceLock<Instant>,
    /// Set when the scheduler thread is about to end (every pool thread joined).
    exited: Mutex<bool>,
    exited_cv: Condvar,
    /// Threads started by drivers (`through` stages), joined when the scheduler ends.
    threads: Mutex<Vec<std::thread::JoinHandle<()>>>,
}

impl Shared {
    pub(crate) fn new(budget: FailureBudget) -> Self {
        Self { budget, ..Self::default() }
    }

    pub(crate) fn cancelled(&self) -> bool {
        self.cancel.load(Ordering::Relaxed)
    }

    pub(crate) fn cancel(&self) {
        self.cancel.store(true, Ordering::SeqCst);
        self.cancel_notify.notify_one();
    }

    /// Resolves once [`Shared::cancel`] has been called (one waiter: the scheduler).
    pub(crate) async fn wait_cancelled(&self) {
        loop {
            let mut n = pin!(self.cancel_notify.notified());
            n.as_mut().enable();
            if self.cancel.load(Ordering::SeqCst) {
                return;
            }
            n.await;
        }
    }

    /// Marks the scheduler thread as ended and wakes every [`Shared::wait_exited`].
    pub(crate) fn mark_exited(&self) {
        *self.exited.lock().unwrap_or_else(PoisonError::into_inner) = true;
        self.exited_cv.notify_all();
    }

    /// Waits until the scheduler thread has ended, at most until `deadline` (`None`: for
    /// as long as it takes). Returns whether it has ended.
    pub(crate) fn wait_exited(&self, deadline: Option<Instant>) -> bool {
        let mut exited = self.exited.lock().unwrap_or_else(PoisonError::into_inner);
        while !*exited {
            let wait = match deadline {
                None => Duration::from_secs(3600),
                Some(d) => {
                    let left = d.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return false;
                    }
                    left
                }
            };
            exited = self.exited_cv.wait_timeout(exited, wait).unwrap_or_else(PoisonError::into_inner).0;
        }
        true
    }

    /// Keeps a driver's thread, to be joined when the scheduler ends.
    pub(crate) fn add_thread(&self, handle: std::thread::JoinHandle<()>) {
        self.threads.lock().unwrap_or_else(PoisonError::into_inner).push(handle);
    }

    pub(crate) fn take_threads(&self) -> Vec<std::thread::JoinHandle<()>> {
        std::mem::take(&mut *self.threads.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// Records the error that ends the pipeline; the first one wins.
    pub(crate) fn fail(&self, err: PipelineError) {
        let mut slot = self.outcome.lock().unwrap_or_else(PoisonError::into_inner);
        if slot.is_none() {
            *slot = Some(err);
        }
    }

    pub(crate) fn take_outcome(&self) -> Option<PipelineError> {
        self.outcome.lock().unwrap_or_else(PoisonError::into_inner).take()
    }
}
