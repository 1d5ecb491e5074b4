//! The cost of whole-pipeline checkpoints at 10^6 items: the state's size and the time of one `state()`
//! call mid-epoch, and the per-item cost of keyed items against the same pipeline without them.
//!
//! `cargo run --release -p spdl-checkpoint --example checkpoint_overhead`

use std::time::Instant;

use spdl_checkpoint::{Checkpoint, CheckpointSource, CheckpointedPipeline};
use spdl_exec::{BoxError, BuildOptions, PipelineBuilder, Stage};

const N: u64 = 1_000_000;

struct Range {
    epoch: u64,
}

impl CheckpointSource for Range {
    type Item = u64;
    type Epoch = std::ops::Range<u64>;
    fn state(&self) -> Result<serde_json::Value, BoxError> {
        Ok(serde_json::json!({ "epoch": self.epoch }))
    }
    fn load_state(&mut self, state: &serde_json::Value) -> Result<(), BoxError> {
        self.epoch = state["epoch"].as_u64().ok_or("no epoch")?;
        Ok(())
    }
    fn next_epoch(&mut self) -> Result<Self::Epoch, BoxError> {
        self.epoch += 1;
        Ok(0..N)
    }
}

fn options() -> BuildOptions {
    BuildOptions { num_threads: 2, ..BuildOptions::default() }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Plain pipeline.
    let t = Instant::now();
    let plain = PipelineBuilder::new()
        .source(0..N)
        .pipe(Stage::map("work", |x: u64| Ok::<_, BoxError>(x.wrapping_mul(3))).concurrency(2))
        .sink(8)
        .build(options())?;
    let mut sum = 0u64;
    for x in &plain {
        sum = sum.wrapping_add(x?);
    }
    let plain_s = t.elapsed().as_secs_f64();

    // The same, keyed, with a state() every 1000 items.
    let ckpt = Checkpoint::new();
    let t = Instant::now();
    let keyed = PipelineBuilder::new()
        .source(ckpt.input(Range { epoch: 0 })?)
        .pipe(ckpt.map("work", |x: u64| Ok::<_, BoxError>(x.wrapping_mul(3))).concurrency(2))
        .sink(8)
        .build(options())?;
    let keyed = CheckpointedPipeline::new(keyed, ckpt);
    let (mut calls, mut state_s, mut max_len, mut sum2) = (0u32, 0f64, 0usize, 0u64);
    for (i, x) in keyed.iter().enumerate() {
        sum2 = sum2.wrapping_add(x?);
        if i % 1000 == 999 {
            let s = Instant::now();
            let json = keyed.state()?.to_json()?;
            state_s += s.elapsed().as_secs_f64();
            calls += 1;
            max_len = max_len.max(json.len());
        }
    }
    let keyed_s = t.elapsed().as_secs_f64();
    assert_eq!(sum, sum2);
    println!("items: {N}");
    println!("plain pipeline: {:.3} s ({:.0} ns/item)", plain_s, plain_s * 1e9 / N as f64);
    println!(
        "keyed pipeline: {:.3} s ({:.0} ns/item, {:.2}x plain), state() calls included",
        keyed_s,
        keyed_s * 1e9 / N as f64,
        keyed_s / plain_s
    );
    println!(
        "state() + to_json(): {calls} calls, {:.1} us each, largest state {max_len} bytes",
        state_s * 1e6 / f64::from(calls)
    );
    Ok(())
}
