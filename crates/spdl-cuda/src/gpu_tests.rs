//! GPU-only unit tests that need the crate's internals (a kernel on a second stream, events).
//!
//! Without a GPU each test prints "skipped: no GPU" to stderr and returns; with `SPDL_REQUIRE_GPU=1` (set by
//! `cargo xtask gpu-check`) a missing GPU fails instead.

use std::time::{Duration, Instant};

use spdl_buffer::{Buffer, DType, Layout};

use crate::{CudaDevice, Transfer, TransferConfig, available};

pub(crate) fn gpu_or_skip(test: &str) -> Option<CudaDevice> {
    if available() {
        return CudaDevice::open(0).ok();
    }
    let why = CudaDevice::open(0).err().map(|e| e.to_string()).unwrap_or_default();
    if std::env::var("SPDL_REQUIRE_GPU").is_ok_and(|v| v == "1") {
        panic!("{test}: SPDL_REQUIRE_GPU=1 but no GPU can be used: {why}");
    }
    eprintln!("{test}: skipped: no GPU ({why})");
    None
}

/// Host wall time of `f` followed by a full device synchronize.
fn timed(dev: &CudaDevice, f: impl FnOnce()) -> Duration {
    let t0 = Instant::now();
    f();
    dev.synchronize().unwrap();
    t0.elapsed()
}

#[test]
fn copy_overlaps_compute_on_another_stream() {
    let Some(dev) = gpu_or_skip("copy_overlaps_compute_on_another_stream") else { return };
    let gpu = Transfer::new(&TransferConfig::default()).unwrap();
    let compute = dev.new_stream().unwrap();
    const COPY: usize = 256 << 20;
    const SCRATCH: usize = 512 << 20;
    let scratch = compute.raw().alloc(SCRATCH).unwrap();
    let memset = |n: usize| {
        for i in 0..n {
            // SAFETY: `scratch` holds SCRATCH bytes and outlives the queued work (we synchronize before dropping).
            unsafe { compute.raw().memset(scratch.ptr(), i as u8, SCRATCH).unwrap() };
        }
    };
    let batch = || Buffer::zeros(DType::U8, &[COPY], Layout::Plain, &gpu.allocator()).unwrap();

    // Warm up (pins the pool's block, loads the memset kernel) and size the compute to about the copy's time.
    let mut keep = vec![gpu.transfer(batch()).unwrap()];
    memset(1);
    dev.synchronize().unwrap();
    let pre = batch();
    let t_copy = timed(&dev, || keep.push(gpu.transfer(pre).unwrap()));
    let t_one = timed(&dev, || memset(1));
    let n = (t_copy.as_secs_f64() / t_one.as_secs_f64().max(1e-6)).ceil().clamp(1.0, 5000.0) as usize;
    let t_compute = timed(&dev, || memset(n));

    // Both at once, on two streams: best of three, to stay robust on a shared machine.
    let mut best = f64::INFINITY;
    for _ in 0..3 {
        let pre = batch();
        let t_both = timed(&dev, || {
            memset(n);
            keep.push(gpu.transfer(pre).unwrap());
        });
        best = best.min(t_both.as_secs_f64() / (t_copy + t_compute).as_secs_f64());
    }
    eprintln!(
        "overlap: copy {t_copy:?}, compute ({n} memsets) {t_compute:?}, both at once / serial sum = {best:.2} \
         (1.0 = no overlap, 0.5 = perfect)"
    );
    assert!(best < 0.85, "copy and compute did not overlap: concurrent/serial = {best:.2}");
    gpu.synchronize().unwrap();
    compute.synchronize().unwrap();
    drop(keep);
    drop(scratch);
}

#[test]
fn timing_events_measure_the_copy() {
    let Some(_dev) = gpu_or_skip("timing_events_measure_the_copy") else { return };
    let gpu = Transfer::new(&TransferConfig::default()).unwrap();
    let mut keep = Vec::new();
    for _ in 0..8 {
        let b = Buffer::zeros(DType::F32, &[4 << 20], Layout::Plain, &gpu.allocator()).unwrap();
        keep.push(gpu.transfer(b).unwrap());
    }
    gpu.synchronize().unwrap();
    let s = gpu.stats();
    assert_eq!((s.copies, s.completed_copies, s.pinned_copies), (8, 8, 8));
    assert_eq!(s.timed_bytes, 8 * (16 << 20));
    let gbps = s.h2d_gbps().unwrap();
    eprintln!("event-timed pinned H2D: {gbps:.1} GB/s over {:?}", s.device_time);
    assert!(gbps > 0.5 && gbps < 10_000.0, "implausible bandwidth {gbps}");
}
