//! Stages: a name, a function, and options.

use std::fmt;
use std::future::Future;
use std::sync::Arc;

use futures::future::BoxFuture;
use futures::stream::BoxStream;
use futures::{FutureExt, Stream, StreamExt};

use crate::failure::FailureBudget;
use crate::failure::{BoxError, PartReport, Partial};
use crate::options::{OutputOrder, StageOptions};

/// Outputs made one at a time by a blocking iterator, advanced on the pool.
pub(crate) type LazyIter<U> = Box<dyn Iterator<Item = Result<U, BoxError>> + Send + 'static>;
/// Outputs made one at a time by a stream, polled on the scheduler.
pub(crate) type LazyStream<U> = BoxStream<'static, Result<U, BoxError>>;

/// Zero, one or many outputs of one call.
pub(crate) enum Outputs<U> {
    None,
    One(U),
    Many(Vec<U>),
    /// Outputs still to be made ([`Stage::flat_map_lazy`]).
    Iter(LazyIter<U>),
    /// Outputs still to be made ([`Stage::flat_map_stream`]).
    Stream(LazyStream<U>),
    /// One output, and the failed parts of the call's input ([`Stage::map_partial`]).
    Partial(U, PartReport),
}

/// The outputs of a lazy call that are still to be made.
pub(crate) enum Rest<U> {
    Iter(LazyIter<U>),
    Stream(LazyStream<U>),
}

impl<U> Outputs<U> {
    /// The outputs already made, and the lazy rest if the call returned an iterator or a stream.
    pub(crate) fn split(self) -> (OutputsIter<U>, Option<Rest<U>>) {
        match self {
            Self::None => (OutputsIter::One(None), None),
            Self::One(u) => (OutputsIter::One(Some(u)), None),
            Self::Many(v) => (OutputsIter::Many(v.into_iter()), None),
            Self::Iter(i) => (OutputsIter::One(None), Some(Rest::Iter(i))),
            Self::Stream(s) => (OutputsIter::One(None), Some(Rest::Stream(s))),
            Self::Partial(u, _) => (OutputsIter::One(Some(u)), None),
        }
    }

    /// Takes the failed parts out of a [`Outputs::Partial`] result, for the accounting.
    pub(crate) fn take_parts(self) -> (Self, Option<PartReport>) {
        match self {
            Self::Partial(u, report) => (Self::One(u), Some(report)),
            other => (other, None),
        }
    }
}

pub(crate) enum OutputsIter<U> {
    One(Option<U>),
    Many(std::vec::IntoIter<U>),
}

impl<U> Iterator for OutputsIter<U> {
    type Item = U;

    fn next(&mut self) -> Option<U> {
        match self {
            Self::One(o) => o.take(),
            Self::Many(it) => it.next(),
        }
    }
}

pub(crate) type BlockingFn<T, U> = Arc<dyn Fn(T) -> Result<Outputs<U>, BoxError> + Send + Sync + 'static>;
pub(crate) type AsyncFn<T, U> =
    Arc<dyn Fn(T) -> BoxFuture<'static, Result<Outputs<U>, BoxError>> + Send + Sync + 'static>;
pub(crate) type Describe<T> = Arc<dyn Fn(&T) -> String + Send + Sync + 'static>;
/// A stage's fast path ([`Stage::fast_path`]): the outputs of an input it handles on the scheduler, or
/// the input back for the stage's function.
pub(crate) type FastFn<T, U> = Arc<dyn Fn(T) -> Result<Vec<U>, T> + Send + Sync + 'static>;

pub(crate) enum StageFn<T, U> {
    Blocking(BlockingFn<T, U>),
    Async(AsyncFn<T, U>),
}

impl<T, U> Clone for StageFn<T, U> {
    fn clone(&self) -> Self {
        match self {
            Self::Blocking(f) => Self::Blocking(Arc::clone(f)),
            Self::Async(f) => Self::Async(Arc::clone(f)),
        }
    }
}

impl<T, U> Clone for Stage<T, U> {
    fn clone(&self) -> Self {
        Self {
            name: self.name.clone(),
            func: self.func.clone(),
            options: self.options,
            describe: self.describe.clone(),
            item_size: self.item_size.clone(),
            fast: self.fast.clone(),
        }
    }
}

