//! Blocking work on the pool without a thread hand-off per item.
//!
//! A blocking stage is served by up to `concurrency` *runs*: pool jobs that pop an item,
//! call the function, push the outputs, and loop. While items flow, a run never leaves
//! its thread, so the per-item cost is a few atomic operations. A run gives its thread
//! back (and its async driver on the scheduler takes over the waiting, which costs no
//! thread) when its input stays empty or its output stays full for [`HOLD`], at once if
//! other jobs wait for a thread, and every [`YIELD_EVERY`] items if others wait. So a
//! pool smaller than the number of runs still makes progress and never deadlocks.
//!
//! The iterator source works the same way with a single run that owns the iterator.

use std::collections::VecDeque;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use spdl_report::{error_chain, panic_message};
use tokio::sync::mpsc;

use crate::context::Shared;
use crate::driver::{Link, call_blocking, emit, panicked};
use crate::error::PipelineError;
use crate::pool::PoolHandle;
use crate::queue::{Msg, PopError, PushError, QueueRx, QueueTx, SLOW_ITEM};
use crate::stage::{BlockingFn, Describe, LazyIter, Rest};
use crate::stats::StageCell;

/// One wait of a run on a queue, between checks for cancellation and waiting jobs.
const SLICE: Duration = Duration::from_micros(200);
/// The longest a run keeps its thread while its input is empty or its output full.
const HOLD: Duration = Duration::from_millis(5);
/// Items between two checks for jobs waiting for a thread.
const YIELD_EVERY: u64 = 64;

/// Why a run ended.
enum RunExit<U> {
    /// Nothing to do for now (input empty, paused at a barrier, or yielding the thread).
    Idle,
    InputClosed,
    /// Output stayed full; these messages still have to go out, in this order, and then
    /// the lazy outputs of the call, if any, are made by a new run.
    OutputFull(Vec<Msg<U>>, Option<Cont<U>>),
    OutputClosed,
    /// Popped the end of an epoch: the other runs must finish before it goes on.
    Barrier(u64),
    Stopped,
}

/// The unfinished iterator of a lazy call ([`crate::Stage::flat_map_lazy`]), carried from
/// run to run while the output is full.
pub(crate) struct Cont<U> {
    iter: LazyIter<U>,
    index: u64,
    item: Option<String>,
}

/// What the runs of one blocking stage share.
pub(crate) struct Runs<T, U> {
    input: QueueRx<T>,
    output: QueueTx<U>,
    func: BlockingFn<T, U>,
    describe: Option<Describe<T>>,
    cell: Arc<StageCell>,
    shared: Arc<Shared>,
    pool: PoolHandle,
    /// Held while popping; `true` while an epoch barrier is pending, so that no run takes
    /// an item of the next epoch before the marker has gone downstream.
    barrier: Mutex<bool>,
    exits: mpsc::UnboundedSender<RunExit<U>>,
    /// Runs that should give their thread back after their current item, because the
    /// auto-tuner lowered the stage's concurrency below the runs active.
    retire: AtomicUsize,
}

/// The outcome of [`push_held`].
pub(crate) enum Pushed<U> {
    Done,
    /// Still full when the run had to give its thread back.
    Full(Msg<U>),
    Closed,
}

/// Pushes from a pool thread: waits in slices while the output is full, and gives up after
/// [`HOLD`], as soon as other jobs wait for a thread, or on cancellation. Counts the wait
/// as blocked time.
pub(crate) fn push_held<U>(
    output: &QueueTx<U>,
    cell: &StageCell,
    shared: &Shared,
    pool: &PoolHandle,
    msg: Msg<U>,
) -> Pushed<U> {
    let mut msg = match output.try_push(msg) {
        Ok(()) => return Pushed::Done,
        Err(PushError::Closed(_)) => return Pushed::Closed,
        Err(PushError::Full(m)) => m,
    };
    let t0 = Instant::now();
    let pushed = loop {
        if shared.cancelled() || pool.pending() > 0 || t0.elapsed() >= HOLD {
            break Pushed::Full(msg);
        }
        msg = match output.push_timeout(msg, SLICE) {
            Ok(()) => break Pushed::Done,
            Err(PushError::Closed(_)) => break Pushed::Closed,
            Err(PushError::Full(m)) => m,
        };
    };
    cell.add_blocked(t0);
    pushed
}

