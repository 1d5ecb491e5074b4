//! A caching host-memory pool over a [`PoolBackend`]: size classes, reuse of freed blocks, a byte cap, stats.
//!
//! The pool is for memory whose allocation is expensive. Pinning memory (`cuMemHostAlloc`, in `spdl-cuda`'s
//! pinned backend) costs milliseconds and takes the driver's locks; a training loop that pins each batch spends
//! more time pinning than copying. The pool gets a block from its backend once and hands it out again for every
//! later request of the same size class, so in steady state (batches of one shape) every request is a hit.
//! [`HeapBackend`] puts ordinary page-aligned heap memory behind the same cache (the CPU path, and tests).

use std::alloc::Layout as MemLayout;
use std::collections::BTreeMap;
use std::fmt;
use std::ptr::NonNull;
use std::sync::{Mutex, MutexGuard, PoisonError};

use crate::{Block, BufferError, HostAllocator, MIN_ALIGN};

/// Size of a page: every pooled block is a multiple of it and aligned to it.
pub const PAGE: usize = 4096;

/// Where a [`CachingPool`] gets its memory from: ordinary heap pages for [`HeapBackend`], page-locked memory
/// from the CUDA driver for `spdl_cuda::PinnedAllocator`, or a fake in tests.
///
/// Calls are expensive by assumption (that is why the pool caches); the pool never holds its lock across them.
pub trait PoolBackend: Send + Sync + fmt::Debug + 'static {
    /// What a failed call reports; the pool puts its message and causes into the `BufferError::OutOfMemory` it
    /// returns.
    type Error: std::error::Error;

    /// Allocates `size` bytes (`size` is a non-zero multiple of [`PAGE`]), aligned to at least [`PAGE`].
    fn alloc_block(&self, size: usize) -> Result<NonNull<u8>, Self::Error>;

    /// Frees a block.
    ///
    /// # Safety
    /// `ptr` was returned by `alloc_block(size)` of this backend, is freed once, and nothing uses it any more.
    unsafe fn free_block(&self, ptr: NonNull<u8>, size: usize) -> Result<(), Self::Error>;

    /// A short name for errors and stats (`"cuda-pinned"`).
    fn name(&self) -> &str;

    /// True if the memory is page-locked (eligible for asynchronous DMA).
    fn is_pinned(&self) -> bool;
}

/// Ordinary page-aligned heap memory behind the same caching pool: for machines without a GPU and for tests.
#[derive(Debug, Default, Clone, Copy)]
pub struct HeapBackend;

impl PoolBackend for HeapBackend {
    type Error = BufferError;

    fn alloc_block(&self, size: usize) -> Result<NonNull<u8>, BufferError> {
        let oom = |cause: &str| BufferError::OutOfMemory { allocator: "heap".into(), bytes: size, cause: cause.into() };
        let layout = MemLayout::from_size_align(size, PAGE).map_err(|_| oom("size overflows a layout"))?;
        if size == 0 {
            return Err(oom("zero-size block"));
        }
        // SAFETY: `layout` has a non-zero size.
        NonNull::new(unsafe { std::alloc::alloc(layout) }).ok_or_else(|| oom("the global allocator returned null"))
    }

    unsafe fn free_block(&self, ptr: NonNull<u8>, size: usize) -> Result<(), BufferError> {
        if let Ok(layout) = MemLayout::from_size_align(size, PAGE) {
            // SAFETY: the caller guarantees `ptr` came from `alloc_block(size)`, i.e. `alloc` with this layout.
            unsafe { std::alloc::dealloc(ptr.as_ptr(), layout) };
        }
        Ok(())
    }

    fn name(&self) -> &str {
        "heap-pool"
    }

    fn is_pinned(&self) -> bool {
        false
    }
}

/// Settings of a [`CachingPool`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolConfig {
    /// The most bytes the pool holds from its backend at once, in use and cached together. An allocation that
    /// would pass it first returns cached blocks to the backend, then fails with `BufferError::OutOfMemory`.
    /// Page-locked memory cannot be swapped out, so this protects the host. Default: 4 GiB.
    pub max_bytes: usize,
}

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig { max_bytes: 4 << 30 }
    }
}

