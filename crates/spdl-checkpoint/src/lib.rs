//! # spdl-checkpoint: whole-pipeline checkpoints for spdl-exec
//!
//! What the consumer has received, saved so that a new pipeline resumes with exactly the items not yet
//! delivered. Built on spdl-exec's public API only (a keyed source, stage wrappers, a consumer-side
//! recorder), so the engine carries no checkpoint code and a loader that does not resume does not build it.
//!
//! A sampler that resumes from its position skips the items a pipeline held in flight (prefetched, in a
//! stage, in a queue). Here the source tags every item with its key ([`ItemKey`]: merge input, epoch,
//! position in the epoch) and the key travels with the item ([`Keyed`]) through maps, filters, batches
//! and splits; the consumer-facing side ([`CheckpointedPipeline`]) records each delivered key in a
//! watermark plus the set of delivered positions above it. A failed item counts as consumed and its
//! failure is recorded (the stage wrappers of [`Checkpoint`] see the failure with its key). The state
//! ([`PipelineState`], JSON) holds, per input, the source's state at the start of each epoch not yet
//! fully delivered, its watermark, the delivered positions above it and the failures; its size follows
//! the items in flight, not the dataset. On resume the source re-enumerates those epochs from their
//! saved start state and skips the delivered positions, then continues as if never interrupted.
//! Batches that drop the incomplete last one of each epoch go through [`Checkpoint::batch`] (or a custom
//! aggregator through [`Checkpoint::aggregator`]), which records the dropped items as consumed: the
//! engine's own `aggregate_drop_last` drops them unseen, so they would come back after a resume.
//!
//! ```
//! use spdl_checkpoint::{Checkpoint, CheckpointSource, CheckpointedPipeline};
//! use spdl_exec::{BuildOptions, PipelineBuilder};
//!
//! /// Epoch `e` yields `0..n` rotated by `e` (a stand-in for a seeded shuffle).
//! #[derive(Clone)]
//! struct Rotating { n: u64, epoch: u64 }
//! impl CheckpointSource for Rotating {
//!     type Item = u64;
//!     type Epoch = std::vec::IntoIter<u64>;
//!     fn state(&self) -> Result<serde_json::Value, spdl_exec::BoxError> {
//!         Ok(serde_json::json!({ "epoch": self.epoch }))
//!     }
//!     fn load_state(&mut self, state: &serde_json::Value) -> Result<(), spdl_exec::BoxError> {
//!         self.epoch = state["epoch"].as_u64().ok_or("no epoch")?;
//!         Ok(())
//!     }
//!     fn next_epoch(&mut self) -> Result<Self::Epoch, spdl_exec::BoxError> {
//!         let e = self.epoch;
//!         self.epoch += 1;
//!         Ok((0..self.n).map(|i| (i + e) % self.n).collect::<Vec<_>>().into_iter())
//!     }
//! }
//!
//! let build = |ckpt: &Checkpoint| -> Result<_, Box<dyn std::error::Error>> {
//!     let source = ckpt.input(Rotating { n: 10, epoch: 0 })?;
//!     let pipeline = PipelineBuilder::new()
//!         .source(source)
//!         .pipe(ckpt.map("square", |x: u64| Ok::<_, String>(x * x)).concurrency(2))
//!         .sink(2)
//!         .build(BuildOptions::default())?;
//!     Ok(CheckpointedPipeline::new(pipeline, ckpt.clone()))
//! };
//! let ckpt = Checkpoint::new();
//! let first = build(&ckpt)?;
//! let got: Vec<u64> = first.iter().take(4).collect::<Result<_, _>>()?;
//! let saved = first.state()?.to_json()?;
//! drop(first); // items in flight are lost with it
//!
//! let resumed = build(&Checkpoint::resume(&spdl_checkpoint::PipelineState::from_json(&saved)?))?;
//! let mut all: Vec<u64> = got.into_iter().chain(resumed.iter().collect::<Result<Vec<_>, _>>()?).collect();
//! all.sort();
//! assert_eq!(all, (0..10u64).map(|x| x * x).collect::<Vec<_>>());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![deny(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

use std::collections::BTreeMap;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use spdl_exec::{Aggregator, BoxError, Item, Pipeline, PipelineError, PipelineStats, Stage};
use spdl_report::{error_chain, panicked};

/// Where an item came from: its merge input (0 for a pipeline of one source), its epoch (counted by
/// the checkpoint from the first epoch the input enumerated) and its position in that epoch's
/// enumeration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ItemKey {
    /// The merge input the item came from.
    pub input: u32,
    /// The epoch.
    pub epoch: u64,
    /// The item's position in its epoch's enumeration by the source.
    pub index: u64,
}

/// An item with the keys of the source items it was made from (one for an item, one per item for a
/// batch).
#[derive(Debug)]
pub struct Keyed<T> {
    keys: Vec<ItemKey>,
    value: T,
}

impl<T> Keyed<T> {
    /// The keys this value carries.
    pub fn keys(&self) -> &[ItemKey] {
        &self.keys
    }

    /// The value.
    pub fn value(&self) -> &T {
        &self.value
    }

    /// The value, keys dropped (they are no longer tracked: record them first).
    pub fn into_value(self) -> T {
        self.value
    }

    /// Applies `f` to the value and keeps the keys: how a custom stage (an async one, say) keeps
    /// an item's keys. A stage that can fail should use [`Checkpoint::map`] or record the failure
    /// with [`Checkpoint::fail`], or the failed item counts as never delivered.
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> Keyed<U> {
        Keyed { keys: self.keys, value: f(self.value) }
    }
}

