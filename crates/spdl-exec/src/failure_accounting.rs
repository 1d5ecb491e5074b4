//! Failure accounting: every finished call is booked here (stats, failure log, kept causes),
//! and each failure is judged against its stage's own [`FailureBudget`] where it has one, else the
//! pipeline's. A spent budget stops feeding the stage and records the error that ends the pipeline.

use std::sync::PoisonError;
use std::sync::atomic::Ordering;

use crate::context::{Done, Shared};
use crate::error::PipelineError;
use crate::failure::{FRACTION_PROBATION, FailureBudget, ItemFailure};
use crate::stats::StageCell;

/// Failures kept per stage for the error message.
const KEPT_CAUSES: usize = 5;

/// Checks a failure budget given as `option`.
pub(crate) fn validate(budget: &FailureBudget, option: &str) -> Result<(), PipelineError> {
    match *budget {
        FailureBudget::Fraction(f) if !(0.0..=1.0).contains(&f) => Err(PipelineError::InvalidOption {
            option: option.to_owned(),
            reason: format!("a failure fraction must be within 0.0..=1.0, got {f}"),
        }),
        _ => Ok(()),
    }
}

impl Shared {
    /// Books a finished call: stats, failure log and budgets. Returns the outputs on success.
    pub(crate) fn settle<U>(&self, cell: &StageCell, done: Done<U>) -> Option<U> {
        cell.hist.record(done.elapsed);
        let extra = done.parts.as_ref().map_or(0, |p| p.parts.saturating_sub(1));
        let calls = cell.completed.fetch_add(1 + extra, Ordering::Relaxed) + 1 + extra;
        match done.result {
            Ok(out) => {
                if let Some(report) = done.parts {
                    for f in report.failures {
                        let item = f.item.or_else(|| done.item.clone());
                        self.record_failure(cell, done.index, item, f.cause);
                    }
                }
                if calls >= FRACTION_PROBATION
                    && calls - 1 - extra < FRACTION_PROBATION
                    && cell.failed.load(Ordering::Relaxed) > 0
                {
                    self.judge(cell);
                }
                Some(out)
            }
            Err(cause) => {
                self.record_failure(cell, done.index, done.item, cause);
                None
            }
        }
    }

    /// Books a failure found after its call returned: the iterator or stream of a lazy
    /// stage ([`crate::Stage::flat_map_lazy`]) failed part-way. The call itself was counted.
    pub(crate) fn fail_late(&self, cell: &StageCell, index: u64, item: Option<String>, cause: String) {
        self.record_failure(cell, index, item, cause);
    }

    /// Books `n` items that failed for one `cause` (inputs a through-stage's function left untaken): counted
    /// one by one, logged and kept once.
    pub(crate) fn fail_many(&self, cell: &StageCell, index: u64, n: u64, cause: String) {
        self.record_failures(cell, index, None, cause, n);
    }

    fn record_failure(&self, cell: &StageCell, index: u64, item: Option<String>, cause: String) {
        self.record_failures(cell, index, item, cause, 1);
    }

    fn record_failures(&self, cell: &StageCell, index: u64, item: Option<String>, cause: String, n: u64) {
        cell.failed.fetch_add(n, Ordering::Relaxed);
        tracing::warn!(
            target: "spdl_exec",
            stage = %cell.name,
            index,
            item = item.as_deref().unwrap_or("-"),
            cause = %cause,
            "item failed and was dropped"
        );
        {
            let mut causes = cell.causes.lock().unwrap_or_else(PoisonError::into_inner);
            if causes.len() < KEPT_CAUSES {
                causes.push(ItemFailure { stage: cell.name.clone(), index, item, cause });
            }
        }
        self.judge(cell);
    }

    /// Checks the stage's budget and the pipeline's; stops feeding the stage when spent.
    fn judge(&self, cell: &StageCell) {
        let failed = cell.failed.load(Ordering::Relaxed);
        let calls = cell.completed.load(Ordering::Relaxed);
        let causes = || cell.causes.lock().unwrap_or_else(PoisonError::into_inner).clone();
        // A stage with its own budget is judged by it alone (SPDL's per-stage `max_failures`).
        if let Some(budget) = cell.budget {
            if budget.is_exceeded(failed, calls) {
                self.trip(
                    cell,
                    PipelineError::StageBudgetExceeded {
                        stage: cell.name.clone(),
                        budget,
                        failed,
                        calls,
                        causes: causes(),
                    },
                );
            }
            return;
        }
        if self.budget == FailureBudget::Unlimited {
            return;
        }
        let (mut all_failed, mut all_calls) = (0, 0);
        for c in self.cells.get().map(Vec::as_slice).unwrap_or_default() {
            all_failed += c.failed.load(Ordering::Relaxed);
            all_calls += c.completed.load(Ordering::Relaxed);
        }
        if self.budget.is_exceeded(all_failed, all_calls) {
            self.trip(
                cell,
                PipelineError::PipelineBudgetExceeded {
                    stage: cell.name.clone(),
                    budget: self.budget,
                    failed: all_failed,
                    calls: all_calls,
                    causes: causes(),
                },
            );
        }
    }

    fn trip(&self, cell: &StageCell, err: PipelineError) {
        if !cell.stop_feeding.swap(true, Ordering::SeqCst) {
            tracing::error!(target: "spdl_exec", stage = %cell.name, "{}", spdl_report::error_chain(&err));
            self.fail(err);
        }
    }
}
