//! Whole-pipeline checkpoints: 1,000 random interruption points over ordered and unordered
//! pipelines, with concurrency, batches, splits, filters, failures and merges. A new pipeline
//! resumed from the state yields, per epoch and input, exactly the multiset the uninterrupted run
//! yields, and every failure is recorded once. Then `drop_last` batches through the keyed aggregator:
//! the dropped tail of an epoch counts as consumed, so a resumed epoch delivers the batches the
//! uninterrupted one would.

// The engine's test helpers (the watchdog that turns a hang into a failure).
#[path = "../../spdl-exec/tests/common/mod.rs"]
mod common;

use std::collections::BTreeMap;

use spdl_checkpoint::{Checkpoint, CheckpointError, CheckpointSource, CheckpointedPipeline, Keyed, PipelineState};
use spdl_exec::{Aggregator, BoxError, BuildOptions, Item, MergeOptions, MergePolicy, OutputOrder, PipelineBuilder};

/// splitmix64: the test's only randomness.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next() % n }
    }
}

/// A seeded shuffle of `0..n` per epoch, for `epochs` epochs (then empty: the pipeline ends).
/// Items are `(input, epoch, sample)`.
struct Shuffled {
    input: u32,
    n: u64,
    seed: u64,
    epoch: u64,
    epochs: u64,
}

impl CheckpointSource for Shuffled {
    type Item = (u32, u64, u64);
    type Epoch = std::vec::IntoIter<(u32, u64, u64)>;

    fn state(&self) -> Result<serde_json::Value, BoxError> {
        Ok(serde_json::json!({ "seed": self.seed, "epoch": self.epoch }))
    }

    fn load_state(&mut self, state: &serde_json::Value) -> Result<(), BoxError> {
        self.seed = state["seed"].as_u64().ok_or("no seed")?;
        self.epoch = state["epoch"].as_u64().ok_or("no epoch")?;
        Ok(())
    }

    fn next_epoch(&mut self) -> Result<Self::Epoch, BoxError> {
        let e = self.epoch;
        self.epoch += 1;
        if e >= self.epochs {
            return Ok(Vec::new().into_iter());
        }
        let mut order: Vec<u64> = (0..self.n).collect();
        let mut rng = Rng(self.seed ^ e.wrapping_mul(0x1234_5678_9ABC));
        for i in (1..order.len()).rev() {
            order.swap(i, rng.below(i as u64 + 1) as usize);
        }
        let input = self.input;
        Ok(order.into_iter().map(|s| (input, e, s)).collect::<Vec<_>>().into_iter())
    }
}

/// A source that cannot report its state.
struct Opaque;
impl CheckpointSource for Opaque {
    type Item = (u32, u64, u64);
    type Epoch = std::vec::IntoIter<(u32, u64, u64)>;
    fn state(&self) -> Result<serde_json::Value, BoxError> {
        Err("this source keeps no state".into())
    }
    fn load_state(&mut self, _: &serde_json::Value) -> Result<(), BoxError> {
        Err("this source keeps no state".into())
    }
    fn next_epoch(&mut self) -> Result<Self::Epoch, BoxError> {
        Ok(Vec::new().into_iter())
    }
}

#[derive(Debug, Clone, Copy)]
struct Config {
    n: [u64; 2],
    inputs: usize,
    concurrency: usize,
    ordered: bool,
    batch: usize,
    split: bool,
    filter: bool,
    epochs: u64,
    /// Batches through `Checkpoint::batch` (the keyed aggregator) rather than `aggregate` + `collate`.
    keyed_batch: bool,
    /// With `keyed_batch`: drop the incomplete last batch of each epoch.
    drop_last: bool,
}

fn fails(sample: u64) -> bool {
    sample % 7 == 3
}
fn filtered(sample: u64) -> bool {
    sample % 5 == 1
}

type Out = (u32, u64, u64);

