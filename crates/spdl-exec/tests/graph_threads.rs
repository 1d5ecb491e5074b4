//! Stopping a graph mid-run joins every thread of every branch and region (alone in its
//! test binary, so that other tests' threads do not count).

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use common::{mix, thread_count, watchdog};
use spdl_exec::{
    Branch, BuildOptions, Inputs, MergeOptions, MergePolicy, OutputOrder, Pipeline, PipelineBuilder, Stage,
};

fn opts() -> BuildOptions {
    BuildOptions { num_threads: 4, ..BuildOptions::default() }
}

fn delay(x: u64) {
    std::thread::sleep(Duration::from_micros(mix(x) % 300));
}

fn branches() -> Vec<Branch<u64, u64>> {
    vec![
        Branch::new().pipe(
            Stage::map("double", |x: u64| {
                delay(x);
                Ok::<_, std::io::Error>(x * 2)
            })
            .concurrency(4),
        ),
        Branch::new()
            .pipe(
                Stage::filter_map("odd_or_fail", |x: u64| {
                    delay(x);
                    if x.is_multiple_of(9) {
                        return Err(format!("{x} is a multiple of 9"));
                    }
                    Ok((!x.is_multiple_of(5)).then_some(x))
                })
                .concurrency(3),
            )
            .pipe(Stage::flat_map("twice", |x: u64| Ok::<_, std::io::Error>([x * 10, x * 10 + 1])).concurrency(2)),
    ]
}

/// A graph with every kind of node, for the lifecycle tests.
fn big_graph(counter: Arc<AtomicU64>) -> Pipeline<u64> {
    let c = Arc::clone(&counter);
    let a = PipelineBuilder::new().source(0..u64::MAX).pipe(
        Stage::map("a", move |x: u64| {
            c.fetch_add(1, Ordering::Relaxed);
            Ok::<_, std::io::Error>(x)
        })
        .concurrency(2),
    );
    let b = PipelineBuilder::new()
        .source(0..u64::MAX)
        .pipe(Stage::map_async("b", |x: u64| async move { Ok::<_, std::io::Error>(x) }));
    let body = Branch::new().pipe(Stage::map("r", |x: u64| Ok::<_, std::io::Error>(x + 1)).concurrency(2));
    PipelineBuilder::new()
        .merge(vec![a, b], MergeOptions::new("m").policy(MergePolicy::Weighted { weights: vec![1.0, 2.0], seed: 1 }))
        .route("route", |x: &u64| Ok::<_, std::io::Error>((x % 2) as usize), branches(), OutputOrder::Input)
        .region("region", 2, body)
        .through("t", |inputs: Inputs<u64>| Ok::<_, std::io::Error>(inputs.map(Ok::<_, std::io::Error>)))
        .sink(2)
        .build(opts())
        .unwrap()
}

#[test]
fn stopping_mid_graph_joins_every_thread_over_200_cycles() {
    watchdog(300, || {
        let baseline = thread_count();
        for cycle in 0..200u64 {
            let counter = Arc::new(AtomicU64::new(0));
            let p = big_graph(Arc::clone(&counter));
            let n = (cycle % 7) as usize;
            let got: Vec<_> = p.iter().take(n).collect();
            assert_eq!(got.len(), n);
            if cycle % 2 == 0 {
                p.stop();
            }
            drop(p);
            // Every thread of every branch and region is joined by then.
            assert_eq!(thread_count(), baseline, "cycle {cycle}");
        }
    });
}
