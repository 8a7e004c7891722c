//! Error type shared by every provider call, and the status classification the worker's retry loop relies on.

use std::fmt;
use std::time::Duration;

/// Why a provider call failed, sorted by what the caller should do about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProviderError {
    /// Worth retrying later: 408/425/429, 5xx, connection refused or reset, timeout.
    /// `retry_after` comes from the `Retry-After` header (seconds or HTTP-date) or OpenAI's `retry-after-ms`.
    Transient {
        /// The HTTP status when the server answered at all.
        status: Option<u16>,
        /// The least time the server asked us to wait before trying again.
        retry_after: Option<Duration>,
        /// Human-readable cause: kind, route, model, status and an excerpt of the provider's error text.
        message: String,
    },
    /// Will never succeed as sent: other 4xx, malformed or wrongly shaped JSON, vector count mismatch,
    /// non-finite values, zero vectors, ragged dimensions, invalid configuration.
    Permanent {
        /// The HTTP status when the server answered at all.
        status: Option<u16>,
        /// Human-readable cause: kind, route, model, status and an excerpt of the provider's error text.
        message: String,
    },
    /// An input is longer than the model takes (a model run in-process knows its window exactly): never
    /// succeeds as sent, and is the caller's to shorten, not a problem with the model or its credentials.
    InputTooLong {
        /// Which input, how long, and what the model takes.
        message: String,
    },
    /// The caller's interrupt hook asked us to stop (query cancel, statement_timeout, SIGTERM).
    Interrupted,
}

impl ProviderError {
    /// True when retrying the same request later may succeed.
    pub fn is_transient(&self) -> bool {
        matches!(self, ProviderError::Transient { .. })
    }

    /// The HTTP status the provider answered with, if it answered.
    pub fn status(&self) -> Option<u16> {
        match self {
            ProviderError::Transient { status, .. } | ProviderError::Permanent { status, .. } => {
                *status
            }
            ProviderError::InputTooLong { .. } | ProviderError::Interrupted => None,
        }
    }

    /// The wait the provider asked for (only ever set on transient errors).
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            ProviderError::Transient { retry_after, .. } => *retry_after,
            _ => None,
        }
    }

    /// The human-readable cause (empty for [`ProviderError::Interrupted`]).
    pub fn message(&self) -> &str {
        match self {
            ProviderError::Transient { message, .. }
            | ProviderError::Permanent { message, .. }
            | ProviderError::InputTooLong { message } => message,
            ProviderError::Interrupted => "",
        }
    }

    pub(crate) fn permanent(message: impl Into<String>) -> Self {
        ProviderError::Permanent {
            status: None,
            message: message.into(),
        }
    }
}

impl fmt::Display for ProviderError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProviderError::Transient {
                message,
                retry_after,
                ..
            } => {
                write!(f, "{message}")?;
                if let Some(wait) = retry_after {
                    write!(
                        f,
                        " (provider asks to retry after {:.3}s)",
                        wait.as_secs_f64()
                    )?;
                }
                Ok(())
            }
            ProviderError::Permanent { message, .. } | ProviderError::InputTooLong { message } => {
                write!(f, "{message}")
            }
            ProviderError::Interrupted => write!(f, "provider call interrupted"),
        }
    }
}

impl std::error::Error for ProviderError {}

/// How an unsuccessful HTTP status should be treated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatusClass {
    /// The same request may succeed later.
    Transient,
    /// The same request will fail again.
    Permanent,
}

/// Classifies a non-success HTTP status: 408 (request timeout), 425 (too early), 429 (rate limited) and every
/// 5xx are transient; everything else (other 4xx, unresolved 3xx, nonsense codes) is permanent.
pub fn classify_status(status: u16) -> StatusClass {
    match status {
        408 | 425 | 429 | 500..=599 => StatusClass::Transient,
        _ => StatusClass::Permanent,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transient_statuses() {
        for status in [408, 425, 429, 500, 502, 503, 504, 599] {
            assert_eq!(
                classify_status(status),
                StatusClass::Transient,
                "status {status}"
            );
        }
    }

    #[test]
    fn permanent_statuses() {
        for status in [
            400, 401, 403, 404, 405, 409, 413, 415, 422, 426, 431, 451, 499, 301, 600, 0,
        ] {
            assert_eq!(
                classify_status(status),
                StatusClass::Permanent,
                "status {status}"
            );
        }
    }

    #[test]
    fn accessors() {
        let transient = ProviderError::Transient {
            status: Some(429),
            retry_after: Some(Duration::from_secs(2)),
            message: "slow down".into(),
        };
        assert!(transient.is_transient());
        assert_eq!(transient.status(), Some(429));
        assert_eq!(transient.retry_after(), Some(Duration::from_secs(2)));
        assert_eq!(
            transient.to_string(),
            "slow down (provider asks to retry after 2.000s)"
        );

        let permanent = ProviderError::Permanent {
            status: Some(401),
            message: "bad key".into(),
        };
        assert!(!permanent.is_transient());
        assert_eq!(permanent.status(), Some(401));
        assert_eq!(permanent.retry_after(), None);
        assert_eq!(permanent.message(), "bad key");

        assert!(!ProviderError::Interrupted.is_transient());
        assert_eq!(ProviderError::Interrupted.status(), None);
    }
}
