//! When to retry a registry request, and how long to wait.
//!
//! Transient failures are retried: connection failures and I/O errors,
//! HTTP 429 (too many requests) and 500, 502, 503, 504. The wait doubles from
//! [`RetryPolicy::initial_delay`]; a `Retry-After` header (in seconds) replaces
//! it. Nothing is retried once [`RetryPolicy::attempts`] requests were made or
//! the next wait would end after [`RetryPolicy::max_total`].

use std::time::Duration;

/// How often and how long to retry a failed registry request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Requests made at most, the first one included (1: never retry).
    pub attempts: u32,
    /// The wait before the first retry; doubled before each further one.
    pub initial_delay: Duration,
    /// No retry starts later than this after the first request.
    pub max_total: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            attempts: 4,
            initial_delay: Duration::from_millis(500),
            max_total: Duration::from_secs(30),
        }
    }
}

impl RetryPolicy {
    /// A policy that never retries.
    pub fn never() -> RetryPolicy {
        RetryPolicy {
            attempts: 1,
            ..RetryPolicy::default()
        }
    }

    /// The wait before request number `attempt + 1`, after request number
    /// `attempt` (1-based) failed transiently, `elapsed` after the first one
    /// started; `None` to give up. `retry_after` is the response's
    /// `Retry-After` header, if any.
    pub fn delay(
        &self,
        attempt: u32,
        retry_after: Option<&str>,
        elapsed: Duration,
    ) -> Option<Duration> {
        if attempt >= self.attempts {
            return None;
        }
        let backoff = self
            .initial_delay
            .saturating_mul(1u32.checked_shl(attempt - 1).unwrap_or(u32::MAX));
        let wait = retry_after.and_then(parse_retry_after).unwrap_or(backoff);
        (elapsed.saturating_add(wait) <= self.max_total).then_some(wait)
    }
}

/// Whether an HTTP status is worth retrying.
pub fn retryable_status(status: u16) -> bool {
    matches!(status, 429 | 500 | 502 | 503 | 504)
}

/// Whether a transport failure is worth retrying (DNS failures and bad URLs
/// are not: they do not heal in seconds).
pub fn retryable_transport(kind: ureq::ErrorKind) -> bool {
    matches!(
        kind,
        ureq::ErrorKind::ConnectionFailed | ureq::ErrorKind::Io | ureq::ErrorKind::ProxyConnect
    )
}

/// `Retry-After` in delay-seconds form (the HTTP-date form is rare from
/// registries and falls back to the backoff).
fn parse_retry_after(value: &str) -> Option<Duration> {
    value.trim().parse::<u64>().ok().map(Duration::from_secs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_and_is_bounded() {
        let p = RetryPolicy::default();
        let s = Duration::from_secs;
        assert_eq!(p.delay(1, None, s(0)), Some(Duration::from_millis(500)));
        assert_eq!(p.delay(2, None, s(1)), Some(s(1)));
        assert_eq!(p.delay(3, None, s(2)), Some(s(2)));
        assert_eq!(p.delay(4, None, s(4)), None, "four requests at most");
        assert_eq!(p.delay(1, Some("3"), s(0)), Some(s(3)));
        assert_eq!(p.delay(1, Some(" 7 "), s(0)), Some(s(7)));
        assert_eq!(
            p.delay(1, Some("Wed, 21 Oct 2015 07:28:00 GMT"), s(0)),
            Some(Duration::from_millis(500))
        );
        assert_eq!(p.delay(1, Some("31"), s(0)), None, "past the 30 s bound");
        assert_eq!(p.delay(2, Some("10"), s(25)), None);
        assert_eq!(RetryPolicy::never().delay(1, None, s(0)), None);
        let many = RetryPolicy {
            attempts: 100,
            max_total: Duration::MAX,
            ..p
        };
        assert!(many.delay(60, None, s(0)).is_some(), "no overflow");
    }

    #[test]
    fn what_is_retried() {
        for s in [429, 500, 502, 503, 504] {
            assert!(retryable_status(s), "{s}");
        }
        for s in [400, 401, 403, 404, 501] {
            assert!(!retryable_status(s), "{s}");
        }
        assert!(retryable_transport(ureq::ErrorKind::ConnectionFailed));
        assert!(!retryable_transport(ureq::ErrorKind::Dns));
    }
}
