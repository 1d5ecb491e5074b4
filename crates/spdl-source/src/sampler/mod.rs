//! Samplers: the order in which a training loop visits a dataset, reproducible from (seed, epoch) on every
//! machine, shardable across ranks, and resumable exactly from a saved [`SamplerState`].
//!
//! A [`Sampler`] is a pure function from an epoch number to an order of indices. A [`SamplerIter`] walks those
//! orders epoch after epoch and knows where it is, so its [`SamplerIter::state`] (seed, epoch, position) can be
//! saved in a checkpoint and [`SamplerIter::restore`]d later to yield exactly the indices not yet yielded, in the
//! same order.
//!
//! ```
//! use spdl_source::sampler::{Remainder, Sampler, SamplerIter, ShardedSampler, ShuffledSampler};
//!
//! // 10 items, shuffled with seed 42, split over 2 ranks; this is rank 1.
//! let sampler = ShardedSampler::new(ShuffledSampler::new(10, 42), 1, 2, Remainder::Pad)?;
//! let mut it = SamplerIter::new(sampler.clone());
//! let first_three: Vec<usize> = it.by_ref().take(3).collect();
//! let saved = it.state(); // e.g. serde_json::to_string(&saved) into a checkpoint
//!
//! let rest: Vec<usize> = it.epoch_iter().collect();
//! let resumed: Vec<usize> = SamplerIter::restore(sampler, &saved)?.epoch_iter().collect();
//! assert_eq!(rest, resumed);
//! assert_eq!(first_three.len() + rest.len(), 5);
//! # Ok::<(), spdl_source::SourceError>(())
//! ```

use serde::{Deserialize, Serialize};

use crate::error::{Result, SourceError};

mod basic;
mod elastic;
mod shard;

pub use basic::{SequentialSampler, ShuffledSampler, WeightedSampler};
pub use elastic::{
    CanonicalOrder, ElasticShard, EpochProgress, MAX_PARTITIONS_FLOOR, Spans, batches_per_rank, per_rank,
};
pub use shard::{Remainder, Shard, ShardedSampler};

/// The largest number of indices any sampler computes or allocates at once: an epoch's order, the permutation a
/// shuffle draws, the draws of a weighted sampler. 2^31 indices (16 GiB as `usize`); a larger size is refused with
/// [`SourceError::OrderTooLarge`] before anything is allocated. A sharded sampler allocates only its share, so a
/// huge sequential sampler split over many ranks stays usable.
pub const MAX_ORDER_LEN: usize = 1 << 31;

/// Refuses `size` items of `what` when above [`MAX_ORDER_LEN`].
pub(crate) fn check_order_len(what: &'static str, size: u128) -> Result<()> {
    if size > MAX_ORDER_LEN as u128 {
        return Err(SourceError::OrderTooLarge { what, size, limit: MAX_ORDER_LEN as u128 });
    }
    Ok(())
}

/// A deterministic order of dataset indices for each epoch.
///
/// Implementations must make [`try_order`](Sampler::try_order) a pure function of their configuration and the
/// epoch, with a fixed, portable algorithm: the same configuration gives the same order on every machine and every
/// run. That is what makes sharding (every rank computes the same global order and takes its share) and exact
/// resume work. Every size that comes from an argument is checked against [`MAX_ORDER_LEN`] before it is
/// allocated.
pub trait Sampler: Send + Sync {
    /// Number of indices one epoch yields.
    fn len(&self) -> usize;

    /// True when an epoch yields nothing.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The indices of `epoch`, in order; exactly [`len`](Sampler::len) of them. Fails with
    /// [`SourceError::OrderTooLarge`] when the order (or what computing it needs) is above [`MAX_ORDER_LEN`].
    fn try_order(&self, epoch: u64) -> Result<Vec<usize>>;

    /// The indices at `positions` of `epoch`'s order (`result[i] == order[positions[i]]`), computing no more of
    /// the order than the sampler's algorithm needs: a sequential sampler computes each one directly, a weighted
    /// sampler streams its draws, a shuffle needs its whole permutation. Fails when a position is not below
    /// [`len`](Sampler::len), or as [`try_order`](Sampler::try_order) does.
    fn try_order_at(&self, epoch: u64, positions: &[usize]) -> Result<Vec<usize>>;

