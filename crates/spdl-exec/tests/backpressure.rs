//! Bounded queues: a consumer that stops stalls the source; memory stays bounded.

mod common;

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use common::{settle, watchdog};
use spdl_exec::{BuildOptions, PipelineBuilder, Stage};

#[test]
fn stopped_consumer_bounds_items_produced() {
    watchdog(120, || {
        let produced = Arc::new(AtomicU64::new(0));
        let counter = Arc::clone(&produced);
        let source = (0..1_000_000u64).inspect(move |_| {
            counter.fetch_add(1, Ordering::SeqCst);
        });
        let queue_capacity = 8;
        let sink = 4;
        let (blocking_c, async_c) = (2, 3);
        let pipeline = PipelineBuilder::new()
            .source(source)
            .pipe(Stage::map("blocking", |x: u64| Ok::<_, Infallible>(x + 1)).concurrency(blocking_c))
            .pipe(Stage::map_async("async", |x: u64| async move { Ok::<_, Infallible>(x * 2) }).concurrency(async_c))
            .sink(sink)
            .build(BuildOptions { queue_capacity, ..Default::default() })
            .expect("build");

        let consumed = pipeline.iter().take(10).inspect(|r| assert!(r.is_ok())).count();
        assert_eq!(consumed, 10);

        // Let the pipeline fill every queue and stall.
        let stalled_at = settle(Duration::from_secs(30), 50, || produced.load(Ordering::SeqCst));
        // Queues: source→blocking, blocking→async, async→sink; in flight: the source's own
        // pending item, and each stage's concurrency.
        let bound =
            consumed as u64 + (queue_capacity + queue_capacity + sink) as u64 + 1 + (blocking_c + async_c) as u64;
        assert!(stalled_at <= bound, "produced {stalled_at} items for 10 consumed; bound {bound}");
        assert!(stalled_at >= consumed as u64);

        // Occupancy is visible in the stats while stalled. A producer that found the sink queue full
        // is woken only once the queue drains to its low-water mark (half the capacity), so a consumer
        // that stops right after one pop leaves it at capacity - 1: the stalled queue holds more than
        // half its capacity. The source can stop before the last stage has pushed its final items (a
        // worker may still be waking up on a loaded machine): wait for that rather than sampling once.
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        let stats = loop {
            let stats = pipeline.stats();
            let full = stats.stages.last().is_some_and(|s| s.queue_len > sink / 2);
            if full || std::time::Instant::now() > deadline {
                break stats;
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        let sink_row = stats.stages.last().expect("sink row");
        assert_eq!(sink_row.queue_capacity, sink);
        assert!(sink_row.queue_len > sink / 2 && sink_row.queue_len <= sink, "{stats}");
        let produced_end = produced.load(Ordering::SeqCst);
        assert!(produced_end <= bound, "produced {produced_end} items for 10 consumed; bound {bound}");
        pipeline.stop();
    });
}

#[test]
fn batch_queues_get_the_batch_capacity() {
    watchdog(60, || {
        let pipeline = PipelineBuilder::new()
            .source(0..1000u64)
            .pipe(Stage::map("item", |x: u64| Ok::<_, Infallible>(x)))
            .aggregate(10)
            .pipe(Stage::map("batch", |b: Vec<u64>| Ok::<_, Infallible>(b)))
            .disaggregate()
            .pipe(Stage::map("again", |x: u64| Ok::<_, Infallible>(x)))
            .sink(3)
            .build(BuildOptions { queue_capacity: 16, batch_queue_capacity: 2, ..Default::default() })
            .expect("build");
        let stats = pipeline.stats();
        let cap = |name: &str| stats.stage(name).unwrap_or_else(|| panic!("no stage {name}: {stats}")).queue_capacity;
        // Each row shows the capacity of the queue feeding that stage.
        assert_eq!(cap("aggregate(10)"), 16);
        assert_eq!(cap("batch"), 2);
        assert_eq!(cap("disaggregate"), 2);
        assert_eq!(cap("again"), 16);
        assert_eq!(pipeline.iter().count(), 1000);

        let zero = PipelineBuilder::new()
            .source(0..1u64)
            .sink(1)
            .build(BuildOptions { batch_queue_capacity: 0, ..Default::default() });
        assert!(zero.is_err());
    });
}
