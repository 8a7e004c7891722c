//! Structure-aware text chunking for retrieval-augmented generation.
//!
//! Chunks that end mid-sentence embed poorly, so [`chunk_text`] follows the text's own structure:
//!
//! 1. The text is split into paragraphs on blank lines (a form feed or U+2029 also counts), and
//!    consecutive paragraphs are packed into one chunk while they fit.
//! 2. A paragraph larger than the chunk size is split into UAX #29 sentences, which are packed the same
//!    way. Single line breaks inside a paragraph do not end a sentence, so hard-wrapped prose still
//!    splits on full stops.
//! 3. A "sentence" still larger than the size (a table, minified JSON, base64) is hard-cut: at a line
//!    break or other whitespace in the last quarter of the window, else at a word boundary there, else at
//!    a grapheme boundary.
//! 4. Each chunk after the first repeats the end of the one before it, up to the configured overlap,
//!    starting on a sentence boundary when one lies in that window, else on a word boundary.
//! 5. A last chunk holding under a quarter of the size of new text is merged into the one before when the
//!    result fits; otherwise the last two chunks are rebalanced so that neither is that small.
//! 6. A heading (a paragraph of one short line that does not end like a sentence: `## Backups`,
//!    `3.2. Point-in-time recovery`), or a heading and a subheading, that packing would leave at the end
//!    of a chunk starts the next chunk instead, with the text it introduces, when the two fit together;
//!    before a block too big for any chunk it leads the block's first piece. It stays put when moving it
//!    would leave less than a quarter of a chunk behind, or when the run of short lines is longer than
//!    160 characters (a list or a table, not a heading).
//!
//! Offsets are in chars (Unicode scalar values), as PostgreSQL's `substr` counts them, into the original
//! text, and each chunk's text is exactly that slice, trimmed of surrounding whitespace. Chunks never
//! exceed [`ChunkConfig::max_chars`]. The work is linear in the length of the text: boundaries are only
//! ever searched inside the chunk at hand.
//!
//! ```
//! use rag_chunk::{chunk_text, ChunkConfig, SizeUnit};
//!
//! let config = ChunkConfig::new(120, 40, SizeUnit::Characters).unwrap();
//! let text = "PostgreSQL stores rows in pages. Each page is eight kilobytes. \
//!             Tuples that do not fit are toasted. Indexes point at tuples by their location. \
//!             Vacuum reclaims dead tuples.";
//! let chunks = chunk_text(text, &config);
//! assert!(chunks.len() > 1);
//! for chunk in &chunks {
//!     assert!(chunk.text.ends_with('.'));
//!     let slice: String = text.chars().skip(chunk.char_start).take(chunk.char_end - chunk.char_start).collect();
//!     assert_eq!(slice, chunk.text);
//! }
//! ```

#![warn(missing_docs)]

mod boundary;
mod config;
mod fit;
mod header;
mod pack;
mod sentences;
mod units;

pub use fit::{chunk_bounds_within, chunk_text_within, FitError};
pub use header::{
    chunk_header, embedding_input, headings_above, with_header, MAX_HEADER_PART_CHARS,
};

pub use config::{
    ChunkConfig, ChunkConfigError, SizeUnit, CHARS_PER_TOKEN, MAX_CHUNK_CHARS, MAX_OVERLAP_CHARS,
    MIN_CHUNK_CHARS,
};

/// One chunk of a document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chunk {
    /// The chunk's text: exactly the original text's chars `char_start..char_end`.
    pub text: String,
    /// Offset of the chunk's first char in the original text, counted in chars from 0.
    pub char_start: usize,
    /// Offset just past the chunk's last char in the original text, counted in chars.
    pub char_end: usize,
    /// [`estimate_tokens`] of `text`.
    pub token_estimate: usize,
}

