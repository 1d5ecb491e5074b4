//! [`HttpStore`]: objects under a base URL, read with plain GETs (reqwest, rustls).

use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::future::BoxFuture;
use futures::stream::BoxStream;
use reqwest::header::{CONTENT_LENGTH, CONTENT_RANGE, HeaderMap, RANGE};
use reqwest::{StatusCode, Url};
use tokio::sync::Semaphore;

use super::retry::{Failure, with_retry};
use super::{ObjectMeta, ObjectStore, RetryPolicy, StoreOptions, check_range_order};
use crate::error::{Result, SourceError};
use crate::walk::check_relative;

/// Objects are `base_url/key`; ranges use the `Range` header. A server that ignores it still works: its whole-object
/// answer is read only up to the end of the range, keeping only the range, and refused when that would transfer
/// more than [`StoreOptions::max_object_size`].
///
/// Costs are bounded before they are paid: a body is streamed, never buffered whole on trust, and cut at its
/// stated size (`Content-Length`, or the range asked for) or, when no size is stated, at
/// [`StoreOptions::max_object_size`]; a stated size over that cap is refused from the header
/// ([`SourceError::ObjectTooLarge`], not retried). [`StoreOptions::attempt_timeout`] caps each attempt as a whole,
/// body included, so a server that drips one byte per read timeout cannot hold a request forever; redirects are
/// followed at most 10 times.
///
/// HTTP has no standard listing, so [`ObjectStore::list`] returns [`SourceError::Unsupported`]: list the keys in
/// a manifest instead (see [`crate::Dataset::parse_manifest`]). Keys are percent-encoded per path segment; a
/// query string on the base URL (e.g. a token) is kept on every request.
#[derive(Debug, Clone)]
pub struct HttpStore {
    base: Url,
    client: reqwest::Client,
    retry: RetryPolicy,
    attempt_timeout: Option<Duration>,
    max_object_size: u64,
    limiter: Arc<Semaphore>,
}

impl HttpStore {
    /// A store under `base_url` (`http://` or `https://`) with default options.
    pub fn new(base_url: &str) -> Result<Self> {
        Self::with_options(base_url, &StoreOptions::default())
    }

    /// A store under `base_url` with the given timeouts, retries and in-flight cap.
    pub fn with_options(base_url: &str, opts: &StoreOptions) -> Result<Self> {
        let invalid = |reason: String| SourceError::InvalidUrl { url: base_url.to_owned(), reason };
        let base = Url::parse(base_url).map_err(|e| invalid(e.to_string()))?;
        if !matches!(base.scheme(), "http" | "https") || base.cannot_be_a_base() {
            return Err(invalid("expected an http:// or https:// URL".into()));
        }
        let client = reqwest::Client::builder()
            .connect_timeout(opts.connect_timeout)
            .read_timeout(opts.read_timeout)
            .pool_max_idle_per_host(opts.max_in_flight)
            .redirect(reqwest::redirect::Policy::limited(10))
            .build()
            .map_err(|e| SourceError::Config {
                store: "HTTP",
                reason: spdl_report::error_chain(&e),
                source: Some(Box::new(e)),
            })?;
        Ok(HttpStore {
            base,
            client,
            retry: opts.retry.clone(),
            attempt_timeout: opts.attempt_timeout,
            max_object_size: opts.max_object_size,
            limiter: super::limiter(opts.max_in_flight),
        })
    }

    /// The URL of `key`.
    pub fn url_of(&self, key: &str) -> Result<Url> {
        check_relative(key, false)?;
        let mut url = self.base.clone();
        {
            let Ok(mut segments) = url.path_segments_mut() else {
                return Err(SourceError::InvalidUrl { url: self.base.to_string(), reason: "not a base URL".into() });
            };
            segments.pop_if_empty();
            segments.extend(key.split('/').filter(|s| !s.is_empty() && *s != "."));
        }
        Ok(url)
    }

