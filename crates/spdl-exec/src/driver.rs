//! Async drivers run by the scheduler: concurrent stages (async functions, and blocking
//! functions that must keep input order at concurrency > 1), aggregate, disaggregate and
//! stream sources. Each driver owns the input end of its queue and the output end of the
//! next; when it returns, dropping them closes the queue for the stage downstream (and, if
//! it stopped early, for the stage upstream, which then stops too).

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::pin::pin;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::Poll;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use futures::stream::{FuturesOrdered, FuturesUnordered};
use futures::{FutureExt, Stream, StreamExt};
use spdl_report::{error_chain, panic_message};

use crate::aggregator::Aggregator;
use crate::context::{Done, Shared};
use crate::error::PipelineError;
use crate::options::OutputOrder;
use crate::pool::PoolHandle;
use crate::queue::{Msg, PopError, PushError, QueueRx, QueueTx};
use crate::stage::{AsyncFn, BlockingFn, Describe, Outputs, Rest};
use crate::stats::StageCell;

/// The two queues around a stage, its stats and the pipeline's shared state.
pub(crate) struct Link<T, U> {
    pub(crate) input: QueueRx<T>,
    pub(crate) output: QueueTx<U>,
    pub(crate) cell: Arc<StageCell>,
    pub(crate) shared: Arc<Shared>,
}

impl<T, U> Link<T, U> {
    /// The next input message, counting the wait as starved time. `None`: input closed.
    pub(crate) async fn next_input(&self) -> Option<Msg<T>> {
        match self.input.try_pop() {
            Ok(m) => Some(m),
            Err(PopError::Closed) => None,
            Err(PopError::Empty) => {
                self.output.flush();
                let t0 = Instant::now();
                let m = self.input.pop().await;
                self.cell.add_starved(t0);
                m
            }
        }
    }

    async fn emit(&self, msg: Msg<U>) -> bool {
        emit(&self.output, &self.cell, msg).await
    }
}

/// Puts `msg` into `output`, counting the wait as blocked time. `false`: the queue is closed.
pub(crate) async fn emit<U>(output: &QueueTx<U>, cell: &StageCell, msg: Msg<U>) -> bool {
    let is_item = matches!(msg, Msg::Item(_));
    let sent = match output.try_push(msg) {
        Ok(()) => true,
        Err(PushError::Closed(_)) => false,
        Err(PushError::Full(m)) => {
            let t0 = Instant::now();
            let sent = output.push(m).await.is_ok();
            cell.add_blocked(t0);
            sent
        }
    };
    if sent && is_item {
        cell.items_out.fetch_add(1, Relaxed);
    } else if sent {
        // An epoch marker: the consumer may be waiting for exactly this.
        output.flush();
    }
    sent
}

pub(crate) use spdl_report::panicked;

/// Calls a blocking function on the current thread, catching a panic.
pub(crate) fn call_blocking<T, U>(
    f: &BlockingFn<T, U>,
    item: T,
    index: u64,
    described: Option<String>,
) -> Done<Outputs<U>> {
    let t0 = Instant::now();
    let (result, parts) = match catch_unwind(AssertUnwindSafe(|| f(item))) {
        Ok(Ok(out)) => {
            let (out, parts) = out.take_parts();
            (Ok(out), parts)
        }
        Ok(Err(e)) => (Err(error_chain(&*e)), None),
        Err(p) => (Err(panicked(&*p)), None),
    };
    Done { index, item: described, elapsed: t0.elapsed(), result, parts }
}

/// Starts one call and gives a future of its outcome.
pub(crate) type Launch<T, U> = Box<dyn Fn(T) -> BoxFuture<'static, Step<U>> + Send + Sync + 'static>;

/// What a future in flight in a [`Concurrent`] stage yields.
pub(crate) enum Step<U> {
    /// A call finished.
    Call(Done<Outputs<U>>),
    /// The next output of a lazy call ([`crate::Stage::flat_map_lazy`], `flat_map_stream`).
    Next {
        /// The call's input index and description, for a failure.
        index: u64,
        item: Option<String>,
        /// The output; `None`: the call's outputs have ended.
        next: Option<Result<U, String>>,
        /// What makes the following outputs (`None` once they ended or the pipeline stops).
        rest: Option<Rest<U>>,
        /// How long the output took to make.
        took: Duration,
    },
}

