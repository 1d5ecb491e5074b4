//! Live auto-tuning of stage concurrency and pool threads ([`crate::BuildOptions::autotune`]).
//!
//! Two parts:
//! - [`Window`]: the measurement. Two [`PipelineStats`] snapshots give each stage's busy
//!   share, starved and blocked shares, mean task time and rate over the time between them,
//!   and the pipeline's throughput (items out of its sources per second). It is public so
//!   that offline sweeps measure exactly what the controller measures.
//! - [`Controller`]: a pure state machine fed with snapshots (and the process's resident
//!   memory); it returns [`Action`]s and keeps a log of [`Decision`]s. It owns no thread and
//!   reads no clock, so it is tested on synthetic stages. A pipeline built with `autotune`
//!   runs it in a task on its scheduler every [`AutotuneConfig::interval`] and applies what
//!   it returns (the stage drivers read their concurrency at each step; the pool starts or
//!   retires threads).
//!
//! How it decides. Once the first item has reached the sink, after each window (at least
//! [`AutotuneConfig::min_window`] and [`AutotuneConfig::min_items`] items, the first sample
//! after a change skipped as transient) it takes the busiest tunable stage (busy share at least
//! [`AutotuneConfig::busy_floor`]) and doubles its concurrency (hill-climbing). A raise that
//! improves throughput by more than [`AutotuneConfig::gain`] is kept and the stage is raised
//! again; one that does not is undone, and a binary search between the last value known to
//! be worse and the best one finds the least concurrency within
//! [`AutotuneConfig::tolerance`] of the best throughput (the hysteresis: it takes a clear
//! gain to go up, and only a loss to stop going down). Each stage is searched once per
//! round; then the controller settles, and starts a new round only when the throughput has
//! moved by more than [`AutotuneConfig::reprobe`] for [`AutotuneConfig::reprobe_windows`]
//! windows in a row. So it never oscillates: a round is finite, and a steady pipeline
//! starts no new one. Raises stay within each stage's bounds and within the memory budget
//! (each stage's `item_bytes` for its calls in flight and its output queue); while the
//! process's resident memory exceeds the memory budget, it halves the stage that holds the most.
//! The pool follows: its thread count is the sum of the blocking concurrency (at least the
//! pipeline's `num_threads`, at most [`AutotuneConfig::max_threads`]).
//!
//! Queues. Once no stage's concurrency is left to search in a round, the controller looks
//! at the queues after the tuned stages whose capacity was not set explicitly (they may grow
//! to [`QUEUE_GROWTH`] times their capacity). A queue is too short when, in the same window,
//! the stage before it waits for room and the stage after it waits for items (both for at
//! least [`AutotuneConfig::jitter_floor`] of the window): the two run in bursts the queue
//! does not absorb. It tries that queue at the largest capacity its bound and the memory
//! budget allow (each slot counted at the stage's `item_bytes`): one large step gives a
//! clear signal where a doubling would drown in noise. If throughput improves by more than
//! [`AutotuneConfig::gain`], it searches between the two (geometric midpoints) for the
//! least capacity within [`AutotuneConfig::tolerance`] of the best, to a factor of two, so
//! that the queue holds no more memory than pays; otherwise it goes back.
//!
//! Re-probing backs off: a round started because the throughput moved that ends where it
//! began (every probe undone) doubles the windows the next one waits for, up to 32 times
//! [`AutotuneConfig::reprobe_windows`]; a round that changes something resets it. A
//! pipeline on a noisy machine thus re-probes less and less often, while a real change of
//! the workload is still followed.
//!
//! ```
//! use std::time::Duration;
//! use spdl_exec::autotune::{AutotuneConfig, Controller, TunedStage};
//! use spdl_exec::StageKind;
//!
//! let stages = vec![TunedStage::new(1, "decode", StageKind::Blocking, 1, 8)];
//! let mut c = Controller::new(AutotuneConfig::default(), stages, 4);
//! assert!(c.decisions().is_empty());
//! assert!(!c.is_settled());
//! ```

use std::time::Duration;

use crate::options::{StageOptions, Tune};
use crate::stats::{PipelineStats, StageKind, TuneBounds};

/// The controller's knobs. The defaults suit pipelines whose items take microseconds to
/// tens of milliseconds.
#[derive(Debug, Clone, PartialEq)]
pub struct AutotuneConfig {
    /// How often the pipeline samples its stats for the controller (default 100 ms).
    pub interval: Duration,
    /// The shortest measurement window (default 300 ms).
    pub min_window: Duration,
    /// The fewest source items a window counts, unless it reaches `max_window` (default 64).
    pub min_items: u64,
    /// The longest measurement window (default 2 s).
    pub max_window: Duration,
    /// A raise is kept when throughput improves by more than this share (default 0.05).
    pub gain: f64,
    /// A lower concurrency is kept when throughput stays within this share of the best
    /// (default 0.03).
    pub tolerance: f64,
    /// Once settled, a new round starts when throughput moves by more than this share
    /// (default 0.2) ...
    pub reprobe: f64,
    /// ... for this many windows in a row (default 3).
    pub reprobe_windows: u32,
    /// A stage less busy than this share is not a bottleneck (default 0.5).
    pub busy_floor: f64,
    /// A queue is grown when the stage before it is blocked and the stage after it starved
    /// for at least this share of a window each (default 0.1).
    pub jitter_floor: f64,
    /// The memory budget: the memory the tuned stages may hold, and the resident memory above
    /// which the controller lowers what it raised (`None`: no limit). Not the pipeline's
    /// [`crate::FailureBudget`], nor spdl-io's process-wide decode memory budget.
    pub max_memory_bytes: Option<u64>,
    /// The most pool threads (default 4x the cores).
    pub max_threads: usize,
}

impl Default for AutotuneConfig {
    fn default() -> Self {
        Self {
            interval: Duration::from_millis(100),
            min_window: Duration::from_millis(300),
            min_items: 64,
            max_window: Duration::from_secs(2),
            gain: 0.05,
            tolerance: 0.03,
            reprobe: 0.2,
            reprobe_windows: 3,
            busy_floor: 0.5,
            jitter_floor: 0.1,
            max_memory_bytes: None,
            max_threads: 4 * cores(),
        }
    }
}

/// How far the auto-tuner may grow the queue after a tuned stage: up to this many times its
/// capacity (unless the capacity was set explicitly, which fixes it).
pub const QUEUE_GROWTH: usize = 8;

/// The longest a settled controller waits between re-probes, in multiples of
/// [`AutotuneConfig::reprobe_windows`].
const MAX_BACKOFF: u32 = 32;

pub(crate) fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
}

/// The tuning bounds of a stage wired with `options`, if it may be tuned (`None` for bounds
/// that are not `1 <= min <= max`, reported as an invalid option by the builder).
pub(crate) fn stage_bounds(options: &StageOptions, kind: StageKind, output_capacity: usize) -> Option<TuneBounds> {
    let (min, max) = match options.tune {
        Tune::Fixed => return None,
        Tune::Within { min, max } => (min, max),
        Tune::Auto if kind == StageKind::Async => (1, 256),
        Tune::Auto => (1, 4 * cores()),
    };
    (min >= 1 && min <= max).then_some(TuneBounds { min, max, item_bytes: options.item_bytes, output_capacity })
}

/// A stage the controller may tune.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TunedStage {
    /// Its row in [`PipelineStats::stages`].
    pub row: usize,
    /// Its name (for the log).
    pub name: String,
    /// [`StageKind::Blocking`] (its concurrency is pool threads) or [`StageKind::Async`].
    pub kind: StageKind,
    /// The least concurrency.
    pub min: usize,
    /// The most concurrency.
    pub max: usize,
    /// Memory one call in flight holds, if known.
    pub item_bytes: Option<u64>,
    /// Capacity of the queue after the stage (counted at `item_bytes` per slot) at the start.
    pub output_capacity: usize,
    /// The most the controller may set that queue's capacity to (at most `output_capacity`:
    /// the queue is not tuned).
    pub queue_max: usize,
    /// The row of the stage that reads that queue, if known (its starved share tells when
    /// the queue is too short).
    pub consumer_row: Option<usize>,
}

