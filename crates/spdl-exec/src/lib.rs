//! # spdl-exec: the spdl-rs pipeline engine
//!
//! A data-loading pipeline is a **source** → **stages** → **sink**, driven by a scheduler
//! on a background thread; the consumer (a training loop) only iterates. Start from
//! [`PipelineBuilder`]:
//!
//! - the source is any `IntoIterator` (pulled on the pipeline's thread pool, since `next()`
//!   may do I/O) or any `Stream`; a continuous source re-runs each epoch and marks its end;
//! - each [`Stage`] is a named function `T → U` (or `T →` zero or many `U`), blocking (run on
//!   a bounded thread pool, `BuildOptions::num_threads`) or async (run on the scheduler's
//!   tokio runtime), with its own concurrency, [`OutputOrder`] and [`FailureBudget`];
//! - `aggregate(n)` batches (or an [`Aggregator`] groups by a rule of its own), `disaggregate()`
//!   flattens, `sink(n)` sets the consumer's buffer.
//!
//! Stages are joined by bounded queues, so a slow consumer stalls the source and memory
//! stays bounded whatever the dataset size. A blocking stage is served by worker loops that
//! stay on their pool thread while items flow (no thread hand-off per item) and give the
//! thread back when they would wait. A failing or panicking call fails that item only: it
//! is counted, logged with `tracing` and dropped, until a budget is spent and iteration
//! ends with a [`PipelineError`] naming the stage and the first causes. Stats per stage
//! (items, task-time quantiles, starved/blocked time, queue occupancy) are atomics, always
//! on: [`Pipeline::stats`] prints a table that names the bottleneck. Stopping a [`Pipeline`]
//! cancels pending work and joins every thread it started ([`Pipeline::stop_timeout`] bounds
//! the wait for a stage call that does not return; dropping waits at most [`DROP_GRACE`]).
//!
//! ```
//! use spdl_exec::{BuildOptions, PipelineBuilder, Stage};
//!
//! # fn main() -> Result<(), spdl_exec::PipelineError> {
//! let pipeline = PipelineBuilder::new()
//!     .source(1..=1000u64)
//!     .pipe(Stage::map("double", |x: u64| Ok::<_, std::io::Error>(x * 2)).concurrency(2))
//!     .pipe(Stage::map_async("check", |x: u64| async move {
//!         if x % 100 == 0 { Err(format!("{x} is round")) } else { Ok(x) }
//!     }))
//!     .aggregate(32)
//!     .sink(2)
//!     .build(BuildOptions::default())?;
//!
//! let mut n = 0;
//! for batch in &pipeline {
//!     n += batch?.len();
//! }
//! assert_eq!(n, 980); // 20 items failed (and were logged), the rest came through
//! let stats = pipeline.stats();
//! assert_eq!(stats.stage("check").map(|s| s.items_failed), Some(20));
//! # Ok(())
//! # }
//! ```
#![deny(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

mod aggregator;
pub mod autotune;
mod builder;
mod context;
mod driver;
mod error;
mod failure;
mod failure_accounting;
mod fast;
mod graph;
mod item_size;
mod options;
mod pipeline;
mod pool;
mod queue;
mod runs;
mod stage;
mod stats;
mod through;

pub use aggregator::Aggregator;
pub use builder::{PipelineBuilder, state};
pub use error::{PipelineError, StopTimeout};
pub use failure::{BoxError, FRACTION_PROBATION, FailureBudget, ItemFailure, Partial};
pub use graph::{Branch, MergeOptions, MergePolicy, MergeStop};
pub use item_size::ItemSize;
pub use options::{BuildOptions, OutputOrder, ReportHook, StageOptions, Tune};
pub use pipeline::{DROP_GRACE, Item, Pipeline, PipelineIter};
pub use pool::set_before_block_hook;
pub use stage::Stage;
pub use stats::{PipelineStats, StageKind, StageStats};
pub use through::Inputs;
