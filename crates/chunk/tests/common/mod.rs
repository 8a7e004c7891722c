//! Invariant checks shared by the integration tests.

#![allow(dead_code)] // each test binary uses a different subset

use std::collections::HashSet;

use rag_chunk::{Chunk, ChunkConfig};
use unicode_segmentation::UnicodeSegmentation;

/// Byte offset of every char of `text`, plus `text.len()` for the end.
pub fn char_byte_offsets(text: &str) -> Vec<usize> {
    text.char_indices()
        .map(|(byte, _)| byte)
        .chain(std::iter::once(text.len()))
        .collect()
}

/// The original text's chars `start..end`, as PostgreSQL's substr would return them.
pub fn char_slice<'t>(text: &'t str, offsets: &[usize], start: usize, end: usize) -> &'t str {
    &text[offsets[start]..offsets[end]]
}

/// Char offsets of every extended grapheme cluster boundary of `text`.
pub fn grapheme_boundaries(text: &str) -> HashSet<usize> {
    let mut boundaries = HashSet::new();
    let mut chars = 0;
    for grapheme in text.graphemes(true) {
        boundaries.insert(chars);
        chars += grapheme.chars().count();
    }
    boundaries.insert(chars);
    boundaries
}

/// New text a chunk adds beyond the chunk before it.
pub fn new_chars(previous: Option<&Chunk>, chunk: &Chunk) -> usize {
    let from = previous.map_or(chunk.char_start, |p| p.char_end.max(chunk.char_start));
    chunk.char_end - from
}

/// Checks every invariant that holds for any input, and returns a description of the first violation.
pub fn check_invariants(
    text: &str,
    config: &ChunkConfig,
    chunks: &[Chunk],
    check_graphemes: bool,
) -> Result<(), String> {
    let offsets = char_byte_offsets(text);
    let total_chars = offsets.len() - 1;
    let graphemes = check_graphemes.then(|| grapheme_boundaries(text));
    if text.trim().is_empty() != chunks.is_empty() {
        return Err(format!(
            "blank input must give no chunks and only blank input may: {} chunks",
            chunks.len()
        ));
    }
    for (index, chunk) in chunks.iter().enumerate() {
        let (start, end) = (chunk.char_start, chunk.char_end);
        if start >= end || end > total_chars {
            return Err(format!(
                "chunk {index}: bad offsets {start}..{end} of {total_chars}"
            ));
        }
        if char_slice(text, &offsets, start, end) != chunk.text {
            return Err(format!(
                "chunk {index}: text is not the slice {start}..{end}"
            ));
        }
        if chunk.text.trim() != chunk.text || chunk.text.is_empty() {
            return Err(format!(
                "chunk {index}: not trimmed or empty: {:?}",
                chunk.text
            ));
        }
        let chars = chunk.text.chars().count();
        if chars != end - start {
            return Err(format!(
                "chunk {index}: {chars} chars for offsets {start}..{end}"
            ));
        }
        if chars > config.max_chars() {
            return Err(format!(
                "chunk {index}: {chars} chars exceeds max {}",
                config.max_chars()
            ));
        }
        if chunk.token_estimate != chars.div_ceil(4) {
            return Err(format!(
                "chunk {index}: token estimate {}",
                chunk.token_estimate
            ));
        }
        if let Some(graphemes) = &graphemes {
            if !graphemes.contains(&start) || !graphemes.contains(&end) {
                return Err(format!(
                    "chunk {index}: {start}..{end} splits a grapheme cluster"
                ));
            }
        }
    }
    let blank = |from: usize, to: usize| char_slice(text, &offsets, from, to).trim().is_empty();
    match (chunks.first(), chunks.last()) {
        (Some(first), Some(last)) => {
            if !blank(0, first.char_start) || !blank(last.char_end, total_chars) {
                return Err("text before the first or after the last chunk is lost".into());
            }
        }
        _ => return Ok(()),
    }
    for (index, pair) in chunks.windows(2).enumerate() {
        let (previous, chunk) = (&pair[0], &pair[1]);
        let at = index + 1;
        if chunk.char_start <= previous.char_start || chunk.char_end <= previous.char_end {
            return Err(format!("chunk {at} does not move forward"));
        }
        let shared = previous.char_end.saturating_sub(chunk.char_start);
        if shared > config.overlap_chars() {
            return Err(format!(
                "chunk {at} shares {shared} chars, more than the overlap {}",
                config.overlap_chars()
            ));
        }
        if chunk.char_start > previous.char_end && !blank(previous.char_end, chunk.char_start) {
            return Err(format!("text between chunk {index} and chunk {at} is lost"));
        }
    }
    Ok(())
}

/// Panics with the text and chunks when an invariant is violated.
pub fn assert_invariants(
    text: &str,
    config: &ChunkConfig,
    chunks: &[Chunk],
    check_graphemes: bool,
) {
    if let Err(problem) = check_invariants(text, config, chunks, check_graphemes) {
        panic!("{problem}\nconfig: {config:?}\ntext: {text:?}\nchunks: {chunks:#?}");
    }
}
