//! Elastic ranks: an epoch order that does not depend on the world size, equal shares for every rank,
//! and progress that a job saved at world size W resumes at world size W'.
//!
//! The epoch's order is defined over a fixed number of canonical partitions ([`CanonicalOrder`], the
//! scheme of MosaicML streaming's canonical nodes): samples are cut into `partitions` contiguous
//! partitions; a shuffled epoch permutes the partitions and the samples inside each one, from
//! `(seed, epoch)` only. What has been delivered anywhere is a set of positions in that order
//! ([`EpochProgress`], stored as spans). A rank's share ([`ElasticShard::share`]) is every
//! `world_size`-th position of what remains, evened out by [`Remainder`] so every rank gets the same
//! count, hence the same number of batches ([`batches_per_rank`]). After an interruption,
//! [`ElasticShard::merge`] turns what each rank delivered (positions in its own share) back into
//! positions of the order; the merged progress is valid for any world size.
//!
//! ```
//! use spdl_source::sampler::{CanonicalOrder, ElasticShard, EpochProgress, Remainder, Shard, Spans};
//!
//! let order = CanonicalOrder::new(10, 4, 7, true)?;
//! let start = EpochProgress::new(0);
//! // Two ranks; each delivers the first 2 items of its share, then the job stops.
//! let ranks: Vec<ElasticShard> =
//!     (0..2).map(|r| ElasticShard::new(order, Shard::new(r, 2).unwrap(), Remainder::Pad)).collect();
//! let delivered: Vec<(usize, Spans)> = (0..2).map(|r| (r, Spans::from_range(0, 2))).collect();
//! let progress = ranks[0].merge(&start, &delivered)?;
//! assert_eq!(progress.done.count(), 4);
//! // It resumes on 3 ranks: the 6 samples left, 2 each, none delivered twice.
//! let mut left: Vec<usize> = (0..3)
//!     .flat_map(|r| ElasticShard::new(order, Shard::new(r, 3).unwrap(), Remainder::Pad).indices(&progress).unwrap())
//!     .collect();
//! left.sort();
//! left.dedup();
//! assert_eq!(left.len(), 6);
//! # Ok::<(), spdl_source::SourceError>(())
//! ```

use serde::{Deserialize, Serialize};

use super::basic::{below, rng_for};
use super::{Remainder, Sampler, Shard, check_order_len, check_positions};
use crate::error::{Result, SourceError};

const CANONICAL_DOMAIN: u64 = 0x4341_4E4F; // "CANO"

/// An epoch order over `len` samples defined by `partitions` canonical partitions: the same for every
/// world size. Without `shuffle` it is `0..len`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CanonicalOrder {
    len: usize,
    partitions: usize,
    seed: u64,
    shuffle: bool,
}

/// The most canonical partitions of an order of fewer samples than this; an order of more samples may
/// have up to one partition per sample. A shuffled epoch permutes every partition (empty ones included), so
/// the cap keeps that permutation within the order's own size.
pub const MAX_PARTITIONS_FLOOR: usize = 1 << 16;

impl CanonicalOrder {
    /// The most partitions an order of `len` samples may have: `max(len, MAX_PARTITIONS_FLOOR)`.
    pub fn max_partitions(len: usize) -> usize {
        len.max(MAX_PARTITIONS_FLOOR)
    }

    /// The order of `len` samples over `partitions` canonical partitions (at least 1, at most
    /// [`max_partitions`](Self::max_partitions)`(len)`).
    pub fn new(len: usize, partitions: usize, seed: u64, shuffle: bool) -> Result<Self> {
        check_order_len("canonical order length", len as u128)?;
        let max = Self::max_partitions(len);
        if partitions == 0 || partitions > max {
            return Err(SourceError::SamplerConfig {
                reason: format!("num_partitions must be between 1 and {max}, got {partitions}"),
            });
        }
        Ok(Self { len, partitions, seed, shuffle })
    }

    /// The number of canonical partitions.
    pub fn partitions(&self) -> usize {
        self.partitions
    }

    /// Whether epochs are shuffled.
    pub fn shuffle(&self) -> bool {
        self.shuffle
    }

