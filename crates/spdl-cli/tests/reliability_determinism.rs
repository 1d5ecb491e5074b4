//! Determinism and resume through real pipelines (spdl-source samplers → spdl-exec → spdl-io).
//!
//! - The same seed gives the same sample order and the same batches (bit-identical decoded images, random
//!   crops included) on every run, whatever the thread count and stage concurrency, with `OutputOrder::Input`.
//! - A training loop that saves the sampler state of the last item it consumed, drops the pipeline (losing
//!   whatever was prefetched) and resumes from that state at random points, across epochs and on every rank
//!   of a sharded run, sees exactly the uninterrupted sequence: every epoch's union over ranks is the whole
//!   dataset, with no duplicates.

mod reliability_util;

use std::collections::BTreeSet;
use std::convert::Infallible;
use std::time::Duration;

use reliability_util::watchdog;
use spdl_buffer::system_allocator;
use spdl_exec::{BuildOptions, OutputOrder, PipelineBuilder, Stage};
use spdl_io::image::{BatchDecoder, BatchOptions, Transform};
use spdl_source::sampler::{Remainder, Sampler, SamplerIter, SamplerState, ShardedSampler, ShuffledSampler};

fn mix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A pseudo-random delay (0–300 µs) so that concurrent calls finish out of order.
fn jitter(x: u64) -> Duration {
    Duration::from_micros(mix(x) % 300)
}

/// Index batches of one epoch of `sampler` through a pipeline with the given parallelism.
fn index_batches(sampler: ShuffledSampler, threads: usize, concurrency: usize) -> Vec<Vec<(usize, u64)>> {
    let n = sampler.len();
    let pipeline = PipelineBuilder::new()
        .source(SamplerIter::new(sampler).take(n))
        .pipe(
            Stage::map("load", |i: usize| {
                std::thread::sleep(jitter(i as u64));
                Ok::<_, Infallible>((i, mix(i as u64)))
            })
            .concurrency(concurrency)
            .order(OutputOrder::Input),
        )
        .pipe(
            Stage::map_async("augment", |(i, v): (usize, u64)| async move {
                tokio::time::sleep(jitter(v)).await;
                Ok::<_, Infallible>((i, v ^ 1))
            })
            .concurrency(concurrency * 2)
            .order(OutputOrder::Input),
        )
        .aggregate(32)
        .sink(2)
        .build(BuildOptions { num_threads: threads, ..BuildOptions::default() })
        .expect("build");
    pipeline.iter().map(|b| b.expect("batch")).collect()
}

#[test]
fn the_same_seed_gives_the_same_batches_at_any_thread_count() {
    watchdog(600, || {
        let sampler = ShuffledSampler::new(1000, 42);
        let want: Vec<Vec<(usize, u64)>> =
            sampler.order(0).chunks(32).map(|c| c.iter().map(|&i| (i, mix(i as u64) ^ 1)).collect()).collect();
        for (threads, concurrency) in [(1, 1), (2, 2), (4, 4), (8, 3), (3, 8)] {
            let got = index_batches(sampler, threads, concurrency);
            assert!(got == want, "threads {threads}, concurrency {concurrency}: other batches");
        }
        let other = index_batches(ShuffledSampler::new(1000, 43), 2, 2);
        assert!(other != want, "another seed gives another order");
    });
}

#[test]
fn decoded_batches_are_bit_identical_at_any_thread_count() {
    watchdog(600, || {
        let dir = tempfile::tempdir().expect("tempdir");
        let paths = spdl_io::synth::write_dataset(dir.path(), 64, 5, 4).expect("images");
        let run = |threads: usize, decode_threads: Option<usize>, concurrency: usize| {
            let paths = paths.clone();
            let decoder = BatchDecoder::new(
                BatchOptions {
                    // A random crop: its randomness must come from the seed, not from timing.
                    transform: Transform::random_resized_crop(64, 64, 7),
                    threads: decode_threads,
                    ..BatchOptions::default()
                },
                system_allocator(),
            )
            .expect("options");
            let pipeline = PipelineBuilder::new()
                .source(SamplerIter::new(ShuffledSampler::new(paths.len(), 11)).take(paths.len()))
                .pipe(
                    Stage::map_async("read", move |i: usize| {
                        let path = paths.get(i).cloned().unwrap_or_default();
                        async move { tokio::fs::read(&path).await.map(|b| (path.display().to_string(), b)) }
                    })
                    .concurrency(8)
                    .order(OutputOrder::Input),
                )
                .aggregate(16)
                .pipe(
                    Stage::map("decode", move |batch: Vec<(String, Vec<u8>)>| {
                        decoder.decode(&batch).map(|o| o.buffer.as_bytes().to_vec())
                    })
                    .concurrency(concurrency)
                    .order(OutputOrder::Input),
                )
                .sink(2)
                .build(BuildOptions { num_threads: threads, ..BuildOptions::default() })
                .expect("build");
            pipeline.iter().map(|b| b.expect("batch")).collect::<Vec<Vec<u8>>>()
        };
        let want = run(1, Some(1), 1);
        assert_eq!(want.len(), 4);
        for (threads, decode_threads, concurrency) in [(2, Some(1), 2), (4, None, 3), (2, Some(2), 1)] {
            let got = run(threads, decode_threads, concurrency);
            assert!(got == want, "threads {threads}, decode threads {decode_threads:?}, concurrency {concurrency}");
        }
    });
}