impl TunedStage {
    /// A stage at `row` tuned within `min..=max`, its memory unknown.
    pub fn new(row: usize, name: &str, kind: StageKind, min: usize, max: usize) -> Self {
        Self {
            row,
            name: name.to_owned(),
            kind,
            min,
            max,
            item_bytes: None,
            output_capacity: 0,
            queue_max: 0,
            consumer_row: None,
        }
    }

    /// The same, with the memory of a call in flight and the output queue's capacity.
    #[must_use]
    pub fn with_memory(mut self, item_bytes: u64, output_capacity: usize) -> Self {
        self.item_bytes = Some(item_bytes);
        self.output_capacity = output_capacity;
        self
    }

    /// The same, with a queue after it that may grow to `max` slots, read by the stage at
    /// `consumer_row`.
    #[must_use]
    pub fn with_queue(mut self, max: usize, consumer_row: usize) -> Self {
        self.queue_max = max;
        self.consumer_row = Some(consumer_row);
        self
    }

    fn memory(&self, concurrency: usize, capacity: usize) -> u64 {
        let slots = (concurrency as u64).saturating_add(capacity as u64);
        self.item_bytes.map_or(0, |b| b.saturating_mul(slots))
    }

    fn queue_tunable(&self) -> bool {
        self.queue_max > self.output_capacity && self.consumer_row.is_some()
    }
}

/// One stage over a [`Window`].
#[derive(Debug, Clone, PartialEq)]
pub struct StageWindow {
    /// The stage's name.
    pub name: String,
    /// What the row is.
    pub kind: StageKind,
    /// Its concurrency at the end of the window.
    pub concurrency: usize,
    /// Items put out per second.
    pub rate: f64,
    /// Share of its capacity spent in its function (0.0..=1.0).
    pub busy: f64,
    /// Share of the window spent waiting for input (0.0..=1.0).
    pub starved: f64,
    /// Share of the window spent waiting for room downstream (0.0..=1.0).
    pub blocked: f64,
    /// Mean time per call in the window.
    pub task_mean: Duration,
}

/// What happened between two snapshots of the same pipeline: the measurement behind every
/// decision of the [`Controller`], and what offline sweeps report.
///
/// ```
/// use spdl_exec::{BuildOptions, PipelineBuilder, Stage};
/// use spdl_exec::autotune::Window;
///
/// let p = PipelineBuilder::new()
///     .source(0..1000u32)
///     .pipe(Stage::map("inc", |x: u32| Ok::<_, std::io::Error>(x + 1)))
///     .sink(8)
///     .build(BuildOptions::default())
///     .unwrap();
/// let before = p.stats();
/// assert_eq!(p.iter().count(), 1000);
/// let w = Window::between(&before, &p.stats());
/// assert_eq!(w.items, 1000);
/// assert!(w.stage("inc").is_some());
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Window {
    /// How long the window lasted.
    pub duration: Duration,
    /// Items out of the sources in the window.
    pub items: u64,
    /// Items out of the sources per second: the pipeline's throughput in input items.
    pub throughput: f64,
    /// One entry per stats row, in pipeline order.
    pub stages: Vec<StageWindow>,
}

impl Window {
    /// The window from `before` to `after` (two snapshots of one pipeline, in this order).
    pub fn between(before: &PipelineStats, after: &PipelineStats) -> Self {
        let duration = after.elapsed.saturating_sub(before.elapsed);
        let secs = duration.as_secs_f64();
        let per_sec = |n: f64| if secs > 0.0 { n / secs } else { 0.0 };
        let share = |d: Duration, c: usize| {
            if secs > 0.0 { (d.as_secs_f64() / (secs * c.max(1) as f64)).clamp(0.0, 1.0) } else { 0.0 }
        };
        let mut items = 0;
        let mut stages = Vec::with_capacity(after.stages.len());
        for (i, a) in after.stages.iter().enumerate() {
            let b = before.stages.get(i).filter(|b| b.name == a.name);
            let out = a.items_out.saturating_sub(b.map_or(0, |b| b.items_out));
            if a.kind == StageKind::Source {
                items += out;
            }
            let task = a.task_time_total.saturating_sub(b.map_or(Duration::ZERO, |b| b.task_time_total));
            let calls = a.items_in.saturating_sub(b.map_or(0, |b| b.items_in));
            let calls = if a.kind == StageKind::Source { out } else { calls };
            let starved = a.starved.saturating_sub(b.map_or(Duration::ZERO, |b| b.starved));
            let blocked = a.blocked.saturating_sub(b.map_or(Duration::ZERO, |b| b.blocked));
            stages.push(StageWindow {
                name: a.name.clone(),
                kind: a.kind,
                concurrency: a.concurrency,
                rate: per_sec(out as f64),
                busy: share(task, a.concurrency),
                starved: share(starved, a.concurrency),
                blocked: share(blocked, a.concurrency),
                task_mean: task.checked_div(u32::try_from(calls).unwrap_or(u32::MAX)).unwrap_or(Duration::ZERO),
            });
        }
        Self { duration, items, throughput: per_sec(items as f64), stages }
    }

    /// The stage named `name`, if any.
    pub fn stage(&self, name: &str) -> Option<&StageWindow> {
        self.stages.iter().find(|s| s.name == name)
    }
}

/// A change the controller asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Set the concurrency of the stage at `row` of the stats.
    SetConcurrency {
        /// The stage's row.
        row: usize,
        /// The new concurrency.
        to: usize,
        /// Why, for the log and the stats.
        reason: String,
    },
    /// Set the capacity of the queue after the stage at `row` of the stats.
    SetCapacity {
        /// The stage's row.
        row: usize,
        /// The new capacity.
        to: usize,
        /// Why, for the log and the stats.
        reason: String,
    },
    /// Set the number of pool threads.
    SetThreads {
        /// The new thread count.
        to: usize,
    },
}

/// What a [`Decision`] changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Knob {
    /// A stage's concurrency.
    Concurrency,
    /// The capacity of the queue after a stage.
    QueueCapacity,
    /// The pool's thread count.
    Threads,
}

impl Knob {
    /// A short name: `concurrency`, `queue_capacity` or `threads`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Concurrency => "concurrency",
            Self::QueueCapacity => "queue_capacity",
            Self::Threads => "threads",
        }
    }
}

/// One change the controller made, as logged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// When (the pipeline's elapsed time).
    pub at: Duration,
    /// The stage's name (for a queue: the stage before it), or `pool` for the thread count.
    pub stage: String,
    /// What was changed.
    pub knob: Knob,
    /// The value before.
    pub from: usize,
    /// The value after.
    pub to: usize,
    /// Why.
    pub reason: String,
}

