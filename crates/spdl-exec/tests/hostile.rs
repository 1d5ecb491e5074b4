//! Hostile stage functions and arguments: a call that never returns (bounded stop, drop that
//! does not hang), lazy outputs of endless iterators and streams (made only as they are
//! read), and huge capacities and timeouts (no preallocation, no panic).

mod common;

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use futures::StreamExt;

use common::{settle, watchdog};
use spdl_exec::{BuildOptions, DROP_GRACE, OutputOrder, PipelineBuilder, Stage};

/// Threads of pipelines now alive in this process (named `spdl-exec-*`; the kernel keeps
/// 15 bytes of a name).
fn engine_threads() -> u64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else { return 0 };
    tasks
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|name| name.starts_with("spdl-exec"))
        .count() as u64
}

/// Tests of this file run one at a time: two of them count the engine's threads.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A stage whose call on item 1 blocks until the returned sender is dropped or sent to.
fn stuck_pipeline() -> (spdl_exec::Pipeline<u64>, mpsc::Sender<()>) {
    let (release, wait) = mpsc::channel::<()>();
    let wait = Arc::new(Mutex::new(wait));
    let pipeline = PipelineBuilder::new()
        .source(0u64..)
        .pipe(Stage::map("stuck", move |x: u64| {
            if x == 1 {
                let rx = wait.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                let _ = rx.recv();
            }
            Ok::<_, Infallible>(x)
        }))
        .sink(1)
        .build(BuildOptions { num_threads: 2, ..BuildOptions::default() })
        .expect("build");
    (pipeline, release)
}

#[test]
fn stop_timeout_returns_at_its_deadline_with_a_stuck_call_then_joins_once_it_returns() {
    watchdog(60, || {
        let _serial = serial();
        let (pipeline, release) = stuck_pipeline();
        assert!(matches!(pipeline.iter().next(), Some(Ok(0))));
        std::thread::sleep(Duration::from_millis(100));
        let t = Instant::now();
        let err = pipeline.stop_timeout(Duration::from_millis(300)).expect_err("the call is stuck");
        let took = t.elapsed();
        assert!(took >= Duration::from_millis(300) && took < Duration::from_secs(2), "took {took:?}");
        assert_eq!(err.waited, Duration::from_millis(300));
        // Stopped all the same: iteration has ended.
        assert!(pipeline.iter().next().is_none());
        drop(release);
        pipeline.stop_timeout(Duration::from_secs(30)).expect("the call returned: every thread joins");
        assert_eq!(settle(Duration::from_secs(5), 3, engine_threads), 0);
    });
}

#[test]
fn dropping_a_pipeline_with_a_stuck_call_returns_after_the_grace() {
    watchdog(60, || {
        let _serial = serial();
        let (pipeline, release) = stuck_pipeline();
        assert!(matches!(pipeline.iter().next(), Some(Ok(0))));
        std::thread::sleep(Duration::from_millis(100));
        assert!(engine_threads() >= 3, "scheduler and pool threads run");
        let t = Instant::now();
        drop(pipeline);
        let took = t.elapsed();
        assert!(took < DROP_GRACE + Duration::from_secs(2), "drop took {took:?}");
        // The detached threads end by themselves once the call returns.
        drop(release);
        assert_eq!(settle(Duration::from_secs(10), 3, engine_threads), 0);
    });
}

#[test]
fn huge_capacities_and_timeouts_neither_preallocate_nor_panic() {
    watchdog(60, || {
        let _serial = serial();
        let pipeline = PipelineBuilder::new()
            .source(0..10u32)
            .pipe(Stage::map("id", |x: u32| Ok::<_, Infallible>(x)).output_capacity(1 << 40))
            .aggregate(1 << 40)
            .sink(1 << 40)
            .build(BuildOptions { queue_capacity: 1 << 40, ..BuildOptions::default() })
            .expect("build");
        let got = pipeline.get_item(Some(Duration::MAX)).expect("no error");
        assert_eq!(got, Some(spdl_exec::Item::Data((0..10).collect())));
        assert!(pipeline.iter().next_timeout(Duration::MAX).is_none());
        assert!(pipeline.stop_timeout(Duration::MAX).is_ok());
    });
}

