//! Per-stage statistics: always on, updated with relaxed atomics (no lock per item).

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use crate::failure::{FailureBudget, ItemFailure};

const BUCKETS: usize = 256;

/// A streaming latency histogram: buckets at four steps per power of two (about 19%
/// resolution) over the whole `u64` nanosecond range, so memory is fixed whatever the count.
pub(crate) struct Histogram {
    counts: [AtomicU64; BUCKETS],
    sum_ns: AtomicU64,
}

impl Histogram {
    fn new() -> Self {
        Self { counts: std::array::from_fn(|_| AtomicU64::new(0)), sum_ns: AtomicU64::new(0) }
    }

    fn index(ns: u64) -> usize {
        if ns < 4 {
            return ns as usize;
        }
        let msb = 63 - ns.leading_zeros() as usize;
        let sub = ((ns >> (msb - 2)) & 3) as usize;
        (msb - 1) * 4 + sub
    }

    /// The middle of bucket `i`, in nanoseconds.
    fn representative(i: usize) -> u64 {
        if i < 4 {
            return i as u64;
        }
        let msb = i / 4 + 1;
        let sub = (i % 4) as u128;
        let lo = (4 + sub) << (msb - 2);
        let hi = (5 + sub) << (msb - 2);
        u64::try_from((lo + hi) / 2).unwrap_or(u64::MAX)
    }

    pub(crate) fn record(&self, d: Duration) {
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        if let Some(c) = self.counts.get(Self::index(ns)) {
            c.fetch_add(1, Relaxed);
        }
        self.sum_ns.fetch_add(ns, Relaxed);
    }

    fn snapshot(&self) -> ([u64; BUCKETS], u64) {
        (std::array::from_fn(|i| self.counts.get(i).map_or(0, |c| c.load(Relaxed))), self.sum_ns.load(Relaxed))
    }

    fn quantile(counts: &[u64; BUCKETS], total: u64, q: f64) -> Duration {
        if total == 0 {
            return Duration::ZERO;
        }
        let rank = ((q * total as f64).ceil() as u64).clamp(1, total);
        let mut seen = 0;
        for (i, &c) in counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return Duration::from_nanos(Self::representative(i));
            }
        }
        Duration::ZERO
    }
}

/// What a row of the stats is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StageKind {
    /// The source (iterator on the pool, or stream on the scheduler).
    Source,
    /// A stage whose function runs on the thread pool.
    Blocking,
    /// A stage whose function is async, run on the scheduler's runtime.
    Async,
    /// `aggregate(n)`.
    Aggregate,
    /// `disaggregate()`.
    Disaggregate,
    /// The sink queue, read by the consumer.
    Sink,
    /// A merge of several inputs (a merge's own row, or the join after a route).
    Merge,
    /// A stage run by a function that takes the stage's whole input stream
    /// ([`crate::PipelineBuilder::through`]).
    Through,
}

/// What fills the queue in front of a stage, for its occupancy in the stats.
#[derive(Default)]
pub(crate) enum Feed {
    /// Nothing is queued in front (a source).
    #[default]
    None,
    /// The queue is filled by these stages (their items out).
    Cells(Vec<Arc<StageCell>>),
    /// The queue is filled by a router, which counts what it put in.
    Counter(Arc<AtomicU64>),
    /// The queue is filled by several of the above (a merge, a route's join).
    Many(Vec<Feed>),
}

impl Feed {
    fn fed(&self) -> u64 {
        match self {
            Self::None => 0,
            Self::Cells(cells) => cells.iter().map(|c| c.items_out.load(Relaxed)).sum(),
            Self::Counter(n) => n.load(Relaxed),
            Self::Many(feeds) => feeds.iter().map(Self::fed).sum(),
        }
    }
}

/// The bounds within which the auto-tuner may set a stage's concurrency, and what it needs
/// to count the stage's memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TuneBounds {
    pub(crate) min: usize,
    pub(crate) max: usize,
    pub(crate) item_bytes: Option<u64>,
    /// Capacity of the queue after the stage.
    pub(crate) output_capacity: usize,
}

/// The queue after a stage whose capacity the auto-tuner may set, within `min..=max`.
#[derive(Debug, Clone)]
pub(crate) struct TunedQueue {
    pub(crate) limit: crate::queue::QueueLimit,
    pub(crate) min: usize,
    pub(crate) max: usize,
}

/// How the concurrency of a tuned stage changed over time (locked only on a change and for
/// a snapshot, never per item).
#[derive(Debug, Default)]
struct TuneTrack {
    /// Concurrency x seconds up to `changed_at`.
    slot_seconds: f64,
    changed_at: Duration,
    reason: Option<String>,
    changes: u32,
}