/// Where a stage's search is.
#[derive(Debug, Clone, Default)]
struct Search {
    /// The highest concurrency known to give less throughput than `best`.
    lo: Option<usize>,
    best: usize,
    best_tput: f64,
    /// Searched in this round.
    done: bool,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Phase {
    /// Measuring the current setting, then choosing what to probe.
    Measure,
    /// A raise (`trim: false`) or a lower setting within the search (`trim: true`) is on trial.
    Probe { stage: usize, from: usize, to: usize, base: f64, trim: bool, saturated: bool },
    /// A capacity of the queue after `stage` is on trial: the largest the bounds and the
    /// budget allow (`trim: false`), or one between the last known to be worse (`lo`) and
    /// the best (`trim: true`).
    QueueProbe { stage: usize, from: usize, base: f64, trim: bool, lo: usize, best: usize, best_tput: f64 },
    /// Nothing to tune: watching the throughput for a lasting change.
    Settled { base: f64, off: u32 },
}

/// The auto-tuning state machine; see the [module documentation](self).
#[derive(Debug, Clone)]
pub struct Controller {
    config: AutotuneConfig,
    stages: Vec<TunedStage>,
    /// The current concurrency of each tuned stage (as the controller set it).
    current: Vec<usize>,
    /// The current capacity of the queue after each tuned stage.
    capacity: Vec<usize>,
    /// The queue after each stage was searched in this round.
    queue_done: Vec<bool>,
    /// Settled windows of moved throughput that start a new round (backs off).
    reprobe_after: u32,
    /// Concurrency and capacities when the running re-probe round started.
    round_start: Option<(Vec<usize>, Vec<usize>)>,
    /// Each tuned stage's concurrency at the first sample: the pool grows by what is added.
    start: Option<Vec<usize>>,
    search: Vec<Search>,
    min_threads: usize,
    threads: usize,
    phase: Phase,
    /// The first snapshot of the window being measured.
    anchor: Option<PipelineStats>,
    decisions: Vec<Decision>,
    settled_at: Option<Duration>,
    rounds: u32,
}

impl Controller {
    /// A controller of `stages` (each starts at its `min` unless its row says otherwise at
    /// the first sample) for a pool of `threads` threads, which it never goes below.
    pub fn new(config: AutotuneConfig, mut stages: Vec<TunedStage>, threads: usize) -> Self {
        for s in &mut stages {
            s.min = s.min.max(1);
            s.max = s.max.max(s.min);
        }
        let current = stages.iter().map(|s| s.min).collect();
        let capacity = stages.iter().map(|s| s.output_capacity).collect();
        let search = vec![Search::default(); stages.len()];
        let queue_done = vec![false; stages.len()];
        let reprobe_after = config.reprobe_windows.max(1);
        Self {
            config,
            current,
            capacity,
            queue_done,
            reprobe_after,
            round_start: None,
            stages,
            start: None,
            search,
            min_threads: threads.max(1),
            threads: threads.max(1),
            phase: Phase::Measure,
            anchor: None,
            decisions: Vec::new(),
            settled_at: None,
            rounds: 1,
        }
    }

    /// Every change made so far, oldest first.
    pub fn decisions(&self) -> &[Decision] {
        &self.decisions
    }

    /// Whether the controller has settled (nothing left to probe until the throughput moves).
    pub fn is_settled(&self) -> bool {
        matches!(self.phase, Phase::Settled { .. })
    }

    /// When it first settled (the pipeline's elapsed time).
    pub fn settled_at(&self) -> Option<Duration> {
        self.settled_at
    }

    /// Rounds of search started (1, plus one per re-probe).
    pub fn rounds(&self) -> u32 {
        self.rounds
    }

    /// The pool's thread count as the controller set it.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// The concurrency of each tuned stage as the controller set it, in the order given.
    pub fn concurrency(&self) -> &[usize] {
        &self.current
    }

    /// The capacity of the queue after each tuned stage as the controller set it, in the
    /// order given.
    pub fn queue_capacity(&self) -> &[usize] {
        &self.capacity
    }

    /// The memory the tuned stages hold at their current concurrency and queue capacity (by
    /// `item_bytes`).
    pub fn memory(&self) -> u64 {
        (0..self.stages.len()).map(|i| self.stage_memory(i)).sum()
    }

    fn stage_memory(&self, i: usize) -> u64 {
        self.stages[i].memory(self.current[i], self.capacity[i])
    }

    /// How many windows of moved throughput a settled controller now waits for before it
    /// probes again (see the back-off in the [module documentation](self)).
    pub fn reprobe_after(&self) -> u32 {
        self.reprobe_after
    }

    /// Feeds one snapshot (and the process's resident memory, if known); returns the changes
    /// to apply now. Snapshots must come from one pipeline, in order.
    pub fn observe(&mut self, stats: &PipelineStats, rss: Option<u64>) -> Vec<Action> {
        // The rows are the truth for where each stage is (its bounds may have moved it) and,
        // for a stage that measures its items, for what one holds.
        for (i, s) in self.stages.iter_mut().enumerate() {
            if let Some(row) = stats.stages.get(s.row) {
                if let Some(c) = self.current.get_mut(i) {
                    *c = row.concurrency;
                }
                if row.item_bytes.is_some() {
                    s.item_bytes = row.item_bytes;
                }
            }
            if s.queue_tunable()
                && let Some(row) = s.consumer_row.and_then(|r| stats.stages.get(r))
                && row.queue_capacity > 0
                && let Some(c) = self.capacity.get_mut(i)
            {
                *c = row.queue_capacity;
            }
        }
        if self.start.is_none() {
            self.start = Some(self.current.clone());
        }
        let mut actions = Vec::new();
        if let Some(over) = self.over_budget(rss) {
            self.shed(stats.elapsed, over, &mut actions);
            self.anchor = None;
            return actions;
        }
        let primed = stats.stages.iter().filter(|s| s.kind == StageKind::Sink).all(|s| s.items_in > 0);
        if !primed {
            // Queues are filling: what the sources put out now is no rate of the pipeline.
            return actions;
        }
        let Some(anchor) = &self.anchor else {
            // The first sample after a change is its transient: the window starts here.
            self.anchor = Some(stats.clone());
            return actions;
        };
        let window = Window::between(anchor, stats);
        let long_enough = window.duration >= self.config.min_window && window.items >= self.config.min_items;
        if !long_enough && window.duration < self.config.max_window {
            return actions;
        }
        self.anchor = Some(stats.clone());
        self.step(&window, stats.elapsed, rss, &mut actions);
        if !actions.is_empty() {
            self.anchor = None;
        }
        actions
    }

    fn over_budget(&self, rss: Option<u64>) -> Option<u64> {
        let budget = self.config.max_memory_bytes?;
        let rss = rss?;
        (rss > budget).then_some(rss)
    }

    /// Resident memory is over the budget: halve the tuned stage that holds the most (by
    /// `item_bytes`, else by concurrency), and stop raising until the round ends.
    fn shed(&mut self, at: Duration, rss: u64, actions: &mut Vec<Action>) {
        let budget = self.config.max_memory_bytes.unwrap_or(0);
        let reason = format!("memory: resident {} MiB over the budget of {} MiB", rss >> 20, budget >> 20);
        for s in &mut self.search {
            s.done = true;
        }
        self.queue_done.fill(true);
        // A queue grown beyond its start goes back first (it holds finished items only).
        let queue = (0..self.stages.len())
            .filter(|&i| self.capacity[i] > self.stages[i].output_capacity)
            .max_by_key(|&i| (self.stage_memory(i), self.capacity[i]));
        if let Some(i) = queue {
            let to = (self.capacity[i] / 2).max(self.stages[i].output_capacity);
            self.set_capacity(i, to, at, reason, actions);
            self.settle(0.0, at);
            return;
        }
        let pick = (0..self.stages.len())
            .filter(|&i| self.current[i] > self.stages[i].min)
            .max_by_key(|&i| (self.stage_memory(i), self.current[i]));
        let Some(i) = pick else { return };
        let to = (self.current[i] / 2).max(self.stages[i].min);
        self.set(i, to, at, reason, actions);
        self.search[i].best = to;
        self.settle(0.0, at);
    }