    async fn run<T, F, Fut>(&self, operation: &'static str, key: &str, attempt: F) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = std::result::Result<T, Failure>>,
    {
        let location = || self.location(key);
        with_retry(&self.retry, &self.limiter, self.attempt_timeout, operation, &location, attempt).await
    }
}

/// Classifies a transport error: everything on the wire (connect, reset, timeout, truncated body) is transient;
/// a malformed request or a redirect loop is not.
fn transport(err: reqwest::Error) -> Failure {
    if err.is_builder() || err.is_redirect() { Failure::fatal(err) } else { Failure::transient(err) }
}

/// Classifies a non-success status.
fn status_failure(status: StatusCode, location: impl FnOnce() -> String, range: Option<&Range<u64>>) -> Failure {
    let reason = format!("HTTP {status}");
    match status.as_u16() {
        404 | 410 => Failure::NotFound,
        401 | 403 => Failure::Denied { reason, source: None },
        416 => Failure::Done(SourceError::InvalidRange {
            location: location(),
            range: range.cloned().unwrap_or(0..0),
            size: None,
        }),
        408 | 425 | 429 => Failure::Transient { reason, source: None },
        501 | 505 => Failure::Fatal { reason, source: None },
        500..=599 => Failure::Transient { reason, source: None },
        _ => Failure::Fatal { reason, source: None },
    }
}

fn header_u64(headers: &HeaderMap, name: reqwest::header::HeaderName) -> Option<u64> {
    headers.get(name)?.to_str().ok()?.trim().parse().ok()
}

/// Parses `bytes START-END/TOTAL` (TOTAL may be `*`).
fn content_range(headers: &HeaderMap) -> Option<(u64, u64, Option<u64>)> {
    let value = headers.get(CONTENT_RANGE)?.to_str().ok()?.trim();
    let rest = value.strip_prefix("bytes ")?;
    let (span, total) = rest.split_once('/')?;
    let (start, end) = span.split_once('-')?;
    Some((start.trim().parse().ok()?, end.trim().parse().ok()?, total.trim().parse().ok()))
}

/// The error for an object over the size cap.
fn too_large(location: String, size: Option<u64>, limit: u64) -> Failure {
    Failure::Done(SourceError::ObjectTooLarge {
        location,
        size,
        limit,
        hint: " (raise the store's max_object_size to read it)",
    })
}

/// What [`read_body`] received.
struct Body {
    /// The bytes inside the window asked for.
    kept: Bytes,
    /// Bytes received in all.
    seen: u64,
    /// The body went on past the window's end (and was not received further).
    overran: bool,
}

/// Reads a response body chunk by chunk, keeping bytes `keep.start..keep.end` of it (positions in the body) and
/// stopping as soon as it passes `keep.end`: nothing much past it is received.
async fn read_body(mut resp: reqwest::Response, keep: Range<u64>) -> std::result::Result<Body, Failure> {
    // Grows with the data: a stated size is not trusted with an allocation.
    let initial = usize::try_from((keep.end - keep.start).min(1 << 20)).unwrap_or(1 << 20);
    let mut out = bytes::BytesMut::with_capacity(initial);
    let mut seen: u64 = 0;
    while let Some(chunk) = resp.chunk().await.map_err(transport)? {
        let len = chunk.len() as u64;
        let (from, to) = (seen, seen.saturating_add(len));
        // The part of this chunk inside `keep`, as offsets into the chunk (both within `chunk.len()`).
        let lo = keep.start.clamp(from, to) - from;
        let hi = keep.end.clamp(from, to) - from;
        if let Some(part) = chunk.get(lo as usize..hi as usize) {
            out.extend_from_slice(part);
        }
        seen = to;
        if seen > keep.end {
            return Ok(Body { kept: out.freeze(), seen, overran: true });
        }
    }
    Ok(Body { kept: out.freeze(), seen, overran: false })
}

impl ObjectStore for HttpStore {
    fn location(&self, key: &str) -> String {
        match self.url_of(key) {
            Ok(url) => url.to_string(),
            Err(_) => format!("{}/{key}", self.base.as_str().trim_end_matches('/')),
        }
    }