/// One step of a pipeline: a named function from `T` to zero, one or many `U`, with
/// [`StageOptions`].
///
/// Blocking functions (`map`, `filter_map`, `flat_map`, `flat_map_lazy`) run on the
/// pipeline's thread pool;
/// async ones (`*_async`) run on the scheduler's tokio runtime and must not block. An `Err`
/// or a panic fails that item only: it is counted, logged and dropped.
///
/// ```
/// use spdl_exec::{OutputOrder, Stage};
/// let parse = Stage::map("parse", |s: String| s.parse::<u32>()).concurrency(2);
/// let evens = Stage::filter_map("evens", |n: u32| Ok::<_, &str>((n % 2 == 0).then_some(n)))
///     .order(OutputOrder::Input);
/// assert_eq!(parse.name(), "parse");
/// assert_eq!(evens.options().order, OutputOrder::Input);
/// ```
pub struct Stage<T, U> {
    pub(crate) name: String,
    pub(crate) func: StageFn<T, U>,
    pub(crate) options: StageOptions,
    pub(crate) describe: Option<Describe<T>>,
    pub(crate) item_size: Option<crate::ItemSize>,
    /// Inputs handled on the scheduler without a pool job ([`Stage::fast_path`]).
    pub(crate) fast: Option<FastFn<T, U>>,
}

impl<T, U> fmt::Debug for Stage<T, U> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Stage")
            .field("name", &self.name)
            .field(
                "kind",
                &match self.func {
                    StageFn::Blocking(_) => "blocking",
                    StageFn::Async(_) => "async",
                },
            )
            .field("options", &self.options)
            .finish()
    }
}

impl<T: Send + 'static, U: Send + 'static> Stage<T, U> {
    fn with(name: impl Into<String>, func: StageFn<T, U>) -> Self {
        Self { name: name.into(), func, options: StageOptions::default(), describe: None, item_size: None, fast: None }
    }

    /// A blocking one-to-one function.
    pub fn map<F, E>(name: impl Into<String>, f: F) -> Self
    where
        F: Fn(T) -> Result<U, E> + Send + Sync + 'static,
        E: Into<BoxError>,
    {
        Self::with(name, StageFn::Blocking(Arc::new(move |t| f(t).map(Outputs::One).map_err(Into::into))))
    }

    /// A blocking function that keeps (`Some`) or drops (`None`) each item.
    pub fn filter_map<F, E>(name: impl Into<String>, f: F) -> Self
    where
        F: Fn(T) -> Result<Option<U>, E> + Send + Sync + 'static,
        E: Into<BoxError>,
    {
        Self::with(
            name,
            StageFn::Blocking(Arc::new(move |t| match f(t) {
                Ok(Some(u)) => Ok(Outputs::One(u)),
                Ok(None) => Ok(Outputs::None),
                Err(e) => Err(e.into()),
            })),
        )
    }

    /// A blocking function that splits each item into any number of outputs. The iterator
    /// is drained on the pool thread right after the call, so all its outputs exist at once:
    /// for many large or endless outputs use [`Stage::flat_map_lazy`].
    pub fn flat_map<F, E, I>(name: impl Into<String>, f: F) -> Self
    where
        F: Fn(T) -> Result<I, E> + Send + Sync + 'static,
        E: Into<BoxError>,
        I: IntoIterator<Item = U>,
    {
        Self::with(
            name,
            StageFn::Blocking(Arc::new(move |t| {
                f(t).map(|i| Outputs::Many(i.into_iter().collect())).map_err(Into::into)
            })),
        )
    }

