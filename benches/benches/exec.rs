//! spdl-exec per-item overhead: a plain `Iterator::map` chain against 1- and 3-stage
//! pipelines of trivial functions, blocking and async, concurrency 1 and 4, 10^5 items.
//!
//! Each pipeline runs twice: with the default queues (capacity 8, sink 8) and with deep
//! queues (capacity 64), since the cost of a trivial stage is the thread wake-ups between
//! stages, and a deeper queue moves more items per wake-up.
//!
//! Per item per stage = (time per iteration / 10^5) / stages; see docs/benchmarks.md. Run:
//! `cargo bench -p spdl-benches --bench exec -- --warm-up-time 1 --measurement-time 3`

use std::convert::Infallible;
use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use spdl_exec::{BuildOptions, PipelineBuilder, Stage};

const ITEMS: u64 = 100_000;

fn step(x: u64) -> u64 {
    black_box(x).wrapping_mul(3).wrapping_add(1)
}

fn blocking(name: &str, concurrency: usize) -> Stage<u64, u64> {
    Stage::map(name, |x: u64| Ok::<_, Infallible>(step(x))).concurrency(concurrency)
}

fn asynchronous(name: &str, concurrency: usize) -> Stage<u64, u64> {
    Stage::map_async(name, |x: u64| async move { Ok::<_, Infallible>(step(x)) }).concurrency(concurrency)
}

fn run(stages: usize, make: fn(&str, usize) -> Stage<u64, u64>, concurrency: usize, capacity: usize) -> u64 {
    let mut b = PipelineBuilder::new().source(0..ITEMS).pipe(make("s0", concurrency));
    for i in 1..stages {
        b = b.pipe(make(&format!("s{i}"), concurrency));
    }
    let pipeline = b
        .sink(capacity)
        .build(BuildOptions { queue_capacity: capacity, ..BuildOptions::default() })
        .expect("valid pipeline");
    let mut sum = 0u64;
    let mut n = 0;
    for x in pipeline.iter() {
        sum = sum.wrapping_add(x.expect("no failures"));
        n += 1;
    }
    assert_eq!(n, ITEMS);
    sum
}

fn per_item_overhead(c: &mut Criterion) {
    let mut g = c.benchmark_group("exec_per_item");
    g.sample_size(10);
    g.throughput(Throughput::Elements(ITEMS));
    g.bench_function("iter_map_3", |b| {
        b.iter(|| (0..ITEMS).map(step).map(step).map(step).fold(0u64, u64::wrapping_add));
    });
    for capacity in [8usize, 64] {
        for stages in [1usize, 3] {
            for concurrency in [1usize, 4] {
                let id = format!("{stages}stage_c{concurrency}_q{capacity}");
                g.bench_with_input(BenchmarkId::new("blocking", &id), &(), |b, ()| {
                    b.iter(|| run(stages, blocking, concurrency, capacity));
                });
                g.bench_with_input(BenchmarkId::new("async", &id), &(), |b, ()| {
                    b.iter(|| run(stages, asynchronous, concurrency, capacity));
                });
            }
        }
    }
    g.finish();
}

criterion_group!(benches, per_item_overhead);
criterion_main!(benches);
