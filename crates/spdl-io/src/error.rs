use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::PathBuf;

/// Boxed cause carried by decode errors.
pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Every error from spdl-io. Each variant names the item (a path, or the name given to in-memory bytes)
/// so a failure in a pipeline of millions of files says which one and why.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Reading the file failed.
    #[error("{path}: cannot read")]
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
    #[error("{item}: cannot decode {format}")]
    Decode {
        /// The item.
        item: String,
        /// The format being decoded ("jpeg", "flac", "h264", ...).
        format: String,
        /// The decoder's error.
        #[source]
        cause: BoxError,
    },
    /// Encoding or writing media failed: the output did not open, an encoder refused a frame, or the
    /// container writer a packet (`crate::media::Muxer`, `AudioEncoder`, `VideoEncoder`).
    #[error("{item}: {what}")]
    Encode {
        /// The output (a muxer's destination, or `DST stream I (ENCODER)`).
        item: String,
        /// What failed ("encoding with libx264", "writing the mp4 header", "opening the output", ...).
        what: String,
        /// FFmpeg's error (an [`std::io::Error`] when the output did not open).
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
    /// An item of a batch failed: in a strict batch, the first failing index (the batch has no
    /// output); otherwise one of the batch's `failures` (its slot is zero).
    #[error("batch item {index}")]
    BatchItem {
        /// Position of the item in the batch.
        index: usize,
        /// Why it failed (names the item).
        #[source]
        source: Box<Error>,
    },
    /// A capability this process cannot use: FFmpeg's libraries were not found, or no backend of this
    /// build loads them (the detail says what was looked for, what was found, and how to install it).
    #[error("{what} is not available: {detail}")]
    Unavailable {
        /// What is missing ("FFmpeg").
        what: String,
        /// What was looked for and found, and how to get it.
        detail: String,
    },
    /// Allocating or shaping the output buffer failed.
    #[error("output buffer")]
    Buffer(#[from] spdl_buffer::BufferError),
}

impl Error {
    /// The item this error names (a path, or the name given to in-memory bytes), if it names one.
    pub fn item(&self) -> Option<&str> {
        match self {
            Error::Empty { item }
            | Error::UnknownFormat { item, .. }
            | Error::Decode { item, .. }
            | Error::Encode { item, .. }
            | Error::LimitExceeded { item, .. } => Some(item),
            Error::Io { path, .. } | Error::NotRegularFile { path, .. } => path.to_str(),
            Error::BatchItem { source, .. } => source.item(),
            _ => None,
        }
    }

    /// For an [`Error::BatchItem`], the item's position in its batch and why it failed.
    pub fn batch_item(&self) -> Option<(usize, &Error)> {
        match self {
            Error::BatchItem { index, source } => Some((*index, source)),
            _ => None,
        }
    }
}

/// Result alias for spdl-io.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Runs `f`, turning a panic inside a decoder into [`Error::Decode`] for `item` (every decoder, image and
/// audio, goes through this one guard).
#[cfg_attr(not(any(feature = "audio", feature = "image")), allow(dead_code))]
pub(crate) fn guarded<T>(item: &str, format: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|payload| {
        let msg = spdl_report::panic_message(&*payload);
        Err(Error::Decode {
            item: item.to_owned(),
            format: format.to_owned(),
            cause: format!("decoder panicked: {msg}").into(),
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_nested_error_names_each_cause_once() {
        let os = std::io::Error::from_raw_os_error(2);
        let os_text = os.to_string();
        let read = Error::Io { path: "/data/a.jpg".into(), source: os };
        let err = Error::BatchItem { index: 3, source: Box::new(read) };
        // Each layer's Display is its own; the causes come from the chain printer, once each.
        assert_eq!(err.to_string(), "batch item 3");
        let text = spdl_report::error_chain(&err);
        assert_eq!(text, format!("batch item 3: /data/a.jpg: cannot read: {os_text}"));
        for part in ["batch item 3", "/data/a.jpg", "cannot read", os_text.as_str()] {
            assert_eq!(text.matches(part).count(), 1, "{part:?} in {text:?}");
        }
        assert_eq!(err.item(), Some("/data/a.jpg"));
    }

    #[test]
    fn a_decode_error_shows_its_cause_once() {
        let err = Error::Decode { item: "x.png".into(), format: "png".into(), cause: "bad CRC".into() };
        assert_eq!(err.to_string(), "x.png: cannot decode png");
        assert_eq!(spdl_report::error_chain(&err), "x.png: cannot decode png: bad CRC");
    }
}
