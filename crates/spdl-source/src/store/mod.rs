//! The [`ObjectStore`] trait, its options, and [`open_store`], which picks an implementation from an address.

use std::fmt;
use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures::future::BoxFuture;
use futures::stream::{BoxStream, StreamExt, TryStreamExt};

use crate::error::{Result, SourceError};

mod dedicated;
#[cfg(feature = "http")]
pub mod http;
pub mod local;
mod retry;
#[cfg(feature = "s3")]
pub mod s3;

pub use dedicated::DedicatedStore;
pub use retry::RetryPolicy;

/// What a store knows about one object.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ObjectMeta {
    /// The key, relative to the store's root (the same string `get` takes).
    pub key: String,
    /// Size in bytes.
    pub size: u64,
}

impl ObjectMeta {
    /// Metadata for `key` of `size` bytes.
    pub fn new(key: impl Into<String>, size: u64) -> Self {
        ObjectMeta { key: key.into(), size }
    }
}

/// How [`ObjectStore::get_parallel`] splits a large object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParallelRead {
    /// Bytes per range request. Objects no larger than this are read with one `get`.
    pub chunk_size: u64,
    /// Range requests in flight at once for this object (the store's own in-flight cap still applies).
    pub concurrency: usize,
}

impl Default for ParallelRead {
    /// 8 MiB chunks, 8 at a time.
    fn default() -> Self {
        ParallelRead { chunk_size: 8 << 20, concurrency: 8 }
    }
}

/// Where objects come from: a local directory, an HTTP(S) server, an S3 bucket, or your own store.
///
/// Keys are `/`-separated strings relative to the store's root (a directory, a base URL, a bucket and prefix).
/// Every method is async and cheap to call concurrently: implementations bound the requests in flight, time out
/// stalled connections and retry transient failures themselves, so a caller only sees the final outcome, and an
/// error names the object, the number of attempts and the last cause.
///
/// The trait is object safe (methods return boxed futures), so stores are usually passed around as
/// `Arc<dyn ObjectStore>`, which [`open_store`] returns. To implement it for your own store, return
/// `Box::pin(async move { ... })` from each method.
pub trait ObjectStore: Send + Sync + fmt::Debug {
    /// The full address of `key` (URL, `s3://` address or path), as used in error messages.
    fn location(&self, key: &str) -> String;

    /// Reads the whole object.
    fn get<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Bytes>>;

    /// Reads bytes `range.start..min(range.end, size)` of the object. An empty range (`start == end`) returns
    /// empty bytes; a non-empty range that starts at or past the end of the object (of an empty object too) is
    /// [`SourceError::InvalidRange`], as is `start > end`.
    fn get_range<'a>(&'a self, key: &'a str, range: Range<u64>) -> BoxFuture<'a, Result<Bytes>>;

    /// Returns the object's size without reading it.
    fn head<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<ObjectMeta>>;

    /// Streams every object whose key starts with `prefix` (a plain string prefix, as in S3), in lexicographic
    /// byte order of keys. Pages are fetched as the stream is polled.
    fn list<'a>(&'a self, prefix: &'a str) -> BoxStream<'a, Result<ObjectMeta>>;

    /// The largest object (and range) this store reads, when it has a cap (see
    /// [`StoreOptions::max_object_size`]). [`get_parallel`](ObjectStore::get_parallel) checks it before it
    /// allocates the joined buffer.
    fn max_object_size(&self) -> Option<u64> {
        None
    }

