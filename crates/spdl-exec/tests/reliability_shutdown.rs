//! 1,000 cycles of build → iterate a few items → drop or stop, in every state a training loop leaves a
//! pipeline in: threads and open file descriptors return to their baseline after each cycle, and RSS does
//! not grow. (Its own test binary, so that no other test's threads or files change the counts.)

mod common;

use std::convert::Infallible;
use std::fs::File;
use std::time::{Duration, Instant};

use common::{settle, thread_count, threads_back_to, watchdog};
use spdl_exec::{BuildOptions, OutputOrder, PipelineBuilder, Stage};

const CYCLES: u64 = 1_000;

fn fd_count() -> u64 {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count() as u64)
}

/// What each open descriptor points at, for the failure message.
fn fd_list() -> Vec<String> {
    std::fs::read_dir("/proc/self/fd")
        .map(|d| {
            d.filter_map(Result::ok)
                .map(|e| {
                    format!(
                        "{} -> {}",
                        e.file_name().to_string_lossy(),
                        std::fs::read_link(e.path()).map_or_else(|_| "?".into(), |p| p.display().to_string())
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| l.strip_prefix("VmRSS:")).and_then(|v| v.split_whitespace().next()?.parse().ok())
        })
        .unwrap_or(0)
}

/// One cycle; `shape` picks how the pipeline is left. Items carry open files, so a leaked item leaks an fd.
fn cycle(n: u64, file: &std::path::Path) {
    let shape = n % 6;
    let path = file.to_path_buf();
    let pipeline = PipelineBuilder::new()
        .source((0u64..).map(move |i| (i, File::open(&path).ok())))
        .pipe(
            Stage::map("blocking", |(i, f): (u64, Option<File>)| {
                if i % 11 == 5 {
                    return Err(format!("item {i} refused"));
                }
                Ok((i, f))
            })
            .concurrency(2),
        )
        .pipe(
            Stage::map_async("async", |(i, f): (u64, Option<File>)| async move {
                if i % 3 == 0 {
                    tokio::time::sleep(Duration::from_micros(200)).await;
                }
                // Calls still in flight when the pipeline goes away are dropped with their file.
                if i % 13 == 12 {
                    tokio::time::sleep(Duration::from_secs(3600)).await;
                }
                Ok::<_, Infallible>((i, f))
            })
            .concurrency(4),
        )
        .pipe(
            Stage::map("ordered", |x: (u64, Option<File>)| Ok::<_, Infallible>(x))
                .concurrency(2)
                .order(OutputOrder::Input),
        )
        .aggregate(3)
        .sink(2)
        .build(BuildOptions { num_threads: 2 + (n % 3) as usize, queue_capacity: 4, ..BuildOptions::default() })
        .expect("build");
    match shape {
        // Never started.
        0 => drop(pipeline),
        // A few batches, then drop mid-iteration.
        1 | 2 => {
            let got = pipeline.iter().take(1 + (n % 4) as usize).count();
            assert!(got >= 1);
            drop(pipeline);
        }
        // A few batches, stop from this thread, then drop.
        3 => {
            let _ = pipeline.iter().next();
            pipeline.stop();
            assert!(pipeline.iter().next().is_none());
        }
        // Stop from another thread while this one waits for an item.
        4 => {
            let pipeline = std::sync::Arc::new(pipeline);
            let p = std::sync::Arc::clone(&pipeline);
            let stopper = std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(1));
                p.stop();
            });
            for _ in pipeline.iter().take(50) {}
            stopper.join().expect("stopper");
        }
        // Started, nothing read.
        _ => {
            pipeline.start().expect("start");
            drop(pipeline);
        }
    }
}

#[test]
fn thousand_cycles_leave_no_threads_no_fds_and_no_memory_growth() {
    watchdog(900, || {
        let dir = std::env::temp_dir().join(format!("spdl-exec-shutdown-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("tmp dir");
        let file = dir.join("item.bin");
        std::fs::write(&file, b"payload").expect("write");

        // One started cycle first: with tokio's `signal` feature on (other workspace members turn it on),
        // the first runtime with `enable_all` creates the process-wide signal socket pair once. That is a
        // one-time global, not a per-pipeline resource, so the baseline is taken after it.
        cycle(1, &file);
        // The baseline once the first cycle's threads have left the count.
        let threads0 = settle(Duration::from_secs(2), 5, || thread_count() as u64) as usize;
        let fds0 = fd_count();
        let mut rss_warm = 0;
        let t = Instant::now();
        for n in 0..CYCLES {
            cycle(n, &file);
            // Drop and stop join every thread before returning.
            assert_eq!(threads_back_to(threads0, Duration::from_secs(2)), threads0, "threads after cycle {n}");
            assert_eq!(fd_count(), fds0, "open fds after cycle {n}: {:?}", fd_list());
            if n == 99 {
                rss_warm = settle(Duration::from_secs(2), 3, rss_kib);
            }
        }
        let rss_end = settle(Duration::from_secs(2), 3, rss_kib);
        let growth = rss_end.saturating_sub(rss_warm);
        println!(
            "{CYCLES} cycles in {:.1} s: threads {threads0} -> {}, fds {fds0} -> {}, RSS after 100 cycles {rss_warm} KiB, after {CYCLES} {rss_end} KiB (+{growth} KiB)",
            t.elapsed().as_secs_f64(),
            thread_count(),
            fd_count()
        );
        // Allocator slack (per-thread arenas, caches), not a per-cycle leak: 900 cycles leaking even one
        // 8 KiB stack or queue each would add 7 MiB.
        assert!(growth < 4 * 1024, "RSS grew by {growth} KiB over {} cycles", CYCLES - 100);
        let _ = std::fs::remove_dir_all(&dir);
    });
}