    fn step(&mut self, w: &Window, at: Duration, rss: Option<u64>, actions: &mut Vec<Action>) {
        let t = w.throughput;
        match self.phase {
            Phase::Settled { base, off } => {
                let moved = if base > 0.0 { (t - base).abs() / base > self.config.reprobe } else { t > 0.0 };
                let off = if moved { off + 1 } else { 0 };
                if off >= self.reprobe_after {
                    tracing::info!(target: "spdl_exec::autotune", throughput = t, base, "throughput moved; probing again");
                    self.rounds += 1;
                    for s in &mut self.search {
                        s.done = false;
                        s.lo = None;
                    }
                    self.queue_done.fill(false);
                    self.round_start = Some((self.current.clone(), self.capacity.clone()));
                    self.choose(w, at, rss, actions);
                } else {
                    self.phase = Phase::Settled { base, off };
                }
            }
            Phase::Measure => self.choose(w, at, rss, actions),
            Phase::Probe { stage, from, to, base, trim: false, saturated } => {
                let row = self.stages[stage].row;
                let own = w.stages.get(row).map_or(0.0, |s| s.busy);
                let other = w
                    .stages
                    .iter()
                    .enumerate()
                    .filter(|(r, s)| *r != row && s.kind != StageKind::Sink)
                    .map(|(_, s)| s.busy)
                    .fold(0.0, f64::max);
                if t > base * (1.0 + self.config.gain) {
                    let s = &mut self.search[stage];
                    s.lo = Some(from);
                    s.best = to;
                    s.best_tput = t;
                    let why = format!("{:.0}/s -> {:.0}/s (+{:.0}%)", base, t, (t / base - 1.0) * 100.0);
                    if !self.raise(stage, w, at, rss, &why, actions) {
                        self.finish(stage, at, &why, actions);
                    }
                } else if saturated && other >= 0.9 && other > own + 0.1 {
                    // The stage was saturated and no longer is: another one now limits the
                    // pipeline (they were tied). Keep the raise; that one is tuned next.
                    let s = &mut self.search[stage];
                    s.best = to;
                    s.best_tput = t;
                    tracing::info!(target: "spdl_exec::autotune", stage = %self.stages[stage].name, concurrency = to, "the bottleneck moved; keeping the raise");
                    self.phase = Phase::Measure;
                    self.choose(w, at, rss, actions);
                } else {
                    let why = format!("{to} gave {t:.0}/s against {base:.0}/s at {from}");
                    self.trim_or_finish(stage, at, &why, actions);
                }
            }
            Phase::QueueProbe { stage, from, base, trim: false, .. } => {
                let to = self.capacity[stage];
                if t > base * (1.0 + self.config.gain) {
                    // It pays: find the least capacity (within a factor of two) that keeps it.
                    let why = format!("{to} slots: {base:.0}/s -> {t:.0}/s (+{:.0}%)", (t / base - 1.0) * 100.0);
                    self.trim_queue(stage, from, to, t, at, &why, actions);
                } else {
                    let why = format!("queue: {to} slots gave {t:.0}/s against {base:.0}/s at {from}; keeping {from}");
                    self.set_capacity(stage, from, at, why, actions);
                    self.queue_done[stage] = true;
                    self.phase = Phase::Measure;
                }
            }
            Phase::QueueProbe { stage, trim: true, lo, best, best_tput, .. } => {
                let to = self.capacity[stage];
                let why = format!("{to} slots gave {t:.0}/s against the best {best_tput:.0}/s at {best}");
                if t >= best_tput * (1.0 - self.config.tolerance) {
                    self.trim_queue(stage, lo, to, best_tput, at, &why, actions);
                } else {
                    self.trim_queue(stage, to, best, best_tput, at, &why, actions);
                }
            }
            Phase::Probe { stage, to, trim: true, .. } => {
                let s = &mut self.search[stage];
                let kept = t >= s.best_tput * (1.0 - self.config.tolerance);
                let why = format!("{to} gave {t:.0}/s against the best {:.0}/s", s.best_tput);
                if kept {
                    s.best = to;
                } else {
                    s.lo = Some(to);
                }
                self.trim_or_finish(stage, at, &why, actions);
            }
        }
        self.fit_threads(at, actions);
    }

    /// Picks the busiest tunable stage and raises it, or settles.
    fn choose(&mut self, w: &Window, at: Duration, rss: Option<u64>, actions: &mut Vec<Action>) {
        let t = w.throughput;
        loop {
            let busy = |i: usize| w.stages.get(self.stages[i].row).map_or(0.0, |s| s.busy);
            let pick = (0..self.stages.len())
                .filter(|&i| !self.search[i].done && busy(i) >= self.config.busy_floor)
                .max_by(|&a, &b| busy(a).total_cmp(&busy(b)));
            let Some(i) = pick else {
                if !self.choose_queue(w, at, rss, actions) {
                    self.settle(t, at);
                }
                return;
            };
            // An untunable stage far busier than every tunable one is the limit.
            let tuned_rows: Vec<usize> = self.stages.iter().map(|s| s.row).collect();
            let fixed = w
                .stages
                .iter()
                .enumerate()
                .filter(|(r, s)| !tuned_rows.contains(r) && s.kind != StageKind::Sink)
                .max_by(|a, b| a.1.busy.total_cmp(&b.1.busy));
            if let Some((_, f)) = fixed
                && f.busy >= 0.9
                && f.busy > busy(i) + 0.1
            {
                tracing::info!(target: "spdl_exec::autotune", stage = %f.name, busy = f.busy, "the bottleneck is not tunable");
                self.settle(t, at);
                return;
            }
            self.search[i] = Search { lo: None, best: self.current[i], best_tput: t, done: false };
            let why = format!("busy {:.0}%", busy(i) * 100.0);
            if self.raise(i, w, at, rss, &why, actions) {
                return;
            }
            self.search[i].done = true;
        }
    }

    /// Whether the stage before queue `i` waits for room while the one after waits for items.
    fn jittery(&self, i: usize, w: &Window) -> bool {
        self.jitter(i, w) >= self.config.jitter_floor
    }

    /// The lesser of the blocked share before queue `i` and the starved share after it.
    fn jitter(&self, i: usize, w: &Window) -> f64 {
        let s = &self.stages[i];
        let Some(consumer) = s.consumer_row.and_then(|r| w.stages.get(r)) else { return 0.0 };
        let blocked = w.stages.get(s.row).map_or(0.0, |x| x.blocked);
        blocked.min(consumer.starved)
    }

    /// Grows the most jittery tunable queue left in this round. `false`: none.
    fn choose_queue(&mut self, w: &Window, at: Duration, rss: Option<u64>, actions: &mut Vec<Action>) -> bool {
        loop {
            let pick = (0..self.stages.len())
                .filter(|&i| !self.queue_done[i] && self.stages[i].queue_tunable() && self.jittery(i, w))
                .max_by(|&a, &b| self.jitter(a, w).total_cmp(&self.jitter(b, w)));
            let Some(i) = pick else { return false };
            let why = format!(
                "`{}` blocked and its consumer starved {:.0}% of the window",
                self.stages[i].name,
                self.jitter(i, w) * 100.0
            );
            if self.grow_queue(i, w, at, rss, &why, actions) {
                return true;
            }
            self.queue_done[i] = true;
        }
    }

    /// The search of queue `i` knows `lo` slots to be worse than `best`: tries the geometric
    /// middle, or ends at `best` once it is within a factor of two of `lo`.
    #[allow(clippy::too_many_arguments)]
    fn trim_queue(
        &mut self,
        i: usize,
        lo: usize,
        best: usize,
        best_tput: f64,
        at: Duration,
        why: &str,
        actions: &mut Vec<Action>,
    ) {
        if best > lo.saturating_mul(2) {
            let mid = ((lo as f64) * (best as f64)).sqrt().round() as usize;
            let mid = mid.clamp(lo + 1, best - 1);
            let from = self.capacity[i];
            self.set_capacity(i, mid, at, format!("queue: {why}; trying {mid}"), actions);
            self.phase = Phase::QueueProbe { stage: i, from, base: best_tput, trim: true, lo, best, best_tput };
            return;
        }
        self.queue_done[i] = true;
        if self.capacity[i] == best {
            tracing::info!(target: "spdl_exec::autotune", stage = %self.stages[i].name, capacity = best, "queue: {why}; keeping it");
        } else {
            self.set_capacity(i, best, at, format!("queue: {why}; keeping {best}"), actions);
        }
        self.phase = Phase::Measure;
    }

