//! Reading input files with their cost bounded first: only regular files, and never more bytes than a cap.
//!
//! A path in a training list can name anything: `/dev/zero` (endless), a FIFO with no writer (blocks
//! forever on open), a socket, or a file far larger than any image. Every spdl-io entry point that takes a
//! path checks it here before reading: the file must be a regular file (checked with `stat`, which does
//! not open it, so a FIFO never blocks) and no larger than [`ReadLimits::max_bytes`]. Callers that mean to
//! read a device or a pipe opt in with [`ReadLimits::allow_special_files`]; the byte cap still holds and
//! the file is opened non-blocking, so a FIFO without a writer reads as empty instead of hanging.
//!
//! The classification, the non-blocking open and the capped read are `spdl_buffer::file`'s (shared with
//! spdl-source's local store); what is accepted, and the errors, are spdl-io's.

use std::fs::File;
use std::path::Path;

use spdl_buffer::file::{BoundedRead, FileKind, ReadBoundError, open_nonblocking, read_bounded};

use crate::{Error, Result};

/// Default [`ReadLimits::max_bytes`]: 1 GiB, far above any image or clip a loader reads whole.
pub const DEFAULT_MAX_FILE_BYTES: u64 = 1 << 30;

/// What a path may be and how much of it may be read.
///
/// ```
/// use spdl_io::{Error, ReadLimits, read_file};
///
/// let dir = tempfile::tempdir()?;
/// let path = dir.path().join("a.bin");
/// std::fs::write(&path, b"12345")?;
/// assert_eq!(read_file(&path, &ReadLimits::default())?, b"12345");
///
/// // Too large for the cap: refused from the file's size, before reading.
/// let small = ReadLimits { max_bytes: 4, ..ReadLimits::default() };
/// assert!(matches!(read_file(&path, &small), Err(Error::LimitExceeded { .. })));
///
/// // Not a regular file: refused unless the caller opts in.
/// assert!(matches!(read_file("/dev/zero", &ReadLimits::default()), Err(Error::NotRegularFile { .. })));
/// let opt_in = ReadLimits { max_bytes: 16, allow_special_files: true };
/// assert!(matches!(read_file("/dev/zero", &opt_in), Err(Error::LimitExceeded { .. })));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ReadLimits {
    /// Largest file read whole, in bytes (default [`DEFAULT_MAX_FILE_BYTES`]). A regular file is checked
    /// from its size before reading; a special file (opt-in) is read up to this many bytes and refused if
    /// it has more.
    pub max_bytes: u64,
    /// Accept FIFOs, character and block devices and sockets (default `false`: refused with
    /// [`Error::NotRegularFile`]).
    pub allow_special_files: bool,
}

impl Default for ReadLimits {
    fn default() -> Self {
        ReadLimits { max_bytes: DEFAULT_MAX_FILE_BYTES, allow_special_files: false }
    }
}

fn io_error(path: &Path, source: std::io::Error) -> Error {
    Error::Io { path: path.to_owned(), source }
}

/// What kind of non-regular file `kind` is, for errors.
fn describe(kind: FileKind) -> &'static str {
    match kind {
        FileKind::Directory => "a directory",
        FileKind::Fifo => "a FIFO (named pipe)",
        FileKind::CharDevice => "a character device",
        FileKind::BlockDevice => "a block device",
        FileKind::Socket => "a socket",
        FileKind::Regular { .. } | FileKind::Other => "not a regular file",
    }
}

/// Checks `path` (following symlinks) and opens it for reading. Returns the file and, for a regular file,
/// its size. A regular file over `limits.max_bytes` is refused here when `whole` (it is to be read whole);
/// files read in windows (audio, video) pass `whole = false`.
pub(crate) fn open_checked(path: &Path, limits: &ReadLimits, whole: bool) -> Result<(File, Option<u64>)> {
    let meta = std::fs::metadata(path).map_err(|e| io_error(path, e))?;
    let kind = FileKind::of(&meta);
    if let FileKind::Regular { size } = kind {
        if whole && size > limits.max_bytes {
            return Err(Error::LimitExceeded {
                item: path.display().to_string(),
                what: "file bytes".into(),
                value: size,
                limit: limits.max_bytes,
            });
        }
        let file = File::open(path).map_err(|e| io_error(path, e))?;
        return Ok((file, Some(size)));
    }
    if kind == FileKind::Directory || !limits.allow_special_files {
        return Err(Error::NotRegularFile { path: path.to_owned(), kind: describe(kind) });
    }
    // Non-blocking: opening a FIFO without a writer returns at once (and reads as empty).
    let file = open_nonblocking(path).map_err(|e| io_error(path, e))?;
    Ok((file, None))
}

/// Reads the whole file at `path` after checking what it is and how large it is (see [`ReadLimits`]).
///
/// Errors: [`Error::NotRegularFile`] for a directory, FIFO, device or socket (unless opted in),
/// [`Error::LimitExceeded`] (`file bytes`) for a file over the cap, [`Error::Io`] for the OS's errors. All
/// name the path.
pub fn read_file(path: impl AsRef<Path>, limits: &ReadLimits) -> Result<Vec<u8>> {
    let path = path.as_ref();
    let (file, len) = open_checked(path, limits, true)?;
    // The stated size sizes the buffer (a regular file); the cap bounds the read either way, since a file
    // can grow between the stat and the read. A non-blocking special file with nothing to read yet: what is
    // there is all there is (`OnWouldBlock::Stop`, the default).
    let bound = BoundedRead::new(limits.max_bytes).size_hint(len.unwrap_or(0));
    read_bounded(file, &bound).map_err(|e| match e {
        ReadBoundError::TooLarge { read, limit } => {
            Error::LimitExceeded { item: path.display().to_string(), what: "file bytes".into(), value: read, limit }
        }
        ReadBoundError::OutOfMemory { bytes, cause } => Error::Buffer(spdl_buffer::BufferError::OutOfMemory {
            allocator: "system".into(),
            bytes: usize::try_from(bytes).unwrap_or(usize::MAX),
            cause,
        }),
        ReadBoundError::Io(e) => io_error(path, e),
        other => io_error(path, std::io::Error::other(other)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fifo_is_refused_without_blocking() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let fifo = dir.path().join("pipe");
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap_or_default();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let err = read_file(&fifo, &ReadLimits::default()).err();
        assert!(matches!(err, Some(Error::NotRegularFile { .. })), "{err:?}");
        assert!(err.map(|e| e.to_string()).unwrap_or_default().contains("FIFO"));
        // Opted in: opened non-blocking, no writer: empty, at once.
        let opt_in = ReadLimits { allow_special_files: true, ..ReadLimits::default() };
        assert_eq!(read_file(&fifo, &opt_in).ok(), Some(Vec::new()));
    }

    #[test]
    fn symlink_to_a_device_is_refused() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let link = dir.path().join("img.jpg");
        std::os::unix::fs::symlink("/dev/zero", &link).unwrap_or_else(|e| panic!("{e}"));
        let err = read_file(&link, &ReadLimits::default()).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains("img.jpg") && err.contains("character device"), "{err}");
        assert!(read_file(dir.path(), &ReadLimits::default()).is_err());
    }
}
