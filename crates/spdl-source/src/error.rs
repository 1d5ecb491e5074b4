//! The one error type of the crate.

use std::ops::Range;

/// A boxed cause, as carried by the variants that wrap a lower-level error.
pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Result alias used across the crate.
pub type Result<T, E = SourceError> = std::result::Result<T, E>;

/// Everything that can go wrong in spdl-source. Each variant names the object (URL, key, path, line) and the cause.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SourceError {
    /// The object does not exist (HTTP 404, S3 `NoSuchKey`, a missing file). Never retried.
    #[error("object not found: {location}")]
    NotFound {
        /// The URL or path of the object.
        location: String,
    },

    /// Access was refused (HTTP 401/403, S3 `AccessDenied`, a file permission error). Never retried.
    #[error("access denied to {location}: {reason}")]
    PermissionDenied {
        /// The URL or path of the object.
        location: String,
        /// What the server or the OS said.
        reason: String,
        /// The underlying error.
        #[source]
        source: Option<BoxError>,
    },

    /// A request failed for good: either a non-retryable failure, or the last of `attempts` retryable ones.
    #[error("{operation} {location} failed after {attempts} attempt(s): {reason}")]
    Request {
        /// The operation: `GET`, `GET range`, `HEAD`, `LIST`.
        operation: &'static str,
        /// The URL, `s3://` address or path the request was for.
        location: String,
        /// How many attempts were made (1 when the failure was not retryable).
        attempts: u32,
        /// The last cause, rendered with its own causes (so a chain printer such as
        /// `spdl_report::error_chain` skips `source`, whose text it already holds).
        reason: String,
        /// The last underlying error.
        #[source]
        source: Option<BoxError>,
    },

    /// A local file-system operation failed.
    #[error("{operation} {}", path.display())]
    Io {
        /// The operation (`read`, `open`, `stat`, `list`).
        operation: &'static str,
        /// The path it was for.
        path: std::path::PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },

    /// A key that cannot name an object in this store (empty, absolute, or with `..`).
    #[error("invalid key {key:?}: {reason}")]
    InvalidKey {
        /// The key as given.
        key: String,
        /// Why it is refused.
        reason: &'static str,
    },

    /// A byte range that is empty, reversed, or past the end of the object.
    #[error("invalid range {}..{} for {location} (object size {size:?})", range.start, range.end)]
    InvalidRange {
        /// The object.
        location: String,
        /// The range that was asked for.
        range: Range<u64>,
        /// The object's size, when known.
        size: Option<u64>,
    },

    /// The server answered with fewer or more bytes than the request asked for.
    #[error("{location}: expected {expected} bytes, received {received}")]
    ShortBody {
        /// The object.
        location: String,
        /// Bytes asked for.
        expected: u64,
        /// Bytes received.
        received: u64,
    },

    /// A URL or store address that could not be parsed or is not supported.
    #[error("invalid store address {url:?}: {reason}")]
    InvalidUrl {
        /// The address as given.
        url: String,
        /// What is wrong with it.
        reason: String,
    },

    /// The address needs a cargo feature of spdl-source that this build does not have.
    #[error("{url:?} needs spdl-source's `{feature}` feature, which this build does not enable")]
    FeatureDisabled {
        /// The address as given.
        url: String,
        /// The feature to enable.
        feature: &'static str,
    },

    /// The store cannot perform this operation (e.g. `list` over plain HTTP).
    #[error("{store} does not support {operation}")]
    Unsupported {
        /// The store, as its address.
        store: String,
        /// The operation.
        operation: &'static str,
    },

    /// A client could not be configured (TLS, proxy, credentials...).
    #[error("cannot configure the {store} client: {reason}")]
    Config {
        /// The kind of store (`HTTP`, `S3`).
        store: &'static str,
        /// What failed.
        reason: String,
        /// The underlying error.
        #[source]
        source: Option<BoxError>,
    },

    /// The I/O runtime of a [`DedicatedStore`](crate::DedicatedStore) could not be started.
    #[error("cannot start the I/O runtime for {url}")]
    Runtime {
        /// The store's address.
        url: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },

    /// A manifest line that cannot be parsed.
    #[error("manifest {source_name}, line {line}: {reason}")]
    Manifest {
        /// The manifest's path or name.
        source_name: String,
        /// 1-based line number.
        line: usize,
        /// What is wrong with it.
        reason: String,
    },

    /// A tar shard that cannot be read.
    #[error("tar shard {shard}{}", entry.as_ref().map(|e| format!(", entry {e:?}")).unwrap_or_default())]
    Tar {
        /// The shard's name or key.
        shard: String,
        /// The entry being read, when known.
        entry: Option<String>,
        /// The read error.
        #[source]
        source: std::io::Error,
    },

    /// A sampler that cannot be built from the given arguments (weights, rank, world size...).
    #[error("invalid sampler configuration: {reason}")]
    SamplerConfig {
        /// What is wrong.
        reason: String,
    },

    /// A sampler order or draw larger than [`MAX_ORDER_LEN`](crate::sampler::MAX_ORDER_LEN), or whose size does
    /// not fit the arithmetic: refused before anything is allocated or computed.
    #[error("sampler order too large: {what} is {size}, above the limit of {limit}")]
    OrderTooLarge {
        /// What would have been allocated or computed (`order length`, `permutation`, `draws`...).
        what: &'static str,
        /// The size asked for (saturated at `u128::MAX`).
        size: u128,
        /// The limit it exceeds.
        limit: u128,
    },

    /// An object larger than the store's size cap, refused before it is read (or once the body passed the cap).
    #[error("{location}: object is {}, above the limit of {limit} bytes{hint}", size.map_or_else(|| "larger".to_owned(), |s| format!("{s} bytes")))]
    ObjectTooLarge {
        /// The object.
        location: String,
        /// Its size when known (from metadata or a header); `None` when the body ran past the cap.
        size: Option<u64>,
        /// The cap.
        limit: u64,
        /// How to raise the cap.
        hint: &'static str,
    },

    /// A local path that is not a regular file (a FIFO, a device, a socket): refused unless the store allows
    /// special files.
    #[error("{location} is not a regular file ({kind}); refused (allow special files with a byte limit to read it)")]
    NotRegularFile {
        /// The key's full path.
        location: String,
        /// What it is: `FIFO`, `character device`, `block device`, `socket`.
        kind: &'static str,
    },

    /// A key whose path leaves the store's root through a symbolic link.
    #[error(
        "{location} resolves to {target}, outside the store's root {root}; refused (the store does not follow links out of its root)"
    )]
    OutsideRoot {
        /// The key's path under the root.
        location: String,
        /// Where it resolves to.
        target: String,
        /// The store's root.
        root: String,
    },

    /// A saved sampler state that does not belong to this sampler.
    #[error("sampler state does not match this sampler: {reason}")]
    StateMismatch {
        /// Which field differs.
        reason: String,
    },

    /// An environment variable (`RANK`, `WORLD_SIZE`) with a value that cannot be used.
    #[error("environment variable {var}={value:?}: {reason}")]
    Env {
        /// The variable.
        var: &'static str,
        /// Its value.
        value: String,
        /// Why it cannot be used.
        reason: String,
    },

    /// A background task (a blocking file read, a parallel range read) was cancelled or panicked.
    #[error("background task for {location} did not complete: {reason}")]
    Task {
        /// What the task was reading.
        location: String,
        /// Cancelled or panicked.
        reason: String,
    },
}

impl SourceError {
    /// True when the object does not exist.
    pub fn is_not_found(&self) -> bool {
        matches!(self, SourceError::NotFound { .. })
    }

    pub(crate) fn io(operation: &'static str, path: impl Into<std::path::PathBuf>, source: std::io::Error) -> Self {
        let path = path.into();
        match source.kind() {
            // A directory is not an object.
            std::io::ErrorKind::NotFound | std::io::ErrorKind::IsADirectory => {
                SourceError::NotFound { location: path.display().to_string() }
            }
            std::io::ErrorKind::PermissionDenied => SourceError::PermissionDenied {
                location: path.display().to_string(),
                reason: source.to_string(),
                source: Some(Box::new(source)),
            },
            _ => SourceError::Io { operation, path, source },
        }
    }
}
