//! Reading a local file with its cost bounded first: what kind of file a path names (from `stat`, which opens
//! nothing, so a FIFO without a writer cannot block), opening a special file without blocking, and reading at
//! most a cap of bytes, with a bounded wait on a special file that has no data yet.
//!
//! The one home of these reads for spdl-io's input layer (`spdl_io::read_file`) and spdl-source's local store:
//! each decides what it accepts (its own limits, options and error type) and reads through [`read_bounded`].
//!
//! ```
//! use spdl_buffer::file::{BoundedRead, FileKind, ReadBoundError, read_bounded};
//!
//! let dir = std::env::temp_dir().join(format!("spdl-buffer-doc-{}", std::process::id()));
//! std::fs::create_dir_all(&dir)?;
//! let path = dir.join("a.bin");
//! std::fs::write(&path, b"12345")?;
//!
//! let meta = std::fs::metadata(&path)?;
//! assert_eq!(FileKind::of(&meta), FileKind::Regular { size: 5 });
//! let file = std::fs::File::open(&path)?;
//! assert_eq!(read_bounded(file, &BoundedRead::new(16).size_hint(5))?, b"12345");
//!
//! // More bytes than the cap: refused after reading one byte past it, never more.
//! let file = std::fs::File::open(&path)?;
//! assert!(matches!(read_bounded(file, &BoundedRead::new(4)), Err(ReadBoundError::TooLarge { read: 5, limit: 4 })));
//!
//! // An endless device: read up to the cap plus one byte, then refused.
//! # #[cfg(unix)] {
//! assert_eq!(FileKind::of(&std::fs::metadata("/dev/zero")?), FileKind::CharDevice);
//! let zero = spdl_buffer::file::open_nonblocking("/dev/zero")?;
//! assert!(matches!(read_bounded(zero, &BoundedRead::new(1 << 16)), Err(ReadBoundError::TooLarge { .. })));
//! # }
//! # std::fs::remove_dir_all(&dir)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::io::Read;
use std::path::Path;
use std::time::{Duration, Instant};

/// What a path names, from its metadata.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FileKind {
    /// A regular file of `size` bytes (at the time of the `stat`: it may grow).
    Regular {
        /// Its size.
        size: u64,
    },
    /// A directory.
    Directory,
    /// A FIFO (named pipe).
    Fifo,
    /// A character device (`/dev/zero`, a terminal).
    CharDevice,
    /// A block device (a disk).
    BlockDevice,
    /// A Unix domain socket.
    Socket,
    /// Anything else the platform has.
    Other,
}

impl FileKind {
    /// The kind of the file `meta` describes (from [`std::fs::metadata`], which follows symbolic links).
    pub fn of(meta: &std::fs::Metadata) -> FileKind {
        let ft = meta.file_type();
        if ft.is_file() {
            return FileKind::Regular { size: meta.len() };
        }
        if ft.is_dir() {
            return FileKind::Directory;
        }
        #[cfg(unix)]
        {
            use std::os::unix::fs::FileTypeExt;
            if ft.is_fifo() {
                return FileKind::Fifo;
            }
            if ft.is_char_device() {
                return FileKind::CharDevice;
            }
            if ft.is_block_device() {
                return FileKind::BlockDevice;
            }
            if ft.is_socket() {
                return FileKind::Socket;
            }
        }
        FileKind::Other
    }

    /// Whether it is a FIFO, a device, a socket or another kind that is neither a regular file nor a directory.
    pub fn is_special(self) -> bool {
        !matches!(self, FileKind::Regular { .. } | FileKind::Directory)
    }
}

/// Opens `path` for reading without blocking on it: a FIFO without a writer opens at once (and reads as empty
/// or would-block, never hangs). On platforms without `O_NONBLOCK` it is a plain open.
///
/// # Errors
///
/// The OS's error from `open`.
pub fn open_nonblocking(path: impl AsRef<Path>) -> std::io::Result<std::fs::File> {
    let mut options = std::fs::OpenOptions::new();
    options.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.custom_flags(libc::O_NONBLOCK);
    }
    options.open(path)
}

/// What a reader with no data yet (`WouldBlock`, from a file opened with [`open_nonblocking`]) means.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OnWouldBlock {
    /// What was read is all there is: the read ends without error.
    Stop,
    /// Wait for more (polling every few milliseconds) up to this long after the last data, then fail with
    /// [`ReadBoundError::TimedOut`].
    Wait(Duration),
}

