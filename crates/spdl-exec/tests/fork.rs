//! A pipeline in a child forked while it runs: refused with `PipelineError::Forked`, dropped without waiting
//! for the parent's threads, and a new pipeline works in the child; the parent's goes on. Many forks, since a
//! crash that shows once in a few forks is a crash.

mod common;

use std::convert::Infallible;
use std::time::Duration;

use common::watchdog;
use spdl_exec::{BuildOptions, PipelineBuilder, PipelineError, Stage};

fn running() -> spdl_exec::Pipeline<u64> {
    PipelineBuilder::new()
        .source(0u64..)
        .pipe(Stage::map("double", |x: u64| Ok::<_, Infallible>(x * 2)).concurrency(2))
        .pipe(Stage::map_async("async", |x: u64| async move { Ok::<_, Infallible>(x) }))
        .sink(2)
        .build(BuildOptions { num_threads: 2, ..Default::default() })
        .expect("build")
}

/// What the child does; its exit status says which check failed (0: all passed).
fn child(inherited: spdl_exec::Pipeline<u64>) -> i32 {
    match inherited.get_item(Some(Duration::from_secs(1))) {
        Err(PipelineError::Forked { built_in, now }) if built_in != now => {}
        Err(_) => return 3,
        Ok(_) => return 4,
    }
    if inherited.start().is_ok() {
        return 5;
    }
    inherited.stop(); // nothing to stop here: returns at once
    drop(inherited); // must not wait for threads that stayed in the parent
    let fresh = PipelineBuilder::new()
        .source(0u64..10)
        .pipe(Stage::map("inc", |x: u64| Ok::<_, Infallible>(x + 1)))
        .sink(2)
        .build(BuildOptions { num_threads: 1, ..Default::default() })
        .expect("build in the child");
    let got: Vec<u64> = fresh.iter().map(|r| r.expect("item")).collect();
    if got != (1..=10).collect::<Vec<_>>() {
        return 6;
    }
    0
}

#[test]
fn a_pipeline_running_at_fork_is_refused_in_the_child_and_goes_on_in_the_parent() {
    watchdog(240, || {
        for round in 0..20 {
            let pipeline = running();
            assert!(matches!(pipeline.iter().next(), Some(Ok(_))));
            // SAFETY: the child only runs Rust code of this test and ends with `_exit`; glibc's fork resets
            // the allocator's locks in the child.
            let pid = unsafe { libc::fork() };
            assert!(pid >= 0, "fork failed");
            if pid == 0 {
                let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| child(pipeline))).unwrap_or(7);
                // SAFETY: ends the child without running the parent's atexit handlers or test harness.
                unsafe { libc::_exit(code) };
            }
            let mut status = 0;
            // SAFETY: waits for the child just forked.
            let waited = unsafe { libc::waitpid(pid, &mut status, 0) };
            assert_eq!(waited, pid);
            assert!(
                libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
                "round {round}: child status {status} (exit {})",
                libc::WEXITSTATUS(status)
            );
            for _ in 0..5 {
                assert!(matches!(pipeline.iter().next(), Some(Ok(_))), "round {round}: the parent's pipeline stopped");
            }
            pipeline.stop();
        }
    });
}
