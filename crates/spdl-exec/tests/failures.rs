//! Failures: errors and panics fail one item; budgets stop the pipeline with a clear error;
//! every item is accounted for.

mod common;

use std::convert::Infallible;

use common::{mix, watchdog};
use spdl_exec::{BuildOptions, FailureBudget, OutputOrder, PipelineBuilder, PipelineError, Stage};

#[derive(Debug, thiserror::Error)]
#[error("cannot read item {0}")]
struct ReadError(u64, #[source] std::io::Error);

#[test]
fn errors_and_panics_fail_only_their_item() {
    watchdog(120, || {
        let pipeline = PipelineBuilder::new()
            .source(0..100u64)
            .pipe(
                Stage::map("read", |x: u64| {
                    if x % 10 == 1 {
                        return Err(ReadError(x, std::io::Error::other("disk on fire")));
                    }
                    Ok(x)
                })
                .log_failed_items(),
            )
            .pipe(Stage::map_async("decode", |x: u64| async move {
                assert!(x % 10 != 2, "decoder bug on {x}");
                Ok::<_, Infallible>(x)
            }))
            .sink(2)
            .build(BuildOptions::default())
            .expect("build");
        let got: Vec<u64> = pipeline.iter().map(|r| r.expect("item")).collect();
        assert_eq!(got.len(), 80);
        assert!(got.iter().all(|x| x % 10 != 1 && x % 10 != 2));
        let stats = pipeline.stats();
        assert_eq!(stats.stage("read").map(|s| s.items_failed), Some(10));
        assert_eq!(stats.stage("decode").map(|s| s.items_failed), Some(10));
    });
}

#[test]
fn count_budget_stops_the_stage_and_names_it() {
    watchdog(120, || {
        let pipeline = PipelineBuilder::new()
            .source(0..100_000u64)
            .pipe(
                Stage::map("decode", |x: u64| {
                    if x.is_multiple_of(3) { Err(ReadError(x, std::io::Error::other("corrupt header"))) } else { Ok(x) }
                })
                .concurrency(2)
                .failure_budget(FailureBudget::Count(5)),
            )
            .sink(2)
            .build(BuildOptions::default())
            .expect("build");
        let mut ok = 0;
        let mut error = None;
        for r in pipeline.iter() {
            match r {
                Ok(_) => ok += 1,
                Err(e) => error = Some(e),
            }
        }
        let err = error.expect("the budget error ends iteration");
        match &err {
            PipelineError::StageBudgetExceeded { stage, failed, causes, .. } => {
                assert_eq!(stage, "decode");
                assert_eq!(*failed, 6);
                assert_eq!(causes.len(), 5);
                assert!(causes[0].cause.contains("corrupt header"), "{causes:?}");
                assert!(causes[0].cause.contains("cannot read item"), "{causes:?}");
            }
            other => panic!("unexpected error {other}"),
        }
        let msg = err.to_string();
        assert!(msg.contains("decode") && msg.contains("6 of"), "{msg}");
        // It stopped early: far fewer than the 66,666 good items came through.
        assert!(ok < 1_000, "{ok} items came through");
        assert!(pipeline.iter().next().is_none(), "the error is returned once");
    });
}

#[test]
fn fraction_budget_waits_for_probation() {
    watchdog(120, || {
        // 40 of the first 60 fail (67%), then none: judged after 100 calls it is 40%.
        let lenient = PipelineBuilder::new()
            .source(0..1_000u64)
            .pipe(
                Stage::map("early", |x: u64| if x < 60 && !x.is_multiple_of(3) { Err("early failure") } else { Ok(x) })
                    .order(OutputOrder::Input)
                    .failure_budget(FailureBudget::Fraction(0.5)),
            )
            .sink(2)
            .build(BuildOptions::default())
            .expect("build");
        let results: Vec<_> = lenient.iter().collect();
        assert!(results.iter().all(Result::is_ok));
        assert_eq!(results.len(), 960);

        // 60 of the first 60 fail: 60% at call 100 exceeds 50%.
        let strict = PipelineBuilder::new()
            .source(0..1_000u64)
            .pipe(
                Stage::map("early", |x: u64| if x < 60 { Err("early failure") } else { Ok(x) })
                    .failure_budget(FailureBudget::Fraction(0.5)),
            )
            .sink(2)
            .build(BuildOptions::default())
            .expect("build");
        let last = strict.iter().last().expect("some result");
        let err = last.expect_err("budget exceeded");
        assert_eq!(err.stage(), Some("early"));
    });
}

#[test]
fn pipeline_budget_counts_all_stages() {
    watchdog(120, || {
        let pipeline = PipelineBuilder::new()
            .source(0..10_000u64)
            .pipe(Stage::map("a", |x: u64| if x % 50 == 1 { Err("a failed") } else { Ok(x) }))
            .pipe(Stage::map("b", |x: u64| if x % 50 == 2 { Err("b failed") } else { Ok(x) }))
            .sink(2)
            .build(BuildOptions { failure_budget: FailureBudget::Count(9), ..Default::default() })
            .expect("build");
        let err = pipeline.iter().find_map(Result::err).expect("pipeline budget error");
        match err {
            PipelineError::PipelineBudgetExceeded { failed, .. } => assert_eq!(failed, 10),
            other => panic!("unexpected error {other}"),
        }
    });
}

#[test]
fn every_item_is_accounted_for_under_concurrency_and_random_failures() {
    watchdog(300, || {
        const N: u64 = 20_000;
        let fails = |salt: u64, x: u64| mix(x ^ salt).is_multiple_of(10);
        let pipeline = PipelineBuilder::new()
            .source(0..N)
            .pipe(
                Stage::map(
                    "blocking-completion",
                    move |x: u64| {
                        if fails(1, x) { Err(format!("{x} failed")) } else { Ok(x) }
                    },
                )
                .concurrency(4),
            )
            .pipe(
                Stage::map_async("async", move |x: u64| async move {
                    if mix(x ^ 2).is_multiple_of(10) {
                        panic!("{x} panicked");
                    }
                    if x.is_multiple_of(97) {
                        tokio::task::yield_now().await;
                    }
                    Ok::<_, String>(x)
                })
                .concurrency(3),
            )
            .pipe(
                Stage::map("blocking-input", move |x: u64| if fails(3, x) { Err("third") } else { Ok(x) })
                    .concurrency(2)
                    .order(OutputOrder::Input),
            )
            .sink(4)
            .build(BuildOptions { num_threads: 3, queue_capacity: 4, ..Default::default() })
            .expect("build");
        let mut got: Vec<u64> = pipeline.iter().map(|r| r.expect("item")).collect();
        got.sort_unstable();
        let stats = pipeline.stats();
        let failed: u64 = stats.stages.iter().map(|s| s.items_failed).sum();
        assert_eq!(got.len() as u64 + failed, N, "{stats}");
        for s in &stats.stages[1..stats.stages.len() - 1] {
            assert_eq!(s.items_in, s.items_out + s.items_failed, "{}: {stats}", s.name);
        }
        let want: Vec<u64> =
            (0..N).filter(|&x| !fails(1, x) && !mix(x ^ 2).is_multiple_of(10) && !fails(3, x)).collect();
        assert_eq!(got, want);
    });
}