impl<T: Send + 'static, U: Send + 'static> Runs<T, U> {
    /// The barrier's lock; when another run holds it (waiting on the input under it), this
    /// thread may block, so the pool's before-block hook runs first.
    fn lock_barrier(&self) -> std::sync::MutexGuard<'_, bool> {
        match self.barrier.try_lock() {
            Ok(guard) => guard,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => {
                crate::pool::before_block();
                self.barrier.lock().unwrap_or_else(PoisonError::into_inner)
            }
        }
    }

    fn pop(&self) -> Result<T, RunExit<U>> {
        let mut waited: Option<Instant> = None;
        loop {
            let mut barrier = self.lock_barrier();
            if *barrier {
                return Err(RunExit::Idle);
            }
            let popped = match waited {
                None => self.input.try_pop(),
                Some(_) => self.input.pop_blocking(Some(SLICE)),
            };
            match popped {
                Ok(Msg::Item(item)) => {
                    if let Some(t0) = waited {
                        self.cell.add_starved(t0);
                    }
                    return Ok(item);
                }
                Ok(Msg::EpochEnd(e)) => {
                    *barrier = true;
                    return Err(RunExit::Barrier(e));
                }
                Err(PopError::Closed) => return Err(RunExit::InputClosed),
                Err(PopError::Empty) => {}
            }
            drop(barrier);
            if waited.is_none() {
                // About to wait: let the stage downstream see what this run pushed.
                self.output.flush();
            }
            let t0 = *waited.get_or_insert_with(Instant::now);
            if self.shared.cancelled() || self.pool.pending() > 0 || t0.elapsed() >= HOLD {
                self.cell.add_starved(t0);
                return Err(RunExit::Idle);
            }
        }
    }

    /// One run: processes items until it has to give its thread back.
    fn run(&self) -> RunExit<U> {
        let exit = self.process();
        self.output.flush();
        exit
    }

    /// A run that first goes on with a lazy call's outputs, then processes items.
    fn resume(&self, cont: Cont<U>) -> RunExit<U> {
        let exit = match self.drain(cont) {
            Some(exit) => exit,
            None => self.process(),
        };
        self.output.flush();
        exit
    }

    /// Advances a lazy call's iterator while the output has room. `None`: the iterator is
    /// done (or failed, which is booked); otherwise why the run must end.
    fn drain(&self, mut cont: Cont<U>) -> Option<RunExit<U>> {
        loop {
            if self.shared.cancelled() {
                return Some(RunExit::Stopped);
            }
            let t0 = Instant::now();
            let next = catch_unwind(AssertUnwindSafe(|| cont.iter.next()));
            let slow = t0.elapsed() >= SLOW_ITEM;
            let out = match next {
                Ok(None) => return None,
                Ok(Some(Ok(out))) => out,
                Ok(Some(Err(e))) => {
                    self.shared.fail_late(&self.cell, cont.index, cont.item, error_chain(&*e));
                    return None;
                }
                Err(p) => {
                    self.shared.fail_late(&self.cell, cont.index, cont.item, panicked(&*p));
                    return None;
                }
            };
            match push_held(&self.output, &self.cell, &self.shared, &self.pool, Msg::Item(out)) {
                Pushed::Done => {
                    self.cell.items_out.fetch_add(1, Relaxed);
                }
                Pushed::Full(m) => return Some(RunExit::OutputFull(vec![m], Some(cont))),
                Pushed::Closed => return Some(RunExit::OutputClosed),
            }
            if slow {
                // Outputs that take time to make go downstream at once, not in batches.
                self.output.flush();
            }
        }
    }

    fn process(&self) -> RunExit<U> {
        let mut processed = 0u64;
        loop {
            if self.shared.cancelled() || self.cell.feeding_stopped() {
                return RunExit::Stopped;
            }
            let item = match self.pop() {
                Ok(item) => item,
                Err(exit) => return exit,
            };
            let index = self.cell.items_in.fetch_add(1, Relaxed);
            let described = self.describe.as_ref().map(|d| d(&item));
            let kept = described.clone();
            let done = call_blocking(&self.func, item, index, described);
            let slow = done.elapsed >= SLOW_ITEM;
            if let Some(outputs) = self.shared.settle(&self.cell, done) {
                let (mut outputs, rest) = outputs.split();
                let cont = match rest {
                    Some(Rest::Iter(iter)) => Some(Cont { iter, index, item: kept }),
                    Some(Rest::Stream(_)) => {
                        // Not made by blocking constructors; kept total rather than unreachable.
                        let cause = "a blocking stage returned a stream".to_owned();
                        self.shared.fail_late(&self.cell, index, kept, cause);
                        None
                    }
                    None => None,
                };
                while let Some(out) = outputs.next() {
                    let pushed = push_held(&self.output, &self.cell, &self.shared, &self.pool, Msg::Item(out));
                    match pushed {
                        Pushed::Done => {
                            self.cell.items_out.fetch_add(1, Relaxed);
                        }
                        Pushed::Full(m) => {
                            let mut rest = vec![m];
                            rest.extend(outputs.map(Msg::Item));
                            return RunExit::OutputFull(rest, cont);
                        }
                        Pushed::Closed => return RunExit::OutputClosed,
                    }
                }
                if let Some(cont) = cont
                    && let Some(exit) = self.drain(cont)
                {
                    return exit;
                }
            }
            if slow {
                self.output.flush();
            }
            processed += 1;
            if processed.is_multiple_of(YIELD_EVERY) && self.pool.pending() > 0 {
                return RunExit::Idle;
            }
            if self.retire.load(Relaxed) > 0 && self.retire.fetch_update(Relaxed, Relaxed, |n| n.checked_sub(1)).is_ok()
            {
                return RunExit::Idle;
            }
        }
    }
}

