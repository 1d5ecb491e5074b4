//! start / stop / drop, next_timeout, stop from another thread.

mod common;

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use common::watchdog;
use spdl_exec::{BuildOptions, PipelineBuilder, PipelineError, Stage};

#[test]
fn stop_mid_iteration_ends_iteration_and_is_idempotent() {
    watchdog(120, || {
        let pipeline = PipelineBuilder::new()
            .source(0u64..)
            .pipe(Stage::map("b", |x: u64| Ok::<_, Infallible>(x)).concurrency(2))
            .pipe(Stage::map_async("a", |x: u64| async move { Ok::<_, Infallible>(x) }))
            .sink(2)
            .build(BuildOptions::default())
            .expect("build");
        let mut it = pipeline.iter();
        for _ in 0..5 {
            assert!(matches!(it.next(), Some(Ok(_))));
        }
        pipeline.stop();
        pipeline.stop();
        assert!(it.next().is_none());
        assert!(pipeline.iter().next().is_none());
        assert!(pipeline.start().is_ok());
    });
}

#[test]
fn drop_mid_iteration_does_not_hang() {
    watchdog(120, || {
        for _ in 0..20 {
            let pipeline = PipelineBuilder::new()
                .source(0u64..)
                .pipe(
                    Stage::map("slow", |x: u64| {
                        std::thread::sleep(Duration::from_millis(1));
                        Ok::<_, Infallible>(x)
                    })
                    .concurrency(3),
                )
                .pipe(
                    Stage::map_async("sleepy", |x: u64| async move {
                        tokio::time::sleep(Duration::from_millis(1)).await;
                        Ok::<_, Infallible>(x)
                    })
                    .concurrency(3),
                )
                .aggregate(3)
                .sink(2)
                .build(BuildOptions::default())
                .expect("build");
            let first = pipeline.iter().next();
            assert!(matches!(first, Some(Ok(v)) if v.len() == 3));
            drop(pipeline);
        }
    });
}

#[test]
fn a_built_pipeline_that_never_starts_drops_cleanly() {
    watchdog(60, || {
        let pipeline = PipelineBuilder::new().source(0..10u8).sink(1).build(BuildOptions::default()).expect("build");
        let stats = pipeline.stats();
        assert_eq!(stats.elapsed, Duration::ZERO);
        assert!(stats.stages.iter().all(|s| s.items_in == 0 && s.items_out == 0));
        drop(pipeline);
    });
}

#[test]
fn next_timeout_times_out_then_continues() {
    watchdog(120, || {
        let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
        let release_rx = std::sync::Mutex::new(release_rx);
        let pipeline = PipelineBuilder::new()
            .source(0..3u32)
            .pipe(Stage::map("gate", move |x: u32| {
                if x == 0 {
                    // Waits for the test to let the first item through.
                    let rx = release_rx.lock().map_err(|_| "poisoned")?;
                    rx.recv_timeout(Duration::from_secs(60)).map_err(|_| "never released")?;
                }
                Ok::<_, &str>(x)
            }))
            .sink(1)
            .build(BuildOptions::default())
            .expect("build");
        let mut it = pipeline.iter();
        match it.next_timeout(Duration::from_millis(20)) {
            Some(Err(e @ PipelineError::Timeout { .. })) => assert!(e.is_timeout()),
            other => panic!("expected a timeout, got {other:?}"),
        }
        release_tx.send(()).expect("release");
        let rest: Vec<u32> =
            std::iter::from_fn(|| it.next_timeout(Duration::from_secs(60))).map(|r| r.expect("item")).collect();
        assert_eq!(rest, vec![0, 1, 2]);
    });
}

#[test]
fn stop_from_another_thread_wakes_a_blocked_consumer() {
    watchdog(120, || {
        let pipeline = Arc::new(
            PipelineBuilder::new()
                .source(0u64..)
                .pipe(Stage::map("slow", |x: u64| {
                    std::thread::sleep(Duration::from_millis(200));
                    Ok::<_, Infallible>(x)
                }))
                .sink(1)
                .build(BuildOptions::default())
                .expect("build"),
        );
        pipeline.start().expect("start");
        let p2 = Arc::clone(&pipeline);
        let consumer = std::thread::spawn(move || p2.iter().count());
        std::thread::sleep(Duration::from_millis(50));
        pipeline.stop();
        let n = consumer.join().expect("consumer");
        assert!(n < 100, "{n}");
    });
}

#[test]
fn a_panicking_source_ends_with_an_error() {
    watchdog(60, || {
        let pipeline = PipelineBuilder::new()
            .source((0..10u32).inspect(|x| assert!(*x != 5, "listing failed at {x}")))
            .sink(1)
            .build(BuildOptions::default())
            .expect("build");
        let results: Vec<_> = pipeline.iter().collect();
        assert_eq!(results.len(), 6);
        match results.last() {
            Some(Err(PipelineError::SourcePanicked { produced, message })) => {
                assert_eq!(*produced, 5);
                assert!(message.contains("listing failed at 5"));
            }
            other => panic!("unexpected {other:?}"),
        }
    });
}
