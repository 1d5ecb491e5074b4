#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]
//! GPU hand-off for spdl-rs: a pinned (page-locked) caching host allocator, asynchronous host-to-device copies
//! that overlap compute, and zero-copy DLPack export of device buffers to PyTorch/JAX/CuPy.
//!
//! Start from [`Transfer`]: it opens a device, gives decoders a [`PinnedAllocator`] to build batches in (so a
//! batch is born in memory the GPU can DMA from: decoder → batch → GPU with no intermediate copy), and queues
//! each batch's copy on a dedicated copy stream with [`Transfer::transfer`], which returns at once. Queue the
//! next batch's copy before running the model on the current one and the two overlap. A batch's host buffer is
//! kept alive until its copy's event completes, then goes back to the pool, which pins each size class once
//! and recycles it, so a training loop never pins per batch.
//!
//! The driver is loaded at run time (cudarc's dynamic loading, behind the `cuda` feature, off by default):
//! the crate builds and its tests pass on machines without CUDA. [`available`] says whether a GPU can be used,
//! and [`CudaDevice::open`] returns a typed [`Error`] (not compiled, no driver, no device, index out of range),
//! never a panic. Without the `cuda` feature the same API exists and every constructor returns
//! [`Error::NotCompiled`], so facades need no `cfg`.
//!
//! What is not CUDA-specific lives in `spdl-buffer`: the caching pool ([`spdl_buffer::CachingPool`], of which
//! [`PinnedPool`] is the pinned specialisation over [`CudaHostBackend`]) and the one DLPack implementation
//! ([`spdl_buffer::dlpack`], re-exported here as [`dlpack`]; device buffers export through it).
//!
//! Modules depend one way: `device` (devices, streams, device buffers) ← `pinned` (the pinned backend and
//! allocator) ← `transfer` (the [`Transfer`] helper); `backend`, `tracker` and `error` sit below all three.
//!
//! # Example
//! ```
//! use spdl_buffer::{Buffer, DType, Layout, system_allocator};
//! use spdl_cuda::{Transfer, TransferConfig};
//!
//! match Transfer::open_if_available(&TransferConfig::default())? {
//!     Some(gpu) => {
//!         let alloc = gpu.allocator(); // pinned, pooled
//!         let mut next = Some(gpu.transfer(Buffer::zeros(DType::U8, &[4, 64, 64, 3], Layout::Nhwc, &alloc)?)?);
//!         for _step in 0..3 {
//!             let current = next.take().ok_or("no batch")?;
//!             // Queue the next copy first: it runs while the model works on `current`.
//!             next = Some(gpu.transfer(Buffer::zeros(DType::U8, &[4, 64, 64, 3], Layout::Nhwc, &alloc)?)?);
//!             current.synchronize()?; // or `compute_stream.wait_for(&current)?` to not block the host
//!             assert_eq!(current.shape(), &[4, 64, 64, 3]);
//!         }
//!         let stats = gpu.stats();
//!         println!("H2D {:?} GB/s, pool hit rate {:?}", stats.h2d_gbps(), stats.pool.map(|p| p.hit_rate()));
//!     }
//!     None => {
//!         // No GPU here: the CPU path. DLPack export of host buffers works everywhere.
//!         let batch = Buffer::zeros(DType::U8, &[4, 64, 64, 3], Layout::Nhwc, &system_allocator())?;
//!         let tensor = spdl_buffer::dlpack::DlpackTensor::from_buffer(batch)?;
//!         assert_eq!(tensor.shape(), &[4, 64, 64, 3]);
//!     }
//! }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![deny(missing_docs)]

mod backend;
mod device;
mod error;
mod pinned;
mod tracker;
mod transfer;

#[cfg(all(test, feature = "cuda"))]
mod gpu_tests;

pub use device::{
    CudaDevice, DeviceBuffer, PageablePolicy, Stream, StreamOptions, TransferStats, available, compiled_with_cuda,
    device_count, transfer,
};
pub use error::{DriverError, Error, Result};
pub use pinned::{CudaHostBackend, PinnedAllocator, PinnedPool};
pub use transfer::{Transfer, TransferConfig};

/// DLPack structs and export: spdl-buffer's implementation (one for host and device buffers), re-exported.
#[doc(no_inline)]
pub use spdl_buffer::dlpack;
/// The generic pool's parts, re-exported so paths from before the pool moved to spdl-buffer keep working.
#[doc(no_inline)]
pub use spdl_buffer::{CachingPool, HeapBackend, PAGE, PoolBackend, size_class};
/// The pool's settings and counters (spdl-buffer's, re-exported: they appear in this crate's API).
#[doc(no_inline)]
pub use spdl_buffer::{PoolConfig, PoolStats};
