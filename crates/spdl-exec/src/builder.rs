//! The typed pipeline builder.

use std::marker::PhantomData;
use std::sync::Arc;

use futures::future::BoxFuture;
use futures::{FutureExt, Stream};

use crate::ItemSize;
use crate::aggregator::Aggregator;
use crate::context::Shared;
use crate::driver::{self, Concurrent, Link};
use crate::error::PipelineError;
use crate::options::{BuildOptions, OutputOrder};
use crate::pipeline::{Pipeline, Startup};
use crate::pool::{Pool, PoolHandle};
use crate::queue::{QueueRx, queue, resizable_queue};
use crate::runs::{self, IterSource};
use crate::stage::{Stage, StageFn};
use crate::stats::{Feed, StageCell, StageKind};

/// Builder states: they make a pipeline without a source, or one built before its sink,
/// fail to compile.
pub mod state {
    /// [`crate::PipelineBuilder::new`] gives this state; only a source can follow.
    #[derive(Debug)]
    pub struct NoSource(());
    /// A source is set; stages, `aggregate`, `disaggregate` and `sink` can follow.
    #[derive(Debug)]
    pub struct Open(());
    /// The sink is set; only `build` can follow.
    #[derive(Debug)]
    pub struct Sunk(());
}

use state::{NoSource, Open, Sunk};

/// What the builder accumulates while the pipeline is wired (at `build`).
pub(crate) struct Wiring {
    pub(crate) opts: BuildOptions,
    shared: Arc<Shared>,
    pool: PoolHandle,
    cells: Vec<Arc<StageCell>>,
    tasks: Vec<(String, BoxFuture<'static, ()>)>,
    pub(crate) error: Option<PipelineError>,
    /// Capacity of the queue most recently created (it feeds the next stage).
    pub(crate) last_capacity: usize,
    /// That queue's capacity handle, when the auto-tuner may change it.
    pub(crate) last_limit: Option<crate::queue::QueueLimit>,
    /// The items now being wired are batches (after `aggregate`, before `disaggregate`).
    pub(crate) batched: bool,
    /// Put before the names of the stages now being wired (`"merge[1]/"` inside a merge's
    /// second input, `"route[0]/"` inside a route's first branch).
    pub(crate) prefix: String,
    /// What fills the queue most recently created (the next stage's input).
    pub(crate) feed: Option<Feed>,
    /// Thread pools of regions, started and joined with the pipeline's own.
    pub(crate) pools: Vec<(Pool, usize)>,
    /// Stages now being wired run on a region's pool (not tuned: that pool is fixed).
    pub(crate) in_region: bool,
}

impl Wiring {
    pub(crate) fn invalid(&mut self, option: String, reason: String) {
        if self.error.is_none() {
            self.error = Some(PipelineError::InvalidOption { option, reason });
        }
    }

    pub(crate) fn cell(&mut self, name: String, kind: StageKind, concurrency: usize) -> Arc<StageCell> {
        self.cell_with(name, kind, concurrency, None)
    }

    pub(crate) fn cell_with(
        &mut self,
        name: String,
        kind: StageKind,
        concurrency: usize,
        budget: Option<crate::failure::FailureBudget>,
    ) -> Arc<StageCell> {
        let (input_capacity, feed) = if kind == StageKind::Source {
            (0, Feed::None)
        } else {
            (self.last_capacity, self.feed.take().unwrap_or_default())
        };
        let name = format!("{}{name}", self.prefix);
        let cell = Arc::new(StageCell::new(name, kind, concurrency, input_capacity, budget, feed));
        if kind != StageKind::Source
            && let Some(limit) = self.last_limit.take()
        {
            let _ = cell.input_limit.set(limit);
        }
        self.cells.push(Arc::clone(&cell));
        self.feed = Some(Feed::Cells(vec![Arc::clone(&cell)]));
        cell
    }

    pub(crate) fn task(&mut self, name: &str, fut: impl Future<Output = ()> + Send + 'static) {
        let name = format!("{}{name}", self.prefix);
        self.tasks.push((name, fut.boxed()));
    }

    /// The stats row created last.
    pub(crate) fn last_cell(&self) -> Arc<StageCell> {
        match self.cells.last() {
            Some(c) => Arc::clone(c),
            // Only called right after a stage is wired; a detached row keeps it total.
            None => Arc::new(StageCell::new(String::new(), StageKind::Blocking, 1, 0, None, Feed::None)),
        }
    }

