//! The graph: merge (fan-in), route (fan-out to typed branches and rejoin), regions (stages
//! on a thread pool of their own) and sub-pipelines as sources.
//!
//! Every edge is still a bounded queue and every node a driver task, so the chain's
//! promises hold across the graph: memory stays bounded, each stage keeps its own failure
//! budget and stats row (named `merge[1]/decode`, `route[0]/resize`), and stopping cancels
//! every driver and joins every thread.

use std::collections::HashSet;
use std::pin::pin;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use futures::{FutureExt, StreamExt};
use tokio::sync::{Notify, mpsc};

use crate::builder::state::{NoSource, Open};
use crate::builder::{PipelineBuilder, Wiring, wire_batch, wire_disaggregate, wire_pipe};
use crate::context::Shared;
use crate::driver::emit;
use crate::error::PipelineError;
use crate::failure::BoxError;
use crate::options::OutputOrder;
use crate::pipeline::{Item, Pipeline};
use crate::queue::{Msg, PopError, PushError, QueueRx, QueueTx, queue};
use crate::runs::IterSource;
use crate::stage::{BlockingFn, Describe, LazyIter, Outputs, Stage, StageFn};
use crate::stats::{Feed, StageCell, StageKind};

/// How a merge picks the input it takes the next item from.
#[derive(Debug, Clone, PartialEq)]
pub enum MergePolicy {
    /// Whichever input has an item ready (completion order); inputs with items ready are
    /// served in turn, so none starves. The default, and SPDL's `Merge`.
    AsAvailable,
    /// One item from each input in turn (waiting for the input whose turn it is), as SPDL's
    /// `MergeIterator` without weights.
    RoundRobin,
    /// An input drawn at random with probability proportional to its weight, from a
    /// generator seeded with `seed` (so a run is reproducible). Inputs of weight 0 are never
    /// read (and are closed at once); an exhausted input leaves the draw and the others'
    /// weights are renormalised.
    Weighted {
        /// One non-negative, finite weight per input; their sum must be positive.
        weights: Vec<f64>,
        /// Seed of the draw.
        seed: u64,
    },
}

/// When a merge ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MergeStop {
    /// When every input is exhausted; an exhausted input is dropped (and, when weighted, the
    /// remaining weights renormalised). The default.
    AllExhausted,
    /// As soon as one input is exhausted.
    FirstExhausted,
    /// After this many items (or when every input is exhausted, if earlier).
    AfterItems(u64),
}

/// Options of [`PipelineBuilder::merge`].
///
/// ```
/// use spdl_exec::{MergeOptions, MergePolicy, MergeStop};
/// let opts = MergeOptions::new("mix")
///     .policy(MergePolicy::Weighted { weights: vec![3.0, 1.0], seed: 7 })
///     .stop(MergeStop::FirstExhausted);
/// assert_eq!(opts.name, "mix");
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct MergeOptions {
    /// The merge's name: its stats row, and the prefix of its inputs' rows (`name[i]/`).
    pub name: String,
    /// Which input goes next.
    pub policy: MergePolicy,
    /// When the merge ends.
    pub stop: MergeStop,
}

impl Default for MergeOptions {
    fn default() -> Self {
        Self::new("merge")
    }
}

impl MergeOptions {
    /// As-available, until every input is exhausted.
    pub fn new(name: impl Into<String>) -> Self {
        Self { name: name.into(), policy: MergePolicy::AsAvailable, stop: MergeStop::AllExhausted }
    }

    /// Sets the policy.
    #[must_use]
    pub fn policy(mut self, policy: MergePolicy) -> Self {
        self.policy = policy;
        self
    }

    /// Sets when the merge ends.
    #[must_use]
    pub fn stop(mut self, stop: MergeStop) -> Self {
        self.stop = stop;
        self
    }

    fn validate(&self, inputs: usize) -> Result<(), String> {
        if inputs == 0 {
            return Err("a merge needs at least one input".into());
        }
        if let MergePolicy::Weighted { weights, .. } = &self.policy {
            if weights.len() != inputs {
                return Err(format!("{} weights for {inputs} inputs; give one weight per input", weights.len()));
            }
            if weights.iter().any(|w| !w.is_finite() || *w < 0.0) {
                return Err("weights must be finite and non-negative".into());
            }
            let total: f64 = weights.iter().sum();
            if !total.is_finite() || total <= 0.0 {
                return Err("the sum of weights must be positive and finite".into());
            }
        }
        Ok(())
    }
}

/// A small, fast, seeded generator (SplitMix64) for weighted merges.
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