/// A snapshot of a pool's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Requests served from the cache (no backend call).
    pub hits: u64,
    /// Requests that had to call the backend.
    pub misses: u64,
    /// Bytes held from the backend: in use plus cached.
    pub bytes_held: usize,
    /// Bytes in blocks handed out and not yet released.
    pub bytes_in_use: usize,
    /// Bytes in free blocks kept for reuse.
    pub bytes_cached: usize,
    /// The highest `bytes_held` seen.
    pub peak_bytes_held: usize,
    /// Blocks handed out and not yet released.
    pub blocks_in_use: usize,
    /// Free blocks kept for reuse.
    pub blocks_cached: usize,
    /// Cached blocks returned to the backend (to make room under the cap, or by [`CachingPool::trim`]).
    pub evictions: u64,
    /// Requests that failed (cap reached, or the backend failed even after the cache was emptied).
    pub failures: u64,
}

impl PoolStats {
    /// Fraction of requests served from the cache, in `[0, 1]` (1 when there were none).
    pub fn hit_rate(&self) -> f64 {
        ratio(self.hits, self.misses)
    }

    /// The hit rate of the requests made after `earlier` (a snapshot of the same pool): the steady-state rate
    /// once the warm-up misses are excluded.
    pub fn hit_rate_since(&self, earlier: &PoolStats) -> f64 {
        ratio(self.hits.saturating_sub(earlier.hits), self.misses.saturating_sub(earlier.misses))
    }
}

fn ratio(hits: u64, misses: u64) -> f64 {
    let total = hits + misses;
    if total == 0 { 1.0 } else { hits as f64 / total as f64 }
}

/// The size class a request of `size` bytes is served from: a whole number of pages, at most 25% or one page
/// (whichever is larger) above `size` (four classes per power of two). `None` if it overflows.
pub fn size_class(size: usize) -> Option<usize> {
    if size <= PAGE {
        return Some(PAGE);
    }
    // The largest power of two below `size`; classes step by a quarter of it.
    let base = 1usize << (usize::BITS - 1 - (size - 1).leading_zeros());
    let step = (base / 4).max(PAGE);
    size.checked_next_multiple_of(step)
}

#[derive(Debug, Default)]
struct State {
    /// Free blocks by size class, as exposed addresses (the pool owns them; `usize` keeps the state `Send`).
    free: BTreeMap<usize, Vec<usize>>,
    stats: PoolStats,
}

/// Tag of blocks that came from the backend (zero-size blocks carry 0 and are never passed to it).
const POOLED: usize = 1;

/// A caching pool of host blocks over a [`PoolBackend`]; implements [`HostAllocator`].
///
/// Requests are rounded up to a [`size_class`]; a released block goes to its class's free list and the next
/// request of that class gets it back without a backend call. Backend calls happen outside the lock. When an
/// allocation would pass [`PoolConfig::max_bytes`], cached blocks of the largest classes are returned to the
/// backend first (fewest expensive calls per byte); if the live blocks alone leave no room, the request fails.
/// If the backend itself fails, the pool empties its cache and retries once (the OS limit on locked memory
/// counts cached blocks too).
///
/// # Example
/// ```
/// use spdl_buffer::{Buffer, CachingPool, DType, HeapBackend, Layout, PoolConfig, SharedAllocator};
/// use std::sync::Arc;
///
/// let pool = Arc::new(CachingPool::new(HeapBackend, PoolConfig::default()));
/// let alloc: SharedAllocator = pool.clone();
/// for _ in 0..10 {
///     let batch = Buffer::zeros(DType::U8, &[8, 64, 64, 3], Layout::Nhwc, &alloc)?;
///     drop(batch); // back to the pool, not to the OS
/// }
/// let stats = pool.stats();
/// assert_eq!((stats.misses, stats.hits), (1, 9));
/// # Ok::<(), spdl_buffer::BufferError>(())
/// ```
pub struct CachingPool<B: PoolBackend> {
    backend: B,
    config: PoolConfig,
    state: Mutex<State>,
}