/// The pipeline's items, flattened (a batch is its items).
enum Got {
    One(Out),
    Many(Vec<Out>),
}

fn build(cfg: Config, ckpt: &Checkpoint) -> Result<CheckpointedPipeline<Got>, CheckpointError> {
    let order = if cfg.ordered { OutputOrder::Input } else { OutputOrder::Completion };
    let mut inputs = Vec::new();
    for i in 0..cfg.inputs {
        let src =
            ckpt.input(Shuffled { input: i as u32, n: cfg.n[i], seed: 17 + i as u64, epoch: 0, epochs: cfg.epochs })?;
        let mut b = PipelineBuilder::new().continuous_source(src).pipe(
            ckpt.map(
                "work",
                |(i, e, s): Out| {
                    if fails(s) { Err(format!("sample {s} is broken")) } else { Ok((i, e, s * 10)) }
                },
            )
            .concurrency(cfg.concurrency)
            .order(order),
        );
        if cfg.filter {
            b = b.pipe(ckpt.filter_map("keep", |x: Out| Ok::<_, BoxError>((!filtered(x.2 / 10)).then_some(x))));
        }
        inputs.push(b);
    }
    let b = if inputs.len() == 1 {
        inputs.pop().unwrap_or_else(|| unreachable!())
    } else {
        let policy = if cfg.ordered { MergePolicy::RoundRobin } else { MergePolicy::AsAvailable };
        PipelineBuilder::new().merge(inputs, MergeOptions::new("mix").policy(policy))
    };
    let options =
        BuildOptions { num_threads: 2, queue_capacity: 4, batch_queue_capacity: 2, ..BuildOptions::default() };
    let p = if cfg.batch > 0 {
        let b = if cfg.keyed_batch {
            b.aggregate_with("batch", ckpt.batch(cfg.batch, cfg.drop_last), false)
        } else {
            b.aggregate(cfg.batch).pipe(ckpt.collate())
        };
        if cfg.split {
            b.pipe(ckpt.split())
                .disaggregate()
                .pipe(ckpt.map("one", |x: Out| Ok::<_, BoxError>(Got::One(x))))
                .sink(2)
                .build(options)
        } else {
            b.pipe(ckpt.map("many", |x: Vec<Out>| Ok::<_, BoxError>(Got::Many(x)))).sink(2).build(options)
        }
    } else {
        b.pipe(ckpt.map("one", |x: Out| Ok::<_, BoxError>(Got::One(x)))).sink(2).build(options)
    }
    .map_err(|e| CheckpointError::InvalidState(e.to_string()))?;
    Ok(CheckpointedPipeline::new(p, ckpt.clone()))
}

/// (input, epoch) -> sorted samples.
type Multiset = BTreeMap<(u32, u64), Vec<u64>>;

fn expected(cfg: Config) -> Multiset {
    let mut m = Multiset::new();
    for i in 0..cfg.inputs {
        for e in 0..cfg.epochs {
            let v: Vec<u64> =
                (0..cfg.n[i]).filter(|&s| !(fails(s) || cfg.filter && filtered(s))).map(|s| s * 10).collect();
            if !v.is_empty() {
                m.insert((i as u32, e), v);
            }
        }
    }
    m
}

fn add(m: &mut Multiset, got: Got) {
    let items = match got {
        Got::One(x) => vec![x],
        Got::Many(v) => v,
    };
    for (i, e, s) in items {
        m.entry((i, e)).or_default().push(s);
    }
}

/// Reads up to `limit` items (all if `None`); false when the pipeline ended first.
fn drain(p: &CheckpointedPipeline<Got>, into: &mut Multiset, limit: Option<u64>) -> bool {
    let mut taken = 0;
    loop {
        if limit.is_some_and(|l| taken >= l) {
            return true;
        }
        match p.get_item(None).expect("no pipeline error") {
            Some(Item::Data(x)) => {
                add(into, x);
                taken += 1;
            }
            Some(Item::EpochEnd { .. }) => {}
            None => return false,
        }
    }
}

