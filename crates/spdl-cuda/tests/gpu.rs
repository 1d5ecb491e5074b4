//! GPU tests of the public API: round trips of random data over many sizes (pinned, pageable via the driver,
//! pageable staged), the pinned pool in steady state, copies pipelined against a compute stream, DLPack export.
//!
//! Without a GPU each test prints "skipped: no GPU" to stderr and returns; with `SPDL_REQUIRE_GPU=1` (set by
//! `cargo xtask gpu-check`) a missing GPU fails the test instead.

use std::sync::Arc;

use spdl_buffer::dlpack::{DLDeviceType, DlpackTensor};
use spdl_buffer::{Buffer, DType, Layout, SharedAllocator, system_allocator};
use spdl_cuda::{
    CudaDevice, PageablePolicy, PinnedAllocator, PoolConfig, StreamOptions, Transfer, TransferConfig, available,
};

fn gpu_or_skip(test: &str) -> Option<CudaDevice> {
    if available() {
        return Some(CudaDevice::open(0).expect("available() said a GPU can be used"));
    }
    let why = CudaDevice::open(0).err().map(|e| e.to_string()).unwrap_or_default();
    if std::env::var("SPDL_REQUIRE_GPU").is_ok_and(|v| v == "1") {
        panic!("{test}: SPDL_REQUIRE_GPU=1 but no GPU can be used: {why}");
    }
    eprintln!("{test}: skipped: no GPU ({why})");
    None
}

/// Deterministic pseudo-random bytes (xorshift), different per seed.
fn random_bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

fn filled(n: usize, seed: u64, alloc: &SharedAllocator) -> (Buffer, Vec<u8>) {
    let data = random_bytes(n, seed);
    let buf = Buffer::from_slice(&data, &[n], Layout::Plain, alloc).unwrap();
    (buf, data)
}

const SIZES: [usize; 12] =
    [0, 1, 3, 4095, 4096, 4097, 65_537, 1 << 20, (1 << 20) + 3, 3 * 224 * 224 * 32, (16 << 20) + 5, 64 << 20];

#[test]
fn round_trip_random_data_pinned_and_pageable() {
    let Some(dev) = gpu_or_skip("round_trip_random_data_pinned_and_pageable") else { return };
    let pinned = PinnedAllocator::new(&dev, PoolConfig::default());
    let pinned_alloc: SharedAllocator = pinned.clone();
    let driver = dev.new_stream().unwrap();
    let staged = dev
        .new_stream_with(StreamOptions { pageable: PageablePolicy::Staged(pinned_alloc.clone()), timing: true })
        .unwrap();
    for (i, &n) in SIZES.iter().enumerate() {
        let seed = i as u64;
        // Pinned memory, DMA'd directly.
        let (buf, data) = filled(n, seed, &pinned_alloc);
        assert!(buf.is_pinned());
        let d = driver.transfer(buf).unwrap();
        assert_eq!((d.shape(), d.dtype(), d.nbytes()), (&[n][..], DType::U8, n));
        assert_eq!(d.to_host().unwrap().as_bytes(), &data[..], "pinned, {n} bytes");
        // Pageable memory handed to the driver.
        let (buf, data) = filled(n, seed + 100, &system_allocator());
        let d = driver.transfer(buf).unwrap();
        assert_eq!(d.to_host().unwrap().as_bytes(), &data[..], "pageable via driver, {n} bytes");
        // Pageable memory staged through the pinned pool (the source is freed before the DMA runs).
        let (buf, data) = filled(n, seed + 200, &system_allocator());
        let d = staged.transfer(buf).unwrap();
        assert_eq!(d.to_host().unwrap().as_bytes(), &data[..], "pageable staged, {n} bytes");
    }
    driver.synchronize().unwrap();
    staged.synchronize().unwrap();
    let (a, b) = (driver.stats(), staged.stats());
    assert_eq!((a.pinned_copies, a.pageable_copies), (SIZES.len() as u64 - 1, SIZES.len() as u64 - 1));
    assert_eq!(b.staged_copies, SIZES.len() as u64 - 1);
    assert_eq!(a.completed_copies, a.copies);
    assert_eq!(pinned.stats().blocks_in_use, 0, "every pinned source and staging block went back to the pool");
}

#[test]
fn typed_buffers_keep_dtype_shape_layout() {
    let Some(_dev) = gpu_or_skip("typed_buffers_keep_dtype_shape_layout") else { return };
    let gpu = Transfer::new(&TransferConfig::default()).unwrap();
    let vals: Vec<f32> = random_bytes(2 * 3 * 5 * 7 * 4, 9)
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], 0x3f]))
        .collect();
    let buf = Buffer::from_slice(&vals, &[2, 3, 5, 7], Layout::Nchw, &gpu.allocator()).unwrap();
    let d = gpu.transfer(buf).unwrap();
    assert_eq!((d.dtype(), d.shape(), d.layout(), d.len()), (DType::F32, &[2, 3, 5, 7][..], Layout::Nchw, 210));
    d.synchronize().unwrap();
    assert!(d.is_ready().unwrap());
    let back = d.to_host().unwrap();
    assert_eq!(back.as_slice::<f32>().unwrap(), &vals[..]);
    assert_eq!(back.layout(), Layout::Nchw);
}