impl<B: PoolBackend> fmt::Debug for CachingPool<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CachingPool")
            .field("backend", &self.backend)
            .field("config", &self.config)
            .field("stats", &self.stats())
            .finish()
    }
}

impl<B: PoolBackend> CachingPool<B> {
    /// An empty pool: nothing is allocated until the first request.
    pub fn new(backend: B, config: PoolConfig) -> CachingPool<B> {
        CachingPool { backend, config, state: Mutex::new(State::default()) }
    }

    /// The backend.
    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// The settings.
    pub fn config(&self) -> &PoolConfig {
        &self.config
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> PoolStats {
        self.lock().stats
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // The state is plain counters and lists updated without calls that can panic; a poisoned lock still
        // holds consistent data.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn oom(&self, bytes: usize, cause: String) -> BufferError {
        BufferError::OutOfMemory { allocator: self.backend.name().to_owned(), bytes, cause }
    }

    /// Returns every cached block to the backend; returns the bytes freed. Blocks in use are not touched.
    pub fn trim(&self) -> usize {
        let victims = {
            let mut st = self.lock();
            let victims = take_all(&mut st);
            let bytes: usize = victims.iter().map(|&(class, _)| class).sum();
            st.stats.bytes_cached -= bytes;
            st.stats.bytes_held -= bytes;
            st.stats.blocks_cached -= victims.len();
            st.stats.evictions += victims.len() as u64;
            victims
        };
        self.free_blocks(&victims)
    }

    /// Allocates (pins, for a pinned backend) `count` blocks for requests of `size` bytes now and caches them, so
    /// the first batches of a run do not pay for the backend calls.
    pub fn reserve(&self, size: usize, count: usize) -> Result<(), BufferError> {
        let layout =
            MemLayout::from_size_align(size, MIN_ALIGN).map_err(|_| BufferError::SizeOverflow { shape: vec![size] })?;
        let mut blocks = Vec::with_capacity(count);
        let mut outcome = Ok(());
        for _ in 0..count {
            match self.allocate(layout) {
                Ok(b) => blocks.push(b),
                Err(e) => {
                    outcome = Err(e);
                    break;
                }
            }
        }
        // Cache whatever was obtained, also when a later request failed (a `Block` does not free itself).
        blocks.into_iter().for_each(|b| self.release(b));
        outcome
    }

    fn free_blocks(&self, blocks: &[(usize, usize)]) -> usize {
        let mut freed = 0;
        for &(class, addr) in blocks {
            if let Some(ptr) = NonNull::new(std::ptr::with_exposed_provenance_mut::<u8>(addr)) {
                // SAFETY: every cached address came from `alloc_block(class)` and was removed from the cache
                // under the lock, so it is freed exactly once and nobody holds it.
                match unsafe { self.backend.free_block(ptr, class) } {
                    Ok(()) => freed += class,
                    Err(_) => self.lock().stats.failures += 1,
                }
            }
        }
        freed
    }

    fn backend_alloc(&self, class: usize) -> Result<NonNull<u8>, B::Error> {
        match self.backend.alloc_block(class) {
            Ok(p) => Ok(p),
            Err(first) => {
                // The OS limit on locked memory counts our cached blocks too: give them back and try once more.
                if self.trim() == 0 {
                    return Err(first);
                }
                self.backend.alloc_block(class)
            }
        }
    }
}

fn take_all(st: &mut State) -> Vec<(usize, usize)> {
    std::mem::take(&mut st.free)
        .into_iter()
        .flat_map(|(class, addrs)| addrs.into_iter().map(move |a| (class, a)))
        .collect()
}

impl<B: PoolBackend> HostAllocator for CachingPool<B> {
    fn allocate(&self, layout: MemLayout) -> Result<Block, BufferError> {
        let align = layout.align().max(MIN_ALIGN);
        if layout.size() == 0 {
            let ptr =
                NonNull::new(std::ptr::without_provenance_mut::<u8>(align)).ok_or(BufferError::BadAlignment(0))?;
            let layout = MemLayout::from_size_align(0, align).map_err(|_| BufferError::BadAlignment(align))?;
            // SAFETY: zero-size blocks are never read or written, and `release` ignores them.
            return Ok(unsafe { Block::from_raw_parts(ptr, layout, 0) });
        }
        if align > PAGE {
            return Err(self.oom(layout.size(), format!("alignment {align} exceeds the pool's page alignment {PAGE}")));
        }
        let class = size_class(layout.size()).ok_or(BufferError::SizeOverflow { shape: vec![layout.size()] })?;
        let block_layout =
            MemLayout::from_size_align(class, align).map_err(|_| BufferError::SizeOverflow { shape: vec![class] })?;

        let victims = {
            let mut st = self.lock();
            if let Some(addr) = st.free.get_mut(&class).and_then(Vec::pop) {
                let s = &mut st.stats;
                s.hits += 1;
                s.bytes_cached -= class;
                s.blocks_cached -= 1;
                s.bytes_in_use += class;
                s.blocks_in_use += 1;
                drop(st);
                let ptr = NonNull::new(std::ptr::with_exposed_provenance_mut::<u8>(addr))
                    .ok_or_else(|| self.oom(class, "cached block with a null address".into()))?;
                // SAFETY: the block came from `alloc_block(class)` (page-aligned, >= align) and was just taken
                // off the free list under the lock, so it is ours alone.
                return Ok(unsafe { Block::from_raw_parts(ptr, block_layout, POOLED) });
            }
            st.stats.misses += 1;
            let cap = self.config.max_bytes;
            let live = st.stats.bytes_held - st.stats.bytes_cached;
            if live.saturating_add(class) > cap {
                st.stats.failures += 1;
                let held = st.stats.bytes_held;
                drop(st);
                return Err(self.oom(
                    layout.size(),
                    format!("the pool's cap of {cap} bytes is reached ({live} bytes in use, {held} held)"),
                ));
            }
            // Evict the largest cached classes until the new block fits under the cap.
            let mut victims = Vec::new();
            while st.stats.bytes_held + class > cap {
                let Some(mut entry) = st.free.last_entry() else { break };
                let victim_class = *entry.key();
                let addr = entry.get_mut().pop();
                if entry.get().is_empty() {
                    entry.remove();
                }
                if let Some(addr) = addr {
                    victims.push((victim_class, addr));
                    st.stats.bytes_held -= victim_class;
                    st.stats.bytes_cached -= victim_class;
                    st.stats.blocks_cached -= 1;
                    st.stats.evictions += 1;
                }
            }
            // Reserve the new block's bytes before unlocking, so concurrent misses cannot overshoot the cap.
            let s = &mut st.stats;
            s.bytes_held += class;
            s.bytes_in_use += class;
            s.blocks_in_use += 1;
            s.peak_bytes_held = s.peak_bytes_held.max(s.bytes_held);
            victims
        };
        self.free_blocks(&victims);

        match self.backend_alloc(class) {
            Ok(ptr) => {
                // SAFETY: fresh from the backend: `class` bytes, page-aligned (>= align), exclusively ours.
                Ok(unsafe { Block::from_raw_parts(ptr, block_layout, POOLED) })
            }
            Err(e) => {
                let mut st = self.lock();
                let s = &mut st.stats;
                s.bytes_held -= class;
                s.bytes_in_use -= class;
                s.blocks_in_use -= 1;
                s.failures += 1;
                drop(st);
                Err(self.oom(layout.size(), spdl_report::error_chain(&e)))
            }
        }
    }

