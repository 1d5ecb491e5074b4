//! Retries with exponential backoff and jitter, shared by the network stores.
// Without a network store only `RetryPolicy` is used.
#![cfg_attr(not(any(feature = "http", feature = "s3")), allow(dead_code))]

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::Semaphore;

use crate::error::{BoxError, Result, SourceError};

/// How transient failures (5xx, throttling, connection resets, timeouts) are retried. 404 and 403 never are.
///
/// The wait before attempt `n + 1` is drawn uniformly from `[d/2, d]` where `d = min(max_delay,
/// base_delay * 2^(n-1))`: exponential growth, with jitter so that many clients failing together do not
/// retry in lockstep.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts in total, the first one included (1 disables retries).
    pub max_attempts: u32,
    /// Backoff before the second attempt.
    pub base_delay: Duration,
    /// Upper bound of any one backoff.
    pub max_delay: Duration,
}

impl Default for RetryPolicy {
    /// 5 attempts, 100 ms base, 5 s cap.
    fn default() -> Self {
        RetryPolicy { max_attempts: 5, base_delay: Duration::from_millis(100), max_delay: Duration::from_secs(5) }
    }
}

impl RetryPolicy {
    /// A policy that makes one attempt only.
    pub fn none() -> Self {
        RetryPolicy { max_attempts: 1, ..RetryPolicy::default() }
    }

    /// The backoff after failed attempt number `attempt` (1-based), jittered.
    pub fn backoff(&self, attempt: u32) -> Duration {
        let exp = 2u32.saturating_pow(attempt.saturating_sub(1));
        let ceiling = self.base_delay.saturating_mul(exp).min(self.max_delay);
        let half = ceiling / 2;
        let nanos = u64::try_from(half.as_nanos()).unwrap_or(u64::MAX);
        let jitter = if nanos == 0 { 0 } else { next_random() % (nanos + 1) };
        half + Duration::from_nanos(jitter)
    }
}

/// Jitter needs no reproducibility, only spread: a splitmix64 sequence over a global counter seeded from the clock.
fn next_random() -> u64 {
    static STATE: AtomicU64 = AtomicU64::new(0);
    let mut seed = STATE.load(Ordering::Relaxed);
    if seed == 0 {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        seed = (now.as_nanos() as u64) | 1;
        let _ = STATE.compare_exchange(0, seed, Ordering::Relaxed, Ordering::Relaxed);
    }
    let mut z = STATE.fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed).wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// How one attempt failed; decides whether to try again.
#[derive(Debug)]
pub(crate) enum Failure {
    /// 404 / NoSuchKey: final.
    NotFound,
    /// 401 / 403: final.
    Denied { reason: String, source: Option<BoxError> },
    /// 5xx, throttling, reset, timeout: try again while attempts remain.
    Transient { reason: String, source: Option<BoxError> },
    /// Anything else (a 400, a malformed response): final.
    Fatal { reason: String, source: Option<BoxError> },
    /// A complete error the attempt already built (e.g. an invalid range): returned as is.
    Done(SourceError),
}

impl Failure {
    /// A transient failure from an error value, its causes rendered into the reason.
    pub(crate) fn transient(err: impl std::error::Error + Send + Sync + 'static) -> Self {
        Failure::Transient { reason: spdl_report::error_chain(&err), source: Some(Box::new(err)) }
    }

    /// A final failure from an error value.
    pub(crate) fn fatal(err: impl std::error::Error + Send + Sync + 'static) -> Self {
        Failure::Fatal { reason: spdl_report::error_chain(&err), source: Some(Box::new(err)) }
    }
}

