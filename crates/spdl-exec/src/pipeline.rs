//! A built pipeline: lifecycle (start, stop, drop), the scheduler thread, and iteration.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use spdl_report::panic_message;

use crate::context::Shared;
use crate::error::{PipelineError, StopTimeout};
use crate::options::ReportHook;
use crate::pool::Pool;
use crate::queue::{Msg, PopError, QueueRx};
use crate::stats::{self, PipelineStats, StageCell};

/// How long dropping a running [`Pipeline`] waits for its threads to end. A stage function
/// (or source `next()`) still running after that is not waited for: its thread is detached
/// and ends on its own when the call returns, so a stuck call cannot hang the thread that
/// drops the pipeline (a garbage collector, an interpreter at exit). After a
/// [`Pipeline::stop_timeout`] that timed out, dropping does not wait at all.
pub const DROP_GRACE: Duration = Duration::from_secs(2);

/// What the consumer receives from [`Pipeline::get_item`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Item<T> {
    /// An item out of the last stage.
    Data(T),
    /// The end of an epoch of a continuous source (numbered from 0).
    EpochEnd {
        /// The epoch that ended.
        epoch: u64,
    },
}

/// Everything the scheduler thread needs, kept until the pipeline starts.
pub(crate) struct Startup {
    pub(crate) tasks: Vec<(String, BoxFuture<'static, ()>)>,
    pub(crate) pool: Pool,
    pub(crate) num_threads: usize,
    /// The pools of regions and their thread counts.
    pub(crate) pools: Vec<(Pool, usize)>,
    pub(crate) report: Option<(Duration, ReportHook)>,
    /// The auto-tuner, when the pipeline was built with `autotune`.
    pub(crate) autotune: Option<crate::autotune::Setup>,
}

enum Life {
    Ready(Box<Startup>),
    Running(JoinHandle<()>),
    Stopped,
}

/// A running (or ready to run) pipeline. The consumer only iterates: [`Pipeline::iter`]
/// gives one epoch (all items, for a one-pass source); [`Pipeline::get_item`] is the
/// low-level call with a timeout and epoch markers.
///
/// All methods take `&self`, and `Pipeline` is `Sync`: [`Pipeline::stop`] and
/// [`Pipeline::stats`] may be called from any thread while another one iterates.
/// Dropping the pipeline stops it and joins every thread it started, waiting at most
/// [`DROP_GRACE`] for calls still running (see [`Pipeline::stop_timeout`]).
pub struct Pipeline<T> {
    sink: QueueRx<T>,
    sink_cell: Arc<StageCell>,
    shared: Arc<Shared>,
    cells: Vec<Arc<StageCell>>,
    life: Mutex<Life>,
    /// A `stop_timeout` has timed out: `Drop` then does not wait again.
    gave_up: AtomicBool,
    /// What the auto-tuner did (with `autotune`).
    autotune: Option<Arc<Mutex<crate::autotune::AutotuneReport>>>,
    /// The process the pipeline was built in. In a child forked from it, the pipeline's threads do not
    /// exist: it refuses to run ([`PipelineError::Forked`]) and is left as it is when dropped.
    pid: u32,
}

impl<T> std::fmt::Debug for Pipeline<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let stages: Vec<&str> = self.cells.iter().map(|c| c.name.as_str()).collect();
        f.debug_struct("Pipeline").field("stages", &stages).field("stopped", &self.shared.cancelled()).finish()
    }
}

impl<T: Send + 'static> Pipeline<T> {
    pub(crate) fn new(
        sink: QueueRx<T>,
        sink_cell: Arc<StageCell>,
        shared: Arc<Shared>,
        cells: Vec<Arc<StageCell>>,
        startup: Startup,
    ) -> Self {
        let autotune = startup.autotune.as_ref().map(|a| Arc::clone(&a.report));
        Self {
            sink,
            sink_cell,
            shared,
            cells,
            life: Mutex::new(Life::Ready(Box::new(startup))),
            gave_up: AtomicBool::new(false),
            autotune,
            pid: std::process::id(),
        }
    }

    /// Starts the scheduler and the thread pool. Idempotent; implicit on the first item
    /// asked. After [`Pipeline::stop`], does nothing.
    pub fn start(&self) -> Result<(), PipelineError> {
        self.check_process()?;
        let mut life = self.life.lock().unwrap_or_else(PoisonError::into_inner);
        if !matches!(*life, Life::Ready(_)) {
            return Ok(());
        }
        let Life::Ready(startup) = std::mem::replace(&mut *life, Life::Stopped) else {
            return Ok(());
        };
        let _ = self.shared.started.set(Instant::now());
        let shared = Arc::clone(&self.shared);
        let cells = self.cells.clone();
        let spawned = std::thread::Builder::new().name("spdl-exec-scheduler".into()).spawn(move || {
            // Marks the end even if the scheduler panics, for `stop_timeout`'s wait.
            struct Exit(Arc<Shared>);
            impl Drop for Exit {
                fn drop(&mut self) {
                    self.0.mark_exited();
                }
            }
            let exit = Exit(shared);
            schedule(*startup, &exit.0, cells);
        });
        match spawned {
            Ok(handle) => {
                *life = Life::Running(handle);
                Ok(())
            }
            Err(source) => Err(PipelineError::Spawn { what: "scheduler", source }),
        }
    }
}

