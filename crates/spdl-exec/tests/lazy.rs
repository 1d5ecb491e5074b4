//! Lazy stages ([`Stage::flat_map_lazy`]): a run advances the iterator in bounded batches, but
//! back-pressure stays exact (an endless iterator makes only what the queues can hold), a failure
//! part-way is counted once and keeps the outputs before it, and `OutputOrder::Input` keeps every
//! call's outputs together and in order. Plus an ignored speed check against the native
//! `disaggregate` (`cargo test --release --test lazy -- --ignored --nocapture`).

mod common;

use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{settle, watchdog};
use spdl_exec::{BuildOptions, OutputOrder, PipelineBuilder, Stage};

/// Tests of this file run one at a time (the speed check most of all).
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// An endless lazy stage with a wide output queue behind a small sink: however many outputs a
/// run makes per batch, no more exist than the queues hold plus one per running call.
fn endless_wide_queue_is_bounded(order: OutputOrder, concurrency: usize, capacity: usize) {
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
            .output_capacity(capacity),
        )
        .sink(3)
        .build(BuildOptions { num_threads: 2, ..BuildOptions::default() })
        .expect("build");
    let first: Vec<(u64, u64)> = pipeline.iter().take(10).map(|r| r.expect("item")).collect();
    if order == OutputOrder::Input || concurrency == 1 {
        assert_eq!(first, (0..10).map(|i| (0, i)).collect::<Vec<_>>());
    }
    let made_now = settle(Duration::from_secs(2), 5, || made.load(Ordering::SeqCst));
    // 10 read + sink (3) + output queue + one held per running call.
    let bound = 10 + 3 + capacity as u64 + concurrency as u64;
    assert!(made_now <= bound, "{made_now} outputs made for 10 read (bound {bound}, {order:?} x{concurrency})");
    pipeline.stop();
}

#[test]
fn batched_lazy_runs_keep_back_pressure_exact() {
    watchdog(60, || {
        let _serial = serial();
        for capacity in [1, 5, 100] {
            endless_wide_queue_is_bounded(OutputOrder::Completion, 1, capacity);
            endless_wide_queue_is_bounded(OutputOrder::Completion, 3, capacity);
            endless_wide_queue_is_bounded(OutputOrder::Input, 1, capacity);
            endless_wide_queue_is_bounded(OutputOrder::Input, 3, capacity);
        }
    });
}

/// Failures (an `Err` element, a panic in `next`) after many outputs: counted once per call, the
/// outputs before them delivered, none after.
#[test]
fn a_failure_deep_in_a_long_iterator_is_counted_once() {
    watchdog(60, || {
        let _serial = serial();
        for (order, concurrency) in [(OutputOrder::Completion, 1), (OutputOrder::Input, 1), (OutputOrder::Input, 3)] {
            let pipeline = PipelineBuilder::new()
                .source(0..6u32)
                .pipe(
                    Stage::flat_map_lazy("fail_at_150", |x: u32| {
                        Ok::<_, Infallible>((0..300u32).map(move |i| {
                            if i == 150 && x % 3 == 1 {
                                return Err(format!("item {x} broke at {i}"));
                            }
                            if i == 150 && x % 3 == 2 {
                                panic!("item {x} panicked at {i}");
                            }
                            Ok(x * 1000 + i)
                        }))
                    })
                    .concurrency(concurrency)
                    .order(order)
                    .output_capacity(7),
                )
                .sink(2)
                .build(BuildOptions::default())
                .expect("build");
            let mut got: Vec<u32> = pipeline.iter().map(|r| r.expect("item")).collect();
            got.sort_unstable();
            let want: Vec<u32> =
                (0..6u32).flat_map(|x| (0..if x % 3 == 0 { 300 } else { 150 }).map(move |i| x * 1000 + i)).collect();
            assert_eq!(got, want, "{order:?} x{concurrency}");
            let stats = pipeline.stats();
            let stage = stats.stage("fail_at_150").expect("stage");
            assert_eq!(stage.items_failed, 4, "{order:?} x{concurrency}");
            assert_eq!(stage.items_in, 6);
            assert_eq!(stage.items_out, want.len() as u64, "{order:?} x{concurrency}");
        }
    });
}