/// An endless lazy stage behind `sink(1)`: reading 5 outputs makes only a few more.
fn endless_is_bounded(order: OutputOrder, concurrency: usize) {
    let made = Arc::new(AtomicU64::new(0));
    let count = Arc::clone(&made);
    let pipeline = PipelineBuilder::new()
        .source(0..4u64)
        .pipe(
            Stage::flat_map_lazy("endless", move |x: u64| {
                let count = Arc::clone(&count);
                Ok::<_, Infallible>((0u64..).map(move |i| {
                    count.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, Infallible>((x, i))
                }))
            })
            .concurrency(concurrency)
            .order(order)
            .output_capacity(2),
        )
        .sink(1)
        .build(BuildOptions { num_threads: 2, ..BuildOptions::default() })
        .expect("build");
    let first: Vec<(u64, u64)> = pipeline.iter().take(5).map(|r| r.expect("item")).collect();
    if order == OutputOrder::Input || concurrency == 1 {
        assert_eq!(first, (0..5).map(|i| (0, i)).collect::<Vec<_>>());
    }
    let made_now = settle(Duration::from_secs(2), 5, || made.load(Ordering::SeqCst));
    // 5 read + sink (1) + output queue (2) + one held per running call.
    let bound = 5 + 1 + 2 + concurrency as u64;
    assert!(made_now <= bound, "{made_now} outputs made for 5 read (bound {bound})");
    pipeline.stop();
}

#[test]
fn a_lazy_stage_makes_outputs_only_as_they_are_read() {
    watchdog(60, || {
        let _serial = serial();
        endless_is_bounded(OutputOrder::Completion, 1);
        endless_is_bounded(OutputOrder::Completion, 2);
        endless_is_bounded(OutputOrder::Input, 2);
    });
}

#[test]
fn a_lazy_stage_gives_its_first_output_before_its_iterator_ends() {
    watchdog(60, || {
        let _serial = serial();
        let finished = Arc::new(AtomicBool::new(false));
        let done = Arc::clone(&finished);
        let pipeline = PipelineBuilder::new()
            .source(0..1u32)
            .pipe(Stage::flat_map_lazy("slow", move |_: u32| {
                let done = Arc::clone(&done);
                Ok::<_, Infallible>((0..5u32).map(move |i| {
                    if i > 0 {
                        std::thread::sleep(Duration::from_millis(200));
                    }
                    if i == 4 {
                        done.store(true, Ordering::SeqCst);
                    }
                    Ok::<_, Infallible>(i)
                }))
            }))
            .sink(4)
            .build(BuildOptions::default())
            .expect("build");
        assert!(matches!(pipeline.iter().next(), Some(Ok(0))));
        assert!(!finished.load(Ordering::SeqCst), "the first output waited for the whole iterator");
        assert_eq!(pipeline.iter().map(|r| r.expect("item")).collect::<Vec<_>>(), [1, 2, 3, 4]);
    });
}

#[test]
fn a_failing_lazy_iterator_keeps_its_earlier_outputs_and_counts_one_failure() {
    watchdog(60, || {
        let _serial = serial();
        for (order, concurrency) in [(OutputOrder::Completion, 1), (OutputOrder::Input, 2)] {
            let pipeline = PipelineBuilder::new()
                .source(0..3u32)
                .pipe(
                    Stage::flat_map_lazy("two_then_fail", |x: u32| {
                        Ok::<_, Infallible>((0..3u32).map(move |i| {
                            if x == 1 && i == 2 {
                                return Err(format!("item {x} broke"));
                            }
                            if x == 2 && i == 2 {
                                panic!("item {x} panicked");
                            }
                            Ok(x * 10 + i)
                        }))
                    })
                    .concurrency(concurrency)
                    .order(order),
                )
                .sink(2)
                .build(BuildOptions::default())
                .expect("build");
            let mut got: Vec<u32> = pipeline.iter().map(|r| r.expect("item")).collect();
            got.sort_unstable();
            assert_eq!(got, [0, 1, 2, 10, 11, 20, 21]);
            let stats = pipeline.stats();
            let stage = stats.stage("two_then_fail").expect("stage");
            assert_eq!(stage.items_failed, 2);
        }
    });
}