impl<T> Pipeline<T> {
    /// Whether this process is a child forked from the one that built the pipeline.
    fn forked(&self) -> bool {
        std::process::id() != self.pid
    }

    fn check_process(&self) -> Result<(), PipelineError> {
        if self.forked() {
            return Err(PipelineError::Forked { built_in: self.pid, now: std::process::id() });
        }
        Ok(())
    }

    /// Stops the pipeline: cancels pending work, lets running calls of stage functions
    /// return, and joins every thread. Idempotent; callable from any thread. Iteration
    /// then ends. A stage function or source `next()` that never returns blocks this: use
    /// [`Pipeline::stop_timeout`] to bound the wait.
    ///
    /// Called from inside a stage function it only requests the stop; the threads are
    /// joined by the next `stop` from outside or by `Drop`.
    pub fn stop(&self) {
        // Without a deadline the wait only ends when the threads do.
        let _ = self.stop_within(None);
    }

    /// [`Pipeline::stop`], waiting at most `timeout` for the pipeline's threads to end.
    ///
    /// `Ok`: every thread is joined. `Err(StopTimeout)`: a call of a stage function (or the
    /// source's `next()`) was still running at the deadline. The pipeline is stopped all the
    /// same: iteration has ended and no new call starts; the threads are left to end when
    /// that call returns (a later `stop` or `stop_timeout` waits for them again; dropping
    /// the pipeline then detaches them without waiting).
    ///
    /// ```
    /// use std::time::Duration;
    /// use spdl_exec::{BuildOptions, PipelineBuilder, Stage};
    ///
    /// let pipeline = PipelineBuilder::new()
    ///     .source(0..10u32)
    ///     .pipe(Stage::map("slow", |x: u32| {
    ///         if x == 1 {
    ///             std::thread::sleep(Duration::from_secs(1)); // a call that takes long
    ///         }
    ///         Ok::<_, std::io::Error>(x)
    ///     }))
    ///     .sink(1)
    ///     .build(BuildOptions::default())
    ///     .unwrap();
    /// assert_eq!(pipeline.iter().next().unwrap().unwrap(), 0);
    /// std::thread::sleep(Duration::from_millis(100)); // item 1 is now being processed
    /// assert!(pipeline.stop_timeout(Duration::from_millis(50)).is_err());
    /// assert!(pipeline.iter().next().is_none()); // stopped all the same
    /// assert!(pipeline.stop_timeout(Duration::from_secs(30)).is_ok()); // the call returned
    /// ```
    pub fn stop_timeout(&self, timeout: Duration) -> Result<(), StopTimeout> {
        // A deadline beyond what `Instant` can represent is no deadline.
        self.stop_within(Instant::now().checked_add(timeout)).map_err(|()| {
            self.gave_up.store(true, Relaxed);
            StopTimeout { waited: timeout }
        })
    }

    fn stop_within(&self, deadline: Option<Instant>) -> Result<(), ()> {
        if self.forked() {
            return Ok(()); // its threads are in the parent: nothing runs here to stop
        }
        self.shared.cancel();
        if std::thread::current().name().is_some_and(|n| n.starts_with("spdl-exec-")) {
            return Ok(());
        }
        {
            let mut life = self.life.lock().unwrap_or_else(PoisonError::into_inner);
            if !matches!(*life, Life::Running(_)) {
                // Never started (what `Startup` holds is dropped here), or already joined.
                *life = Life::Stopped;
                return Ok(());
            }
        }
        // Wait without the lock, so that every caller waits with its own deadline.
        if !self.shared.wait_exited(deadline) {
            return Err(());
        }
        let mut life = self.life.lock().unwrap_or_else(PoisonError::into_inner);
        if let Life::Running(handle) = std::mem::replace(&mut *life, Life::Stopped)
            && handle.join().is_err()
        {
            tracing::error!(target: "spdl_exec", "the scheduler thread panicked");
        }
        Ok(())
    }

    /// A snapshot of every stage's stats (source first, sink last). Cheap; any thread.
    pub fn stats(&self) -> PipelineStats {
        let elapsed = self.shared.started.get().map_or(Duration::ZERO, Instant::elapsed);
        stats::snapshot(&self.cells, elapsed)
    }

