//! Output order, and concurrency that really overlaps.

mod common;

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::{mix, watchdog};
use spdl_exec::{BuildOptions, OutputOrder, PipelineBuilder, Stage};

fn jitter(x: u64) -> Duration {
    Duration::from_micros(mix(x) % 2_000)
}

#[test]
fn input_order_is_kept_at_concurrency_4_blocking_and_async() {
    watchdog(120, || {
        let pipeline = PipelineBuilder::new()
            .source(0..400u64)
            .pipe(
                Stage::map("blocking", |x: u64| {
                    std::thread::sleep(jitter(x));
                    Ok::<_, Infallible>(x)
                })
                .concurrency(4)
                .order(OutputOrder::Input),
            )
            .pipe(
                Stage::map_async("async", |x: u64| async move {
                    tokio::time::sleep(jitter(x + 7)).await;
                    Ok::<_, Infallible>(x)
                })
                .concurrency(4)
                .order(OutputOrder::Input),
            )
            .sink(2)
            .build(BuildOptions::default())
            .expect("build");
        let out: Vec<u64> = pipeline.iter().map(|r| r.expect("item")).collect();
        assert_eq!(out, (0..400).collect::<Vec<_>>());
    });
}

#[test]
fn input_order_has_no_gap_stall_on_failures() {
    watchdog(120, || {
        let pipeline = PipelineBuilder::new()
            .source(0..300u64)
            .pipe(
                Stage::map("flaky", |x: u64| {
                    std::thread::sleep(jitter(x));
                    if x % 7 == 3 { Err(format!("{x} rejected")) } else { Ok(x) }
                })
                .concurrency(3)
                .order(OutputOrder::Input),
            )
            .sink(2)
            .build(BuildOptions::default())
            .expect("build");
        let out: Vec<u64> = pipeline.iter().map(|r| r.expect("item")).collect();
        let want: Vec<u64> = (0..300).filter(|x| x % 7 != 3).collect();
        assert_eq!(out, want);
    });
}

#[test]
fn completion_order_delivers_every_item() {
    watchdog(120, || {
        let pipeline = PipelineBuilder::new()
            .source(0..500u64)
            .pipe(
                Stage::map("b", |x: u64| {
                    std::thread::sleep(jitter(x) / 4);
                    Ok::<_, Infallible>(x)
                })
                .concurrency(4),
            )
            .pipe(
                Stage::map_async("a", |x: u64| async move {
                    tokio::time::sleep(jitter(x) / 4).await;
                    Ok::<_, Infallible>(x)
                })
                .concurrency(4),
            )
            .sink(2)
            .build(BuildOptions::default())
            .expect("build");
        let mut out: Vec<u64> = pipeline.iter().map(|r| r.expect("item")).collect();
        out.sort_unstable();
        assert_eq!(out, (0..500).collect::<Vec<_>>());
    });
}

/// Calls wait (up to a generous deadline) until `want` of them run at once; the maximum
/// observed proves the overlap without depending on timing.
struct Rendezvous {
    current: AtomicUsize,
    max: AtomicUsize,
    want: usize,
}

impl Rendezvous {
    fn enter(&self) {
        let now = self.current.fetch_add(1, Ordering::SeqCst) + 1;
        self.max.fetch_max(now, Ordering::SeqCst);
    }
    fn ready(&self) -> bool {
        self.max.load(Ordering::SeqCst) >= self.want
    }
    fn leave(&self) {
        self.current.fetch_sub(1, Ordering::SeqCst);
    }
}

#[test]
fn blocking_concurrency_overlaps() {
    watchdog(120, || {
        for order in [OutputOrder::Completion, OutputOrder::Input] {
            let r = Arc::new(Rendezvous { current: AtomicUsize::new(0), max: AtomicUsize::new(0), want: 4 });
            let r2 = Arc::clone(&r);
            let pipeline = PipelineBuilder::new()
                .source(0..16u64)
                .pipe(
                    Stage::map("wait", move |x: u64| {
                        r2.enter();
                        let deadline = Instant::now() + Duration::from_secs(20);
                        while !r2.ready() && Instant::now() < deadline {
                            std::thread::sleep(Duration::from_millis(1));
                        }
                        r2.leave();
                        Ok::<_, Infallible>(x)
                    })
                    .concurrency(4)
                    .order(order),
                )
                .sink(2)
                .build(BuildOptions { num_threads: 5, ..Default::default() })
                .expect("build");
            assert_eq!(pipeline.iter().count(), 16);
            assert_eq!(r.max.load(Ordering::SeqCst), 4, "{order:?}");
        }
    });
}

#[test]
fn async_concurrency_overlaps() {
    watchdog(120, || {
        let r = Arc::new(Rendezvous { current: AtomicUsize::new(0), max: AtomicUsize::new(0), want: 4 });
        let r2 = Arc::clone(&r);
        let pipeline = PipelineBuilder::new()
            .source(0..16u64)
            .pipe(
                Stage::map_async("wait", move |x: u64| {
                    let r = Arc::clone(&r2);
                    async move {
                        r.enter();
                        let deadline = Instant::now() + Duration::from_secs(20);
                        while !r.ready() && Instant::now() < deadline {
                            tokio::time::sleep(Duration::from_millis(1)).await;
                        }
                        r.leave();
                        Ok::<_, Infallible>(x)
                    }
                })
                .concurrency(4),
            )
            .sink(2)
            .build(BuildOptions::default())
            .expect("build");
        assert_eq!(pipeline.iter().count(), 16);
        assert_eq!(r.max.load(Ordering::SeqCst), 4);
    });
}

#[test]
fn a_pool_smaller_than_the_workers_still_completes() {
    watchdog(120, || {
        let stage = |name: &str| Stage::map(name, |x: u64| Ok::<_, Infallible>(x + 1)).concurrency(4);
        let pipeline = PipelineBuilder::new()
            .source(0..20_000u64)
            .pipe(stage("a"))
            .pipe(stage("b"))
            .pipe(stage("c"))
            .sink(2)
            .build(BuildOptions { num_threads: 1, ..Default::default() })
            .expect("build");
        let sum: u64 = pipeline.iter().map(|r| r.expect("item")).sum();
        assert_eq!(sum, (3..20_003u64).sum::<u64>());
    });
}