impl PipelineBuilder<(), NoSource> {
    /// A source that merges several inputs, each a source with its own stages (a
    /// [`PipelineBuilder`] not yet sunk), into one stream, by [`MergeOptions`]' policy.
    ///
    /// Each input keeps its own stats rows (`name[i]/source`, `name[i]/decode`, ...). With
    /// continuous inputs, an epoch ends downstream once every input has ended it: an input
    /// that ends its epoch early waits (its queue fills, its stages pause) for the others.
    ///
    /// ```
    /// use spdl_exec::{BuildOptions, MergeOptions, MergePolicy, PipelineBuilder, Stage};
    ///
    /// let images = PipelineBuilder::new().source(0..3u32);
    /// let captions = PipelineBuilder::new()
    ///     .source(10..13u32)
    ///     .pipe(Stage::map("shift", |x: u32| Ok::<_, std::io::Error>(x + 90)));
    /// let pipeline = PipelineBuilder::new()
    ///     .merge(vec![images, captions], MergeOptions::new("mix").policy(MergePolicy::RoundRobin))
    ///     .sink(4)
    ///     .build(BuildOptions::default())
    ///     .unwrap();
    /// let all: Vec<u32> = pipeline.iter().map(Result::unwrap).collect();
    /// assert_eq!(all, [0, 100, 1, 101, 2, 102]);
    /// assert!(pipeline.stats().stage("mix[1]/shift").is_some());
    /// ```
    pub fn merge<T: Send + 'static>(
        self,
        inputs: Vec<PipelineBuilder<T, Open>>,
        options: MergeOptions,
    ) -> PipelineBuilder<T, Open> {
        PipelineBuilder::with_wire(Box::new(move |w: &mut Wiring, cap| {
            if let Err(reason) = options.validate(inputs.len()) {
                w.invalid(format!("merge `{}`", options.name), reason);
            }
            let MergeOptions { name, policy, stop } = options;
            let batched = w.batched;
            let mut rxs = Vec::with_capacity(inputs.len());
            let mut feeds = Vec::with_capacity(inputs.len());
            let mut out_batched = batched;
            for (i, input) in inputs.into_iter().enumerate() {
                let rx = w.nested(&format!("{name}[{i}]/"), |w| {
                    w.batched = batched;
                    let rx = match input.wire {
                        Some(wire) => wire(w, None),
                        None => queue::<T>(1).1,
                    };
                    out_batched = w.batched;
                    rx
                });
                feeds.push(w.feed.take().unwrap_or_default());
                rxs.push(rx);
            }
            w.batched = out_batched;
            w.feed = Some(Feed::Many(feeds));
            let cell = w.cell(name.clone(), StageKind::Merge, 1);
            let cap = w.capacity(cap, &format!("merge `{name}`"));
            let (tx, rx) = queue(cap);
            w.task(&name, merge_driver(rxs, tx, cell, w.shared(), policy, stop));
            rx
        }))
    }

    /// A source that reads another, built pipeline: its items, and its epoch ends, flow on
    /// into this one. The upstream pipeline is started on the first item asked, and stopped
    /// when this one stops; an error that ends it ends this one
    /// ([`PipelineError::Upstream`]).
    ///
    /// ```
    /// use spdl_exec::{BuildOptions, PipelineBuilder, Stage};
    ///
    /// let upstream = PipelineBuilder::new().source(0..5u32).sink(2).build(BuildOptions::default()).unwrap();
    /// let pipeline = PipelineBuilder::new()
    ///     .source_pipeline(upstream)
    ///     .pipe(Stage::map("double", |x: u32| Ok::<_, std::io::Error>(x * 2)))
    ///     .sink(2)
    ///     .build(BuildOptions::default())
    ///     .unwrap();
    /// let mut all: Vec<u32> = pipeline.iter().map(Result::unwrap).collect();
    /// all.sort();
    /// assert_eq!(all, [0, 2, 4, 6, 8]);
    /// ```
    pub fn source_pipeline<T: Send + 'static>(self, upstream: Pipeline<T>) -> PipelineBuilder<T, Open> {
        PipelineBuilder::with_wire(Box::new(move |w: &mut Wiring, cap| {
            let shared = w.shared();
            let next = move || -> Option<Msg<T>> {
                loop {
                    if shared.cancelled() {
                        return None;
                    }
                    match upstream.get_item(Some(Duration::from_millis(50))) {
                        Ok(Some(Item::Data(item))) => return Some(Msg::Item(item)),
                        Ok(Some(Item::EpochEnd { epoch })) => return Some(Msg::EpochEnd(epoch)),
                        Ok(None) => return None,
                        Err(e) if e.is_timeout() => {}
                        Err(e) => {
                            shared.fail(PipelineError::Upstream(Box::new(e)));
                            return None;
                        }
                    }
                }
            };
            let src: IterSource<std::iter::Empty<T>> = IterSource::Upstream(Box::new(next));
            crate::builder::wire_iter_source(w, cap, src, None)
        }))
    }
}

/// A typed chain of steps from `T` to `U` without a source: one branch of a
/// [`PipelineBuilder::route`], or the body of a [`PipelineBuilder::region`].
///
/// ```
/// use spdl_exec::{Branch, Stage};
/// let branch: Branch<u32, String> = Branch::new()
///     .pipe(Stage::map("double", |x: u32| Ok::<_, std::io::Error>(x * 2)))
///     .pipe(Stage::map("show", |x: u32| Ok::<_, std::io::Error>(x.to_string())));
/// # let _ = branch;
/// ```
pub struct Branch<T, U> {
    plain: PlainWire<T, U>,
    /// The same steps over tagged items (for input order and batched routes); `Err` names
    /// a step that cannot keep track of its inputs' outputs.
    tagged: Result<TaggedWire<T, U>, String>,
}

type PlainWire<T, U> = Box<dyn FnOnce(&mut Wiring, QueueRx<T>, Option<usize>) -> QueueRx<U> + Send + 'static>;
type TaggedWire<T, U> = Box<dyn FnOnce(&mut Wiring, QueueRx<Tag<T>>) -> QueueRx<Tag<U>> + Send + 'static>;

impl<T, U> std::fmt::Debug for Branch<T, U> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Branch").finish_non_exhaustive()
    }
}

impl<T: Send + 'static> Default for Branch<T, T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T: Send + 'static> Branch<T, T> {
    /// An empty branch: items pass through unchanged.
    pub fn new() -> Self {
        Self { plain: Box::new(|_, rx, _| rx), tagged: Ok(Box::new(|_, rx| rx)) }
    }
}

impl<T: Send + 'static, U: Send + 'static> Branch<T, U> {
    /// Adds a stage.
    pub fn pipe<V: Send + 'static>(self, stage: Stage<U, V>) -> Branch<T, V> {
        let Self { plain, tagged } = self;
        let tagged_stage = stage.clone();
        Branch {
            plain: Box::new(move |w, rx, cap| {
                let mid = plain(w, rx, None);
                wire_pipe(w, mid, cap, stage)
            }),
            tagged: tagged.map(|t| -> TaggedWire<T, V> {
                Box::new(move |w, rx| {
                    let mid = t(w, rx);
                    wire_pipe(w, mid, None, tag_stage(tagged_stage))
                })
            }),
        }
    }

    /// Groups items into `Vec`s of `size` (see [`PipelineBuilder::aggregate`]). Not in a
    /// branch of an input-ordered or batched route (a batch mixes several inputs).
    pub fn aggregate(self, size: usize) -> Branch<T, Vec<U>> {
        self.batch(size, false)
    }

    /// Groups items into `Vec`s of exactly `size` (see
    /// [`PipelineBuilder::aggregate_drop_last`]).
    pub fn aggregate_drop_last(self, size: usize) -> Branch<T, Vec<U>> {
        self.batch(size, true)
    }

    fn batch(self, size: usize, drop_last: bool) -> Branch<T, Vec<U>> {
        let Self { plain, .. } = self;
        Branch {
            plain: Box::new(move |w, rx, cap| {
                let mid = plain(w, rx, None);
                wire_batch(w, mid, cap, size, drop_last)
            }),
            tagged: Err(format!("aggregate({size})")),
        }
    }
}

impl<T: Send + 'static, U: Send + 'static> Branch<T, U> {
    /// Adds a custom aggregation step (see [`PipelineBuilder::aggregate_with`]). Not in a
    /// branch of an input-ordered or batched route.
    pub fn aggregate_with<A>(self, name: impl Into<String>, aggregator: A, drop_last: bool) -> Branch<T, A::Output>
    where
        A: crate::Aggregator<U>,
    {
        let name = name.into();
        let Self { plain, .. } = self;
        Branch {
            tagged: Err(format!("aggregate `{name}`")),
            plain: Box::new(move |w, rx, cap| {
                let mid = plain(w, rx, None);
                crate::builder::wire_aggregate_with(w, mid, cap, name, aggregator, drop_last)
            }),
        }
    }

