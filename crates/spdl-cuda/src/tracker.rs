//! Keeps the host memory of queued copies alive until their events complete, then releases it.
//!
//! An asynchronous copy reads its source after `transfer` has returned, so the source must outlive the copy,
//! yet must not outlive it by much: a pinned batch buffer that goes back to the pool only when its device
//! tensor dies would make the pool as large as everything the model keeps alive. Each copy's source (or
//! pinned staging block) is parked here with the copy's completion event; [`CopyTracker::reap`] (called at
//! every transfer) releases those whose events have completed. Events of one stream complete in queue order,
//! so reaping stops at the first one still running.
//!
//! Generic over the event so the logic is tested without a GPU.

use std::collections::VecDeque;
use std::fmt;
use std::mem::ManuallyDrop;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use spdl_buffer::{Block, Buffer, MIN_ALIGN, SharedAllocator};

use crate::error::{Error, Result};

/// A point in a stream's work that the host can poll and wait for.
pub(crate) trait CopyEvent: Send + Sync + fmt::Debug + 'static {
    /// True once all work recorded before the event is done.
    fn query(&self) -> Result<bool>;
    /// Blocks until the event completes.
    fn wait(&self) -> Result<()>;
    /// Device time between `start` (recorded earlier on the same stream) and this event; both complete.
    fn elapsed_since(&self, start: &Self) -> Result<Duration>;
}

/// A pinned block holding a copy of pageable data, for the staged path. Returns to its allocator on drop.
pub(crate) struct StagingBlock {
    block: ManuallyDrop<Block>,
    allocator: SharedAllocator,
    len: usize,
}

impl fmt::Debug for StagingBlock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StagingBlock").field("len", &self.len).field("allocator", &self.allocator.name()).finish()
    }
}

impl StagingBlock {
    /// A block from `allocator` holding a copy of `src` (`src` must not be empty). No zero-fill first: one pass.
    pub(crate) fn copy_of(src: &[u8], allocator: &SharedAllocator) -> Result<StagingBlock> {
        let oom = |source| Error::HostAlloc { purpose: "pageable staging", bytes: src.len(), source };
        let layout = std::alloc::Layout::from_size_align(src.len(), MIN_ALIGN)
            .map_err(|_| oom(spdl_buffer::BufferError::SizeOverflow { shape: vec![src.len()] }))?;
        let block = allocator.allocate(layout).map_err(oom)?;
        // SAFETY: the block is valid for writes of at least `src.len()` bytes, is exclusively ours, and is fresh
        // memory that cannot overlap `src`.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), block.as_ptr(), src.len()) };
        Ok(StagingBlock { block: ManuallyDrop::new(block), allocator: allocator.clone(), len: src.len() })
    }

    pub(crate) fn as_bytes(&self) -> &[u8] {
        // SAFETY: `copy_of` initialised the first `len` bytes, and the block lives as long as `self`.
        unsafe { std::slice::from_raw_parts(self.block.as_ptr(), self.len) }
    }
}

impl Drop for StagingBlock {
    fn drop(&mut self) {
        // SAFETY: taken exactly once, here.
        let block = unsafe { ManuallyDrop::take(&mut self.block) };
        self.allocator.release(block);
    }
}

/// Host memory a queued copy reads from. Never read: held only to be dropped once the copy is done.
#[allow(dead_code)]
#[derive(Debug)]
pub(crate) enum HostHold {
    /// The caller's buffer itself (pinned, or pageable handed to the driver).
    Source(Buffer),
    /// A pinned copy of a pageable buffer (the caller's buffer was dropped right after the memcpy).
    Staging(StagingBlock),
    /// A reference to a buffer the caller keeps sharing (e.g. one Python also holds); the memory is freed
    /// when the last reference goes, never before the copy is done.
    Shared(Arc<Buffer>),
}

/// One queued copy.
#[derive(Debug)]
pub(crate) struct Pending<E> {
    /// Recorded before the copy, when timing is on.
    pub(crate) start: Option<E>,
    /// Recorded after the copy; shared with the device buffer.
    pub(crate) done: Arc<E>,
    pub(crate) bytes: u64,
    pub(crate) hold: HostHold,
}

/// Counters of copies whose completion the tracker has seen.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Completed {
    pub(crate) copies: u64,
    pub(crate) bytes: u64,
    /// Sum of device copy times of the timed copies.
    pub(crate) device_time: Duration,
    /// Bytes of the timed copies (the numerator of the bandwidth).
    pub(crate) timed_bytes: u64,
    /// Host blocks never released because their copy could not be confirmed complete (a failed device).
    pub(crate) leaked: u64,
}