/// `OutputOrder::Input` at any concurrency: each call's outputs come out together, in input order,
/// even when later calls' iterators are faster.
#[test]
fn input_order_keeps_each_calls_outputs_together_and_in_order() {
    watchdog(60, || {
        let _serial = serial();
        for concurrency in [1, 2, 4] {
            let pipeline = PipelineBuilder::new()
                .source(0..40u32)
                .pipe(
                    Stage::flat_map_lazy("count", |x: u32| {
                        Ok::<_, Infallible>((0..(x % 7) * 30).map(move |i| {
                            if x.is_multiple_of(5) && i.is_multiple_of(50) {
                                std::thread::sleep(Duration::from_millis(1));
                            }
                            Ok::<_, Infallible>((x, i))
                        }))
                    })
                    .concurrency(concurrency)
                    .order(OutputOrder::Input)
                    .output_capacity(16),
                )
                .sink(4)
                .build(BuildOptions { num_threads: 3, ..BuildOptions::default() })
                .expect("build");
            let got: Vec<(u32, u32)> = pipeline.iter().map(|r| r.expect("item")).collect();
            let want: Vec<(u32, u32)> = (0..40u32).flat_map(|x| (0..(x % 7) * 30).map(move |i| (x, i))).collect();
            assert_eq!(got, want, "x{concurrency}");
            let stats = pipeline.stats();
            assert_eq!(stats.stage("count").expect("stage").items_out, want.len() as u64);
        }
    });
}

fn timed(label: &str, reps: usize, run: impl Fn() -> usize) -> f64 {
    let mut best = f64::MAX;
    let mut n = 0;
    for _ in 0..reps {
        let t0 = Instant::now();
        n = run();
        best = best.min(t0.elapsed().as_secs_f64());
    }
    println!("{label}: {n} items, best {:.1} ms", best * 1e3);
    best
}

/// 2000 inputs x 100 outputs through `disaggregate`, a lazy stage over a `Vec`, a lazy stage
/// over a generator-like iterator, and an input-order lazy stage at concurrency 2.
#[test]
#[ignore = "speed check; run with --release -- --ignored --nocapture"]
fn lazy_speed() {
    let _serial = serial();
    let opts = || BuildOptions { num_threads: 2, ..BuildOptions::default() };
    let count = |p: spdl_exec::Pipeline<u64>| p.iter().inspect(|r| assert!(r.is_ok())).count();
    for _ in 0..2 {
        timed("native disaggregate", 5, || {
            count(
                PipelineBuilder::new()
                    .source(0..2000u64)
                    .pipe(Stage::map("make", |x: u64| Ok::<_, Infallible>((0..100).map(|i| x + i).collect::<Vec<_>>())))
                    .disaggregate()
                    .sink(64)
                    .build(opts())
                    .expect("build"),
            )
        });
        timed("lazy over Vec", 5, || {
            count(
                PipelineBuilder::new()
                    .source(0..2000u64)
                    .pipe(Stage::map("make", |x: u64| Ok::<_, Infallible>((0..100).map(|i| x + i).collect::<Vec<_>>())))
                    .pipe(Stage::flat_map_lazy("split", |v: Vec<u64>| {
                        Ok::<_, Infallible>(v.into_iter().map(Ok::<_, Infallible>))
                    }))
                    .sink(64)
                    .build(opts())
                    .expect("build"),
            )
        });
        timed("lazy generator", 5, || {
            count(
                PipelineBuilder::new()
                    .source(0..2000u64)
                    .pipe(Stage::flat_map_lazy("gen", |x: u64| {
                        Ok::<_, Infallible>((0..100).map(move |i| Ok::<_, Infallible>(x + i)))
                    }))
                    .sink(64)
                    .build(opts())
                    .expect("build"),
            )
        });
        timed("lazy generator, input order x2", 5, || {
            count(
                PipelineBuilder::new()
                    .source(0..2000u64)
                    .pipe(
                        Stage::flat_map_lazy("gen", |x: u64| {
                            Ok::<_, Infallible>((0..100).map(move |i| Ok::<_, Infallible>(x + i)))
                        })
                        .concurrency(2)
                        .order(OutputOrder::Input),
                    )
                    .sink(64)
                    .build(opts())
                    .expect("build"),
            )
        });
    }
}

