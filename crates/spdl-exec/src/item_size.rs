//! [`ItemSize`]: a stage's measured output size, for the auto-tuner's memory budget.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;

/// Calls measured before sampling thins out to one in [`ItemSize::EVERY`].
const WARMUP: u64 = 8;

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
}