/// How much [`read_bounded`] may read, and how it waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BoundedRead {
    /// The most bytes accepted: a reader with more is [`ReadBoundError::TooLarge`] (one byte past it is read to
    /// tell).
    pub limit: u64,
    /// The read stops, without error, after this many bytes (a prefix is wanted); `u64::MAX` reads to the end.
    pub want: u64,
    /// The size the reader is expected to have (a regular file's): reserved up front, at most `limit` (plus the
    /// byte that tells a larger file). 0 lets the buffer grow as bytes arrive.
    pub size_hint: u64,
    /// What `WouldBlock` means (default [`OnWouldBlock::Stop`]).
    pub on_would_block: OnWouldBlock,
}

impl BoundedRead {
    /// Up to `limit` bytes, to the end, no size hint, stopping at `WouldBlock`.
    pub fn new(limit: u64) -> Self {
        BoundedRead { limit, want: u64::MAX, size_hint: 0, on_would_block: OnWouldBlock::Stop }
    }

    /// With [`BoundedRead::want`] set.
    #[must_use]
    pub fn want(mut self, want: u64) -> Self {
        self.want = want;
        self
    }

    /// With [`BoundedRead::size_hint`] set.
    #[must_use]
    pub fn size_hint(mut self, size_hint: u64) -> Self {
        self.size_hint = size_hint;
        self
    }

    /// With [`BoundedRead::on_would_block`] set.
    #[must_use]
    pub fn on_would_block(mut self, on_would_block: OnWouldBlock) -> Self {
        self.on_would_block = on_would_block;
        self
    }
}

/// Why [`read_bounded`] refused or failed. Callers map it to their own error, naming the path.
#[derive(Debug)]
#[non_exhaustive]
pub enum ReadBoundError {
    /// The reader has more than [`BoundedRead::limit`] bytes; `read` were read before giving up (`limit + 1`).
    TooLarge {
        /// Bytes read.
        read: u64,
        /// The limit.
        limit: u64,
    },
    /// No data for [`OnWouldBlock::Wait`]'s duration.
    TimedOut {
        /// How long it waited.
        waited: Duration,
    },
    /// The buffer for the size hint could not be reserved.
    OutOfMemory {
        /// The bytes asked for.
        bytes: u64,
        /// The allocator's message.
        cause: String,
    },
    /// The reader failed.
    Io(std::io::Error),
}

impl std::fmt::Display for ReadBoundError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadBoundError::TooLarge { read, limit } => {
                write!(f, "more than {limit} bytes (read {read} before stopping)")
            }
            ReadBoundError::TimedOut { waited } => write!(f, "no data for {waited:?}"),
            ReadBoundError::OutOfMemory { bytes, cause } => write!(f, "cannot reserve {bytes} bytes: {cause}"),
            ReadBoundError::Io(_) => f.write_str("read failed"),
        }
    }
}

impl std::error::Error for ReadBoundError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ReadBoundError::Io(e) => Some(e),
            _ => None,
        }
    }
}

/// How long a [`OnWouldBlock::Wait`] read sleeps between polls.
const POLL: Duration = Duration::from_millis(5);

