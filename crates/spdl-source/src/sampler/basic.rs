//! The base samplers: sequential, shuffled, weighted with replacement.
//!
//! Randomness comes from ChaCha8 (rand_chacha, whose output is value-stable across versions and platforms), keyed
//! by the seed, on the stream numbered by the epoch. Bounded integers and floats are derived from its `u64` output
//! with fixed arithmetic below, never through `usize` or a library's changeable algorithm, so an order is the same
//! on every machine.

use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::{RngCore, SeedableRng};

use super::{Sampler, check_order_len, check_positions};
use crate::error::{Result, SourceError};

/// Stream domain of the shuffle, so that a shuffle and a weighted draw with the same seed are independent.
const SHUFFLE_DOMAIN: u64 = 0x5348_5546; // "SHUF"
const WEIGHTED_DOMAIN: u64 = 0x5745_4947; // "WEIG"

/// The generator for (seed, epoch) in one domain: the key holds the seed and the domain, the stream the epoch.
pub(super) fn rng_for(seed: u64, domain: u64, epoch: u64) -> ChaCha8Rng {
    let mut key = [0u8; 32];
    key[..8].copy_from_slice(&seed.to_le_bytes());
    key[8..16].copy_from_slice(&domain.to_le_bytes());
    let mut rng = ChaCha8Rng::from_seed(key);
    rng.set_stream(epoch);
    rng
}

/// A uniform integer in `0..n` (n > 0), by Lemire's multiply-and-reject method: unbiased, no floating point.
pub(super) fn below(rng: &mut ChaCha8Rng, n: u64) -> u64 {
    let mut product = u128::from(rng.next_u64()) * u128::from(n);
    let mut low = product as u64;
    if low < n {
        let threshold = n.wrapping_neg() % n;
        while low < threshold {
            product = u128::from(rng.next_u64()) * u128::from(n);
            low = product as u64;
        }
    }
    (product >> 64) as u64
}

/// A uniform float in `[0, 1)` with 53 random bits.
fn unit_f64(rng: &mut ChaCha8Rng) -> f64 {
    (rng.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

/// Indices `0..len` in order, every epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SequentialSampler {
    len: usize,
}

impl SequentialSampler {
    /// A sampler over `len` items.
    pub fn new(len: usize) -> Self {
        SequentialSampler { len }
    }
}

impl Sampler for SequentialSampler {
    fn len(&self) -> usize {
        self.len
    }
    fn try_order(&self, _epoch: u64) -> Result<Vec<usize>> {
        check_order_len("order length", self.len as u128)?;
        Ok((0..self.len).collect())
    }
    fn try_order_at(&self, _epoch: u64, positions: &[usize]) -> Result<Vec<usize>> {
        check_positions(positions, self.len)?;
        Ok(positions.to_vec())
    }
}

/// A permutation of `0..len` drawn from (seed, epoch): a new order each epoch, the same order for the same seed
/// and epoch on every machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShuffledSampler {
    len: usize,
    seed: u64,
}

impl ShuffledSampler {
    /// A shuffled sampler over `len` items. An order needs the whole permutation (4 bytes per item), so `len` above
    /// [`MAX_ORDER_LEN`](super::MAX_ORDER_LEN) fails when an order is asked for.
    pub fn new(len: usize, seed: u64) -> Self {
        ShuffledSampler { len, seed }
    }

    /// The epoch's permutation, as `u32` (`len` is at most [`MAX_ORDER_LEN`](super::MAX_ORDER_LEN) = 2^31).
    fn permutation(&self, epoch: u64) -> Result<Vec<u32>> {
        check_order_len("permutation length", self.len as u128)?;
        let mut order: Vec<u32> = (0..self.len).map(|i| i as u32).collect();
        let mut rng = rng_for(self.seed, SHUFFLE_DOMAIN, epoch);
        // Fisher-Yates, from the end.
        for i in (1..order.len()).rev() {
            // j <= i < len, so it fits in usize.
            let j = below(&mut rng, i as u64 + 1) as usize;
            order.swap(i, j);
        }
        Ok(order)
    }
}

impl Sampler for ShuffledSampler {
    fn len(&self) -> usize {
        self.len
    }

    fn try_order(&self, epoch: u64) -> Result<Vec<usize>> {
        Ok(self.permutation(epoch)?.into_iter().map(|i| i as usize).collect())
    }

    fn try_order_at(&self, epoch: u64, positions: &[usize]) -> Result<Vec<usize>> {
        check_positions(positions, self.len)?;
        if positions.is_empty() {
            return Ok(Vec::new());
        }
        let perm = self.permutation(epoch)?;
        // Every position is below len, the permutation's length.
        Ok(positions.iter().filter_map(|&p| perm.get(p).map(|&i| i as usize)).collect())
    }

    fn seed(&self) -> u64 {
        self.seed
    }
}

/// `num_samples` indices drawn with replacement, index `i` with probability `weights[i] / sum(weights)`.
///
/// Useful to rebalance classes: give each item the inverse frequency of its class.
#[derive(Debug, Clone, PartialEq)]
pub struct WeightedSampler {
    /// Running sums of the weights; the last one is the total.
    cumulative: Vec<f64>,
    num_samples: usize,
    seed: u64,
}