    /// The indices of `epoch`, in order, as [`try_order`](Sampler::try_order).
    ///
    /// # Panics
    ///
    /// When [`try_order`](Sampler::try_order) fails (an order above [`MAX_ORDER_LEN`]); use `try_order` when the
    /// size comes from untrusted input.
    fn order(&self, epoch: u64) -> Vec<usize> {
        match self.try_order(epoch) {
            Ok(order) => order,
            Err(err) => panic!("{err}"),
        }
    }

    /// The seed the order derives from (0 for samplers that do not shuffle). Saved in [`SamplerState`] so that a
    /// state is not restored into a sampler with another seed.
    fn seed(&self) -> u64 {
        0
    }
}

/// Refuses a position that is not below `len`.
pub(crate) fn check_positions(positions: &[usize], len: usize) -> Result<()> {
    check_order_len("positions asked for", positions.len() as u128)?;
    match positions.iter().find(|&&p| p >= len) {
        Some(p) => Err(SourceError::SamplerConfig { reason: format!("position {p} is past the epoch length {len}") }),
        None => Ok(()),
    }
}

impl<S: Sampler + ?Sized> Sampler for Box<S> {
    fn len(&self) -> usize {
        (**self).len()
    }
    fn try_order(&self, epoch: u64) -> Result<Vec<usize>> {
        (**self).try_order(epoch)
    }
    fn try_order_at(&self, epoch: u64, positions: &[usize]) -> Result<Vec<usize>> {
        (**self).try_order_at(epoch, positions)
    }
    fn seed(&self) -> u64 {
        (**self).seed()
    }
}

impl<S: Sampler + ?Sized> Sampler for std::sync::Arc<S> {
    fn len(&self) -> usize {
        (**self).len()
    }
    fn try_order(&self, epoch: u64) -> Result<Vec<usize>> {
        (**self).try_order(epoch)
    }
    fn try_order_at(&self, epoch: u64, positions: &[usize]) -> Result<Vec<usize>> {
        (**self).try_order_at(epoch, positions)
    }
    fn seed(&self) -> u64 {
        (**self).seed()
    }
}

/// Where a [`SamplerIter`] stands: enough to continue exactly where it stopped. Serializes to a few numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SamplerState {
    /// The sampler's seed, checked on restore.
    pub seed: u64,
    /// The epoch being read.
    pub epoch: u64,
    /// How many indices of that epoch were already yielded.
    pub position: u64,
    /// The sampler's epoch length, checked on restore.
    pub len: u64,
}

/// Walks a sampler's orders epoch after epoch, tracking (epoch, position) for exact resume.
///
/// As an [`Iterator`] it runs across epoch boundaries without end (unless the sampler is empty); use
/// [`epoch_iter`](SamplerIter::epoch_iter) to read just the rest of the current epoch. The state is kept in a
/// canonical form: once the last index of an epoch is yielded, the iterator stands at position 0 of the next one.
#[derive(Debug, Clone)]
pub struct SamplerIter<S> {
    sampler: S,
    epoch: u64,
    position: usize,
    /// The order of `epoch`, computed on first use.
    order: Option<Vec<usize>>,
    /// Why the last order could not be computed; iteration ends there.
    error: Option<std::sync::Arc<SourceError>>,
}

impl<S: Sampler> SamplerIter<S> {
    /// Starts at epoch 0, position 0.
    pub fn new(sampler: S) -> Self {
        Self::at_epoch(sampler, 0)
    }

    /// Starts at the beginning of `epoch`.
    pub fn at_epoch(sampler: S, epoch: u64) -> Self {
        SamplerIter { sampler, epoch, position: 0, order: None, error: None }
    }

    /// Starts at epoch 0, position 0, computing epoch 0's order now: fails when the sampler's order cannot be
    /// computed (see [`Sampler::try_order`]) instead of ending the iteration later.
    pub fn try_new(sampler: S) -> Result<Self> {
        let mut it = Self::new(sampler);
        it.order = Some(it.sampler.try_order(0)?);
        Ok(it)
    }

    /// Why iteration ended early: the order of the current epoch could not be computed (e.g. it is above
    /// [`MAX_ORDER_LEN`]). `None` while iteration goes on or after a normal end.
    pub fn error(&self) -> Option<&SourceError> {
        self.error.as_deref()
    }