/// The live counters of one stage, shared by its driver, its workers and the snapshots.
pub(crate) struct StageCell {
    pub(crate) name: String,
    pub(crate) kind: StageKind,
    /// The calls the stage may have in flight; changed while running by the auto-tuner.
    concurrency: AtomicUsize,
    /// Set (once, at wiring) when the auto-tuner may change the concurrency.
    pub(crate) tune: OnceLock<TuneBounds>,
    /// Signalled when the concurrency changes, for the stage's driver.
    pub(crate) retuned: tokio::sync::Notify,
    track: Mutex<TuneTrack>,
    /// Capacity of the queue feeding this stage (0 for the source) when it was wired.
    pub(crate) input_capacity: usize,
    /// The queue feeding this stage, when its capacity may change while it runs.
    pub(crate) input_limit: OnceLock<crate::queue::QueueLimit>,
    /// The queue after this stage, when the auto-tuner may set its capacity.
    pub(crate) output_tune: OnceLock<TunedQueue>,
    /// The stage's own measure of its items' size, if it takes one.
    pub(crate) item_size: OnceLock<crate::ItemSize>,
    /// The stage's own budget; `None`: the pipeline's judges it.
    pub(crate) budget: Option<FailureBudget>,
    pub(crate) items_in: AtomicU64,
    pub(crate) items_out: AtomicU64,
    pub(crate) failed: AtomicU64,
    pub(crate) completed: AtomicU64,
    pub(crate) starved_ns: AtomicU64,
    pub(crate) blocked_ns: AtomicU64,
    pub(crate) hist: Histogram,
    /// Set when the stage's budget (or the pipeline's) is spent: take no more input.
    pub(crate) stop_feeding: AtomicBool,
    /// The first few failures, kept for the error message (locked only on failure).
    pub(crate) causes: Mutex<Vec<ItemFailure>>,
    /// What fills this stage's input queue.
    pub(crate) feed: Feed,
}

impl StageCell {
    pub(crate) fn new(
        name: String,
        kind: StageKind,
        concurrency: usize,
        input_capacity: usize,
        budget: Option<FailureBudget>,
        feed: Feed,
    ) -> Self {
        Self {
            feed,
            name,
            kind,
            concurrency: AtomicUsize::new(concurrency.max(1)),
            tune: OnceLock::new(),
            retuned: tokio::sync::Notify::new(),
            track: Mutex::new(TuneTrack::default()),
            input_capacity,
            input_limit: OnceLock::new(),
            output_tune: OnceLock::new(),
            item_size: OnceLock::new(),
            budget,
            items_in: AtomicU64::new(0),
            items_out: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            completed: AtomicU64::new(0),
            starved_ns: AtomicU64::new(0),
            blocked_ns: AtomicU64::new(0),
            hist: Histogram::new(),
            stop_feeding: AtomicBool::new(false),
            causes: Mutex::new(Vec::new()),
        }
    }

    pub(crate) fn add_starved(&self, since: Instant) {
        self.starved_ns.fetch_add(nanos(since.elapsed()), Relaxed);
    }

    pub(crate) fn add_blocked(&self, since: Instant) {
        self.blocked_ns.fetch_add(nanos(since.elapsed()), Relaxed);
    }

    pub(crate) fn feeding_stopped(&self) -> bool {
        self.stop_feeding.load(Relaxed)
    }

    /// The calls the stage may now have in flight.
    pub(crate) fn concurrency(&self) -> usize {
        self.concurrency.load(Relaxed).max(1)
    }

    /// Sets the concurrency (at `elapsed` since the start, for the busy share) and wakes the
    /// stage's driver.
    pub(crate) fn set_concurrency(&self, n: usize, elapsed: Duration, reason: String) {
        let n = n.max(1);
        let mut track = self.track.lock().unwrap_or_else(PoisonError::into_inner);
        let old = self.concurrency.swap(n, Relaxed);
        let span = elapsed.saturating_sub(track.changed_at).as_secs_f64();
        track.slot_seconds += span * old.max(1) as f64;
        track.changed_at = track.changed_at.max(elapsed);
        track.reason = Some(reason);
        track.changes += 1;
        drop(track);
        self.retuned.notify_one();
    }

    /// Sets the capacity of the queue after this stage, if it is tuned, and records why.
    pub(crate) fn set_output_capacity(&self, n: usize, reason: String) {
        let Some(q) = self.output_tune.get() else { return };
        q.limit.set(n.clamp(q.min, q.max));
        let mut track = self.track.lock().unwrap_or_else(PoisonError::into_inner);
        track.reason = Some(reason);
        track.changes += 1;
    }

    /// Capacity of the queue feeding this stage now.
    fn input_capacity_now(&self) -> usize {
        self.input_limit.get().map_or(self.input_capacity, crate::queue::QueueLimit::capacity)
    }