    /// Reads a large object as concurrent range requests and joins them into one contiguous buffer.
    ///
    /// Objects no larger than `opts.chunk_size` are read with a single [`get`](ObjectStore::get). An object
    /// above [`max_object_size`](ObjectStore::max_object_size) is refused before anything is allocated.
    fn get_parallel<'a>(&'a self, key: &'a str, opts: ParallelRead) -> BoxFuture<'a, Result<Bytes>> {
        Box::pin(async move {
            let size = self.head(key).await?.size;
            if let Some(limit) = self.max_object_size().filter(|&limit| size > limit) {
                return Err(SourceError::ObjectTooLarge {
                    location: self.location(key),
                    size: Some(size),
                    limit,
                    hint: " (raise the store's max_object_size to read it)",
                });
            }
            let chunk = opts.chunk_size.max(1);
            if size <= chunk {
                return self.get(key).await;
            }
            let ranges = (0..size.div_ceil(chunk)).map(|i| i * chunk..((i + 1) * chunk).min(size));
            let capacity = usize::try_from(size).map_err(|_| SourceError::InvalidRange {
                location: self.location(key),
                range: 0..size,
                size: Some(size),
            })?;
            let mut out = BytesMut::with_capacity(capacity);
            let mut parts = futures::stream::iter(ranges)
                .map(|range| async move {
                    let expected = range.end - range.start;
                    let part = self.get_range(key, range).await?;
                    if part.len() as u64 != expected {
                        return Err(SourceError::ShortBody {
                            location: self.location(key),
                            expected,
                            received: part.len() as u64,
                        });
                    }
                    Ok(part)
                })
                .buffered(opts.concurrency.max(1));
            // `buffered` yields in range order, so appending keeps the object's byte order.
            while let Some(part) = parts.try_next().await? {
                out.extend_from_slice(&part);
            }
            Ok(out.freeze())
        })
    }
}

impl<T: ObjectStore + ?Sized> ObjectStore for Arc<T> {
    fn location(&self, key: &str) -> String {
        (**self).location(key)
    }
    fn get<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Bytes>> {
        (**self).get(key)
    }
    fn get_range<'a>(&'a self, key: &'a str, range: Range<u64>) -> BoxFuture<'a, Result<Bytes>> {
        (**self).get_range(key, range)
    }
    fn head<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<ObjectMeta>> {
        (**self).head(key)
    }
    fn list<'a>(&'a self, prefix: &'a str) -> BoxStream<'a, Result<ObjectMeta>> {
        (**self).list(prefix)
    }
    fn max_object_size(&self) -> Option<u64> {
        (**self).max_object_size()
    }
    fn get_parallel<'a>(&'a self, key: &'a str, opts: ParallelRead) -> BoxFuture<'a, Result<Bytes>> {
        (**self).get_parallel(key, opts)
    }
}

/// S3 settings used by [`open_store_with`] for `s3://` addresses. Unset fields come from the standard AWS
/// chain (environment, `~/.aws/config`, instance metadata...).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct S3Options {
    /// Region, e.g. `us-east-1`. S3-compatible servers usually accept any.
    pub region: Option<String>,
    /// Custom endpoint for S3-compatible servers, e.g. `http://127.0.0.1:9000`.
    pub endpoint: Option<String>,
    /// Path-style addressing (`endpoint/bucket/key`). Default: on when `endpoint` is set, off otherwise.
    pub force_path_style: Option<bool>,
    /// Static access key and secret key. When unset, the standard AWS credential chain is used.
    pub credentials: Option<(String, String)>,
}

impl fmt::Debug for S3Options {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("S3Options")
            .field("region", &self.region)
            .field("endpoint", &self.endpoint)
            .field("force_path_style", &self.force_path_style)
            .field("credentials", &self.credentials.as_ref().map(|(k, _)| (k, "<secret>")))
            .finish()
    }
}

/// Default [`StoreOptions::max_object_size`]: 2 GiB.
pub const DEFAULT_MAX_OBJECT_SIZE: u64 = 2 << 30;

/// Default [`StoreOptions::attempt_timeout`]: 10 minutes for one request, body included.
pub const DEFAULT_ATTEMPT_TIMEOUT: Duration = Duration::from_secs(600);