    /// A route nested in this branch (see [`PipelineBuilder::route_with`]). Not in a branch
    /// of an input-ordered or batched route.
    pub fn route_with<V: Send + 'static>(
        self,
        classifier: Stage<U, (usize, U)>,
        branches: Vec<Branch<U, V>>,
        order: OutputOrder,
    ) -> Branch<T, V> {
        let Self { plain, .. } = self;
        Branch {
            tagged: Err(format!("route `{}`", classifier.name)),
            plain: Box::new(move |w, rx, cap| {
                let mid = plain(w, rx, None);
                wire_route(w, mid, cap, classifier, branches, order)
            }),
        }
    }
}

impl<T: Send + 'static, U: Send + 'static> Branch<T, Vec<U>> {
    /// A batched route nested in this branch (see [`PipelineBuilder::route_batched_with`]).
    /// Not in a branch of an input-ordered or batched route.
    pub fn route_batched_with<V: Send + 'static>(
        self,
        classifier: Stage<Vec<U>, (Vec<usize>, Vec<U>)>,
        branches: Vec<Branch<Vec<U>, Vec<V>>>,
    ) -> Branch<T, Vec<V>> {
        let Self { plain, .. } = self;
        Branch {
            tagged: Err(format!("route `{}`", classifier.name)),
            plain: Box::new(move |w, rx, cap| {
                let mid = plain(w, rx, None);
                wire_route_batched(w, mid, cap, classifier, branches)
            }),
        }
    }
}

impl<T: Send + 'static, C> Branch<T, C>
where
    C: IntoIterator + Send + 'static,
    C::IntoIter: Send,
    C::Item: Send + 'static,
{
    /// Flattens each item into its elements (see [`PipelineBuilder::disaggregate`]).
    pub fn disaggregate(self) -> Branch<T, C::Item> {
        let Self { plain, tagged } = self;
        let tagged = tagged.map(|t| -> TaggedWire<T, C::Item> {
            Box::new(move |w, rx| {
                let mid = t(w, rx);
                wire_pipe(w, mid, None, tag_stage(Stage::flat_map("disaggregate", Ok::<C, std::convert::Infallible>)))
            })
        });
        Branch {
            plain: Box::new(move |w, rx, cap| {
                let mid = plain(w, rx, None);
                wire_disaggregate(w, mid, cap)
            }),
            tagged,
        }
    }
}

// ---------------------------------------------------------------------------------------
// Tagged items: how an input-ordered (or batched) route knows when an input is done.
// ---------------------------------------------------------------------------------------

/// An item inside a tagged branch: its input's sequence number, and, on the last output
/// of that input, a guard that reports the input done if the item is dropped anywhere
/// before the join (a failure, a filter, a panic).
pub(crate) struct Tag<X> {
    seq: u64,
    item: X,
    end: Option<EndGuard>,
}

/// Reports `(branch, seq)` done to the route's tracker when dropped, unless disarmed.
pub(crate) struct EndGuard {
    tracker: Option<Arc<EndedRoutes>>,
    branch: usize,
    seq: u64,
}

impl EndGuard {
    fn disarm(mut self) {
        self.tracker = None;
    }
}

impl Drop for EndGuard {
    fn drop(&mut self) {
        if let Some(t) = self.tracker.take() {
            t.end(self.branch, self.seq);
        }
    }
}

/// The inputs of a route that ended inside a branch without a last output, `(branch, seq)`, which an
/// ordered merge waits on instead of that route's output.
#[derive(Default)]
pub(crate) struct EndedRoutes {
    ended: Mutex<HashSet<(usize, u64)>>,
    notify: Notify,
}

impl EndedRoutes {
    fn end(&self, branch: usize, seq: u64) {
        self.ended.lock().unwrap_or_else(PoisonError::into_inner).insert((branch, seq));
        self.notify.notify_waiters();
    }

    fn take(&self, branch: usize, seq: u64) -> bool {
        self.ended.lock().unwrap_or_else(PoisonError::into_inner).remove(&(branch, seq))
    }
}

/// The same stage over tagged items: outputs carry their input's number, the last one its
/// guard. The stage keeps input order, so the outputs of one input come out together.
fn tag_stage<X: Send + 'static, Y: Send + 'static>(stage: Stage<X, Y>) -> Stage<Tag<X>, Tag<Y>> {
    // The fast path is not tagged: the function handles every input.
    let Stage { name, func, mut options, describe, item_size, fast: _ } = stage;
    options.order = OutputOrder::Input;
    let func = match func {
        StageFn::Blocking(f) => StageFn::Blocking(Arc::new(move |t: Tag<X>| {
            let Tag { seq, item, end } = t;
            // On an error or a panic `end` is dropped here: the input is done.
            f(item).map(|o| tag_outputs(o, seq, end))
        }) as BlockingFn<Tag<X>, Tag<Y>>),
        StageFn::Async(f) => StageFn::Async(Arc::new(move |t: Tag<X>| {
            let Tag { seq, item, end } = t;
            let fut = f(item);
            async move { fut.await.map(|o| tag_outputs(o, seq, end)) }.boxed()
        })),
    };
    let describe = describe.map(|d| -> Describe<Tag<X>> { Arc::new(move |t: &Tag<X>| d(&t.item)) });
    Stage { name, func, options, describe, item_size, fast: None }
}

fn tag_outputs<Y: Send + 'static>(o: Outputs<Y>, seq: u64, end: Option<EndGuard>) -> Outputs<Tag<Y>> {
    match o {
        Outputs::None => Outputs::None,
        Outputs::One(item) => Outputs::One(Tag { seq, item, end }),
        Outputs::Partial(item, report) => Outputs::Partial(Tag { seq, item, end }, report),
        Outputs::Many(v) => {
            let n = v.len();
            let mut end = end;
            Outputs::Many(
                v.into_iter()
                    .enumerate()
                    .map(|(i, item)| Tag { seq, item, end: if i + 1 == n { end.take() } else { None } })
                    .collect(),
            )
        }
        Outputs::Iter(it) => Outputs::Iter(Box::new(TagIter { it: it.peekable(), seq, end }) as LazyIter<Tag<Y>>),
        Outputs::Stream(s) => {
            let state = (Box::pin(s.peekable()), end);
            Outputs::Stream(
                futures::stream::unfold(state, move |(mut s, mut end)| async move {
                    let next = s.next().await?;
                    Some(match next {
                        Ok(item) => {
                            let last = s.as_mut().peek().await.is_none();
                            let e = if last { end.take() } else { None };
                            (Ok(Tag { seq, item, end: e }), (s, end))
                        }
                        Err(e) => (Err(e), (s, end)),
                    })
                })
                .boxed(),
            )
        }
    }
}

