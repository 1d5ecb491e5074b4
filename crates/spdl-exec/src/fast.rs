//! A blocking stage with a fast path ([`crate::Stage::fast_path`]), one call at a time.
//!
//! The driver takes each input on the scheduler and tries the fast path there: the inputs it
//! takes (a batch already in memory, to be split) are pushed like a native `disaggregate`'s,
//! with no pool job and no thread of the pool held, so a stage that mostly splits batches does
//! not compete with the stages around it for the pool's threads. Any other input goes to the
//! stage's function in one pool job, which then pushes the call's outputs, and advances a lazy
//! call's iterator, while the output has room (waiting for it briefly, as a run of a plain
//! blocking stage does); if the output stays full, the job hands the message it holds back,
//! the driver waits for room without a thread, and a new job goes on with the iterator. So at
//! most one output waits outside the queues, and inputs are handled strictly in order.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;

use spdl_report::error_chain;

use crate::context::Done;
use crate::driver::{Link, call_blocking, emit, panicked};
use crate::pool::PoolHandle;
use crate::queue::{Msg, SLOW_ITEM};
use crate::runs::{Pushed, push_held};
use crate::stage::{BlockingFn, Describe, FastFn, LazyIter, Rest};

/// Why a pool job of the stage ended.
enum JobExit<U> {
    /// The call and all its outputs are done (or it failed, which is booked).
    Done,
    /// The output stayed full: these messages go out first, in order, then the lazy call's
    /// iterator, if any, goes on in a new job.
    Full(Vec<Msg<U>>, Option<Cont<U>>),
    Closed,
    Stopped,
}

/// The unfinished iterator of a lazy call, carried from job to job while the output is full.
struct Cont<U> {
    iter: LazyIter<U>,
    index: u64,
    item: Option<String>,
}

/// What the driver and its pool jobs share.
struct Ctx<T, U> {
    link: Link<T, U>,
    func: BlockingFn<T, U>,
    pool: PoolHandle,
}

type Job<T, U> = Box<dyn FnOnce(&Ctx<T, U>) -> JobExit<U> + Send + 'static>;

impl<T: Send + 'static, U: Send + 'static> Ctx<T, U> {
    fn push(&self, msg: Msg<U>) -> Pushed<U> {
        let Link { output, cell, shared, .. } = &self.link;
        let pushed = push_held(output, cell, shared, &self.pool, msg);
        if matches!(pushed, Pushed::Done) {
            cell.items_out.fetch_add(1, Relaxed);
        }
        pushed
    }

    /// Calls the stage's function on the pool thread, then pushes its outputs.
    fn call(&self, item: T, index: u64, described: Option<String>) -> JobExit<U> {
        let Link { output, cell, shared, .. } = &self.link;
        if shared.cancelled() {
            return JobExit::Stopped;
        }
        let kept = described.clone();
        let done = call_blocking(&self.func, item, index, described);
        let slow = done.elapsed >= SLOW_ITEM;
        let Some(outputs) = shared.settle(cell, done) else {
            return JobExit::Done;
        };
        let (mut outputs, rest) = outputs.split();
        let cont = match rest {
            Some(Rest::Iter(iter)) => Some(Cont { iter, index, item: kept }),
            Some(Rest::Stream(_)) => {
                // Not made by blocking constructors; kept total rather than unreachable.
                shared.fail_late(cell, index, kept, "a blocking stage returned a stream".to_owned());
                None
            }
            None => None,
        };
        while let Some(out) = outputs.next() {
            match self.push(Msg::Item(out)) {
                Pushed::Done => {}
                Pushed::Full(m) => {
                    let mut rest = vec![m];
                    rest.extend(outputs.map(Msg::Item));
                    return JobExit::Full(rest, cont);
                }
                Pushed::Closed => return JobExit::Closed,
            }
        }
        if slow {
            output.flush();
        }
        match cont {
            Some(cont) => self.drain(cont),
            None => JobExit::Done,
        }
    }

