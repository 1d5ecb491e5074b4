//! Sharding a sampler over the ranks of a distributed job.

use super::{Sampler, check_order_len, check_positions};
use crate::error::{Result, SourceError};

/// What to do when the epoch length is not a multiple of the world size. Either way every rank gets the same
/// count, so collective operations (all-reduce after each step) stay in step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Remainder {
    /// Repeat indices from the start of the epoch's order until it divides evenly (as PyTorch's
    /// `DistributedSampler` does by default): every item is seen, a few twice.
    #[default]
    Pad,
    /// Drop the last `len % world_size` indices of the epoch's order: no item twice, a few not at all this epoch.
    Drop,
}

/// One process's place in a distributed job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Shard {
    /// This process's rank, `0..world_size`.
    pub rank: usize,
    /// Number of processes.
    pub world_size: usize,
}

impl Shard {
    /// A shard; fails unless `rank < world_size`.
    pub fn new(rank: usize, world_size: usize) -> Result<Self> {
        if world_size == 0 || rank >= world_size {
            return Err(SourceError::SamplerConfig {
                reason: format!("rank {rank} is not in 0..{world_size} (world size)"),
            });
        }
        Ok(Shard { rank, world_size })
    }

    /// Reads `RANK` and `WORLD_SIZE` as set by `torchrun` and most launchers. When neither is set the process is
    /// alone (rank 0 of 1); when only one is set, or a value is not a number, or `RANK >= WORLD_SIZE`, it fails.
    pub fn from_env() -> Result<Self> {
        Self::from_vars(std::env::var("RANK").ok(), std::env::var("WORLD_SIZE").ok())
    }

    fn from_vars(rank: Option<String>, world: Option<String>) -> Result<Self> {
        fn parse(var: &'static str, value: String) -> Result<usize> {
            value.trim().parse().map_err(|e: std::num::ParseIntError| SourceError::Env {
                var,
                value,
                reason: format!("not a non-negative integer ({e})"),
            })
        }
        match (rank, world) {
            (None, None) => Ok(Shard { rank: 0, world_size: 1 }),
            (Some(rank), Some(world)) => {
                let (r, w) = (parse("RANK", rank.clone())?, parse("WORLD_SIZE", world)?);
                Shard::new(r, w).map_err(|e| SourceError::Env { var: "RANK", value: rank, reason: e.to_string() })
            }
            (Some(value), None) => {
                Err(SourceError::Env { var: "RANK", value, reason: "RANK is set but WORLD_SIZE is not".into() })
            }
            (None, Some(value)) => {
                Err(SourceError::Env { var: "WORLD_SIZE", value, reason: "WORLD_SIZE is set but RANK is not".into() })
            }
        }
    }
}

/// One rank's share of any sampler: every rank computes the same global order from the same seed and epoch,
/// evens it out by [`Remainder`], then takes every `world_size`-th index starting at its rank. The shares are
/// disjoint (except for padding) and cover the epoch.
#[derive(Debug, Clone, PartialEq)]
pub struct ShardedSampler<S> {
    inner: S,
    shard: Shard,
    remainder: Remainder,
}

impl<S: Sampler> ShardedSampler<S> {
    /// Rank `rank` of `world_size`; fails unless `rank < world_size`.
    pub fn new(inner: S, rank: usize, world_size: usize, remainder: Remainder) -> Result<Self> {
        Ok(Self::with_shard(inner, Shard::new(rank, world_size)?, remainder))
    }

    /// The rank and world size from `RANK` / `WORLD_SIZE` (see [`Shard::from_env`]).
    pub fn from_env(inner: S, remainder: Remainder) -> Result<Self> {
        Ok(Self::with_shard(inner, Shard::from_env()?, remainder))
    }

    /// A sampler for an already known shard.
    pub fn with_shard(inner: S, shard: Shard, remainder: Remainder) -> Self {
        ShardedSampler { inner, shard, remainder }
    }

    /// This sampler's shard.
    pub fn shard(&self) -> Shard {
        self.shard
    }

    /// The wrapped sampler.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// The positions of the inner order this share takes at its own `positions`: `rank + p * world_size`, cycled
    /// over the inner order for padding. Computed in 128 bits, so huge sizes cannot overflow.
    fn inner_positions(&self, positions: impl Iterator<Item = usize>) -> Vec<usize> {
        let n = self.inner.len() as u128;
        let (rank, w) = (self.shard.rank as u128, self.shard.world_size as u128);
        // n > 0 whenever a position exists (len() is 0 otherwise); the result is below n, a usize.
        positions.map(|p| ((rank + p as u128 * w) % n.max(1)) as usize).collect()
    }
}