    /// What the auto-tuner has done so far (every change with its reason, whether it has
    /// settled); `None` unless the pipeline was built with [`crate::BuildOptions::autotune`].
    ///
    /// ```
    /// use spdl_exec::{BuildOptions, PipelineBuilder, Stage};
    ///
    /// let p = PipelineBuilder::new()
    ///     .source(0..100u32)
    ///     .pipe(Stage::map("inc", |x: u32| Ok::<_, std::io::Error>(x + 1)))
    ///     .sink(8)
    ///     .build(BuildOptions { autotune: true, ..BuildOptions::default() })
    ///     .unwrap();
    /// assert_eq!(p.iter().count(), 100);
    /// let report = p.autotune().unwrap();
    /// assert!(report.decisions.iter().all(|d| d.to >= 1));
    /// ```
    pub fn autotune(&self) -> Option<crate::autotune::AutotuneReport> {
        self.autotune.as_ref().map(|r| r.lock().unwrap_or_else(PoisonError::into_inner).clone())
    }
}

impl<T: Send + 'static> Pipeline<T> {
    /// The next item or epoch marker, waiting at most `timeout` (`None`: until one comes).
    ///
    /// `Ok(None)`: the pipeline has finished (or was stopped). `Err(Timeout)`: nothing came
    /// in time; call again. Other errors end the pipeline (a spent failure budget, a
    /// panicking source) and are returned once, after every item that made it through.
    pub fn get_item(&self, timeout: Option<Duration>) -> Result<Option<Item<T>>, PipelineError> {
        self.check_process()?;
        if self.shared.started.get().is_none() {
            self.start()?;
        }
        if self.shared.cancelled() {
            return Ok(None);
        }
        // The sink's starved time is the consumer's wait for the next item.
        let waiting = Instant::now();
        let popped = self.pop(timeout);
        self.sink_cell.add_starved(waiting);
        match popped {
            Ok(Msg::Item(item)) => {
                // The sink's row: items taken from its queue (in) and handed to the consumer (out).
                self.sink_cell.items_in.fetch_add(1, Relaxed);
                self.sink_cell.items_out.fetch_add(1, Relaxed);
                Ok(Some(Item::Data(item)))
            }
            Ok(Msg::EpochEnd(epoch)) => Ok(Some(Item::EpochEnd { epoch })),
            Err(PopError::Empty) => Err(PipelineError::Timeout { waited: timeout.unwrap_or_default() }),
            Err(PopError::Closed) => match self.shared.take_outcome() {
                Some(err) => Err(err),
                None => Ok(None),
            },
        }
    }

    /// Pops from the sink, returning early (as closed) once the pipeline is stopped, even if
    /// a stuck stage function keeps the queue open.
    fn pop(&self, timeout: Option<Duration>) -> Result<Msg<T>, PopError> {
        const CHECK_STOP: Duration = Duration::from_millis(20);
        // A timeout too large for `Instant` waits forever.
        let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
        loop {
            let slice = match deadline {
                None => CHECK_STOP,
                Some(d) => d.saturating_duration_since(Instant::now()).min(CHECK_STOP),
            };
            match self.sink.pop_blocking(Some(slice)) {
                Err(PopError::Empty) => {}
                other => return other,
            }
            if self.shared.cancelled() {
                return Err(PopError::Closed);
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Err(PopError::Empty);
            }
        }
    }

    /// Iterates over one epoch: every item of a one-pass source, or the items up to the
    /// next epoch end of a continuous source (call again for the next epoch). Starts the
    /// pipeline if needed. The last element is an `Err` if the pipeline failed.
    pub fn iter(&self) -> PipelineIter<'_, T> {
        PipelineIter { pipeline: self, ended: false }
    }
}

impl<T> Drop for Pipeline<T> {
    fn drop(&mut self) {
        if self.forked() {
            // A forked child's copy: the scheduler's handle names a thread of the parent, and locks may have
            // been held by threads that are gone. Nothing is joined or detached; the memory is left as is.
            let life = std::mem::replace(self.life.get_mut().unwrap_or_else(PoisonError::into_inner), Life::Stopped);
            std::mem::forget(life);
            return;
        }
        // After a `stop_timeout` that timed out, its caller has chosen the bound already.
        let grace = if self.gave_up.load(Relaxed) { Duration::ZERO } else { DROP_GRACE };
        if self.stop_timeout(grace).is_err() {
            // The scheduler's handle is dropped with `self`: its thread is detached and ends
            // (joining the pool) once the stuck call returns.
            tracing::warn!(
                target: "spdl_exec",
                "a stage call was still running {grace:?} after the pipeline was dropped; its threads are left to end on their own"
            );
        }
    }
}