/// The queue of copies in flight on one stream.
#[derive(Debug)]
pub(crate) struct CopyTracker<E: CopyEvent> {
    queue: Mutex<VecDeque<Pending<E>>>,
    completed: Mutex<Completed>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Plain data updated without panicking calls in between: still consistent after a poison.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl<E: CopyEvent> Default for CopyTracker<E> {
    fn default() -> Self {
        CopyTracker { queue: Mutex::new(VecDeque::new()), completed: Mutex::new(Completed::default()) }
    }
}

impl<E: CopyEvent> CopyTracker<E> {
    pub(crate) fn push(&self, p: Pending<E>) {
        lock(&self.queue).push_back(p);
    }

    /// Copies queued and not yet seen complete, and their bytes.
    pub(crate) fn in_flight(&self) -> (usize, u64) {
        let q = lock(&self.queue);
        (q.len(), q.iter().map(|p| p.bytes).sum())
    }

    pub(crate) fn completed(&self) -> Completed {
        *lock(&self.completed)
    }

    /// Releases the host memory of every copy at the head of the queue that has completed; returns how many.
    /// Never blocks on the device.
    pub(crate) fn reap(&self) -> Result<usize> {
        let mut finished = Vec::new();
        let mut outcome = Ok(());
        {
            let mut q = lock(&self.queue);
            while let Some(front) = q.front() {
                match front.done.query() {
                    Ok(true) => finished.extend(q.pop_front()),
                    Ok(false) => break,
                    Err(e) => {
                        outcome = Err(e);
                        break;
                    }
                }
            }
        }
        let n = finished.len();
        // Dropping the holds returns buffers to their allocators: done outside the queue lock.
        finished.into_iter().for_each(|p| self.finish(p));
        outcome.map(|()| n)
    }

    /// Waits for every queued copy and releases its host memory. On a device error the failing copy stays
    /// queued (its memory may still be read) and the error is returned.
    pub(crate) fn drain(&self) -> Result<()> {
        loop {
            let Some(p) = lock(&self.queue).pop_front() else { return Ok(()) };
            if let Err(e) = p.done.wait() {
                lock(&self.queue).push_front(p);
                return Err(e);
            }
            self.finish(p);
        }
    }