    /// The largest value up to `to` of stage `i`'s concurrency or queue capacity (`knob`) that
    /// keeps the tuned stages within the memory budget: `from` when none above it fits, or
    /// when resident memory is already at the budget.
    fn within_budget(&self, i: usize, knob: Knob, from: usize, to: usize, rss: Option<u64>) -> usize {
        let Some(budget) = self.config.max_memory_bytes else { return to };
        if rss.is_some_and(|r| r >= budget) {
            return from;
        }
        let others = self.memory().saturating_sub(self.stage_memory(i));
        let s = &self.stages[i];
        let fits = |v: usize| {
            let held =
                if knob == Knob::QueueCapacity { s.memory(self.current[i], v) } else { s.memory(v, self.capacity[i]) };
            others.saturating_add(held) <= budget
        };
        let mut to = to;
        while to > from && !fits(to) {
            to -= 1;
        }
        to
    }

    /// Probes the largest capacity of the queue after stage `i` that its bound and the
    /// memory budget allow. `false`: it cannot grow.
    fn grow_queue(
        &mut self,
        i: usize,
        w: &Window,
        at: Duration,
        rss: Option<u64>,
        why: &str,
        actions: &mut Vec<Action>,
    ) -> bool {
        let from = self.capacity[i];
        let to = self.within_budget(i, Knob::QueueCapacity, from, self.stages[i].queue_max, rss);
        if to <= from {
            return false;
        }
        self.set_capacity(i, to, at, format!("queue: {why}; probing {from} -> {to} slots"), actions);
        let base = w.throughput;
        self.phase = Phase::QueueProbe { stage: i, from, base, trim: false, lo: from, best: to, best_tput: base };
        true
    }

    /// Probes a higher concurrency for stage `i` (twice the current, within its bounds and
    /// the memory budget). `false`: it cannot go higher.
    fn raise(
        &mut self,
        i: usize,
        w: &Window,
        at: Duration,
        rss: Option<u64>,
        why: &str,
        actions: &mut Vec<Action>,
    ) -> bool {
        let from = self.current[i];
        if from >= self.stages[i].max {
            return false;
        }
        let to = self.within_budget(i, Knob::Concurrency, from, from.saturating_mul(2).min(self.stages[i].max), rss);
        if to <= from {
            return false;
        }
        let base = w.throughput;
        let saturated = w.stages.get(self.stages[i].row).is_some_and(|s| s.busy >= 0.9);
        self.set(i, to, at, format!("raise: {why}; probing {from} -> {to}"), actions);
        self.phase = Phase::Probe { stage: i, from, to, base, trim: false, saturated };
        true
    }

    /// After a probe that was not kept: tries the middle of what is left of the search, or
    /// ends the stage's search at its best.
    fn trim_or_finish(&mut self, i: usize, at: Duration, why: &str, actions: &mut Vec<Action>) {
        let s = &self.search[i];
        if let Some(lo) = s.lo
            && s.best > lo + 1
        {
            let mid = lo + (s.best - lo) / 2;
            let base = s.best_tput;
            let from = self.current[i];
            self.set(i, mid, at, format!("trim: {why}; trying {mid}"), actions);
            self.phase = Phase::Probe { stage: i, from, to: mid, base, trim: true, saturated: false };
            return;
        }
        self.finish(i, at, why, actions);
    }

    /// Ends the search of stage `i` at its best concurrency, then measures again.
    fn finish(&mut self, i: usize, at: Duration, why: &str, actions: &mut Vec<Action>) {
        let best = self.search[i].best.clamp(self.stages[i].min, self.stages[i].max);
        self.search[i].done = true;
        if self.current[i] != best {
            self.set(i, best, at, format!("settle: {why}; keeping {best}"), actions);
        } else {
            tracing::info!(target: "spdl_exec::autotune", stage = %self.stages[i].name, concurrency = best, "{why}; keeping it");
        }
        self.phase = Phase::Measure;
    }

    fn settle(&mut self, base: f64, at: Duration) {
        if self.settled_at.is_none() {
            self.settled_at = Some(at);
        }
        if let Some((conc, cap)) = self.round_start.take() {
            let floor = self.config.reprobe_windows.max(1);
            if conc == self.current && cap == self.capacity {
                self.reprobe_after = self.reprobe_after.saturating_mul(2).min(floor.saturating_mul(MAX_BACKOFF));
                tracing::info!(target: "spdl_exec::autotune", windows = self.reprobe_after, "the round changed nothing; re-probing less often");
            } else {
                self.reprobe_after = floor;
            }
        }
        tracing::info!(target: "spdl_exec::autotune", throughput = base, concurrency = ?self.current, "settled");
        self.phase = Phase::Settled { base, off: 0 };
    }

    fn set(&mut self, i: usize, to: usize, at: Duration, reason: String, actions: &mut Vec<Action>) {
        let from = self.current[i];
        let stage = &self.stages[i];
        let to = to.clamp(stage.min, stage.max);
        if to == from {
            return;
        }
        tracing::info!(target: "spdl_exec::autotune", stage = %stage.name, from, to, "{reason}");
        let name = stage.name.clone();
        self.decisions.push(Decision { at, stage: name, knob: Knob::Concurrency, from, to, reason: reason.clone() });
        actions.push(Action::SetConcurrency { row: stage.row, to, reason });
        self.current[i] = to;
    }

    fn set_capacity(&mut self, i: usize, to: usize, at: Duration, reason: String, actions: &mut Vec<Action>) {
        let from = self.capacity[i];
        let stage = &self.stages[i];
        let to = to.clamp(stage.output_capacity.max(1), stage.queue_max.max(stage.output_capacity).max(1));
        if to == from {
            return;
        }
        tracing::info!(target: "spdl_exec::autotune", stage = %stage.name, from, to, "{reason}");
        let name = stage.name.clone();
        self.decisions.push(Decision { at, stage: name, knob: Knob::QueueCapacity, from, to, reason: reason.clone() });
        actions.push(Action::SetCapacity { row: stage.row, to, reason });
        self.capacity[i] = to;
    }

    /// Sizes the pool to the blocking concurrency the controller set.
    fn fit_threads(&mut self, at: Duration, actions: &mut Vec<Action>) {
        let start = self.start.as_deref().unwrap_or(&[]);
        let blocking: usize = self
            .stages
            .iter()
            .zip(&self.current)
            .zip(start)
            .filter(|((s, _), _)| s.kind == StageKind::Blocking)
            .map(|((_, &c), &c0)| c.saturating_sub(c0))
            .sum();
        let want = (self.min_threads + blocking).min(self.config.max_threads.max(self.min_threads));
        if want != self.threads {
            let reason = format!("pool follows the blocking concurrency (+{blocking} over the start)");
            tracing::info!(target: "spdl_exec::autotune", from = self.threads, to = want, "{reason}");
            let (from, stage) = (self.threads, "pool".to_owned());
            self.decisions.push(Decision { at, stage, knob: Knob::Threads, from, to: want, reason });
            actions.push(Action::SetThreads { to: want });
            self.threads = want;
        }
    }
}

/// The process's resident memory, where it can be read (Linux).
pub(crate) fn resident_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    spdl_report::proc_field(&status, "VmRSS")?.ok()
}

/// Half the memory available now, where it can be read (Linux): the default memory budget
/// ([`AutotuneConfig::max_memory_bytes`]).
pub(crate) fn default_memory_budget() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    spdl_report::proc_field(&info, "MemAvailable")?.ok().map(|b| b / 2)
}

