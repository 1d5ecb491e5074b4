//! Stats: counts, task-time quantiles, starved/blocked time, the bottleneck, the report hook.

mod common;

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::watchdog;
use spdl_exec::{BuildOptions, PipelineBuilder, PipelineStats, Stage, StageKind};

#[test]
fn stats_find_the_slow_stage() {
    watchdog(120, || {
        let reports = Arc::new(AtomicUsize::new(0));
        let r2 = Arc::clone(&reports);
        let pipeline = PipelineBuilder::new()
            .source(0..100u32)
            .pipe(Stage::map("fast", |x: u32| Ok::<_, Infallible>(x)))
            .pipe(Stage::map("slow", |x: u32| {
                std::thread::sleep(Duration::from_millis(3));
                Ok::<_, Infallible>(x)
            }))
            .pipe(Stage::map_async("after", |x: u32| async move { Ok::<_, Infallible>(x) }))
            .sink(2)
            .build(BuildOptions {
                report_interval: Some(Duration::from_millis(20)),
                report_hook: Some(Arc::new(move |s: &PipelineStats| {
                    assert_eq!(s.stages.len(), 5);
                    r2.fetch_add(1, Ordering::SeqCst);
                })),
                ..Default::default()
            })
            .expect("build");
        assert_eq!(pipeline.iter().count(), 100);
        let stats = pipeline.stats();
        let names: Vec<&str> = stats.stages.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["source", "fast", "slow", "after", "sink"]);
        assert_eq!(stats.stages[0].kind, StageKind::Source);
        assert_eq!(stats.stages[4].kind, StageKind::Sink);
        assert_eq!(stats.stages[4].items_in, 100);

        let slow = stats.stage("slow").expect("row");
        assert_eq!((slow.items_in, slow.items_out, slow.items_failed), (100, 100, 0));
        // Sleeps of 3 ms: the histogram resolution is ~19%; sleeping may overshoot.
        assert!(slow.task_p50 >= Duration::from_micros(2_400), "{stats}");
        assert!(slow.task_p50 <= slow.task_p90 && slow.task_p90 <= slow.task_p99);
        assert!(slow.task_mean >= Duration::from_micros(2_400));
        assert!(slow.task_time_total >= Duration::from_millis(240));
        // Downstream of the slow stage waits for input; upstream of it waits for room.
        assert!(stats.stage("after").expect("row").starved > Duration::from_millis(50), "{stats}");
        assert!(stats.stage("fast").expect("row").blocked > Duration::from_millis(50), "{stats}");
        // The consumer waited for the slow stage too: the sink row's starved time is its wait.
        assert!(stats.stages[4].starved > Duration::from_millis(50), "{stats}");
        assert_eq!(stats.bottleneck().map(|s| s.name.as_str()), Some("slow"));
        let table = stats.to_string();
        assert!(table.contains("slow") && table.contains("<- bottleneck"), "{table}");
        assert!(table.contains("bottleneck: `slow`"), "{table}");
        assert!(reports.load(Ordering::SeqCst) >= 1);
    });
}