    fn max_object_size(&self) -> Option<u64> {
        Some(self.max_object_size)
    }

    fn get<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Bytes>> {
        Box::pin(async move {
            let url = self.url_of(key)?;
            self.run("GET", key, || async {
                let resp = self.client.get(url.clone()).send().await.map_err(transport)?;
                let status = resp.status();
                if !status.is_success() {
                    return Err(status_failure(status, || self.location(key), None));
                }
                let expected = header_u64(resp.headers(), CONTENT_LENGTH);
                if let Some(size) = expected.filter(|&n| n > self.max_object_size) {
                    return Err(too_large(self.location(key), Some(size), self.max_object_size));
                }
                // Cut at the stated size, or at the cap when none is stated (chunked).
                let cap = expected.unwrap_or(self.max_object_size);
                let body = read_body(resp, 0..cap).await?;
                if body.overran {
                    if expected.is_none() {
                        return Err(too_large(self.location(key), None, self.max_object_size));
                    }
                    return Err(Failure::Transient {
                        reason: format!("expected {cap} bytes, the body went on past {}", body.seen),
                        source: None,
                    });
                }
                let body = body.kept;
                // hyper already rejects a body shorter than its Content-Length; this guards odd proxies.
                if let Some(expected) = expected.filter(|&n| n != body.len() as u64) {
                    return Err(Failure::Transient {
                        reason: format!("expected {expected} bytes, received {}", body.len()),
                        source: None,
                    });
                }
                Ok(body)
            })
            .await
        })
    }

    fn get_range<'a>(&'a self, key: &'a str, range: Range<u64>) -> BoxFuture<'a, Result<Bytes>> {
        Box::pin(async move {
            let url = self.url_of(key)?;
            check_range_order(|| self.location(key), &range)?;
            if range.start == range.end {
                return Ok(Bytes::new());
            }
            let header = format!("bytes={}-{}", range.start, range.end - 1);
            self.run("GET range", key, || async {
                let resp = self.client.get(url.clone()).header(RANGE, &header).send().await.map_err(transport)?;
                let status = resp.status();
                if !status.is_success() {
                    return Err(status_failure(status, || self.location(key), Some(&range)));
                }
                let partial = status == StatusCode::PARTIAL_CONTENT;
                let span = content_range(resp.headers());
                if !partial {
                    // The server ignored Range and sends the whole object: read it up to the range's end only,
                    // keeping the range, unless even that is more than the cap allows.
                    let stated = header_u64(resp.headers(), CONTENT_LENGTH);
                    let end = stated.map_or(range.end, |n| n.min(range.end));
                    if end > self.max_object_size {
                        return Err(Failure::Done(SourceError::Request {
                            operation: "GET range",
                            location: self.location(key),
                            attempts: 1,
                            reason: format!(
                                "the server ignored Range and sends the whole object; reading it up to byte {end} \
                                 would pass the store's max_object_size of {} bytes",
                                self.max_object_size
                            ),
                            source: None,
                        }));
                    }
                    let body = read_body(resp, range.clone()).await?;
                    if !body.overran {
                        // The object ended first: its size is known now, and the range is checked against it.
                        super::clamp_range(|| self.location(key), range.clone(), body.seen).map_err(Failure::Done)?;
                    }
                    return Ok(body.kept);
                }
                let want = range.end - range.start;
                let cap = want.min(self.max_object_size);
                let body = read_body(resp, 0..cap).await?;
                if body.overran {
                    if cap < want {
                        return Err(too_large(self.location(key), None, self.max_object_size));
                    }
                    return Err(Failure::Transient {
                        reason: format!("asked for {want} bytes, the body went on past {}", body.seen),
                        source: None,
                    });
                }
                let body = body.kept;
                super::check_range_body(&range, span.map_or((None, None), |(f, l, _)| (Some(f), Some(l))), body.len())
                    .map_err(|reason| Failure::Transient { reason, source: None })?;
                Ok(body)
            })
            .await
        })
    }