    fn bounds(&self, p: usize) -> (usize, usize) {
        let (n, k) = (self.len as u128, self.partitions as u128);
        ((n * p as u128 / k) as usize, (n * (p as u128 + 1) / k) as usize)
    }
}

impl Sampler for CanonicalOrder {
    fn len(&self) -> usize {
        self.len
    }

    fn try_order(&self, epoch: u64) -> Result<Vec<usize>> {
        if !self.shuffle {
            return Ok((0..self.len).collect());
        }
        let mut parts: Vec<usize> = (0..self.partitions).collect();
        let mut rng = rng_for(self.seed, CANONICAL_DOMAIN, epoch);
        for i in (1..parts.len()).rev() {
            parts.swap(i, below(&mut rng, i as u64 + 1) as usize);
        }
        let mut order = Vec::with_capacity(self.len);
        for p in parts {
            let (lo, hi) = self.bounds(p);
            let start = order.len();
            order.extend(lo..hi);
            let slice = &mut order[start..];
            let mut rng = rng_for(self.seed, CANONICAL_DOMAIN ^ ((p as u64 + 1) << 32), epoch);
            for i in (1..slice.len()).rev() {
                slice.swap(i, below(&mut rng, i as u64 + 1) as usize);
            }
        }
        Ok(order)
    }

    fn try_order_at(&self, epoch: u64, positions: &[usize]) -> Result<Vec<usize>> {
        check_positions(positions, self.len)?;
        if positions.is_empty() {
            return Ok(Vec::new());
        }
        let order = self.try_order(epoch)?;
        Ok(positions.iter().filter_map(|&p| order.get(p).copied()).collect())
    }

    fn seed(&self) -> u64 {
        if self.shuffle { self.seed } else { 0 }
    }
}

/// A set of positions as sorted, disjoint, non-adjacent half-open spans `[start, end)`: small when the
/// set is mostly contiguous (what a pipeline delivers).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Spans(Vec<(u64, u64)>);

impl Spans {
    /// No positions.
    pub fn new() -> Self {
        Self::default()
    }

    /// Positions `start..end`.
    pub fn from_range(start: u64, end: u64) -> Self {
        if start < end { Self(vec![(start, end)]) } else { Self::default() }
    }

    /// The spans from a list of `[start, end)` pairs in any order (overlaps merged); refuses `start > end`.
    pub fn from_pairs(pairs: impl IntoIterator<Item = (u64, u64)>) -> Result<Self> {
        let mut v: Vec<(u64, u64)> = Vec::new();
        for (s, e) in pairs {
            if s > e {
                return Err(SourceError::SamplerConfig { reason: format!("span [{s}, {e}) ends before it starts") });
            }
            if s < e {
                v.push((s, e));
            }
        }
        v.sort_unstable();
        let mut out: Vec<(u64, u64)> = Vec::with_capacity(v.len());
        for (s, e) in v {
            match out.last_mut() {
                Some(last) if s <= last.1 => last.1 = last.1.max(e),
                _ => out.push((s, e)),
            }
        }
        Ok(Self(out))
    }

    /// The spans of a set of positions.
    pub fn from_positions(positions: impl IntoIterator<Item = u64>) -> Self {
        let mut v: Vec<u64> = positions.into_iter().collect();
        v.sort_unstable();
        v.dedup();
        let mut out: Vec<(u64, u64)> = Vec::new();
        for p in v {
            match out.last_mut() {
                Some(last) if last.1 == p => last.1 = p + 1,
                _ => out.push((p, p + 1)),
            }
        }
        Self(out)
    }

    /// The spans, ascending.
    pub fn pairs(&self) -> &[(u64, u64)] {
        &self.0
    }

    /// How many positions.
    pub fn count(&self) -> u64 {
        self.0.iter().map(|(s, e)| e - s).sum()
    }

    /// Whether `p` is in the set.
    pub fn contains(&self, p: u64) -> bool {
        let i = self.0.partition_point(|&(_, e)| e <= p);
        self.0.get(i).is_some_and(|&(s, _)| s <= p)
    }

