//! Stopping a graph mid-run joins every thread of every branch and region (alone in its
//! test binary, so that other tests' threads do not count).

mod common;

use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use common::graph::big_graph;
use common::{thread_count, threads_back_to, watchdog};

#[test]
fn stopping_mid_graph_joins_every_thread_over_200_cycles() {
    watchdog(300, || {
        let baseline = thread_count();
        for cycle in 0..200u64 {
            let counter = Arc::new(AtomicU64::new(0));
            let p = big_graph(Arc::clone(&counter));
            let n = (cycle % 7) as usize;
            let got: Vec<_> = p.iter().take(n).collect();
            assert_eq!(got.len(), n);
            if cycle % 2 == 0 {
                p.stop();
            }
            drop(p);
            // Every thread of every branch and region is joined by then.
            assert_eq!(threads_back_to(baseline, Duration::from_secs(10)), baseline, "cycle {cycle}");
        }
    });
}
