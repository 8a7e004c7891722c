//! Checks on embedding batches before they reach pgvector: a wrong vector stored silently would poison
//! retrieval far more than a loud failure, and cosine distance is undefined for a zero vector.

/// Verifies count, dimensions, finiteness and non-zero norm; the error text names the first offending vector.
pub(crate) fn check_vectors(
    vectors: &[Vec<f32>],
    expected_count: usize,
    requested_dimensions: Option<u32>,
) -> Result<(), String> {
    if vectors.len() != expected_count {
        return Err(format!(
            "provider returned {} vectors for {} inputs",
            vectors.len(),
            expected_count
        ));
    }
    let Some(first) = vectors.first() else {
        return Ok(());
    };
    let dimension = first.len();
    if dimension == 0 {
        return Err("vector 0 is empty (0 dimensions)".to_string());
    }
    if let Some(requested) = requested_dimensions {
        if usize::try_from(requested).ok() != Some(dimension) {
            return Err(format!(
                "vectors have {dimension} dimensions but {requested} were requested"
            ));
        }
    }
    for (index, vector) in vectors.iter().enumerate() {
        if vector.len() != dimension {
            return Err(format!(
                "ragged dimensions: vector {index} has {} dimensions, vector 0 has {dimension}",
                vector.len()
            ));
        }
        if let Some(position) = vector.iter().position(|value| !value.is_finite()) {
            return Err(format!(
                "vector {index} has a non-finite value at position {position} ({})",
                vector[position]
            ));
        }
        // Summed in f64 so large but finite components cannot overflow into a bogus infinite norm.
        let squared_norm: f64 = vector
            .iter()
            .map(|&value| f64::from(value) * f64::from(value))
            .sum();
        if squared_norm == 0.0 {
            return Err(format!(
                "vector {index} has zero norm, so its cosine distance is undefined"
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[derive(serde::Deserialize)]
    struct Usage {
        #[serde(default, deserialize_with = "super::token_count")]
        tokens: Option<i64>,
    }

    #[test]
    fn token_counts_outside_reason_are_not_reported() {
        let count = |json: &str| serde_json::from_str::<Usage>(json).unwrap().tokens;
        assert_eq!(count(r#"{"tokens": 42}"#), Some(42));
        assert_eq!(count(r#"{"tokens": 0}"#), Some(0));
        assert_eq!(count(r#"{}"#), None);
        assert_eq!(count(r#"{"tokens": null}"#), None);
        assert_eq!(count(r#"{"tokens": -105}"#), None);
        assert_eq!(count(r#"{"tokens": 9223372036854775807}"#), None);
        assert_eq!(count(r#"{"tokens": 1.5}"#), None);
        assert_eq!(count(r#"{"tokens": 3.0}"#), Some(3));
        assert_eq!(count(r#"{"tokens": "12"}"#), None);
        assert_eq!(count(r#"{"tokens": [1]}"#), None);
    }

    #[test]
    fn no_nul_reaches_postgres() {
        assert_eq!(super::storable_text("a\0b".to_string()), "a\u{FFFD}b");
        assert_eq!(super::storable_text("plain".to_string()), "plain");
    }

    use super::*;

    #[test]
    fn accepts_a_well_formed_batch() {
        let vectors = vec![vec![1.0, 0.0], vec![0.0, -2.5], vec![f32::MAX, f32::MAX]];
        assert_eq!(check_vectors(&vectors, 3, Some(2)), Ok(()));
        assert_eq!(check_vectors(&[], 0, None), Ok(()));
    }

    /// A batch, the input count and requested dimension it answers, and the expected complaint.
    type Case = (Vec<Vec<f32>>, usize, Option<u32>, &'static str);

    #[test]
    fn rejects_each_defect() {
        let ok = vec![1.0f32, 2.0];
        let cases: Vec<Case> = vec![
            (vec![ok.clone()], 2, None, "1 vectors for 2 inputs"),
            (vec![vec![]], 1, None, "vector 0 is empty"),
            (
                vec![ok.clone(), vec![1.0]],
                2,
                None,
                "vector 1 has 1 dimensions, vector 0 has 2",
            ),
            (
                vec![ok.clone(), vec![1.0, f32::NAN]],
                2,
                None,
                "vector 1 has a non-finite value at position 1",
            ),
            (
                vec![vec![f32::INFINITY, 1.0]],
                1,
                None,
                "vector 0 has a non-finite value at position 0",
            ),
            (
                vec![ok.clone(), vec![0.0, -0.0]],
                2,
                None,
                "vector 1 has zero norm",
            ),
            (
                vec![ok.clone()],
                1,
                Some(3),
                "2 dimensions but 3 were requested",
            ),
        ];
        for (vectors, expected, requested, needle) in cases {
            let error = check_vectors(&vectors, expected, requested).unwrap_err();
            assert!(
                error.contains(needle),
                "{error:?} should contain {needle:?}"
            );
        }
    }

    #[test]
    fn tiny_values_are_not_zero() {
        assert_eq!(
            check_vectors(&[vec![f32::MIN_POSITIVE, 0.0]], 1, None),
            Ok(())
        );
    }
}

/// The most tokens one call is believed to report; a count above it is a provider's nonsense, not usage.
pub(crate) const MAX_REPORTED_TOKENS: f64 = 1e12;

/// A provider's token count, as the ledger may trust it: a whole number from 0 to [`MAX_REPORTED_TOKENS`].
/// Anything else (negative, fractional, absurd, a string) is taken as not reported, rather than failing a
/// usable reply or putting a negative or overflowing cost in the ledger.
pub(crate) fn token_count<'de, D>(deserializer: D) -> Result<Option<i64>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    let value = <Option<serde_json::Value> as serde::Deserialize>::deserialize(deserializer)?;
    Ok(value
        .as_ref()
        .and_then(serde_json::Value::as_f64)
        .filter(|count| (0.0..=MAX_REPORTED_TOKENS).contains(count) && count.fract() == 0.0)
        .map(|count| count as i64))
}

/// Reply text as PostgreSQL can store it: `text` holds no NUL, and one would cut off whatever follows it (a
/// truncation note included) when the value is read back. Each NUL becomes U+FFFD, so nothing is hidden.
pub(crate) fn storable_text(text: String) -> String {
    if text.contains('\0') {
        text.replace('\0', "\u{FFFD}")
    } else {
        text
    }
}
