//! A named POSIX shared-memory segment that starts with a [`Control`] block, and the waiting on it.
//!
//! A process creates the segment ([`Segment::create`]); another process (a spawned or forked worker) maps the
//! same memory by name ([`Segment::attach`]). Only the creator removes the name: [`unlink_owned`] and the exit
//! hook check the process id recorded at creation, so a forked child that inherits the creator's objects never
//! unlinks. Waiting across processes is a futex on a word of the control block: no lock or condition object
//! has to travel to the worker, so any start method works.

use std::collections::hash_map::RandomState;
use std::ffi::CString;
use std::hash::{BuildHasher, Hasher};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Mutex, Once, PoisonError};
use std::time::{Duration, Instant};

use super::ArenaError;

/// Bytes reserved for the control block at the start of each segment (the data after it starts aligned).
pub(crate) const CTRL_SIZE: usize = 64;

/// The process-shared counters of an arena, at the start of its segment.
///
/// `head`/`tail` are the ring's written and released byte counts, or the pool's published and reclaimed unit
/// counts. `seq` changes on every [`Control::notify`]: a waiter reads it before checking its condition and
/// sleeps only while it is unchanged, so a release between the check and the sleep is never missed.
#[derive(Debug, Default)]
#[repr(C)]
pub(crate) struct Control {
    /// Written (ring: bytes; pool: units), by the writer.
    pub(crate) head: AtomicU64,
    /// Released (ring: bytes; pool: units), by the reader.
    pub(crate) tail: AtomicU64,
    /// Non-zero once the arena is shut down: a waiting writer gives up.
    shutdown: AtomicU32,
    /// The futex word.
    seq: AtomicU32,
}

const _: () = assert!(std::mem::size_of::<Control>() <= CTRL_SIZE);

/// How a wait for space ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Waited {
    /// The condition holds.
    Ready,
    /// The arena was shut down.
    Shutdown,
    /// The timeout passed first.
    TimedOut,
    /// The interrupt check said stop.
    Interrupted,
}

impl Control {
    /// Whether the arena is shut down.
    pub(crate) fn is_shutdown(&self) -> bool {
        self.shutdown.load(Ordering::Acquire) != 0
    }

    /// Shuts the arena down and wakes every waiter.
    pub(crate) fn shut_down(&self) {
        self.shutdown.store(1, Ordering::Release);
        self.notify();
    }

    /// Wakes every process waiting in [`Control::wait_until`].
    pub(crate) fn notify(&self) {
        self.seq.fetch_add(1, Ordering::AcqRel);
        futex_wake(&self.seq);
    }

    /// Waits until `ready(self)`, the shutdown flag or `timeout` (`None`: no limit), sleeping at most `step`
    /// at a time; between sleeps `interrupted()` may end the wait. `park` runs each sleep (with the GIL
    /// released, from Python).
    pub(crate) fn wait_until<E>(
        &self,
        ready: impl Fn(&Self) -> bool,
        timeout: Option<Duration>,
        step: Duration,
        mut interrupted: impl FnMut() -> Result<bool, E>,
        mut park: impl FnMut(&(dyn Fn() + Sync)),
    ) -> Result<Waited, E> {
        let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
        loop {
            let seq = self.seq.load(Ordering::Acquire);
            if self.is_shutdown() {
                return Ok(Waited::Shutdown);
            }
            if ready(self) {
                return Ok(Waited::Ready);
            }
            if interrupted()? {
                return Ok(Waited::Interrupted);
            }
            let nap = match deadline {
                None => step,
                Some(d) => {
                    let left = d.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Ok(Waited::TimedOut);
                    }
                    left.min(step)
                }
            };
            park(&|| futex_wait(&self.seq, seq, nap));
        }
    }
}

/// Sleeps while `word == expected`, at most `timeout` (a spurious or early return only costs a re-check).
#[cfg(target_os = "linux")]
fn futex_wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    let ts = libc::timespec {
        tv_sec: libc::time_t::try_from(timeout.as_secs()).unwrap_or(libc::time_t::MAX),
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: `word` is a live, 4-byte aligned atomic (in a mapping that outlives this call) and `ts` a valid
    // timespec; FUTEX_WAIT (not the private variant, so waiters in other processes that map the same memory
    // share the queue) only reads them.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            &ts as *const libc::timespec,
            std::ptr::null::<u32>(),
            0u32,
        );
    }
}