/// Timeouts, retries, concurrency and size caps shared by every store. Build with [`StoreOptions::default`] and
/// the setters.
#[derive(Debug, Clone)]
pub struct StoreOptions {
    /// Time allowed to establish a connection.
    pub connect_timeout: Duration,
    /// Time allowed between two reads of a response (first byte included) before the attempt is abandoned. It
    /// restarts with each read, so a server that drips bytes is cut by `attempt_timeout` instead. For a local
    /// store, the longest wait for data from an allowed special file.
    pub read_timeout: Duration,
    /// Cap on a whole attempt: connect, headers and the whole body (`None`: no cap). Default
    /// [`DEFAULT_ATTEMPT_TIMEOUT`].
    pub attempt_timeout: Option<Duration>,
    /// The largest object or range a store reads, in bytes. A larger object is refused with
    /// [`SourceError::ObjectTooLarge`] from its metadata or stated size before it is read; a body that runs past
    /// the cap (no size stated, or a wrong one) is cut there with the same error. Default
    /// [`DEFAULT_MAX_OBJECT_SIZE`].
    pub max_object_size: u64,
    /// Local stores only: follow symbolic links that lead out of the root (default `false`: such keys are refused
    /// with [`SourceError::OutsideRoot`] and left out of listings).
    pub follow_links_outside_root: bool,
    /// Local stores only: read FIFOs, devices and sockets, up to this many bytes (default `None`: refused with
    /// [`SourceError::NotRegularFile`]).
    pub special_file_limit: Option<u64>,
    /// Retries of transient failures.
    pub retry: RetryPolicy,
    /// Requests in flight at once per store; further requests wait for a slot.
    pub max_in_flight: usize,
    /// S3 settings for `s3://` addresses.
    pub s3: S3Options,
}

impl Default for StoreOptions {
    /// Connect 10 s, read 30 s, attempts capped at [`DEFAULT_ATTEMPT_TIMEOUT`], [`RetryPolicy::default`], 64
    /// requests in flight, objects up to [`DEFAULT_MAX_OBJECT_SIZE`], local stores confined to their root and
    /// refusing special files.
    fn default() -> Self {
        StoreOptions {
            connect_timeout: Duration::from_secs(10),
            read_timeout: Duration::from_secs(30),
            attempt_timeout: Some(DEFAULT_ATTEMPT_TIMEOUT),
            max_object_size: DEFAULT_MAX_OBJECT_SIZE,
            follow_links_outside_root: false,
            special_file_limit: None,
            retry: RetryPolicy::default(),
            max_in_flight: 64,
            s3: S3Options::default(),
        }
    }
}

impl StoreOptions {
    /// Sets the connect timeout.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }
    /// Sets the read timeout (also the longest wait for the first byte).
    pub fn read_timeout(mut self, timeout: Duration) -> Self {
        self.read_timeout = timeout;
        self
    }
    /// Caps each attempt as a whole (connect, headers and body).
    pub fn attempt_timeout(mut self, timeout: Duration) -> Self {
        self.attempt_timeout = Some(timeout);
        self
    }
    /// Removes the cap on a whole attempt: only the connect and read timeouts bound it.
    pub fn no_attempt_timeout(mut self) -> Self {
        self.attempt_timeout = None;
        self
    }
    /// Sets the largest object or range a store reads, in bytes.
    pub fn max_object_size(mut self, bytes: u64) -> Self {
        self.max_object_size = bytes;
        self
    }
    /// Lets a local store follow symbolic links out of its root.
    pub fn follow_links_outside_root(mut self, follow: bool) -> Self {
        self.follow_links_outside_root = follow;
        self
    }
    /// Lets a local store read FIFOs, devices and sockets, up to `limit` bytes each (`None` refuses them).
    pub fn special_file_limit(mut self, limit: Option<u64>) -> Self {
        self.special_file_limit = limit;
        self
    }
    /// Sets the retry policy.
    pub fn retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }
    /// Sets the number of requests in flight per store (at least 1).
    pub fn max_in_flight(mut self, n: usize) -> Self {
        self.max_in_flight = n.max(1);
        self
    }
    /// Sets the S3 options.
    pub fn s3(mut self, s3: S3Options) -> Self {
        self.s3 = s3;
        self
    }
}

/// Opens a store from an address with [`StoreOptions::default`]; see [`open_store_with`].
pub async fn open_store(url: &str) -> Result<Arc<dyn ObjectStore>> {
    open_store_with(url, &StoreOptions::default()).await
}

/// Opens the store an address names:
///
/// - `s3://bucket` or `s3://bucket/prefix` → `S3Store` (feature `s3`),
/// - `http://host/path` or `https://host/path` → `HttpStore` (feature `http`),
/// - `file:///abs/dir`, `/abs/dir` or `relative/dir` → [`LocalStore`](local::LocalStore).
///
/// An address whose store is compiled out returns [`SourceError::FeatureDisabled`].
pub async fn open_store_with(url: &str, opts: &StoreOptions) -> Result<Arc<dyn ObjectStore>> {
    match Address::parse(url)? {
        Address::Local(path) => Ok(Arc::new(local::LocalStore::with_options(path, opts)?)),
        Address::Http => open_http(url, opts),
        Address::S3 { bucket, prefix } => open_s3(url, bucket, prefix, opts).await,
    }
}

