//! Validation of chunk size and overlap.

use std::error::Error;

use rag_chunk::{ChunkConfig, SizeUnit};

fn error(size: usize, overlap: usize, unit: SizeUnit) -> String {
    match ChunkConfig::new(size, overlap, unit) {
        Ok(config) => panic!("accepted {config:?}"),
        Err(error) => error.to_string(),
    }
}

#[test]
fn bounds_are_inclusive() {
    for (size, overlap) in [(100, 0), (100, 99), (10_000, 5_000), (500, 50)] {
        let config = ChunkConfig::new(size, overlap, SizeUnit::Characters).expect("in range");
        assert_eq!(
            (config.max_chars(), config.overlap_chars()),
            (size, overlap)
        );
    }
    let tokens = ChunkConfig::new(2_500, 1_250, SizeUnit::Tokens).expect("in range");
    assert_eq!(
        (tokens.max_chars(), tokens.overlap_chars()),
        (10_000, 5_000)
    );
}

#[test]
fn size_out_of_range_names_the_bound_and_value() {
    assert_eq!(
        error(99, 0, SizeUnit::Characters),
        "chunk size (99 characters) must be between 100 and 10000 characters"
    );
    assert_eq!(
        error(10_001, 0, SizeUnit::Characters),
        "chunk size (10001 characters) must be between 100 and 10000 characters"
    );
    assert_eq!(
        error(24, 0, SizeUnit::Tokens),
        "chunk size (24 tokens = 96 characters) must be between 100 and 10000 characters"
    );
    assert_eq!(
        error(usize::MAX, 0, SizeUnit::Tokens),
        format!(
            "chunk size ({} tokens = {} characters) must be between 100 and 10000 characters",
            usize::MAX,
            usize::MAX
        )
    );
}

#[test]
fn overlap_out_of_range_names_the_bound_and_value() {
    assert_eq!(
        error(10_000, 5_001, SizeUnit::Characters),
        "chunk overlap (5001 characters) must be at most 5000 characters"
    );
    assert_eq!(
        error(2_000, 1_251, SizeUnit::Tokens),
        "chunk overlap (1251 tokens = 5004 characters) must be at most 5000 characters"
    );
}

#[test]
fn overlap_must_be_smaller_than_size() {
    assert_eq!(
        error(500, 600, SizeUnit::Characters),
        "chunk overlap (600 characters) must be smaller than chunk size (500 characters)"
    );
    assert_eq!(
        error(500, 500, SizeUnit::Characters),
        "chunk overlap (500 characters) must be smaller than chunk size (500 characters)"
    );
}

#[test]
fn errors_carry_a_hint_and_are_std_errors() {
    let size = ChunkConfig::new(50, 0, SizeUnit::Characters).unwrap_err();
    let overlap = ChunkConfig::new(200, 200, SizeUnit::Characters).unwrap_err();
    let too_much = ChunkConfig::new(10_000, 6_000, SizeUnit::Characters).unwrap_err();
    assert!(size.hint().contains("100 to 10000"));
    assert!(overlap.hint().contains("below the chunk size"));
    assert!(too_much.hint().contains("0 to 5000"));
    let boxed: Box<dyn Error> = Box::new(size);
    assert!(boxed.source().is_none());
}
