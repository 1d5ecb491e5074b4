//! spdl-exec graph overhead: a 3-input weighted merge, then a 2-way route, then a trivial
//! stage, against the same chain without the merge and the route (a source and 3 trivial
//! stages), 10^5 items, so that the difference is what the graph's nodes cost per item.
//!
//! Per item across the graph = time per iteration / 10^5; see docs/benchmarks.md. Run:
//! `cargo bench -p spdl-benches --bench graph -- --warm-up-time 1 --measurement-time 3`

use std::convert::Infallible;
use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use spdl_exec::{Branch, BuildOptions, MergeOptions, MergePolicy, OutputOrder, PipelineBuilder, Stage};

const ITEMS: u64 = 100_000;

fn step(x: u64) -> u64 {
    black_box(x).wrapping_mul(3).wrapping_add(1)
}

fn trivial(name: &str) -> Stage<u64, u64> {
    Stage::map(name, |x: u64| Ok::<_, Infallible>(step(x)))
}

fn drain(pipeline: &spdl_exec::Pipeline<u64>) -> u64 {
    let mut n = 0;
    for x in pipeline.iter() {
        black_box(x.expect("no failures"));
        n += 1;
    }
    n
}

fn graph(order: OutputOrder, capacity: usize) -> u64 {
    let third = ITEMS / 3;
    let inputs = (0..3)
        .map(|i| {
            let len = if i == 2 { ITEMS - 2 * third } else { third };
            PipelineBuilder::new().source(i * third..i * third + len)
        })
        .collect();
    let branches = vec![Branch::new().pipe(trivial("even")), Branch::new().pipe(trivial("odd"))];
    let pipeline = PipelineBuilder::new()
        .merge(inputs, MergeOptions::new("mix").policy(MergePolicy::Weighted { weights: vec![1.0, 1.0, 1.0], seed: 1 }))
        .route("parity", |x: &u64| Ok::<_, Infallible>((x % 2) as usize), branches, order)
        .pipe(trivial("after"))
        .sink(capacity)
        .build(BuildOptions { queue_capacity: capacity, ..BuildOptions::default() })
        .expect("valid graph");
    let n = drain(&pipeline);
    assert_eq!(n, ITEMS);
    n
}

fn chain(capacity: usize) -> u64 {
    let pipeline = PipelineBuilder::new()
        .source(0..ITEMS)
        .pipe(trivial("a"))
        .pipe(trivial("b"))
        .pipe(trivial("c"))
        .sink(capacity)
        .build(BuildOptions { queue_capacity: capacity, ..BuildOptions::default() })
        .expect("valid chain");
    drain(&pipeline)
}

fn graph_overhead(c: &mut Criterion) {
    let mut g = c.benchmark_group("graph_per_item");
    g.sample_size(10);
    g.throughput(Throughput::Elements(ITEMS));
    for capacity in [32usize, 256] {
        g.bench_with_input(BenchmarkId::new("chain_3stages", capacity), &capacity, |b, &cap| b.iter(|| chain(cap)));
        g.bench_with_input(BenchmarkId::new("merge3_route2_completion", capacity), &capacity, |b, &cap| {
            b.iter(|| graph(OutputOrder::Completion, cap));
        });
        g.bench_with_input(BenchmarkId::new("merge3_route2_input_order", capacity), &capacity, |b, &cap| {
            b.iter(|| graph(OutputOrder::Input, cap));
        });
    }
    g.finish();
}

criterion_group!(benches, graph_overhead);
criterion_main!(benches);
