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

/// Whether the auto-tuner ([`BuildOptions::autotune`]) may change a stage's concurrency.
///
/// ```
/// use spdl_exec::{StageOptions, Tune};
/// // Tuned between 2 and 16 calls at a time, whatever `concurrency` starts at.
/// let opts = StageOptions { concurrency: 2, tune: Tune::Within { min: 2, max: 16 }, ..Default::default() };
/// assert!(opts.tune.is_tunable(opts.concurrency));
/// assert!(!Tune::Fixed.is_tunable(1));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Tune {
    /// Tuned within the default bounds (1..=4x cores for blocking stages, 1..=256 for async
    /// ones) unless the concurrency was set explicitly: a `concurrency` other than 1, or any
    /// value given through [`crate::Stage::concurrency`] (which makes it [`Tune::Fixed`]).
    #[default]
    Auto,
    /// Never changed by the auto-tuner.
    Fixed,
    /// Tuned within `min..=max` (an explicit opt-in, also for a stage whose concurrency was set).
    Within {
        /// The least concurrency (at least 1).
        min: usize,
        /// The most concurrency (at least `min`).
        max: usize,
    },
}

impl Tune {
    /// Whether a stage with this setting and this starting concurrency is tuned.
    pub fn is_tunable(&self, concurrency: usize) -> bool {
        match self {
            Self::Auto => concurrency == 1,
            Self::Fixed => false,
            Self::Within { .. } => true,
        }
    }
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
    /// Failures this stage tolerates. `None` (the default): the stage is judged by the pipeline's
    /// [`BuildOptions::failure_budget`]; `Some`: by this budget alone, as a stage-level `max_failures`
    /// overrides the pipeline's in SPDL (its failures still count towards the pipeline's total).
    pub failure_budget: Option<FailureBudget>,
    /// Capacity of the queue after this stage; `None` uses [`BuildOptions::queue_capacity`].
    pub output_capacity: Option<usize>,
    /// Whether [`BuildOptions::autotune`] may change `concurrency` (default [`Tune::Auto`]).
    pub tune: Tune,
    /// Memory one call in flight holds (its input, output and working set), in bytes, if
    /// known: the auto-tuner counts it against [`BuildOptions::max_memory_bytes`] before it
    /// raises the concurrency, as it counts the output queue at its capacity.
    pub item_bytes: Option<u64>,
}

impl Default for StageOptions {
    fn default() -> Self {
        Self {
            concurrency: 1,
            order: OutputOrder::Completion,
            failure_budget: None,
            output_capacity: None,
            tune: Tune::Auto,
            item_bytes: None,
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
    /// Tune the pipeline while it runs (default off): a controller samples the stats every
    /// 100 ms and raises the concurrency of the bottleneck stage while throughput improves,
    /// backs off when it does not, grows the pool to the blocking concurrency it set, and
    /// settles; see [`crate::autotune`]. Stages whose concurrency was set explicitly stay
    /// as they are ([`Tune`]).
    pub autotune: bool,
    /// The memory the auto-tuner may commit to calls in flight and queued items (default
    /// `None`: half of the memory available when the pipeline is built, where that can be
    /// read, else no limit). It counts each stage's [`StageOptions::item_bytes`] and, while
    /// the process's resident memory exceeds it, lowers what it raised.
    pub max_memory_bytes: Option<u64>,
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
            autotune: false,
            max_memory_bytes: None,
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
            .field("autotune", &self.autotune)
            .field("max_memory_bytes", &self.max_memory_bytes)
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
        assert!(crate::failure_accounting::validate(&FailureBudget::Fraction(1.5), "x").is_err());
    }
}