#[test]
fn a_lazy_stream_is_polled_only_as_its_outputs_are_read_and_its_errors_count() {
    watchdog(60, || {
        let _serial = serial();
        let made = Arc::new(AtomicU64::new(0));
        let count = Arc::clone(&made);
        let pipeline = PipelineBuilder::new()
            .source(0..2u64)
            .pipe(
                Stage::flat_map_stream("endless", move |x: u64| {
                    let count = Arc::clone(&count);
                    async move {
                        let s = futures::stream::iter(0u64..).map(move |i| {
                            count.fetch_add(1, Ordering::SeqCst);
                            Ok::<_, Infallible>((x, i))
                        });
                        Ok::<_, Infallible>(s)
                    }
                })
                .output_capacity(2),
            )
            .sink(1)
            .build(BuildOptions::default())
            .expect("build");
        let first: Vec<(u64, u64)> = pipeline.iter().take(5).map(|r| r.expect("item")).collect();
        assert_eq!(first, (0..5).map(|i| (0, i)).collect::<Vec<_>>());
        let made_now = settle(Duration::from_secs(2), 5, || made.load(Ordering::SeqCst));
        assert!(made_now <= 5 + 1 + 2 + 1, "{made_now} outputs made for 5 read");
        pipeline.stop();

        let pipeline = PipelineBuilder::new()
            .source(0..2u32)
            .pipe(Stage::flat_map_stream("fails", |x: u32| async move {
                let s = futures::stream::iter(0..3u32)
                    .map(move |i| if x == 1 && i == 1 { Err("broke") } else { Ok(x * 10 + i) });
                Ok::<_, Infallible>(s)
            }))
            .sink(2)
            .build(BuildOptions::default())
            .expect("build");
        let got: Vec<u32> = pipeline.iter().map(|r| r.expect("item")).collect();
        assert_eq!(got, [0, 1, 2, 10]);
        assert_eq!(pipeline.stats().stage("fails").map(|s| s.items_failed), Some(1));
    });
}

#[test]
fn lazy_streams_run_at_once_in_completion_order_and_one_after_another_in_input_order() {
    watchdog(60, || {
        let _serial = serial();
        for order in [OutputOrder::Completion, OutputOrder::Input] {
            let pipeline = PipelineBuilder::new()
                .source(0..2u64)
                .pipe(
                    Stage::flat_map_stream("ticks", |x: u64| async move {
                        let s = futures::stream::iter(0..4u64).then(move |i| async move {
                            // The second call's outputs come faster, yet in input order after the first's.
                            tokio::time::sleep(Duration::from_millis(if x == 0 { 200 } else { 150 })).await;
                            Ok::<_, Infallible>((x, i))
                        });
                        Ok::<_, Infallible>(s)
                    })
                    .concurrency(2)
                    .order(order),
                )
                .sink(8)
                .build(BuildOptions::default())
                .expect("build");
            let t = Instant::now();
            let got: Vec<(u64, u64)> = pipeline.iter().map(|r| r.expect("item")).collect();
            let took = t.elapsed();
            // One stream after the other takes 4 x 200 + 4 x 150 ms = 1.4 s: in completion order
            // they run at once (in input order a call's stream starts when the previous one ends).
            if order == OutputOrder::Completion {
                assert!(took < Duration::from_millis(1200), "took {took:?}");
            }
            let mut sorted = got.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, (0..2).flat_map(|x| (0..4).map(move |i| (x, i))).collect::<Vec<_>>());
            if order == OutputOrder::Input {
                assert_eq!(got, sorted, "input order");
            }
        }
    });
}
