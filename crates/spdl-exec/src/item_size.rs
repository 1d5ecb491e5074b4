//! [`ItemSize`]: a stage's measured output size, for the auto-tuner's memory budget.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, OnceLock};

use crate::queue::QueueLimit;

/// Calls measured before sampling thins out to one in [`ItemSize::EVERY`].
const WARMUP: u64 = 8;
/// The bytes a queue of small items may hold beyond its capacity in items (see [`ItemSize`]).
pub(crate) const SMALL_QUEUE_BYTES: u64 = 64 * 1024;
/// The most items a queue of small items may hold.
pub(crate) const SMALL_QUEUE_ITEMS: usize = 64;

/// The running size of a stage's items, measured by the stage's own code and read by the
/// auto-tuner ([`crate::BuildOptions::autotune`]) as the stage's
/// [`crate::StageOptions::item_bytes`] when that was not set.
///
/// A stage whose item size is not known when it is built (decoded media, a Python op's
/// result) shares an `ItemSize` with its function ([`crate::Stage::item_size`]); the
/// function asks [`ItemSize::due`] before it measures an output (every call at first, then
/// one in [`ItemSize::EVERY`]) and [`ItemSize::record`]s the bytes. The estimate is an
/// exponential moving average (weight 1/8), so a few outliers do not swing the budget.
/// Clones share the estimate.
///
/// The estimate also sizes the stage's output queue. A queue's capacity is counted in items,
/// and a hand-off between threads costs a wake-up per item once the queue is short (at a
/// capacity of 2, every item); so while every measured output is small and of known size, the
/// queue after the stage (unless the auto-tuner sizes it) holds as many items as fit in
/// 64 KiB, at most 64 and never fewer than its capacity. One output measured by a guess
/// ([`ItemSize::record_guess`]: an object whose memory the stage cannot see) keeps the queue at
/// its capacity in items for good.
///
/// ```
/// use spdl_exec::{ItemSize, Stage};
/// let size = ItemSize::new();
/// let probe = size.clone();
/// let stage = Stage::map("frames", move |n: usize| {
///     let frame = vec![0u8; n];
///     if probe.due() {
///         probe.record(frame.len() as u64);
///     }
///     Ok::<_, std::io::Error>(frame)
/// })
/// .item_size(size.clone());
/// assert_eq!(size.get(), None); // nothing measured yet
/// # drop(stage);
/// size.record(1000);
/// assert_eq!(size.get(), Some(1000));
/// ```
#[derive(Debug, Clone, Default)]
pub struct ItemSize(Arc<Inner>);

#[derive(Debug, Default)]
struct Inner {
    /// The moving average in bytes; 0 until the first record.
    bytes: AtomicU64,
    calls: AtomicU64,
    /// Some output's size was a guess.
    guessed: AtomicBool,
    /// The stage's output queue, deepened while the items are small.
    queue: OnceLock<SmallItems>,
}

/// The output queue of a stage whose items are measured, and its bounds in items.
#[derive(Debug)]
struct SmallItems {
    limit: QueueLimit,
    min: usize,
    max: usize,
}

impl ItemSize {
    /// After the first calls, one output in this many is measured.
    pub const EVERY: u64 = 16;

    /// An estimate with nothing measured.
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether this call should measure its output (counts the call).
    pub fn due(&self) -> bool {
        let n = self.0.calls.fetch_add(1, Relaxed);
        n < WARMUP || n.is_multiple_of(Self::EVERY)
    }

    /// Adds one measured output of `bytes` bytes to the estimate.
    pub fn record(&self, bytes: u64) {
        let bytes = bytes.max(1);
        let _ = self
            .0
            .bytes
            .fetch_update(Relaxed, Relaxed, |old| Some(if old == 0 { bytes } else { old - old / 8 + bytes / 8 }));
        self.fit_queue();
    }

    /// Adds an output whose size is only guessed (`bytes`, say a fixed charge for an opaque
    /// object): it counts in the estimate, and the output queue stays at its capacity in items.
    ///
    /// ```
    /// use spdl_exec::ItemSize;
    /// let size = ItemSize::new();
    /// size.record_guess(64);
    /// assert_eq!(size.get(), Some(64));
    /// ```
    pub fn record_guess(&self, bytes: u64) {
        self.0.guessed.store(true, Relaxed);
        self.record(bytes);
    }

    /// Lets the stage's output queue (`limit`, of `min` items, at most `max`) hold more items
    /// while they are small.
    pub(crate) fn deepen_queue(&self, limit: QueueLimit, min: usize, max: usize) {
        if max > min {
            let _ = self.0.queue.set(SmallItems { limit, min, max });
            self.fit_queue();
        }
    }

    fn fit_queue(&self) {
        let Some(q) = self.0.queue.get() else { return };
        let want = match self.get() {
            Some(bytes) if !self.0.guessed.load(Relaxed) => {
                usize::try_from(SMALL_QUEUE_BYTES / bytes).unwrap_or(usize::MAX).clamp(q.min, q.max)
            }
            _ => q.min,
        };
        if want != q.limit.capacity() {
            q.limit.set(want);
        }
    }

    /// The estimate, `None` until something was recorded.
    pub fn get(&self) -> Option<u64> {
        match self.0.bytes.load(Relaxed) {
            0 => None,
            n => Some(n),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn measures_every_call_at_first_then_one_in_sixteen() {
        let s = ItemSize::new();
        let due = (0..8 + 64).filter(|_| s.due()).count();
        assert_eq!(due, 8 + 4);
    }

    #[test]
    fn the_estimate_follows_a_change_without_jumping_on_one_outlier() {
        let s = ItemSize::new();
        s.record(1000);
        s.record(1_000_000);
        let after_outlier = s.get().unwrap();
        assert!(after_outlier < 200_000, "{after_outlier}");
        for _ in 0..64 {
            s.record(4000);
        }
        let settled = s.get().unwrap();
        assert!((3900..=4100).contains(&settled), "{settled}");
        assert_eq!(ItemSize::new().get(), None);
    }

    #[test]
    fn a_queue_of_small_items_deepens_and_a_guess_keeps_it_at_its_capacity() {
        let s = ItemSize::new();
        let (tx, _rx) = crate::queue::resizable_queue::<u8>(2, SMALL_QUEUE_ITEMS);
        s.deepen_queue(tx.limit(), 2, SMALL_QUEUE_ITEMS);
        s.record(8);
        assert_eq!(tx.limit().capacity(), SMALL_QUEUE_ITEMS);
        for _ in 0..64 {
            s.record(16 * 1024);
        }
        assert_eq!(tx.limit().capacity(), 4, "64 KiB of 16 KiB items");
        for _ in 0..64 {
            s.record(1 << 20);
        }
        assert_eq!(tx.limit().capacity(), 2, "never below the capacity asked for");
        let g = ItemSize::new();
        let (tx, _rx) = crate::queue::resizable_queue::<u8>(2, SMALL_QUEUE_ITEMS);
        g.deepen_queue(tx.limit(), 2, SMALL_QUEUE_ITEMS);
        g.record(8);
        g.record_guess(64);
        g.record(8);
        assert_eq!(tx.limit().capacity(), 2);
    }
}