impl WeightedSampler {
    /// Fails when a weight is negative or not finite, or when all are zero while samples are asked for.
    pub fn new(weights: Vec<f64>, num_samples: usize, seed: u64) -> Result<Self> {
        let mut cumulative = Vec::with_capacity(weights.len());
        let mut total = 0.0f64;
        for (i, w) in weights.iter().enumerate() {
            if !w.is_finite() || *w < 0.0 {
                return Err(SourceError::SamplerConfig {
                    reason: format!("weight {i} is {w}; weights must be finite and non-negative"),
                });
            }
            total += w;
            cumulative.push(total);
        }
        if num_samples > 0 && !(total > 0.0 && total.is_finite()) {
            return Err(SourceError::SamplerConfig {
                reason: format!("the {} weights sum to {total}; at least one must be positive", weights.len()),
            });
        }
        Ok(WeightedSampler { cumulative, num_samples, seed })
    }

    /// The epoch's draws, one per call, or `None` without weights.
    fn draws(&self, epoch: u64) -> Option<impl FnMut() -> usize + '_> {
        let &total = self.cumulative.last()?;
        let last = self.cumulative.len() - 1;
        let mut rng = rng_for(self.seed, WEIGHTED_DOMAIN, epoch);
        Some(move || {
            let target = unit_f64(&mut rng) * total;
            // The first running sum above the target; zero-weight items have no room and are never chosen.
            self.cumulative.partition_point(|&c| c <= target).min(last)
        })
    }
}

impl Sampler for WeightedSampler {
    fn len(&self) -> usize {
        self.num_samples
    }

    fn try_order(&self, epoch: u64) -> Result<Vec<usize>> {
        check_order_len("draws", self.num_samples as u128)?;
        let Some(mut draw) = self.draws(epoch) else { return Ok(Vec::new()) };
        Ok((0..self.num_samples).map(|_| draw()).collect())
    }

    fn try_order_at(&self, epoch: u64, positions: &[usize]) -> Result<Vec<usize>> {
        check_positions(positions, self.num_samples)?;
        let Some(&max) = positions.iter().max() else { return Ok(Vec::new()) };
        // Draws are made in sequence up to the last position asked for, keeping only those asked for.
        check_order_len("draws", max as u128 + 1)?;
        let Some(mut draw) = self.draws(epoch) else { return Ok(Vec::new()) };
        let mut slots: Vec<usize> = (0..positions.len()).collect();
        slots.sort_unstable_by_key(|&slot| positions.get(slot).copied().unwrap_or(0));
        let mut out = vec![0usize; positions.len()];
        let mut next = slots.iter().peekable();
        for pos in 0..=max {
            let value = draw();
            while let Some(&&slot) = next.peek() {
                if positions.get(slot) != Some(&pos) {
                    break;
                }
                if let Some(o) = out.get_mut(slot) {
                    *o = value;
                }
                next.next();
            }
        }
        Ok(out)
    }

    fn seed(&self) -> u64 {
        self.seed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shuffle_is_a_permutation_that_depends_on_seed_and_epoch() {
        let s = ShuffledSampler::new(1000, 7);
        let mut o = s.order(0);
        assert_eq!(o, s.order(0));
        assert_ne!(o, s.order(1));
        assert_ne!(o, ShuffledSampler::new(1000, 8).order(0));
        o.sort_unstable();
        assert_eq!(o, (0..1000).collect::<Vec<_>>());
        assert!(ShuffledSampler::new(0, 1).order(0).is_empty());
        assert_eq!(ShuffledSampler::new(1, 1).order(3), vec![0]);
    }

    /// Pins the algorithm: if this changes, every saved checkpoint and every multi-machine run breaks.
    #[test]
    fn shuffle_is_pinned() {
        assert_eq!(ShuffledSampler::new(10, 42).order(0), vec![9, 1, 8, 5, 7, 2, 0, 6, 4, 3]);
        assert_eq!(ShuffledSampler::new(10, 42).order(1), vec![1, 5, 2, 4, 7, 3, 8, 0, 6, 9]);
        let w = WeightedSampler::new(vec![1.0, 2.0, 3.0, 4.0], 10, 42).unwrap();
        assert_eq!(w.order(0), vec![2, 3, 3, 1, 2, 3, 3, 1, 3, 3]);
    }

    #[test]
    fn below_is_uniform_enough() {
        let mut rng = rng_for(1, 0, 0);
        let mut counts = [0u32; 6];
        for _ in 0..60_000 {
            counts[below(&mut rng, 6) as usize] += 1;
        }
        assert!(counts.iter().all(|&c| (9_000..11_000).contains(&c)), "{counts:?}");
    }

    #[test]
    fn weighted_follows_the_weights() {
        let w = WeightedSampler::new(vec![1.0, 0.0, 3.0], 40_000, 5).unwrap();
        let mut counts = [0usize; 3];
        for i in w.order(0) {
            counts[i] += 1;
        }
        assert_eq!(counts[1], 0);
        let ratio = counts[2] as f64 / counts[0] as f64;
        assert!((2.7..3.3).contains(&ratio), "{counts:?}");
        assert_ne!(w.order(0), w.order(1));
    }

    #[test]
    fn weighted_rejects_bad_weights() {
        for bad in [vec![1.0, -1.0], vec![f64::NAN], vec![f64::INFINITY], vec![0.0, 0.0], vec![]] {
            assert!(
                matches!(WeightedSampler::new(bad.clone(), 3, 0), Err(SourceError::SamplerConfig { .. })),
                "{bad:?}"
            );
        }
        assert!(WeightedSampler::new(vec![], 0, 0).unwrap().order(0).is_empty());
    }
}
