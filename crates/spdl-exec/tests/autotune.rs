//! Auto-tuning on real pipelines: a waiting stage's concurrency rises, fixed stages stay,
//! order holds while the concurrency changes, and the memory budget lowers what was raised.

mod common;

use std::convert::Infallible;
use std::time::Duration;

use common::watchdog;
use spdl_exec::autotune::Knob;
use spdl_exec::{BuildOptions, ItemSize, OutputOrder, PipelineBuilder, Stage, Tune};

fn tuned(memory: Option<u64>) -> BuildOptions {
    BuildOptions { autotune: true, max_memory_bytes: memory, num_threads: 2, ..BuildOptions::default() }
}

#[test]
fn a_waiting_blocking_stage_is_raised_and_a_fixed_one_is_not() {
    watchdog(120, || {
        let n = 3000u32;
        let pipeline = PipelineBuilder::new()
            .source(0..n)
            .pipe(Stage::map("fixed", |x: u32| Ok::<_, Infallible>(x)).concurrency(2))
            .pipe(Stage::map("wait", |x: u32| {
                std::thread::sleep(Duration::from_millis(2));
                Ok::<_, Infallible>(x)
            }))
            .sink(4)
            .build(tuned(None))
            .expect("build");
        let mut got: Vec<u32> = pipeline.iter().map(|r| r.expect("item")).collect();
        got.sort_unstable();
        assert_eq!(got, (0..n).collect::<Vec<_>>());
        let stats = pipeline.stats();
        let fixed = stats.stage("fixed").expect("row");
        assert_eq!((fixed.concurrency, fixed.concurrency_bounds, fixed.tune_changes), (2, None, 0));
        let wait = stats.stage("wait").expect("row");
        assert!(wait.concurrency_bounds.is_some());
        let report = pipeline.autotune().expect("report");
        let raised = report.decisions.iter().any(|d| d.stage == "wait" && d.to > d.from);
        assert!(raised, "{report:#?}");
        assert!(report.decisions.iter().all(|d| d.stage != "fixed"));
        // The pool followed the blocking concurrency at some point.
        assert!(report.decisions.iter().any(|d| d.stage == "pool" && d.to > 2), "{report:#?}");
        // The table says why.
        let table = stats.to_string();
        assert!(table.contains("autotune `wait`"), "{table}");
    });
}

#[test]
fn input_order_holds_while_concurrency_changes() {
    watchdog(120, || {
        let n = 2000u32;
        let pipeline = PipelineBuilder::new()
            .source(0..n)
            .pipe(
                Stage::map_async("fetch", |x: u32| async move {
                    tokio::time::sleep(Duration::from_millis(1 + u64::from(x % 3))).await;
                    Ok::<_, Infallible>(x)
                })
                .order(OutputOrder::Input),
            )
            .pipe(
                Stage::map("work", |x: u32| {
                    std::thread::sleep(Duration::from_micros(500 + 300 * u64::from(x % 4)));
                    Ok::<_, Infallible>(x)
                })
                .order(OutputOrder::Input),
            )
            .sink(4)
            .build(tuned(None))
            .expect("build");
        let got: Vec<u32> = pipeline.iter().map(|r| r.expect("item")).collect();
        assert_eq!(got, (0..n).collect::<Vec<_>>());
        let report = pipeline.autotune().expect("report");
        assert!(report.decisions.iter().any(|d| d.to > d.from && d.stage != "pool"), "{report:#?}");
    });
}

#[test]
fn resident_memory_over_the_budget_lowers_what_is_tuned() {
    watchdog(120, || {
        let n = 1500u32;
        // A budget of one byte: resident memory is always over it. The stage starts at 8
        // (opted in) and is halved down to its minimum, then never raised.
        let pipeline = PipelineBuilder::new()
            .source(0..n)
            .pipe(
                Stage::map("wait", |x: u32| {
                    std::thread::sleep(Duration::from_millis(1));
                    Ok::<_, Infallible>(x)
                })
                .concurrency(8)
                .tune(1, 8),
            )
            .sink(4)
            .build(tuned(Some(1)))
            .expect("build");
        assert_eq!(pipeline.iter().count(), n as usize);
        let report = pipeline.autotune().expect("report");
        let wait: Vec<_> = report.decisions.iter().filter(|d| d.stage == "wait").collect();
        assert!(!wait.is_empty(), "{report:#?}");
        assert!(wait.iter().all(|d| d.to < d.from && d.reason.starts_with("memory")), "{report:#?}");
        assert_eq!(pipeline.stats().stage("wait").map(|s| s.concurrency), Some(1));
    });
}