struct TagIter<Y> {
    it: std::iter::Peekable<LazyIter<Y>>,
    seq: u64,
    end: Option<EndGuard>,
}

impl<Y> Iterator for TagIter<Y> {
    type Item = Result<Tag<Y>, BoxError>;

    fn next(&mut self) -> Option<Self::Item> {
        Some(match self.it.next()? {
            Ok(item) => {
                let last = self.it.peek().is_none();
                Ok(Tag { seq: self.seq, item, end: if last { self.end.take() } else { None } })
            }
            Err(e) => Err(e),
        })
    }
}

// ---------------------------------------------------------------------------------------
// Route.
// ---------------------------------------------------------------------------------------

impl<T: Send + 'static> PipelineBuilder<T, Open> {
    /// Sends each item down one of several typed branches, chosen by `classify`, and joins
    /// the branches' outputs into one stream.
    ///
    /// `classify` runs as a blocking stage named `name` (its stats row and failure budget);
    /// an item it fails on, or sends to a branch that does not exist, is a failure of that
    /// stage. Branch stages show as `name[i]/stage`, the join as `name/join`.
    /// [`OutputOrder::Completion`] (the default, SPDL's) joins outputs as they come;
    /// [`OutputOrder::Input`] keeps input order: the outputs of one input come out together,
    /// in the order of their inputs (the branches' stages then keep input order too; an
    /// input order route's branches cannot `aggregate`). Epoch ends go to every branch and
    /// leave the join once every branch has passed them.
    ///
    /// ```
    /// use spdl_exec::{BuildOptions, Branch, OutputOrder, PipelineBuilder, Stage};
    ///
    /// let evens = Branch::new().pipe(Stage::map("half", |x: u32| Ok::<_, std::io::Error>(x / 2)));
    /// let odds = Branch::new().pipe(Stage::map("triple", |x: u32| Ok::<_, std::io::Error>(x * 3)));
    /// let pipeline = PipelineBuilder::new()
    ///     .source(0..6u32)
    ///     .route("by_parity", |x: &u32| Ok::<_, std::io::Error>((x % 2) as usize), vec![evens, odds], OutputOrder::Input)
    ///     .sink(4)
    ///     .build(BuildOptions::default())
    ///     .unwrap();
    /// let all: Vec<u32> = pipeline.iter().map(Result::unwrap).collect();
    /// assert_eq!(all, [0, 3, 1, 9, 2, 15]);
    /// ```
    pub fn route<U, F, E>(
        self,
        name: impl Into<String>,
        classify: F,
        branches: Vec<Branch<T, U>>,
        order: OutputOrder,
    ) -> PipelineBuilder<U, Open>
    where
        U: Send + 'static,
        F: Fn(&T) -> Result<usize, E> + Send + Sync + 'static,
        E: Into<BoxError>,
    {
        let classifier = Stage::map(name, move |t: T| classify(&t).map(|i| (i, t)));
        self.route_with(classifier, branches, order)
    }

    /// [`route`](Self::route) with a classifier stage of the caller's making (async, with a
    /// concurrency or a failure budget of its own): it returns the branch index with the
    /// item.
    pub fn route_with<U: Send + 'static>(
        self,
        classifier: Stage<T, (usize, T)>,
        branches: Vec<Branch<T, U>>,
        order: OutputOrder,
    ) -> PipelineBuilder<U, Open> {
        self.then(move |w, input, cap| wire_route(w, input, cap, classifier, branches, order))
    }

    /// Wraps an already built chain of steps into a *region*: its stages' blocking work
    /// runs on a thread pool of its own with `num_threads` threads, apart from the
    /// pipeline's pool. A heavy stage then cannot take the threads the rest needs. Its
    /// stages show as `name/stage`.
    ///
    /// ```
    /// use spdl_exec::{BuildOptions, Branch, PipelineBuilder, Stage};
    ///
    /// let heavy = Branch::new().pipe(Stage::map("decode", |x: u64| Ok::<_, std::io::Error>(x + 1)).concurrency(2));
    /// let pipeline = PipelineBuilder::new()
    ///     .source(0..10u64)
    ///     .region("decoding", 2, heavy)
    ///     .sink(4)
    ///     .build(BuildOptions::default())
    ///     .unwrap();
    /// assert_eq!(pipeline.iter().map(Result::unwrap).sum::<u64>(), 55);
    /// assert!(pipeline.stats().stage("decoding/decode").is_some());
    /// ```
    pub fn region<U: Send + 'static>(
        self,
        name: impl Into<String>,
        num_threads: usize,
        body: Branch<T, U>,
    ) -> PipelineBuilder<U, Open> {
        let name = name.into();
        self.then(move |w, input, cap| {
            if num_threads == 0 {
                w.invalid(format!("region `{name}`: num_threads"), "must be at least 1".into());
            }
            w.with_pool(num_threads.max(1), |w| w.nested(&format!("{name}/"), |w| (body.plain)(w, input, cap)))
        })
    }
}

