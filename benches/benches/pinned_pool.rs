//! spdl-buffer's caching pool (behind spdl-cuda's pinned allocator), CPU side (no GPU needed): what a batch
//! allocation costs when served from the pool's cache (the steady state of a training loop) against the system
//! allocator, for one 224x224x3x32 u8 batch (4.6 MiB). With `HeapBackend` the pool's memory is ordinary heap;
//! with the CUDA backend the miss path is `cuMemHostAlloc` (milliseconds), which is what the cache saves, while
//! the hit path is the same code as here.
//!
//! `cargo bench -p spdl-benches --bench pinned_pool` (results: docs/benchmarks.md, "spdl-cuda").

use std::alloc::Layout as MemLayout;
use std::hint::black_box;
use std::sync::Arc;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use spdl_buffer::{CachingPool, HeapBackend, PoolConfig, SharedAllocator, SystemAllocator};

const BATCH: usize = 32 * 224 * 224 * 3;

fn alloc_release(c: &mut Criterion) {
    let layout = MemLayout::from_size_align(BATCH, 64).expect("layout");
    let pool: SharedAllocator = Arc::new(CachingPool::new(HeapBackend, PoolConfig::default()));
    let system: SharedAllocator = Arc::new(SystemAllocator);
    let mut g = c.benchmark_group("alloc_release_4.6MiB");
    g.throughput(Throughput::Elements(1));
    for (name, alloc) in [("pool_hit", &pool), ("system", &system)] {
        g.bench_function(name, |b| {
            b.iter(|| {
                let block = alloc.allocate(black_box(layout)).expect("allocate");
                black_box(block.as_ptr());
                alloc.release(block);
            })
        });
    }
    // Allocate, write every byte (as a decoder fills its batch), release: page faults vs recycled pages.
    for (name, alloc) in [("pool_hit_and_fill", &pool), ("system_and_fill", &system)] {
        g.bench_function(name, |b| {
            b.iter(|| {
                let block = alloc.allocate(black_box(layout)).expect("allocate");
                // SAFETY: the block holds at least BATCH writable bytes and is ours until released.
                unsafe { std::ptr::write_bytes(block.as_ptr(), 7, BATCH) };
                black_box(block.as_ptr());
                alloc.release(block);
            })
        });
    }
    g.finish();
}

criterion_group!(benches, alloc_release);
criterion_main!(benches);