/// What the auto-tuner did, from [`crate::Pipeline::autotune`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AutotuneReport {
    /// Every change, oldest first: the trajectory of each stage's concurrency.
    pub decisions: Vec<Decision>,
    /// When the controller first settled (the pipeline's elapsed time).
    pub settled_at: Option<Duration>,
    /// Whether it is settled now.
    pub settled: bool,
    /// Rounds of search started.
    pub rounds: u32,
    /// The pool's thread count now.
    pub threads: usize,
    /// The memory budget in force.
    pub max_memory_bytes: Option<u64>,
}

/// What a pipeline built with `autotune` hands its scheduler.
pub(crate) struct Setup {
    pub(crate) controller: Controller,
    pub(crate) report: std::sync::Arc<std::sync::Mutex<AutotuneReport>>,
}

impl Setup {
    /// The controller of the tuned rows among `cells` (the pipeline's rows, sink last).
    pub(crate) fn new(
        cells: &[std::sync::Arc<crate::stats::StageCell>],
        threads: usize,
        max_memory_bytes: Option<u64>,
    ) -> Self {
        let stages = cells
            .iter()
            .enumerate()
            .filter_map(|(row, c)| {
                let b = c.tune.get()?;
                let queue = c.output_tune.get();
                let consumer_row = queue.and_then(|q| {
                    cells.iter().position(|d| d.input_limit.get().is_some_and(|l| l.same_queue(&q.limit)))
                });
                Some(TunedStage {
                    row,
                    name: c.name.clone(),
                    kind: c.kind,
                    min: b.min,
                    max: b.max,
                    item_bytes: b.item_bytes,
                    output_capacity: b.output_capacity,
                    queue_max: queue.map_or(b.output_capacity, |q| q.max),
                    consumer_row,
                })
            })
            .collect();
        let max_memory_bytes = max_memory_bytes.or_else(default_memory_budget);
        let config = AutotuneConfig { max_memory_bytes, max_threads: (4 * cores()).max(threads), ..Default::default() };
        let report = AutotuneReport { threads, max_memory_bytes, rounds: 1, ..Default::default() };
        Self {
            controller: Controller::new(config, stages, threads),
            report: std::sync::Arc::new(std::sync::Mutex::new(report)),
        }
    }
}

