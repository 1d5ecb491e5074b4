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

/// Blocks of at least this many bytes are mapped on their own, in 2 MiB-aligned ranges the kernel may back
/// with transparent huge pages (Linux): a 44 MB batch of video clips then costs 22 page faults instead of
/// 11,000, and no zero-fill pass (fresh mappings are zero).
pub const LARGE_BLOCK: usize = 2 << 20;

/// The tag of a block [`SystemAllocator`] mapped itself.
const MAPPED: usize = 1;

#[cfg(target_os = "linux")]
mod large {
    use std::ptr::NonNull;

    use super::LARGE_BLOCK;

    /// The mapped length of a block of `size` bytes: whole 2 MiB units.
    pub(super) fn mapped_len(size: usize) -> Option<usize> {
        size.checked_next_multiple_of(LARGE_BLOCK)
    }

    /// Maps `len` zeroed bytes (a multiple of [`LARGE_BLOCK`]) at a [`LARGE_BLOCK`]-aligned address, asking
    /// for huge pages. `None` when the kernel refuses the mapping.
    pub(super) fn map(len: usize) -> Option<NonNull<u8>> {
        let span = len.checked_add(LARGE_BLOCK)?;
        // SAFETY: an anonymous private mapping of `span` bytes, at an address the kernel picks; nothing
        // else refers to it.
        let raw = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                span,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if raw == libc::MAP_FAILED {
            return None;
        }
        let start = raw as usize;
        let aligned = start.next_multiple_of(LARGE_BLOCK);
        let head = aligned - start;
        let tail = span - head - len;
        // SAFETY: the head and tail are parts of the mapping just made, outside `[aligned, aligned + len)`,
        // and unused; madvise only advises on the kept range.
        unsafe {
            if head > 0 {
                libc::munmap(raw, head);
            }
            if tail > 0 {
                libc::munmap((aligned + len) as *mut libc::c_void, tail);
            }
            // Advice only: without transparent huge pages the range is ordinary pages.
            libc::madvise(aligned as *mut libc::c_void, len, libc::MADV_HUGEPAGE);
        }
        NonNull::new(aligned as *mut u8)
    }

    /// Unmaps a block [`map`] made.
    ///
    /// # Safety
    /// `ptr` and `len` are those of one [`map`] call, and the block is no longer used.
    pub(super) unsafe fn unmap(ptr: *mut u8, len: usize) {
        // SAFETY: per the contract, the range is exactly one live mapping of ours.
        unsafe { libc::munmap(ptr.cast(), len) };
    }
}

impl SystemAllocator {
    fn alloc_with(&self, layout: MemLayout, zeroed: bool) -> Result<Block, BufferError> {
        let layout = checked(layout)?;
        #[cfg(target_os = "linux")]
        if layout.size() >= LARGE_BLOCK
            && layout.align() <= LARGE_BLOCK
            && let Some(ptr) = large::mapped_len(layout.size()).and_then(large::map)
        {
            // SAFETY: a fresh mapping of at least `size()` zeroed bytes aligned to LARGE_BLOCK (>= align),
            // exclusively ours; `release` unmaps it (the tag says so).
            return Ok(unsafe { Block::from_raw_parts(ptr, layout, MAPPED) });
        }
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
        #[cfg(target_os = "linux")]
        if block.tag() == MAPPED {
            if let Some(len) = large::mapped_len(block.size()) {
                // SAFETY: `alloc_with` mapped this block with this length; it is released once.
                unsafe { large::unmap(block.as_ptr(), len) };
            }
            return;
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn large_blocks_are_zeroed_aligned_writable_and_released() {
        let alloc = SystemAllocator;
        for size in [LARGE_BLOCK, LARGE_BLOCK + 1, 5 * LARGE_BLOCK + 12345] {
            for zeroed in [true, false] {
                let layout = MemLayout::from_size_align(size, MIN_ALIGN).unwrap();
                let block = if zeroed { alloc.allocate_zeroed(layout) } else { alloc.allocate(layout) }.unwrap();
                assert!(block.size() >= size);
                assert_eq!(block.as_ptr() as usize % MIN_ALIGN, 0);
                // SAFETY: the block holds `size` bytes, exclusively ours until released.
                let bytes = unsafe { std::slice::from_raw_parts_mut(block.as_ptr(), size) };
                if zeroed {
                    assert!(bytes.iter().all(|&b| b == 0));
                }
                bytes.fill(7);
                assert_eq!(bytes[size - 1], 7);
                alloc.release(block);
            }
        }
        // Small blocks still come from the heap.
        let small = alloc.allocate_zeroed(MemLayout::from_size_align(4096, MIN_ALIGN).unwrap()).unwrap();
        assert_ne!(small.tag(), MAPPED);
        alloc.release(small);
    }
}
