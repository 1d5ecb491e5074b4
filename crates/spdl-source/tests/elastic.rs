//! Elastic ranks, property-tested over seeded random cases: every rank gets the same number of items
//! and batches for any dataset size, world size, batch size and remainder policy; a checkpoint taken at
//! world size W resumes at W' with every sample not yet delivered anywhere delivered exactly once; and
//! the same through real checkpointed pipelines (one per rank) from spdl-exec.

use std::collections::BTreeMap;

use spdl_checkpoint::{Checkpoint, CheckpointSource, CheckpointedPipeline, PipelineState};
use spdl_exec::{BoxError, BuildOptions, PipelineBuilder};
use spdl_source::sampler::{
    CanonicalOrder, ElasticShard, EpochProgress, Remainder, Sampler, Shard, Spans, batches_per_rank, per_rank,
};

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

fn shards(order: CanonicalOrder, w: usize, rem: Remainder) -> Vec<ElasticShard> {
    (0..w).map(|r| ElasticShard::new(order, Shard::new(r, w).unwrap(), rem)).collect()
}

fn random_progress(rng: &mut Rng, n: u64, epoch: u64) -> EpochProgress {
    let done = Spans::from_positions((0..n).filter(|_| rng.below(3) == 0));
    EpochProgress { epoch, done }
}

#[test]
fn every_rank_gets_the_same_items_and_batches() {
    let mut rng = Rng(1);
    for case in 0..2000 {
        let n = rng.below(300);
        let w = 1 + rng.below(9) as usize;
        let b = 1 + rng.below(10) as usize;
        let rem = if rng.below(2) == 0 { Remainder::Pad } else { Remainder::Drop };
        let drop_last = rng.below(2) == 0;
        let order = CanonicalOrder::new(n as usize, 1 + rng.below(16) as usize, case, rng.below(2) == 0).unwrap();
        let progress = if rng.below(2) == 0 { EpochProgress::new(0) } else { random_progress(&mut rng, n, 0) };
        let remaining = n - progress.done.count();
        let all: Vec<Vec<u64>> = shards(order, w, rem).iter().map(|s| s.share(&progress).unwrap()).collect();
        let count = per_rank(remaining, w, rem);
        for share in &all {
            assert_eq!(share.len() as u64, count, "case {case}: n={n} w={w} {rem:?}");
            let batches = share.chunks(b).filter(|c| !drop_last || c.len() == b).count() as u64;
            assert_eq!(batches, batches_per_rank(count, b, drop_last), "case {case}: batches");
        }
        // Never a delivered position; the remaining ones covered (Pad) or all but < w (Drop).
        let mut seen = BTreeMap::<u64, u32>::new();
        for &p in all.iter().flatten() {
            assert!(!progress.done.contains(p), "case {case}: {p} was delivered already");
            *seen.entry(p).or_default() += 1;
        }
        match rem {
            Remainder::Pad => {
                assert_eq!(seen.len() as u64, remaining, "case {case}: every remaining position");
                let extra: u64 = seen.values().map(|&m| u64::from(m) - 1).sum();
                assert!(extra < w as u64 || remaining == 0, "case {case}: padding is under one round");
            }
            Remainder::Drop => {
                assert!(seen.values().all(|&m| m == 1), "case {case}: no position twice");
                assert!(remaining - (seen.len() as u64) < w as u64, "case {case}: fewer than a round dropped");
            }
        }
    }
}

/// Each rank delivers a random part of its share (a prefix and a few out of order, as a pipeline
/// with items in flight does).
fn deliver(rng: &mut Rng, share_len: usize) -> Spans {
    let prefix = rng.below(share_len as u64 + 1);
    let extra = (prefix..share_len as u64).filter(|_| rng.below(4) == 0);
    Spans::from_positions((0..prefix).chain(extra))
}