    /// Continues from a saved state. Fails when the state was saved from a sampler with another seed or epoch
    /// length, or its position is past the end of the epoch.
    pub fn restore(sampler: S, state: &SamplerState) -> Result<Self> {
        let len = sampler.len() as u64;
        if state.seed != sampler.seed() {
            return Err(SourceError::StateMismatch {
                reason: format!("state has seed {}, sampler has seed {}", state.seed, sampler.seed()),
            });
        }
        if state.len != len {
            return Err(SourceError::StateMismatch {
                reason: format!("state has epoch length {}, sampler has {len}", state.len),
            });
        }
        if state.position > len {
            return Err(SourceError::StateMismatch {
                reason: format!("position {} is past the epoch length {len}", state.position),
            });
        }
        let mut it = Self::at_epoch(sampler, state.epoch);
        // In range: position <= len, and len came from a usize.
        it.position = usize::try_from(state.position).unwrap_or(usize::MAX);
        if len > 0 && state.position == len {
            it.advance_epoch();
        }
        if len > 0 {
            // Computed now, so that an order that cannot be computed fails the restore, not a later `next`.
            it.order = Some(it.sampler.try_order(it.epoch)?);
        }
        Ok(it)
    }

    /// The current state, to save in a checkpoint.
    pub fn state(&self) -> SamplerState {
        SamplerState {
            seed: self.sampler.seed(),
            epoch: self.epoch,
            position: self.position as u64,
            len: self.sampler.len() as u64,
        }
    }

    /// The epoch being read.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Indices of the current epoch already yielded.
    pub fn position(&self) -> usize {
        self.position
    }

    /// Indices left in the current epoch.
    pub fn remaining_in_epoch(&self) -> usize {
        self.sampler.len().saturating_sub(self.position)
    }

    /// The sampler.
    pub fn sampler(&self) -> &S {
        &self.sampler
    }

    /// Jumps to the beginning of `epoch`, dropping the rest of the current one.
    pub fn set_epoch(&mut self, epoch: u64) {
        if epoch != self.epoch {
            self.order = None;
            self.error = None;
        }
        self.epoch = epoch;
        self.position = 0;
    }

    /// Iterates over the rest of the current epoch; afterwards the iterator stands at the next epoch.
    pub fn epoch_iter(&mut self) -> EpochIter<'_, S> {
        let epoch = self.epoch;
        EpochIter { inner: self, epoch }
    }

    fn advance_epoch(&mut self) {
        self.epoch = self.epoch.wrapping_add(1);
        self.position = 0;
        self.order = None;
    }
}

impl<S: Sampler> Iterator for SamplerIter<S> {
    type Item = usize;

    fn next(&mut self) -> Option<usize> {
        if self.sampler.is_empty() {
            return None;
        }
        if self.error.is_some() {
            return None;
        }
        let order = match self.order.take() {
            Some(order) => self.order.insert(order),
            None => match self.sampler.try_order(self.epoch) {
                Ok(order) => self.order.insert(order),
                Err(err) => {
                    tracing::error!(
                        epoch = self.epoch,
                        err = %spdl_report::error_chain(&err),
                        "sampler order cannot be computed; iteration ends"
                    );
                    self.error = Some(std::sync::Arc::new(err));
                    return None;
                }
            },
        };
        let index = order.get(self.position).copied();
        match index {
            Some(index) => {
                self.position += 1;
                if self.position >= order.len() {
                    self.advance_epoch();
                }
                Some(index)
            }
            // A sampler whose order is shorter than its len: treat the epoch as over.
            None => {
                self.advance_epoch();
                None
            }
        }
    }
}

/// The rest of one epoch of a [`SamplerIter`]; see [`SamplerIter::epoch_iter`].
#[derive(Debug)]
pub struct EpochIter<'a, S> {
    inner: &'a mut SamplerIter<S>,
    epoch: u64,
}