    /// The union with `other`.
    pub fn union(&self, other: &Spans) -> Spans {
        // Both inputs are valid spans: this cannot fail.
        Self::from_pairs(self.0.iter().chain(other.0.iter()).copied()).unwrap_or_default()
    }
}

/// What of one epoch has been delivered anywhere: positions in the epoch's [`CanonicalOrder`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EpochProgress {
    /// The epoch.
    pub epoch: u64,
    /// Delivered positions of the epoch's order.
    pub done: Spans,
}

impl EpochProgress {
    /// Nothing delivered of `epoch`.
    pub fn new(epoch: u64) -> Self {
        Self { epoch, done: Spans::new() }
    }
}

/// How many items each rank gets when `remaining` are shared by `world_size` ranks under `remainder`
/// (the same for every rank).
pub fn per_rank(remaining: u64, world_size: usize, remainder: Remainder) -> u64 {
    let w = world_size.max(1) as u64;
    match remainder {
        Remainder::Pad => remaining.div_ceil(w),
        Remainder::Drop => remaining / w,
    }
}

/// How many batches of `batch_size` each rank makes from `per_rank` items: `drop_last` drops a short
/// last batch. Every rank has the same `per_rank`, so the same number of batches.
pub fn batches_per_rank(per_rank: u64, batch_size: usize, drop_last: bool) -> u64 {
    let b = batch_size.max(1) as u64;
    if drop_last { per_rank / b } else { per_rank.div_ceil(b) }
}

/// One rank's elastic share of a [`CanonicalOrder`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ElasticShard {
    order: CanonicalOrder,
    shard: Shard,
    remainder: Remainder,
}

impl ElasticShard {
    /// Rank `shard.rank` of `shard.world_size` over `order`.
    pub fn new(order: CanonicalOrder, shard: Shard, remainder: Remainder) -> Self {
        Self { order, shard, remainder }
    }

    /// The order.
    pub fn order(&self) -> &CanonicalOrder {
        &self.order
    }

    /// The rank and world size.
    pub fn shard(&self) -> Shard {
        self.shard
    }

    /// The positions of the order this rank visits in `progress.epoch`, given what was delivered
    /// anywhere: every `world_size`-th of the remaining positions, starting at the rank, after the
    /// remaining list is padded (repeating its start) or cut to a multiple of the world size. Every rank
    /// gets [`per_rank`] positions.
    pub fn share(&self, progress: &EpochProgress) -> Result<Vec<u64>> {
        let n = self.order.len as u64;
        if let Some(&(_, end)) = progress.done.pairs().last()
            && end > n
        {
            return Err(SourceError::SamplerConfig {
                reason: format!("delivered position {} is past the epoch length {n}", end - 1),
            });
        }
        let remaining = n - progress.done.count();
        let (w, r) = (self.shard.world_size as u64, self.shard.rank as u64);
        let count = per_rank(remaining, self.shard.world_size, self.remainder);
        check_order_len("rank share", count as u128)?;
        // The j-th remaining position, in order (j < remaining), by walking the gaps between spans.
        let gaps = gaps(progress.done.pairs(), n);
        let mut out = Vec::with_capacity(count as usize);
        let mut cursor = GapCursor::new(&gaps);
        for j in 0..count {
            let k = (r + j * w) % remaining.max(1); // padding repeats the start
            out.push(cursor.nth(k));
        }
        Ok(out)
    }

    /// The sample indices of [`share`](Self::share), in order.
    pub fn indices(&self, progress: &EpochProgress) -> Result<Vec<usize>> {
        let positions = self.share(progress)?;
        let order = self.order.try_order(progress.epoch)?;
        Ok(positions.iter().filter_map(|&p| order.get(p as usize).copied()).collect())
    }