fn failures_of(state: &PipelineState) -> u64 {
    state.inputs.iter().map(|i| i.failures_done + i.epochs.iter().map(|e| e.failures.len() as u64).sum::<u64>()).sum()
}

#[test]
fn a_thousand_random_interruptions_resume_exactly() {
    common::watchdog(240, || {
        let mut rng = Rng(2024);
        for trial in 0..1000 {
            let cfg = Config {
                n: [1 + rng.below(30), 1 + rng.below(20)],
                inputs: 1 + (rng.below(4) == 0) as usize,
                concurrency: 1 + rng.below(4) as usize,
                ordered: rng.below(2) == 0,
                batch: if rng.below(2) == 0 { 0 } else { 1 + rng.below(5) as usize },
                split: rng.below(2) == 0,
                filter: rng.below(3) == 0,
                epochs: 1 + rng.below(3),
                keyed_batch: false,
                drop_last: false,
            };
            let total: u64 = (0..cfg.inputs).map(|i| cfg.n[i]).sum::<u64>() * cfg.epochs;
            let stop_after = rng.below(total + 2);
            let got = interrupt_and_resume(cfg, stop_after, trial);
            assert_eq!(got, expected(cfg), "trial {trial}: {cfg:?}, interrupted after {stop_after} items");
        }
    });
}

/// Runs `cfg`, stops reading after `stop_after` items, saves the state, drops the pipeline (what it held
/// in flight is lost) and reads the rest from a new pipeline resumed from the state. Checks that every
/// epoch ends complete and every failure is recorded once; returns what both runs delivered, sorted.
fn interrupt_and_resume(cfg: Config, stop_after: u64, trial: usize) -> Multiset {
    let mut got = Multiset::new();
    let ckpt = Checkpoint::new();
    let first = build(cfg, &ckpt).expect("build");
    drain(&first, &mut got, Some(stop_after));
    let saved = first.state().expect("state").to_json().expect("json");
    drop(first);

    let state = PipelineState::from_json(&saved).expect("parse");
    let resumed_ckpt = Checkpoint::resume(&state);
    let resumed = build(cfg, &resumed_ckpt).expect("build resumed");
    drain(&resumed, &mut got, None);

    for v in got.values_mut() {
        v.sort_unstable();
    }
    let end = resumed.state().expect("final state");
    assert!(end.inputs.iter().all(|i| i.epochs.is_empty()), "trial {trial}: {cfg:?}: every epoch complete");
    let failing: u64 =
        (0..cfg.inputs).map(|i| (0..cfg.n[i]).filter(|&s| fails(s)).count() as u64).sum::<u64>() * cfg.epochs;
    assert_eq!(failures_of(&end), failing, "trial {trial}: {cfg:?}: each failure recorded once");
    got
}

/// What reaches the aggregator in epoch `e` of input 0, in the source's order (the work stage's output).
fn kept_in_order(cfg: Config, e: u64) -> Vec<u64> {
    let mut src = Shuffled { input: 0, n: cfg.n[0], seed: 17, epoch: e, epochs: cfg.epochs };
    let epoch = src.next_epoch().expect("epoch");
    epoch.map(|(_, _, s)| s).filter(|&s| !(fails(s) || cfg.filter && filtered(s))).map(|s| s * 10).collect()
}