#[test]
fn a_checkpoint_at_one_world_size_resumes_at_another_exactly_once() {
    let mut rng = Rng(7);
    for case in 0..500 {
        let n = 1 + rng.below(200);
        let order = CanonicalOrder::new(n as usize, 1 + rng.below(8) as usize, case, true).unwrap();
        let mut progress = EpochProgress::new(3);
        let mut delivered = BTreeMap::<u64, u32>::new();
        // Up to three interruptions at random world sizes, then a run to the end.
        let hops = 1 + rng.below(3);
        for hop in 0..=hops {
            let w = 1 + rng.below(8) as usize;
            let ranks = shards(order, w, Remainder::Drop);
            let shares: Vec<Vec<u64>> = ranks.iter().map(|s| s.share(&progress).unwrap()).collect();
            let local: Vec<(usize, Spans)> = shares
                .iter()
                .enumerate()
                .map(|(r, s)| {
                    (r, if hop == hops { Spans::from_range(0, s.len() as u64) } else { deliver(&mut rng, s.len()) })
                })
                .collect();
            for (r, spans) in &local {
                for &(s, e) in spans.pairs() {
                    for &p in &shares[*r][s as usize..e as usize] {
                        *delivered.entry(p).or_default() += 1;
                    }
                }
            }
            progress = ranks[0].merge(&progress, &local).unwrap();
            assert_eq!(progress.done.count(), delivered.len() as u64, "case {case} hop {hop}: merged = delivered");
        }
        assert!(delivered.values().all(|&m| m == 1), "case {case}: a sample delivered twice");
        // Only the last run's remainder (< its world size) can be missing.
        assert!(n - (delivered.len() as u64) < 8, "case {case}: {} of {n} delivered", delivered.len());
    }
}

/// An elastic rank as a checkpointable source: state = the epoch and what was delivered anywhere
/// before this run; items are sample indices.
struct RankSource {
    shard: ElasticShard,
    progress: EpochProgress,
}

impl CheckpointSource for RankSource {
    type Item = usize;
    type Epoch = std::vec::IntoIter<usize>;

    fn state(&self) -> Result<serde_json::Value, BoxError> {
        Ok(serde_json::to_value(&self.progress)?)
    }

    fn load_state(&mut self, state: &serde_json::Value) -> Result<(), BoxError> {
        self.progress = serde_json::from_value(state.clone())?;
        Ok(())
    }

    fn next_epoch(&mut self) -> Result<Self::Epoch, BoxError> {
        let items = self.shard.indices(&self.progress)?;
        self.progress = EpochProgress::new(self.progress.epoch + 1);
        Ok(items.into_iter())
    }
}

fn rank_pipeline(shard: ElasticShard, start: &EpochProgress, ckpt: &Checkpoint) -> CheckpointedPipeline<usize> {
    let src = ckpt.input(RankSource { shard, progress: start.clone() }).unwrap();
    let p = PipelineBuilder::new()
        .source(src)
        .pipe(ckpt.map("load", |i: usize| Ok::<_, BoxError>(i)).concurrency(2))
        .sink(2)
        .build(BuildOptions { num_threads: 2, queue_capacity: 4, ..BuildOptions::default() })
        .unwrap();
    CheckpointedPipeline::new(p, ckpt.clone())
}

/// The positions of its share a rank's pipeline state says it delivered.
fn local_delivered(state: &PipelineState, share_len: u64) -> Spans {
    match state.inputs[0].epochs.first() {
        Some(e) => Spans::from_range(0, e.watermark).union(&Spans::from_pairs(e.delivered.iter().copied()).unwrap()),
        None if state.inputs[0].next_epoch == 0 => Spans::new(), // never started
        None => Spans::from_range(0, share_len),                 // the epoch is complete
    }
}

#[test]
fn ranks_pipelines_resume_at_another_world_size() {
    let mut rng = Rng(11);
    for case in 0..40 {
        let n = 20 + rng.below(100);
        let order = CanonicalOrder::new(n as usize, 4, case, true).unwrap();
        let w = 1 + rng.below(4) as usize;
        let start = EpochProgress::new(0);
        let mut got = Vec::new();
        let mut local = Vec::new();
        for shard in shards(order, w, Remainder::Drop) {
            let ckpt = Checkpoint::new();
            let p = rank_pipeline(shard, &start, &ckpt);
            let take = rng.below(n / w as u64 + 1) as usize;
            got.extend(p.iter().take(take).map(Result::unwrap));
            let state = PipelineState::from_json(&p.state().unwrap().to_json().unwrap()).unwrap();
            local.push((shard.shard().rank, local_delivered(&state, shard.share(&start).unwrap().len() as u64)));
        }
        let merged = shards(order, w, Remainder::Drop)[0].merge(&start, &local).unwrap();
        let w2 = 1 + rng.below(4) as usize;
        for shard in shards(order, w2, Remainder::Drop) {
            let p = rank_pipeline(shard, &merged, &Checkpoint::new());
            got.extend(p.iter().map(Result::unwrap));
        }
        let mut sorted = got.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), got.len(), "case {case}: a sample delivered twice");
        let full: Vec<usize> = order.try_order(0).unwrap();
        assert!(full.len() - got.len() < w2.max(w), "case {case}: {} of {} delivered", got.len(), full.len());
    }
}
