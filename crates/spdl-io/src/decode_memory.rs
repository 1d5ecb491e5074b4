//! The process-wide decode memory budget: the bytes that large decodes running at once may hold together
//! (not the pipeline's failure budget, `spdl_exec::FailureBudget`, nor the auto-tuner's memory budget,
//! `spdl_exec::autotune::AutotuneConfig::max_memory_bytes`).
//!
//! Per-decode limits bound one decode, not the sum of those running at once: with 16 decoding threads, a
//! batch of images that each decode to 1 GB would need 16 GB. Large decodes therefore reserve their
//! working memory from one budget shared by the whole process before they allocate, and release it when
//! they finish. Over budget they wait for others to finish; a single decode larger than the whole budget
//! fails at once with [`Error::LimitExceeded`] (`decode memory bytes`). Decodes below
//! [`UNMETERED_BYTES`] are not counted (they are bounded by the thread count, and counting them would put a
//! lock on every image).
//!
//! The default budget is a quarter of the memory this process may use (the smaller of the machine's RAM
//! and the cgroup's limit); [`set_decode_memory_budget`] changes it.
//!
//! A child forked while decodes run gets a budget of its own on first use (same capacity, nothing
//! reserved): the parent's reservations belong to threads that do not exist in the child, and its lock may
//! have been held by one of them at the fork.
// Image decodes reserve from the budget; audio only checks batch sizes against it.
#![cfg_attr(not(feature = "image"), allow(dead_code))]

use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, PoisonError};

use crate::{Error, Result};

/// Working sets smaller than this (16 MiB) are not metered.
pub const UNMETERED_BYTES: u64 = 16 << 20;

/// Used when the machine's memory cannot be read: 4 GiB.
const FALLBACK_CAPACITY: u64 = 4 << 30;

/// The decode memory budget of one process: its capacity, what is reserved now, and the waiters for
/// reservations to be given back.
#[derive(Debug)]
struct DecodeMemoryPool {
    /// The process this budget belongs to.
    pid: u32,
    state: Mutex<State>,
    freed: Condvar,
}

#[derive(Debug, Clone, Copy)]
struct State {
    capacity: u64,
    used: u64,
}

/// Where a budget lives: this process's budget (see the module doc), made on first use and again in a
/// forked child, and the capacity [`set_decode_memory_budget`] set (0: the default), carried into forked
/// children. A run-time-loaded FFmpeg backend (crate::media) holds a copy of this crate: it uses the
/// loader's `SharedDecodeMemory` instead of its own, so that the process has one budget.
#[derive(Debug)]
pub(crate) struct SharedDecodeMemory {
    current: AtomicPtr<DecodeMemoryPool>,
    capacity: AtomicU64,
}

static OWN: SharedDecodeMemory =
    SharedDecodeMemory { current: AtomicPtr::new(std::ptr::null_mut()), capacity: AtomicU64::new(0) };
/// The loader's `SharedDecodeMemory`, in a backend (null: this copy's own).
static HOST: AtomicPtr<SharedDecodeMemory> = AtomicPtr::new(std::ptr::null_mut());

/// The `SharedDecodeMemory` this copy of the crate uses.
pub(crate) fn shared() -> &'static SharedDecodeMemory {
    // SAFETY: a non-null HOST points at the loader's `OWN`, a static of a library that is never unloaded.
    unsafe { HOST.load(Ordering::Acquire).as_ref() }.unwrap_or(&OWN)
}

/// Makes this copy of the crate use `host` (a backend, told by its loader).
#[cfg_attr(not(feature = "ffmpeg-linked"), allow(dead_code))]
pub(crate) fn use_host(host: &'static SharedDecodeMemory) {
    if !std::ptr::eq(host, &OWN) {
        HOST.store(std::ptr::from_ref(host).cast_mut(), Ordering::Release);
    }
}

/// This process's pool (made on first use, and again in a forked child).
fn pool() -> &'static DecodeMemoryPool {
    let pid = std::process::id();
    let shared = shared();
    loop {
        let current = shared.current.load(Ordering::Acquire);
        // SAFETY: a non-null `current` always points to a leaked, never freed `DecodeMemoryPool`.
        if let Some(b) = unsafe { current.as_ref() }
            && b.pid == pid
        {
            return b;
        }
        let capacity = match shared.capacity.load(Ordering::Acquire) {
            0 => default_decode_memory_budget(),
            c => c,
        };
        // One small allocation per process (and per fork), never freed: reservations refer to it.
        let fresh: &'static mut DecodeMemoryPool = Box::leak(Box::new(DecodeMemoryPool {
            pid,
            state: Mutex::new(State { capacity, used: 0 }),
            freed: Condvar::new(),
        }));
        if shared.current.compare_exchange(current, fresh, Ordering::AcqRel, Ordering::Acquire).is_ok() {
            return fresh;
        }
        // Another thread installed one first: use that (the loop re-reads it).
    }
}