/// Splits `text` into chunks following its paragraphs and sentences; see the crate documentation for
/// the rules. Blank or empty text gives no chunks.
///
/// Chunks come in text order, each starting and ending later than the one before. The overlap actually
/// shared is at most [`ChunkConfig::overlap_chars`] and may be less: it yields to a paragraph or
/// sentence that would otherwise not fit whole, and at least a quarter of every chunk is new text.
pub fn chunk_text(text: &str, config: &ChunkConfig) -> Vec<Chunk> {
    chunk_text_with_checkpoint(text, config, &mut || {})
}

/// [`chunk_text`] that calls `checkpoint` before packing each chunk, a few microseconds apart at most. A
/// caller that must be able to stop a long text (a database backend honouring a cancel request or a
/// statement timeout) checks there and unwinds out of it; nothing is left half-built but the chunks so far,
/// which are dropped.
pub fn chunk_text_with_checkpoint(
    text: &str,
    config: &ChunkConfig,
    checkpoint: &mut dyn FnMut(),
) -> Vec<Chunk> {
    chunk_bounds_with_checkpoint(text, config, checkpoint)
        .into_iter()
        .map(|bounds| bounds.chunk(text))
        .collect()
}

/// Where one chunk of [`chunk_text`] lies in the text, without its own copy of the text: a caller with a
/// large document makes the chunks' texts a few at a time ([`ChunkBounds::chunk`]) instead of holding a
/// second copy of the whole document at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkBounds {
    /// Byte offset of the chunk's first byte in the text.
    pub byte_start: usize,
    /// Byte offset just past the chunk's last byte.
    pub byte_end: usize,
    /// Offset of the chunk's first char, counted in chars from 0.
    pub char_start: usize,
    /// Offset just past the chunk's last char, counted in chars.
    pub char_end: usize,
}

impl ChunkBounds {
    /// The chunk these bounds delimit in `text`, which must be the text they were found in.
    pub fn chunk(&self, text: &str) -> Chunk {
        Chunk {
            text: text[self.byte_start..self.byte_end].to_owned(),
            char_start: self.char_start,
            char_end: self.char_end,
            token_estimate: (self.char_end - self.char_start).div_ceil(CHARS_PER_TOKEN),
        }
    }
}

/// The bounds of [`chunk_text_with_checkpoint`]'s chunks, in the same order.
pub fn chunk_bounds_with_checkpoint(
    text: &str,
    config: &ChunkConfig,
    checkpoint: &mut dyn FnMut(),
) -> Vec<ChunkBounds> {
    let limits = pack::Limits::new(config.max_chars(), config.overlap_chars());
    pack::chunk_spans_with_checkpoint(text, limits, checkpoint)
        .into_iter()
        .map(|span| ChunkBounds {
            byte_start: span.start.byte,
            byte_end: span.end.byte,
            char_start: span.start.char,
            char_end: span.end.char,
        })
        .collect()
}

/// Whether a paragraph reads as a heading to the packer (rule 6 of the crate documentation): one short
/// line (at most 120 chars) with a letter in it that does not end like a sentence — a title, a numbered
/// section heading, a Markdown `#` line, a table caption, "For example:".
pub fn looks_like_heading(paragraph: &str) -> bool {
    const MAX_HEADING_CHARS: usize = 120;
    // Cheapest tests first: the packer asks this of every paragraph, and most are long or end a
    // sentence.
    if paragraph.len() > MAX_HEADING_CHARS * 4 {
        return false;
    }
    let Some(last) = paragraph.chars().next_back() else {
        return false;
    };
    !matches!(last, '.' | ',' | ';')
        && paragraph.chars().count() <= MAX_HEADING_CHARS
        && !paragraph.contains(['\n', '\r'])
        && paragraph.chars().any(char::is_alphabetic)
}

/// A crude token count: the number of chars divided by four, rounded up.
pub fn estimate_tokens(text: &str) -> usize {
    text.chars().count().div_ceil(CHARS_PER_TOKEN)
}
