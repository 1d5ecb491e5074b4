//! The crate's error type.

use std::time::Duration;

use crate::failure::{FailureBudget, ItemFailure};

fn join_causes(causes: &[ItemFailure]) -> String {
    if causes.is_empty() {
        return "none recorded".to_owned();
    }
    causes.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ")
}

/// Everything that can go wrong when building, starting or iterating a pipeline.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PipelineError {
    /// The pipeline was built in another process: this is a child forked from it, where the pipeline's
    /// threads do not exist. Build a new pipeline in the child.
    #[error(
        "the pipeline was built in process {built_in} and this is a child forked from it (process {now}); its \
         threads do not exist here: build a new pipeline in the child"
    )]
    Forked {
        /// The process that built the pipeline.
        built_in: u32,
        /// This process.
        now: u32,
    },
    /// A builder or stage option is out of range.
    #[error("invalid pipeline option `{option}`: {reason}")]
    InvalidOption {
        /// The option, e.g. `stage "decode": concurrency`.
        option: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A stage failed more items than its own budget allows; the pipeline stopped feeding it.
    #[error(
        "stage `{stage}` exceeded its failure budget ({budget}): {failed} of {calls} calls failed; first causes: {}",
        join_causes(causes)
    )]
    StageBudgetExceeded {
        /// The stage's name.
        stage: String,
        /// Its budget.
        budget: FailureBudget,
        /// Items failed in the stage when it was judged.
        failed: u64,
        /// Calls completed in the stage when it was judged.
        calls: u64,
        /// The first few failures of the stage.
        causes: Vec<ItemFailure>,
    },
    /// The stages together failed more items than the pipeline's budget allows.
    #[error(
        "the pipeline exceeded its failure budget ({budget}): {failed} of {calls} calls failed, last in stage `{stage}`; first causes: {}",
        join_causes(causes)
    )]
    PipelineBudgetExceeded {
        /// The stage whose failure exceeded the budget (the pipeline stopped feeding it).
        stage: String,
        /// The pipeline's budget.
        budget: FailureBudget,
        /// Items failed over all stages.
        failed: u64,
        /// Calls completed over all stages.
        calls: u64,
        /// The first few failures of that stage.
        causes: Vec<ItemFailure>,
    },
    /// The source's iterator or stream panicked; the pipeline ended there.
    #[error("the source panicked after {produced} items: {message}")]
    SourcePanicked {
        /// Items the source had produced.
        produced: u64,
        /// The panic message.
        message: String,
    },
    /// [`crate::PipelineIter::next_timeout`] or [`crate::Pipeline::get_item`] waited this long
    /// for nothing. Not fatal: iteration can go on.
    #[error("no item within {waited:?}")]
    Timeout {
        /// How long it waited.
        waited: Duration,
    },
    /// A thread of the pipeline could not be started.
    #[error("could not start the pipeline's {what} thread")]
    Spawn {
        /// Which thread: `scheduler` or `pool`.
        what: &'static str,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The scheduler's async runtime could not be created.
    #[error("could not create the scheduler's runtime")]
    Runtime(#[source] std::io::Error),
    /// The pipeline this one reads from ([`crate::PipelineBuilder::source_pipeline`]) failed.
    #[error("the upstream pipeline failed")]
    Upstream(#[source] Box<PipelineError>),
    /// A driver of the pipeline itself failed (a bug in spdl-exec, not in a stage function).
    #[error("internal failure of the pipeline's driver for `{stage}`: {message}")]
    Internal {
        /// The stage whose driver failed.
        stage: String,
        /// What happened.
        message: String,
    },
}

impl PipelineError {
    /// Whether this is a [`PipelineError::Timeout`], after which iteration can go on.
    pub fn is_timeout(&self) -> bool {
        matches!(self, Self::Timeout { .. })
    }

    /// The stage this error is about, if any.
    pub fn stage(&self) -> Option<&str> {
        match self {
            Self::StageBudgetExceeded { stage, .. }
            | Self::PipelineBudgetExceeded { stage, .. }
            | Self::Internal { stage, .. } => Some(stage),
            _ => None,
        }
    }

    /// The first recorded failures behind a budget error (empty for other errors).
    pub fn causes(&self) -> &[ItemFailure] {
        match self {
            Self::StageBudgetExceeded { causes, .. } | Self::PipelineBudgetExceeded { causes, .. } => causes,
            _ => &[],
        }
    }
}

/// [`crate::Pipeline::stop_timeout`] gave up: a thread of the pipeline was still running
/// when the time ran out (a stage function or source `next()` that does not return).
///
/// The pipeline is stopped all the same (no new call starts, iteration has ended); the
/// threads still running are left to end on their own when the call returns. A later
/// [`crate::Pipeline::stop`] or `stop_timeout` waits for them again.
///
/// ```
/// use std::time::Duration;
/// let err = spdl_exec::StopTimeout { waited: Duration::from_secs(2) };
/// assert_eq!(err.to_string(), "the pipeline's threads did not end within 2s (a stage function or the source is still running)");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the pipeline's threads did not end within {waited:?} (a stage function or the source is still running)")]
pub struct StopTimeout {
    /// How long it waited.
    pub waited: Duration,
}
