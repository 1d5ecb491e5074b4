//! A quick per-item overhead probe (the criterion bench in `benches/benches/exec.rs` is the
//! reference): `cargo run --release -p spdl-exec --example overhead [ITEMS]`.

use std::convert::Infallible;
use std::hint::black_box;
use std::time::Instant;

use spdl_exec::{BuildOptions, PipelineBuilder, PipelineError, Stage};

fn step(x: u64) -> u64 {
    black_box(x).wrapping_mul(3).wrapping_add(1)
}

fn run(items: u64, stages: usize, is_async: bool, concurrency: usize) -> Result<f64, PipelineError> {
    let make = |name: String| -> Stage<u64, u64> {
        if is_async {
            Stage::map_async(name, |x: u64| async move { Ok::<_, Infallible>(step(x)) })
        } else {
            Stage::map(name, |x: u64| Ok::<_, Infallible>(step(x)))
        }
        .concurrency(concurrency)
    };
    let mut b = PipelineBuilder::new().source(0..items).pipe(make("s0".into()));
    for i in 1..stages {
        b = b.pipe(make(format!("s{i}")));
    }
    let cap: usize =
        std::env::var("QUEUE_CAP").ok().and_then(|v| v.parse().ok()).unwrap_or(BuildOptions::default().queue_capacity);
    let pipeline = b.sink(cap).build(BuildOptions { queue_capacity: cap, ..BuildOptions::default() })?;
    let t0 = Instant::now();
    let mut n = 0u64;
    for x in &pipeline {
        black_box(x?);
        n += 1;
    }
    let secs = t0.elapsed().as_secs_f64();
    assert_eq!(n, items);
    if std::env::var_os("SHOW_STATS").is_some() {
        println!("{}", pipeline.stats());
    }
    Ok(secs)
}

fn main() -> Result<(), PipelineError> {
    let items: u64 = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(100_000);
    println!("{items} items; per item per stage (median of 5 runs)");
    for stages in [1usize, 3] {
        for is_async in [false, true] {
            for concurrency in [1usize, 4] {
                let mut times = Vec::new();
                for _ in 0..5 {
                    times.push(run(items, stages, is_async, concurrency)?);
                }
                times.sort_by(f64::total_cmp);
                let per = times[2] / items as f64 / stages as f64 * 1e9;
                println!(
                    "{stages} stage(s) {:8} c{concurrency}: {per:8.0} ns",
                    if is_async { "async" } else { "blocking" }
                );
            }
        }
    }
    Ok(())
}