#[test]
fn steady_state_pipeline_hits_the_pool_and_overlaps_with_a_compute_stream() {
    let Some(dev) = gpu_or_skip("steady_state_pipeline_hits_the_pool") else { return };
    let gpu = Transfer::new(&TransferConfig::default()).unwrap();
    let compute = dev.new_stream().unwrap();
    let shape = [16, 3, 128, 128];
    let n = shape.iter().product::<usize>();
    let make = |i: u64| {
        let data = random_bytes(n, 1000 + i);
        let buf = Buffer::from_slice(&data, &shape, Layout::Nchw, &gpu.allocator()).unwrap();
        (buf, data)
    };
    let mut warm = None;
    let mut prev: Option<(spdl_cuda::DeviceBuffer, Vec<u8>)> = None;
    for i in 0..300u64 {
        if i == 10 {
            warm = Some(gpu.stats().pool.unwrap());
        }
        let (buf, data) = make(i);
        let next = gpu.transfer(buf).unwrap(); // queued before the previous batch is consumed
        if let Some((cur, expect)) = prev.take() {
            compute.wait_for(&cur).unwrap(); // the compute stream waits on the device, the host does not
            if i % 50 == 0 {
                assert_eq!(cur.to_host().unwrap().as_bytes(), &expect[..], "batch {i}");
            }
        }
        prev = Some((next, data));
    }
    gpu.synchronize().unwrap();
    compute.synchronize().unwrap();
    let stats = gpu.stats();
    let pool = stats.pool.unwrap();
    let rate = pool.hit_rate_since(&warm.unwrap());
    eprintln!(
        "pool steady-state hit rate {:.4}, {} blocks held, H2D {:?} GB/s",
        rate,
        pool.blocks_cached,
        stats.h2d_gbps()
    );
    assert!(rate >= 0.99, "steady-state hit rate {rate}");
    assert!(pool.blocks_cached <= 4, "a depth-2 pipeline needs few blocks, pool holds {}", pool.blocks_cached);
    assert_eq!(stats.completed_copies, 300);
    assert_eq!(stats.in_flight, 0);
}

#[test]
fn transfers_from_several_threads_on_one_stream() {
    let Some(_dev) = gpu_or_skip("transfers_from_several_threads_on_one_stream") else { return };
    let gpu = Arc::new(Transfer::new(&TransferConfig::default()).unwrap());
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let gpu = gpu.clone();
            s.spawn(move || {
                for i in 0..20u64 {
                    let (buf, data) = filled(100_000 + 4096 * i as usize, t * 1000 + i, &gpu.allocator());
                    let d = gpu.transfer(buf).unwrap();
                    assert_eq!(d.to_host().unwrap().as_bytes(), &data[..]);
                }
            });
        }
    });
    gpu.synchronize().unwrap();
    assert_eq!(gpu.stats().pool.unwrap().blocks_in_use, 0);
}

#[test]
fn device_dlpack_export_shares_device_memory() {
    let Some(dev) = gpu_or_skip("device_dlpack_export_shares_device_memory") else { return };
    let gpu = Transfer::new(&TransferConfig::default()).unwrap();
    let consumer = dev.new_stream().unwrap();
    let (buf, _) = filled(3 * 32 * 32, 5, &gpu.allocator());
    let mut buf = buf;
    buf.reshape(&[3, 32, 32], Layout::Chw).unwrap();
    let d = gpu.transfer(buf).unwrap();
    let ptr = d.device_ptr();
    let t = d.into_dlpack(Some(&consumer)).unwrap();
    let dl = t.tensor();
    assert_eq!(dl.device.device_type, DLDeviceType::CUDA);
    assert_eq!(dl.device.device_id, 0);
    assert_eq!(dl.data as usize as u64, ptr);
    assert_eq!(t.shape(), &[3, 32, 32]);
    assert_eq!(t.strides(), &[1024, 32, 1]);
    // The consumer deletes it through the C path; the memory is freed stream-ordered after the consumer.
    let raw = t.into_raw();
    // SAFETY: ours, deleted once.
    unsafe { ((*raw).deleter.unwrap())(raw) };
    consumer.synchronize().unwrap();

    // A raw handle, as Python's __dlpack__(stream=...) passes it: the legacy default stream.
    let (buf, _) = filled(1000, 6, &gpu.allocator());
    let d = gpu.transfer(buf).unwrap();
    // SAFETY: the legacy default stream always exists.
    let t = unsafe { d.into_dlpack_for_stream_handle(1) }.unwrap();
    drop::<DlpackTensor>(t);
    dev.synchronize().unwrap();
}

#[test]
fn shared_buffers_are_held_until_their_copy_is_done_then_let_go() {
    let Some(_dev) = gpu_or_skip("shared_buffers_are_held_until_their_copy_is_done_then_let_go") else { return };
    let gpu = Transfer::new(&TransferConfig::default()).unwrap();
    for (seed, alloc) in [(1, gpu.allocator()), (2, system_allocator())] {
        let (buf, data) = filled(3 << 20, seed, &alloc);
        let shared = Arc::new(buf);
        let d = gpu.transfer_shared(Arc::clone(&shared)).unwrap();
        d.synchronize().unwrap();
        gpu.stream().release_completed().unwrap();
        assert_eq!(Arc::strong_count(&shared), 1, "the stream let go of the caller's buffer once the copy was done");
        assert_eq!(d.to_host().unwrap().as_bytes(), &data[..], "seed {seed}");
    }
    let stats = gpu.stats();
    assert_eq!((stats.pinned_copies, stats.staged_copies), (1, 1));
}
