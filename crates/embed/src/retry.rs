//! Backoff schedule for transient provider failures. Pure arithmetic over an injected random source, so the
//! worker's retry loop is testable with a fake clock and a seeded generator.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A source of uniformly distributed 64-bit values.
pub trait RngLike {
    /// Returns the next value; every bit should be equally likely to be set.
    fn next_u64(&mut self) -> u64;
}

/// SplitMix64: tiny, fast, statistically fine for jitter, and reproducible from a seed in tests.
/// Not suitable for anything security-related.
#[derive(Debug, Clone)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    /// A generator whose sequence is fully determined by `seed`.
    pub fn new(seed: u64) -> Self {
        SplitMix64 { state: seed }
    }

    /// A generator seeded from the clock and the process's hash randomisation, so concurrent workers that
    /// fail together do not retry in lockstep.
    pub fn from_entropy() -> Self {
        let mut hasher = RandomState::new().build_hasher();
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        hasher.write_u128(nanos);
        hasher.write_u32(std::process::id());
        SplitMix64::new(hasher.finish())
    }
}

impl RngLike for SplitMix64 {
    fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

/// Exponential backoff with jitter, bounded by an overall deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Upper bound of the first retry's delay.
    pub base: Duration,
    /// Largest backoff the policy picks by itself (a provider's Retry-After may exceed it).
    pub cap: Duration,
    /// How long after the first failure the policy keeps retrying.
    pub deadline: Duration,
}

impl Default for RetryPolicy {
    /// 1 s base, 5 min cap, 1 h deadline.
    fn default() -> Self {
        RetryPolicy {
            base: Duration::from_secs(1),
            cap: Duration::from_secs(300),
            deadline: Duration::from_secs(3600),
        }
    }
}

impl RetryPolicy {
    /// The largest backoff attempt `attempt` may draw: `base * 2^(attempt-1)`, capped at `cap`.
    /// Attempt 0 is treated as 1.
    pub fn ceiling(&self, attempt: u32) -> Duration {
        let doublings = attempt.saturating_sub(1).min(63);
        let factor = 1u64 << doublings;
        let factor = u32::try_from(factor).unwrap_or(u32::MAX);
        self.base
            .checked_mul(factor)
            .unwrap_or(Duration::MAX)
            .min(self.cap)
    }

    /// Delay before attempt number `attempt` (1 = first retry), given how long ago the first failure happened
    /// and an optional Retry-After from the provider.
    ///
    /// The backoff is drawn uniformly from `[ceiling/2, ceiling]` where `ceiling = min(base * 2^(attempt-1), cap)`;
    /// capping the ceiling (rather than the drawn value) keeps the jitter once the cap is reached, so many
    /// workers failing together spread out. A Retry-After raises the delay to at least what it says, even
    /// above `cap`. Whatever the delay, it is clamped to the time left before the deadline, so the last attempt
    /// happens right at the deadline. Returns None once the deadline has been reached: give up.
    pub fn next_delay(
        &self,
        attempt: u32,
        elapsed_since_first_failure: Duration,
        retry_after: Option<Duration>,
        rng: &mut impl RngLike,
    ) -> Option<Duration> {
        let remaining = self
            .deadline
            .checked_sub(elapsed_since_first_failure)
            .filter(|left| !left.is_zero())?;
        let ceiling = self.ceiling(attempt);
        let floor = ceiling / 2;
        let backoff = floor + uniform_up_to(ceiling - floor, rng);
        let wanted = match retry_after {
            Some(asked) => backoff.max(asked),
            None => backoff,
        };
        Some(wanted.min(remaining))
    }
}