    pub(crate) fn shared(&self) -> Arc<Shared> {
        Arc::clone(&self.shared)
    }

    /// Runs `f` with the stage names prefixed by `prefix` (after the current prefix).
    pub(crate) fn nested<R>(&mut self, prefix: &str, f: impl FnOnce(&mut Self) -> R) -> R {
        let saved = self.prefix.clone();
        self.prefix.push_str(prefix);
        let r = f(self);
        self.prefix = saved;
        r
    }

    /// Runs `f` with blocking work going to a pool of its own with `threads` threads.
    pub(crate) fn with_pool<R>(&mut self, threads: usize, f: impl FnOnce(&mut Self) -> R) -> R {
        let pool = Pool::new();
        let saved = std::mem::replace(&mut self.pool, pool.handle());
        self.pools.push((pool, threads));
        let was = std::mem::replace(&mut self.in_region, true);
        let r = f(self);
        self.pool = saved;
        self.in_region = was;
        r
    }

    pub(crate) fn capacity(&mut self, wanted: Option<usize>, stage: &str) -> usize {
        let default = if self.batched { self.opts.batch_queue_capacity } else { self.opts.queue_capacity };
        let cap = wanted.unwrap_or(default);
        self.last_limit = None;
        if cap == 0 {
            self.invalid(format!("{stage}: queue capacity"), "must be at least 1".into());
        }
        self.last_capacity = cap.max(1);
        self.last_capacity
    }
}

/// Wires one step: given the wiring and the capacity the sink wants for this step's output
/// (only for the last step), returns the queue this step fills.
pub(crate) type Wire<T> = Box<dyn FnOnce(&mut Wiring, Option<usize>) -> QueueRx<T> + Send + 'static>;

/// Builds a [`Pipeline`]: a source, then stages, then a sink. Each step changes the item
/// type, so a mis-wired pipeline does not compile.
///
/// ```
/// use spdl_exec::{BuildOptions, PipelineBuilder, Stage};
///
/// # fn main() -> Result<(), spdl_exec::PipelineError> {
/// let pipeline = PipelineBuilder::new()
///     .source(0..100u32)
///     .pipe(Stage::map("square", |x: u32| Ok::<_, std::io::Error>(x * x)).concurrency(4))
///     .pipe(Stage::filter_map("even", |x: u32| Ok::<_, String>((x % 2 == 0).then_some(x))))
///     .aggregate(10)
///     .sink(4)
///     .build(BuildOptions::default())?;
///
/// let mut total = 0;
/// for batch in pipeline.iter() {
///     total += batch?.len();
/// }
/// assert_eq!(total, 50);
/// println!("{}", pipeline.stats());
/// # Ok(())
/// # }
/// ```
pub struct PipelineBuilder<T, S = Open> {
    pub(crate) wire: Option<Wire<T>>,
    sink_capacity: usize,
    _state: PhantomData<fn() -> S>,
}

impl<T, S> std::fmt::Debug for PipelineBuilder<T, S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PipelineBuilder")
            .field("has_source", &self.wire.is_some())
            .field("sink_capacity", &self.sink_capacity)
            .finish()
    }
}

impl Default for PipelineBuilder<(), NoSource> {
    fn default() -> Self {
        Self::new()
    }
}

const SOURCE: &str = "source";

impl PipelineBuilder<(), NoSource> {
    /// An empty builder; give it a source next.
    pub fn new() -> Self {
        Self { wire: None, sink_capacity: 0, _state: PhantomData }
    }

    fn from_iter_source<I>(src: IterSource<I>, size: Option<ItemSize>) -> PipelineBuilder<I::Item, Open>
    where
        I: Iterator + Send + 'static,
        I::Item: Send + 'static,
    {
        PipelineBuilder::with_wire(Box::new(move |w: &mut Wiring, cap| wire_iter_source(w, cap, src, size)))
    }