/// A future of the next output of a lazy call: a stream is polled here, an iterator is
/// advanced by one job on the pool.
fn advance<U: Send + 'static>(
    rest: Rest<U>,
    index: u64,
    item: Option<String>,
    pool: &PoolHandle,
) -> BoxFuture<'static, Step<U>> {
    fn outcome<U>(r: std::thread::Result<Option<Result<U, crate::failure::BoxError>>>) -> Option<Result<U, String>> {
        match r {
            Ok(None) => None,
            Ok(Some(Ok(out))) => Some(Ok(out)),
            Ok(Some(Err(e))) => Some(Err(error_chain(&*e))),
            Err(p) => Some(Err(panicked(&*p))),
        }
    }
    match rest {
        Rest::Stream(mut stream) => async move {
            let t0 = Instant::now();
            let next = outcome(AssertUnwindSafe(stream.next()).catch_unwind().await);
            Step::Next { index, item, next, rest: Some(Rest::Stream(stream)), took: t0.elapsed() }
        }
        .boxed(),
        Rest::Iter(mut iter) => {
            let (tx, rx) = futures::channel::oneshot::channel();
            pool.spawn(move || {
                let t0 = Instant::now();
                let next = outcome(catch_unwind(AssertUnwindSafe(|| iter.next())));
                let _ = tx.send((iter, next, t0.elapsed()));
            });
            async move {
                match rx.await {
                    Ok((iter, next, took)) => Step::Next { index, item, next, rest: Some(Rest::Iter(iter)), took },
                    // The pool dropped the job without running it: the pipeline is stopping.
                    Err(_) => Step::Next { index, item, next: None, rest: None, took: Duration::ZERO },
                }
            }
            .boxed()
        }
    }
}

/// Calls of an async function, polled by the driver on the scheduler's runtime.
pub(crate) fn async_launcher<T: Send + 'static, U: Send + 'static>(
    f: AsyncFn<T, U>,
    describe: Option<Describe<T>>,
    cell: Arc<StageCell>,
) -> Launch<T, U> {
    Box::new(move |item| {
        let index = cell.items_in.fetch_add(1, Relaxed);
        let described = describe.as_ref().map(|d| d(&item));
        let t0 = Instant::now();
        let started = catch_unwind(AssertUnwindSafe(|| f(item)));
        async move {
            let (result, parts) = match started {
                Ok(fut) => match AssertUnwindSafe(fut).catch_unwind().await {
                    Ok(Ok(out)) => {
                        let (out, parts) = out.take_parts();
                        (Ok(out), parts)
                    }
                    Ok(Err(e)) => (Err(error_chain(&*e)), None),
                    Err(p) => (Err(panicked(&*p)), None),
                },
                Err(p) => (Err(panicked(&*p)), None),
            };
            Step::Call(Done { index, item: described, elapsed: t0.elapsed(), result, parts })
        }
        .boxed()
    })
}

/// Calls of a blocking function, one pool job each (used only for input order at
/// concurrency > 1, where results must be re-sequenced).
pub(crate) fn pool_launcher<T: Send + 'static, U: Send + 'static>(
    f: BlockingFn<T, U>,
    describe: Option<Describe<T>>,
    cell: Arc<StageCell>,
    pool: PoolHandle,
    shared: Arc<Shared>,
) -> Launch<T, U> {
    Box::new(move |item| {
        let index = cell.items_in.fetch_add(1, Relaxed);
        let described = describe.as_ref().map(|d| d(&item));
        let (tx, rx) = futures::channel::oneshot::channel();
        let f = Arc::clone(&f);
        let shared = Arc::clone(&shared);
        pool.spawn(move || {
            if !shared.cancelled() {
                let _ = tx.send(call_blocking(&f, item, index, described));
            }
        });
        async move {
            Step::Call(rx.await.unwrap_or_else(|_| Done {
                index,
                item: None,
                elapsed: Duration::ZERO,
                result: Err("cancelled before it ran".to_owned()),
                parts: None,
            }))
        }
        .boxed()
    })
}

