use std::alloc::Layout as MemLayout;
use std::fmt;
use std::ptr::NonNull;
use std::sync::{Arc, OnceLock};

use crate::BufferError;

/// Every block handed out for a [`crate::Buffer`] is aligned to at least this many bytes (a cache line, and
/// enough for any SIMD load and for DMA engines).
pub const MIN_ALIGN: usize = 64;

/// A block of host memory owned by whoever holds it, to be given back to the [`HostAllocator`] that made it.
///
/// A `Block` does not free itself: [`crate::Buffer`] returns it to its allocator on drop.
#[derive(Debug)]
pub struct Block {
    ptr: NonNull<u8>,
    layout: MemLayout,
    tag: usize,
}

// SAFETY: a Block is a unique handle to a heap block; it is never aliased and carries no thread affinity.
unsafe impl Send for Block {}
// SAFETY: `&Block` only exposes the address and sizes; reading or writing the memory goes through `Buffer`,
// whose borrow rules make it exclusive for writes.
unsafe impl Sync for Block {}

impl Block {
    /// Wraps memory that an allocator owns.
    ///
    /// # Safety
    /// `ptr` must be valid for reads and writes of `layout.size()` bytes, aligned to `layout.align()`, and not
    /// used by anyone else until the block is released. For `layout.size() == 0` a dangling aligned pointer
    /// is allowed. `tag` is opaque to everyone but the allocator (e.g. a size class or a pinned-pool index).
    pub unsafe fn from_raw_parts(ptr: NonNull<u8>, layout: MemLayout, tag: usize) -> Block {
        Block { ptr, layout, tag }
    }

    /// Start of the block.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// The usable size in bytes (at least what was requested).
    pub fn size(&self) -> usize {
        self.layout.size()
    }

    /// The size and alignment the block was made with.
    pub fn layout(&self) -> MemLayout {
        self.layout
    }

    /// The allocator's opaque tag.
    pub fn tag(&self) -> usize {
        self.tag
    }
}

/// Allocates aligned host memory for [`crate::Buffer`]s.
///
/// Implementations: [`SystemAllocator`] (the global heap), [`crate::CachingPool`] (recycled blocks from a
/// [`crate::PoolBackend`]), and `spdl_cuda::PinnedAllocator` (page-locked memory from such a pool). Decoders
/// take an allocator so that a batch can be built directly in the memory it will be copied to the GPU from.
///
/// Contract: `allocate` returns a block of at least `layout.size()` bytes aligned to at least `layout.align()`
/// (callers pass at least [`MIN_ALIGN`]); a zero-size request succeeds. `release` is called exactly once per
/// block, with a block this allocator returned.
///
/// # Example
/// ```
/// use spdl_buffer::{Buffer, DType, HostAllocator, Layout, SystemAllocator};
/// use std::sync::Arc;
///
/// let alloc: Arc<dyn HostAllocator> = Arc::new(SystemAllocator);
/// let buf = Buffer::zeros(DType::F32, &[3, 224, 224], Layout::Chw, &alloc)?;
/// assert_eq!(buf.as_slice::<f32>()?.len(), 3 * 224 * 224);
/// # Ok::<(), spdl_buffer::BufferError>(())
/// ```
pub trait HostAllocator: Send + Sync + fmt::Debug {
    /// Allocates a block of uninitialized memory.
    fn allocate(&self, layout: MemLayout) -> Result<Block, BufferError>;

    /// Allocates a block whose bytes are all zero. The default writes zeros after [`Self::allocate`].
    fn allocate_zeroed(&self, layout: MemLayout) -> Result<Block, BufferError> {
        let block = self.allocate(layout)?;
        // SAFETY: the block is valid for writes of `size()` bytes and exclusively ours.
        unsafe { std::ptr::write_bytes(block.as_ptr(), 0, block.size()) };
        Ok(block)
    }

    /// Gives a block back. Called exactly once per block this allocator returned.
    fn release(&self, block: Block);

    /// A short name for errors and stats (`"system"`, `"cuda-pinned"`).
    fn name(&self) -> &str;

    /// True if the memory is page-locked (eligible for asynchronous DMA to a device).
    fn is_pinned(&self) -> bool {
        false
    }
}

/// A shared handle to an allocator, as buffers and decoders hold it.
pub type SharedAllocator = Arc<dyn HostAllocator>;

/// The global heap (`std::alloc`), with every block aligned to at least [`MIN_ALIGN`].
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemAllocator;

fn checked(layout: MemLayout) -> Result<MemLayout, BufferError> {
    let align = layout.align().max(MIN_ALIGN);
    MemLayout::from_size_align(layout.size(), align)
        .map_err(|_| BufferError::SizeOverflow { shape: vec![layout.size()] })
}

impl SystemAllocator {
    fn alloc_with(&self, layout: MemLayout, zeroed: bool) -> Result<Block, BufferError> {
        let layout = checked(layout)?;
        if layout.size() == 0 {
            // Zero-size: a dangling pointer with the right alignment; nothing to free.
            let ptr = NonNull::new(layout.align() as *mut u8).ok_or(BufferError::BadAlignment(0))?;
            // SAFETY: zero-size blocks are never read or written.
            return Ok(unsafe { Block::from_raw_parts(ptr, layout, 0) });
        }
        // SAFETY: the layout has non-zero size.
        let raw = unsafe { if zeroed { std::alloc::alloc_zeroed(layout) } else { std::alloc::alloc(layout) } };
        let ptr = NonNull::new(raw).ok_or_else(|| BufferError::OutOfMemory {
            allocator: "system".into(),
            bytes: layout.size(),
            cause: "the global allocator returned null".into(),
        })?;
        // SAFETY: freshly allocated with `layout`, exclusively ours.
        Ok(unsafe { Block::from_raw_parts(ptr, layout, 0) })
    }
}

impl HostAllocator for SystemAllocator {
    fn allocate(&self, layout: MemLayout) -> Result<Block, BufferError> {
        self.alloc_with(layout, false)
    }

    fn allocate_zeroed(&self, layout: MemLayout) -> Result<Block, BufferError> {
        // calloc-style: fresh pages from the OS are already zero, so this is cheaper than write_bytes.
        self.alloc_with(layout, true)
    }

    fn release(&self, block: Block) {
        if block.size() != 0 {
            // SAFETY: the block came from `alloc_with` with exactly this layout and is released once.
            unsafe { std::alloc::dealloc(block.as_ptr(), block.layout()) };
        }
    }

    fn name(&self) -> &str {
        "system"
    }
}

/// The process-wide shared [`SystemAllocator`] handle.
pub fn system_allocator() -> SharedAllocator {
    static SYSTEM: OnceLock<SharedAllocator> = OnceLock::new();
    SYSTEM.get_or_init(|| Arc::new(SystemAllocator)).clone()
}
