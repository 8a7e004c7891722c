//! Chunking exposed to SQL, so users can see exactly what a collection's settings will do to their text.
use crate::error::{RagError, UnwrapOrRaise};
use pgrx::prelude::*;
use rag_chunk::{chunk_text_with_checkpoint, ChunkConfig, SizeUnit};

pub fn parse_unit(unit: &str) -> SizeUnit {
    // The one parser of a unit name (rag_chunk's), shared with the worker: unknown units are errors everywhere.
    unit.parse()
        .map_err(|message: String| {
            RagError::invalid(
                message,
                format!(
                    "Use 'characters' or 'tokens' (about {} characters each).",
                    crate::limits::CHARS_PER_TOKEN
                ),
            )
        })
        .unwrap_or_raise()
}

pub fn config_or_raise(size: i32, overlap: i32, unit: &str) -> ChunkConfig {
    let unit = parse_unit(unit);
    if size < 0 || overlap < 0 {
        RagError::invalid(
            format!("chunk size ({size}) and overlap ({overlap}) must not be negative"),
            "Chunk size is 100 to 10000 characters, overlap 0 to 5000 and smaller than the size.",
        )
        .raise();
    }
    match ChunkConfig::new(size as usize, overlap as usize, unit) {
        Ok(config) => config,
        Err(error) => RagError::invalid(error.to_string(), error.hint()).raise(),
    }
}

/// Splits text the way the worker will: paragraphs, then sentences, then a hard cut, with overlap.
#[pg_extern(immutable, parallel_safe)]
pub fn rag_chunk(
    text: &str,
    size: default!(i32, 1000),
    overlap: default!(i32, 150),
) -> SetOfIterator<'static, String> {
    let config = config_or_raise(size, overlap, "characters");
    // Every chunk is made before the first is returned (with the overlap, several times the text): a text of
    // more than a document may be is refused, as rag_ingest refuses it (500 MB of text peaked at 2.4 GB).
    let limit = crate::settings::MAX_DOCUMENT_SIZE_KB.get().max(1) as usize * 1024;
    if text.len() > limit {
        crate::error::RagError::invalid(
            format!(
                "the text is {} bytes, above rag.max_document_size ({limit} bytes)",
                text.len()
            ),
            "Chunk a document's worth of text at a time.",
        )
        .raise();
    }
    // A cancel request or statement_timeout stops a large text between two chunks.
    let mut checkpoint = || {
        pgrx::check_for_interrupts!();
    };
    SetOfIterator::new(
        chunk_text_with_checkpoint(text, &config, &mut checkpoint)
            .into_iter()
            .map(|chunk| chunk.text),
    )
}

#[pg_schema]
pub mod rag {
    use super::*;

    /// Raises the chunker's own error (with a hint) when a collection's chunk settings are out of bounds.
    #[pg_extern(immutable, parallel_safe, name = "_validate_chunking")]
    pub fn validate_chunking(size: i32, overlap: i32, unit: &str) -> i32 {
        config_or_raise(size, overlap, unit).max_chars() as i32
    }
}
