//! Where each binary of a unit goes: the ring's wrap-around, the pool's aligned cursor, and the pool's
//! reclaim watermark. Pure arithmetic, so that it is tested without shared memory or Python.

use std::collections::BTreeSet;

use super::ArenaError;

/// Alignment of each binary inside a pool segment (and of the segments themselves).
pub(crate) const ALIGNMENT: usize = 64;

/// Rounds `n` up to a multiple of [`ALIGNMENT`]; `None` on overflow.
pub(crate) fn align_up(n: usize) -> Option<usize> {
    n.checked_add(ALIGNMENT - 1).map(|v| v & !(ALIGNMENT - 1))
}

/// The ring's free bytes for a writer at byte count `pos` whose reader has released `tail` bytes.
pub(crate) fn ring_free(capacity: u64, pos: u64, tail: u64) -> u64 {
    capacity.saturating_sub(pos.saturating_sub(tail))
}

/// Checks that a binary of `n` bytes fits in a ring of `capacity` bytes, and in the unit begun at `start`
/// with `pos` bytes written so far.
pub(crate) fn ring_check(capacity: u64, start: u64, pos: u64, n: u64) -> Result<(), ArenaError> {
    if n > capacity {
        return Err(ArenaError::BinaryExceedsRing { n, capacity });
    }
    let written = pos.saturating_sub(start);
    if written.saturating_add(n) > capacity {
        return Err(ArenaError::UnitExceedsRing { written, n, capacity });
    }
    Ok(())
}

/// The ring offset of byte count `pos` and how many of `n` bytes fit before the end of the ring (the rest
/// wraps to offset 0). Callers check `n <= capacity` first; a capacity of 0 places everything at 0.
pub(crate) fn ring_place(capacity: u64, pos: u64, n: u64) -> (u64, u64) {
    let at = pos.checked_rem(capacity).unwrap_or(0);
    (at, n.min(capacity - at))
}

/// Checks a `(offset, nbytes)` marker read back from the ring: `offset` inside the ring and `nbytes` at most
/// the capacity (it may wrap).
pub(crate) fn ring_check_marker(capacity: u64, offset: u64, nbytes: u64) -> Result<(), ArenaError> {
    if offset >= capacity || nbytes > capacity {
        return Err(ArenaError::BadMarker { offset, nbytes, size: capacity });
    }
    Ok(())
}

/// The offset in a pool segment of `segment_size` bytes of a binary of `n` bytes written after `cursor`
/// bytes (aligned to [`ALIGNMENT`]).
pub(crate) fn pool_place(segment_size: usize, cursor: usize, n: usize) -> Result<usize, ArenaError> {
    let too_big = || ArenaError::UnitExceedsSegment { segment_size };
    let at = align_up(cursor).ok_or_else(too_big)?;
    match at.checked_add(n) {
        Some(end) if end <= segment_size => Ok(at),
        _ => Err(too_big()),
    }
}

/// Checks a `(offset, nbytes)` marker read back from a pool segment.
pub(crate) fn pool_check_marker(segment_size: usize, offset: u64, nbytes: u64) -> Result<(), ArenaError> {
    match offset.checked_add(nbytes) {
        Some(end) if end <= segment_size as u64 => Ok(()),
        _ => Err(ArenaError::BadMarker { offset, nbytes, size: segment_size as u64 }),
    }
}

/// Whether a pool of `count` segments has one free while `published` units are out and `reclaimed` back.
pub(crate) fn pool_has_free(count: u64, published: u64, reclaimed: u64) -> bool {
    published.saturating_sub(reclaimed) < count
}

/// The pool reader's record of released units: units are released in any order (as their views are
/// collected), but a segment is reused in order, so the shared `reclaimed` count is the first unit not yet
/// released.
#[derive(Debug, Default)]
pub(crate) struct Watermark {
    next: u64,
    done: BTreeSet<u64>,
}

impl Watermark {
    /// Records `unit` as released; the new watermark if it moved.
    pub(crate) fn release(&mut self, unit: u64) -> Option<u64> {
        if unit < self.next {
            return None;
        }
        self.done.insert(unit);
        let before = self.next;
        while self.done.remove(&self.next) {
            self.next += 1;
        }
        (self.next != before).then_some(self.next)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ring_wraps_around() {
        assert_eq!(ring_place(100, 90, 30), (90, 10));
        assert_eq!(ring_place(100, 250, 30), (50, 30));
        assert_eq!(ring_place(100, 100, 100), (0, 100));
        assert_eq!(ring_free(100, 250, 180), 30);
        assert_eq!(ring_free(100, 250, 150), 0);
    }

    #[test]
    fn a_unit_larger_than_the_ring_is_refused() {
        assert!(matches!(ring_check(100, 0, 0, 101), Err(ArenaError::BinaryExceedsRing { n: 101, capacity: 100 })));
        assert!(matches!(
            ring_check(100, 10, 70, 50),
            Err(ArenaError::UnitExceedsRing { written: 60, n: 50, capacity: 100 })
        ));
        assert!(ring_check(100, 10, 70, 40).is_ok());
        assert!(ring_check_marker(100, 100, 1).is_err());
        assert!(ring_check_marker(100, 99, 100).is_ok());
    }

    #[test]
    fn pool_binaries_are_aligned_and_bounded() {
        assert_eq!(pool_place(4096, 0, 10).unwrap(), 0);
        assert_eq!(pool_place(4096, 10, 10).unwrap(), 64);
        assert_eq!(pool_place(4096, 64, 4032).unwrap(), 64);
        assert!(matches!(pool_place(4096, 65, 4000), Err(ArenaError::UnitExceedsSegment { segment_size: 4096 })));
        assert!(pool_place(4096, usize::MAX - 3, 1).is_err());
        assert!(pool_check_marker(4096, 4000, 96).is_ok());
        assert!(pool_check_marker(4096, 4000, 97).is_err());
        assert!(pool_check_marker(4096, u64::MAX, 2).is_err());
        assert!(pool_has_free(2, 5, 4));
        assert!(!pool_has_free(2, 6, 4));
    }

    #[test]
    fn the_watermark_moves_over_units_released_in_order() {
        let mut w = Watermark::default();
        assert_eq!(w.release(1), None);
        assert_eq!(w.release(2), None);
        assert_eq!(w.release(0), Some(3));
        assert_eq!(w.release(0), None);
        assert_eq!(w.release(3), Some(4));
    }
}
