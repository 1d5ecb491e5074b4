//! [`S3Store`]: objects in an S3 bucket (or an S3-compatible server) under a prefix, read with aws-sdk-s3.

use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use aws_sdk_s3::config::retry::RetryConfig;
use aws_sdk_s3::config::timeout::TimeoutConfig;
use aws_sdk_s3::config::{BehaviorVersion, Credentials, Region};
use aws_sdk_s3::error::{ProvideErrorMetadata, SdkError};
use bytes::Bytes;
use futures::future::BoxFuture;
use futures::stream::{BoxStream, StreamExt, TryStreamExt};
use tokio::sync::Semaphore;

use super::retry::{Failure, with_retry};
use super::{ObjectMeta, ObjectStore, RetryPolicy, StoreOptions, check_range_order};
use crate::error::{Result, SourceError};

/// The AWS SDK this store is built on, for callers that need the raw [`aws_sdk_s3::Client`] (see
/// [`S3Store::client`]).
pub use aws_sdk_s3;

/// Region used when neither the options nor the AWS chain name one.
const FALLBACK_REGION: &str = "us-east-1";

/// Objects are `s3://bucket/prefix/key`.
///
/// Credentials, region and endpoint come from [`StoreOptions::s3`] when set, otherwise from the standard AWS
/// chain (`AWS_ACCESS_KEY_ID`, `AWS_PROFILE`, `AWS_REGION`, `AWS_ENDPOINT_URL`, `~/.aws/config`, SSO, instance
/// metadata...). The SDK's own retries are turned off: this store retries with [`StoreOptions::retry`], so that
/// every store counts attempts and reports errors the same way. Bodies are streamed and cut at
/// [`StoreOptions::max_object_size`]; an object whose stated size is above it is refused before its body is read.
#[derive(Debug, Clone)]
pub struct S3Store {
    client: aws_sdk_s3::Client,
    bucket: String,
    /// Without leading or trailing `/`; empty for the whole bucket.
    prefix: String,
    retry: RetryPolicy,
    attempt_timeout: Option<Duration>,
    max_object_size: u64,
    limiter: Arc<Semaphore>,
    page_size: i32,
}

impl S3Store {
    /// Connects to `bucket`, scoped to `prefix` (may be empty), resolving credentials and region as described on
    /// the type. No request is made until the first read.
    pub async fn connect(bucket: impl Into<String>, prefix: impl Into<String>, opts: &StoreOptions) -> Result<Self> {
        let s3 = &opts.s3;
        let timeouts =
            TimeoutConfig::builder().connect_timeout(opts.connect_timeout).read_timeout(opts.read_timeout).build();
        let mut loader = aws_config::defaults(BehaviorVersion::latest())
            .timeout_config(timeouts)
            .retry_config(RetryConfig::disabled());
        if let Some(region) = &s3.region {
            loader = loader.region(Region::new(region.clone()));
        }
        if let Some(endpoint) = &s3.endpoint {
            loader = loader.endpoint_url(endpoint.clone());
        }
        if let Some((access_key, secret_key)) = &s3.credentials {
            loader = loader.credentials_provider(Credentials::new(
                access_key,
                secret_key,
                None,
                None,
                "spdl-source options",
            ));
        }
        let shared = loader.load().await;
        let mut config = aws_sdk_s3::config::Builder::from(&shared)
            .force_path_style(s3.force_path_style.unwrap_or(s3.endpoint.is_some()));
        if shared.region().is_none() {
            config = config.region(Region::new(FALLBACK_REGION));
        }
        Ok(Self::from_client(aws_sdk_s3::Client::from_conf(config.build()), bucket, prefix, opts))
    }

    /// A store over an already configured client (your own retry, proxy or credential setup). Only the retry
    /// policy, attempt timeout and in-flight cap of `opts` apply.
    pub fn from_client(
        client: aws_sdk_s3::Client,
        bucket: impl Into<String>,
        prefix: impl Into<String>,
        opts: &StoreOptions,
    ) -> Self {
        S3Store {
            client,
            bucket: bucket.into(),
            prefix: prefix.into().trim_matches('/').to_owned(),
            retry: opts.retry.clone(),
            attempt_timeout: opts.attempt_timeout,
            max_object_size: opts.max_object_size,
            limiter: super::limiter(opts.max_in_flight),
            page_size: 1000,
        }
    }

    /// Keys per `ListObjectsV2` page (1 to 1000; S3's maximum and default is 1000).
    pub fn with_page_size(mut self, page_size: usize) -> Self {
        self.page_size = i32::try_from(page_size.clamp(1, 1000)).unwrap_or(1000);
        self
    }

    /// The underlying SDK client, e.g. to create buckets or write objects in tests.
    pub fn client(&self) -> &aws_sdk_s3::Client {
        &self.client
    }

    /// The bucket.
    pub fn bucket(&self) -> &str {
        &self.bucket
    }

    /// The object key in the bucket for a store key (the prefix joined with `/`).
    pub fn object_key(&self, key: &str) -> String {
        if self.prefix.is_empty() { key.to_owned() } else { format!("{}/{key}", self.prefix) }
    }