/// Starts the driver of a blocking stage whose order does not need re-sequencing
/// (completion order, or concurrency 1).
pub(crate) fn blocking_stage<T: Send + 'static, U: Send + 'static>(
    link: Link<T, U>,
    func: BlockingFn<T, U>,
    describe: Option<Describe<T>>,
    pool: PoolHandle,
) -> impl Future<Output = ()> + Send + 'static {
    let (exits, exits_rx) = mpsc::unbounded_channel();
    let Link { input, output, cell, shared } = link;
    let barrier = Mutex::new(false);
    let retire = AtomicUsize::new(0);
    let runs = Arc::new(Runs { input, output, func, describe, cell, shared, pool, barrier, exits, retire });
    drive_runs(runs, exits_rx)
}

async fn drive_runs<T: Send + 'static, U: Send + 'static>(
    runs: Arc<Runs<T, U>>,
    mut exits: mpsc::UnboundedReceiver<RunExit<U>>,
) {
    let tuned = runs.cell.tune.get().is_some();
    let mut active = 0usize;
    let mut pending: VecDeque<Msg<U>> = VecDeque::new();
    let mut conts: Vec<Cont<U>> = Vec::new();
    let mut barrier: Option<u64> = None;
    let (mut input_closed, mut output_closed) = (false, false);
    loop {
        // Outputs handed back by runs go first, in order.
        while !output_closed && let Some(m) = pending.pop_front() {
            output_closed = !emit(&runs.output, &runs.cell, m).await;
        }
        pending.clear();
        // Then the lazy calls they paused go on, each on a run of its own (still counted
        // as active, so an epoch barrier waits for them).
        let stopping = output_closed || runs.shared.cancelled();
        for cont in conts.drain(..) {
            if stopping {
                continue;
            }
            let r = Arc::clone(&runs);
            runs.pool.spawn(move || {
                let exit = r.resume(cont);
                let _ = r.exits.send(exit);
            });
            active += 1;
        }
        if let Some(epoch) = barrier
            && active == 0
        {
            output_closed = output_closed || !emit(&runs.output, &runs.cell, Msg::EpochEnd(epoch)).await;
            barrier = None;
            *runs.barrier.lock().unwrap_or_else(PoisonError::into_inner) = false;
        }
        let stopping = output_closed || runs.cell.feeding_stopped() || runs.shared.cancelled();
        if active == 0 && (input_closed || stopping) {
            return;
        }
        // The auto-tuner may change the concurrency at any time.
        let concurrency = runs.cell.concurrency();
        if tuned {
            runs.retire.store(active.saturating_sub(concurrency), Relaxed);
        }
        let can_spawn = !stopping && !input_closed && barrier.is_none() && active < concurrency;
        if can_spawn {
            let queued = runs.input.len();
            if queued > 0 {
                for _ in 0..queued.min(concurrency - active) {
                    let r = Arc::clone(&runs);
                    runs.pool.spawn(move || {
                        let exit = r.run();
                        let _ = r.exits.send(exit);
                    });
                    active += 1;
                }
                continue;
            }
            if runs.input.is_finished() {
                input_closed = true;
                continue;
            }
        }
        runs.output.flush();
        let starving = active == 0;
        let t0 = Instant::now();
        let exit = tokio::select! {
            biased;
            Some(exit) = exits.recv(), if active > 0 => Some(exit),
            () = runs.input.ready(), if can_spawn => None,
            () = runs.cell.retuned.notified(), if tuned && active > 0 => None,
            else => return,
        };
        if starving {
            runs.cell.add_starved(t0);
        }
        let Some(exit) = exit else { continue };
        active -= 1;
        match exit {
            RunExit::Idle | RunExit::Stopped => {}
            RunExit::InputClosed => input_closed = true,
            RunExit::OutputFull(msgs, cont) => {
                pending.extend(msgs);
                conts.extend(cont);
            }
            RunExit::OutputClosed => output_closed = true,
            RunExit::Barrier(e) => barrier = Some(e),
        }
    }
}