#[cfg(feature = "http")]
fn open_http(url: &str, opts: &StoreOptions) -> Result<Arc<dyn ObjectStore>> {
    Ok(Arc::new(http::HttpStore::with_options(url, opts)?))
}

#[cfg(not(feature = "http"))]
fn open_http(url: &str, _opts: &StoreOptions) -> Result<Arc<dyn ObjectStore>> {
    Err(SourceError::FeatureDisabled { url: url.to_owned(), feature: "http" })
}

#[cfg(feature = "s3")]
async fn open_s3(_url: &str, bucket: String, prefix: String, opts: &StoreOptions) -> Result<Arc<dyn ObjectStore>> {
    Ok(Arc::new(s3::S3Store::connect(bucket, prefix, opts).await?))
}

#[cfg(not(feature = "s3"))]
async fn open_s3(url: &str, _bucket: String, _prefix: String, _opts: &StoreOptions) -> Result<Arc<dyn ObjectStore>> {
    Err(SourceError::FeatureDisabled { url: url.to_owned(), feature: "s3" })
}

/// A parsed store address.
#[derive(Debug, PartialEq, Eq)]
enum Address {
    Local(std::path::PathBuf),
    Http,
    S3 { bucket: String, prefix: String },
}

impl Address {
    fn parse(url: &str) -> Result<Address> {
        let invalid = |reason: &str| SourceError::InvalidUrl { url: url.to_owned(), reason: reason.to_owned() };
        let Some((scheme, rest)) = url.split_once("://") else {
            if url.is_empty() {
                return Err(invalid("empty address"));
            }
            return Ok(Address::Local(url.into()));
        };
        if scheme.is_empty() || !scheme.chars().all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c)) {
            // Not a scheme (e.g. a local path that happens to contain "://").
            return Ok(Address::Local(url.into()));
        }
        match scheme.to_ascii_lowercase().as_str() {
            "s3" => {
                let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
                if bucket.is_empty() {
                    return Err(invalid("no bucket name after s3://"));
                }
                Ok(Address::S3 { bucket: bucket.to_owned(), prefix: prefix.to_owned() })
            }
            "http" | "https" => {
                if rest.is_empty() || rest.starts_with('/') {
                    return Err(invalid("no host in the URL"));
                }
                Ok(Address::Http)
            }
            "file" => {
                // file:///abs/path (empty authority) or file://localhost/abs/path.
                let path = rest.strip_prefix("localhost").unwrap_or(rest);
                if !path.starts_with('/') {
                    return Err(invalid("file:// URLs need an absolute path (file:///dir)"));
                }
                Ok(Address::Local(percent_decode(path).ok_or_else(|| invalid("bad percent-encoding"))?.into()))
            }
            other => Err(invalid(&format!("unsupported scheme {other:?} (use s3://, http(s)://, file:// or a path)"))),
        }
    }
}