#[test]
fn a_measured_item_size_bounds_what_is_raised() {
    watchdog(120, || {
        const MIB: u64 = 1 << 20;
        let n = 3000u32;
        // Each output is a 64 MiB buffer (zero pages, never touched: nothing resident), which
        // the stage measures. Budget 512 MiB: calls in flight plus the 4 queued may be 8.
        let size = ItemSize::new();
        let probe = size.clone();
        let pipeline = PipelineBuilder::new()
            .source(0..n)
            .pipe(
                Stage::map("frames", move |_x: u32| {
                    std::thread::sleep(Duration::from_millis(2));
                    let frame = vec![0u8; 64 << 20];
                    if probe.due() {
                        probe.record(frame.len() as u64);
                    }
                    Ok::<_, Infallible>(frame)
                })
                .concurrency(1)
                .tune(1, 32)
                .output_capacity(4)
                .item_size(size),
            )
            .pipe(Stage::map("len", |v: Vec<u8>| Ok::<_, Infallible>(v.len())))
            .sink(1)
            .build(tuned(Some(512 * MIB)))
            .expect("build");
        assert!(pipeline.iter().all(|r| r.expect("item") == 64 << 20));
        let row = pipeline.stats().stage("frames").cloned().expect("row");
        assert_eq!(row.item_bytes, Some(64 * MIB));
        let report = pipeline.autotune().expect("report");
        let raised: Vec<_> = report.decisions.iter().filter(|d| d.stage == "frames").collect();
        assert!(raised.iter().any(|d| d.to > d.from), "{report:#?}");
        assert!(raised.iter().all(|d| d.to <= 4), "{report:#?}");
    });
}

#[test]
fn invalid_bounds_are_refused() {
    let built = PipelineBuilder::new()
        .source(0..1u32)
        .pipe(
            Stage::map("s", |x: u32| Ok::<_, Infallible>(x))
                .with_options(spdl_exec::StageOptions { tune: Tune::Within { min: 4, max: 2 }, ..Default::default() }),
        )
        .sink(1)
        .build(tuned(None));
    let err = built.expect_err("refused").to_string();
    assert!(err.contains("stage `s`: tune"), "{err}");
}

#[test]
fn a_queue_between_bursty_stages_is_grown_and_a_set_one_is_not() {
    watchdog(120, || {
        let n = 4000u32;
        // `read` makes 31 items at once, then stalls 8 ms; `decode` takes 0.25 ms each. A
        // queue of 4 cannot carry `decode` through the stall (it starves while `read` waits
        // for room): the controller grows it. Both stages are held at concurrency 1.
        let pipeline = PipelineBuilder::new()
            .source(0..n)
            .pipe(
                Stage::map("read", |x: u32| {
                    if x % 32 == 31 {
                        std::thread::sleep(Duration::from_millis(8));
                    }
                    Ok::<_, Infallible>(x)
                })
                .tune(1, 1)
                .order(OutputOrder::Input),
            )
            .pipe(
                Stage::map("decode", |x: u32| {
                    std::thread::sleep(Duration::from_micros(250));
                    Ok::<_, Infallible>(x)
                })
                .tune(1, 1)
                .order(OutputOrder::Input),
            )
            .pipe(Stage::map("set", |x: u32| Ok::<_, Infallible>(x)).tune(1, 1).output_capacity(4))
            .sink(4)
            .build(BuildOptions { queue_capacity: 4, ..tuned(None) })
            .expect("build");
        let got: Vec<u32> = pipeline.iter().map(|r| r.expect("item")).collect();
        assert_eq!(got, (0..n).collect::<Vec<_>>());
        let report = pipeline.autotune().expect("report");
        let queue: Vec<_> = report.decisions.iter().filter(|d| d.knob == Knob::QueueCapacity).collect();
        // The probe goes straight to the bound (8x); a search back down may follow.
        assert!(queue.iter().any(|d| d.stage == "read" && d.from == 4 && d.to == 32), "{report:#?}");
        // Within its bound (8x), never below where it started, and never the set one.
        assert!(queue.iter().all(|d| d.stage != "set" && (4..=32).contains(&d.to)), "{report:#?}");
        let stats = pipeline.stats();
        let decode = stats.stage("decode").expect("row");
        assert!((4..=32).contains(&decode.queue_capacity), "{}", decode.queue_capacity);
        let set = stats.stage("sink").expect("row");
        assert_eq!(set.queue_capacity, 4);
    });
}