/// Errors of checkpointing.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CheckpointError {
    /// The source of input `input` could not report or load its state.
    #[error("checkpoint: the source of input {input} failed to {what} its state: {cause}")]
    Source {
        /// The merge input.
        input: u32,
        /// `"report"` or `"load"`.
        what: &'static str,
        /// The source's error.
        cause: String,
    },
    /// A saved state that cannot be used (malformed JSON, or not for this pipeline).
    #[error("checkpoint: invalid state: {0}")]
    InvalidState(String),
    /// More inputs were added than the saved state has, or fewer.
    #[error("checkpoint: the saved state has {saved} inputs, this pipeline has {now}")]
    InputCount {
        /// Inputs in the saved state.
        saved: usize,
        /// Inputs registered by the new pipeline.
        now: usize,
    },
    /// The state was asked for in the middle of an epoch of a source whose epochs do not come again
    /// in the same order ([`CheckpointSource::deterministic_epoch_order`] is `false`): skipping "the
    /// delivered positions" of a different order would skip the wrong items.
    #[error(
        "checkpoint: the state cannot be saved in the middle of an epoch: the source of input {input} ({source_name}) \
         does not enumerate an epoch in the same order again; save the state at an epoch boundary"
    )]
    MidEpoch {
        /// The merge input.
        input: u32,
        /// The source, as [`CheckpointSource::describe`] names it.
        source_name: String,
    },
    /// [`Checkpoint::load`] was called after an input began an epoch.
    #[error("checkpoint: a state must be loaded before the pipeline starts")]
    Started,
}

impl CheckpointError {
    /// A copy (the causes are kept as text, so every variant can be copied).
    fn duplicate(&self) -> Self {
        match self {
            Self::Source { input, what, cause } => Self::Source { input: *input, what, cause: cause.clone() },
            Self::InvalidState(s) => Self::InvalidState(s.clone()),
            Self::InputCount { saved, now } => Self::InputCount { saved: *saved, now: *now },
            Self::MidEpoch { input, source_name } => Self::MidEpoch { input: *input, source_name: source_name.clone() },
            Self::Started => Self::Started,
        }
    }
}

/// A source whose epochs can be re-enumerated from a saved state (a seeded sampler: seed and epoch).
///
/// [`next_epoch`](CheckpointSource::next_epoch) must be a pure function of the state
/// [`state`](CheckpointSource::state) reported just before it: the same state enumerates the same items
/// in the same order. That is what lets a resumed pipeline skip exactly what was delivered.
pub trait CheckpointSource: Send + 'static {
    /// What the source yields.
    type Item: Send + 'static;
    /// One epoch's enumeration.
    type Epoch: Iterator<Item = Self::Item> + Send + 'static;

    /// The state from which the next [`next_epoch`](CheckpointSource::next_epoch) enumerates (JSON).
    fn state(&self) -> Result<serde_json::Value, BoxError>;

    /// Sets the state (one that [`state`](CheckpointSource::state) returned).
    fn load_state(&mut self, state: &serde_json::Value) -> Result<(), BoxError>;

    /// Enumerates the next epoch and advances the state past it. A source whose state moves on only
    /// as the epoch is enumerated (a Python generator) is supported too: the checkpoint reads the state
    /// again once the epoch is exhausted, and never loads a state between this call and the epoch's end.
    fn next_epoch(&mut self) -> Result<Self::Epoch, BoxError>;

    /// Whether an epoch enumerated again from the same state comes in the same order (the default).
    /// A source that says `false` (a distributed reader, a stream) can be checkpointed at epoch
    /// boundaries only: [`Checkpoint::state`] refuses a state taken in the middle of one of its epochs
    /// ([`CheckpointError::MidEpoch`]). Asked once, when the source is registered.
    fn deterministic_epoch_order(&self) -> bool {
        true
    }

    /// The source's name in error messages (default: its type's).
    fn describe(&self) -> String {
        std::any::type_name::<Self>().to_owned()
    }
}

/// A failure recorded against an item's key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FailureRecord {
    /// The item's position in its epoch.
    pub index: u64,
    /// The stage it failed in.
    pub stage: String,
    /// The error's text.
    pub cause: String,
}

/// The progress of one epoch of one input.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EpochState {
    /// The epoch.
    pub epoch: u64,
    /// The source's state at the start of the epoch.
    pub source: serde_json::Value,
    /// Every position below it is delivered (or failed).
    pub watermark: u64,
    /// The delivered positions above the watermark, as ascending, disjoint `[start, end)` spans (few:
    /// one per gap left by an item still in flight).
    pub delivered: Vec<(u64, u64)>,
    /// The items of this epoch that failed (counted as delivered).
    pub failures: Vec<FailureRecord>,
}

/// The state of one input (a source, or one input of a merge).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InputState {
    /// The epochs started and not fully delivered, oldest first.
    pub epochs: Vec<EpochState>,
    /// The epoch that comes after them, and the source's state to enumerate it.
    pub next_epoch: u64,
    /// The source's state at the start of `next_epoch`.
    pub next_source: serde_json::Value,
    /// Failed items in epochs already complete (their records are dropped with the epoch).
    pub failures_done: u64,
}

/// A whole pipeline's checkpoint: one [`InputState`] per input, in the order the inputs were added.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PipelineState {
    /// Format version.
    pub version: u32,
    /// Per input.
    pub inputs: Vec<InputState>,
}

const VERSION: u32 = 1;

impl PipelineState {
    /// The state as JSON text.
    pub fn to_json(&self) -> Result<String, CheckpointError> {
        serde_json::to_string(self).map_err(|e| CheckpointError::InvalidState(e.to_string()))
    }

    /// A state from JSON text made by [`to_json`](PipelineState::to_json).
    pub fn from_json(text: &str) -> Result<Self, CheckpointError> {
        serde_json::from_value(parse_versioned(text)?).map_err(|e| CheckpointError::InvalidState(e.to_string()))
    }
}

/// A state's JSON, its format version checked first (a state of another version is reported as such,
/// whatever else differs).
fn parse_versioned(text: &str) -> Result<serde_json::Value, CheckpointError> {
    let value: serde_json::Value =
        serde_json::from_str(text).map_err(|e| CheckpointError::InvalidState(e.to_string()))?;
    match value.get("version").and_then(serde_json::Value::as_u64) {
        Some(v) if v == u64::from(VERSION) => Ok(value),
        Some(v) => Err(CheckpointError::InvalidState(format!("format version {v} (this build reads {VERSION})"))),
        None => Err(CheckpointError::InvalidState(format!("no format version (this build reads {VERSION})"))),
    }
}

