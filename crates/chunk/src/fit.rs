//! Chunking against a measured limit, such as an embedding model's token window.
//!
//! Chunk sizes are set in characters (or estimated tokens), but a model's limit is in its own tokens,
//! and the ratio varies with the text: code, tables and non-Latin scripts give more tokens per
//! character than prose. [`chunk_text_within`] therefore measures every chunk with the caller's
//! tokenizer and splits only the chunks that do not fit, by the same structural rules, so nothing ever
//! reaches the model too long to embed whole.

use std::fmt;

use crate::{
    chunk_bounds_with_checkpoint, Chunk, ChunkBounds, ChunkConfig, SizeUnit, MIN_CHUNK_CHARS,
};

/// Why [`chunk_text_within`] could not produce chunks that fit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FitError<E> {
    /// The measuring function failed on a chunk.
    Measure(E),
    /// A piece of the smallest chunk size still measures more than the limit.
    TooLong {
        /// Offset of the piece's first char in the text.
        char_start: usize,
        /// Offset just past the piece's last char.
        char_end: usize,
        /// What the piece measured.
        measured: usize,
        /// The limit it had to fit.
        limit: usize,
    },
}

impl<E: fmt::Display> fmt::Display for FitError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FitError::Measure(error) => write!(f, "{error}"),
            FitError::TooLong {
                char_start,
                char_end,
                measured,
                limit,
            } => write!(
                f,
                "characters {char_start}..{char_end} measure {measured} tokens even in a {MIN_CHUNK_CHARS}-character \
                 chunk, more than the model's window of {limit}"
            ),
        }
    }
}

/// Like [`chunk_text`], then every chunk whose `measure` exceeds `limit` is split again, by paragraphs,
/// sentences and finally hard cuts, at a size scaled down by how far over the limit it was, until each
/// piece fits. Pieces of a split chunk do not overlap each other (the overlap with the chunks around
/// them is kept). Chunks that fit are returned untouched, so for text that fits nothing changes.
///
/// Fails with [`FitError::TooLong`] if a piece of [`MIN_CHUNK_CHARS`] characters still does not fit,
/// and with [`FitError::Measure`] if measuring fails.
pub fn chunk_text_within<E>(
    text: &str,
    config: &ChunkConfig,
    limit: usize,
    measure: impl FnMut(&str) -> Result<usize, E>,
) -> Result<Vec<Chunk>, FitError<E>> {
    Ok(chunk_bounds_within(text, config, limit, measure)?
        .into_iter()
        .map(|bounds| bounds.chunk(text))
        .collect())
}

/// The bounds of [`chunk_text_within`]'s chunks, in the same order: each chunk is measured on a slice of
/// `text`, so a large document is never held twice (a caller makes the texts a few at a time).
pub fn chunk_bounds_within<E>(
    text: &str,
    config: &ChunkConfig,
    limit: usize,
    mut measure: impl FnMut(&str) -> Result<usize, E>,
) -> Result<Vec<ChunkBounds>, FitError<E>> {
    let mut fitted = Vec::new();
    for bounds in chunk_bounds_with_checkpoint(text, config, &mut || {}) {
        fit_chunk(text, bounds, limit, &mut measure, &mut fitted)?;
    }
    Ok(fitted)
}

