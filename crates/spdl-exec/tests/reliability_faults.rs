//! Faulty stages: one that panics, one that fails at random, one that runs past its deadline. Each failure
//! is counted and reported with its stage; with a budget the run ends with a `PipelineError` that names the
//! stage; without one every item is either delivered or counted as failed, exactly once. Stopping while a
//! stage is busy returns promptly.

mod common;

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::{mix, watchdog};
use spdl_exec::{BuildOptions, FailureBudget, OutputOrder, PipelineBuilder, PipelineError, Stage};

/// The stage's deadline in the timeout tests, and how long a stuck call sleeps (far past it).
const DEADLINE: Duration = Duration::from_millis(50);
const STUCK: Duration = Duration::from_secs(3600);

/// An error like a real decode error: it names the item and chains the cause.
#[derive(Debug, thiserror::Error)]
#[error("item {0}: cannot decode")]
struct DecodeError(u64, #[source] std::io::Error);

fn drain<T: Send + 'static>(p: &spdl_exec::Pipeline<T>) -> (Vec<T>, Option<PipelineError>) {
    let mut ok = Vec::new();
    let mut err = None;
    for r in p {
        match r {
            Ok(x) => ok.push(x),
            Err(e) => err = Some(e),
        }
    }
    (ok, err)
}

#[test]
fn a_stage_that_always_panics_ends_the_run_naming_the_stage() {
    watchdog(120, || {
        for blocking in [true, false] {
            let stage = if blocking {
                Stage::map("explode", |x: u64| -> Result<u64, Infallible> { panic!("decoder bug on item {x}") })
            } else {
                Stage::map_async("explode", |x: u64| async move {
                    if x < u64::MAX {
                        panic!("decoder bug on item {x}");
                    }
                    Ok::<_, Infallible>(x)
                })
            };
            let pipeline = PipelineBuilder::new()
                .source(0..1_000_000u64)
                .pipe(stage.concurrency(3).failure_budget(FailureBudget::Count(10)))
                .sink(2)
                .build(BuildOptions { num_threads: 2, ..BuildOptions::default() })
                .expect("build");
            let (ok, err) = drain(&pipeline);
            assert!(ok.is_empty());
            match err {
                Some(PipelineError::StageBudgetExceeded { stage, failed, causes, .. }) => {
                    assert_eq!(stage, "explode");
                    assert_eq!(failed, 11);
                    assert!(causes.iter().all(|c| c.stage == "explode" && c.cause.contains("decoder bug on item")));
                }
                other => panic!("blocking={blocking}: unexpected end {other:?}"),
            }
            let stats = pipeline.stats();
            let s = stats.stage("explode").expect("stage stats");
            assert!(s.items_failed >= 11 && s.items_out == 0, "{stats}");
        }
    });
}

#[test]
fn random_errors_are_counted_exactly_and_every_item_is_accounted_for() {
    watchdog(300, || {
        const N: u64 = 20_000;
        let fails = |x: u64| mix(x ^ 0xBAD).is_multiple_of(20); // ~5%
        let pipeline = PipelineBuilder::new()
            .source(0..N)
            .pipe(
                Stage::map("flaky", move |x: u64| {
                    if fails(x) { Err(DecodeError(x, std::io::Error::other("corrupt"))) } else { Ok(x) }
                })
                .concurrency(4)
                .order(OutputOrder::Input),
            )
            .sink(4)
            .build(BuildOptions { num_threads: 3, ..BuildOptions::default() })
            .expect("build");
        let (ok, err) = drain(&pipeline);
        assert!(err.is_none(), "{err:?}");
        let want: Vec<u64> = (0..N).filter(|&x| !fails(x)).collect();
        assert_eq!(ok, want, "every good item, once, in input order");
        let failed = pipeline.stats().stage("flaky").map(|s| s.items_failed);
        assert_eq!(failed, Some(N - want.len() as u64));
    });
}