impl<T: Send + 'static> PipelineBuilder<Vec<T>, Open> {
    /// Routes the elements of each batch: `classify` gives one branch index per element,
    /// the batch is split into one sub-batch per branch (in order; empty where a branch got
    /// nothing), each branch processes its sub-batch as a `Vec`, and the results are
    /// concatenated in branch order into one batch, in input order (an empty result is
    /// skipped). SPDL's `path_variants(..., batched=True)`. A branch may return a shorter
    /// `Vec`; a sub-batch that fails in a branch loses those elements only.
    ///
    /// ```
    /// use spdl_exec::{BuildOptions, Branch, PipelineBuilder, Stage};
    ///
    /// let small = Branch::new().pipe(Stage::map("inc", |v: Vec<u32>| Ok::<_, std::io::Error>(v.iter().map(|x| x + 1).collect::<Vec<_>>())));
    /// let big = Branch::new().pipe(Stage::map("neg", |v: Vec<u32>| Ok::<_, std::io::Error>(v.iter().map(|x| x * 100).collect::<Vec<_>>())));
    /// let pipeline = PipelineBuilder::new()
    ///     .source(0..6u32)
    ///     .aggregate(3)
    ///     .route_batched("split", |b: &[u32]| Ok::<_, std::io::Error>(b.iter().map(|&x| usize::from(x >= 2)).collect()), vec![small, big])
    ///     .sink(2)
    ///     .build(BuildOptions::default())
    ///     .unwrap();
    /// let all: Vec<Vec<u32>> = pipeline.iter().map(Result::unwrap).collect();
    /// assert_eq!(all, [vec![1, 2, 200], vec![300, 400, 500]]);
    /// ```
    pub fn route_batched<U, F, E>(
        self,
        name: impl Into<String>,
        classify: F,
        branches: Vec<Branch<Vec<T>, Vec<U>>>,
    ) -> PipelineBuilder<Vec<U>, Open>
    where
        U: Send + 'static,
        F: Fn(&[T]) -> Result<Vec<usize>, E> + Send + Sync + 'static,
        E: Into<BoxError>,
    {
        let classifier = Stage::map(name, move |b: Vec<T>| classify(&b).map(|i| (i, b)));
        self.route_batched_with(classifier, branches)
    }

    /// [`route_batched`](Self::route_batched) with a classifier stage of the caller's making.
    pub fn route_batched_with<U: Send + 'static>(
        self,
        classifier: Stage<Vec<T>, (Vec<usize>, Vec<T>)>,
        branches: Vec<Branch<Vec<T>, Vec<U>>>,
    ) -> PipelineBuilder<Vec<U>, Open> {
        self.then(move |w, input, cap| wire_route_batched(w, input, cap, classifier, branches))
    }
}

fn check_branches(w: &mut Wiring, name: &str, n: usize) {
    if n == 0 {
        w.invalid(format!("route `{name}`: branches"), "needs at least one branch".into());
    }
}

/// Wires the classifier and returns its output and stats row.
fn wire_classifier<T: Send + 'static, R: Send + 'static>(
    w: &mut Wiring,
    input: QueueRx<T>,
    mut classifier: Stage<T, R>,
    ordered: bool,
) -> (QueueRx<R>, Arc<StageCell>) {
    if ordered {
        classifier.options.order = OutputOrder::Input;
    }
    let routed = wire_pipe(w, input, None, classifier);
    let cell = w.last_cell();
    (routed, cell)
}

fn wire_route<T: Send + 'static, U: Send + 'static>(
    w: &mut Wiring,
    input: QueueRx<T>,
    cap: Option<usize>,
    classifier: Stage<T, (usize, T)>,
    branches: Vec<Branch<T, U>>,
    order: OutputOrder,
) -> QueueRx<U> {
    let name = classifier.name.clone();
    check_branches(w, &name, branches.len());
    let ordered = order == OutputOrder::Input;
    let (routed, cls) = wire_classifier(w, input, classifier, ordered);
    let batched = w.batched;
    let shared = w.shared();
    let mut feeds = Vec::with_capacity(branches.len());
    let join = if ordered {
        let tracker = Arc::new(EndedRoutes::default());
        let (order_tx, order_rx) = mpsc::unbounded_channel();
        let mut txs = Vec::new();
        let mut rxs = Vec::new();
        for (i, branch) in branches.into_iter().enumerate() {
            let (tx, rx, counter) = branch_queue::<Tag<T>>(w, &name);
            w.feed = Some(Feed::Counter(counter.clone()));
            let out = w.nested(&format!("{name}[{i}]/"), |w| {
                w.batched = batched;
                match branch.tagged {
                    Ok(wire) => wire(w, rx),
                    Err(step) => {
                        w.invalid(
                            format!("route `{name}`: branch {i}"),
                            format!("{step} cannot be in a branch of an input-ordered route"),
                        );
                        queue::<Tag<U>>(1).1
                    }
                }
            });
            feeds.push(w.feed.take().unwrap_or_default());
            txs.push((tx, counter));
            rxs.push(out);
        }
        w.task(
            &format!("{name}/dispatch"),
            dispatch_tagged(routed, txs, order_tx, Arc::clone(&tracker), cls, Arc::clone(&shared)),
        );
        Join::Ordered { rxs, order: order_rx, tracker }
    } else {
        let mut txs = Vec::new();
        let mut rxs = Vec::new();
        for (i, branch) in branches.into_iter().enumerate() {
            let (tx, rx, counter) = branch_queue::<T>(w, &name);
            w.feed = Some(Feed::Counter(counter.clone()));
            let out = w.nested(&format!("{name}[{i}]/"), |w| {
                w.batched = batched;
                (branch.plain)(w, rx, None)
            });
            feeds.push(w.feed.take().unwrap_or_default());
            txs.push((tx, counter));
            rxs.push(out);
        }
        w.task(&format!("{name}/dispatch"), dispatch_plain(routed, txs, cls, Arc::clone(&shared)));
        Join::Completion(rxs)
    };
    w.feed = Some(Feed::Many(feeds));
    let cell = w.cell(format!("{name}/join"), StageKind::Merge, 1);
    let cap = w.capacity(cap, &format!("route `{name}`"));
    let (tx, rx) = queue(cap);
    match join {
        Join::Completion(rxs) => {
            w.task(
                &format!("{name}/join"),
                merge_driver(rxs, tx, cell, shared, MergePolicy::AsAvailable, MergeStop::AllExhausted),
            );
        }
        Join::Ordered { rxs, order, tracker } => {
            w.task(&format!("{name}/join"), join_ordered(rxs, order, tracker, tx, cell, shared));
        }
    }
    rx
}

enum Join<U> {
    Completion(Vec<QueueRx<U>>),
    Ordered { rxs: Vec<QueueRx<Tag<U>>>, order: mpsc::UnboundedReceiver<Order>, tracker: Arc<EndedRoutes> },
}

