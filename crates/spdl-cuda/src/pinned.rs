//! The CUDA pinned-memory backend of spdl-buffer's [`CachingPool`], and the allocator built on it.

use std::alloc::Layout as MemLayout;
use std::ptr::NonNull;
use std::sync::Arc;

use spdl_buffer::{Block, BufferError, CachingPool, HostAllocator, PoolBackend, PoolConfig, PoolStats};

use crate::backend;
use crate::device::CudaDevice;
use crate::error::{Error, Result};

/// Page-locked host memory from the CUDA driver (`cuMemHostAlloc` with `CU_MEMHOSTALLOC_PORTABLE` /
/// `cuMemFreeHost`, through cudarc's run-time loaded driver) on one device's context: the [`PoolBackend`] of
/// [`PinnedPool`] and [`PinnedAllocator`].
#[derive(Debug)]
pub struct CudaHostBackend {
    ctx: backend::Context,
}

impl CudaHostBackend {
    /// A backend that pins memory in `device`'s context.
    #[cfg_attr(not(feature = "cuda"), allow(unreachable_code, unused_variables))] // uninhabited stub types
    pub fn new(device: &CudaDevice) -> CudaHostBackend {
        CudaHostBackend { ctx: device.ctx.clone() }
    }
}

impl PoolBackend for CudaHostBackend {
    type Error = Error;

    fn alloc_block(&self, size: usize) -> Result<NonNull<u8>> {
        self.ctx.alloc_host(size)
    }

    unsafe fn free_block(&self, ptr: NonNull<u8>, _size: usize) -> Result<()> {
        // SAFETY: forwarded to the caller (the pool frees each block it got from `alloc_block` once).
        unsafe { self.ctx.free_host(ptr) }
    }

    fn name(&self) -> &str {
        "cuda-pinned"
    }

    fn is_pinned(&self) -> bool {
        true
    }
}

/// spdl-buffer's [`CachingPool`] over pinned memory: the pool behind [`PinnedAllocator`]. Any other
/// [`PoolBackend`] may be named (`PinnedPool<HeapBackend>` is the generic pool over heap memory, as before the
/// pool moved to spdl-buffer); new code names [`CachingPool`] for those.
///
/// # Example
/// ```
/// use spdl_cuda::{CudaDevice, CudaHostBackend, HeapBackend, PinnedPool, PoolConfig};
///
/// // The path code written against the old generic pool used still works.
/// let heap = PinnedPool::new(HeapBackend, PoolConfig::default());
/// assert_eq!(heap.stats().misses, 0);
/// if let Ok(dev) = CudaDevice::open(0) {
///     let pinned: PinnedPool = PinnedPool::new(CudaHostBackend::new(&dev), PoolConfig { max_bytes: 1 << 30 });
///     assert!(spdl_buffer::HostAllocator::is_pinned(&pinned));
/// }
/// ```
pub type PinnedPool<B = CudaHostBackend> = CachingPool<B>;

/// Page-locked host memory from the CUDA driver behind a caching pool: implements
/// [`spdl_buffer::HostAllocator`], so decoders build batches directly in memory the GPU can DMA from.
///
/// Pinning costs milliseconds per call; the pool pins each size class once and recycles freed blocks (see
/// [`CachingPool`] for the size classes, the cap and the eviction order), so a training loop does not pin per
/// batch. Blocks are allocated with `CU_MEMHOSTALLOC_PORTABLE`: any context in the process can use them.
///
/// # Example
/// ```
/// use spdl_buffer::{Buffer, DType, Layout, SharedAllocator};
/// use spdl_cuda::{CudaDevice, PinnedAllocator, PoolConfig};
///
/// if let Ok(dev) = CudaDevice::open(0) {
///     let pinned = PinnedAllocator::new(&dev, PoolConfig { max_bytes: 1 << 30 });
///     let alloc: SharedAllocator = pinned.clone();
///     let batch = Buffer::zeros(DType::F32, &[8, 3, 224, 224], Layout::Nchw, &alloc)?;
///     assert!(batch.is_pinned());
///     drop(batch);
///     assert_eq!(pinned.stats().blocks_cached, 1); // kept for the next batch
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct PinnedAllocator {
    pool: PinnedPool,
    device: CudaDevice,
}

impl PinnedAllocator {
    /// An empty pool on `device`'s context; memory is pinned on first use (or by [`Self::reserve`]).
    #[cfg_attr(not(feature = "cuda"), allow(unreachable_code, unused_variables))] // uninhabited stub types
    pub fn new(device: &CudaDevice, config: PoolConfig) -> Arc<PinnedAllocator> {
        Arc::new(PinnedAllocator {
            pool: CachingPool::new(CudaHostBackend::new(device), config),
            device: device.clone(),
        })
    }

    /// The device whose context pins the memory.
    pub fn device(&self) -> &CudaDevice {
        &self.device
    }

    /// The pool's settings.
    pub fn config(&self) -> &PoolConfig {
        self.pool.config()
    }

    /// A snapshot of the pool's counters (hits, misses, bytes held, ...).
    pub fn stats(&self) -> PoolStats {
        self.pool.stats()
    }

    /// Unpins every cached block; returns the bytes freed.
    pub fn trim(&self) -> usize {
        self.pool.trim()
    }

    /// Pins `count` blocks for requests of `size` bytes now, so the first batches do not pay for pinning.
    pub fn reserve(&self, size: usize, count: usize) -> std::result::Result<(), BufferError> {
        self.pool.reserve(size, count)
    }
}

impl HostAllocator for PinnedAllocator {
    fn allocate(&self, layout: MemLayout) -> std::result::Result<Block, BufferError> {
        self.pool.allocate(layout)
    }

    fn release(&self, block: Block) {
        self.pool.release(block)
    }

    fn name(&self) -> &str {
        self.pool.name()
    }

    fn is_pinned(&self) -> bool {
        true
    }
}
