#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]
//! Host memory for spdl-rs: one owned, aligned block per [`Buffer`], typed by a [`DType`], a shape and a
//! [`Layout`], and allocated by any [`HostAllocator`]; a [`CachingPool`] that recycles blocks of expensive
//! memory; and (feature `dlpack`) the `dlpack` module's export that hands buffers to PyTorch, JAX and NumPy in place.
//!
//! Every decoder in spdl-rs writes its output straight into a `Buffer`, and a batch decoder writes each
//! sample straight into its own slot of one contiguous batch buffer ([`Buffer::outer_slots_mut`]). The
//! allocator is a trait object, so the same decoder fills system memory ([`SystemAllocator`], the default)
//! or page-locked memory from `spdl-cuda`'s pinned pool without an intermediate copy. Nothing in this crate
//! assumes the system allocator; the buffer always frees its block through the allocator that made it.
//!
//! [`CachingPool`] is the size-class cache behind every pooled allocator: generic over a [`PoolBackend`]
//! (`spdl-cuda` plugs in `cuMemHostAlloc`; [`HeapBackend`] uses the heap), so its logic is tested here,
//! without a GPU.
//!
//! The [`mod@file`] module reads a local file with its cost bounded first (regular or special, capped, never blocking
//! on a FIFO): the one home of those reads for spdl-io's inputs and spdl-source's local store.
//!
//! The crate is std only, with or without the `dlpack` feature: its one dependency, `spdl-report` (how an
//! error is shown), is std only too.
//!
//! # Example
//! ```
//! use spdl_buffer::{Buffer, DType, Layout, system_allocator};
//!
//! // A batch of 2 RGB images, 4x3 pixels each, channels last.
//! let mut batch = Buffer::zeros(DType::U8, &[2, 3, 4, 3], Layout::Nhwc, &system_allocator())?;
//! for (i, slot) in batch.outer_slots_mut().into_iter().enumerate() {
//!     slot.fill(i as u8 + 1); // each sample is written in place, in parallel if you like
//! }
//! assert_eq!(batch.nbytes(), 2 * 3 * 4 * 3);
//! assert_eq!(batch.as_bytes()[0], 1);
//! assert_eq!(batch.as_bytes()[batch.nbytes() - 1], 2);
//! assert_eq!(batch.as_ptr() as usize % 64, 0);
//! # Ok::<(), spdl_buffer::BufferError>(())
//! ```
#![deny(missing_docs)]

mod alloc;
mod buffer;
#[cfg(feature = "dlpack")]
pub mod dlpack;
mod dtype;
mod error;
pub mod file;
mod pool;

pub use alloc::{Block, HostAllocator, LARGE_BLOCK, MIN_ALIGN, SharedAllocator, SystemAllocator, system_allocator};
pub use buffer::Buffer;
pub use dtype::{DType, Element, Layout};
pub use error::BufferError;
pub use pool::{CachingPool, HeapBackend, PAGE, PoolBackend, PoolConfig, PoolStats, size_class};