    fn release(&self, block: Block) {
        if block.tag() != POOLED || block.size() == 0 {
            return;
        }
        let class = block.size();
        let addr = block.as_ptr().expose_provenance();
        let mut st = self.lock();
        st.free.entry(class).or_default().push(addr);
        let s = &mut st.stats;
        s.bytes_in_use -= class;
        s.blocks_in_use -= 1;
        s.bytes_cached += class;
        s.blocks_cached += 1;
    }

    fn name(&self) -> &str {
        self.backend.name()
    }

    fn is_pinned(&self) -> bool {
        self.backend.is_pinned()
    }
}

impl<B: PoolBackend> Drop for CachingPool<B> {
    fn drop(&mut self) {
        // Blocks in use hold an `Arc` of their allocator, so when the pool drops only cached blocks remain.
        self.trim();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Buffer, DType, Layout, SharedAllocator};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    /// Heap memory that counts backend calls and can be told to fail.
    #[derive(Debug, Default)]
    struct Fake {
        allocs: AtomicUsize,
        frees: AtomicUsize,
        live: AtomicUsize,
        fail: AtomicBool,
        /// Fail only while more than this many bytes are live at the backend (an OS locked-memory limit).
        limit: AtomicUsize,
    }

    impl PoolBackend for Fake {
        type Error = BufferError;