fn wire_route_batched<T: Send + 'static, U: Send + 'static>(
    w: &mut Wiring,
    input: QueueRx<Vec<T>>,
    cap: Option<usize>,
    classifier: Stage<Vec<T>, (Vec<usize>, Vec<T>)>,
    branches: Vec<Branch<Vec<T>, Vec<U>>>,
) -> QueueRx<Vec<U>> {
    let name = classifier.name.clone();
    check_branches(w, &name, branches.len());
    let (routed, cls) = wire_classifier(w, input, classifier, true);
    let batched = w.batched;
    let shared = w.shared();
    let tracker = Arc::new(EndedRoutes::default());
    let (order_tx, order_rx) = mpsc::unbounded_channel();
    let mut feeds = Vec::with_capacity(branches.len());
    let mut txs = Vec::new();
    let mut rxs = Vec::new();
    for (i, branch) in branches.into_iter().enumerate() {
        let (tx, rx, counter) = branch_queue::<Tag<Vec<T>>>(w, &name);
        w.feed = Some(Feed::Counter(counter.clone()));
        let out = w.nested(&format!("{name}[{i}]/"), |w| {
            w.batched = batched;
            match branch.tagged {
                Ok(wire) => wire(w, rx),
                Err(step) => {
                    w.invalid(
                        format!("route `{name}`: branch {i}"),
                        format!("{step} cannot be in a branch of a batched route"),
                    );
                    queue::<Tag<Vec<U>>>(1).1
                }
            }
        });
        feeds.push(w.feed.take().unwrap_or_default());
        txs.push((tx, counter));
        rxs.push(out);
    }
    w.task(
        &format!("{name}/dispatch"),
        dispatch_batched(routed, txs, order_tx, Arc::clone(&tracker), cls, Arc::clone(&shared)),
    );
    w.feed = Some(Feed::Many(feeds));
    let cell = w.cell(format!("{name}/join"), StageKind::Merge, 1);
    let cap = w.capacity(cap, &format!("route `{name}`"));
    let (tx, rx) = queue(cap);
    w.task(&format!("{name}/join"), join_batched(rxs, order_rx, tracker, tx, cell, shared));
    rx
}

/// The queue in front of a branch, and the counter of what the router put in it.
type Port<X> = (QueueTx<X>, Arc<AtomicU64>);

/// Makes a [`Port`] and the branch's end of it.
fn branch_queue<X>(w: &mut Wiring, name: &str) -> (QueueTx<X>, QueueRx<X>, Arc<AtomicU64>) {
    let cap = w.capacity(None, &format!("route `{name}`"));
    let (tx, rx) = queue(cap);
    (tx, rx, Arc::new(AtomicU64::new(0)))
}

/// Puts `msg` into a branch queue, waiting for room. `false`: the branch is gone.
async fn send<X>(tx: &QueueTx<X>, msg: Msg<X>) -> bool {
    match tx.try_push(msg) {
        Ok(()) => true,
        Err(PushError::Closed(_)) => false,
        Err(PushError::Full(m)) => {
            tx.flush();
            tx.push(m).await.is_ok()
        }
    }
}

/// Pops the router's next message, flushing the branch queues before waiting.
async fn next_routed<R, X>(input: &QueueRx<R>, txs: &[Port<X>]) -> Option<Msg<R>> {
    match input.try_pop() {
        Ok(m) => Some(m),
        Err(PopError::Closed) => None,
        Err(PopError::Empty) => {
            for (tx, _) in txs {
                tx.flush();
            }
            input.pop().await
        }
    }
}

fn out_of_range(i: usize, n: usize) -> String {
    format!("the classifier chose branch {i}, but there are only {n} branches (valid range: [0, {n}))")
}

async fn broadcast_epoch<X>(txs: &[Port<X>], e: u64) -> bool {
    for (tx, _) in txs {
        if !send(tx, Msg::EpochEnd(e)).await {
            return false;
        }
        tx.flush();
    }
    true
}

async fn dispatch_plain<T>(input: QueueRx<(usize, T)>, txs: Vec<Port<T>>, cls: Arc<StageCell>, shared: Arc<Shared>) {
    let n = txs.len();
    let mut index = 0u64;
    while let Some(msg) = next_routed(&input, &txs).await {
        if shared.cancelled() {
            return;
        }
        match msg {
            Msg::Item((i, item)) => {
                index += 1;
                let Some((tx, counter)) = txs.get(i) else {
                    shared.fail_late(&cls, index - 1, None, out_of_range(i, n));
                    continue;
                };
                if !send(tx, Msg::Item(item)).await {
                    return;
                }
                counter.fetch_add(1, Relaxed);
            }
            Msg::EpochEnd(e) => {
                if !broadcast_epoch(&txs, e).await {
                    return;
                }
            }
        }
    }
}

/// What the ordered join processes next, in input order.
pub(crate) enum Order {
    /// The outputs of input `seq`, from `branch`.
    Item { seq: u64, branch: usize },
    /// The parts of batch `seq`, from every branch.
    Batch { seq: u64 },
    /// The end of an epoch.
    Epoch(u64),
}

async fn dispatch_tagged<T>(
    input: QueueRx<(usize, T)>,
    txs: Vec<Port<Tag<T>>>,
    order: mpsc::UnboundedSender<Order>,
    tracker: Arc<EndedRoutes>,
    cls: Arc<StageCell>,
    shared: Arc<Shared>,
) {
    let n = txs.len();
    let mut seq = 0u64;
    while let Some(msg) = next_routed(&input, &txs).await {
        if shared.cancelled() {
            return;
        }
        match msg {
            Msg::Item((i, item)) => {
                seq += 1;
                let Some((tx, counter)) = txs.get(i) else {
                    shared.fail_late(&cls, seq - 1, None, out_of_range(i, n));
                    continue;
                };
                if order.send(Order::Item { seq, branch: i }).is_err() {
                    return;
                }
                let end = Some(EndGuard { tracker: Some(Arc::clone(&tracker)), branch: i, seq });
                if !send(tx, Msg::Item(Tag { seq, item, end })).await {
                    return;
                }
                counter.fetch_add(1, Relaxed);
            }
            Msg::EpochEnd(e) => {
                if order.send(Order::Epoch(e)).is_err() || !broadcast_epoch(&txs, e).await {
                    return;
                }
            }
        }
    }
}

async fn dispatch_batched<T>(
    input: QueueRx<(Vec<usize>, Vec<T>)>,
    txs: Vec<Port<Tag<Vec<T>>>>,
    order: mpsc::UnboundedSender<Order>,
    tracker: Arc<EndedRoutes>,
    cls: Arc<StageCell>,
    shared: Arc<Shared>,
) {
    let n = txs.len();
    let mut seq = 0u64;
    while let Some(msg) = next_routed(&input, &txs).await {
        if shared.cancelled() {
            return;
        }
        match msg {
            Msg::Item((indices, batch)) => {
                seq += 1;
                if indices.len() != batch.len() {
                    let cause = format!(
                        "the classifier returned {} indices for a batch of {} items; it must return one per item",
                        indices.len(),
                        batch.len()
                    );
                    shared.fail_late(&cls, seq - 1, None, cause);
                    continue;
                }
                if let Some(&bad) = indices.iter().find(|&&i| i >= n) {
                    shared.fail_late(&cls, seq - 1, None, out_of_range(bad, n));
                    continue;
                }
                let mut parts: Vec<Vec<T>> = (0..n).map(|_| Vec::new()).collect();
                for (i, item) in indices.into_iter().zip(batch) {
                    parts[i].push(item);
                }
                if order.send(Order::Batch { seq }).is_err() {
                    return;
                }
                for (b, ((tx, counter), part)) in txs.iter().zip(parts).enumerate() {
                    let end = Some(EndGuard { tracker: Some(Arc::clone(&tracker)), branch: b, seq });
                    if !send(tx, Msg::Item(Tag { seq, item: part, end })).await {
                        return;
                    }
                    counter.fetch_add(1, Relaxed);
                }
            }
            Msg::EpochEnd(e) => {
                if order.send(Order::Epoch(e)).is_err() || !broadcast_epoch(&txs, e).await {
                    return;
                }
            }
        }
    }
}