    fn snapshot(&self, elapsed: Duration, queue_len: usize) -> StageStats {
        let (counts, sum_ns) = self.hist.snapshot();
        let calls: u64 = counts.iter().sum();
        let task_time_total = Duration::from_nanos(sum_ns);
        let concurrency = self.concurrency();
        let (wall, tune_reason, tune_changes) = {
            let track = self.track.lock().unwrap_or_else(PoisonError::into_inner);
            let since = elapsed.saturating_sub(track.changed_at).as_secs_f64();
            (track.slot_seconds + since * concurrency as f64, track.reason.clone(), track.changes)
        };
        StageStats {
            name: self.name.clone(),
            kind: self.kind,
            concurrency,
            concurrency_bounds: self.tune.get().map(|b| (b.min, b.max)),
            tune_reason,
            tune_changes,
            items_in: self.items_in.load(Relaxed),
            items_out: self.items_out.load(Relaxed),
            items_failed: self.failed.load(Relaxed),
            task_time_total,
            task_mean: Duration::from_nanos(sum_ns.checked_div(calls).unwrap_or(0)),
            task_p50: Histogram::quantile(&counts, calls, 0.50),
            task_p90: Histogram::quantile(&counts, calls, 0.90),
            task_p99: Histogram::quantile(&counts, calls, 0.99),
            starved: Duration::from_nanos(self.starved_ns.load(Relaxed)),
            blocked: Duration::from_nanos(self.blocked_ns.load(Relaxed)),
            queue_len,
            queue_capacity: self.input_capacity_now(),
            busy: if wall > 0.0 { (task_time_total.as_secs_f64() / wall).min(1.0) } else { 0.0 },
            item_bytes: self.tune.get().and_then(|b| b.item_bytes).or_else(|| self.item_size.get()?.get()),
        }
    }
}

pub(crate) fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Builds a snapshot from the cells, in pipeline order (source first, sink last).
pub(crate) fn snapshot(cells: &[std::sync::Arc<StageCell>], elapsed: Duration) -> PipelineStats {
    let mut stages = Vec::with_capacity(cells.len());
    for cell in cells {
        // Occupancy of the queue feeding this stage: pushed upstream minus popped here.
        let items_in = cell.items_in.load(Relaxed);
        let queue_len = usize::try_from(cell.feed.fed().saturating_sub(items_in))
            .unwrap_or(usize::MAX)
            .min(cell.input_capacity_now().max(cell.input_capacity));
        stages.push(cell.snapshot(elapsed, queue_len));
    }
    PipelineStats { elapsed, stages }
}

/// A snapshot of one stage's counters. Times of concurrent workers are summed.
#[derive(Debug, Clone, PartialEq)]
pub struct StageStats {
    /// The stage's name (`source`, `aggregate(32)`, `sink`, or the name given to [`crate::Stage`]).
    pub name: String,
    /// What the row is.
    pub kind: StageKind,
    /// The stage's concurrency (now: the auto-tuner may have changed it).
    pub concurrency: usize,
    /// The bounds within which the auto-tuner sets the concurrency; `None`: not tuned.
    pub concurrency_bounds: Option<(usize, usize)>,
    /// Why the auto-tuner last changed the concurrency or the capacity of the queue after
    /// the stage, if it did.
    pub tune_reason: Option<String>,
    /// How many times the auto-tuner changed either.
    pub tune_changes: u32,
    /// Items taken from the input queue (for the sink: items delivered to the consumer).
    pub items_in: u64,
    /// Items put into the output queue.
    pub items_out: u64,
    /// Items whose function returned an error or panicked.
    pub items_failed: u64,
    /// Total time spent in the stage's function.
    pub task_time_total: Duration,
    /// Mean time per call.
    pub task_mean: Duration,
    /// Median time per call (from a fixed log-bucket histogram, about 19% resolution).
    pub task_p50: Duration,
    /// 90th percentile time per call.
    pub task_p90: Duration,
    /// 99th percentile time per call.
    pub task_p99: Duration,
    /// Time spent waiting for input (the stage upstream is slower).
    pub starved: Duration,
    /// Time spent waiting to put output (the stage downstream is slower).
    pub blocked: Duration,
    /// Items waiting in the queue feeding this stage.
    pub queue_len: usize,
    /// Capacity of the queue feeding this stage (0 for the source).
    pub queue_capacity: usize,
    /// Share of the stage's capacity spent in its function: `task_time_total /
    /// (concurrency × elapsed)` (concurrency integrated over time when it was tuned),
    /// 0.0..=1.0. The busiest stage is the bottleneck.
    pub busy: f64,
    /// The memory one item of the stage holds, as the auto-tuner counts it: the stage's
    /// [`crate::StageOptions::item_bytes`] if set (and tuned), else its
    /// [`crate::Stage::item_size`] measure; `None`: unknown.
    pub item_bytes: Option<u64>,
}