    /// Writes an object (one `PutObject`, retried like reads). spdl-source is a reader; this is for preparing
    /// data sets, test fixtures and small outputs.
    pub async fn put(&self, key: &str, data: Bytes) -> Result<()> {
        check_key(key)?;
        let object_key = self.object_key(key);
        self.run("PUT", key, || async {
            self.client
                .put_object()
                .bucket(&self.bucket)
                .key(&object_key)
                .body(data.clone().into())
                .send()
                .await
                .map_err(classify)?;
            Ok(())
        })
        .await
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

fn check_key(key: &str) -> Result<()> {
    if key.is_empty() {
        return Err(SourceError::InvalidKey { key: String::new(), reason: "empty key" });
    }
    Ok(())
}

/// S3 error codes that mean "slow down" or "try again".
const TRANSIENT_CODES: [&str; 8] = [
    "SlowDown",
    "Throttling",
    "ThrottlingException",
    "RequestTimeout",
    "RequestTimeTooSkewed",
    "InternalError",
    "ServiceUnavailable",
    "RequestLimitExceeded",
];

/// Classifies an SDK error: wire failures, timeouts, 5xx and throttling are transient; 404 and 403 are final.
fn classify<E>(err: SdkError<E>) -> Failure
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    let reason = render(&err);
    let status = status_of(&err);
    let code = match &err {
        SdkError::ServiceError(service) => service.err().code().unwrap_or("").to_owned(),
        _ => String::new(),
    };
    let transient = match &err {
        SdkError::ServiceError(_) | SdkError::ResponseError(_) => None,
        SdkError::DispatchFailure(dispatch) => Some(!dispatch.is_user()),
        SdkError::ConstructionFailure(_) => Some(false),
        // Timeouts, and any future SDK variant: worth another try.
        _ => Some(true),
    };
    let source: Option<crate::error::BoxError> = Some(Box::new(err));
    if let Some(transient) = transient {
        return if transient { Failure::Transient { reason, source } } else { Failure::Fatal { reason, source } };
    }
    match status {
        Some(404) => Failure::NotFound,
        _ if code == "NoSuchKey" || code == "NotFound" => Failure::NotFound,
        Some(401 | 403) => Failure::Denied { reason, source },
        Some(408 | 429) | Some(500..=599) => Failure::Transient { reason, source },
        _ if TRANSIENT_CODES.contains(&code.as_str()) => Failure::Transient { reason, source },
        // A response that failed to parse (truncated XML after a reset): worth another try.
        None => Failure::Transient { reason, source },
        _ => Failure::Fatal { reason, source },
    }
}

/// The HTTP status of a failed response, when there was one.
fn status_of<E>(err: &SdkError<E>) -> Option<u16> {
    match err {
        SdkError::ServiceError(service) => Some(service.raw().status().as_u16()),
        SdkError::ResponseError(response) => Some(response.raw().status().as_u16()),
        _ => None,
    }
}

/// `HTTP 403 SignatureDoesNotMatch: message` for service errors (the SDK's own text is a generic "service
/// error"); the chain of causes for the rest.
fn render<E>(err: &SdkError<E>) -> String
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
{
    match err {
        SdkError::ServiceError(service) => {
            let status = service.raw().status().as_u16();
            let code = service.err().code().unwrap_or("unknown error");
            match service.err().message() {
                Some(message) => format!("HTTP {status} {code}: {message}"),
                None => format!("HTTP {status} {code}"),
            }
        }
        _ => spdl_report::error_chain(err),
    }
}

/// Parses `bytes START-END/TOTAL`.
fn content_range_start(value: Option<&str>) -> Option<u64> {
    value?.trim().strip_prefix("bytes ")?.split_once('-')?.0.trim().parse().ok()
}

/// Collects a body, refusing it once it passes `cap` bytes (the stated size is not trusted with an allocation).
async fn collect_capped(
    mut body: aws_sdk_s3::primitives::ByteStream,
    cap: u64,
    too_large: impl FnOnce() -> Failure,
) -> std::result::Result<Bytes, Failure> {
    let mut out = bytes::BytesMut::new();
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(Failure::transient)?;
        if (out.len() as u64).saturating_add(chunk.len() as u64) > cap {
            return Err(too_large());
        }
        out.extend_from_slice(&chunk);
    }
    Ok(out.freeze())
}

impl S3Store {
    fn too_large(&self, key: &str, size: Option<u64>) -> Failure {
        Failure::Done(SourceError::ObjectTooLarge {
            location: self.location(key),
            size,
            limit: self.max_object_size,
            hint: " (raise the store's max_object_size to read it)",
        })
    }
}

impl ObjectStore for S3Store {
    fn max_object_size(&self) -> Option<u64> {
        Some(self.max_object_size)
    }

    fn location(&self, key: &str) -> String {
        format!("s3://{}/{}", self.bucket, self.object_key(key))
    }