/// One output of input `seq` from a branch, or why there is none.
enum Piece<U> {
    /// An output; `true` if it is the input's last.
    Part(U, bool),
    /// The input ended in the branch without (more) outputs, or the branch is gone.
    Done,
}

/// The output end of a tagged branch, as the ordered join reads it.
struct BranchOut<U> {
    rx: QueueRx<Tag<U>>,
    /// An output of a later input, popped while looking for an earlier one.
    held: Option<Tag<U>>,
    /// The branch's epoch end, popped: nothing more of this epoch comes from it.
    epoch: Option<u64>,
}

impl<U> BranchOut<U> {
    fn new(rx: QueueRx<Tag<U>>) -> Self {
        Self { rx, held: None, epoch: None }
    }

    /// The next message without waiting: the held output first, then the queue's.
    fn try_next(&mut self) -> Result<Tag<U>, PopError> {
        if let Some(t) = self.held.take() {
            return Ok(t);
        }
        if self.epoch.is_some() {
            return Err(PopError::Empty);
        }
        match self.rx.try_pop() {
            Ok(Msg::Item(tag)) => Ok(tag),
            Ok(Msg::EpochEnd(e)) => {
                self.epoch = Some(e);
                Err(PopError::Empty)
            }
            Err(e) => Err(e),
        }
    }
}

/// The next output of input `seq` from branch `b`. Outputs of one input come out of a tagged
/// branch together and in input order, so it is the branch's next output, unless that
/// belongs to a later input (then `seq` ended without more outputs: it is held for later)
/// or the tracker says `seq` ended (failed, filtered).
async fn next_piece<U>(
    out: &mut BranchOut<U>,
    b: usize,
    seq: u64,
    tracker: &EndedRoutes,
    downstream: &QueueTx<impl Sized>,
    cell: &StageCell,
) -> Piece<U> {
    let mut waited: Option<Instant> = None;
    let piece = loop {
        match out.try_next() {
            Ok(tag) if tag.seq > seq => {
                out.held = Some(tag);
                tracker.take(b, seq);
                break Piece::Done;
            }
            Ok(mut tag) => {
                let last = tag.seq == seq && tag.end.is_some();
                if let Some(g) = tag.end.take() {
                    g.disarm();
                }
                break Piece::Part(tag.item, last);
            }
            Err(PopError::Closed) => {
                tracker.take(b, seq);
                break Piece::Done;
            }
            Err(PopError::Empty) => {}
        }
        let mut notified = pin!(tracker.notify.notified());
        notified.as_mut().enable();
        if tracker.take(b, seq) {
            break Piece::Done;
        }
        if waited.is_none() {
            downstream.flush();
            waited = Some(Instant::now());
        }
        if out.epoch.is_some() {
            // Nothing more of this epoch can come from this branch: only the tracker can answer.
            let _ = tokio::time::timeout(Duration::from_millis(50), notified).await;
        } else {
            tokio::select! {
                () = out.rx.ready() => {}
                () = notified => {}
            }
        }
    };
    if let Some(t0) = waited {
        cell.add_starved(t0);
    }
    piece
}

/// Reads a branch up to its epoch end; outputs still there (of inputs already joined) go to
/// `stray`, so that none is lost.
async fn finish_epoch<U>(out: &mut BranchOut<U>, mut stray: impl FnMut(U)) {
    if let Some(mut t) = out.held.take() {
        if let Some(g) = t.end.take() {
            g.disarm();
        }
        stray(t.item);
    }
    while out.epoch.is_none() {
        match out.rx.pop().await {
            Some(Msg::Item(mut tag)) => {
                if let Some(g) = tag.end.take() {
                    g.disarm();
                }
                stray(tag.item);
            }
            Some(Msg::EpochEnd(e)) => out.epoch = Some(e),
            None => return,
        }
    }
    out.epoch = None;
}

async fn next_order(order: &mut mpsc::UnboundedReceiver<Order>, out: &QueueTx<impl Sized>) -> Option<Order> {
    match order.try_recv() {
        Ok(o) => Some(o),
        Err(mpsc::error::TryRecvError::Disconnected) => None,
        Err(mpsc::error::TryRecvError::Empty) => {
            out.flush();
            order.recv().await
        }
    }
}

async fn join_ordered<U: Send + 'static>(
    rxs: Vec<QueueRx<Tag<U>>>,
    mut order: mpsc::UnboundedReceiver<Order>,
    tracker: Arc<EndedRoutes>,
    out: QueueTx<U>,
    cell: Arc<StageCell>,
    shared: Arc<Shared>,
) {
    let mut branches: Vec<BranchOut<U>> = rxs.into_iter().map(BranchOut::new).collect();
    while let Some(entry) = next_order(&mut order, &out).await {
        if shared.cancelled() {
            return;
        }
        match entry {
            Order::Item { seq, branch } => {
                while let Piece::Part(u, last) =
                    next_piece(&mut branches[branch], branch, seq, &tracker, &out, &cell).await
                {
                    cell.items_in.fetch_add(1, Relaxed);
                    if !emit(&out, &cell, Msg::Item(u)).await {
                        return;
                    }
                    if last {
                        break;
                    }
                }
            }
            Order::Batch { .. } => {}
            Order::Epoch(e) => {
                let mut strays = Vec::new();
                for b in &mut branches {
                    finish_epoch(b, |u| strays.push(u)).await;
                }
                for u in strays {
                    cell.items_in.fetch_add(1, Relaxed);
                    if !emit(&out, &cell, Msg::Item(u)).await {
                        return;
                    }
                }
                if !emit(&out, &cell, Msg::EpochEnd(e)).await {
                    return;
                }
            }
        }
    }
}