    fn head<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<ObjectMeta>> {
        Box::pin(async move {
            let url = self.url_of(key)?;
            let size = self
                .run("HEAD", key, || async {
                    let resp = self.client.head(url.clone()).send().await.map_err(transport)?;
                    let status = resp.status();
                    if !status.is_success() {
                        return Err(status_failure(status, || self.location(key), None));
                    }
                    if let Some(size) = header_u64(resp.headers(), CONTENT_LENGTH) {
                        return Ok(size);
                    }
                    // No length on HEAD (e.g. chunked): ask for one byte and read the total from Content-Range.
                    let resp =
                        self.client.get(url.clone()).header(RANGE, "bytes=0-0").send().await.map_err(transport)?;
                    let status = resp.status();
                    if status == StatusCode::RANGE_NOT_SATISFIABLE {
                        return Ok(0);
                    }
                    if !status.is_success() {
                        return Err(status_failure(status, || self.location(key), None));
                    }
                    match content_range(resp.headers()).and_then(|(_, _, total)| total) {
                        Some(total) => Ok(total),
                        None => {
                            Err(Failure::Fatal { reason: "the server reports no object size".into(), source: None })
                        }
                    }
                })
                .await?;
            Ok(ObjectMeta::new(key, size))
        })
    }

    fn list<'a>(&'a self, _prefix: &'a str) -> BoxStream<'a, Result<ObjectMeta>> {
        let err = SourceError::Unsupported { store: self.base.to_string(), operation: "list (HTTP has no listing)" };
        Box::pin(futures::stream::iter([Err(err)]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_joined_and_encoded() {
        let s = HttpStore::new("https://host/data/?token=abc").unwrap();
        assert_eq!(s.url_of("a b/c#1.jpg").unwrap().as_str(), "https://host/data/a%20b/c%231.jpg?token=abc");
        let s = HttpStore::new("http://host:8080/data").unwrap();
        assert_eq!(s.location("x/y.jpg"), "http://host:8080/data/x/y.jpg");
        assert!(matches!(s.url_of("../x"), Err(SourceError::InvalidKey { .. })));
        assert!(HttpStore::new("ftp://host/x").is_err());
        assert!(HttpStore::new("not a url").is_err());
    }

    #[test]
    fn statuses_are_classified() {
        let loc = || "u".to_string();
        assert!(matches!(status_failure(StatusCode::NOT_FOUND, loc, None), Failure::NotFound));
        assert!(matches!(status_failure(StatusCode::FORBIDDEN, loc, None), Failure::Denied { .. }));
        assert!(matches!(status_failure(StatusCode::SERVICE_UNAVAILABLE, loc, None), Failure::Transient { .. }));
        assert!(matches!(status_failure(StatusCode::TOO_MANY_REQUESTS, loc, None), Failure::Transient { .. }));
        assert!(matches!(status_failure(StatusCode::BAD_REQUEST, loc, None), Failure::Fatal { .. }));
        assert!(matches!(status_failure(StatusCode::RANGE_NOT_SATISFIABLE, loc, None), Failure::Done(_)));
    }

    #[test]
    fn parses_content_range() {
        let mut h = HeaderMap::new();
        h.insert(CONTENT_RANGE, "bytes 10-19/100".parse().unwrap());
        assert_eq!(content_range(&h), Some((10, 19, Some(100))));
        h.insert(CONTENT_RANGE, "bytes 0-0/*".parse().unwrap());
        assert_eq!(content_range(&h), Some((0, 0, None)));
    }
}