/// Wakes every waiter on `word`.
#[cfg(target_os = "linux")]
fn futex_wake(word: &AtomicU32) {
    // SAFETY: `word` is a live, 4-byte aligned atomic; FUTEX_WAKE only uses its address as a key.
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, i32::MAX, std::ptr::null::<u8>(), 0usize, 0u32);
    }
}

/// Without futexes, a waiter polls.
#[cfg(not(target_os = "linux"))]
fn futex_wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    if word.load(Ordering::Acquire) == expected {
        std::thread::sleep(timeout.min(Duration::from_millis(1)));
    }
}

#[cfg(not(target_os = "linux"))]
fn futex_wake(_word: &AtomicU32) {}

/// One process's mapping of a shared-memory segment; dropping it unmaps it (the name stays until
/// [`unlink_owned`]).
#[derive(Debug)]
pub(crate) struct Segment {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain shared memory: the control block is read and written through atomics only,
// and the data area through raw-pointer copies whose ranges the arena protocol hands to one side at a time.
unsafe impl Send for Segment {}
// SAFETY: as for `Send`: no `&`/`&mut` to the data area is ever formed.
unsafe impl Sync for Segment {}

impl Segment {
    /// Creates a new segment of `CTRL_SIZE + data` bytes under a fresh name (returned without the leading
    /// `/`, as `multiprocessing.shared_memory` reports names), zero-filled, and records this process as its
    /// owner.
    pub(crate) fn create(data: usize) -> Result<(String, Self), ArenaError> {
        let len = data.checked_add(CTRL_SIZE).ok_or(ArenaError::TooLarge { bytes: data })?;
        let off_len = libc::off_t::try_from(len).map_err(|_| ArenaError::TooLarge { bytes: data })?;
        let hasher = RandomState::new();
        for attempt in 0u32..64 {
            let mut h = hasher.build_hasher();
            h.write_u32(attempt);
            h.write_u128(
                std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos()),
            );
            let name = format!("spdl_{:x}_{:012x}", std::process::id(), h.finish() & 0xffff_ffff_ffff);
            let c_name = c_name(&name)?;
            // SAFETY: `c_name` is a NUL-terminated string; the flags and mode are plain integers.
            let fd = unsafe {
                libc::shm_open(c_name.as_ptr(), libc::O_CREAT | libc::O_EXCL | libc::O_RDWR, 0o600 as libc::mode_t)
            };
            if fd < 0 {
                let err = std::io::Error::last_os_error();
                if err.raw_os_error() == Some(libc::EEXIST) {
                    continue;
                }
                return Err(ArenaError::Os { what: "create", name, source: err });
            }
            // Refused before sizing: a segment larger than the shared-memory filesystem's free space maps fine
            // but kills the process with SIGBUS when a write reaches a page the filesystem cannot back.
            let mapped = match free_bytes(fd) {
                Some(free) if (len as u64) > free => Err(ArenaError::NoSpace { needed: len, free }),
                _ => {
                    // SAFETY: `fd` is the descriptor shm_open just returned.
                    let sized = unsafe { libc::ftruncate(fd, off_len) } == 0;
                    let mapped = if sized { map(fd, len) } else { Err(std::io::Error::last_os_error()) };
                    mapped.map_err(|source| ArenaError::Os { what: "create", name: name.clone(), source })
                }
            };
            // SAFETY: `fd` is ours and no longer needed (the mapping keeps the memory).
            unsafe { libc::close(fd) };
            return match mapped {
                Ok(ptr) => {
                    register_owned(&name);
                    Ok((name, Self { ptr, len }))
                }
                Err(e) => {
                    // SAFETY: `c_name` names the segment this call created.
                    unsafe { libc::shm_unlink(c_name.as_ptr()) };
                    Err(e)
                }
            };
        }
        Err(ArenaError::Os {
            what: "create",
            name: "spdl_*".into(),
            source: std::io::Error::from_raw_os_error(libc::EEXIST),
        })
    }