#[test]
fn drop_last_tails_count_as_consumed_across_random_interruptions() {
    common::watchdog(240, || {
        let mut rng = Rng(77);
        for trial in 0..400 {
            let cfg = Config {
                n: [1 + rng.below(30), 1 + rng.below(20)],
                inputs: 1 + (rng.below(4) == 0) as usize,
                concurrency: 1 + rng.below(4) as usize,
                ordered: rng.below(2) == 0,
                batch: 1 + rng.below(6) as usize,
                split: rng.below(3) == 0,
                filter: rng.below(3) == 0,
                epochs: 1 + rng.below(3),
                keyed_batch: true,
                drop_last: rng.below(4) != 0,
            };
            let total: u64 = (0..cfg.inputs).map(|i| cfg.n[i]).sum::<u64>() * cfg.epochs;
            let stop_after = rng.below(total + 2);
            let got = interrupt_and_resume(cfg, stop_after, trial);
            let ctx = format!("trial {trial}: {cfg:?}, interrupted after {stop_after} items");
            if !cfg.drop_last {
                assert_eq!(got, expected(cfg), "{ctx}");
                continue;
            }
            if cfg.inputs > 1 {
                // Batches mix the inputs of the merge (which tail is dropped depends on the interleaving):
                // nothing twice, nothing that did not reach the aggregator, and every tail recorded (each
                // epoch ends complete, checked above).
                let all = expected(cfg);
                for (k, v) in &got {
                    let mut d = v.clone();
                    d.dedup();
                    assert_eq!(&d, v, "{ctx}: {k:?}: an item delivered twice");
                    let kept = all.get(k).cloned().unwrap_or_default();
                    assert!(v.iter().all(|s| kept.binary_search(s).is_ok()), "{ctx}: {k:?}");
                }
                continue;
            }
            let b = cfg.batch;
            for e in 0..cfg.epochs {
                let kept = kept_in_order(cfg, e);
                let full = kept.len() / b * b;
                let mut delivered = got.get(&(0, e)).cloned().unwrap_or_default();
                let mut all = kept.clone();
                all.sort_unstable();
                // Never an item twice, never one that did not reach the aggregator.
                let before = delivered.len();
                delivered.dedup();
                assert_eq!(delivered.len(), before, "{ctx}: epoch {e}: an item delivered twice");
                assert!(delivered.iter().all(|s| all.binary_search(s).is_ok()), "{ctx}: epoch {e}");
                if cfg.split {
                    // Items of one batch are delivered one by one: a resume mid-batch forms other
                    // batches, so only the bounds hold.
                    assert!(delivered.len() <= kept.len(), "{ctx}: epoch {e}");
                } else if cfg.ordered {
                    // Exactly the uninterrupted run's batches: the first `full` items in order.
                    let mut first = kept[..full].to_vec();
                    first.sort_unstable();
                    assert_eq!(delivered, first, "{ctx}: epoch {e}");
                } else {
                    // Completion order picks the tail by timing; its size is what the uninterrupted
                    // run drops.
                    assert_eq!(delivered.len(), full, "{ctx}: epoch {e}: {delivered:?}");
                }
            }
        }
    });
}

/// A single-epoch source over `0..n` in order.
#[derive(Clone)]
struct Ordered {
    n: u64,
    done: bool,
}

impl CheckpointSource for Ordered {
    type Item = u64;
    type Epoch = std::ops::Range<u64>;
    fn state(&self) -> Result<serde_json::Value, BoxError> {
        Ok(serde_json::json!({ "done": self.done }))
    }
    fn load_state(&mut self, state: &serde_json::Value) -> Result<(), BoxError> {
        self.done = state["done"].as_bool().ok_or("no done")?;
        Ok(())
    }
    fn next_epoch(&mut self) -> Result<Self::Epoch, BoxError> {
        let n = if self.done { 0 } else { self.n };
        self.done = true;
        Ok(0..n)
    }
}

fn ordered_batches(ckpt: &Checkpoint, n: u64, size: usize) -> CheckpointedPipeline<Vec<u64>> {
    let p = PipelineBuilder::new()
        .source(ckpt.input(Ordered { n, done: false }).expect("input"))
        .aggregate_with("batch", ckpt.batch(size, true), false)
        .sink(4)
        .build(BuildOptions { num_threads: 2, ..BuildOptions::default() })
        .expect("build");
    CheckpointedPipeline::new(p, ckpt.clone())
}

