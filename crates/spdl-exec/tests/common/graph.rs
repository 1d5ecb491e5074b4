//! The graph shared by the graph tests: two branches (one fans out, filters and fails items) and a pipeline
//! with every kind of node.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use spdl_exec::{
    Branch, BuildOptions, Inputs, MergeOptions, MergePolicy, OutputOrder, Pipeline, PipelineBuilder, Stage,
};

use super::mix;

pub fn delay(x: u64) {
    std::thread::sleep(Duration::from_micros(mix(x) % 300));
}

pub fn branches() -> Vec<Branch<u64, u64>> {
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
pub fn big_graph(counter: Arc<AtomicU64>) -> Pipeline<u64> {
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
        .build(BuildOptions { num_threads: 4, ..BuildOptions::default() })
        .unwrap()
}
