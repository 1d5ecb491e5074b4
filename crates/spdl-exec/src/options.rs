//! Options of stages and of the whole pipeline.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::failure::FailureBudget;
use crate::stats::PipelineStats;

/// The order in which a stage emits its results.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OutputOrder {
    /// As soon as each item is done (fastest; the default).
    #[default]
    Completion,
    /// In the order the items entered the stage. Failed items leave no gap to wait for.
    Input,
}

/// Options of one stage. Build with struct update syntax or the [`crate::Stage`] methods.
///
/// ```
/// use spdl_exec::{OutputOrder, StageOptions};
/// let opts = StageOptions { concurrency: 4, order: OutputOrder::Input, ..Default::default() };
/// assert_eq!(opts.concurrency, 4);
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StageOptions {
    /// Items processed at the same time (at least 1; default 1).
    pub concurrency: usize,
    /// Output order (default [`OutputOrder::Completion`]).
    pub order: OutputOrder,
    /// Failures this stage tolerates (default unlimited).
    pub failure_budget: FailureBudget,
    /// Capacity of the queue after this stage; `None` uses [`BuildOptions::queue_capacity`].
    pub output_capacity: Option<usize>,
}

impl Default for StageOptions {
    fn default() -> Self {
        Self {
            concurrency: 1,
            order: OutputOrder::Completion,
            failure_budget: FailureBudget::Unlimited,
            output_capacity: None,
        }
    }
}

/// A hook called with a stats snapshot every [`BuildOptions::report_interval`].
/// It runs on the scheduler thread: keep it short.
pub type ReportHook = Arc<dyn Fn(&PipelineStats) + Send + Sync + 'static>;

/// Options of the whole pipeline, given to [`crate::PipelineBuilder::build`].
#[derive(Clone)]
pub struct BuildOptions {
    /// Threads of the pool that runs the iterator source and blocking stage functions
    /// (default 4; at least 1).
    pub num_threads: usize,
    /// Default capacity of the queues between item-level stages (default 32; at least 1):
    /// before any `aggregate`, and after `disaggregate`.
    ///
    /// With trivial stages the cost per item is the thread wake-ups between stages, and a
    /// queue moves about half its capacity per wake-up: 8 costs several µs per item and
    /// stage on a busy 2-core machine, 32 about 1–3 µs, 256 under 1 µs. Memory is bounded
    /// by capacity × item size: lower it for large items (decoded full-size frames).
    pub queue_capacity: usize,
    /// Default capacity of the queues that carry batches: every queue after an `aggregate`
    /// until a `disaggregate` (default 4; at least 1). Batches are large (a decoded batch of
    /// 32 images at 224² is ~5 MB in u8, ~19 MB in f32), and a few in flight are enough to
    /// hide the variance of one batch's decode time.
    pub batch_queue_capacity: usize,
    /// Failures the pipeline tolerates over all its stages (default unlimited).
    pub failure_budget: FailureBudget,
    /// Report the stats this often (default: never).
    pub report_interval: Option<Duration>,
    /// What to do with each report (default: one `tracing` info line per stage).
    pub report_hook: Option<ReportHook>,
}

impl Default for BuildOptions {
    fn default() -> Self {
        Self {
            num_threads: 4,
            queue_capacity: 32,
            batch_queue_capacity: 4,
            failure_budget: FailureBudget::Unlimited,
            report_interval: None,
            report_hook: None,
        }
    }
}

impl fmt::Debug for BuildOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BuildOptions")
            .field("num_threads", &self.num_threads)
            .field("queue_capacity", &self.queue_capacity)
            .field("batch_queue_capacity", &self.batch_queue_capacity)
            .field("failure_budget", &self.failure_budget)
            .field("report_interval", &self.report_interval)
            .field("report_hook", &self.report_hook.as_ref().map(|_| "Fn(&PipelineStats)"))
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budgets() {
        assert!(!FailureBudget::Unlimited.is_exceeded(1000, 1000));
        assert!(!FailureBudget::Count(3).is_exceeded(3, 10));
        assert!(FailureBudget::Count(3).is_exceeded(4, 10));
        // Probation: 50 of 99 failing is not judged yet.
        assert!(!FailureBudget::Fraction(0.1).is_exceeded(50, 99));
        assert!(FailureBudget::Fraction(0.1).is_exceeded(11, 100));
        assert!(!FailureBudget::Fraction(0.1).is_exceeded(10, 100));
        assert!(crate::budget::validate(&FailureBudget::Fraction(1.5), "x").is_err());
    }
}