/// Inputs of a stage with a fast path: batches it takes, and lazy calls it leaves to the function.
enum Work {
    Ready(Vec<u64>),
    /// `n` outputs made lazily, failing (an `Err`) at `fail_at` if set; `u64::MAX`: endless.
    Lazy {
        base: u64,
        n: u64,
        fail_at: Option<u64>,
    },
    /// Panics in the fast path.
    Poison,
}

fn fast_stage(made: Arc<AtomicU64>, capacity: usize) -> Stage<Work, u64> {
    Stage::flat_map_lazy("split", move |w: Work| {
        let made = Arc::clone(&made);
        let items: Box<dyn Iterator<Item = Result<u64, String>> + Send> = match w {
            Work::Ready(v) => Box::new(v.into_iter().map(Ok)),
            Work::Lazy { base, n, fail_at } => Box::new((0..n).map(move |i| {
                made.fetch_add(1, Ordering::SeqCst);
                if Some(i) == fail_at { Err(format!("{base} broke at {i}")) } else { Ok(base + i) }
            })),
            Work::Poison => Box::new(std::iter::empty()),
        };
        Ok::<_, Infallible>(items)
    })
    .concurrency(1)
    .output_capacity(capacity)
    .fast_path(|w: Work| match w {
        Work::Ready(v) => Ok(v),
        Work::Poison => panic!("poisoned input"),
        other => Err(other),
    })
}

#[test]
fn a_fast_path_keeps_order_and_counts_failures_once() {
    watchdog(60, || {
        let _serial = serial();
        for capacity in [1, 3, 64] {
            let inputs = vec![
                Work::Ready((0..50).collect()),
                Work::Lazy { base: 100, n: 40, fail_at: None },
                Work::Ready(vec![]),
                Work::Poison,
                Work::Lazy { base: 200, n: 90, fail_at: Some(70) },
                Work::Ready((300..310).collect()),
                Work::Lazy { base: 400, n: 5, fail_at: None },
            ];
            let pipeline = PipelineBuilder::new()
                .source(inputs)
                .pipe(fast_stage(Arc::new(AtomicU64::new(0)), capacity))
                .sink(2)
                .build(BuildOptions { num_threads: 1, ..BuildOptions::default() })
                .expect("build");
            let got: Vec<u64> = pipeline.iter().map(|r| r.expect("item")).collect();
            let want: Vec<u64> = (0..50).chain(100..140).chain(200..270).chain(300..310).chain(400..405).collect();
            assert_eq!(got, want, "capacity {capacity}");
            let stats = pipeline.stats();
            let stage = stats.stage("split").expect("stage");
            assert_eq!(stage.items_in, 7);
            assert_eq!(stage.items_failed, 2, "the panic and the Err, once each");
            assert_eq!(stage.items_out, want.len() as u64);
        }
    });
}

#[test]
fn a_fast_path_keeps_an_endless_lazy_call_bounded() {
    watchdog(60, || {
        let _serial = serial();
        let made = Arc::new(AtomicU64::new(0));
        let inputs = vec![Work::Ready(vec![1, 2, 3]), Work::Lazy { base: 1000, n: u64::MAX, fail_at: None }];
        let pipeline = PipelineBuilder::new()
            .source(inputs)
            .pipe(fast_stage(Arc::clone(&made), 4))
            .sink(2)
            .build(BuildOptions { num_threads: 1, ..BuildOptions::default() })
            .expect("build");
        let first: Vec<u64> = pipeline.iter().take(10).map(|r| r.expect("item")).collect();
        assert_eq!(first, [1, 2, 3, 1000, 1001, 1002, 1003, 1004, 1005, 1006]);
        let made_now = settle(Duration::from_secs(2), 5, || made.load(Ordering::SeqCst));
        // 7 lazy outputs read + sink (2) + output queue (4) + one held.
        assert!(made_now <= 7 + 2 + 4 + 1, "{made_now} lazy outputs made for 7 read");
        pipeline.stop();
    });
}