impl<S: Sampler> Sampler for ShardedSampler<S> {
    fn len(&self) -> usize {
        let (n, w) = (self.inner.len(), self.shard.world_size);
        match self.remainder {
            // Padding cannot conjure items from an empty order.
            Remainder::Pad if n == 0 => 0,
            Remainder::Pad => n.div_ceil(w),
            Remainder::Drop => n / w,
        }
    }

    /// Only this rank's share is computed: its positions in the inner order are asked of the inner sampler.
    fn try_order(&self, epoch: u64) -> Result<Vec<usize>> {
        let len = self.len();
        check_order_len("order length", len as u128)?;
        let positions = self.inner_positions(0..len);
        self.inner.try_order_at(epoch, &positions)
    }

    fn try_order_at(&self, epoch: u64, positions: &[usize]) -> Result<Vec<usize>> {
        check_positions(positions, self.len())?;
        let positions = self.inner_positions(positions.iter().copied());
        self.inner.try_order_at(epoch, &positions)
    }

    fn seed(&self) -> u64 {
        self.inner.seed()
    }
}

#[cfg(test)]
mod tests {
    use super::super::{SequentialSampler, ShuffledSampler};
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn shards_are_disjoint_and_cover_with_drop() {
        for n in [0, 1, 7, 10, 100] {
            for w in 1..6 {
                let inner = ShuffledSampler::new(n, 9);
                let mut seen = Vec::new();
                for r in 0..w {
                    let s = ShardedSampler::new(inner, r, w, Remainder::Drop).unwrap();
                    assert_eq!(s.len(), n / w);
                    let o = s.order(2);
                    assert_eq!(o.len(), n / w);
                    seen.extend(o);
                }
                let mut expected = inner.order(2);
                expected.truncate(n / w * w);
                seen.sort_unstable();
                expected.sort_unstable();
                assert_eq!(seen, expected, "n={n} w={w}");
            }
        }
    }

    #[test]
    fn padding_covers_everything_with_equal_counts() {
        for n in [1usize, 7, 10, 13] {
            for w in 1..6 {
                let mut counts: BTreeMap<usize, usize> = BTreeMap::new();
                let per = n.div_ceil(w);
                for r in 0..w {
                    let s = ShardedSampler::new(SequentialSampler::new(n), r, w, Remainder::Pad).unwrap();
                    assert_eq!(s.len(), per);
                    let o = s.order(0);
                    assert_eq!(o.len(), per);
                    for i in o {
                        *counts.entry(i).or_default() += 1;
                    }
                }
                assert_eq!(counts.len(), n, "every item seen, n={n} w={w}");
                assert_eq!(counts.values().sum::<usize>(), per * w);
                // Padding cycles through the order, so counts differ by at most one.
                let (lo, hi) = (counts.values().min().unwrap(), counts.values().max().unwrap());
                assert!(hi - lo <= 1, "n={n} w={w} {counts:?}");
            }
        }
        // The ranks take interleaved positions, as PyTorch's DistributedSampler does.
        let s = ShardedSampler::new(SequentialSampler::new(5), 1, 2, Remainder::Pad).unwrap();
        assert_eq!(s.order(0), vec![1, 3, 0]);
        // World larger than the dataset: padding repeats the order.
        let s = ShardedSampler::new(SequentialSampler::new(2), 4, 5, Remainder::Pad).unwrap();
        assert_eq!(s.order(0), vec![0]);
    }

    #[test]
    fn shard_from_vars() {
        let v = |s: &str| Some(s.to_string());
        assert_eq!(Shard::from_vars(None, None).unwrap(), Shard { rank: 0, world_size: 1 });
        assert_eq!(Shard::from_vars(v("3"), v(" 8 ")).unwrap(), Shard { rank: 3, world_size: 8 });
        for (r, w) in
            [(v("8"), v("8")), (v("x"), v("8")), (v("1"), v("-2")), (v("0"), None), (None, v("2")), (v("0"), v("0"))]
        {
            assert!(matches!(Shard::from_vars(r.clone(), w.clone()), Err(SourceError::Env { .. })), "{r:?} {w:?}");
        }
        assert!(Shard::new(2, 2).is_err());
    }
}