/// A duration drawn uniformly from `[0, span]` at nanosecond resolution.
fn uniform_up_to(span: Duration, rng: &mut impl RngLike) -> Duration {
    let span_nanos = u64::try_from(span.as_nanos()).unwrap_or(u64::MAX);
    let draw = match span_nanos.checked_add(1) {
        // The modulo bias is below 2^-30 for any span up to hours: irrelevant for jitter.
        Some(modulus) => rng.next_u64() % modulus,
        None => rng.next_u64(),
    };
    Duration::from_nanos(draw)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Always returns the same value, to pin the draw to an end of the interval.
    struct Fixed(u64);
    impl RngLike for Fixed {
        fn next_u64(&mut self) -> u64 {
            self.0
        }
    }

    fn policy() -> RetryPolicy {
        RetryPolicy::default()
    }

    #[test]
    fn defaults() {
        let p = policy();
        assert_eq!(p.base, Duration::from_secs(1));
        assert_eq!(p.cap, Duration::from_secs(300));
        assert_eq!(p.deadline, Duration::from_secs(3600));
    }

    #[test]
    fn ceiling_doubles_until_cap() {
        let p = policy();
        let expected = [1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300];
        for (i, secs) in expected.iter().enumerate() {
            assert_eq!(
                p.ceiling(i as u32 + 1),
                Duration::from_secs(*secs),
                "attempt {}",
                i + 1
            );
        }
        assert_eq!(p.ceiling(0), Duration::from_secs(1));
        assert_eq!(p.ceiling(u32::MAX), Duration::from_secs(300));
    }

    #[test]
    fn jitter_stays_within_half_to_full_ceiling() {
        let p = policy();
        let mut rng = SplitMix64::new(7);
        for attempt in 1..=15 {
            let ceiling = p.ceiling(attempt);
            let mut lowest = Duration::MAX;
            let mut highest = Duration::ZERO;
            for _ in 0..500 {
                let delay = p
                    .next_delay(attempt, Duration::ZERO, None, &mut rng)
                    .unwrap();
                assert!(
                    delay >= ceiling / 2 && delay <= ceiling,
                    "attempt {attempt}: {delay:?} vs {ceiling:?}"
                );
                lowest = lowest.min(delay);
                highest = highest.max(delay);
            }
            // Real spread, not a constant: the draws cover most of the interval.
            let spread = ceiling / 2;
            assert!(
                lowest < ceiling / 2 + spread / 10,
                "attempt {attempt}: lowest {lowest:?}"
            );
            assert!(
                highest > ceiling - spread / 10,
                "attempt {attempt}: highest {highest:?}"
            );
        }
    }

    #[test]
    fn interval_ends_are_reachable() {
        let p = policy();
        assert_eq!(
            p.next_delay(3, Duration::ZERO, None, &mut Fixed(0)),
            Some(Duration::from_secs(2))
        );
        let span_nanos = Duration::from_secs(2).as_nanos() as u64;
        assert_eq!(
            p.next_delay(3, Duration::ZERO, None, &mut Fixed(span_nanos)),
            Some(Duration::from_secs(4))
        );
    }

    #[test]
    fn growth_is_monotone_and_bounded() {
        let p = policy();
        let mut previous_low = Duration::ZERO;
        let mut previous_ceiling = Duration::ZERO;
        for attempt in 1..=40 {
            let low = p
                .next_delay(attempt, Duration::ZERO, None, &mut Fixed(0))
                .unwrap();
            let ceiling = p.ceiling(attempt);
            assert!(
                low >= previous_low && ceiling >= previous_ceiling,
                "attempt {attempt}"
            );
            assert!(ceiling <= p.cap);
            if ceiling < p.cap {
                assert!(
                    low > previous_low,
                    "attempt {attempt} must grow before the cap"
                );
            }
            previous_low = low;
            previous_ceiling = ceiling;
        }
        assert_eq!(previous_low, p.cap / 2);
    }

    #[test]
    fn retry_after_is_honoured_even_above_cap() {
        let p = policy();
        let mut rng = SplitMix64::new(1);
        let asked = Duration::from_secs(30);
        for _ in 0..100 {
            assert!(
                p.next_delay(1, Duration::ZERO, Some(asked), &mut rng)
                    .unwrap()
                    >= asked
            );
        }
        let above_cap = Duration::from_secs(900);
        assert_eq!(
            p.next_delay(1, Duration::ZERO, Some(above_cap), &mut rng),
            Some(above_cap)
        );
        // A short Retry-After does not shorten the backoff already due.
        let delay = p
            .next_delay(8, Duration::ZERO, Some(Duration::from_secs(1)), &mut rng)
            .unwrap();
        assert!(delay >= Duration::from_secs(64));
    }

    #[test]
    fn retry_after_is_clamped_to_the_deadline() {
        let p = policy();
        let elapsed = Duration::from_secs(3500);
        let delay = p.next_delay(1, elapsed, Some(Duration::from_secs(600)), &mut Fixed(0));
        assert_eq!(delay, Some(Duration::from_secs(100)));
        let delay = p.next_delay(20, elapsed, None, &mut Fixed(u64::MAX));
        assert_eq!(delay, Some(Duration::from_secs(100)));
    }

    #[test]
    fn deadline_gives_none() {
        let p = policy();
        let mut rng = SplitMix64::new(3);
        assert_eq!(p.next_delay(1, p.deadline, None, &mut rng), None);
        assert_eq!(
            p.next_delay(
                1,
                p.deadline + Duration::from_secs(1),
                Some(Duration::from_secs(1)),
                &mut rng
            ),
            None
        );
        assert!(p
            .next_delay(1, p.deadline - Duration::from_millis(1), None, &mut rng)
            .is_some());
    }

    #[test]
    fn simulated_schedule_with_fake_clock_ends_at_deadline() {
        let p = RetryPolicy {
            base: Duration::from_secs(1),
            cap: Duration::from_secs(60),
            deadline: Duration::from_secs(600),
        };
        let mut rng = SplitMix64::new(42);
        let mut clock = Duration::ZERO;
        let mut attempts = 0u32;
        while let Some(delay) = p.next_delay(attempts + 1, clock, None, &mut rng) {
            attempts += 1;
            clock += delay;
            assert!(clock <= p.deadline);
            assert!(attempts < 1000, "schedule must terminate");
        }
        assert_eq!(clock, p.deadline);
        assert!((10..=30).contains(&attempts), "{attempts} attempts");
    }

    #[test]
    fn seeded_generator_is_reproducible_and_entropy_seeds_differ() {
        let first: Vec<u64> = (0..5)
            .scan(SplitMix64::new(9), |rng, _| Some(rng.next_u64()))
            .collect();
        let second: Vec<u64> = (0..5)
            .scan(SplitMix64::new(9), |rng, _| Some(rng.next_u64()))
            .collect();
        assert_eq!(first, second);
        assert_ne!(
            SplitMix64::from_entropy().next_u64(),
            SplitMix64::from_entropy().next_u64()
        );
    }

    #[test]
    fn zero_base_never_panics() {
        let p = RetryPolicy {
            base: Duration::ZERO,
            cap: Duration::ZERO,
            deadline: Duration::from_secs(1),
        };
        assert_eq!(
            p.next_delay(5, Duration::ZERO, None, &mut SplitMix64::new(1)),
            Some(Duration::ZERO)
        );
    }
}