    /// Advances a lazy call's iterator while the output has room.
    fn drain(&self, mut cont: Cont<U>) -> JobExit<U> {
        let Link { output, cell, shared, .. } = &self.link;
        loop {
            if shared.cancelled() {
                return JobExit::Stopped;
            }
            let t0 = Instant::now();
            let next = catch_unwind(AssertUnwindSafe(|| cont.iter.next()));
            let slow = t0.elapsed() >= SLOW_ITEM;
            let out = match next {
                Ok(None) => return JobExit::Done,
                Ok(Some(Ok(out))) => out,
                Ok(Some(Err(e))) => {
                    shared.fail_late(cell, cont.index, cont.item, error_chain(&*e));
                    return JobExit::Done;
                }
                Err(p) => {
                    shared.fail_late(cell, cont.index, cont.item, panicked(&*p));
                    return JobExit::Done;
                }
            };
            match self.push(Msg::Item(out)) {
                Pushed::Done => {}
                Pushed::Full(m) => return JobExit::Full(vec![m], Some(cont)),
                Pushed::Closed => return JobExit::Closed,
            }
            if slow {
                // Outputs that take time to make go downstream at once, not in batches.
                output.flush();
            }
        }
    }
}

/// Runs a blocking stage at concurrency 1 whose inputs go through `fast` first.
pub(crate) async fn fast_path_stage<T: Send + 'static, U: Send + 'static>(
    link: Link<T, U>,
    fast: FastFn<T, U>,
    func: BlockingFn<T, U>,
    describe: Option<Describe<T>>,
    pool: PoolHandle,
) {
    let ctx = Arc::new(Ctx { link, func, pool });
    let Link { output, cell, shared, .. } = &ctx.link;
    loop {
        if shared.cancelled() || cell.feeding_stopped() {
            return;
        }
        let item = match ctx.link.next_input().await {
            None => return,
            Some(Msg::EpochEnd(e)) => {
                if !emit(output, cell, Msg::EpochEnd(e)).await {
                    return;
                }
                continue;
            }
            Some(Msg::Item(item)) => item,
        };
        let index = cell.items_in.fetch_add(1, Relaxed);
        let described = describe.as_ref().map(|d| d(&item));
        let t0 = Instant::now();
        let result = match catch_unwind(AssertUnwindSafe(|| fast(item))) {
            Ok(Ok(outputs)) => Ok(outputs),
            Err(p) => Err(panicked(&*p)),
            Ok(Err(item)) => {
                if on_pool(&ctx, item, index, described).await {
                    continue;
                }
                return;
            }
        };
        let done = Done { index, item: described, elapsed: t0.elapsed(), result, parts: None };
        for out in shared.settle(cell, done).into_iter().flatten() {
            if !emit(output, cell, Msg::Item(out)).await {
                return;
            }
        }
    }
}

/// The stage's function on the pool, then its lazy outputs, job after job while the output fills.
/// `false`: the stage must end (output closed, or the pipeline stopping).
async fn on_pool<T: Send + 'static, U: Send + 'static>(
    ctx: &Arc<Ctx<T, U>>,
    item: T,
    index: u64,
    described: Option<String>,
) -> bool {
    let Link { output, cell, shared, .. } = &ctx.link;
    let mut job: Job<T, U> = Box::new(move |ctx: &Ctx<T, U>| ctx.call(item, index, described));
    loop {
        output.flush();
        let (tx, rx) = futures::channel::oneshot::channel();
        let c = Arc::clone(ctx);
        ctx.pool.spawn(move || {
            let exit = job(&c);
            c.link.output.flush();
            let _ = tx.send(exit);
        });
        // An error: the pool dropped the job without running it (the pipeline is stopping).
        let Ok(exit) = rx.await else { return false };
        match exit {
            JobExit::Done => return true,
            JobExit::Closed | JobExit::Stopped => return false,
            JobExit::Full(msgs, cont) => {
                for m in msgs {
                    if !emit(output, cell, m).await {
                        return false;
                    }
                }
                let Some(cont) = cont else { return true };
                if shared.cancelled() {
                    return false;
                }
                job = Box::new(move |ctx: &Ctx<T, U>| ctx.drain(cont));
            }
        }
    }
}