        fn alloc_block(&self, size: usize) -> Result<NonNull<u8>, BufferError> {
            assert!(size > 0 && size.is_multiple_of(PAGE), "the pool asks for whole pages");
            let limit = self.limit.load(Ordering::SeqCst);
            if self.fail.load(Ordering::SeqCst) || (limit > 0 && self.live.load(Ordering::SeqCst) + size > limit) {
                return Err(BufferError::OutOfMemory {
                    allocator: "fake".into(),
                    bytes: size,
                    cause: "told to".into(),
                });
            }
            self.allocs.fetch_add(1, Ordering::SeqCst);
            self.live.fetch_add(size, Ordering::SeqCst);
            HeapBackend.alloc_block(size)
        }
        unsafe fn free_block(&self, ptr: NonNull<u8>, size: usize) -> Result<(), BufferError> {
            self.frees.fetch_add(1, Ordering::SeqCst);
            self.live.fetch_sub(size, Ordering::SeqCst);
            // SAFETY: forwarded.
            unsafe { HeapBackend.free_block(ptr, size) }
        }
        fn name(&self) -> &str {
            "fake-pinned"
        }
        fn is_pinned(&self) -> bool {
            true
        }
    }

    fn pool(cap: usize) -> (Arc<CachingPool<Arc<Fake>>>, Arc<Fake>, SharedAllocator) {
        let fake = Arc::new(Fake::default());
        let pool = Arc::new(CachingPool::new(fake.clone(), PoolConfig { max_bytes: cap }));
        let alloc: SharedAllocator = pool.clone();
        (pool, fake, alloc)
    }

    impl PoolBackend for Arc<Fake> {
        type Error = BufferError;

        fn alloc_block(&self, size: usize) -> Result<NonNull<u8>, BufferError> {
            (**self).alloc_block(size)
        }
        unsafe fn free_block(&self, ptr: NonNull<u8>, size: usize) -> Result<(), BufferError> {
            // SAFETY: forwarded.
            unsafe { (**self).free_block(ptr, size) }
        }
        fn name(&self) -> &str {
            (**self).name()
        }
        fn is_pinned(&self) -> bool {
            true
        }
    }

    #[test]
    fn size_classes_are_pages_and_within_a_quarter() {
        assert_eq!(size_class(0), Some(PAGE));
        assert_eq!(size_class(1), Some(PAGE));
        assert_eq!(size_class(PAGE), Some(PAGE));
        assert_eq!(size_class(PAGE + 1), Some(2 * PAGE));
        assert_eq!(size_class(8193), Some(12288));
        assert_eq!(size_class(1 << 20), Some(1 << 20));
        assert_eq!(size_class((1 << 20) + 1), Some((1 << 20) + (1 << 18)));
        assert_eq!(size_class(usize::MAX), None);
        let mut prev = 0;
        for size in (1..5000).map(|i| i * 997).chain([3 * 224 * 224 * 32, 150_528 * 256, 1 << 30]) {
            let c = size_class(size).unwrap();
            assert!(c >= size && c.is_multiple_of(PAGE), "{size} -> {c}");
            assert!(c - size < PAGE || (c - size) * 4 <= size, "waste above 25% and a page: {size} -> {c}");
            assert!(c >= prev || size < prev, "classes are monotonic");
            prev = c;
        }
    }

