//! GPU hand-off for spdl-rs: a pinned (page-locked) caching host allocator, asynchronous host-to-device copies
//! that overlap compute, and zero-copy DLPack export to PyTorch/JAX/CuPy.
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
//! The [`dlpack`] module (DLPack v0.8 structs and export of host [`spdl_buffer::Buffer`]s) needs no CUDA.
//! The caching logic ([`PinnedPool`]) is generic over a [`PinnedBackend`], so it is tested without a GPU.
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
//!         let tensor = spdl_cuda::dlpack::DlpackTensor::from_buffer(batch)?;
//!         assert_eq!(tensor.shape(), &[4, 64, 64, 3]);
//!     }
//! }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![deny(missing_docs)]

mod backend;
mod device;
pub mod dlpack;
mod error;
mod pinned;
mod pool;
mod tracker;
mod transfer;

#[cfg(all(test, feature = "cuda"))]
mod gpu_tests;

pub use device::{
    CudaDevice, PageablePolicy, Stream, StreamOptions, available, compiled_with_cuda, device_count, transfer,
};
pub use error::{DriverError, Error, Result};
pub use pinned::PinnedAllocator;
pub use pool::{HeapBackend, PAGE, PinnedBackend, PinnedPool, PoolConfig, PoolStats, size_class};
pub use transfer::{DeviceBuffer, Transfer, TransferConfig, TransferStats};
