//! The before-block hook lets a stage keep a per-thread lock across items (as spdl-py keeps the GIL): a
//! pipeline whose stage keeps a lock the consumer also takes still runs to the end, because every pool thread
//! releases the lock before it waits. Its own test binary: the hook is process-wide.

mod common;

use std::cell::Cell;
use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, PoisonError};
use std::thread::ThreadId;

use common::watchdog;
use spdl_exec::{BuildOptions, PipelineBuilder, Stage};

/// A lock with an owner, taken and released by separate calls (like an interpreter lock).
struct Lock {
    owner: Mutex<Option<ThreadId>>,
    freed: Condvar,
}

static LOCK: Lock = Lock { owner: Mutex::new(None), freed: Condvar::new() };
static RELEASED_BY_HOOK: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    static HELD: Cell<bool> = const { Cell::new(false) };
}

fn acquire() {
    let mut owner = LOCK.owner.lock().unwrap_or_else(PoisonError::into_inner);
    while owner.is_some() {
        owner = LOCK.freed.wait(owner).unwrap_or_else(PoisonError::into_inner);
    }
    *owner = Some(std::thread::current().id());
}

fn release() {
    *LOCK.owner.lock().unwrap_or_else(PoisonError::into_inner) = None;
    LOCK.freed.notify_all();
}

/// The hook: releases the lock if this thread kept it.
fn release_kept() {
    if HELD.with(Cell::get) {
        HELD.with(|h| h.set(false));
        RELEASED_BY_HOOK.fetch_add(1, Ordering::Relaxed);
        release();
    }
}

/// A stage function that takes the lock on its first item and keeps it.
fn keep_lock(x: u64) -> Result<u64, Infallible> {
    if !HELD.with(Cell::get) {
        acquire();
        HELD.with(|h| h.set(true));
    }
    Ok(x * 2)
}

#[test]
fn a_lock_kept_across_items_is_released_before_every_wait() {
    assert!(spdl_exec::set_before_block_hook(release_kept));
    assert!(!spdl_exec::set_before_block_hook(release_kept), "installed once per process");
    watchdog(120, || {
        let n = 20_000u64;
        let pipeline = PipelineBuilder::new()
            .source(0..n)
            .pipe(Stage::map("keeps", keep_lock))
            .pipe(Stage::map("keeps too", keep_lock))
            .sink(1)
            .build(BuildOptions { num_threads: 2, ..Default::default() })
            .expect("build");
        let mut sum = 0u64;
        for item in &pipeline {
            // The consumer takes the lock per item: a stage thread waiting for room while it keeps the lock
            // would deadlock here.
            acquire();
            sum += item.expect("item");
            release();
        }
        assert_eq!(sum, 4 * (n * (n - 1) / 2));
    });
    assert!(RELEASED_BY_HOOK.load(Ordering::Relaxed) > 0);
}