    #[test]
    fn freed_blocks_are_reused_and_counted() {
        let (pool, fake, alloc) = pool(1 << 30);
        let shape = [4, 224, 224, 3];
        let a = Buffer::zeros(DType::U8, &shape, Layout::Nhwc, &alloc).unwrap();
        assert!(a.is_pinned());
        assert_eq!(a.as_ptr() as usize % PAGE, 0);
        let addr = a.as_ptr();
        drop(a);
        for _ in 0..99 {
            let b = Buffer::zeros(DType::U8, &shape, Layout::Nhwc, &alloc).unwrap();
            assert_eq!(b.as_ptr(), addr, "same block handed out again");
            assert!(b.as_bytes().iter().all(|&x| x == 0), "zeros() re-zeroes a dirty cached block");
        }
        let s = pool.stats();
        assert_eq!((s.misses, s.hits), (1, 99));
        assert_eq!(fake.allocs.load(Ordering::SeqCst), 1, "pinned once");
        assert_eq!(s.hit_rate(), 0.99);
        let class = size_class(4 * 224 * 224 * 3).unwrap();
        assert_eq!((s.bytes_held, s.bytes_cached, s.bytes_in_use), (class, class, 0));
        assert_eq!((s.blocks_cached, s.blocks_in_use), (1, 0));

        // Two live at once need two blocks; sizes in the same class share blocks.
        let x = Buffer::zeros(DType::U8, &[class - 100], Layout::Plain, &alloc).unwrap();
        let y = Buffer::zeros(DType::U8, &[class - 200], Layout::Plain, &alloc).unwrap();
        assert_ne!(x.as_ptr(), y.as_ptr());
        let s2 = pool.stats();
        assert_eq!((s2.hits - s.hits, s2.misses - s.misses), (1, 1));
        assert_eq!(s2.bytes_in_use, 2 * class);
        drop((x, y));
        assert_eq!(pool.stats().hit_rate_since(&s), 0.5);
        assert_eq!(pool.trim(), 2 * class);
        assert_eq!(fake.frees.load(Ordering::SeqCst), 2);
        assert_eq!(pool.stats().bytes_held, 0);
    }

    #[test]
    fn cap_evicts_cached_blocks_then_fails_with_a_clear_error() {
        let (pool, fake, alloc) = pool(64 * PAGE);
        let big = Buffer::zeros(DType::U8, &[32 * PAGE], Layout::Plain, &alloc).unwrap();
        let mid = Buffer::zeros(DType::U8, &[16 * PAGE], Layout::Plain, &alloc).unwrap();
        drop((big, mid)); // 48 pages cached
        // 32 pages more would make 80 > 64: the largest cached block (32 pages) goes back to the backend.
        let other = Buffer::zeros(DType::U8, &[24 * PAGE], Layout::Plain, &alloc).unwrap();
        let s = pool.stats();
        assert_eq!(s.evictions, 1);
        assert_eq!(s.bytes_held, 16 * PAGE + size_class(24 * PAGE).unwrap());
        assert!(s.bytes_held <= 64 * PAGE && s.peak_bytes_held <= 64 * PAGE);
        assert_eq!(fake.frees.load(Ordering::SeqCst), 1);

        // Live blocks alone leave no room: an error naming the allocator, the size and the cap.
        let err = Buffer::zeros(DType::U8, &[48 * PAGE], Layout::Plain, &alloc).unwrap_err();
        match &err {
            BufferError::OutOfMemory { allocator, bytes, cause } => {
                assert_eq!(allocator, "fake-pinned");
                assert_eq!(*bytes, 48 * PAGE);
                assert!(cause.contains("cap of 262144 bytes"), "{cause}");
            }
            other => panic!("unexpected {other:?}"),
        }
        assert_eq!(pool.stats().failures, 1);
        assert_eq!(pool.stats().bytes_held, s.bytes_held, "a failed request leaves the accounting as it was");
        drop(other);
        // With the live block gone, the request fits after evicting the cache.
        let fits = Buffer::zeros(DType::U8, &[48 * PAGE], Layout::Plain, &alloc).unwrap();
        assert_eq!(pool.stats().bytes_in_use, 48 * PAGE);
        drop(fits);
    }