/// The controller's task on the scheduler: samples the stats, applies the actions.
pub(crate) async fn drive(
    setup: Setup,
    cells: Vec<std::sync::Arc<crate::stats::StageCell>>,
    shared: std::sync::Arc<crate::context::Shared>,
    pool: crate::pool::PoolResizer,
) {
    let Setup { mut controller, report } = setup;
    if controller.stages.is_empty() {
        return;
    }
    let mut tick = tokio::time::interval(controller.config.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if shared.cancelled() {
            return;
        }
        let elapsed = shared.started.get().map_or(Duration::ZERO, std::time::Instant::elapsed);
        let stats = crate::stats::snapshot(&cells, elapsed);
        for action in controller.observe(&stats, resident_bytes()) {
            match action {
                Action::SetConcurrency { row, to, reason } => {
                    if let Some(cell) = cells.get(row) {
                        cell.set_concurrency(to, elapsed, reason);
                    }
                }
                Action::SetCapacity { row, to, reason } => {
                    if let Some(cell) = cells.get(row) {
                        cell.set_output_capacity(to, reason);
                    }
                }
                Action::SetThreads { to } => {
                    if let Err(err) = pool.resize(to) {
                        tracing::warn!(target: "spdl_exec::autotune", "could not resize the pool to {to} threads: {}", spdl_report::error_chain(&err));
                    }
                }
            }
        }
        let mut r = report.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let known = r.decisions.len();
        r.decisions.extend(controller.decisions().iter().skip(known).cloned());
        r.settled_at = controller.settled_at();
        r.settled = controller.is_settled();
        r.rounds = controller.rounds();
        r.threads = pool.threads();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::StageStats;

    /// A synthetic stage: each of its first `opt` slots serves `rate` items/s; slots beyond
    /// `opt` add nothing and each costs 1% of throughput (contention).
    #[derive(Clone)]
    struct SimStage {
        name: &'static str,
        kind: StageKind,
        rate: f64,
        opt: usize,
        conc: usize,
        items: f64,
        task: f64,
        /// Capacity of the queue after the stage.
        queue: usize,
        /// How bursty the stage and its consumer are: the queue after it passes
        /// `queue / (queue + burst)` of the items it could (the rest of the time the stage
        /// is blocked and its consumer starved).
        burst: f64,
        blocked: f64,
        starved: f64,
        /// What the stage reports measuring per item (`StageStats::item_bytes`).
        item_bytes: Option<u64>,
    }

    impl SimStage {
        fn new(name: &'static str, kind: StageKind, rate: f64, opt: usize) -> Self {
            Self {
                name,
                kind,
                rate,
                opt,
                conc: 1,
                items: 0.0,
                task: 0.0,
                queue: 32,
                burst: 0.0,
                blocked: 0.0,
                starved: 0.0,
                item_bytes: None,
            }
        }

        fn passed(&self) -> f64 {
            if self.burst > 0.0 { self.queue as f64 / (self.queue as f64 + self.burst) } else { 1.0 }
        }

        fn capacity(&self) -> f64 {
            let extra = self.conc.saturating_sub(self.opt) as f64;
            self.rate * self.conc.min(self.opt) as f64 * (1.0 - 0.01 * extra).max(0.1)
        }
    }

    /// A pipeline of synthetic stages behind a source of `source_rate` items/s, sampled
    /// every 100 ms, with deterministic throughput noise of +-`noise`.
    struct Sim {
        source_rate: f64,
        stages: Vec<SimStage>,
        t: f64,
        source_items: f64,
        noise: f64,
        seed: u64,
    }

    impl Sim {
        fn new(source_rate: f64, stages: Vec<SimStage>, noise: f64) -> Self {
            Self { source_rate, stages, t: 0.0, source_items: 0.0, noise, seed: 0x9e37_79b9_7f4a_7c15 }
        }

        fn jitter(&mut self) -> f64 {
            // xorshift64*
            self.seed ^= self.seed >> 12;
            self.seed ^= self.seed << 25;
            self.seed ^= self.seed >> 27;
            let u = (self.seed.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as f64 / (1u64 << 53) as f64;
            1.0 + self.noise * (2.0 * u - 1.0)
        }

        fn throughput(&self) -> f64 {
            let limit = self.stages.iter().map(SimStage::capacity).fold(self.source_rate, f64::min);
            self.stages.iter().map(SimStage::passed).product::<f64>() * limit
        }

        fn tick(&mut self) -> PipelineStats {
            let dt = 0.1;
            let tput = self.throughput() * self.jitter();
            self.t += dt;
            self.source_items += tput * dt;
            for i in 0..self.stages.len() {
                let s = &mut self.stages[i];
                let per_call = s.conc as f64 / s.capacity();
                s.items += tput * dt;
                s.task += tput * dt * per_call;
                let lost = 1.0 - s.passed();
                s.blocked += dt * s.conc as f64 * lost;
                if let Some(next) = self.stages.get_mut(i + 1) {
                    next.starved += dt * next.conc as f64 * lost;
                }
            }
            self.stats()
        }

        fn row(
            name: &str,
            kind: StageKind,
            conc: usize,
            items: f64,
            task: f64,
            bounds: Option<(usize, usize)>,
        ) -> StageStats {
            StageStats {
                name: name.into(),
                kind,
                concurrency: conc,
                concurrency_bounds: bounds,
                tune_reason: None,
                tune_changes: 0,
                items_in: items as u64,
                items_out: items as u64,
                items_failed: 0,
                task_time_total: Duration::from_secs_f64(task),
                task_mean: Duration::ZERO,
                task_p50: Duration::ZERO,
                task_p90: Duration::ZERO,
                task_p99: Duration::ZERO,
                starved: Duration::ZERO,
                blocked: Duration::ZERO,
                queue_len: 0,
                queue_capacity: 32,
                busy: 0.0,
                item_bytes: None,
            }
        }

        fn stats(&self) -> PipelineStats {
            let src_task = self.source_items / self.source_rate;
            let mut stages = vec![Self::row("source", StageKind::Source, 1, self.source_items, src_task, None)];
            for (i, s) in self.stages.iter().enumerate() {
                let mut row = Self::row(s.name, s.kind, s.conc, s.items, s.task, None);
                row.blocked = Duration::from_secs_f64(s.blocked);
                row.starved = Duration::from_secs_f64(s.starved);
                row.item_bytes = s.item_bytes;
                row.queue_capacity = if i == 0 { 32 } else { self.stages[i - 1].queue };
                stages.push(row);
            }
            stages.push(Self::row("sink", StageKind::Sink, 1, self.source_items, 0.0, None));
            PipelineStats { elapsed: Duration::from_secs_f64(self.t), stages }
        }

        fn apply(&mut self, actions: &[Action]) {
            for a in actions {
                match a {
                    Action::SetConcurrency { row, to, .. } => self.stages[row - 1].conc = *to,
                    Action::SetCapacity { row, to, .. } => self.stages[row - 1].queue = *to,
                    Action::SetThreads { .. } => {}
                }
            }
        }

        /// Runs `ticks` samples through `c`; returns the throughput of each tick.
        fn run(&mut self, c: &mut Controller, ticks: usize) -> Vec<f64> {
            (0..ticks)
                .map(|_| {
                    let stats = self.tick();
                    let actions = c.observe(&stats, None);
                    self.apply(&actions);
                    self.throughput()
                })
                .collect()
        }
    }

    fn tuned(sim: &Sim, max: usize) -> Vec<TunedStage> {
        sim.stages.iter().enumerate().map(|(i, s)| TunedStage::new(i + 1, s.name, s.kind, 1, max)).collect()
    }

    #[test]
    fn converges_on_the_optimal_concurrency() {
        let mut sim = Sim::new(1e6, vec![SimStage::new("decode", StageKind::Blocking, 100.0, 6)], 0.02);
        let config = AutotuneConfig { max_threads: 64, ..AutotuneConfig::default() };
        let mut c = Controller::new(config, tuned(&sim, 32), 4);
        sim.run(&mut c, 600);
        assert_eq!(sim.stages[0].conc, 6, "{:#?}", c.decisions());
        assert!(c.is_settled());
        assert_eq!(c.rounds(), 1);
        // The pool grew with the blocking concurrency (4 threads + 5 more slots).
        assert_eq!(c.threads(), 9);
    }

    #[test]
    fn converges_on_several_stages_and_async_io() {
        let stages = vec![
            SimStage::new("get", StageKind::Async, 50.0, 64),
            SimStage::new("decode", StageKind::Blocking, 400.0, 5),
            SimStage::new("collate", StageKind::Blocking, 5000.0, 1),
        ];
        let mut sim = Sim::new(1e6, stages, 0.03);
        let best = 2000.0; // decode at 5 slots
        let mut c = Controller::new(AutotuneConfig::default(), tuned(&sim, 256), 2);
        let tput = sim.run(&mut c, 1200);
        assert!(c.is_settled(), "{:#?}", c.decisions());
        assert!(c.settled_at().is_some_and(|t| t < Duration::from_secs(10)));
        let last = tput.last().copied().unwrap_or(0.0);
        assert!(last >= 0.95 * best, "{last} against {best}: {:#?}", c.decisions());
        // Nothing is raised that does not pay: collate stays at 1, decode at its optimum.
        assert_eq!(sim.stages[2].conc, 1);
        assert_eq!(sim.stages[1].conc, 5);
        assert!(sim.stages[0].conc >= 40 && sim.stages[0].conc <= 64, "get at {}", sim.stages[0].conc);
    }

    #[test]
    fn does_not_oscillate_once_settled() {
        let mut sim = Sim::new(1e6, vec![SimStage::new("decode", StageKind::Blocking, 100.0, 6)], 0.05);
        let mut c = Controller::new(AutotuneConfig::default(), tuned(&sim, 32), 4);
        sim.run(&mut c, 200);
        let settled_at = c.settled_at().expect("settled within 20 s");
        let n = c.decisions().len();
        // Ten more minutes of noisy but steady throughput: no change at all.
        sim.run(&mut c, 6000);
        assert_eq!(c.decisions().len(), n, "changes after settling at {settled_at:?}: {:#?}", &c.decisions()[n..]);
        assert_eq!(c.rounds(), 1);
    }

    #[test]
    fn reprobes_when_the_workload_changes_then_settles_again() {
        let mut sim = Sim::new(1e6, vec![SimStage::new("decode", StageKind::Blocking, 100.0, 4)], 0.02);
        let mut c = Controller::new(AutotuneConfig::default(), tuned(&sim, 64), 1);
        sim.run(&mut c, 300);
        assert_eq!(sim.stages[0].conc, 4);
        // Each item now waits longer (on I/O, say): throughput falls, and more slots pay.
        sim.stages[0].rate = 40.0;
        sim.stages[0].opt = 12;
        sim.run(&mut c, 600);
        assert!(c.rounds() >= 2);
        assert!(c.is_settled());
        assert_eq!(sim.stages[0].conc, 12, "{:#?}", c.decisions());
    }

    #[test]
    fn respects_bounds() {
        let mut sim = Sim::new(1e6, vec![SimStage::new("decode", StageKind::Blocking, 100.0, 10)], 0.02);
        let stages = vec![TunedStage::new(1, "decode", StageKind::Blocking, 2, 3)];
        let mut c = Controller::new(AutotuneConfig::default(), stages, 4);
        sim.stages[0].conc = 2;
        sim.run(&mut c, 300);
        assert_eq!(sim.stages[0].conc, 3);
        assert!(c.decisions().iter().filter(|d| d.stage == "decode").all(|d| (2..=3).contains(&d.to)));
        // The pool never exceeds its own bound either.
        let config = AutotuneConfig { max_threads: 5, ..AutotuneConfig::default() };
        let mut sim = Sim::new(1e6, vec![SimStage::new("decode", StageKind::Blocking, 100.0, 10)], 0.02);
        let mut c = Controller::new(config, tuned(&sim, 32), 4);
        sim.run(&mut c, 300);
        assert_eq!(c.threads(), 5);
    }

    #[test]
    fn counts_a_measured_item_size_against_the_budget() {
        const MIB: u64 = 1 << 20;
        // Nothing configured: the size comes from the stage's own measure in its stats row,
        // and may change while it runs.
        let mut sim = Sim::new(1e6, vec![SimStage::new("decode", StageKind::Blocking, 100.0, 12)], 0.02);
        sim.stages[0].item_bytes = Some(10 * MIB);
        let stage = TunedStage { output_capacity: 4, ..TunedStage::new(1, "decode", StageKind::Blocking, 1, 32) };
        run_within_budget(&mut sim, stage, 100 * MIB);
        assert_eq!(sim.stages[0].conc, 6);
        // Without a measure the same stage climbs to its optimum.
        let mut sim = Sim::new(1e6, vec![SimStage::new("decode", StageKind::Blocking, 100.0, 12)], 0.02);
        let stages = vec![TunedStage::new(1, "decode", StageKind::Blocking, 1, 32)];
        let config = AutotuneConfig { max_memory_bytes: Some(100 * MIB), ..AutotuneConfig::default() };
        let mut c = Controller::new(config, stages, 4);
        sim.run(&mut c, 300);
        assert!(sim.stages[0].conc >= 12, "{}", sim.stages[0].conc);
    }

    /// Runs `stage` over `sim` for 300 samples at a resident memory of half of `budget`,
    /// checking at each that what the controller counts stays within the budget.
    fn run_within_budget(sim: &mut Sim, stage: TunedStage, budget: u64) -> Controller {
        let config = AutotuneConfig { max_memory_bytes: Some(budget), ..AutotuneConfig::default() };
        let mut c = Controller::new(config, vec![stage], 4);
        for _ in 0..300 {
            let stats = sim.tick();
            let actions = c.observe(&stats, Some(budget / 2));
            sim.apply(&actions);
            assert!(c.memory() <= budget, "{} of {budget} bytes", c.memory());
        }
        c
    }

    #[test]
    fn respects_the_memory_budget() {
        const MIB: u64 = 1 << 20;
        let mut sim = Sim::new(1e6, vec![SimStage::new("decode", StageKind::Blocking, 100.0, 12)], 0.02);
        // (concurrency + 4 queued) x 10 MiB never exceeds 100 MiB.
        let stage = TunedStage::new(1, "decode", StageKind::Blocking, 1, 32).with_memory(10 * MIB, 4);
        let mut c = run_within_budget(&mut sim, stage, 100 * MIB);
        assert_eq!(sim.stages[0].conc, 6);
        // Resident memory over the budget: the controller halves what it raised.
        let stats = sim.tick();
        let actions = c.observe(&stats, Some(120 * MIB));
        sim.apply(&actions);
        assert_eq!(sim.stages[0].conc, 3);
        assert!(c.decisions().last().is_some_and(|d| d.reason.starts_with("memory")));
    }

    #[test]
    fn leaves_fixed_stages_alone() {
        // `fixed` is the bottleneck but not tunable: nothing is changed, and it settles.
        let stages = vec![
            SimStage::new("fixed", StageKind::Blocking, 100.0, 8),
            SimStage::new("tunable", StageKind::Blocking, 150.0, 8),
        ];
        let mut sim = Sim::new(1e6, stages, 0.02);
        let mut c = Controller::new(
            AutotuneConfig::default(),
            vec![TunedStage::new(2, "tunable", StageKind::Blocking, 1, 32)],
            4,
        );
        sim.run(&mut c, 300);
        assert_eq!(sim.stages[0].conc, 1);
        assert!(c.decisions().iter().all(|d| d.stage != "fixed"));
        assert!(c.is_settled());
        // The tunable stage was not raised for nothing (at most one probe, undone).
        assert_eq!(sim.stages[1].conc, 1);
    }

    /// `read` (async) feeds `decode` through a queue of 32 that they fill and drain in
    /// bursts; neither is worth more concurrency.
    fn bursty(burst: f64, noise: f64) -> (Sim, Vec<TunedStage>) {
        let mut read = SimStage::new("read", StageKind::Async, 2000.0, 1);
        read.burst = burst;
        let decode = SimStage::new("decode", StageKind::Blocking, 500.0, 1);
        let sim = Sim::new(1e6, vec![read, decode], noise);
        let stages = vec![
            TunedStage::new(1, "read", StageKind::Async, 1, 256).with_memory(1 << 20, 32).with_queue(256, 2),
            TunedStage::new(2, "decode", StageKind::Blocking, 1, 8),
        ];
        (sim, stages)
    }

    #[test]
    fn grows_a_queue_between_bursty_stages_until_it_stops_paying() {
        let (mut sim, stages) = bursty(16.0, 0.02);
        let mut c = Controller::new(AutotuneConfig::default(), stages, 2);
        let tput = sim.run(&mut c, 600);
        assert!(c.is_settled(), "{:#?}", c.decisions());
        // 32 slots pass 2/3 of what decode could take; 128 pass 89%, 256 94%.
        assert!(sim.stages[0].queue >= 128, "queue at {}: {:#?}", sim.stages[0].queue, c.decisions());
        assert_eq!(c.queue_capacity()[0], sim.stages[0].queue);
        let last = tput.last().copied().unwrap_or(0.0);
        assert!(last >= 0.88 * 500.0, "{last}");
        let grown: Vec<_> = c.decisions().iter().filter(|d| d.knob == Knob::QueueCapacity).collect();
        assert!(grown.iter().all(|d| d.stage == "read" && d.to <= 256), "{grown:#?}");
        // Concurrency that does not pay was not kept.
        assert_eq!((sim.stages[0].conc, sim.stages[1].conc), (1, 1), "{:#?}", c.decisions());
        // Steady afterwards.
        let n = c.decisions().len();
        sim.run(&mut c, 3000);
        assert_eq!(c.decisions().len(), n, "{:#?}", &c.decisions()[n..]);
    }

    #[test]
    fn leaves_a_queue_alone_when_the_stages_are_steady() {
        let (mut sim, stages) = bursty(0.0, 0.02);
        let mut c = Controller::new(AutotuneConfig::default(), stages, 2);
        sim.run(&mut c, 600);
        assert!(c.is_settled());
        assert!(c.decisions().iter().all(|d| d.knob != Knob::QueueCapacity), "{:#?}", c.decisions());
        assert_eq!(sim.stages[0].queue, 32);
    }

    #[test]
    fn queue_growth_stays_within_the_memory_budget() {
        const MIB: u64 = 1 << 20;
        let (mut sim, stages) = bursty(16.0, 0.02);
        // 1 MiB per slot: read's calls in flight plus its queue may hold 80 slots.
        let config = AutotuneConfig { max_memory_bytes: Some(80 * MIB), ..AutotuneConfig::default() };
        let mut c = Controller::new(config, stages, 2);
        for _ in 0..600 {
            let stats = sim.tick();
            let actions = c.observe(&stats, Some(10 * MIB));
            sim.apply(&actions);
            assert!(c.memory() <= 80 * MIB, "{} MiB", c.memory() / MIB);
        }
        assert!(sim.stages[0].queue > 32 && sim.stages[0].queue < 80, "{}", sim.stages[0].queue);
        // Over the budget: the grown queue goes back first.
        let stats = sim.tick();
        let actions = c.observe(&stats, Some(100 * MIB));
        sim.apply(&actions);
        let last = c.decisions().last().cloned().expect("a decision");
        assert_eq!((last.knob, last.to), (Knob::QueueCapacity, 32.max(last.from / 2)), "{last:#?}");
    }

    #[test]
    fn reprobes_back_off_on_a_noisy_machine() {
        // +-45% noise per sample: settled throughput keeps "moving" by more than 20%.
        let mut sim = Sim::new(1e6, vec![SimStage::new("decode", StageKind::Blocking, 100.0, 6)], 0.45);
        let mut c = Controller::new(AutotuneConfig::default(), tuned(&sim, 32), 4);
        sim.run(&mut c, 600);
        let early = c.rounds();
        sim.run(&mut c, 6000);
        let late = c.rounds() - early;
        // Ten minutes after the first one: at most a handful more rounds, and their gaps grew.
        assert!(late <= 12, "{late} rounds in ten minutes: {:#?}", c.decisions());
        assert!(c.reprobe_after() > AutotuneConfig::default().reprobe_windows, "{}", c.reprobe_after());
    }

    #[test]
    fn window_measures_rates_and_shares() {
        let mut sim = Sim::new(1e6, vec![SimStage::new("decode", StageKind::Blocking, 100.0, 6)], 0.0);
        sim.stages[0].conc = 2;
        let a = sim.tick();
        for _ in 0..9 {
            sim.tick();
        }
        let b = sim.tick();
        let w = Window::between(&a, &b);
        assert!((w.duration.as_secs_f64() - 1.0).abs() < 1e-6);
        assert!((w.throughput - 200.0).abs() < 1.0, "{}", w.throughput);
        let d = w.stage("decode").expect("row");
        assert!((d.busy - 1.0).abs() < 0.01, "{}", d.busy);
        assert!((d.task_mean.as_secs_f64() - 0.01).abs() < 1e-4, "{:?}", d.task_mean);
    }
}