/// A snapshot of the whole pipeline, from [`crate::Pipeline::stats`].
#[derive(Debug, Clone, PartialEq)]
pub struct PipelineStats {
    /// Time since the pipeline started (zero if not started).
    pub elapsed: Duration,
    /// One row per stage in pipeline order: the source first, the sink last.
    pub stages: Vec<StageStats>,
}

impl PipelineStats {
    /// The stage with the highest [`StageStats::busy`] share (source and stages; not the sink).
    pub fn bottleneck(&self) -> Option<&StageStats> {
        self.stages
            .iter()
            .filter(|s| s.kind != StageKind::Sink && s.task_time_total > Duration::ZERO)
            .max_by(|a, b| a.busy.total_cmp(&b.busy))
    }

    /// The row named `name`, if any.
    pub fn stage(&self, name: &str) -> Option<&StageStats> {
        self.stages.iter().find(|s| s.name == name)
    }
}

struct Dur(Duration);

impl fmt::Display for Dur {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ns = self.0.as_nanos();
        let s = if ns < 10_000 {
            format!("{ns}ns")
        } else if ns < 10_000_000 {
            format!("{}us", ns / 1_000)
        } else if ns < 10_000_000_000 {
            format!("{}ms", ns / 1_000_000)
        } else {
            format!("{}s", ns / 1_000_000_000)
        };
        f.pad(&s)
    }
}

impl fmt::Display for PipelineStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let bottleneck = self.bottleneck().map(|s| s.name.clone());
        let width = self.stages.iter().map(|s| s.name.len()).max().unwrap_or(5).max(5);
        writeln!(
            f,
            "{:<width$} {:>4} {:>9} {:>9} {:>7} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>7} {:>5}",
            "stage", "conc", "in", "out", "failed", "mean", "p50", "p90", "p99", "starved", "blocked", "queue", "busy"
        )?;
        for s in &self.stages {
            let queue = if s.kind == StageKind::Source {
                "-".to_owned()
            } else {
                format!("{}/{}", s.queue_len, s.queue_capacity)
            };
            write!(
                f,
                "{:<width$} {:>4} {:>9} {:>9} {:>7} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>7} {:>4.0}%",
                s.name,
                s.concurrency,
                s.items_in,
                s.items_out,
                s.items_failed,
                Dur(s.task_mean),
                Dur(s.task_p50),
                Dur(s.task_p90),
                Dur(s.task_p99),
                Dur(s.starved),
                Dur(s.blocked),
                queue,
                s.busy * 100.0
            )?;
            if bottleneck.as_deref() == Some(s.name.as_str()) {
                write!(f, "  <- bottleneck")?;
            }
            writeln!(f)?;
        }
        match self.bottleneck() {
            Some(b) => write!(
                f,
                "bottleneck: `{}` ({:.0}% busy over {:?}); raise its concurrency or make it faster",
                b.name,
                b.busy * 100.0,
                self.elapsed
            )?,
            None => write!(f, "bottleneck: none measured yet")?,
        }
        for s in &self.stages {
            if let Some((min, max)) = s.concurrency_bounds {
                let why = s.tune_reason.as_deref().unwrap_or("not changed yet");
                write!(
                    f,
                    "\nautotune `{}`: concurrency {} (bounds {min}..={max}, {} changes): {why}",
                    s.name, s.concurrency, s.tune_changes
                )?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_quantiles_are_within_a_bucket() {
        let h = Histogram::new();
        for us in 1..=1000u64 {
            h.record(Duration::from_micros(us));
        }
        let (counts, sum) = h.snapshot();
        let total: u64 = counts.iter().sum();
        assert_eq!(total, 1000);
        assert_eq!(sum, (1..=1000u64).sum::<u64>() * 1000);
        for (q, want_us) in [(0.5, 500.0), (0.9, 900.0), (0.99, 990.0)] {
            let got = Histogram::quantile(&counts, total, q).as_secs_f64() * 1e6;
            assert!((got - want_us).abs() / want_us < 0.2, "q{q}: {got} vs {want_us}");
        }
    }

    #[test]
    fn bucket_bounds_are_monotonic() {
        let mut prev = 0;
        for v in [0u64, 1, 3, 4, 5, 7, 8, 100, 1 << 20, u64::MAX] {
            let i = Histogram::index(v);
            assert!(i >= prev && i < BUCKETS);
            prev = i;
        }
        assert!(Histogram::representative(Histogram::index(1000)).abs_diff(1000) < 200);
    }
}