enum InFlight<D> {
    Unordered(FuturesUnordered<BoxFuture<'static, D>>),
    Ordered(FuturesOrdered<BoxFuture<'static, D>>),
}

impl<D> InFlight<D> {
    fn push(&mut self, f: BoxFuture<'static, D>) {
        match self {
            Self::Unordered(s) => s.push(f),
            Self::Ordered(s) => s.push_back(f),
        }
    }

    /// Pushes a future that must come out before every other one in input order (the
    /// next output of the call at the front).
    fn push_front(&mut self, f: BoxFuture<'static, D>) {
        match self {
            Self::Unordered(s) => s.push(f),
            Self::Ordered(s) => s.push_front(f),
        }
    }

    fn len(&self) -> usize {
        match self {
            Self::Unordered(s) => s.len(),
            Self::Ordered(s) => s.len(),
        }
    }

    async fn next(&mut self) -> Option<D> {
        match self {
            Self::Unordered(s) => s.next().await,
            Self::Ordered(s) => s.next().await,
        }
    }
}

enum Event<D, T> {
    Done(D),
    Input(Option<Msg<T>>),
}

/// A stage with up to `concurrency` calls in flight, polled by one async task.
pub(crate) struct Concurrent<T, U> {
    link: Link<T, U>,
    launch: Launch<T, U>,
    /// Calls in flight, and the next output of lazy calls (each holds a slot until its
    /// outputs end, and is polled again only once its previous output is queued).
    inflight: InFlight<Step<U>>,
    input_done: bool,
    output_closed: bool,
    /// Advances the iterators of lazy blocking calls ([`crate::Stage::flat_map_lazy`]).
    pool: PoolHandle,
}

impl<T: Send + 'static, U: Send + 'static> Concurrent<T, U> {
    pub(crate) fn new(link: Link<T, U>, launch: Launch<T, U>, order: OutputOrder, pool: PoolHandle) -> Self {
        Self {
            link,
            launch,
            inflight: match order {
                OutputOrder::Completion => InFlight::Unordered(FuturesUnordered::new()),
                OutputOrder::Input => InFlight::Ordered(FuturesOrdered::new()),
            },
            input_done: false,
            output_closed: false,
            pool,
        }
    }

    fn can_take(&self) -> bool {
        !self.input_done
            && !self.output_closed
            && self.inflight.len() < self.link.cell.concurrency()
            && !self.link.cell.feeding_stopped()
            && !self.link.shared.cancelled()
    }

    pub(crate) async fn run(mut self) {
        loop {
            // Fill free slots with what is already queued, without waiting.
            while self.can_take() {
                match self.link.input.try_pop() {
                    Ok(m) => self.on_input(m).await,
                    Err(PopError::Empty) => break,
                    Err(PopError::Closed) => self.input_done = true,
                }
            }
            let event = if self.inflight.len() == 0 {
                if !self.can_take() {
                    return;
                }
                Event::Input(self.link.next_input().await)
            } else {
                let can_take = self.can_take();
                let Self { inflight, link, .. } = &mut self;
                let mut next_done = pin!(inflight.next());
                // Poll once before waiting: trivial futures are ready at once, and the queue
                // downstream is flushed only when this driver is really about to wait.
                if let Poll::Ready(d) = futures::poll!(next_done.as_mut()) {
                    match d {
                        Some(d) => Event::Done(d),
                        None => continue,
                    }
                } else {
                    link.output.flush();
                    if can_take {
                        tokio::select! {
                            biased;
                            Some(d) = &mut next_done => Event::Done(d),
                            m = link.input.pop() => Event::Input(m),
                        }
                    } else if link.cell.tune.get().is_some() {
                        // All slots are taken; the auto-tuner may open more.
                        tokio::select! {
                            biased;
                            d = &mut next_done => match d {
                                Some(d) => Event::Done(d),
                                None => continue,
                            },
                            () = link.cell.retuned.notified() => continue,
                        }
                    } else {
                        match next_done.await {
                            Some(d) => Event::Done(d),
                            None => continue,
                        }
                    }
                }
            };
            match event {
                Event::Done(d) => self.on_step(d).await,
                Event::Input(Some(m)) => self.on_input(m).await,
                Event::Input(None) => self.input_done = true,
            }
        }
    }

    async fn on_input(&mut self, msg: Msg<T>) {
        match msg {
            Msg::Item(item) => self.inflight.push((self.launch)(item)),
            Msg::EpochEnd(epoch) => {
                // An epoch boundary is a barrier: finish this epoch's items first.
                while let Some(d) = self.inflight.next().await {
                    self.on_step(d).await;
                }
                if !self.output_closed && !self.link.emit(Msg::EpochEnd(epoch)).await {
                    self.output_closed = true;
                }
            }
        }
    }

    async fn on_step(&mut self, step: Step<U>) {
        match step {
            Step::Call(done) => {
                let (index, item) = (done.index, done.item.clone());
                let Some(outputs) = self.link.shared.settle(&self.link.cell, done) else {
                    return;
                };
                let (outputs, rest) = outputs.split();
                for out in outputs {
                    if self.output_closed || !self.link.emit(Msg::Item(out)).await {
                        self.output_closed = true;
                        return;
                    }
                }
                if let Some(rest) = rest {
                    self.inflight.push_front(advance(rest, index, item, &self.pool));
                }
            }
            Step::Next { index, item, next, rest, took } => match next {
                None => {}
                Some(Err(cause)) => self.link.shared.fail_late(&self.link.cell, index, item, cause),
                Some(Ok(out)) => {
                    if self.output_closed || !self.link.emit(Msg::Item(out)).await {
                        self.output_closed = true;
                        return;
                    }
                    if took >= crate::queue::SLOW_ITEM {
                        // Outputs that take time to make go downstream at once.
                        self.link.output.flush();
                    }
                    // Polled again only now that its previous output is queued: back-pressure.
                    if let Some(rest) = rest
                        && !self.link.shared.cancelled()
                    {
                        self.inflight.push_front(advance(rest, index, item, &self.pool));
                    }
                }
            },
        }
    }
}

/// The most slots a batch reserves before its items arrive.
const PREALLOCATED_BATCH: usize = 1024;

/// Groups items into `Vec`s of `size`; a partial batch is emitted at the end of each epoch
/// unless `drop_last`.
pub(crate) async fn aggregate<T>(link: Link<T, Vec<T>>, size: usize, drop_last: bool) {
    // Reserve no more than a typical batch up front: `size` is the caller's and may be huge.
    let reserve = size.min(PREALLOCATED_BATCH);
    let mut batch = Vec::with_capacity(reserve);
    while !link.shared.cancelled() {
        let msg = link.next_input().await;
        let (flush, marker, done) = match msg {
            Some(Msg::Item(item)) => {
                link.cell.items_in.fetch_add(1, Relaxed);
                batch.push(item);
                (batch.len() >= size, None, false)
            }
            Some(Msg::EpochEnd(e)) => (!drop_last, Some(e), false),
            None => (!drop_last, None, true),
        };
        if flush && !batch.is_empty() {
            let full = std::mem::replace(&mut batch, Vec::with_capacity(reserve));
            if !link.emit(Msg::Item(full)).await {
                return;
            }
        } else if marker.is_some() || done {
            batch.clear();
        }
        if let Some(e) = marker
            && !link.emit(Msg::EpochEnd(e)).await
        {
            return;
        }
        if done {
            return;
        }
    }
}

/// One call of an [`Aggregator`]: an item to accumulate, or a flush.
enum AggCall<T> {
    Accumulate(T),
    Flush,
}

/// Runs an [`Aggregator`], one call at a time, each call on the pool (its methods may block,
/// or wait for Python's GIL, and must not hold up the scheduler). `drop_last`: the flush at
/// an epoch end is discarded, and there is none at the end of the input.
pub(crate) async fn aggregate_with<T, A>(link: Link<T, A::Output>, agg: A, drop_last: bool, pool: PoolHandle)
where
    T: Send + 'static,
    A: Aggregator<T>,
{
    let agg = Arc::new(Mutex::new(agg));
    while !link.shared.cancelled() && !link.cell.feeding_stopped() {
        let msg = link.next_input().await;
        let (call, marker, done) = match msg {
            Some(Msg::Item(item)) => (Some(AggCall::Accumulate(item)), None, false),
            Some(Msg::EpochEnd(e)) => (Some(AggCall::Flush), Some(e), false),
            None => ((!drop_last).then_some(AggCall::Flush), None, true),
        };
        if let Some(call) = call {
            let flush = matches!(call, AggCall::Flush);
            // A flush is numbered after the items it follows.
            let index = if flush { link.cell.items_in.load(Relaxed) } else { link.cell.items_in.fetch_add(1, Relaxed) };
            let what = match (flush, marker) {
                (false, _) => None,
                (true, Some(e)) => Some(format!("flush at the end of epoch {e}")),
                (true, None) => Some("flush at the end of the input".to_owned()),
            };
            let Some(done) = agg_call(&pool, &link.shared, &agg, call, index, what).await else {
                return;
            };
            let out = link.shared.settle(&link.cell, done).flatten();
            if let Some(out) = out.filter(|_| !(flush && drop_last))
                && !link.emit(Msg::Item(out)).await
            {
                return;
            }
        }
        if let Some(e) = marker
            && !link.emit(Msg::EpochEnd(e)).await
        {
            return;
        }
        if done {
            return;
        }
    }
}

/// Runs one aggregator call on the pool; `None` when the pipeline was cancelled first.
async fn agg_call<T, A>(
    pool: &PoolHandle,
    shared: &Arc<Shared>,
    agg: &Arc<Mutex<A>>,
    call: AggCall<T>,
    index: u64,
    item: Option<String>,
) -> Option<Done<Option<A::Output>>>
where
    T: Send + 'static,
    A: Aggregator<T>,
{
    let (tx, rx) = futures::channel::oneshot::channel();
    let (agg, shared) = (Arc::clone(agg), Arc::clone(shared));
    pool.spawn(move || {
        if shared.cancelled() {
            return;
        }
        let t0 = Instant::now();
        // A panic is caught inside the lock, so the mutex is not poisoned by the user's code.
        let mut agg = agg.lock().unwrap_or_else(PoisonError::into_inner);
        let result = match catch_unwind(AssertUnwindSafe(|| match call {
            AggCall::Accumulate(item) => agg.accumulate(item),
            AggCall::Flush => agg.flush(),
        })) {
            Ok(Ok(out)) => Ok(out),
            Ok(Err(e)) => Err(error_chain(&*e)),
            Err(p) => Err(panicked(&*p)),
        };
        drop(agg);
        let _ = tx.send(Done { index, item, elapsed: t0.elapsed(), result, parts: None });
    });
    rx.await.ok()
}

/// Flattens each collection into its items.
pub(crate) async fn disaggregate<C>(link: Link<C, C::Item>)
where
    C: IntoIterator,
    C::IntoIter: Send,
{
    while !link.shared.cancelled() {
        match link.next_input().await {
            Some(Msg::Item(items)) => {
                link.cell.items_in.fetch_add(1, Relaxed);
                for item in items {
                    if !link.emit(Msg::Item(item)).await {
                        return;
                    }
                }
            }
            Some(Msg::EpochEnd(e)) => {
                if !link.emit(Msg::EpochEnd(e)).await {
                    return;
                }
            }
            None => return,
        }
    }
}

/// Pulls a stream on the scheduler's runtime into the first queue.
pub(crate) async fn stream_source<S>(stream: S, output: QueueTx<S::Item>, cell: Arc<StageCell>, shared: Arc<Shared>)
where
    S: Stream + Send,
{
    let mut stream = std::pin::pin!(stream);
    let mut produced = 0u64;
    while !shared.cancelled() {
        let t0 = Instant::now();
        let mut next = pin!(AssertUnwindSafe(stream.next()).catch_unwind());
        let polled = match futures::poll!(next.as_mut()) {
            Poll::Ready(r) => r,
            Poll::Pending => {
                output.flush();
                next.await
            }
        };
        match polled {
            Ok(Some(item)) => {
                cell.hist.record(t0.elapsed());
                cell.completed.fetch_add(1, Relaxed);
                produced += 1;
                let slow = t0.elapsed() >= crate::queue::SLOW_ITEM;
                if !emit(&output, &cell, Msg::Item(item)).await {
                    return;
                }
                if slow {
                    output.flush();
                }
            }
            Ok(None) => return,
            Err(p) => {
                shared.fail(PipelineError::SourcePanicked { produced, message: panic_message(&*p) });
                return;
            }
        }
    }
}