/// A quarter of the memory available to this process: the smaller of `MemTotal` and the cgroup v2
/// `memory.max`, or 4 GiB when neither can be read.
pub fn default_decode_memory_budget() -> u64 {
    let mem_total = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| spdl_report::proc_field(&s, "MemTotal").and_then(Result::ok));
    let cgroup = std::fs::read_to_string("/sys/fs/cgroup/memory.max").ok().and_then(|s| s.trim().parse::<u64>().ok());
    match (mem_total, cgroup) {
        (Some(a), Some(b)) => a.min(b) / 4,
        (Some(a), None) | (None, Some(a)) => a / 4,
        (None, None) => FALLBACK_CAPACITY,
    }
}

/// The current decode memory budget in bytes.
pub fn decode_memory_budget() -> u64 {
    pool().state.lock().unwrap_or_else(PoisonError::into_inner).capacity
}

/// Sets the process-wide decode memory budget (bytes, at least [`UNMETERED_BYTES`]). Decodes already
/// running keep their reservations; waiting ones are re-checked against the new budget.
///
/// ```
/// use spdl_io::{decode_memory_budget, set_decode_memory_budget};
/// let before = decode_memory_budget();
/// set_decode_memory_budget(2 << 30)?;
/// assert_eq!(decode_memory_budget(), 2 << 30);
/// assert!(set_decode_memory_budget(0).is_err());
/// set_decode_memory_budget(before)?;
/// # Ok::<(), spdl_io::Error>(())
/// ```
pub fn set_decode_memory_budget(bytes: u64) -> Result<()> {
    if bytes < UNMETERED_BYTES {
        return Err(Error::InvalidOptions(format!(
            "the decode memory budget must be at least {UNMETERED_BYTES} bytes, got {bytes}"
        )));
    }
    shared().capacity.store(bytes, Ordering::Release);
    let b = pool();
    b.state.lock().unwrap_or_else(PoisonError::into_inner).capacity = bytes;
    b.freed.notify_all();
    Ok(())
}

/// Bytes reserved from the decode memory budget, given back on drop.
#[derive(Debug)]
#[must_use = "the reservation is released when dropped"]
pub(crate) struct Reservation {
    bytes: u64,
    /// The budget it was taken from (`None`: not metered).
    from: Option<&'static DecodeMemoryPool>,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        let Some(b) = self.from else { return };
        if b.pid != std::process::id() {
            return; // taken in the parent before a fork: this process's budget never counted it
        }
        let mut s = b.state.lock().unwrap_or_else(PoisonError::into_inner);
        s.used = s.used.saturating_sub(self.bytes);
        drop(s);
        b.freed.notify_all();
    }
}

/// Reserves `bytes` for `item`'s decode, waiting while the budget is in use by others. Small working sets
/// are not metered; one larger than the whole budget is an error.
pub(crate) fn reserve(item: &str, bytes: u64) -> Result<Reservation> {
    if bytes < UNMETERED_BYTES {
        return Ok(Reservation { bytes: 0, from: None });
    }
    let b = pool();
    let mut s = b.state.lock().unwrap_or_else(PoisonError::into_inner);
    loop {
        if bytes > s.capacity {
            return Err(Error::LimitExceeded {
                item: item.to_owned(),
                what: "decode memory bytes".into(),
                value: bytes,
                limit: s.capacity,
            });
        }
        if s.used.saturating_add(bytes) <= s.capacity {
            s.used += bytes;
            return Ok(Reservation { bytes, from: Some(b) });
        }
        s = b.freed.wait(s).unwrap_or_else(PoisonError::into_inner);
    }
}

/// Fails if one allocation of `bytes` (a whole batch buffer) could never fit in the budget.
pub(crate) fn check_fits(item: &str, what: &str, bytes: u64) -> Result<()> {
    let capacity = decode_memory_budget();
    if bytes > capacity {
        return Err(Error::LimitExceeded {
            item: item.to_owned(),
            what: what.to_owned(),
            value: bytes,
            limit: capacity,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_is_a_fraction_of_ram() {
        let d = default_decode_memory_budget();
        assert!(d >= 64 << 20, "{d}");
    }

    #[test]
    fn a_forked_child_gets_a_budget_of_its_own() {
        // The parent holds most of the budget when it forks: the child must not wait for it.
        let capacity = decode_memory_budget();
        let held = reserve("parent.png", capacity - UNMETERED_BYTES).expect("reserve in the parent");
        // SAFETY: the child only reserves and releases memory from the budget, then ends with `_exit`.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork failed");
        if pid == 0 {
            let ok = reserve("child.png", capacity - UNMETERED_BYTES).is_ok() && decode_memory_budget() == capacity;
            // SAFETY: ends the child without the parent's test harness.
            unsafe { libc::_exit(if ok { 0 } else { 1 }) };
        }
        let mut status = 0;
        // SAFETY: waits for the child just forked.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "child status {status}");
        drop(held);
    }

    #[test]
    fn small_reservations_are_free_and_huge_ones_fail() {
        let r = reserve("x", 1024);
        assert!(r.is_ok());
        let err = reserve("big.png", u64::MAX).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains("big.png") && err.contains("decode memory bytes"), "{err}");
    }
}