/// Decodes `%XX` escapes in a `file://` path.
fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        if b == b'%' {
            let hex = bytes.get(i + 1..i + 3)?;
            let hex = std::str::from_utf8(hex).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// The in-flight limiter of a store: `n` slots, at least 1 and at most what a tokio semaphore holds.
pub(crate) fn limiter(n: usize) -> Arc<tokio::sync::Semaphore> {
    Arc::new(tokio::sync::Semaphore::new(n.clamp(1, tokio::sync::Semaphore::MAX_PERMITS)))
}

/// Checks a range against a known object size and clamps its end, the same way for every store.
pub(crate) fn clamp_range(location: impl FnOnce() -> String, range: Range<u64>, size: u64) -> Result<Range<u64>> {
    if range.start > range.end || (range.start >= size && range.start < range.end) {
        return Err(SourceError::InvalidRange { location: location(), range, size: Some(size) });
    }
    Ok(range.start..range.end.min(size))
}

/// Rejects a range whose start is after its end before any request is made.
pub(crate) fn check_range_order(location: impl FnOnce() -> String, range: &Range<u64>) -> Result<()> {
    if range.start > range.end {
        return Err(SourceError::InvalidRange { location: location(), range: range.clone(), size: None });
    }
    Ok(())
}

/// Checks the body of a ranged GET, the same way for every store: it must be non-empty, no longer than the
/// range, and start where asked; `span` is the `(first, last)` byte positions the response's Content-Range
/// names, each when known. `Err` is the reason a retry is due (a server or proxy that answered another range).
#[cfg(any(feature = "http", feature = "s3", test))]
pub(crate) fn check_range_body(range: &Range<u64>, span: (Option<u64>, Option<u64>), len: usize) -> Result<(), String> {
    let len = len as u64;
    let (first, last) = span;
    let fits = len > 0 && len <= range.end - range.start;
    let starts = first.is_none_or(|f| f == range.start);
    // An inclusive last position must agree with the body's length.
    let ends = match (first, last) {
        (Some(f), Some(l)) => l.checked_sub(f).is_some_and(|d| d + 1 == len),
        _ => true,
    };
    if fits && starts && ends {
        Ok(())
    } else {
        Err(format!(
            "asked for bytes {}..{}, got {len} bytes (Content-Range {first:?}-{last:?})",
            range.start, range.end
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn range_bodies_are_checked_alike() {
        let r = 10..20;
        assert!(check_range_body(&r, (Some(10), Some(19)), 10).is_ok());
        assert!(check_range_body(&r, (None, None), 4).is_ok()); // clipped at the object's end
        assert!(check_range_body(&r, (Some(10), None), 10).is_ok());
        assert!(check_range_body(&r, (Some(0), Some(9)), 10).is_err()); // another range
        assert!(check_range_body(&r, (Some(10), Some(14)), 10).is_err()); // length disagrees
        assert!(check_range_body(&r, (None, None), 11).is_err()); // too long
        assert!(check_range_body(&r, (None, None), 0).is_err()); // empty
    }

    #[test]
    fn parses_addresses() {
        assert_eq!(
            Address::parse("s3://bucket/some/prefix").unwrap(),
            Address::S3 { bucket: "bucket".into(), prefix: "some/prefix".into() }
        );
        assert_eq!(Address::parse("s3://bucket").unwrap(), Address::S3 { bucket: "bucket".into(), prefix: "".into() });
        assert_eq!(Address::parse("https://host/path").unwrap(), Address::Http);
        assert_eq!(Address::parse("HTTP://host").unwrap(), Address::Http);
        assert_eq!(Address::parse("/data/imagenet").unwrap(), Address::Local("/data/imagenet".into()));
        assert_eq!(Address::parse("rel/dir").unwrap(), Address::Local("rel/dir".into()));
        assert_eq!(Address::parse("file:///data/my%20set").unwrap(), Address::Local("/data/my set".into()));
        assert_eq!(Address::parse("file://localhost/data").unwrap(), Address::Local("/data".into()));
        for bad in ["", "s3://", "s3:///key", "gs://bucket", "file://relative", "https://", "file:///bad%zz"] {
            assert!(matches!(Address::parse(bad), Err(SourceError::InvalidUrl { .. })), "{bad}");
        }
    }

    #[test]
    fn clamps_ranges() {
        let loc = || "x".to_string();
        assert_eq!(clamp_range(loc, 2..10, 5).unwrap(), 2..5);
        assert_eq!(clamp_range(loc, 0..0, 0).unwrap(), 0..0);
        assert_eq!(clamp_range(loc, 5..5, 5).unwrap(), 5..5);
        assert!(clamp_range(loc, 5..6, 5).is_err());
        #[allow(clippy::reversed_empty_ranges)]
        let reversed = 4..2;
        assert!(clamp_range(loc, reversed, 5).is_err());
    }

    #[tokio::test]
    async fn disabled_features_are_named() {
        #[cfg(not(feature = "s3"))]
        {
            let err = open_store("s3://bucket/prefix").await.unwrap_err();
            assert!(matches!(err, SourceError::FeatureDisabled { feature: "s3", .. }), "{err}");
        }
        #[cfg(not(feature = "http"))]
        {
            let err = open_store("https://example.invalid/data").await.unwrap_err();
            assert!(matches!(err, SourceError::FeatureDisabled { feature: "http", .. }), "{err}");
        }
    }
}