    fn get<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Bytes>> {
        Box::pin(async move {
            check_key(key)?;
            let object_key = self.object_key(key);
            self.run("GET", key, || async {
                let resp =
                    self.client.get_object().bucket(&self.bucket).key(&object_key).send().await.map_err(classify)?;
                let expected = resp.content_length();
                let stated = expected.and_then(|n| u64::try_from(n).ok());
                if let Some(size) = stated.filter(|&n| n > self.max_object_size) {
                    return Err(self.too_large(key, Some(size)));
                }
                let body = collect_capped(resp.body, self.max_object_size, || self.too_large(key, None)).await?;
                if let Some(expected) = expected.filter(|&n| n != body.len() as i64) {
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
            check_key(key)?;
            check_range_order(|| self.location(key), &range)?;
            if range.start == range.end {
                return Ok(Bytes::new());
            }
            let object_key = self.object_key(key);
            let header = format!("bytes={}-{}", range.start, range.end - 1);
            self.run("GET range", key, || async {
                let resp = self
                    .client
                    .get_object()
                    .bucket(&self.bucket)
                    .key(&object_key)
                    .range(&header)
                    .send()
                    .await
                    .map_err(|e| {
                    // 416: the range starts past the end of the object.
                    if status_of(&e) == Some(416) {
                        let location = self.location(key);
                        Failure::Done(SourceError::InvalidRange { location, range: range.clone(), size: None })
                    } else {
                        classify(e)
                    }
                })?;
                let start = content_range_start(resp.content_range());
                let want = range.end - range.start;
                let cap = want.min(self.max_object_size);
                let body = collect_capped(resp.body, cap, || {
                    if cap < want {
                        self.too_large(key, None)
                    } else {
                        Failure::Transient { reason: format!("asked for {want} bytes, the body went on"), source: None }
                    }
                })
                .await?;
                super::check_range_body(&range, (start, None), body.len())
                    .map_err(|reason| Failure::Transient { reason, source: None })?;
                Ok(body)
            })
            .await
        })
    }

    fn head<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<ObjectMeta>> {
        Box::pin(async move {
            check_key(key)?;
            let object_key = self.object_key(key);
            let size = self
                .run("HEAD", key, || async {
                    let resp = self
                        .client
                        .head_object()
                        .bucket(&self.bucket)
                        .key(&object_key)
                        .send()
                        .await
                        .map_err(classify)?;
                    Ok(resp.content_length().unwrap_or(0).max(0) as u64)
                })
                .await?;
            Ok(ObjectMeta::new(key, size))
        })
    }

    fn list<'a>(&'a self, prefix: &'a str) -> BoxStream<'a, Result<ObjectMeta>> {
        let full_prefix = if self.prefix.is_empty() { prefix.to_owned() } else { format!("{}/{prefix}", self.prefix) };
        let strip = if self.prefix.is_empty() { String::new() } else { format!("{}/", self.prefix) };
        // State: None before the first page, Some(Some(token)) between pages, Some(None) after the last.
        let pages = futures::stream::try_unfold(None::<Option<String>>, move |state| {
            let full_prefix = full_prefix.clone();
            let strip = strip.clone();
            async move {
                let token = match state {
                    Some(None) => return Ok(None),
                    Some(Some(token)) => Some(token),
                    None => None,
                };
                let page = self
                    .run("LIST", prefix, || async {
                        self.client
                            .list_objects_v2()
                            .bucket(&self.bucket)
                            .prefix(&full_prefix)
                            .max_keys(self.page_size)
                            .set_continuation_token(token.clone())
                            .send()
                            .await
                            .map_err(classify)
                    })
                    .await?;
                let next = match page.next_continuation_token() {
                    Some(token) if page.is_truncated() == Some(true) => Some(token.to_owned()),
                    _ => None,
                };
                let items: Vec<ObjectMeta> = page
                    .contents()
                    .iter()
                    .filter_map(|obj| {
                        let key = obj.key()?.strip_prefix(strip.as_str())?;
                        Some(ObjectMeta::new(key, obj.size().unwrap_or(0).max(0) as u64))
                    })
                    .collect();
                Ok(Some((items, Some(next))))
            }
        });
        pages.map_ok(|items| futures::stream::iter(items.into_iter().map(Ok))).try_flatten().boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn keys_and_locations() {
        let opts = StoreOptions::default().s3(super::super::S3Options {
            region: Some("eu-west-1".into()),
            endpoint: Some("http://127.0.0.1:1".into()),
            force_path_style: None,
            credentials: Some(("k".into(), "s".into())),
        });
        let store = S3Store::connect("bucket", "/train/", &opts).await.unwrap();
        assert_eq!(store.object_key("a/b.jpg"), "train/a/b.jpg");
        assert_eq!(store.location("a/b.jpg"), "s3://bucket/train/a/b.jpg");
        assert!(matches!(store.get("").await, Err(SourceError::InvalidKey { .. })));
        let whole = S3Store::connect("bucket", "", &opts).await.unwrap();
        assert_eq!(whole.location("x"), "s3://bucket/x");
    }

    #[test]
    fn content_range_start_parses() {
        assert_eq!(content_range_start(Some("bytes 5-9/100")), Some(5));
        assert_eq!(content_range_start(Some("nonsense")), None);
        assert_eq!(content_range_start(None), None);
    }
}