    /// Maps the existing segment `name` (made by [`Segment::create`] with `data` bytes) without taking
    /// ownership.
    pub(crate) fn attach(name: &str, data: usize) -> Result<Self, ArenaError> {
        let len = data.checked_add(CTRL_SIZE).ok_or(ArenaError::TooLarge { bytes: data })?;
        let c_name = c_name(name)?;
        let os = |source| ArenaError::Os { what: "attach", name: name.to_owned(), source };
        // SAFETY: `c_name` is a NUL-terminated string.
        let fd = unsafe { libc::shm_open(c_name.as_ptr(), libc::O_RDWR, 0) };
        if fd < 0 {
            return Err(os(std::io::Error::last_os_error()));
        }
        // SAFETY: an all-zero `stat` is a valid value for fstat to overwrite.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: `fd` is open and `st` is writable.
        let size_ok = unsafe { libc::fstat(fd, &mut st) } == 0;
        let result = if !size_ok {
            Err(os(std::io::Error::last_os_error()))
        } else if usize::try_from(st.st_size).map_or(true, |size| size < len) {
            Err(ArenaError::Truncated { name: name.to_owned(), size: st.st_size as i64, expected: len })
        } else {
            map(fd, len).map(|ptr| Self { ptr, len }).map_err(os)
        };
        // SAFETY: `fd` is ours and no longer needed.
        unsafe { libc::close(fd) };
        result
    }