impl<S: Sampler> Iterator for EpochIter<'_, S> {
    type Item = usize;

    fn next(&mut self) -> Option<usize> {
        if self.inner.epoch != self.epoch {
            return None;
        }
        self.inner.next()
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = if self.inner.epoch == self.epoch { self.inner.remaining_in_epoch() } else { 0 };
        (n, Some(n))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand_chacha::ChaCha8Rng;
    use rand_chacha::rand_core::{RngCore, SeedableRng};

    /// Everything a fresh iterator yields over `epochs` epochs.
    fn stream<S: Sampler + Clone>(sampler: &S, epochs: u64) -> Vec<usize> {
        (0..epochs).flat_map(|e| sampler.order(e)).collect()
    }

    /// Cuts the stream at random points (saving and restoring through JSON at each) and checks that the
    /// concatenation equals the uninterrupted stream.
    fn check_resume<S: Sampler + Clone>(sampler: S, epochs: u64, cuts: usize, seed: u64) {
        let expected = stream(&sampler, epochs);
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut got = Vec::new();
        let mut it = SamplerIter::new(sampler.clone());
        while got.len() < expected.len() {
            let left = expected.len() - got.len();
            let step = (rng.next_u64() as usize % (left.min(sampler.len().max(1) * 2))) + 1;
            got.extend(it.by_ref().take(step));
            for _ in 0..cuts {
                let json = serde_json::to_string(&it.state()).unwrap();
                let state: SamplerState = serde_json::from_str(&json).unwrap();
                it = SamplerIter::restore(sampler.clone(), &state).unwrap();
            }
        }
        assert_eq!(got, expected);
    }

    #[test]
    fn resume_at_random_cut_points() {
        for seed in 0..20 {
            check_resume(ShuffledSampler::new(37, seed), 4, 1, seed);
            check_resume(SequentialSampler::new(11), 3, 2, seed);
            let weighted = WeightedSampler::new(vec![1.0, 0.0, 3.0, 0.5], 9, seed).unwrap();
            check_resume(weighted, 3, 1, seed);
            for world in 1..5 {
                for rank in 0..world {
                    for rem in [Remainder::Pad, Remainder::Drop] {
                        let sharded = ShardedSampler::new(ShuffledSampler::new(23, seed), rank, world, rem).unwrap();
                        check_resume(sharded, 3, 1, seed + rank as u64);
                    }
                }
            }
        }
    }

    #[test]
    fn epoch_iter_stops_at_the_boundary() {
        let sampler = ShuffledSampler::new(5, 1);
        let mut it = SamplerIter::new(sampler);
        assert_eq!(it.epoch_iter().size_hint(), (5, Some(5)));
        let e0: Vec<usize> = it.epoch_iter().collect();
        assert_eq!(e0, sampler.order(0));
        assert_eq!((it.epoch(), it.position()), (1, 0));
        assert_eq!(it.state(), SamplerState { seed: 1, epoch: 1, position: 0, len: 5 });
        let e1: Vec<usize> = it.epoch_iter().collect();
        assert_eq!(e1, sampler.order(1));
        it.set_epoch(7);
        assert_eq!(it.next(), sampler.order(7).first().copied());
    }

    #[test]
    fn restore_checks_the_state() {
        let s = ShuffledSampler::new(10, 3);
        let state = SamplerState { seed: 3, epoch: 2, position: 10, len: 10 };
        let it = SamplerIter::restore(s, &state).unwrap();
        assert_eq!((it.epoch(), it.position()), (3, 0));
        let bad_seed = SamplerState { seed: 4, ..state };
        assert!(matches!(SamplerIter::restore(s, &bad_seed), Err(SourceError::StateMismatch { .. })));
        let bad_len = SamplerState { len: 11, ..state };
        assert!(SamplerIter::restore(s, &bad_len).is_err());
        let bad_pos = SamplerState { position: 11, ..state };
        assert!(SamplerIter::restore(s, &bad_pos).is_err());
    }

    #[test]
    fn empty_sampler_ends() {
        let mut it = SamplerIter::new(SequentialSampler::new(0));
        assert_eq!(it.next(), None);
        assert_eq!(it.epoch_iter().count(), 0);
        let state = it.state();
        assert!(SamplerIter::restore(SequentialSampler::new(0), &state).is_ok());
    }

    /// The share a sharded sampler takes, computed the plain way from the whole inner order.
    fn reference_share<S: Sampler>(inner: &S, rank: usize, world: usize, rem: Remainder, epoch: u64) -> Vec<usize> {
        let global = inner.order(epoch);
        if global.is_empty() {
            return Vec::new();
        }
        let total = match rem {
            Remainder::Pad => global.len().div_ceil(world) * world,
            Remainder::Drop => global.len() / world * world,
        };
        (rank..total).step_by(world).map(|p| global[p % global.len()]).collect()
    }

    #[test]
    fn shares_computed_from_positions_match_the_whole_order() {
        let weighted = WeightedSampler::new(vec![0.5, 2.0, 0.0, 1.0, 3.0], 23, 9).unwrap();
        for world in 1..7 {
            for rank in 0..world {
                for rem in [Remainder::Pad, Remainder::Drop] {
                    for epoch in 0..2 {
                        let seq = SequentialSampler::new(13);
                        let shuf = ShuffledSampler::new(17, 4);
                        let sharded = ShardedSampler::new(seq, rank, world, rem).unwrap();
                        assert_eq!(sharded.order(epoch), reference_share(&seq, rank, world, rem, epoch));
                        let sharded = ShardedSampler::new(shuf, rank, world, rem).unwrap();
                        assert_eq!(sharded.order(epoch), reference_share(&shuf, rank, world, rem, epoch));
                        let sharded = ShardedSampler::new(weighted.clone(), rank, world, rem).unwrap();
                        assert_eq!(sharded.order(epoch), reference_share(&weighted, rank, world, rem, epoch));
                        // A share of a share.
                        let twice = ShardedSampler::new(sharded.clone(), 0, 2, rem).unwrap();
                        assert_eq!(twice.order(epoch), reference_share(&sharded, 0, 2, rem, epoch));
                    }
                }
            }
        }
    }

    #[test]
    fn huge_sizes_are_refused_before_allocating() {
        let too_large = |r: Result<Vec<usize>>| matches!(r, Err(SourceError::OrderTooLarge { .. }));
        assert!(too_large(ShuffledSampler::new(10_000_000_000, 1).try_order(0)));
        assert!(too_large(SequentialSampler::new(1 << 62).try_order(0)));
        assert!(too_large(SequentialSampler::new(usize::MAX).try_order(0)));
        let weighted = WeightedSampler::new(vec![1.0, 2.0], 1_000_000_000_000, 3).unwrap();
        assert!(too_large(weighted.try_order(0)));
        // A 2-item share of a 2^40-item sequential order costs 2 items.
        let share = ShardedSampler::new(SequentialSampler::new(1 << 40), 0, 1 << 39, Remainder::Pad).unwrap();
        assert_eq!(share.len(), 2);
        assert_eq!(share.try_order(0).unwrap(), vec![0, 1 << 39]);
        // Padding arithmetic near usize::MAX neither overflows nor panics.
        let edge = ShardedSampler::new(SequentialSampler::new(usize::MAX), usize::MAX - 1, usize::MAX, Remainder::Pad)
            .unwrap();
        assert_eq!(edge.len(), 1);
        assert_eq!(edge.try_order(0).unwrap(), vec![usize::MAX - 1]);
        let edge = ShardedSampler::new(SequentialSampler::new(usize::MAX), 1, 3, Remainder::Pad).unwrap();
        assert!(too_large(edge.try_order(0)));
        // A small share of a huge shuffle still needs the whole permutation: refused.
        let share = ShardedSampler::new(ShuffledSampler::new(1 << 40, 1), 0, 1 << 39, Remainder::Drop).unwrap();
        assert!(too_large(share.try_order(0)));
        // A small share of a huge weighted draw needs the draws up to its last position.
        let first = ShardedSampler::new(weighted.clone(), 0, 1 << 39, Remainder::Drop).unwrap();
        assert_eq!(first.try_order(0).unwrap(), weighted.try_order_at(0, &[0]).unwrap());
        let last = ShardedSampler::new(weighted, (1 << 39) - 1, 1 << 39, Remainder::Drop).unwrap();
        assert!(too_large(last.try_order(0)));
        // Positions past the end are refused, not clamped.
        assert!(SequentialSampler::new(3).try_order_at(0, &[3]).is_err());
        assert!(ShuffledSampler::new(3, 0).try_order_at(0, &[0, 7]).is_err());
    }

    #[test]
    fn iterators_report_orders_they_cannot_compute() {
        let huge = ShuffledSampler::new(1 << 40, 1);
        assert!(matches!(SamplerIter::try_new(huge), Err(SourceError::OrderTooLarge { .. })));
        let mut it = SamplerIter::new(huge);
        assert_eq!(it.next(), None);
        assert!(matches!(it.error(), Some(SourceError::OrderTooLarge { .. })));
        let state = SamplerState { seed: 1, epoch: 0, position: 5, len: 1 << 40 };
        assert!(matches!(SamplerIter::restore(huge, &state), Err(SourceError::OrderTooLarge { .. })));
        let mut ok = SamplerIter::try_new(ShuffledSampler::new(4, 1)).unwrap();
        assert_eq!(ok.epoch_iter().count(), 4);
        assert!(ok.error().is_none());
    }

    #[test]
    fn state_is_small() {
        let json = serde_json::to_string(&SamplerState { seed: 42, epoch: 3, position: 1000, len: 1281167 }).unwrap();
        assert_eq!(json, r#"{"seed":42,"epoch":3,"position":1000,"len":1281167}"#);
    }
}