    /// [`PipelineBuilder::source`] whose iterator measures its items in `size` (as a stage does with
    /// [`Stage::item_size`]), so that the queue after the source holds more of them while they are small.
    ///
    /// ```
    /// use spdl_exec::{BuildOptions, ItemSize, PipelineBuilder};
    /// let size = ItemSize::new();
    /// let probe = size.clone();
    /// let ids = (0..100u64).inspect(move |_| {
    ///     if probe.due() {
    ///         probe.record(8);
    ///     }
    /// });
    /// let pipeline = PipelineBuilder::new().source_measured(ids, size).sink(2).build(BuildOptions::default()).unwrap();
    /// assert_eq!(pipeline.iter().count(), 100);
    /// ```
    pub fn source_measured<I>(self, iterable: I, size: ItemSize) -> PipelineBuilder<I::Item, Open>
    where
        I: IntoIterator + Send + 'static,
        I::IntoIter: Send + 'static,
        I::Item: Send + 'static,
    {
        Self::from_iter_source(
            IterSource::OnePass { make: Some(Box::new(move || iterable.into_iter())), current: None },
            Some(size),
        )
    }

    /// [`PipelineBuilder::continuous_source`] whose iterators measure their items in `size` (see
    /// [`PipelineBuilder::source_measured`]).
    ///
    /// ```
    /// use spdl_exec::{BuildOptions, ItemSize, PipelineBuilder};
    /// let size = ItemSize::new();
    /// size.record(8);
    /// let pipeline =
    ///     PipelineBuilder::new().continuous_source_measured(vec![1u8, 2], size).sink(2).build(BuildOptions::default()).unwrap();
    /// assert_eq!(pipeline.iter().count(), 2); // one epoch
    /// ```
    pub fn continuous_source_measured<I>(self, iterable: I, size: ItemSize) -> PipelineBuilder<I::Item, Open>
    where
        I: IntoIterator + Clone + Send + 'static,
        I::IntoIter: Send + 'static,
        I::Item: Send + 'static,
    {
        Self::from_iter_source(
            IterSource::Continuous {
                make: Box::new(move || iterable.clone().into_iter()),
                current: None,
                epoch: 0,
                in_epoch: 0,
            },
            Some(size),
        )
    }

    /// A one-pass source from any `IntoIterator`. `into_iter()` and every `next()` run on
    /// the pipeline's thread pool, so they may block (list files, read a manifest).
    pub fn source<I>(self, iterable: I) -> PipelineBuilder<I::Item, Open>
    where
        I: IntoIterator + Send + 'static,
        I::IntoIter: Send + 'static,
        I::Item: Send + 'static,
    {
        Self::from_iter_source(
            IterSource::OnePass { make: Some(Box::new(move || iterable.into_iter())), current: None },
            None,
        )
    }

    /// A continuous source: `iterable` is cloned and iterated again for every epoch, and
    /// each epoch's end is marked, so one [`Pipeline`] serves epoch after epoch (each
    /// [`Pipeline::iter`] call yields one epoch). Runs on the thread pool like
    /// [`PipelineBuilder::source`]. An epoch that yields nothing ends the pipeline.
    pub fn continuous_source<I>(self, iterable: I) -> PipelineBuilder<I::Item, Open>
    where
        I: IntoIterator + Clone + Send + 'static,
        I::IntoIter: Send + 'static,
        I::Item: Send + 'static,
    {
        Self::from_iter_source(
            IterSource::Continuous {
                make: Box::new(move || iterable.clone().into_iter()),
                current: None,
                epoch: 0,
                in_epoch: 0,
            },
            None,
        )
    }

    /// A one-pass source from a `Stream`, polled on the scheduler's runtime (it must not
    /// block).
    pub fn source_stream<St>(self, stream: St) -> PipelineBuilder<St::Item, Open>
    where
        St: Stream + Send + 'static,
        St::Item: Send + 'static,
    {
        PipelineBuilder::with_wire(Box::new(move |w: &mut Wiring, cap| {
            let cap = w.capacity(cap, SOURCE);
            let (tx, rx) = queue(cap);
            let cell = w.cell(SOURCE.into(), StageKind::Source, 1);
            let fut = driver::stream_source(stream, tx, cell, Arc::clone(&w.shared));
            w.task(SOURCE, fut);
            rx
        }))
    }
}