/// One epoch's delivery log.
#[derive(Debug)]
struct EpochLog {
    start: serde_json::Value,
    watermark: u64,
    above: SpanSet,
    /// Known once the source has enumerated the whole epoch.
    total: Option<u64>,
    failures: Vec<FailureRecord>,
}

impl EpochLog {
    fn new(start: serde_json::Value) -> Self {
        Self { start, watermark: 0, above: SpanSet::default(), total: None, failures: Vec::new() }
    }

    fn mark(&mut self, index: u64) {
        if index < self.watermark {
            return;
        }
        if index == self.watermark {
            self.watermark = self.above.take_from(self.watermark + 1);
        } else {
            self.above.insert(index);
        }
    }

    fn complete(&self) -> bool {
        self.total.is_some_and(|t| self.watermark >= t)
    }
}

/// One input's log: its open epochs, and where it resumes.
#[derive(Debug)]
struct InputLog {
    epochs: BTreeMap<u64, EpochLog>,
    /// The next epoch to enumerate and the source's state for it (`None` until the source reported
    /// it: a source that cannot is not checkpointable).
    next_epoch: u64,
    next_source: Option<serde_json::Value>,
    failures_done: u64,
    /// Saved epochs still to re-enumerate (on resume), oldest first.
    pending: Vec<EpochState>,
    /// Why this input cannot be checkpointed, if it cannot.
    broken: Option<CheckpointError>,
    /// Whether `next_source` is to be loaded into the source before its first epoch (a state loaded
    /// by [`Checkpoint::load`] with no epoch to re-enumerate).
    load_next: bool,
    /// [`CheckpointSource::deterministic_epoch_order`] and [`CheckpointSource::describe`].
    ordered: bool,
    name: String,
}

impl InputLog {
    fn mark(&mut self, key: ItemKey) {
        if let Some(log) = self.epochs.get_mut(&key.epoch) {
            log.mark(key.index);
            if log.complete() {
                self.finish(key.epoch);
            }
        }
    }

    fn finish(&mut self, epoch: u64) {
        if let Some(log) = self.epochs.remove(&epoch) {
            self.failures_done += log.failures.len() as u64;
        }
    }

    fn state(&self, input: u32) -> Result<InputState, CheckpointError> {
        if let Some(err) = &self.broken {
            return Err(err.duplicate());
        }
        if !self.ordered
            && (!self.pending.is_empty() || self.epochs.values().any(|e| e.watermark > 0 || !e.above.spans.is_empty()))
        {
            return Err(CheckpointError::MidEpoch { input, source_name: self.name.clone() });
        }
        let next_source = self.next_source.clone().ok_or_else(|| CheckpointError::Source {
            input,
            what: "report",
            cause: "the source has not reported its state yet".into(),
        })?;
        // Saved epochs not re-enumerated yet come first, untouched.
        let mut epochs: Vec<EpochState> = self
            .epochs
            .iter()
            .map(|(&epoch, log)| EpochState {
                epoch,
                source: log.start.clone(),
                watermark: log.watermark,
                delivered: log.above.pairs(),
                failures: log.failures.clone(),
            })
            .collect();
        epochs.extend(self.pending.iter().rev().cloned());
        epochs.sort_by_key(|e| e.epoch);
        Ok(InputState { epochs, next_epoch: self.next_epoch, next_source, failures_done: self.failures_done })
    }
}

/// What a [`Checkpoint`] holds behind its lock: the log of each input registered with it, and the state
/// being resumed from.
#[derive(Debug, Default)]
struct CheckpointInputs {
    inputs: Vec<InputLog>,
    /// The state being resumed from (inputs are matched by position as they are added).
    resume: Option<PipelineState>,
    /// Whether an input has begun an epoch.
    started: bool,
}

/// The shared checkpoint of one pipeline: its inputs register with it, its stage wrappers record
/// failures in it, and [`CheckpointedPipeline`] records deliveries. Cheap to clone (one `Arc`).
#[derive(Debug, Clone, Default)]
pub struct Checkpoint {
    inner: Arc<Mutex<CheckpointInputs>>,
}

impl Checkpoint {
    /// A checkpoint for a pipeline that starts from the beginning.
    pub fn new() -> Self {
        Self::default()
    }

    /// A checkpoint that resumes from `state`: the inputs, added in the same order as in the
    /// pipeline that saved it, re-enumerate the epochs not fully delivered and skip what was.
    pub fn resume(state: &PipelineState) -> Self {
        let inputs = CheckpointInputs { inputs: Vec::new(), resume: Some(state.clone()), started: false };
        Self { inner: Arc::new(Mutex::new(inputs)) }
    }