/// Runs `attempt` until it succeeds, fails for good, or `policy.max_attempts` is spent. Each attempt holds one
/// slot of `limiter` (backoff sleeps do not) and is cut at `attempt_timeout` when set.
pub(crate) async fn with_retry<T, F, Fut>(
    policy: &RetryPolicy,
    limiter: &Semaphore,
    attempt_timeout: Option<Duration>,
    operation: &'static str,
    location: &(dyn Fn() -> String + Sync),
    mut attempt: F,
) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = std::result::Result<T, Failure>>,
{
    let max_attempts = policy.max_attempts.max(1);
    let mut n = 0;
    loop {
        n += 1;
        let outcome = {
            // The semaphore is never closed, so acquire only fails if it were; treat that as a fatal failure.
            let permit = limiter.acquire().await;
            match permit {
                Err(closed) => Err(Failure::fatal(closed)),
                Ok(_permit) => match attempt_timeout {
                    Some(limit) => match tokio::time::timeout(limit, attempt()).await {
                        Ok(outcome) => outcome,
                        Err(elapsed) => Err(Failure::Transient {
                            reason: format!("attempt timed out after {limit:?}"),
                            source: Some(Box::new(elapsed)),
                        }),
                    },
                    None => attempt().await,
                },
            }
        };
        let failure = match outcome {
            Ok(value) => return Ok(value),
            Err(failure) => failure,
        };
        match failure {
            Failure::NotFound => return Err(SourceError::NotFound { location: location() }),
            Failure::Denied { reason, source } => {
                return Err(SourceError::PermissionDenied { location: location(), reason, source });
            }
            Failure::Done(err) => return Err(err),
            Failure::Fatal { reason, source } => {
                return Err(SourceError::Request { operation, location: location(), attempts: n, reason, source });
            }
            Failure::Transient { reason, source } => {
                if n >= max_attempts {
                    return Err(SourceError::Request { operation, location: location(), attempts: n, reason, source });
                }
                let wait = policy.backoff(n);
                tracing::debug!(operation, location = %location(), attempt = n, ?wait, %reason, "retrying");
                tokio::time::sleep(wait).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;

    #[test]
    fn backoff_grows_and_is_capped() {
        let p =
            RetryPolicy { max_attempts: 10, base_delay: Duration::from_millis(100), max_delay: Duration::from_secs(1) };
        for attempt in 1..12 {
            let d = p.backoff(attempt);
            let ceiling = (Duration::from_millis(100) * 2u32.pow((attempt - 1).min(20))).min(Duration::from_secs(1));
            assert!(d >= ceiling / 2 && d <= ceiling, "attempt {attempt}: {d:?} vs {ceiling:?}");
        }
        assert_eq!(RetryPolicy::none().max_attempts, 1);
        // Huge attempt numbers saturate instead of overflowing.
        assert!(p.backoff(u32::MAX) <= Duration::from_secs(1));
    }

    fn fast() -> RetryPolicy {
        RetryPolicy { max_attempts: 4, base_delay: Duration::from_millis(1), max_delay: Duration::from_millis(2) }
    }

    #[tokio::test]
    async fn retries_transient_until_success() {
        let calls = AtomicU32::new(0);
        let sem = Semaphore::new(1);
        let out = with_retry(&fast(), &sem, None, "GET", &|| "loc".into(), || async {
            if calls.fetch_add(1, Ordering::SeqCst) < 2 {
                Err(Failure::Transient { reason: "503".into(), source: None })
            } else {
                Ok(7)
            }
        })
        .await
        .unwrap();
        assert_eq!(out, 7);
        assert_eq!(calls.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn gives_up_with_attempts_and_cause() {
        let sem = Semaphore::new(1);
        let err = with_retry::<(), _, _>(&fast(), &sem, None, "GET", &|| "s3://b/k".into(), || async {
            Err(Failure::Transient { reason: "connection reset".into(), source: None })
        })
        .await
        .unwrap_err();
        let text = err.to_string();
        assert!(text.contains("s3://b/k") && text.contains("4 attempt") && text.contains("connection reset"), "{text}");
    }

    #[tokio::test]
    async fn never_retries_not_found_or_denied() {
        let sem = Semaphore::new(1);
        let calls = AtomicU32::new(0);
        let err = with_retry::<(), _, _>(&fast(), &sem, None, "GET", &|| "k".into(), || async {
            calls.fetch_add(1, Ordering::SeqCst);
            Err(Failure::NotFound)
        })
        .await
        .unwrap_err();
        assert!(err.is_not_found());
        let err = with_retry::<(), _, _>(&fast(), &sem, None, "GET", &|| "k".into(), || async {
            calls.fetch_add(1, Ordering::SeqCst);
            Err(Failure::Denied { reason: "403".into(), source: None })
        })
        .await
        .unwrap_err();
        assert!(matches!(err, SourceError::PermissionDenied { .. }));
        assert_eq!(calls.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn attempt_timeout_is_retried() {
        let sem = Semaphore::new(1);
        let calls = AtomicU32::new(0);
        let out = with_retry(&fast(), &sem, Some(Duration::from_millis(20)), "GET", &|| "k".into(), || async {
            if calls.fetch_add(1, Ordering::SeqCst) == 0 {
                tokio::time::sleep(Duration::from_secs(60)).await;
            }
            Ok(1)
        })
        .await
        .unwrap();
        assert_eq!(out, 1);
    }
}
