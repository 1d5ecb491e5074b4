use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::PathBuf;

/// Boxed cause carried by decode errors.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Every error from spdl-io. Each variant names the item (a path, or the name given to in-memory bytes)
/// so a failure in a pipeline of millions of files says which one and why.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Reading the file failed.
    #[error("{path}: cannot read: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The path names something other than a regular file (a directory, FIFO, device or socket), which
    /// is refused unless [`crate::ReadLimits::allow_special_files`] opts in.
    #[error("{path}: is {kind}, not a regular file (refused: it may never end or never answer)")]
    NotRegularFile {
        /// The path.
        path: PathBuf,
        /// What it is ("a FIFO (named pipe)", "a character device", ...).
        kind: &'static str,
    },
    /// The input has no bytes.
    #[error("{item}: empty input (0 bytes)")]
    Empty {
        /// The item.
        item: String,
    },
    /// The bytes are not in any format this build can read.
    #[error("{item}: unrecognized or unsupported format ({detail})")]
    UnknownFormat {
        /// The item.
        item: String,
        /// What was seen (magic bytes, extension).
        detail: String,
    },
    /// The bytes claim a format but do not decode (corrupt, truncated).
    #[error("{item}: cannot decode {format}: {cause}")]
    Decode {
        /// The item.
        item: String,
        /// The format being decoded ("jpeg", "flac", "h264", ...).
        format: String,
        /// The decoder's error.
        #[source]
        cause: BoxError,
    },
    /// The input would exceed a configured limit (decompression bomb, absurd header values).
    #[error("{item}: {what} is {value}, above the limit of {limit}")]
    LimitExceeded {
        /// The item.
        item: String,
        /// What was limited ("pixels", "samples", "frames", ...).
        what: String,
        /// The value the input asked for.
        value: u64,
        /// The configured limit.
        limit: u64,
    },
    /// Options that cannot be satisfied (zero size, crop larger than the image, ...).
    #[error("invalid options: {0}")]
    InvalidOptions(String),
    /// An item of a strict batch failed (the first failing index; the batch has no output).
    #[error("batch item {index}: {source}")]
    BatchItem {
        /// Position of the item in the batch.
        index: usize,
        /// Why it failed (names the item).
        #[source]
        source: Box<Error>,
    },
    /// Allocating or shaping the output buffer failed.
    #[error("output buffer: {0}")]
    Buffer(#[from] spdl_buffer::BufferError),
}

/// Result alias for spdl-io.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Runs `f`, turning a panic inside a decoder into [`Error::Decode`].
#[cfg_attr(not(feature = "audio"), allow(dead_code))]
pub(crate) fn guarded<T>(item: &str, format: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|payload| {
        let msg = payload
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "non-string panic payload".to_owned());
        Err(Error::Decode {
            item: item.to_owned(),
            format: format.to_owned(),
            cause: format!("decoder panicked: {msg}").into(),
        })
    })
}