fn fit_chunk<E>(
    text: &str,
    chunk: ChunkBounds,
    limit: usize,
    measure: &mut impl FnMut(&str) -> Result<usize, E>,
    fitted: &mut Vec<ChunkBounds>,
) -> Result<(), FitError<E>> {
    let piece_text = &text[chunk.byte_start..chunk.byte_end];
    let measured = measure(piece_text).map_err(FitError::Measure)?;
    if measured <= limit {
        fitted.push(chunk);
        return Ok(());
    }
    let chars = chunk.char_end - chunk.char_start;
    if chars <= MIN_CHUNK_CHARS {
        return Err(FitError::TooLong {
            char_start: chunk.char_start,
            char_end: chunk.char_end,
            measured,
            limit,
        });
    }
    // Aim 10% under the proportional size, since tokens are not spread evenly; always shrink by at
    // least a quarter so that the recursion ends within a few rounds.
    let proportional = chars.saturating_mul(limit) / measured * 9 / 10;
    let size = proportional.min(chars * 3 / 4).max(MIN_CHUNK_CHARS);
    let config = ChunkConfig::new(size, 0, SizeUnit::Characters)
        .expect("a size within MIN_CHUNK_CHARS..chars with no overlap is valid");
    // Every piece is at most `size` < `chars` long (the chunker's bound), so the recursion ends.
    for piece in chunk_bounds_with_checkpoint(piece_text, &config, &mut || {}) {
        let piece = ChunkBounds {
            byte_start: chunk.byte_start + piece.byte_start,
            byte_end: chunk.byte_start + piece.byte_end,
            char_start: chunk.char_start + piece.char_start,
            char_end: chunk.char_start + piece.char_end,
        };
        fit_chunk(text, piece, limit, measure, fitted)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chunk_text;

    /// Counts words, a stand-in tokenizer whose ratio to characters varies with word length.
    fn words(text: &str) -> Result<usize, String> {
        Ok(text.split_whitespace().count())
    }

    fn slice(text: &str, chunk: &Chunk) -> String {
        text.chars()
            .skip(chunk.char_start)
            .take(chunk.char_end - chunk.char_start)
            .collect()
    }

    #[test]
    fn chunks_that_fit_are_returned_unchanged() {
        let text = "Short sentence one. Short sentence two.\n\nAnother paragraph here.";
        let config = ChunkConfig::new(500, 50, SizeUnit::Characters).unwrap();
        let plain = chunk_text(text, &config);
        let fitted = chunk_text_within(text, &config, 100, words).unwrap();
        assert_eq!(plain, fitted);
    }

    #[test]
    fn dense_text_is_split_until_every_piece_fits() {
        // 1-letter "words": 2 characters per token, so a 1000-character chunk holds ~500 tokens.
        let dense: String = (0..600)
            .map(|i| match i % 40 {
                0 => "Y ",
                39 => "x. ",
                _ => "x ",
            })
            .collect();
        let text =
            format!("A normal opening paragraph of prose.\n\n{dense}\n\nA closing paragraph.");
        let config = ChunkConfig::new(1000, 100, SizeUnit::Characters).unwrap();
        let limit = 120;
        let fitted = chunk_text_within(&text, &config, limit, words).unwrap();
        assert!(fitted.len() > chunk_text(&text, &config).len());
        for chunk in &fitted {
            assert!(words(&chunk.text).unwrap() <= limit, "{:?}", chunk.text);
            assert_eq!(
                slice(&text, chunk),
                chunk.text,
                "offsets map back to the text"
            );
        }
        // Every non-blank character of the text is still covered, in order.
        let chars: Vec<char> = text.chars().collect();
        let mut covered_to = 0;
        for chunk in &fitted {
            if chunk.char_start > covered_to {
                let gap: String = chars[covered_to..chunk.char_start].iter().collect();
                assert!(
                    gap.trim().is_empty(),
                    "text {gap:?} lost before {}",
                    chunk.char_start
                );
            }
            covered_to = covered_to.max(chunk.char_end);
        }
        assert_eq!(covered_to, text.trim_end().chars().count());
        // Split pieces end on the sentence boundaries the dense text has.
        assert!(fitted.iter().filter(|c| c.text.ends_with("x.")).count() >= 3);
    }

    #[test]
    fn text_that_cannot_fit_reports_where() {
        let text = "y ".repeat(300);
        let config = ChunkConfig::new(400, 0, SizeUnit::Characters).unwrap();
        let error = chunk_text_within(&text, &config, 10, words).unwrap_err();
        match error {
            FitError::TooLong {
                char_start,
                char_end,
                measured,
                limit,
            } => {
                assert_eq!(char_start, 0);
                assert!(char_end - char_start <= MIN_CHUNK_CHARS);
                assert!(measured > limit);
                assert_eq!(limit, 10);
            }
            other => panic!("unexpected {other:?}"),
        }
        assert!(error_message(&text).contains("more than the model's window of 10"));
    }

    fn error_message(text: &str) -> String {
        let config = ChunkConfig::new(400, 0, SizeUnit::Characters).unwrap();
        chunk_text_within(text, &config, 10, words)
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn measuring_errors_are_passed_on() {
        let config = ChunkConfig::new(400, 0, SizeUnit::Characters).unwrap();
        let error =
            chunk_text_within("Some text.", &config, 10, |_| Err("tokenizer broke")).unwrap_err();
        assert_eq!(error, FitError::Measure("tokenizer broke"));
    }

    #[test]
    fn split_pieces_keep_byte_and_char_offsets_in_step() {
        // Multi-byte letters and dense one-letter words, so chunks are split and every byte offset differs
        // from its char offset.
        let dense: String = (0..900)
            .map(|i| match i % 30 {
                0 => "Ünïcödé ",
                29 => "é. ",
                _ => "ß ",
            })
            .collect();
        let text = format!("Intro paragraph ending here.\n\n{dense}\n\n日本語の段落です。");
        let config = ChunkConfig::new(1000, 100, SizeUnit::Characters).unwrap();
        let bounds = chunk_bounds_within(&text, &config, 120, words).unwrap();
        assert!(bounds.len() > chunk_bounds_with_checkpoint(&text, &config, &mut || {}).len());
        for b in &bounds {
            let by_chars: String = text
                .chars()
                .skip(b.char_start)
                .take(b.char_end - b.char_start)
                .collect();
            assert_eq!(&text[b.byte_start..b.byte_end], by_chars);
            assert!(words(&by_chars).unwrap() <= 120);
        }
        let chunks = chunk_text_within(&text, &config, 120, words).unwrap();
        assert_eq!(chunks.len(), bounds.len());
        assert!(
            chunks
                .iter()
                .zip(&bounds)
                .all(|(c, b)| c.char_start == b.char_start
                    && c.text == text[b.byte_start..b.byte_end])
        );
    }
}