#[test]
fn random_errors_past_a_fraction_budget_end_the_run_naming_the_stage() {
    watchdog(300, || {
        let fails = |x: u64| mix(x ^ 0xF00D).is_multiple_of(10); // ~10%, over a 2% budget
        let pipeline = PipelineBuilder::new()
            .source(0..1_000_000u64)
            .pipe(Stage::map("fine", |x: u64| Ok::<_, Infallible>(x)).concurrency(2))
            .pipe(
                Stage::map_async("flaky", move |x: u64| async move {
                    if fails(x) { Err(DecodeError(x, std::io::Error::other("bad checksum"))) } else { Ok(x) }
                })
                .concurrency(4)
                .failure_budget(FailureBudget::Fraction(0.02)),
            )
            .sink(2)
            .build(BuildOptions::default())
            .expect("build");
        let (ok, err) = drain(&pipeline);
        let err = err.expect("the budget ends the run");
        assert_eq!(err.stage(), Some("flaky"));
        let msg = err.to_string();
        assert!(msg.contains("flaky") && msg.contains("bad checksum") && msg.contains("item "), "{msg}");
        assert!(ok.len() < 10_000, "stopped early: {} items came through", ok.len());
    });
}

/// An async stage with a deadline: calls that take longer fail with a timeout error.
fn with_deadline(name: &str, stuck: impl Fn(u64) -> bool + Send + Sync + 'static) -> Stage<u64, u64> {
    let stuck = Arc::new(stuck);
    Stage::map_async(name, move |x: u64| {
        let stuck = Arc::clone(&stuck);
        async move {
            let work = async {
                if stuck(x) {
                    tokio::time::sleep(STUCK).await;
                }
                x
            };
            tokio::time::timeout(DEADLINE, work)
                .await
                .map_err(|_| format!("item {x}: no answer within the {DEADLINE:?} deadline"))
        }
    })
}

#[test]
fn calls_past_their_deadline_are_counted_and_the_run_goes_on() {
    watchdog(300, || {
        const N: u64 = 2_000;
        let stuck = |x: u64| x % 50 == 7;
        let t = Instant::now();
        let pipeline = PipelineBuilder::new()
            .source(0..N)
            .pipe(with_deadline("fetch", stuck).concurrency(16).order(OutputOrder::Input))
            .sink(4)
            .build(BuildOptions::default())
            .expect("build");
        let (ok, err) = drain(&pipeline);
        assert!(err.is_none(), "{err:?}");
        assert_eq!(ok, (0..N).filter(|&x| !stuck(x)).collect::<Vec<_>>());
        assert_eq!(pipeline.stats().stage("fetch").map(|s| s.items_failed), Some(N / 50));
        // 40 stuck calls of an hour each cost 40 deadlines, not 40 hours.
        assert!(t.elapsed() < Duration::from_secs(120), "{:?}", t.elapsed());
    });
}

#[test]
fn calls_past_their_deadline_exhaust_the_budget_and_name_the_stage() {
    watchdog(300, || {
        let t = Instant::now();
        let pipeline = PipelineBuilder::new()
            .source(0..1_000_000u64)
            .pipe(with_deadline("fetch", |x| x % 3 == 0).concurrency(8).failure_budget(FailureBudget::Count(20)))
            .sink(2)
            .build(BuildOptions::default())
            .expect("build");
        let (_, err) = drain(&pipeline);
        match err {
            Some(PipelineError::StageBudgetExceeded { stage, failed, causes, .. }) => {
                assert_eq!((stage.as_str(), failed), ("fetch", 21));
                assert!(causes[0].cause.contains("deadline"), "{causes:?}");
            }
            other => panic!("unexpected end {other:?}"),
        }
        assert!(t.elapsed() < Duration::from_secs(120), "{:?}", t.elapsed());
    });
}