#[test]
fn a_tail_dropped_before_the_interruption_stays_dropped() {
    common::watchdog(60, || {
        // 10 items in batches of 4: [0..4], [4..8], and 8, 9 dropped.
        let ckpt = Checkpoint::new();
        let first = ordered_batches(&ckpt, 10, 4);
        let Some(Item::Data(batch)) = first.get_item(None).expect("first batch") else { panic!("no batch") };
        assert_eq!(batch, [0, 1, 2, 3]);
        // The second batch waits in the sink queue while the aggregator drops the tail: wait until the
        // state records it (the consumer has not read the second batch). Unrecorded, it never shows.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        let state = loop {
            let state = first.state().expect("state");
            if state.inputs[0].epochs.first().is_some_and(|e| e.delivered == [(8, 10)]) {
                break state;
            }
            assert!(std::time::Instant::now() < deadline, "the dropped tail 8, 9 was never recorded: {state:?}");
            std::thread::sleep(std::time::Duration::from_millis(2));
        };
        assert_eq!(state.inputs[0].epochs[0].watermark, 4, "{state:?}");
        drop(first); // [4..8] is lost in flight

        let resumed = ordered_batches(&Checkpoint::resume(&state), 10, 4);
        let rest: Vec<Vec<u64>> = resumed.iter().collect::<Result<_, _>>().expect("rest");
        // What the uninterrupted run delivered after [0..4]. Had the tail gone unrecorded, 4..10 would be
        // enumerated again: the same batch here, but the state would count 8 and 9 as owed until then.
        assert_eq!(rest, [vec![4, 5, 6, 7]]);
        assert!(resumed.state().expect("state").inputs[0].epochs.is_empty());
    });
}

/// Sums items, emitting every 3; fails on 13.
struct Sums {
    acc: Vec<u64>,
}

impl Aggregator<u64> for Sums {
    type Output = u64;
    fn accumulate(&mut self, x: u64) -> Result<Option<u64>, BoxError> {
        if x == 13 {
            self.acc.clear();
            return Err("13 is unlucky".into());
        }
        self.acc.push(x);
        Ok((self.acc.len() == 3).then(|| self.acc.drain(..).sum()))
    }
    fn flush(&mut self) -> Result<Option<u64>, BoxError> {
        Ok((!self.acc.is_empty()).then(|| self.acc.drain(..).sum()))
    }
}

#[test]
fn a_custom_aggregator_failure_is_recorded_against_its_pending_items() {
    common::watchdog(60, || {
        let ckpt = Checkpoint::new();
        let p = PipelineBuilder::new()
            .source(ckpt.input(Ordered { n: 20, done: false }).expect("input"))
            .aggregate_with("sums", ckpt.aggregator("sums", Sums { acc: Vec::new() }, true), false)
            .sink(4)
            .build(BuildOptions { num_threads: 1, ..BuildOptions::default() })
            .expect("build");
        let p = CheckpointedPipeline::new(p, ckpt.clone());
        let mut got = Vec::new();
        loop {
            match p.get_item(None) {
                Ok(Some(Item::Data(x))) => got.push(x),
                Ok(Some(Item::EpochEnd { .. })) => {}
                Ok(None) => break,
                Err(e) => panic!("{e}"),
            }
        }
        // [0,1,2] [3,4,5] [6,7,8] [9,10,11], then 12 and 13 fail together, [14,15,16], [17,18,19] and
        // nothing dropped (20 - 14 = 6 items: two full outputs).
        assert_eq!(got, [3, 12, 21, 30, 45, 54]);
        let state = ckpt.state().expect("state");
        assert!(state.inputs[0].epochs.is_empty(), "{state:?}");
        assert_eq!(state.inputs[0].failures_done, 2, "{state:?}");
    });
}