impl<'a, T: Send + 'static> IntoIterator for &'a Pipeline<T> {
    type Item = Result<T, PipelineError>;
    type IntoIter = PipelineIter<'a, T>;

    fn into_iter(self) -> PipelineIter<'a, T> {
        self.iter()
    }
}

/// Iterator over one epoch of a [`Pipeline`]; see [`Pipeline::iter`].
#[derive(Debug)]
pub struct PipelineIter<'a, T> {
    pipeline: &'a Pipeline<T>,
    ended: bool,
}

impl<T: Send + 'static> PipelineIter<'_, T> {
    /// Like `next`, waiting at most `timeout`; on timeout returns
    /// `Some(Err(PipelineError::Timeout { .. }))` and iteration can go on.
    pub fn next_timeout(&mut self, timeout: Duration) -> Option<Result<T, PipelineError>> {
        self.advance(Some(timeout))
    }

    fn advance(&mut self, timeout: Option<Duration>) -> Option<Result<T, PipelineError>> {
        if self.ended {
            return None;
        }
        match self.pipeline.get_item(timeout) {
            Ok(Some(Item::Data(item))) => Some(Ok(item)),
            Ok(Some(Item::EpochEnd { .. }) | None) => {
                self.ended = true;
                None
            }
            Err(err) if err.is_timeout() => Some(Err(err)),
            Err(err) => {
                self.ended = true;
                Some(Err(err))
            }
        }
    }
}

impl<T: Send + 'static> Iterator for PipelineIter<'_, T> {
    type Item = Result<T, PipelineError>;

    fn next(&mut self) -> Option<Self::Item> {
        self.advance(None)
    }
}

/// The scheduler thread: starts the pool, runs every driver on a current-thread tokio
/// runtime until they finish or the pipeline is stopped, then tears everything down.
fn schedule(startup: Startup, shared: &Arc<Shared>, cells: Vec<Arc<StageCell>>) {
    let Startup { tasks, mut pool, num_threads, mut pools, report, autotune } = startup;
    if let Err(err) = pool.start(num_threads) {
        shared.fail(err);
        return;
    }
    for (p, n) in &mut pools {
        if let Err(err) = p.start(*n) {
            shared.fail(err);
            return;
        }
    }
    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(err) => {
            shared.fail(PipelineError::Runtime(err));
            return;
        }
    };
    rt.block_on(async {
        let handles: Vec<_> = tasks.into_iter().map(|(name, task)| (name, tokio::spawn(task))).collect();
        if let Some(setup) = autotune {
            tokio::spawn(crate::autotune::drive(setup, cells.clone(), Arc::clone(shared), pool.resizer()));
        }
        if let Some((every, hook)) = report {
            tokio::spawn(report_loop(every, hook, cells, Arc::clone(shared)));
        }
        let all = async {
            for (stage, handle) in handles {
                if let Err(err) = handle.await
                    && err.is_panic()
                {
                    shared.fail(PipelineError::Internal { stage, message: panic_message(&*err.into_panic()) });
                }
            }
        };
        tokio::select! {
            () = all => {}
            () = shared.wait_cancelled() => {}
        }
    });
    // Dropping the runtime drops every driver (and the items they hold); runs on the pool
    // see the cancel flag or their closed queues and return; then the pool is joined.
    drop(rt);
    pool.shutdown();
    for (p, _) in &mut pools {
        p.shutdown();
    }
    // Threads of `through` stages see the cancel flag or their closed queues and return.
    for t in shared.take_threads() {
        if t.join().is_err() {
            tracing::error!(target: "spdl_exec", "a through-stage thread panicked");
        }
    }
}

async fn report_loop(every: Duration, hook: ReportHook, cells: Vec<Arc<StageCell>>, shared: Arc<Shared>) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tick.tick().await;
        let elapsed = shared.started.get().map_or(Duration::ZERO, Instant::elapsed);
        let snapshot = stats::snapshot(&cells, elapsed);
        if catch_unwind(AssertUnwindSafe(|| hook(&snapshot))).is_err() {
            tracing::error!(target: "spdl_exec", "the stats report hook panicked");
        }
    }
}

/// The default report hook: one `tracing` info line per stage.
pub(crate) fn log_stats(stats: &PipelineStats) {
    for s in &stats.stages {
        tracing::info!(
            target: "spdl_exec",
            stage = %s.name,
            items_in = s.items_in,
            items_out = s.items_out,
            failed = s.items_failed,
            mean_us = s.task_mean.as_micros() as u64,
            p50_us = s.task_p50.as_micros() as u64,
            p99_us = s.task_p99.as_micros() as u64,
            starved_ms = s.starved.as_millis() as u64,
            blocked_ms = s.blocked.as_millis() as u64,
            queue = s.queue_len,
            busy_pct = (s.busy * 100.0).round() as u64,
            "pipeline stage stats"
        );
    }
}
