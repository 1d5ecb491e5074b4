//! Every thread a pipeline starts is joined when it is dropped (its own test binary, so
//! that no other test's threads change the count).

mod common;

use std::convert::Infallible;
use std::time::Duration;

use common::{thread_count, threads_back_to, watchdog};
use spdl_exec::{BuildOptions, PipelineBuilder, Stage};

#[test]
fn thread_count_returns_to_baseline_after_200_cycles() {
    watchdog(300, || {
        let baseline = thread_count();
        for cycle in 0..200u64 {
            let pipeline = PipelineBuilder::new()
                .source(0u64..)
                .pipe(Stage::map("b", |x: u64| Ok::<_, Infallible>(x + 1)).concurrency(2))
                .pipe(
                    Stage::map_async("a", |x: u64| async move {
                        if x.is_multiple_of(2) {
                            tokio::time::sleep(Duration::from_micros(50)).await;
                        }
                        Ok::<_, Infallible>(x)
                    })
                    .concurrency(2),
                )
                .pipe(
                    Stage::map("ordered", |x: u64| Ok::<_, Infallible>(x))
                        .concurrency(2)
                        .order(spdl_exec::OutputOrder::Input),
                )
                .sink(2)
                .build(BuildOptions { num_threads: 3, ..Default::default() })
                .expect("build");
            let n = pipeline.iter().take((cycle % 5) as usize + 1).count();
            assert!(n >= 1);
            assert!(thread_count() > baseline);
            drop(pipeline);
            // `drop` joined every thread.
            assert_eq!(threads_back_to(baseline, Duration::from_secs(10)), baseline, "cycle {cycle}");
        }
    });
}