#[test]
fn the_state_is_small_and_names_the_epoch() {
    let cfg = Config {
        n: [1000, 0],
        inputs: 1,
        concurrency: 2,
        ordered: true,
        batch: 0,
        split: false,
        filter: false,
        epochs: 2,
        keyed_batch: false,
        drop_last: false,
    };
    let ckpt = Checkpoint::new();
    let p = build(cfg, &ckpt).expect("build");
    let mut got = Multiset::new();
    drain(&p, &mut got, Some(1200));
    let state = p.state().expect("state");
    let input = &state.inputs[0];
    // Epoch 0 is complete: only epoch 1 is open, with its start state and a few positions.
    assert_eq!(input.epochs.len(), 1);
    assert_eq!(input.epochs[0].epoch, 1);
    assert_eq!(input.epochs[0].source, serde_json::json!({ "seed": 17, "epoch": 1 }));
    assert!(input.epochs[0].delivered.len() < 64);
    assert!(state.to_json().expect("json").len() < 4096);
}

#[test]
fn a_source_without_state_makes_state_fail_clearly() {
    let ckpt = Checkpoint::new();
    let err = ckpt.input(Opaque).expect_err("no state");
    assert!(err.to_string().contains("failed to report its state: this source keeps no state"), "{err}");
}

#[test]
fn a_state_for_another_pipeline_is_refused() {
    let cfg = Config {
        n: [10, 10],
        inputs: 2,
        concurrency: 1,
        ordered: true,
        batch: 0,
        split: false,
        filter: false,
        epochs: 1,
        keyed_batch: false,
        drop_last: false,
    };
    let ckpt = Checkpoint::new();
    let p = build(cfg, &ckpt).expect("build");
    let state = p.state().expect("state");
    let one_input = Config { inputs: 1, ..cfg };
    let resumed = build(one_input, &Checkpoint::resume(&state)).expect("build");
    let err = resumed.state().expect_err("input count");
    assert!(matches!(err, CheckpointError::InputCount { saved: 2, now: 1 }), "{err}");
    assert!(PipelineState::from_json("{\"version\": 9, \"inputs\": []}").is_err());
    assert!(PipelineState::from_json("not json").is_err());
}

#[test]
fn keys_follow_values() {
    let ckpt = Checkpoint::new();
    let src = ckpt.input(Shuffled { input: 0, n: 3, seed: 1, epoch: 0, epochs: 1 }).expect("input");
    let all: Vec<Keyed<Out>> = src.into_iter().collect();
    assert_eq!(all.len(), 3);
    let idx: Vec<u64> = all.iter().map(|k| k.keys()[0].index).collect();
    assert_eq!(idx, [0, 1, 2]);
    let doubled = all.into_iter().next().map(|k| k.map(|(_, _, s)| s * 2)).expect("one");
    assert_eq!(doubled.keys()[0].index, 0);
}

#[test]
fn malformed_delivered_spans_are_refused() {
    let cfg = Config {
        n: [10, 0],
        inputs: 1,
        concurrency: 1,
        ordered: true,
        batch: 0,
        split: false,
        filter: false,
        epochs: 1,
        keyed_batch: false,
        drop_last: false,
    };
    let ckpt = Checkpoint::new();
    let p = build(cfg, &ckpt).expect("build");
    let _ = p.get_item(None).expect("one item");
    let mut state = p.state().expect("state");
    assert!(!state.inputs[0].epochs.is_empty());
    state.inputs[0].epochs[0].delivered = vec![(5, 7), (6, 9)];
    let err = build(cfg, &Checkpoint::resume(&state)).expect_err("overlapping spans");
    assert!(err.to_string().contains("ascending, disjoint"), "{err}");
}

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// `(epoch, i)` for `i` in `0..n`, for `epochs` epochs, whose state (the epoch) moves on only as an epoch
/// is enumerated: read at the first item, advanced at the end, as a Python generator's `__iter__` does.
struct Lazy {
    n: u64,
    epochs: u64,
    epoch: Arc<AtomicU64>,
    ordered: bool,
}