/// Reads `reader` to its end, to [`BoundedRead::want`] bytes, or to one byte past [`BoundedRead::limit`]
/// (refused), whichever comes first; `Interrupted` reads are retried and `WouldBlock` is handled as
/// [`BoundedRead::on_would_block`] says. Memory is bounded by the limit: the size hint reserves at most
/// `limit + 1` bytes, and the buffer grows only as bytes arrive.
///
/// # Errors
///
/// [`ReadBoundError::TooLarge`] past the limit (unless `want` stopped the read first),
/// [`ReadBoundError::TimedOut`] after a [`OnWouldBlock::Wait`] without data, [`ReadBoundError::OutOfMemory`] if
/// the hinted buffer cannot be reserved, [`ReadBoundError::Io`] for the reader's other errors.
pub fn read_bounded(reader: impl Read, bound: &BoundedRead) -> Result<Vec<u8>, ReadBoundError> {
    // One byte past the limit tells a reader that has more; `want` may stop the read before.
    let stop = bound.want.min(bound.limit.saturating_add(1));
    let mut buf = Vec::new();
    let reserve = bound.size_hint.min(bound.limit).saturating_add(1).min(stop);
    if reserve > 0 {
        let bytes = usize::try_from(reserve).unwrap_or(usize::MAX);
        buf.try_reserve_exact(bytes)
            .map_err(|e| ReadBoundError::OutOfMemory { bytes: reserve, cause: e.to_string() })?;
    }
    let mut reader = reader.take(stop);
    let mut last_data = Instant::now();
    loop {
        let before = buf.len();
        let result = reader.read_to_end(&mut buf);
        if buf.len() > before {
            last_data = Instant::now();
        }
        match result {
            Ok(_) => break,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => match bound.on_would_block {
                OnWouldBlock::Stop => break,
                OnWouldBlock::Wait(timeout) => {
                    let waited = last_data.elapsed();
                    if waited >= timeout {
                        return Err(ReadBoundError::TimedOut { waited: timeout });
                    }
                    std::thread::sleep(POLL.min(timeout - waited));
                }
            },
            Err(e) => return Err(ReadBoundError::Io(e)),
        }
    }
    if buf.len() as u64 > bound.limit {
        return Err(ReadBoundError::TooLarge { read: buf.len() as u64, limit: bound.limit });
    }
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reader that has `data`, handed out in `chunk`-byte reads, with a `WouldBlock` between reads for the
    /// first `blocks` calls, and an `Interrupted` first.
    struct Slow {
        data: Vec<u8>,
        chunk: usize,
        blocks: usize,
        calls: usize,
    }

    impl Read for Slow {
        fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
            self.calls += 1;
            if self.calls == 1 {
                return Err(std::io::ErrorKind::Interrupted.into());
            }
            if self.calls.is_multiple_of(2) && self.blocks > 0 {
                self.blocks -= 1;
                return Err(std::io::ErrorKind::WouldBlock.into());
            }
            let n = self.chunk.min(out.len()).min(self.data.len());
            out[..n].copy_from_slice(&self.data[..n]);
            self.data.drain(..n);
            Ok(n)
        }
    }

    fn slow(len: usize, blocks: usize) -> Slow {
        Slow { data: (0..len).map(|i| i as u8).collect(), chunk: 7, blocks, calls: 0 }
    }

    #[test]
    fn limits_want_and_hints() {
        let data: Vec<u8> = (0..100u8).collect();
        assert_eq!(read_bounded(&data[..], &BoundedRead::new(100)).unwrap(), data);
        let err = read_bounded(&data[..], &BoundedRead::new(99)).unwrap_err();
        assert!(matches!(err, ReadBoundError::TooLarge { read: 100, limit: 99 }), "{err}");
        // `want` stops the read first: a prefix, no error.
        assert_eq!(read_bounded(&data[..], &BoundedRead::new(10).want(10)).unwrap(), &data[..10]);
        assert_eq!(read_bounded(&data[..], &BoundedRead::new(99).want(5)).unwrap(), &data[..5]);
        assert!(read_bounded(&data[..], &BoundedRead::new(10).want(50)).is_err());
        // A lying hint reserves no more than the limit allows.
        let buf = read_bounded(&data[..3], &BoundedRead::new(1 << 20).size_hint(u64::MAX)).unwrap();
        assert_eq!(buf, &data[..3]);
        assert!(buf.capacity() <= (1 << 20) + 1);
        let err = read_bounded(&data[..], &BoundedRead::new(u64::MAX).size_hint(u64::MAX)).unwrap_err();
        assert!(matches!(err, ReadBoundError::OutOfMemory { .. }), "{err}");
    }

    #[test]
    fn would_block_stops_or_waits() {
        // Stop: what arrived before the first WouldBlock is all there is.
        let got = read_bounded(slow(50, 100), &BoundedRead::new(100)).unwrap();
        assert!(got.len() < 50, "{}", got.len());
        // Wait: every byte, across the WouldBlocks.
        let wait = BoundedRead::new(100).on_would_block(OnWouldBlock::Wait(Duration::from_secs(5)));
        assert_eq!(read_bounded(slow(50, 100), &wait).unwrap(), slow(50, 0).data);
        // The limit still holds, and so does the timeout.
        let small = BoundedRead { limit: 20, ..wait };
        assert!(matches!(read_bounded(slow(50, 100), &small), Err(ReadBoundError::TooLarge { read: 21, .. })));
        struct Stalled;
        impl Read for Stalled {
            fn read(&mut self, _: &mut [u8]) -> std::io::Result<usize> {
                Err(std::io::ErrorKind::WouldBlock.into())
            }
        }
        let stalled = BoundedRead::new(100).on_would_block(OnWouldBlock::Wait(Duration::from_millis(30)));
        let start = Instant::now();
        let err = read_bounded(Stalled, &stalled).unwrap_err();
        assert!(matches!(err, ReadBoundError::TimedOut { .. }), "{err}");
        assert!(start.elapsed() < Duration::from_secs(5));
    }

    #[cfg(unix)]
    #[test]
    fn fifo_opens_without_blocking_and_reads_empty() {
        let dir = std::env::temp_dir().join(format!("spdl-buffer-fifo-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let fifo = dir.join("pipe");
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        assert_eq!(FileKind::of(&std::fs::metadata(&fifo).unwrap()), FileKind::Fifo);
        assert!(FileKind::Fifo.is_special() && !FileKind::Directory.is_special());
        let file = open_nonblocking(&fifo).unwrap();
        assert_eq!(read_bounded(file, &BoundedRead::new(10)).unwrap(), b"");
        assert_eq!(FileKind::of(&std::fs::metadata(&dir).unwrap()), FileKind::Directory);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