    /// A blocking function that returns an iterator whose elements are outputs made one at
    /// a time, as a generator does. Each element goes downstream as soon as the iterator
    /// yields it, and the iterator is advanced (on the pool) only while the output queue has
    /// room: a slow consumer pauses it, so an endless iterator is fine and at most one
    /// output per running call waits outside the queues. An `Err` element (or a panic in
    /// `next`) fails the item: it is counted and logged like a failed call, and the
    /// iterator is dropped; the outputs before it stay delivered. Stopping the pipeline
    /// drops iterators that are not finished.
    ///
    /// The stage's task time covers the call that returns the iterator, not the iteration.
    ///
    /// ```
    /// use spdl_exec::{BuildOptions, PipelineBuilder, Stage};
    ///
    /// // Each number becomes an endless run of copies; only what is read is ever made.
    /// let pipeline = PipelineBuilder::new()
    ///     .source(1..=3u64)
    ///     .pipe(Stage::flat_map_lazy("repeat", |x: u64| {
    ///         Ok::<_, std::io::Error>(std::iter::repeat(x).map(Ok::<_, std::io::Error>))
    ///     }))
    ///     .sink(1)
    ///     .build(BuildOptions::default())
    ///     .unwrap();
    /// let first: Vec<u64> = pipeline.iter().take(5).map(Result::unwrap).collect();
    /// assert_eq!(first, [1, 1, 1, 1, 1]);
    /// ```
    pub fn flat_map_lazy<F, E, I, E2>(name: impl Into<String>, f: F) -> Self
    where
        F: Fn(T) -> Result<I, E> + Send + Sync + 'static,
        E: Into<BoxError>,
        I: IntoIterator<Item = Result<U, E2>>,
        I::IntoIter: Send + 'static,
        E2: Into<BoxError>,
    {
        Self::with(
            name,
            StageFn::Blocking(Arc::new(move |t| {
                f(t).map(|i| Outputs::Iter(Box::new(i.into_iter().map(|r| r.map_err(Into::into))) as LazyIter<U>))
                    .map_err(Into::into)
            })),
        )
    }

    /// An async function that returns a stream whose elements are outputs made one at a
    /// time, as an async generator does: the async counterpart of
    /// [`Stage::flat_map_lazy`]. Each element goes downstream as soon as the stream yields
    /// it; the stream is polled only while the output queue has room. An `Err` element (or
    /// a panic) fails the item and drops the stream. A call holds one of the stage's
    /// `concurrency` slots until its stream ends. In [`OutputOrder::Completion`] the streams
    /// of the calls in flight are polled at the same time; in [`OutputOrder::Input`] a
    /// call's outputs all come before those of the next call, whose stream is polled once
    /// the previous one has ended.
    ///
    /// ```
    /// use spdl_exec::{BuildOptions, PipelineBuilder, Stage};
    ///
    /// let pipeline = PipelineBuilder::new()
    ///     .source(vec![2u32, 3])
    ///     .pipe(Stage::flat_map_stream("count", |n: u32| async move {
    ///         Ok::<_, std::io::Error>(futures::stream::iter((0..n).map(Ok::<_, std::io::Error>)))
    ///     }))
    ///     .sink(1)
    ///     .build(BuildOptions::default())
    ///     .unwrap();
    /// let all: Vec<u32> = pipeline.iter().map(Result::unwrap).collect();
    /// assert_eq!(all, [0, 1, 0, 1, 2]);
    /// ```
    pub fn flat_map_stream<F, Fut, E, S, E2>(name: impl Into<String>, f: F) -> Self
    where
        F: Fn(T) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<S, E>> + Send + 'static,
        E: Into<BoxError>,
        S: Stream<Item = Result<U, E2>> + Send + 'static,
        E2: Into<BoxError>,
    {
        Self::with(
            name,
            StageFn::Async(Arc::new(move |t| {
                f(t).map(|r| r.map(|s| Outputs::Stream(s.map(|r| r.map_err(Into::into)).boxed())).map_err(Into::into))
                    .boxed()
            })),
        )
    }

