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

/// Objects are `base_url/key`; ranges use the `Range` header (a server that ignores it still works, at the cost
/// of the full transfer).
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
            .build()
            .map_err(|e| SourceError::Config { store: "HTTP", reason: e.to_string(), source: Some(Box::new(e)) })?;
        Ok(HttpStore {
            base,
            client,
            retry: opts.retry.clone(),
            attempt_timeout: opts.attempt_timeout,
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

impl ObjectStore for HttpStore {
    fn location(&self, key: &str) -> String {
        match self.url_of(key) {
            Ok(url) => url.to_string(),
            Err(_) => format!("{}/{key}", self.base.as_str().trim_end_matches('/')),
        }
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
                let body = resp.bytes().await.map_err(transport)?;
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
                let body = resp.bytes().await.map_err(transport)?;
                if !partial {
                    // The server ignored Range and sent the whole object: cut the range out of it.
                    let size = body.len() as u64;
                    let clamped =
                        super::clamp_range(|| self.location(key), range.clone(), size).map_err(Failure::Done)?;
                    // Both bounds are within `body.len()`, a usize.
                    return Ok(body.slice(clamped.start as usize..clamped.end as usize));
                }
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