    /// What every rank delivered, back in positions of the order: each `(rank, delivered)` gives the
    /// positions *in that rank's share* (its pipeline's checkpoint keys) that it delivered, for ranks of
    /// this shard's world size sharing `start`. The result is valid for any world size.
    pub fn merge(&self, start: &EpochProgress, delivered: &[(usize, Spans)]) -> Result<EpochProgress> {
        let mut all = Vec::new();
        for (rank, local) in delivered {
            let shard = Shard::new(*rank, self.shard.world_size)?;
            let share = ElasticShard { shard, ..*self }.share(start)?;
            for &(s, e) in local.pairs() {
                if e > share.len() as u64 {
                    return Err(SourceError::SamplerConfig {
                        reason: format!(
                            "rank {rank} delivered position {} of its share, which has {} positions",
                            e - 1,
                            share.len()
                        ),
                    });
                }
                all.extend(share[s as usize..e as usize].iter().map(|&p| (p, p + 1)));
            }
        }
        let done = start.done.union(&Spans::from_pairs(all)?);
        Ok(EpochProgress { epoch: start.epoch, done })
    }
}

/// The gaps (undelivered spans) of `0..n`.
fn gaps(done: &[(u64, u64)], n: u64) -> Vec<(u64, u64)> {
    let mut out = Vec::with_capacity(done.len() + 1);
    let mut at = 0;
    for &(s, e) in done {
        if s > at {
            out.push((at, s));
        }
        at = at.max(e);
    }
    if at < n {
        out.push((at, n));
    }
    out
}

/// Finds the k-th undelivered position, fast for increasing k (one pass) and correct for any k.
struct GapCursor<'a> {
    gaps: &'a [(u64, u64)],
    /// Index of the current gap and how many positions lie before it.
    gap: usize,
    before: u64,
}

impl<'a> GapCursor<'a> {
    fn new(gaps: &'a [(u64, u64)]) -> Self {
        Self { gaps, gap: 0, before: 0 }
    }

    fn nth(&mut self, k: u64) -> u64 {
        if k < self.before {
            self.gap = 0;
            self.before = 0;
        }
        while let Some(&(s, e)) = self.gaps.get(self.gap) {
            if k < self.before + (e - s) {
                return s + (k - self.before);
            }
            self.before += e - s;
            self.gap += 1;
        }
        // k is below the remaining count by construction.
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partitions_are_capped_by_the_dataset_size() {
        // 2**40 partitions of 1000 samples used to allocate 8 TB for the permutation of partitions.
        let e = CanonicalOrder::new(1000, 1 << 40, 0, true).unwrap_err().to_string();
        assert!(e.contains("num_partitions must be between 1 and 65536, got 1099511627776"), "{e}");
        assert!(CanonicalOrder::new(1000, 1_000_000_000, 0, true).is_err());
        assert!(CanonicalOrder::new(10, 0, 0, true).is_err());
        // Up to the floor for small datasets (SPDL's default of 64 partitions over 10 samples), up to one per
        // sample for large ones.
        let o = CanonicalOrder::new(10, 64, 0, true).unwrap();
        let mut v = o.try_order(0).unwrap();
        v.sort_unstable();
        assert_eq!(v, (0..10).collect::<Vec<_>>());
        assert!(CanonicalOrder::new(100_000, 100_000, 0, true).is_ok());
        assert!(CanonicalOrder::new(100_000, 100_001, 0, true).is_err());
    }

    #[test]
    fn spans_merge_and_count() {
        let s = Spans::from_positions([5, 1, 2, 3, 9, 2]);
        assert_eq!(s.pairs(), &[(1, 4), (5, 6), (9, 10)]);
        assert_eq!(s.count(), 5);
        assert!(s.contains(3) && !s.contains(4) && s.contains(9) && !s.contains(10));
        assert_eq!(s.union(&Spans::from_range(4, 5)).pairs(), &[(1, 6), (9, 10)]);
        assert!(Spans::from_pairs([(3, 2)]).is_err());
    }

    #[test]
    fn canonical_order_is_a_permutation_independent_of_the_world() {
        let o = CanonicalOrder::new(103, 8, 5, true).unwrap();
        let mut a = o.try_order(2).unwrap();
        assert_ne!(a, o.try_order(3).unwrap());
        a.sort_unstable();
        assert_eq!(a, (0..103).collect::<Vec<_>>());
        assert!(CanonicalOrder::new(3, 0, 0, true).is_err());
    }
}
