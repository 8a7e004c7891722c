//! Validated chunking parameters.

use std::fmt;

/// Smallest accepted chunk size, in characters.
pub const MIN_CHUNK_CHARS: usize = 100;
/// Largest accepted chunk size, in characters.
pub const MAX_CHUNK_CHARS: usize = 10_000;
/// Largest accepted overlap, in characters.
pub const MAX_OVERLAP_CHARS: usize = 5_000;
/// The crude characters-per-token ratio used for sizing; being 10% off is harmless when it only sizes chunks.
pub const CHARS_PER_TOKEN: usize = 4;

/// The unit in which a chunk size and overlap are given.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SizeUnit {
    /// Unicode scalar values, the way PostgreSQL's `length()` and `substr()` count.
    Characters,
    /// Estimated tokens, each taken as [`CHARS_PER_TOKEN`] characters.
    Tokens,
}

/// The one parser of a unit name, for every caller: an unknown unit is an error, never silently characters.
impl std::str::FromStr for SizeUnit {
    type Err = String;

    fn from_str(unit: &str) -> Result<SizeUnit, String> {
        match unit {
            "characters" => Ok(SizeUnit::Characters),
            "tokens" => Ok(SizeUnit::Tokens),
            other => Err(format!(
                "chunk unit must be 'characters' or 'tokens', not '{other}'"
            )),
        }
    }
}

impl SizeUnit {
    fn to_chars(self, amount: usize) -> usize {
        match self {
            SizeUnit::Characters => amount,
            SizeUnit::Tokens => amount.saturating_mul(CHARS_PER_TOKEN),
        }
    }
}

/// Chunk size and overlap, validated and converted to characters.
///
/// Build it with [`ChunkConfig::new`]; the fields stay private so that an unvalidated configuration
/// can never reach [`crate::chunk_text`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ChunkConfig {
    max_chars: usize,
    overlap_chars: usize,
}

impl ChunkConfig {
    /// Validates a chunk size and overlap given in `unit`.
    ///
    /// The size, converted to characters (tokens × 4 for [`SizeUnit::Tokens`]), must lie within
    /// 100..=10000; the overlap, converted the same way, within 0..=5000 and strictly below the size.
    pub fn new(
        size: usize,
        overlap: usize,
        unit: SizeUnit,
    ) -> Result<ChunkConfig, ChunkConfigError> {
        let max_chars = unit.to_chars(size);
        let overlap_chars = unit.to_chars(overlap);
        let problem = if !(MIN_CHUNK_CHARS..=MAX_CHUNK_CHARS).contains(&max_chars) {
            Some(Problem::SizeOutOfRange)
        } else if overlap_chars > MAX_OVERLAP_CHARS {
            Some(Problem::OverlapOutOfRange)
        } else if overlap_chars >= max_chars {
            Some(Problem::OverlapNotBelowSize)
        } else {
            None
        };
        match problem {
            Some(problem) => Err(ChunkConfigError {
                problem,
                size: Amount::new(size, unit),
                overlap: Amount::new(overlap, unit),
            }),
            None => Ok(ChunkConfig {
                max_chars,
                overlap_chars,
            }),
        }
    }

    /// The most characters any chunk may hold, overlap included.
    pub fn max_chars(&self) -> usize {
        self.max_chars
    }

    /// The most characters a chunk may share with the chunk before it, as configured.
    ///
    /// The chunker may share fewer: it only starts an overlap on a sentence or word boundary, it never
    /// lets an overlap push a chunk past [`ChunkConfig::max_chars`], and it keeps at least a quarter of
    /// every chunk for new text so that the output stays proportional to the input.
    pub fn overlap_chars(&self) -> usize {
        self.overlap_chars
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Problem {
    SizeOutOfRange,
    OverlapOutOfRange,
    OverlapNotBelowSize,
}

/// An amount as the caller gave it, kept so that messages quote the caller's own numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Amount {
    given: usize,
    unit: SizeUnit,
}

impl Amount {
    fn new(given: usize, unit: SizeUnit) -> Amount {
        Amount { given, unit }
    }
}

impl fmt::Display for Amount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.unit {
            SizeUnit::Characters => write!(f, "{} characters", self.given),
            SizeUnit::Tokens => write!(
                f,
                "{} tokens = {} characters",
                self.given,
                self.unit.to_chars(self.given)
            ),
        }
    }
}

/// Why a chunk size / overlap pair was rejected.
///
/// `Display` names the violated bound with the offending values, e.g.
/// "chunk overlap (600 characters) must be smaller than chunk size (500 characters)";
/// [`ChunkConfigError::hint`] says what to change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChunkConfigError {
    problem: Problem,
    size: Amount,
    overlap: Amount,
}

impl ChunkConfigError {
    /// A short suggestion of values that would be accepted.
    pub fn hint(&self) -> &str {
        match self.problem {
            Problem::SizeOutOfRange => {
                "choose a chunk size from 100 to 10000 characters (25 to 2500 tokens)"
            }
            Problem::OverlapOutOfRange => {
                "choose an overlap from 0 to 5000 characters (0 to 1250 tokens); 10-20% of the chunk size is typical"
            }
            Problem::OverlapNotBelowSize => {
                "lower the overlap below the chunk size; 10-20% of the chunk size is typical"
            }
        }
    }
}

impl fmt::Display for ChunkConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.problem {
            Problem::SizeOutOfRange => write!(
                f,
                "chunk size ({}) must be between {MIN_CHUNK_CHARS} and {MAX_CHUNK_CHARS} characters",
                self.size
            ),
            Problem::OverlapOutOfRange => write!(
                f,
                "chunk overlap ({}) must be at most {MAX_OVERLAP_CHARS} characters",
                self.overlap
            ),
            Problem::OverlapNotBelowSize => write!(
                f,
                "chunk overlap ({}) must be smaller than chunk size ({})",
                self.overlap, self.size
            ),
        }
    }
}

impl std::error::Error for ChunkConfigError {}

#[cfg(test)]
mod unit_tests {
    use super::SizeUnit;

    #[test]
    fn unit_names_parse_and_unknown_ones_are_errors() {
        assert_eq!("tokens".parse::<SizeUnit>(), Ok(SizeUnit::Tokens));
        assert_eq!("characters".parse::<SizeUnit>(), Ok(SizeUnit::Characters));
        for bad in ["words", "", "Tokens", " tokens"] {
            assert!(
                bad.parse::<SizeUnit>()
                    .unwrap_err()
                    .contains("'characters' or 'tokens'"),
                "{bad}"
            );
        }
    }
}