    /// A blocking function over a group of parts (a batch of images, of clips) whose parts
    /// may fail one by one: it returns a [`Partial`], the output of the parts that did not
    /// fail and an [`ItemFailure`](crate::ItemFailure) per part that did. Each failed part is booked against this
    /// stage, as a failed item: the `failed` column of the stats, the stage's
    /// [`FailureBudget`] and the pipeline's. An `Err` (or a panic) fails the whole call, as for
    /// [`Stage::map`].
    ///
    /// ```
    /// use spdl_exec::{BuildOptions, ItemFailure, Partial, PipelineBuilder, Stage};
    ///
    /// // Parse a batch of strings; the ones that are not numbers fail, the batch goes on.
    /// let pipeline = PipelineBuilder::new()
    ///     .source(vec!["1", "x", "3", "4", "y", "6"])
    ///     .aggregate(3)
    ///     .pipe(Stage::map_partial("parse", |batch: Vec<&str>| {
    ///         let mut ok = Vec::new();
    ///         let mut failures = Vec::new();
    ///         for s in &batch {
    ///             match s.parse::<u32>() {
    ///                 Ok(n) => ok.push(n),
    ///                 Err(e) => failures.push(ItemFailure::part(*s, e.to_string())),
    ///             }
    ///         }
    ///         Ok::<_, std::io::Error>(Partial { output: ok, parts: batch.len() as u64, failures })
    ///     }))
    ///     .sink(2)
    ///     .build(BuildOptions::default())
    ///     .unwrap();
    /// let all: Vec<Vec<u32>> = pipeline.iter().map(Result::unwrap).collect();
    /// assert_eq!(all, [vec![1, 3], vec![4, 6]]);
    /// assert_eq!(pipeline.stats().stage("parse").map(|s| s.items_failed), Some(2));
    /// ```
    pub fn map_partial<F, E>(name: impl Into<String>, f: F) -> Self
    where
        F: Fn(T) -> Result<Partial<U>, E> + Send + Sync + 'static,
        E: Into<BoxError>,
    {
        Self::with(
            name,
            StageFn::Blocking(Arc::new(move |t| {
                f(t).map(|p| Outputs::Partial(p.output, PartReport { parts: p.parts, failures: p.failures }))
                    .map_err(Into::into)
            })),
        )
    }

    /// An async one-to-one function.
    pub fn map_async<F, Fut, E>(name: impl Into<String>, f: F) -> Self
    where
        F: Fn(T) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<U, E>> + Send + 'static,
        E: Into<BoxError>,
    {
        Self::with(
            name,
            StageFn::Async(Arc::new(move |t| f(t).map(|r| r.map(Outputs::One).map_err(Into::into)).boxed())),
        )
    }

    /// An async function that keeps (`Some`) or drops (`None`) each item.
    pub fn filter_map_async<F, Fut, E>(name: impl Into<String>, f: F) -> Self
    where
        F: Fn(T) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Option<U>, E>> + Send + 'static,
        E: Into<BoxError>,
    {
        Self::with(
            name,
            StageFn::Async(Arc::new(move |t| {
                f(t).map(|r| match r {
                    Ok(Some(u)) => Ok(Outputs::One(u)),
                    Ok(None) => Ok(Outputs::None),
                    Err(e) => Err(e.into()),
                })
                .boxed()
            })),
        )
    }

    /// An async function that splits each item into any number of outputs.
    pub fn flat_map_async<F, Fut, E, I>(name: impl Into<String>, f: F) -> Self
    where
        F: Fn(T) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<I, E>> + Send + 'static,
        E: Into<BoxError>,
        I: IntoIterator<Item = U>,
    {
        Self::with(
            name,
            StageFn::Async(Arc::new(move |t| {
                f(t).map(|r| r.map(|i| Outputs::Many(i.into_iter().collect())).map_err(Into::into)).boxed()
            })),
        )
    }
}

impl<T, U> Stage<T, U> {
    /// The stage's name, as shown in logs, stats and errors.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The stage's options.
    pub fn options(&self) -> &StageOptions {
        &self.options
    }

    /// Replaces all options.
    #[must_use]
    pub fn with_options(mut self, options: StageOptions) -> Self {
        self.options = options;
        self
    }

    /// Items processed at the same time (at least 1). Setting it fixes it: the auto-tuner
    /// leaves it alone unless [`Stage::tune`] opts the stage in.
    #[must_use]
    pub fn concurrency(mut self, n: usize) -> Self {
        self.options.concurrency = n;
        if self.options.tune == crate::options::Tune::Auto {
            self.options.tune = crate::options::Tune::Fixed;
        }
        self
    }

    /// Lets the auto-tuner ([`crate::BuildOptions::autotune`]) set this stage's concurrency
    /// within `min..=max`, starting from its concurrency (raised to `min` if below).
    ///
    /// ```
    /// use spdl_exec::{Stage, Tune};
    /// let s = Stage::map("decode", |x: u32| Ok::<_, std::io::Error>(x)).concurrency(2).tune(1, 8);
    /// assert_eq!(s.options().tune, Tune::Within { min: 1, max: 8 });
    /// ```
    #[must_use]
    pub fn tune(mut self, min: usize, max: usize) -> Self {
        self.options.tune = crate::options::Tune::Within { min, max };
        self
    }