    fn finish(&self, p: Pending<E>) {
        let timed = p.start.as_ref().and_then(|s| p.done.elapsed_since(s).ok());
        {
            let mut c = lock(&self.completed);
            c.copies += 1;
            c.bytes += p.bytes;
            if let Some(t) = timed {
                c.device_time += t;
                c.timed_bytes += p.bytes;
            }
        }
        drop(p.hold);
    }
}

impl<E: CopyEvent> Drop for CopyTracker<E> {
    fn drop(&mut self) {
        let queue = std::mem::take(self.queue.get_mut().unwrap_or_else(PoisonError::into_inner));
        for p in queue {
            if p.done.wait().is_ok() {
                self.finish(p);
            } else {
                // The copy may still be reading this memory (or the device is gone and we cannot know):
                // leaking it is the only safe choice.
                lock(&self.completed).leaked += 1;
                std::mem::forget(p.hold);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use spdl_buffer::{CachingPool, HeapBackend, PoolConfig, size_class};
    use spdl_buffer::{DType, Layout};
    use std::sync::atomic::{AtomicBool, Ordering};

    /// An event the test completes by hand.
    #[derive(Debug, Default)]
    struct FakeEvent {
        complete: AtomicBool,
        broken: AtomicBool,
        at_ms: u64,
    }

    impl FakeEvent {
        fn at(ms: u64) -> FakeEvent {
            FakeEvent { at_ms: ms, ..FakeEvent::default() }
        }
        fn complete(&self) {
            self.complete.store(true, Ordering::SeqCst);
        }
    }

    impl CopyEvent for FakeEvent {
        fn query(&self) -> Result<bool> {
            if self.broken.load(Ordering::SeqCst) {
                return Err(Error::NoDevice);
            }
            Ok(self.complete.load(Ordering::SeqCst))
        }
        fn wait(&self) -> Result<()> {
            if self.broken.load(Ordering::SeqCst) {
                return Err(Error::NoDevice);
            }
            self.complete();
            Ok(())
        }
        fn elapsed_since(&self, start: &Self) -> Result<Duration> {
            Ok(Duration::from_millis(self.at_ms - start.at_ms))
        }
    }

    fn pool() -> (Arc<CachingPool<HeapBackend>>, SharedAllocator) {
        let pool = Arc::new(CachingPool::new(HeapBackend, PoolConfig::default()));
        let alloc: SharedAllocator = pool.clone();
        (pool, alloc)
    }

    fn queue(tracker: &CopyTracker<FakeEvent>, alloc: &SharedAllocator, n: usize) -> Vec<Arc<FakeEvent>> {
        (0..n)
            .map(|i| {
                let buf = Buffer::zeros(DType::U8, &[1 << 20], Layout::Plain, alloc).unwrap();
                let done = Arc::new(FakeEvent::at(10 * i as u64 + 4));
                let start = Some(FakeEvent::at(10 * i as u64));
                tracker.push(Pending { start, done: done.clone(), bytes: 1 << 20, hold: HostHold::Source(buf) });
                done
            })
            .collect()
    }

    #[test]
    fn host_buffer_returns_to_the_pool_only_after_its_copy_completes() {
        let (pool, alloc) = pool();
        let tracker = CopyTracker::default();
        let events = queue(&tracker, &alloc, 3);
        let class = size_class(1 << 20).unwrap();
        assert_eq!(pool.stats().bytes_in_use, 3 * class);
        assert_eq!(tracker.reap().unwrap(), 0, "nothing completed yet");
        assert_eq!(pool.stats().bytes_in_use, 3 * class, "still read by the copies");

        events[0].complete();
        assert_eq!(tracker.reap().unwrap(), 1);
        assert_eq!(pool.stats().bytes_in_use, 2 * class);
        assert_eq!(tracker.in_flight(), (2, 2 << 20));

        // Stream order: a later event cannot be reaped before an earlier one.
        events[2].complete();
        assert_eq!(tracker.reap().unwrap(), 0);
        events[1].complete();
        assert_eq!(tracker.reap().unwrap(), 2);
        let s = pool.stats();
        assert_eq!((s.bytes_in_use, s.blocks_cached), (0, 3));
        let c = tracker.completed();
        assert_eq!((c.copies, c.bytes, c.timed_bytes), (3, 3 << 20, 3 << 20));
        assert_eq!(c.device_time, Duration::from_millis(12));

        // Reused in steady state: the next batches hit the cache.
        let before = pool.stats();
        let more = queue(&tracker, &alloc, 3);
        more.iter().for_each(|e| e.complete());
        tracker.reap().unwrap();
        assert_eq!(pool.stats().hit_rate_since(&before), 1.0);
    }

    #[test]
    fn drain_waits_and_drop_waits_too() {
        let (pool, alloc) = pool();
        let tracker = CopyTracker::default();
        queue(&tracker, &alloc, 2);
        tracker.drain().unwrap();
        assert_eq!(pool.stats().bytes_in_use, 0);
        assert_eq!(tracker.in_flight(), (0, 0));

        let tracker = CopyTracker::default();
        queue(&tracker, &alloc, 2);
        drop(tracker);
        assert_eq!(pool.stats().bytes_in_use, 0, "dropping the tracker waits, then releases");
    }

    #[test]
    fn a_failed_device_leaks_rather_than_frees_memory_a_copy_may_read() {
        let (pool, alloc) = pool();
        let tracker = CopyTracker::default();
        let events = queue(&tracker, &alloc, 2);
        events[0].broken.store(true, Ordering::SeqCst);
        assert!(matches!(tracker.reap(), Err(Error::NoDevice)));
        assert!(tracker.drain().is_err());
        assert_eq!(tracker.in_flight().0, 2, "the failing copy stays queued");
        let class = size_class(1 << 20).unwrap();
        drop(tracker);
        assert_eq!(pool.stats().bytes_in_use, class, "one leaked (broken), one released (its wait succeeded)");
    }

    #[test]
    fn staging_block_copies_and_returns_to_its_pool() {
        let (pool, alloc) = pool();
        let src: Vec<u8> = (0..10_000u32).map(|i| (i * 7 % 251) as u8).collect();
        let staged = StagingBlock::copy_of(&src, &alloc).unwrap();
        assert_eq!(staged.as_bytes(), &src[..]);
        assert_eq!(pool.stats().blocks_in_use, 1);
        drop(staged);
        assert_eq!(pool.stats().blocks_in_use, 0);
        assert_eq!(pool.stats().blocks_cached, 1);
    }
}