/// The state of an iterator source, moved into each source run and back.
pub(crate) enum IterSource<I: Iterator> {
    OnePass {
        make: Option<Box<dyn FnOnce() -> I + Send>>,
        current: Option<I>,
    },
    Continuous {
        make: Box<dyn FnMut() -> I + Send>,
        current: Option<I>,
        epoch: u64,
        in_epoch: u64,
    },
    /// Messages made by a function (another pipeline's items and epoch ends); `None` ends it.
    Upstream(Box<dyn FnMut() -> Option<Msg<I::Item>> + Send>),
    Done,
}

impl<I: Iterator> IterSource<I> {
    fn next_msg(&mut self) -> Option<Msg<I::Item>> {
        match self {
            Self::OnePass { make, current } => {
                if let Some(make) = make.take() {
                    *current = Some(make());
                }
                current.as_mut()?.next().map(Msg::Item)
            }
            Self::Continuous { make, current, epoch, in_epoch } => {
                let it = current.get_or_insert_with(make);
                if let Some(item) = it.next() {
                    *in_epoch += 1;
                    return Some(Msg::Item(item));
                }
                *current = None;
                if *in_epoch == 0 {
                    tracing::warn!(target: "spdl_exec", epoch = *epoch, "continuous source produced an empty epoch; ending");
                    *self = Self::Done;
                    return None;
                }
                let ended = *epoch;
                *epoch += 1;
                *in_epoch = 0;
                Some(Msg::EpochEnd(ended))
            }
            Self::Upstream(next) => next(),
            Self::Done => None,
        }
    }
}

enum SourceExit<T> {
    Full(Msg<T>),
    Yield,
    Exhausted,
    Closed,
    Panicked(String),
}

struct SourceRun<T> {
    output: QueueTx<T>,
    cell: Arc<StageCell>,
    shared: Arc<Shared>,
    pool: PoolHandle,
}

impl<T: Send + 'static> SourceRun<T> {
    fn run<I: Iterator<Item = T>>(&self, src: &mut IterSource<I>) -> SourceExit<T> {
        let exit = self.produce(src);
        self.output.flush();
        exit
    }

    fn produce<I: Iterator<Item = T>>(&self, src: &mut IterSource<I>) -> SourceExit<T> {
        let mut produced = 0u64;
        loop {
            if self.shared.cancelled() {
                return SourceExit::Closed;
            }
            let t0 = Instant::now();
            let msg = match catch_unwind(AssertUnwindSafe(|| src.next_msg())) {
                Ok(Some(m)) => m,
                Ok(None) => return SourceExit::Exhausted,
                Err(p) => {
                    *src = IterSource::Done;
                    return SourceExit::Panicked(panic_message(&*p));
                }
            };
            let is_item = matches!(msg, Msg::Item(_));
            let elapsed = t0.elapsed();
            if is_item {
                self.cell.hist.record(elapsed);
                self.cell.completed.fetch_add(1, Relaxed);
            }
            match push_held(&self.output, &self.cell, &self.shared, &self.pool, msg) {
                Pushed::Done => {}
                Pushed::Full(m) => return SourceExit::Full(m),
                Pushed::Closed => return SourceExit::Closed,
            }
            if is_item {
                self.cell.items_out.fetch_add(1, Relaxed);
            }
            if !is_item || elapsed >= SLOW_ITEM {
                self.output.flush();
            }
            produced += 1;
            if produced.is_multiple_of(YIELD_EVERY) && self.pool.pending() > 0 {
                return SourceExit::Yield;
            }
        }
    }
}

/// Drives an iterator source: its runs go to the pool; waiting for room is done here.
pub(crate) async fn iter_source<I>(
    mut src: IterSource<I>,
    output: QueueTx<I::Item>,
    cell: Arc<StageCell>,
    shared: Arc<Shared>,
    pool: PoolHandle,
) where
    I: Iterator + Send + 'static,
    I::Item: Send + 'static,
{
    let run = Arc::new(SourceRun { output, cell, shared, pool });
    loop {
        let (tx, rx) = futures::channel::oneshot::channel();
        let r = Arc::clone(&run);
        run.pool.spawn(move || {
            let exit = r.run(&mut src);
            let _ = tx.send((src, exit));
        });
        let Ok((back, exit)) = rx.await else { return };
        src = back;
        match exit {
            SourceExit::Yield => {}
            SourceExit::Full(m) => {
                if !emit(&run.output, &run.cell, m).await {
                    return;
                }
                run.output.flush();
            }
            SourceExit::Exhausted | SourceExit::Closed => return,
            SourceExit::Panicked(message) => {
                run.shared.fail(PipelineError::SourcePanicked { produced: run.cell.items_out.load(Relaxed), message });
                return;
            }
        }
    }
}