    fn lock(&self) -> MutexGuard<'_, CheckpointInputs> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Registers `source` as the next input (0, then 1, ... for the inputs of a merge) and returns
    /// the source to give [`spdl_exec::PipelineBuilder::source`] (one epoch) or
    /// [`continuous_source`](spdl_exec::PipelineBuilder::continuous_source) (epoch after epoch). On
    /// resume, the source's state is loaded from the saved one.
    pub fn input<S: CheckpointSource>(&self, mut source: S) -> Result<KeyedSource<S>, CheckpointError> {
        let (ordered, name) = (source.deterministic_epoch_order(), source.describe());
        let mut t = self.lock();
        let input =
            u32::try_from(t.inputs.len()).map_err(|_| CheckpointError::InvalidState("too many inputs".into()))?;
        let saved = match &t.resume {
            Some(state) => Some(
                state
                    .inputs
                    .get(input as usize)
                    .cloned()
                    .ok_or(CheckpointError::InputCount { saved: state.inputs.len(), now: input as usize + 1 })?,
            ),
            None => None,
        };
        let log = match saved {
            Some(s) => {
                for e in &s.epochs {
                    SpanSet::from_pairs(&e.delivered)?;
                }
                let mut pending = s.epochs;
                pending.reverse(); // popped oldest first
                if pending.is_empty() {
                    source.load_state(&s.next_source).map_err(|e| CheckpointError::Source {
                        input,
                        what: "load",
                        cause: error_chain(&*e),
                    })?;
                }
                InputLog {
                    epochs: BTreeMap::new(),
                    next_epoch: s.next_epoch,
                    next_source: Some(s.next_source),
                    failures_done: s.failures_done,
                    pending,
                    broken: None,
                    load_next: false,
                    ordered,
                    name,
                }
            }
            None => {
                let next_source = source.state().map_err(|e| CheckpointError::Source {
                    input,
                    what: "report",
                    cause: error_chain(&*e),
                })?;
                InputLog {
                    epochs: BTreeMap::new(),
                    next_epoch: 0,
                    next_source: Some(next_source),
                    failures_done: 0,
                    pending: Vec::new(),
                    broken: None,
                    load_next: false,
                    ordered,
                    name,
                }
            }
        };
        t.inputs.push(log);
        Ok(KeyedSource { input, checkpoint: self.clone(), source: Arc::new(Mutex::new(source)) })
    }