impl<T: Send + 'static> PipelineBuilder<T, Open> {
    pub(crate) fn with_wire(wire: Wire<T>) -> Self {
        Self { wire: Some(wire), sink_capacity: 0, _state: PhantomData }
    }

    pub(crate) fn then<U: Send + 'static>(
        self,
        step: impl FnOnce(&mut Wiring, QueueRx<T>, Option<usize>) -> QueueRx<U> + Send + 'static,
    ) -> PipelineBuilder<U, Open> {
        let prev = self.wire;
        PipelineBuilder::with_wire(Box::new(move |w: &mut Wiring, cap| {
            let input = match prev {
                Some(prev) => prev(w, None),
                // Unreachable by construction (an `Open` builder always has a source);
                // a closed queue keeps it panic-free.
                None => queue::<T>(1).1,
            };
            step(w, input, cap)
        }))
    }

    /// Adds a stage `T → U`.
    pub fn pipe<U: Send + 'static>(self, stage: Stage<T, U>) -> PipelineBuilder<U, Open> {
        self.then(move |w, input, cap| wire_pipe(w, input, cap, stage))
    }

    /// Groups items into `Vec`s of `size`. The last batch of each epoch may be smaller.
    pub fn aggregate(self, size: usize) -> PipelineBuilder<Vec<T>, Open> {
        self.then(move |w, input, cap| wire_batch(w, input, cap, size, false))
    }

    /// Groups items into `Vec`s of exactly `size`, dropping the incomplete last batch of
    /// each epoch.
    pub fn aggregate_drop_last(self, size: usize) -> PipelineBuilder<Vec<T>, Open> {
        self.then(move |w, input, cap| wire_batch(w, input, cap, size, true))
    }

    /// Adds a custom aggregation step named `name`: an [`Aggregator`] fed every item, in
    /// order, one call at a time on the pool, and flushed at each epoch end and at the end of
    /// the input (with `drop_last`, what is left at an epoch end is discarded and nothing is
    /// flushed at the end). Its failures count against the pipeline's budget. Its output
    /// queue has the batch capacity (`BuildOptions::batch_queue_capacity`), as
    /// [`aggregate`](Self::aggregate)'s has.
    pub fn aggregate_with<A>(
        self,
        name: impl Into<String>,
        aggregator: A,
        drop_last: bool,
    ) -> PipelineBuilder<A::Output, Open>
    where
        A: Aggregator<T>,
    {
        let name = name.into();
        self.then(move |w, input, cap| wire_aggregate_with(w, input, cap, name, aggregator, drop_last))
    }

    /// Sets the capacity of the queue the consumer reads from, and ends the wiring.
    pub fn sink(self, buffer_size: usize) -> PipelineBuilder<T, Sunk> {
        PipelineBuilder { wire: self.wire, sink_capacity: buffer_size, _state: PhantomData }
    }
}

impl<C> PipelineBuilder<C, Open>
where
    C: IntoIterator + Send + 'static,
    C::IntoIter: Send,
    C::Item: Send + 'static,
{
    /// Flattens each item (a `Vec` from `aggregate`, or any `IntoIterator`) into its elements.
    pub fn disaggregate(self) -> PipelineBuilder<C::Item, Open> {
        self.then(wire_disaggregate)
    }
}

impl<T: Send + 'static> PipelineBuilder<T, Sunk> {
    /// Wires the queues, stages and stats, and returns the pipeline, not started yet
    /// (it starts with [`Pipeline::start`] or on the first item asked).
    pub fn build(self, options: BuildOptions) -> Result<Pipeline<T>, PipelineError> {
        if options.num_threads == 0 {
            return Err(PipelineError::InvalidOption {
                option: "num_threads".into(),
                reason: "must be at least 1".into(),
            });
        }
        if options.queue_capacity == 0 {
            return Err(PipelineError::InvalidOption {
                option: "queue_capacity".into(),
                reason: "must be at least 1".into(),
            });
        }
        if options.batch_queue_capacity == 0 {
            return Err(PipelineError::InvalidOption {
                option: "batch_queue_capacity".into(),
                reason: "must be at least 1".into(),
            });
        }
        if self.sink_capacity == 0 {
            return Err(PipelineError::InvalidOption {
                option: "sink buffer_size".into(),
                reason: "must be at least 1".into(),
            });
        }
        crate::failure_accounting::validate(&options.failure_budget, "failure_budget")?;
        let shared = Arc::new(Shared::new(options.failure_budget));
        let pool = Pool::new();
        let mut w = Wiring {
            opts: options.clone(),
            shared: Arc::clone(&shared),
            pool: pool.handle(),
            cells: Vec::new(),
            tasks: Vec::new(),
            error: None,
            last_capacity: 0,
            last_limit: None,
            batched: false,
            prefix: String::new(),
            feed: None,
            pools: Vec::new(),
            in_region: false,
        };
        let Some(wire) = self.wire else {
            return Err(PipelineError::InvalidOption {
                option: "source".into(),
                reason: "a pipeline needs a source".into(),
            });
        };
        let sink = wire(&mut w, Some(self.sink_capacity));
        if let Some(err) = w.error {
            return Err(err);
        }
        let sink_cell = w.cell("sink".into(), StageKind::Sink, 1);
        let _ = shared.cells.set(w.cells.clone());
        let report = options.report_interval.map(|every| {
            let hook = options.report_hook.clone().unwrap_or_else(|| Arc::new(crate::pipeline::log_stats));
            (every, hook)
        });
        let autotune = options
            .autotune
            .then(|| crate::autotune::Setup::new(&w.cells, options.num_threads, options.max_memory_bytes));
        Ok(Pipeline::new(
            sink,
            sink_cell,
            shared,
            w.cells,
            Startup { tasks: w.tasks, pool, num_threads: options.num_threads, pools: w.pools, report, autotune },
        ))
    }
}