struct LazyEpoch {
    n: u64,
    epochs: u64,
    shared: Arc<AtomicU64>,
    epoch: Option<u64>,
    i: u64,
    done: bool,
}

impl Iterator for LazyEpoch {
    type Item = (u64, u64);
    fn next(&mut self) -> Option<(u64, u64)> {
        if self.done {
            return None;
        }
        let e = *self.epoch.get_or_insert_with(|| self.shared.load(Ordering::SeqCst));
        if e < self.epochs && self.i < self.n {
            self.i += 1;
            return Some((e, self.i - 1));
        }
        self.done = true;
        if e < self.epochs {
            self.shared.store(e + 1, Ordering::SeqCst);
        }
        None
    }
}

impl CheckpointSource for Lazy {
    type Item = (u64, u64);
    type Epoch = LazyEpoch;
    fn state(&self) -> Result<serde_json::Value, BoxError> {
        Ok(self.epoch.load(Ordering::SeqCst).into())
    }
    fn load_state(&mut self, state: &serde_json::Value) -> Result<(), BoxError> {
        self.epoch.store(state.as_u64().ok_or("not an epoch")?, Ordering::SeqCst);
        Ok(())
    }
    fn next_epoch(&mut self) -> Result<LazyEpoch, BoxError> {
        let shared = Arc::clone(&self.epoch);
        Ok(LazyEpoch { n: self.n, epochs: self.epochs, shared, epoch: None, i: 0, done: false })
    }
    fn deterministic_epoch_order(&self) -> bool {
        self.ordered
    }
    fn describe(&self) -> String {
        "Lazy".into()
    }
}

fn lazy(ordered: bool) -> Lazy {
    Lazy { n: 5, epochs: 2, epoch: Arc::default(), ordered }
}

#[test]
fn a_source_whose_state_moves_on_as_it_runs_resumes_exactly_through_load() {
    for stop_after in 0..=10 {
        let first = Checkpoint::new();
        let source = first.input(lazy(true)).expect("input");
        let mut got = Vec::new();
        'run: for _ in 0..2 {
            for k in source.clone() {
                if got.len() == stop_after {
                    break 'run;
                }
                first.deliver(k.keys());
                got.push(k.into_value());
            }
        }
        let saved = PipelineState::from_json(&first.state().expect("state").to_json().expect("json")).expect("parse");
        let again = Checkpoint::new();
        let source = again.input(lazy(true)).expect("input");
        again.load(&saved).expect("load");
        for _ in 0..2 {
            got.extend(source.clone().into_iter().map(Keyed::into_value));
        }
        got.sort_unstable();
        let want: Vec<(u64, u64)> = (0..2).flat_map(|e| (0..5).map(move |i| (e, i))).collect();
        assert_eq!(got, want, "interrupted after {stop_after}");
        assert!(matches!(again.load(&saved), Err(CheckpointError::Started)));
    }
}

#[test]
fn a_source_without_a_deterministic_order_is_saved_at_epoch_boundaries_only() {
    let ckpt = Checkpoint::new();
    let source = ckpt.input(lazy(false)).expect("input");
    let mut epoch = source.into_iter();
    let item = epoch.next().expect("an item");
    ckpt.deliver(item.keys());
    let err = ckpt.state().expect_err("mid-epoch");
    assert!(matches!(err, CheckpointError::MidEpoch { input: 0, .. }), "{err}");
    assert!(err.to_string().contains("(Lazy)"), "{err}");
    for k in epoch {
        ckpt.deliver(k.keys());
    }
    let state = ckpt.state().expect("at the boundary");
    assert!(state.inputs[0].epochs.is_empty());
    assert_eq!(state.inputs[0].next_source, serde_json::json!(1));
}