    /// Resumes the inputs already registered from `state` (of a pipeline of the same shape): what
    /// [`Checkpoint::resume`] does for a checkpoint made before its inputs. Call it before any input
    /// begins an epoch; the sources' states are loaded as their epochs begin.
    ///
    /// ```
    /// use spdl_checkpoint::{Checkpoint, CheckpointError, CheckpointSource};
    ///
    /// /// `0..3` for two epochs, then nothing.
    /// struct Twice { epoch: u64 }
    /// impl CheckpointSource for Twice {
    ///     type Item = u64;
    ///     type Epoch = std::ops::Range<u64>;
    ///     fn state(&self) -> Result<serde_json::Value, spdl_exec::BoxError> {
    ///         Ok(self.epoch.into())
    ///     }
    ///     fn load_state(&mut self, state: &serde_json::Value) -> Result<(), spdl_exec::BoxError> {
    ///         self.epoch = state.as_u64().ok_or("not an epoch")?;
    ///         Ok(())
    ///     }
    ///     fn next_epoch(&mut self) -> Result<Self::Epoch, spdl_exec::BoxError> {
    ///         self.epoch += 1;
    ///         Ok(if self.epoch <= 2 { 0..3 } else { 0..0 })
    ///     }
    /// }
    ///
    /// let first = Checkpoint::new();
    /// let mut epoch = first.input(Twice { epoch: 0 })?.into_iter();
    /// let item = epoch.next().ok_or("empty")?;
    /// first.deliver(item.keys());
    /// let saved = first.state()?;
    ///
    /// let again = Checkpoint::new();
    /// let source = again.input(Twice { epoch: 0 })?;
    /// again.load(&saved)?;
    /// let rest: Vec<u64> = source.into_iter().map(|k| k.into_value()).collect();
    /// assert_eq!(rest, [1, 2]);
    /// assert!(matches!(again.load(&saved), Err(CheckpointError::Started)));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn load(&self, state: &PipelineState) -> Result<(), CheckpointError> {
        let mut t = self.lock();
        if t.started {
            return Err(CheckpointError::Started);
        }
        if state.inputs.len() != t.inputs.len() {
            return Err(CheckpointError::InputCount { saved: state.inputs.len(), now: t.inputs.len() });
        }
        for s in &state.inputs {
            for e in &s.epochs {
                SpanSet::from_pairs(&e.delivered)?;
            }
        }
        for (log, s) in t.inputs.iter_mut().zip(&state.inputs) {
            let mut pending = s.epochs.clone();
            pending.sort_by_key(|e| e.epoch);
            pending.reverse(); // popped oldest first
            log.load_next = pending.is_empty();
            log.epochs.clear();
            log.pending = pending;
            log.next_epoch = s.next_epoch;
            log.next_source = Some(s.next_source.clone());
            log.failures_done = s.failures_done;
            log.broken = None;
        }
        Ok(())
    }

    /// [`load`](Checkpoint::load) of a state's JSON text, checked in the order that says the most: its
    /// format version, then its number of inputs, then the rest of its shape.
    pub fn load_json(&self, text: &str) -> Result<(), CheckpointError> {
        let value = parse_versioned(text)?;
        let saved = value.get("inputs").and_then(serde_json::Value::as_array).map(Vec::len);
        let now = self.lock().inputs.len();
        if let Some(saved) = saved
            && saved != now
        {
            return Err(CheckpointError::InputCount { saved, now });
        }
        let state: PipelineState =
            serde_json::from_value(value).map_err(|e| CheckpointError::InvalidState(e.to_string()))?;
        self.load(&state)
    }

    /// Why input `input` cannot be checkpointed (its source failed to report or load its state), if
    /// it cannot: an epoch whose start failed yields nothing, and this says why.
    pub fn input_error(&self, input: u32) -> Option<CheckpointError> {
        self.lock().inputs.get(input as usize).and_then(|log| log.broken.as_ref().map(CheckpointError::duplicate))
    }

    /// Records `keys` as delivered (what [`CheckpointedPipeline`] does with every item it hands out;
    /// also for an item a custom stage drops on purpose).
    pub fn deliver(&self, keys: &[ItemKey]) {
        let mut t = self.lock();
        for &key in keys {
            if let Some(log) = t.inputs.get_mut(key.input as usize) {
                log.mark(key);
            }
        }
    }

    /// Records `keys` as failed in `stage` (consumed: a resumed pipeline does not yield them again).
    pub fn fail(&self, keys: &[ItemKey], stage: &str, cause: &str) {
        let mut t = self.lock();
        for &key in keys {
            if let Some(log) = t.inputs.get_mut(key.input as usize) {
                if let Some(e) = log.epochs.get_mut(&key.epoch) {
                    e.failures.push(FailureRecord {
                        index: key.index,
                        stage: stage.to_owned(),
                        cause: cause.to_owned(),
                    });
                }
                log.mark(key);
            }
        }
    }

    /// The pipeline's state: what the consumer has received. Fails if a source could not report its
    /// state (never a silently wrong state).
    pub fn state(&self) -> Result<PipelineState, CheckpointError> {
        let t = self.lock();
        let inputs = t.inputs.iter().enumerate().map(|(i, log)| log.state(i as u32)).collect::<Result<Vec<_>, _>>()?;
        if let Some(saved) = &t.resume
            && saved.inputs.len() != inputs.len()
        {
            return Err(CheckpointError::InputCount { saved: saved.inputs.len(), now: inputs.len() });
        }
        Ok(PipelineState { version: VERSION, inputs })
    }

    /// A blocking stage `T → U` over keyed items: the keys follow the value, and a failure (or a
    /// panic) is recorded against them before the engine counts it.
    pub fn map<T, U, F, E>(&self, name: impl Into<String>, f: F) -> Stage<Keyed<T>, Keyed<U>>
    where
        T: Send + 'static,
        U: Send + 'static,
        F: Fn(T) -> Result<U, E> + Send + Sync + 'static,
        E: Into<BoxError>,
    {
        let name = name.into();
        let (ckpt, stage) = (self.clone(), name.clone());
        Stage::map(name, move |k: Keyed<T>| {
            let Keyed { keys, value } = k;
            match ckpt.guard(&keys, &stage, || f(value).map_err(Into::into)) {
                Ok(value) => Ok(Keyed { keys, value }),
                Err(e) => Err(e),
            }
        })
    }

    /// A blocking stage that keeps (`Some`) or drops (`None`) each item; a dropped item counts as
    /// delivered.
    pub fn filter_map<T, U, F, E>(&self, name: impl Into<String>, f: F) -> Stage<Keyed<T>, Keyed<U>>
    where
        T: Send + 'static,
        U: Send + 'static,
        F: Fn(T) -> Result<Option<U>, E> + Send + Sync + 'static,
        E: Into<BoxError>,
    {
        let name = name.into();
        let (ckpt, stage) = (self.clone(), name.clone());
        Stage::filter_map(name, move |k: Keyed<T>| {
            let Keyed { keys, value } = k;
            match ckpt.guard(&keys, &stage, || f(value).map_err(Into::into))? {
                Some(value) => Ok::<_, BoxError>(Some(Keyed { keys, value })),
                None => {
                    ckpt.deliver(&keys);
                    Ok(None)
                }
            }
        })
    }

    /// Runs `f`, recording its error or panic against `keys`.
    fn guard<R>(&self, keys: &[ItemKey], stage: &str, f: impl FnOnce() -> Result<R, BoxError>) -> Result<R, BoxError> {
        match catch_unwind(AssertUnwindSafe(f)) {
            Ok(Ok(r)) => Ok(r),
            Ok(Err(e)) => {
                self.fail(keys, stage, &error_chain(&*e));
                Err(e)
            }
            Err(panic) => {
                self.fail(keys, stage, &panicked(&*panic));
                resume_unwind(panic)
            }
        }
    }

    /// Batches of `size` keyed items as one keyed batch each (what [`spdl_exec::PipelineBuilder::aggregate`]
    /// and [`collate`](Checkpoint::collate) make), for [`spdl_exec::PipelineBuilder::aggregate_with`] with its
    /// own `drop_last` **off**. With `drop_last`, the incomplete batch of each epoch (and of the end of the
    /// input) is dropped and its items count as delivered, so a resumed epoch delivers the batches the
    /// uninterrupted one would; `aggregate_drop_last` followed by `collate` would drop them unrecorded,
    /// and they would come back after a resume. `size` 0 counts as 1.
    ///
    /// ```
    /// use spdl_checkpoint::{Checkpoint, CheckpointSource, CheckpointedPipeline};
    /// use spdl_exec::{BuildOptions, PipelineBuilder};
    ///
    /// /// One epoch of `0..n`.
    /// struct Range { n: u64, done: bool }
    /// impl CheckpointSource for Range {
    ///     type Item = u64;
    ///     type Epoch = std::ops::Range<u64>;
    ///     fn state(&self) -> Result<serde_json::Value, spdl_exec::BoxError> {
    ///         Ok(serde_json::json!({ "done": self.done }))
    ///     }
    ///     fn load_state(&mut self, state: &serde_json::Value) -> Result<(), spdl_exec::BoxError> {
    ///         self.done = state["done"].as_bool().ok_or("no done")?;
    ///         Ok(())
    ///     }
    ///     fn next_epoch(&mut self) -> Result<Self::Epoch, spdl_exec::BoxError> {
    ///         let n = if self.done { 0 } else { self.n };
    ///         self.done = true;
    ///         Ok(0..n)
    ///     }
    /// }
    ///
    /// let ckpt = Checkpoint::new();
    /// let pipeline = PipelineBuilder::new()
    ///     .source(ckpt.input(Range { n: 10, done: false })?)
    ///     .aggregate_with("aggregate(4)", ckpt.batch(4, true), false)
    ///     .sink(2)
    ///     .build(BuildOptions::default())?;
    /// let pipeline = CheckpointedPipeline::new(pipeline, ckpt);
    /// let batches: Vec<Vec<u64>> = pipeline.iter().collect::<Result<_, _>>()?;
    /// assert_eq!(batches, [vec![0, 1, 2, 3], vec![4, 5, 6, 7]]);
    /// // 8 and 9 were dropped and count as consumed: the epoch is complete.
    /// assert!(pipeline.state()?.inputs[0].epochs.is_empty());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn batch<T: Send + 'static>(&self, size: usize, drop_last: bool) -> KeyedAggregator<Batcher<T>> {
        let size = size.max(1);
        self.aggregator(format!("aggregate({size})"), Batcher::new(size), drop_last)
    }

    /// A custom [`Aggregator`] over keyed items, for [`spdl_exec::PipelineBuilder::aggregate_with`] with its
    /// own `drop_last` **off**: each output carries the keys of every item accumulated since the previous
    /// output; an error or panic of `inner` is recorded against those keys (they count as consumed);
    /// with `drop_last`, what `flush` returns is dropped and its items count as delivered (also at the
    /// end of the input, where the engine's `drop_last` would not call `flush` at all).
    pub fn aggregator<T, A>(&self, name: impl Into<String>, inner: A, drop_last: bool) -> KeyedAggregator<A>
    where
        T: Send + 'static,
        A: Aggregator<T>,
    {
        KeyedAggregator { inner, keys: Vec::new(), drop_last, name: name.into(), checkpoint: self.clone() }
    }

    /// The stage after [`spdl_exec::PipelineBuilder::aggregate`]: a batch of keyed items becomes one keyed
    /// batch carrying every item's key.
    pub fn collate<T: Send + 'static>(&self) -> Stage<Vec<Keyed<T>>, Keyed<Vec<T>>> {
        Stage::map("collate", |batch: Vec<Keyed<T>>| {
            let mut keys = Vec::with_capacity(batch.len());
            let mut values = Vec::with_capacity(batch.len());
            for k in batch {
                keys.extend(k.keys);
                values.push(k.value);
            }
            Ok::<_, BoxError>(Keyed { keys, value: values })
        })
    }

    /// The stage before [`spdl_exec::PipelineBuilder::disaggregate`]: a keyed batch becomes keyed items.
    /// When the batch has one key per element, each element takes its own; otherwise the last element
    /// carries them all (the batch counts as delivered with its last part), and an empty batch counts
    /// as delivered at once.
    pub fn split<T: Send + 'static>(&self) -> Stage<Keyed<Vec<T>>, Vec<Keyed<T>>> {
        let ckpt = self.clone();
        Stage::map("split", move |batch: Keyed<Vec<T>>| {
            let Keyed { keys, value } = batch;
            if keys.len() == value.len() {
                return Ok::<_, BoxError>(
                    keys.into_iter().zip(value).map(|(k, value)| Keyed { keys: vec![k], value }).collect(),
                );
            }
            let n = value.len();
            if n == 0 {
                ckpt.deliver(&keys);
                return Ok(Vec::new());
            }
            let mut keys = Some(keys);
            Ok(value
                .into_iter()
                .enumerate()
                .map(|(i, value)| Keyed {
                    keys: if i + 1 == n { keys.take().unwrap_or_default() } else { Vec::new() },
                    value,
                })
                .collect())
        })
    }

    /// Starts epoch enumeration for `input`: the epoch, its start state, its source iterator and the
    /// positions to skip.
    fn begin_epoch<S: CheckpointSource>(
        &self,
        input: u32,
        source: &mut S,
    ) -> Result<EpochRun<S::Epoch>, CheckpointError> {
        let mut t = self.lock();
        let log = t
            .inputs
            .get_mut(input as usize)
            .ok_or_else(|| CheckpointError::InvalidState(format!("unknown input {input}")))?;
        let res = Self::begin_epoch_locked(input, log, source);
        if let Err(e) = &res {
            log.broken = Some(e.duplicate());
        }
        t.started = true;
        res
    }

    fn begin_epoch_locked<S: CheckpointSource>(
        input: u32,
        log: &mut InputLog,
        source: &mut S,
    ) -> Result<EpochRun<S::Epoch>, CheckpointError> {
        let src_err =
            |what: &'static str| move |e: BoxError| CheckpointError::Source { input, what, cause: error_chain(&*e) };
        if std::mem::take(&mut log.load_next)
            && let Some(next) = &log.next_source
        {
            source.load_state(next).map_err(src_err("load"))?;
        }
        if let Some(saved) = log.pending.pop() {
            source.load_state(&saved.source).map_err(src_err("load"))?;
            let iter = source.next_epoch().map_err(src_err("load"))?;
            let mut elog = EpochLog::new(saved.source);
            elog.watermark = saved.watermark;
            elog.above = SpanSet::from_pairs(&saved.delivered)?;
            elog.failures = saved.failures;
            let skip_below = elog.watermark;
            let skip = elog.above.pairs();
            // Past the saved epochs the source continues from its own state after them (which it reaches
            // as this epoch is enumerated); the state after the last one is read when it ends.
            log.epochs.insert(saved.epoch, elog);
            return Ok(EpochRun {
                epoch: saved.epoch,
                iter,
                skip_below,
                skip,
                next_skip: 0,
                index: 0,
                yielded: 0,
                resumed: true,
            });
        }
        let start = source.state().map_err(src_err("report"))?;
        let iter = source.next_epoch().map_err(src_err("report"))?;
        let after = source.state().map_err(src_err("report"))?;
        let epoch = log.next_epoch;
        log.epochs.insert(epoch, EpochLog::new(start));
        log.next_epoch = epoch + 1;
        log.next_source = Some(after);
        Ok(EpochRun {
            epoch,
            iter,
            skip_below: 0,
            skip: Vec::new(),
            next_skip: 0,
            index: 0,
            yielded: 0,
            resumed: false,
        })
    }

    /// The source enumerated all `total` positions of `epoch`; `after` is its state then (the state of
    /// the next epoch, if `epoch` is the latest).
    fn end_epoch(&self, input: u32, epoch: u64, total: u64, after: Result<serde_json::Value, BoxError>) {
        let mut t = self.lock();
        let Some(log) = t.inputs.get_mut(input as usize) else { return };
        match after {
            Ok(state) if epoch + 1 == log.next_epoch => log.next_source = Some(state),
            Ok(_) => {}
            Err(e) => {
                log.broken = Some(CheckpointError::Source { input, what: "report", cause: error_chain(&*e) });
            }
        }
        if let Some(e) = log.epochs.get_mut(&epoch) {
            e.total = Some(total);
            if e.complete() {
                log.finish(epoch);
            }
        }
    }
}