/// Wires a stage reading `input`; returns its output queue.
pub(crate) fn wire_pipe<T: Send + 'static, U: Send + 'static>(
    w: &mut Wiring,
    input: QueueRx<T>,
    cap: Option<usize>,
    stage: Stage<T, U>,
) -> QueueRx<U> {
    let Stage { name, func, options, describe, item_size, fast } = stage;
    if options.concurrency == 0 {
        w.invalid(format!("stage `{name}`: concurrency"), "must be at least 1".into());
    }
    if let Some(budget) = &options.failure_budget
        && let Err(e) = crate::failure_accounting::validate(budget, &format!("stage `{name}`: failure_budget"))
    {
        w.error.get_or_insert(e);
    }
    let c = options.concurrency.max(1);
    let explicit_capacity = cap.or(options.output_capacity).is_some();
    let kind = match func {
        StageFn::Blocking(_) => StageKind::Blocking,
        StageFn::Async(_) => StageKind::Async,
    };
    let cell = w.cell_with(name.clone(), kind, c, options.failure_budget);
    if let Some(size) = item_size {
        let _ = cell.item_size.set(size);
    }
    let cap = w.capacity(cap.or(options.output_capacity), &format!("stage `{name}`"));
    if w.opts.autotune
        && !(w.in_region && kind == StageKind::Blocking)
        && options.tune.is_tunable(options.concurrency)
        && let Some(bounds) = crate::autotune::stage_bounds(&options, kind, cap)
    {
        if !(bounds.min..=bounds.max).contains(&c) {
            cell.set_concurrency(
                c.clamp(bounds.min, bounds.max),
                std::time::Duration::ZERO,
                "moved into its bounds".into(),
            );
        }
        let _ = cell.tune.set(bounds);
    }
    if let crate::options::Tune::Within { min, max } = options.tune
        && (min == 0 || max < min)
    {
        w.invalid(format!("stage `{name}`: tune"), format!("bounds {min}..={max} must satisfy 1 <= min <= max"));
    }
    let tuned = cell.tune.get().is_some();
    // The queue after a tuned stage grows with it unless its capacity was set explicitly; the
    // queue after a stage whose items are measured holds more of them while they are small
    // (see `ItemSize`), unless its capacity was set explicitly too: the sink's buffer (what the
    // consumer lets run ahead, as SPDL's `buffer_size` bounds it) and a stage's own capacity are
    // exact.
    let small = !tuned && !explicit_capacity && cell.item_size.get().is_some();
    let queue_max = if tuned && !explicit_capacity {
        cap.saturating_mul(crate::autotune::QUEUE_GROWTH)
    } else if small {
        cap.max(crate::item_size::SMALL_QUEUE_ITEMS)
    } else {
        cap
    };
    let (tx, rx) = resizable_queue(cap, queue_max);
    if small && let Some(size) = cell.item_size.get() {
        size.deepen_queue(tx.limit(), cap, queue_max);
    } else if queue_max > cap {
        let _ = cell.output_tune.set(crate::stats::TunedQueue { limit: tx.limit(), min: cap, max: queue_max });
        w.last_limit = Some(tx.limit());
    }
    let shared = Arc::clone(&w.shared);
    let link = Link { input, output: tx, cell: Arc::clone(&cell), shared: Arc::clone(&shared) };
    match func {
        StageFn::Async(f) => {
            let launch = driver::async_launcher(f, describe, cell);
            w.task(&name, Concurrent::new(link, launch, options.order, w.pool.clone()).run());
        }
        // Input order at a concurrency that is or may become > 1: results are re-sequenced.
        // One call at a time, with a fast path: the inputs it takes never reach the pool.
        StageFn::Blocking(f)
            if c == 1
                && !tuned
                && let Some(fast) = fast =>
        {
            w.task(&name, crate::fast::fast_path_stage(link, fast, f, describe, w.pool.clone()));
        }
        StageFn::Blocking(f) if options.order == OutputOrder::Input && (c > 1 || tuned) => {
            let launch = driver::pool_launcher(f, describe, cell, w.pool.clone(), shared);
            w.task(&name, Concurrent::new(link, launch, options.order, w.pool.clone()).run());
        }
        StageFn::Blocking(f) => {
            let fut = runs::blocking_stage(link, f, describe, w.pool.clone());
            w.task(&name, fut);
        }
    }
    rx
}