    /// A new descriptor of the existing segment `name` (read-write), for a second mapping made elsewhere.
    pub(crate) fn open_fd(name: &str) -> Result<std::os::fd::OwnedFd, ArenaError> {
        use std::os::fd::FromRawFd;
        let c_name = c_name(name)?;
        // SAFETY: `c_name` is a NUL-terminated string.
        let fd = unsafe { libc::shm_open(c_name.as_ptr(), libc::O_RDWR, 0) };
        if fd < 0 {
            return Err(ArenaError::Os {
                what: "attach",
                name: name.to_owned(),
                source: std::io::Error::last_os_error(),
            });
        }
        // SAFETY: `fd` was just opened and is owned by nothing else.
        Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) })
    }

    /// The control block.
    pub(crate) fn control(&self) -> &Control {
        // SAFETY: the mapping is page-aligned and at least CTRL_SIZE bytes, and every bit pattern is a valid
        // `Control` (atomics only); the memory lives as long as `self`.
        unsafe { &*self.ptr.as_ptr().cast::<Control>() }
    }

    /// The start of the data area (after the control block); `data_len()` bytes follow.
    pub(crate) fn data(&self) -> *mut u8 {
        // SAFETY: CTRL_SIZE <= len, so the result is inside (or one past the end of) the mapping.
        unsafe { self.ptr.as_ptr().add(CTRL_SIZE) }
    }

    /// Bytes of the data area.
    pub(crate) fn data_len(&self) -> usize {
        self.len - CTRL_SIZE
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` are the mapping made in `map`, unmapped only here.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

fn c_name(name: &str) -> Result<CString, ArenaError> {
    CString::new(format!("/{name}")).map_err(|_| ArenaError::BadName { name: name.to_owned() })
}

/// Bytes free for an unprivileged user on the filesystem of `fd` (`None` if the system does not say).
fn free_bytes(fd: libc::c_int) -> Option<u64> {
    // SAFETY: an all-zero `statvfs` is a valid value for fstatvfs to overwrite.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `fd` is open and `st` is writable.
    if unsafe { libc::fstatvfs(fd, &mut st) } != 0 {
        return None;
    }
    (st.f_bavail as u64).checked_mul(st.f_frsize as u64)
}

fn map(fd: libc::c_int, len: usize) -> std::io::Result<NonNull<u8>> {
    // SAFETY: a fresh shared read-write mapping of `len` bytes of the open descriptor `fd`.
    let ptr =
        unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd, 0) };
    if ptr == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error());
    }
    NonNull::new(ptr.cast::<u8>()).ok_or_else(|| std::io::Error::from_raw_os_error(libc::ENOMEM))
}

/// Segments this process created and has not unlinked yet, with the creating process's id (a forked child
/// inherits the list but is not the owner).
static OWNED: Mutex<Vec<(String, u32)>> = Mutex::new(Vec::new());
static EXIT_HOOK: Once = Once::new();

fn register_owned(name: &str) {
    OWNED.lock().unwrap_or_else(PoisonError::into_inner).push((name.to_owned(), std::process::id()));
    EXIT_HOOK.call_once(|| {
        // SAFETY: `unlink_all_at_exit` is an `extern "C" fn()` that does not unwind.
        unsafe { libc::atexit(unlink_all_at_exit) };
    });
}

/// Removes `name` if this process created it and has not removed it yet; elsewhere a no-op.
pub(crate) fn unlink_owned(name: &str) -> Result<(), ArenaError> {
    let pid = std::process::id();
    {
        let mut owned = OWNED.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(i) = owned.iter().position(|(n, p)| n == name && *p == pid) else {
            return Ok(());
        };
        owned.swap_remove(i);
    }
    let c_name = c_name(name)?;
    // SAFETY: `c_name` is a NUL-terminated string.
    if unsafe { libc::shm_unlink(c_name.as_ptr()) } != 0 {
        let err = std::io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::ENOENT) {
            return Err(ArenaError::Os { what: "unlink", name: name.to_owned(), source: err });
        }
    }
    Ok(())
}

/// At process exit, removes the segments this process created and nobody unlinked (an arena never closed).
extern "C" fn unlink_all_at_exit() {
    let pid = std::process::id();
    let owned = std::mem::take(&mut *OWNED.lock().unwrap_or_else(PoisonError::into_inner));
    for (name, p) in owned {
        if p == pid
            && let Ok(c_name) = c_name(&name)
        {
            // SAFETY: `c_name` is a NUL-terminated string.
            unsafe { libc::shm_unlink(c_name.as_ptr()) };
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[test]
    fn a_wait_times_out() {
        let ctrl = Control::default();
        let t0 = Instant::now();
        let got = ctrl.wait_until(
            |_| false,
            Some(Duration::from_millis(50)),
            Duration::from_millis(10),
            || Ok::<_, ()>(false),
            |f| f(),
        );
        assert_eq!(got, Ok(Waited::TimedOut));
        assert!(t0.elapsed() >= Duration::from_millis(50));
    }

    #[test]
    fn a_release_from_another_thread_ends_the_wait() {
        let ctrl = Arc::new(Control::default());
        let other = Arc::clone(&ctrl);
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            other.tail.store(5, Ordering::Release);
            other.notify();
        });
        let got = ctrl.wait_until(
            |c| c.tail.load(Ordering::Acquire) == 5,
            Some(Duration::from_secs(10)),
            Duration::from_secs(5),
            || Ok::<_, ()>(false),
            |f| f(),
        );
        t.join().unwrap();
        assert_eq!(got, Ok(Waited::Ready));
    }

    #[test]
    fn shutdown_and_interrupt_end_the_wait() {
        let ctrl = Control::default();
        let step = Duration::from_millis(1);
        assert_eq!(ctrl.wait_until(|_| false, None, step, || Ok::<_, ()>(true), |f| f()), Ok(Waited::Interrupted));
        ctrl.shut_down();
        assert_eq!(ctrl.wait_until(|_| false, None, step, || Ok::<_, ()>(false), |f| f()), Ok(Waited::Shutdown));
    }

    #[test]
    fn a_segment_larger_than_the_free_shared_memory_is_refused() {
        assert!(matches!(Segment::create(1 << 60), Err(ArenaError::NoSpace { .. })));
    }

    #[test]
    fn a_segment_is_shared_by_name_and_unlinked_by_its_creator() {
        let (name, created) = Segment::create(4096).unwrap();
        let attached = Segment::attach(&name, 4096).unwrap();
        created.control().head.store(42, Ordering::Release);
        assert_eq!(attached.control().head.load(Ordering::Acquire), 42);
        assert_eq!(attached.data_len(), 4096);
        assert!(matches!(Segment::attach(&name, 1 << 20), Err(ArenaError::Truncated { .. })));
        unlink_owned(&name).unwrap();
        unlink_owned(&name).unwrap();
        assert!(matches!(Segment::attach(&name, 4096), Err(ArenaError::Os { .. })));
    }
}