/// One epoch being enumerated.
struct EpochRun<I> {
    epoch: u64,
    iter: I,
    skip_below: u64,
    /// Delivered spans above `skip_below`, ascending; `next_skip` is the first not yet passed.
    skip: Vec<(u64, u64)>,
    next_skip: usize,
    index: u64,
    yielded: u64,
    resumed: bool,
}

impl<I> EpochRun<I> {
    /// Whether `index` (increasing from call to call) was delivered.
    fn skips(&mut self, index: u64) -> bool {
        while let Some(&(_, end)) = self.skip.get(self.next_skip) {
            if index < end {
                break;
            }
            self.next_skip += 1;
        }
        self.skip.get(self.next_skip).is_some_and(|&(start, _)| start <= index)
    }
}

/// Groups items into `Vec`s of `size` (the last one of an epoch shorter): [`Checkpoint::batch`]'s inner
/// aggregator.
#[derive(Debug)]
pub struct Batcher<T> {
    size: usize,
    items: Vec<T>,
}

impl<T> Batcher<T> {
    /// Batches of `size` (0 counts as 1).
    pub fn new(size: usize) -> Self {
        Self { size: size.max(1), items: Vec::new() }
    }
}

impl<T: Send + 'static> Aggregator<T> for Batcher<T> {
    type Output = Vec<T>;

    fn accumulate(&mut self, item: T) -> Result<Option<Vec<T>>, BoxError> {
        if self.items.is_empty() {
            // Reserve no more than a typical batch up front: `size` is the caller's and may be huge.
            self.items.reserve(self.size.min(1024));
        }
        self.items.push(item);
        Ok((self.items.len() >= self.size).then(|| std::mem::take(&mut self.items)))
    }

    fn flush(&mut self) -> Result<Option<Vec<T>>, BoxError> {
        Ok((!self.items.is_empty()).then(|| std::mem::take(&mut self.items)))
    }
}