    /// The memory one call in flight holds, for the auto-tuner's memory budget
    /// ([`crate::StageOptions::item_bytes`]).
    #[must_use]
    pub fn item_bytes(mut self, bytes: u64) -> Self {
        self.options.item_bytes = Some(bytes);
        self
    }

    /// The size of this stage's items as its function measures them, for the auto-tuner's
    /// memory budget when [`Stage::item_bytes`] is not set; also reported as
    /// [`crate::StageStats::item_bytes`]. See [`crate::ItemSize`] for an example.
    #[must_use]
    pub fn item_size(mut self, size: crate::ItemSize) -> Self {
        self.item_size = Some(size);
        self
    }

    /// The order of the outputs.
    #[must_use]
    pub fn order(mut self, order: OutputOrder) -> Self {
        self.options.order = order;
        self
    }

    /// The failures this stage tolerates: the stage is then judged by this budget instead of the
    /// pipeline's ([`crate::StageOptions::failure_budget`]).
    #[must_use]
    pub fn failure_budget(mut self, budget: FailureBudget) -> Self {
        self.options.failure_budget = Some(budget);
        self
    }

    /// The capacity of the queue after this stage.
    #[must_use]
    pub fn output_capacity(mut self, capacity: usize) -> Self {
        self.options.output_capacity = Some(capacity);
        self
    }

    /// A cheap function tried first on each input of a blocking stage, on the scheduler's thread and
    /// without a pool job: `Ok(outputs)` are that input's outputs (pushed as a `flat_map`'s are, under
    /// the output queue's back-pressure); `Err(input)` hands the input to the stage's function. It
    /// must not block, and should take no longer than a few queue operations: it holds up every
    /// other driver of the pipeline while it runs. A panic in it fails the item, as a panic in the
    /// stage's function does.
    ///
    /// The fast path is taken only while the stage runs one call at a time (concurrency 1, not
    /// tuned); otherwise every input goes to the stage's function, which must therefore give the
    /// same outputs for the inputs the fast path takes. With the fast path, inputs are handled
    /// one at a time and in order: a lazy call ([`Stage::flat_map_lazy`]) of the function ends
    /// before the next input is looked at. The stats count a fast-path input as a call.
    ///
    /// Splitting batches that are already in memory, while items of other kinds need a lazy,
    /// blocking iteration:
    ///
    /// ```
    /// use spdl_exec::{BuildOptions, PipelineBuilder, Stage};
    ///
    /// enum Batch { Ready(Vec<u32>), Count(u32) }
    /// let pipeline = PipelineBuilder::new()
    ///     .source(vec![Batch::Ready(vec![7, 8]), Batch::Count(3)])
    ///     .pipe(
    ///         Stage::flat_map_lazy("split", |b: Batch| {
    ///             let items: Box<dyn Iterator<Item = u32> + Send> = match b {
    ///                 Batch::Ready(v) => Box::new(v.into_iter()),
    ///                 Batch::Count(n) => Box::new(0..n),
    ///             };
    ///             Ok::<_, std::io::Error>(items.map(Ok::<_, std::io::Error>))
    ///         })
    ///         .concurrency(1)
    ///         .fast_path(|b: Batch| match b {
    ///             Batch::Ready(v) => Ok(v),
    ///             other => Err(other),
    ///         }),
    ///     )
    ///     .sink(4)
    ///     .build(BuildOptions::default())
    ///     .unwrap();
    /// let all: Vec<u32> = pipeline.iter().map(Result::unwrap).collect();
    /// assert_eq!(all, [7, 8, 0, 1, 2]);
    /// ```
    #[must_use]
    pub fn fast_path<F>(mut self, f: F) -> Self
    where
        F: Fn(T) -> Result<Vec<U>, T> + Send + Sync + 'static,
    {
        self.fast = Some(Arc::new(f));
        self
    }
}

impl<T: fmt::Debug, U> Stage<T, U> {
    /// Logs each failed item's `Debug` text with its failure. This formats every input
    /// before the call (the function consumes the item), so it costs a `format!` per item:
    /// a debugging aid, off by default.
    #[must_use]
    pub fn log_failed_items(mut self) -> Self {
        self.describe = Some(Arc::new(|t: &T| format!("{t:?}")));
        self
    }
}