#[test]
fn panics_errors_and_timeouts_together_lose_and_duplicate_nothing() {
    watchdog(300, || {
        const N: u64 = 5_000;
        let panics = |x: u64| mix(x ^ 1).is_multiple_of(17);
        let errors = |x: u64| mix(x ^ 2).is_multiple_of(13);
        let stuck = |x: u64| mix(x ^ 3).is_multiple_of(29);
        let pipeline = PipelineBuilder::new()
            .source(0..N)
            .pipe(
                Stage::map("panicky", move |x: u64| {
                    assert!(!panics(x), "bug on {x}");
                    Ok::<_, Infallible>(x)
                })
                .concurrency(3),
            )
            .pipe(
                Stage::map_async("flaky", move |x: u64| async move {
                    if errors(x) { Err(format!("item {x}: refused")) } else { Ok(x) }
                })
                .concurrency(5),
            )
            .pipe(with_deadline("slow", stuck).concurrency(32))
            .aggregate(7)
            .disaggregate()
            .sink(4)
            .build(BuildOptions { num_threads: 3, queue_capacity: 4, ..BuildOptions::default() })
            .expect("build");
        let (mut ok, err) = drain(&pipeline);
        assert!(err.is_none(), "{err:?}");
        ok.sort_unstable();
        let before = ok.len();
        ok.dedup();
        assert_eq!(before, ok.len(), "an item came out twice");
        let want: Vec<u64> = (0..N).filter(|&x| !panics(x) && !errors(x) && !stuck(x)).collect();
        assert_eq!(ok, want);
        let stats = pipeline.stats();
        let failed = |s: &str| stats.stage(s).map_or(0, |s| s.items_failed);
        assert_eq!(failed("panicky"), (0..N).filter(|&x| panics(x)).count() as u64);
        assert_eq!(failed("flaky"), (0..N).filter(|&x| !panics(x) && errors(x)).count() as u64);
        assert_eq!(failed("slow"), (0..N).filter(|&x| !panics(x) && !errors(x) && stuck(x)).count() as u64);
    });
}

#[test]
fn the_pipeline_budget_names_the_stage_that_crossed_it() {
    watchdog(120, || {
        let pipeline = PipelineBuilder::new()
            .source(0..100_000u64)
            .pipe(Stage::map("rarely", |x: u64| if x % 100 == 1 { Err("rare") } else { Ok(x) }))
            .pipe(Stage::map("often", |x: u64| if x % 10 == 3 { Err("often") } else { Ok(x) }))
            .sink(2)
            .build(BuildOptions { failure_budget: FailureBudget::Count(50), ..BuildOptions::default() })
            .expect("build");
        let (_, err) = drain(&pipeline);
        match err {
            Some(PipelineError::PipelineBudgetExceeded { failed, stage, .. }) => {
                assert_eq!(failed, 51);
                assert!(stage == "often" || stage == "rarely");
            }
            other => panic!("unexpected end {other:?}"),
        }
    });
}

#[test]
fn stop_during_an_endless_async_call_returns_promptly() {
    watchdog(120, || {
        let pipeline = PipelineBuilder::new()
            .source(0u64..)
            .pipe(
                Stage::map_async("hang", |x: u64| async move {
                    if x > 0 {
                        tokio::time::sleep(STUCK).await;
                    }
                    Ok::<_, Infallible>(x)
                })
                .concurrency(4),
            )
            .sink(1)
            .build(BuildOptions::default())
            .expect("build");
        let first = pipeline.iter().next();
        assert!(matches!(first, Some(Ok(0))));
        let mut it = pipeline.iter();
        assert!(matches!(it.next_timeout(Duration::from_millis(100)), Some(Err(e)) if e.is_timeout()));
        let t = Instant::now();
        pipeline.stop();
        // Pending async calls are dropped, not awaited.
        assert!(t.elapsed() < Duration::from_secs(5), "stop took {:?}", t.elapsed());
        assert!(it.next().is_none());
    });
}

#[test]
fn stop_during_a_long_blocking_call_waits_for_that_call_only() {
    watchdog(120, || {
        let started = Arc::new(AtomicU64::new(0));
        let calls = Arc::clone(&started);
        let pipeline = PipelineBuilder::new()
            .source(0u64..)
            .pipe(
                Stage::map("busy", move |x: u64| {
                    calls.fetch_add(1, Ordering::SeqCst);
                    if x > 0 {
                        // A blocking call cannot be interrupted: stop waits for it to return.
                        std::thread::sleep(Duration::from_millis(1500));
                    }
                    Ok::<_, Infallible>(x)
                })
                .concurrency(2),
            )
            .sink(1)
            .build(BuildOptions { num_threads: 2, ..BuildOptions::default() })
            .expect("build");
        assert!(matches!(pipeline.iter().next(), Some(Ok(0))));
        let t = Instant::now();
        pipeline.stop();
        let took = t.elapsed();
        assert!(took < Duration::from_secs(10), "stop took {took:?}");
        let n = started.load(Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(200));
        assert_eq!(started.load(Ordering::SeqCst), n, "no call starts after stop");
    });
}