    #[test]
    fn backend_failure_retries_after_emptying_the_cache() {
        let (pool, fake, alloc) = pool(1 << 30);
        for n in [1, 2, 3] {
            drop(Buffer::zeros(DType::U8, &[n * 8 * PAGE], Layout::Plain, &alloc).unwrap());
        }
        let cached = pool.stats().bytes_cached;
        assert!(cached > 0);
        // The "OS" allows only what is cached now: a new class succeeds only once the cache is given back.
        fake.limit.store(fake.live.load(Ordering::SeqCst), Ordering::SeqCst);
        let b = Buffer::zeros(DType::U8, &[5 * 8 * PAGE], Layout::Plain, &alloc).unwrap();
        assert_eq!(pool.stats().bytes_cached, 0);
        drop(b);
        // A hard failure is an OutOfMemory with the backend's cause, and counts as a failure.
        fake.fail.store(true, Ordering::SeqCst);
        let err = Buffer::zeros(DType::U8, &[100 * PAGE], Layout::Plain, &alloc).unwrap_err();
        assert!(matches!(&err, BufferError::OutOfMemory { cause, .. } if cause.contains("told to")), "{err}");
        let s = pool.stats();
        assert_eq!(s.failures, 1);
        assert_eq!(s.blocks_in_use, 0);
    }

    #[test]
    fn zero_size_and_alignment() {
        let (pool, fake, alloc) = pool(1 << 20);
        let z = Buffer::zeros(DType::F32, &[0, 3], Layout::Plain, &alloc).unwrap();
        assert!(z.is_empty());
        drop(z);
        assert_eq!(fake.allocs.load(Ordering::SeqCst), 0, "zero-size requests never reach the backend");
        let s = pool.stats();
        assert_eq!((s.hits, s.misses), (0, 0));
        let too_aligned = MemLayout::from_size_align(100, 2 * PAGE).unwrap();
        assert!(matches!(pool.allocate(too_aligned), Err(BufferError::OutOfMemory { .. })));
        let ok = MemLayout::from_size_align(100, PAGE).unwrap();
        let b = pool.allocate(ok).unwrap();
        assert_eq!(b.as_ptr() as usize % PAGE, 0);
        assert_eq!(b.size(), PAGE);
        pool.release(b);
    }

    #[test]
    fn reserve_prepins_so_the_first_batches_hit() {
        let (pool, fake, alloc) = pool(1 << 30);
        pool.reserve(3 * 64 * 64, 4).unwrap();
        assert_eq!(fake.allocs.load(Ordering::SeqCst), 4);
        let before = pool.stats();
        let live: Vec<_> =
            (0..4).map(|_| Buffer::zeros(DType::U8, &[3, 64, 64], Layout::Chw, &alloc).unwrap()).collect();
        assert_eq!(pool.stats().hit_rate_since(&before), 1.0);
        drop(live);
        assert!(pool.reserve(usize::MAX, 1).is_err());
    }

    #[test]
    fn concurrent_use_keeps_the_books_straight() {
        let (pool, fake, alloc) = pool(64 << 20);
        std::thread::scope(|s| {
            for t in 0..4 {
                let alloc = alloc.clone();
                s.spawn(move || {
                    for i in 0..200 {
                        let n = PAGE * (1 + (t + i) % 5);
                        let mut b = Buffer::zeros(DType::U8, &[n], Layout::Plain, &alloc).unwrap();
                        b.as_bytes_mut().fill(t as u8);
                        assert!(b.as_bytes().iter().all(|&x| x == t as u8), "no block is shared by two owners");
                    }
                });
            }
        });
        let s = pool.stats();
        assert_eq!(s.hits + s.misses, 800);
        assert_eq!((s.bytes_in_use, s.blocks_in_use), (0, 0));
        assert_eq!(s.bytes_held, s.bytes_cached);
        assert_eq!(fake.live.load(Ordering::SeqCst), s.bytes_held);
        assert!(s.misses <= 20, "at most 4 threads x 5 classes pinned, got {}", s.misses);
        drop(alloc);
        drop(Arc::try_unwrap(pool).unwrap());
        assert_eq!(fake.live.load(Ordering::SeqCst), 0, "dropping the pool frees its cache");
    }
}
