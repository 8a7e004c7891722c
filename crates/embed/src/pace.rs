//! How fast a provider embeds, as the worker has seen it, and how much text that makes a claim worth taking at
//! once. A worker claims small documents in groups so that they share provider calls and transactions; with a
//! provider that answers at once a group of dozens is right, with one that needs a second per call (the local
//! model on one thread, a busy server) the same group keeps one worker busy for many seconds while the others
//! find nothing to claim. Sizing the group by what the provider gets through in a slice of time keeps both.
use std::time::Duration;

/// Weight of the newest call in the running figure: a few calls follow a change of pace (another model on the
/// same server, a server that got busy) without one odd call deciding.
const NEWEST_WEIGHT: f64 = 0.3;

/// Calls shorter than this say nothing about the provider's pace (timer resolution, a cache hit), so they are
/// left out: a provider that answers that fast needs no limit anyway.
const SHORTEST_CALL: Duration = Duration::from_millis(2);

/// Embedded text per second, smoothed over calls; unknown until a call long enough to measure.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Pace {
    /// Text embedded per second, smoothed; None until a call was long enough to measure.
    bytes_per_second: Option<f64>,
}

impl Pace {
    /// One call embedded `bytes` of text in `elapsed`.
    pub fn record(&mut self, bytes: usize, elapsed: Duration) {
        if bytes == 0 || elapsed < SHORTEST_CALL {
            return;
        }
        let observed = bytes as f64 / elapsed.as_secs_f64();
        self.bytes_per_second = Some(match self.bytes_per_second {
            None => observed,
            Some(previous) => previous + NEWEST_WEIGHT * (observed - previous),
        });
    }

    /// The smoothed pace, once one call was long enough to measure.
    pub fn bytes_per_second(&self) -> Option<f64> {
        self.bytes_per_second
    }

    /// Text to claim at once so that embedding it takes about `slice`: None (no limit beyond the caller's
    /// own) while the pace is unknown or the provider is faster than any group could use.
    pub fn bytes_within(&self, slice: Duration) -> Option<i32> {
        let bytes = self.bytes_per_second? * slice.as_secs_f64();
        (bytes < i32::MAX as f64).then(|| bytes.max(1.0) as i32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: Duration = Duration::from_secs(1);

    #[test]
    fn unknown_until_a_measurable_call() {
        let mut pace = Pace::default();
        assert_eq!(pace.bytes_within(SECOND), None);
        pace.record(10_000, Duration::from_micros(500));
        pace.record(0, SECOND);
        assert_eq!(pace.bytes_within(SECOND), None);
        pace.record(16_000, Duration::from_millis(500));
        assert_eq!(pace.bytes_within(SECOND), Some(32_000));
        assert_eq!(pace.bytes_within(Duration::from_millis(250)), Some(8_000));
    }

    #[test]
    fn follows_a_change_of_pace_within_a_few_calls() {
        let mut pace = Pace::default();
        pace.record(32_000, SECOND);
        // Ten times slower from now on: one call moves the figure a third of the way, a handful nearly all.
        pace.record(3_200, SECOND);
        let after_one = pace.bytes_per_second().unwrap();
        assert!(after_one < 32_000.0 && after_one > 16_000.0, "{after_one}");
        for _ in 0..8 {
            pace.record(3_200, SECOND);
        }
        let settled = pace.bytes_per_second().unwrap();
        assert!((settled - 3_200.0).abs() < 0.05 * 32_000.0, "{settled}");
    }

    #[test]
    fn a_provider_too_fast_to_limit_gets_no_limit() {
        let mut pace = Pace::default();
        pace.record(usize::MAX / 2, Duration::from_millis(2));
        assert_eq!(pace.bytes_within(SECOND), None);
        // The smallest limit is still a byte: a group always has room for its first document.
        let mut slow = Pace::default();
        slow.record(1, Duration::from_secs(100));
        assert_eq!(slow.bytes_within(SECOND), Some(1));
    }
}