/// An [`Aggregator`] over [`Keyed`] items made by [`Checkpoint::aggregator`] or [`Checkpoint::batch`]:
/// `inner` sees the values, its outputs carry the keys, and what `drop_last` drops is recorded as
/// delivered.
pub struct KeyedAggregator<A> {
    inner: A,
    /// The keys of the items accumulated since the last output.
    keys: Vec<ItemKey>,
    drop_last: bool,
    name: String,
    checkpoint: Checkpoint,
}

impl<A> std::fmt::Debug for KeyedAggregator<A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyedAggregator")
            .field("name", &self.name)
            .field("drop_last", &self.drop_last)
            .field("pending_keys", &self.keys.len())
            .finish_non_exhaustive()
    }
}

impl<A> KeyedAggregator<A> {
    /// Runs one call of the inner aggregator; an error or a panic fails every pending key (the keys are
    /// cleared first, so a later output does not carry them again).
    fn call<O>(&mut self, f: impl FnOnce(&mut A) -> Result<O, BoxError>) -> Result<O, BoxError> {
        match catch_unwind(AssertUnwindSafe(|| f(&mut self.inner))) {
            Ok(Ok(out)) => Ok(out),
            Ok(Err(e)) => {
                let keys = std::mem::take(&mut self.keys);
                self.checkpoint.fail(&keys, &self.name, &error_chain(&*e));
                Err(e)
            }
            Err(panic) => {
                let keys = std::mem::take(&mut self.keys);
                self.checkpoint.fail(&keys, &self.name, &panicked(&*panic));
                resume_unwind(panic)
            }
        }
    }
}

impl<T, A> Aggregator<Keyed<T>> for KeyedAggregator<A>
where
    T: Send + 'static,
    A: Aggregator<T>,
{
    type Output = Keyed<A::Output>;

    fn accumulate(&mut self, item: Keyed<T>) -> Result<Option<Keyed<A::Output>>, BoxError> {
        let Keyed { keys, value } = item;
        self.keys.extend(keys);
        Ok(self
            .call(|inner| inner.accumulate(value))?
            .map(|value| Keyed { keys: std::mem::take(&mut self.keys), value }))
    }

    fn flush(&mut self) -> Result<Option<Keyed<A::Output>>, BoxError> {
        let out = self.call(|inner| inner.flush())?;
        let keys = std::mem::take(&mut self.keys);
        match out {
            Some(value) if !self.drop_last => Ok(Some(Keyed { keys, value })),
            // Dropped (or nothing left): these items are consumed, a resumed run must not yield them.
            _ => {
                self.checkpoint.deliver(&keys);
                Ok(None)
            }
        }
    }
}

/// Positions as disjoint, non-adjacent `[start, end)` spans: what an epoch delivered above its watermark.
#[derive(Debug, Default, Clone)]
struct SpanSet {
    /// start -> end.
    spans: BTreeMap<u64, u64>,
}

impl SpanSet {
    fn from_pairs(pairs: &[(u64, u64)]) -> Result<Self, CheckpointError> {
        let mut spans = BTreeMap::new();
        let mut last_end = None;
        for &(s, e) in pairs {
            if s >= e || last_end.is_some_and(|l| s <= l) {
                return Err(CheckpointError::InvalidState(format!(
                    "delivered spans must be ascending, disjoint and non-empty; got [{s}, {e}) after {last_end:?}"
                )));
            }
            spans.insert(s, e);
            last_end = Some(e);
        }
        Ok(Self { spans })
    }

    fn pairs(&self) -> Vec<(u64, u64)> {
        self.spans.iter().map(|(&s, &e)| (s, e)).collect()
    }

    fn insert(&mut self, p: u64) {
        let left = self.spans.range(..=p).next_back().map(|(&s, &e)| (s, e));
        if let Some((_, e)) = left
            && p < e
        {
            return; // present
        }
        let right_end = self.spans.get(&(p + 1)).copied();
        match (left.filter(|&(_, e)| e == p), right_end) {
            (Some((s, _)), Some(re)) => {
                self.spans.remove(&(p + 1));
                self.spans.insert(s, re);
            }
            (Some((s, _)), None) => {
                self.spans.insert(s, p + 1);
            }
            (None, Some(re)) => {
                self.spans.remove(&(p + 1));
                self.spans.insert(p, re);
            }
            (None, None) => {
                self.spans.insert(p, p + 1);
            }
        }
    }