async fn join_batched<U: Send + 'static>(
    rxs: Vec<QueueRx<Tag<Vec<U>>>>,
    mut order: mpsc::UnboundedReceiver<Order>,
    tracker: Arc<EndedRoutes>,
    out: QueueTx<Vec<U>>,
    cell: Arc<StageCell>,
    shared: Arc<Shared>,
) {
    let mut branches: Vec<BranchOut<Vec<U>>> = rxs.into_iter().map(BranchOut::new).collect();
    while let Some(entry) = next_order(&mut order, &out).await {
        if shared.cancelled() {
            return;
        }
        match entry {
            Order::Batch { seq } => {
                let mut batch = Vec::new();
                for (b, branch) in branches.iter_mut().enumerate() {
                    while let Piece::Part(part, last) = next_piece(branch, b, seq, &tracker, &out, &cell).await {
                        batch.extend(part);
                        if last {
                            break;
                        }
                    }
                }
                cell.items_in.fetch_add(1, Relaxed);
                if !batch.is_empty() && !emit(&out, &cell, Msg::Item(batch)).await {
                    return;
                }
            }
            Order::Item { .. } => {}
            Order::Epoch(e) => {
                let mut strays = Vec::new();
                for b in &mut branches {
                    finish_epoch(b, |u: Vec<U>| strays.extend(u)).await;
                }
                if !strays.is_empty() && !emit(&out, &cell, Msg::Item(strays)).await {
                    return;
                }
                if !emit(&out, &cell, Msg::EpochEnd(e)).await {
                    return;
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// Merge.
// ---------------------------------------------------------------------------------------

struct MergeIn<T> {
    rx: QueueRx<T>,
    weight: f64,
    /// The input has ended this epoch and waits for the others.
    ended: Option<u64>,
}

/// Pops from one input, waiting for it (counted as starved time).
async fn pop_one<T, O>(input: &MergeIn<T>, out: &QueueTx<O>, cell: &StageCell) -> Option<Msg<T>> {
    match input.rx.try_pop() {
        Ok(m) => Some(m),
        Err(PopError::Closed) => None,
        Err(PopError::Empty) => {
            out.flush();
            let t0 = Instant::now();
            let m = input.rx.pop().await;
            cell.add_starved(t0);
            m
        }
    }
}

/// Pops from whichever open input has a message, starting at `start` (for fairness).
async fn pop_any<T, O>(
    ins: &[MergeIn<T>],
    start: usize,
    out: &QueueTx<O>,
    cell: &StageCell,
) -> (usize, Option<Msg<T>>) {
    let n = ins.len();
    let mut waited: Option<Instant> = None;
    loop {
        for k in 0..n {
            let i = (start + k) % n;
            if ins[i].ended.is_some() {
                continue;
            }
            match ins[i].rx.try_pop() {
                Ok(m) => {
                    if let Some(t0) = waited {
                        cell.add_starved(t0);
                    }
                    return (i, Some(m));
                }
                Err(PopError::Closed) => {
                    if let Some(t0) = waited {
                        cell.add_starved(t0);
                    }
                    return (i, None);
                }
                Err(PopError::Empty) => {}
            }
        }
        if waited.is_none() {
            out.flush();
            waited = Some(Instant::now());
        }
        let ready: Vec<_> = ins.iter().filter(|i| i.ended.is_none()).map(|i| Box::pin(i.rx.ready())).collect();
        if ready.is_empty() {
            return (0, None);
        }
        let _ = futures::future::select_all(ready).await;
    }
}

fn next_open<T>(ins: &[MergeIn<T>], start: usize) -> usize {
    let n = ins.len();
    (0..n).map(|k| (start + k) % n).find(|&i| ins[i].ended.is_none()).unwrap_or(0)
}

fn draw<T>(ins: &[MergeIn<T>], rng: &mut Rng) -> usize {
    let total: f64 = ins.iter().filter(|i| i.ended.is_none()).map(|i| i.weight).sum();
    let mut r = rng.next_f64() * total;
    let mut last = 0;
    for (i, input) in ins.iter().enumerate() {
        if input.ended.is_some() {
            continue;
        }
        last = i;
        if r < input.weight {
            return i;
        }
        r -= input.weight;
    }
    last
}

pub(crate) async fn merge_driver<T: Send + 'static>(
    rxs: Vec<QueueRx<T>>,
    out: QueueTx<T>,
    cell: Arc<StageCell>,
    shared: Arc<Shared>,
    policy: MergePolicy,
    stop: MergeStop,
) {
    let (weights, mut rng) = match &policy {
        MergePolicy::Weighted { weights, seed } => (Some(weights.clone()), Rng(*seed)),
        _ => (None, Rng(0)),
    };
    // Inputs of weight 0 are never read: dropping them now stops them.
    let mut ins: Vec<MergeIn<T>> = rxs
        .into_iter()
        .enumerate()
        .filter_map(|(i, rx)| {
            let weight = weights.as_ref().map_or(1.0, |w| w.get(i).copied().unwrap_or(0.0));
            (weight > 0.0).then_some(MergeIn { rx, weight, ended: None })
        })
        .collect();
    let mut next = 0usize;
    let mut emitted = 0u64;
    loop {
        if shared.cancelled() || cell.feeding_stopped() || ins.is_empty() {
            return;
        }
        if ins.iter().all(|i| i.ended.is_some()) {
            let e = ins.iter().filter_map(|i| i.ended).max().unwrap_or(0);
            for i in &mut ins {
                i.ended = None;
            }
            if !emit(&out, &cell, Msg::EpochEnd(e)).await {
                return;
            }
            continue;
        }
        let (i, msg) = match &policy {
            MergePolicy::AsAvailable => pop_any(&ins, next, &out, &cell).await,
            MergePolicy::RoundRobin => {
                let i = next_open(&ins, next);
                (i, pop_one(&ins[i], &out, &cell).await)
            }
            MergePolicy::Weighted { .. } => {
                let i = draw(&ins, &mut rng);
                (i, pop_one(&ins[i], &out, &cell).await)
            }
        };
        match msg {
            Some(Msg::Item(item)) => {
                cell.items_in.fetch_add(1, Relaxed);
                if !emit(&out, &cell, Msg::Item(item)).await {
                    return;
                }
                emitted += 1;
                if let MergeStop::AfterItems(n) = stop
                    && emitted >= n
                {
                    return;
                }
                next = i + 1;
            }
            Some(Msg::EpochEnd(e)) => {
                ins[i].ended = Some(e);
                next = i + 1;
            }
            None => {
                if stop == MergeStop::FirstExhausted {
                    return;
                }
                ins.remove(i);
                next = i;
            }
        }
        if next >= ins.len() {
            next = 0;
        }
    }
}