/// Wires `aggregate(size)` (or its `drop_last` form) reading `input`.
pub(crate) fn wire_batch<T: Send + 'static>(
    w: &mut Wiring,
    input: QueueRx<T>,
    cap: Option<usize>,
    size: usize,
    drop_last: bool,
) -> QueueRx<Vec<T>> {
    let name = format!("aggregate({size})");
    if size == 0 {
        w.invalid(format!("{name}: size"), "must be at least 1".into());
    }
    let cell = w.cell(name.clone(), StageKind::Aggregate, 1);
    w.batched = true;
    let cap = w.capacity(cap, &name);
    let (tx, rx) = queue(cap);
    let link = Link { input, output: tx, cell, shared: Arc::clone(&w.shared) };
    w.task(&name, driver::aggregate(link, size.max(1), drop_last));
    rx
}

/// Wires a custom aggregation step reading `input`.
pub(crate) fn wire_aggregate_with<T: Send + 'static, A: Aggregator<T>>(
    w: &mut Wiring,
    input: QueueRx<T>,
    cap: Option<usize>,
    name: String,
    aggregator: A,
    drop_last: bool,
) -> QueueRx<A::Output> {
    let cell = w.cell(name.clone(), StageKind::Aggregate, 1);
    w.batched = true;
    let cap = w.capacity(cap, &name);
    let (tx, rx) = queue(cap);
    let link = Link { input, output: tx, cell, shared: Arc::clone(&w.shared) };
    w.task(&name, driver::aggregate_with(link, aggregator, drop_last, w.pool.clone()));
    rx
}

/// Wires `disaggregate()` reading `input`.
pub(crate) fn wire_disaggregate<C>(w: &mut Wiring, input: QueueRx<C>, cap: Option<usize>) -> QueueRx<C::Item>
where
    C: IntoIterator + Send + 'static,
    C::IntoIter: Send,
    C::Item: Send + 'static,
{
    let name = "disaggregate";
    let cell = w.cell(name.into(), StageKind::Disaggregate, 1);
    w.batched = false;
    let cap = w.capacity(cap, name);
    let (tx, rx) = queue(cap);
    let link = Link { input, output: tx, cell, shared: Arc::clone(&w.shared) };
    w.task(name, driver::disaggregate(link));
    rx
}

/// Wires an iterator source; returns its output queue.
pub(crate) fn wire_iter_source<I>(
    w: &mut Wiring,
    cap: Option<usize>,
    src: IterSource<I>,
    size: Option<ItemSize>,
) -> QueueRx<I::Item>
where
    I: Iterator + Send + 'static,
    I::Item: Send + 'static,
{
    // A source right before the sink feeds the sink's buffer, whose capacity is exact (see `wire_stage`).
    let deepen = size.is_some() && cap.is_none();
    let cap = w.capacity(cap, SOURCE);
    let max = if deepen { cap.max(crate::item_size::SMALL_QUEUE_ITEMS) } else { cap };
    let (tx, rx) = resizable_queue(cap, max);
    let cell = w.cell(SOURCE.into(), StageKind::Source, 1);
    if let Some(size) = size {
        if deepen {
            size.deepen_queue(tx.limit(), cap, max);
        }
        let _ = cell.item_size.set(size);
    }
    let fut = runs::iter_source(src, tx, cell, Arc::clone(&w.shared), w.pool.clone());
    w.task(SOURCE, fut);
    rx
}