    /// `w`, or the end of the span that starts at `w` (which is removed): the new watermark.
    fn take_from(&mut self, w: u64) -> u64 {
        self.spans.remove(&w).unwrap_or(w)
    }
}

/// A [`CheckpointSource`] registered with a [`Checkpoint`]: each `into_iter` enumerates one epoch
/// as [`Keyed`] items, skipping what a resumed checkpoint says was delivered. Clone it (it is one
/// `Arc`) for [`spdl_exec::PipelineBuilder::continuous_source`].
pub struct KeyedSource<S> {
    input: u32,
    checkpoint: Checkpoint,
    source: Arc<Mutex<S>>,
}

impl<S> Clone for KeyedSource<S> {
    fn clone(&self) -> Self {
        Self { input: self.input, checkpoint: self.checkpoint.clone(), source: Arc::clone(&self.source) }
    }
}

impl<S> std::fmt::Debug for KeyedSource<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyedSource").field("input", &self.input).finish_non_exhaustive()
    }
}

/// One epoch of a [`KeyedSource`].
pub struct KeyedEpoch<S: CheckpointSource> {
    owner: KeyedSource<S>,
    run: Option<EpochRun<S::Epoch>>,
}

impl<S: CheckpointSource> std::fmt::Debug for KeyedEpoch<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyedEpoch").field("input", &self.owner.input).finish_non_exhaustive()
    }
}

impl<S: CheckpointSource> KeyedEpoch<S> {
    fn start(owner: KeyedSource<S>) -> Self {
        let mut me = Self { owner, run: None };
        me.run = me.begin();
        me
    }

    fn begin(&self) -> Option<EpochRun<S::Epoch>> {
        let mut source = self.owner.source.lock().unwrap_or_else(PoisonError::into_inner);
        match self.owner.checkpoint.begin_epoch(self.owner.input, &mut *source) {
            Ok(run) => Some(run),
            Err(e) => {
                // Recorded on the input: `state()` reports it. The epoch yields nothing.
                tracing::error!(target: "spdl_exec", "{}", error_chain(&e));
                None
            }
        }
    }
}

impl<S: CheckpointSource> Iterator for KeyedEpoch<S> {
    type Item = Keyed<S::Item>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            let run = self.run.as_mut()?;
            match run.iter.next() {
                Some(value) => {
                    let index = run.index;
                    run.index += 1;
                    if index < run.skip_below || run.skips(index) {
                        continue;
                    }
                    run.yielded += 1;
                    return Some(Keyed {
                        keys: vec![ItemKey { input: self.owner.input, epoch: run.epoch, index }],
                        value,
                    });
                }
                None => {
                    let (epoch, total, resumed_empty) = (run.epoch, run.index, run.resumed && run.yielded == 0);
                    let after = self.owner.source.lock().unwrap_or_else(PoisonError::into_inner).state();
                    self.owner.checkpoint.end_epoch(self.owner.input, epoch, total, after);
                    self.run = None;
                    // A resumed epoch whose every item was delivered yields nothing: go on with the
                    // next one (an empty epoch would end a continuous source).
                    if resumed_empty {
                        self.run = self.begin();
                        continue;
                    }
                    return None;
                }
            }
        }
    }
}

impl<S: CheckpointSource> IntoIterator for KeyedSource<S> {
    type Item = Keyed<S::Item>;
    type IntoIter = KeyedEpoch<S>;

    fn into_iter(self) -> KeyedEpoch<S> {
        KeyedEpoch::start(self)
    }
}

/// A pipeline over [`Keyed`] items that records what it delivers: the consumer sees plain `T`s and
/// [`state`](CheckpointedPipeline::state) says what it has received.
pub struct CheckpointedPipeline<T> {
    pipeline: Pipeline<Keyed<T>>,
    checkpoint: Checkpoint,
}

impl<T> std::fmt::Debug for CheckpointedPipeline<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CheckpointedPipeline").finish_non_exhaustive()
    }
}

impl<T: Send + 'static> CheckpointedPipeline<T> {
    /// Wraps a built pipeline whose inputs were registered with `checkpoint`.
    pub fn new(pipeline: Pipeline<Keyed<T>>, checkpoint: Checkpoint) -> Self {
        Self { pipeline, checkpoint }
    }

    /// As [`Pipeline::get_item`]; a delivered item's keys are recorded.
    pub fn get_item(&self, timeout: Option<Duration>) -> Result<Option<Item<T>>, PipelineError> {
        Ok(match self.pipeline.get_item(timeout)? {
            Some(Item::Data(k)) => {
                self.checkpoint.deliver(&k.keys);
                Some(Item::Data(k.value))
            }
            Some(Item::EpochEnd { epoch }) => Some(Item::EpochEnd { epoch }),
            None => None,
        })
    }

    /// One epoch's items, as [`Pipeline::iter`]; each item's keys are recorded as it is handed out.
    pub fn iter(&self) -> impl Iterator<Item = Result<T, PipelineError>> + '_ {
        self.pipeline.iter().map(|r| {
            r.map(|k| {
                self.checkpoint.deliver(&k.keys);
                k.value
            })
        })
    }

    /// What the consumer has received: see [`Checkpoint::state`].
    pub fn state(&self) -> Result<PipelineState, CheckpointError> {
        self.checkpoint.state()
    }

    /// The wrapped pipeline (stop, stats, ...).
    pub fn pipeline(&self) -> &Pipeline<Keyed<T>> {
        &self.pipeline
    }

    /// As [`Pipeline::stats`].
    pub fn stats(&self) -> PipelineStats {
        self.pipeline.stats()
    }
}