/// Yields each index with the sampler state *after* it: what a training loop saves in its checkpoint for
/// the last item it consumed.
struct WithState<S>(SamplerIter<S>);

impl<S: Sampler> Iterator for WithState<S> {
    type Item = (usize, SamplerState);
    fn next(&mut self) -> Option<Self::Item> {
        let i = self.0.next()?;
        Some((i, self.0.state()))
    }
}

/// Consumes `total` items of `sampler` through a prefetching pipeline, interrupted at random points: each
/// time it saves the state (as JSON, like a checkpoint), drops the pipeline and resumes from the state.
fn interrupted_run(sampler: ShardedSampler<ShuffledSampler>, total: usize, salt: u64) -> (Vec<usize>, usize) {
    let mut consumed = Vec::with_capacity(total);
    let mut checkpoint: Option<String> = None;
    let mut resumes = 0;
    while consumed.len() < total {
        let iter = match &checkpoint {
            None => SamplerIter::new(sampler.clone()),
            Some(json) => {
                let state: SamplerState = serde_json::from_str(json).expect("checkpoint");
                SamplerIter::restore(sampler.clone(), &state).expect("restore")
            }
        };
        let pipeline = PipelineBuilder::new()
            .source(WithState(iter))
            .pipe(
                Stage::map("load", |(i, s): (usize, SamplerState)| {
                    std::thread::sleep(jitter(i as u64) / 4);
                    Ok::<_, Infallible>((i, s))
                })
                .concurrency(3)
                .order(OutputOrder::Input),
            )
            .pipe(
                Stage::map_async("augment", |x: (usize, SamplerState)| async move { Ok::<_, Infallible>(x) })
                    .concurrency(4)
                    .order(OutputOrder::Input),
            )
            .sink(8)
            .build(BuildOptions { num_threads: 3, queue_capacity: 8, ..BuildOptions::default() })
            .expect("build");
        let step = 1 + (mix(salt ^ resumes as u64) % (2 * sampler.len() as u64 / 3)) as usize;
        let step = step.min(total - consumed.len());
        let mut last = None;
        for r in pipeline.iter().take(step) {
            let (i, state) = r.expect("item");
            consumed.push(i);
            last = Some(state);
        }
        // The pipeline had prefetched more: dropping it loses them, the checkpoint does not.
        drop(pipeline);
        checkpoint = last.map(|s| serde_json::to_string(&s).expect("serialize")).or(checkpoint);
        resumes += 1;
    }
    (consumed, resumes)
}

#[test]
fn resume_at_random_points_across_epochs_and_shards_loses_and_repeats_nothing() {
    watchdog(600, || {
        const N: usize = 600;
        const EPOCHS: usize = 3;
        let mut total_resumes = 0;
        for world in [1, 2, 3, 4] {
            let mut per_rank = Vec::new();
            for rank in 0..world {
                let sampler =
                    ShardedSampler::new(ShuffledSampler::new(N, 2024), rank, world, Remainder::Drop).expect("shard");
                let len = sampler.len();
                let uninterrupted: Vec<usize> = (0..EPOCHS as u64).flat_map(|e| sampler.order(e)).collect();
                let (got, resumes) = interrupted_run(sampler, EPOCHS * len, (world * 100 + rank) as u64);
                assert_eq!(got, uninterrupted, "world {world}, rank {rank}: {resumes} resumes changed the sequence");
                total_resumes += resumes;
                per_rank.push((len, got));
            }
            for epoch in 0..EPOCHS {
                let mut seen = BTreeSet::new();
                let mut count = 0;
                for (len, got) in &per_rank {
                    for &i in &got[epoch * len..(epoch + 1) * len] {
                        seen.insert(i);
                        count += 1;
                    }
                }
                assert_eq!(count, seen.len(), "world {world}, epoch {epoch}: an item was seen twice");
                assert_eq!(seen, (0..N).collect(), "world {world}, epoch {epoch}: the ranks together miss items");
            }
        }
        println!("{total_resumes} interruptions and resumes over 10 ranks x {EPOCHS} epochs: sequences identical");
    });
}
