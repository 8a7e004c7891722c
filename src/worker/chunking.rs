//! Turning a document's text into chunks with its collection's settings, for a queued document and for a
//! watched row alike.
use crate::error::RagError;
use crate::provider::{self, Kind};
use crate::store::{self, NewChunk, WorkItem};
use rag_chunk::{Chunk, ChunkConfig, SizeUnit};

/// A collection's chunk settings, validated. An unknown unit is an error (the one parser, `SizeUnit`'s),
/// as it is in `rag_chunk()`: never silently characters.
pub fn chunk_config(size: i32, overlap: i32, unit: &str) -> Result<ChunkConfig, String> {
    let unit: SizeUnit = unit
        .parse()
        .map_err(|error| format!("collection chunk settings are invalid: {error}"))?;
    ChunkConfig::new(size.max(0) as usize, overlap.max(0) as usize, unit)
        .map_err(|error| format!("collection chunk settings are invalid: {error}"))
}

/// Splits a document's text into chunks. For a model run in-process the window is known exactly, so every
/// chunk is measured with the model's own tokenizer, document prefix included as it will be embedded, and a
/// chunk over the window is split further here rather than failing at embedding time.
pub fn chunk_body(
    body: &str,
    config: &ChunkConfig,
    provider_kind: &Kind,
    model_name: &str,
    document_prefix: &str,
) -> Result<Vec<Chunk>, String> {
    if *provider_kind != Kind::Local {
        return Ok(rag_chunk::chunk_text(body, config));
    }
    let model = provider::local_model(model_name)?;
    let mut prefixed = String::new();
    rag_chunk::chunk_text_within(body, config, model.max_tokens(), |chunk| {
        prefixed.clear();
        prefixed.push_str(document_prefix);
        prefixed.push_str(chunk);
        model.count_tokens(&prefixed)
    })
    .map_err(|error| format!("chunking for local model \"{model_name}\": {error}"))
}

pub fn new_chunk(page_offsets: &[i32]) -> impl Fn(Chunk) -> NewChunk + '_ {
    move |chunk| NewChunk {
        page: page_of(page_offsets, chunk.char_start),
        char_start: chunk.char_start as i32,
        char_end: chunk.char_end as i32,
        token_estimate: chunk.token_estimate as i32,
        content: chunk.text,
    }
}

/// What became of a document's chunking.
pub enum Chunked {
    /// Its chunks are stored.
    Stored,
    /// It was deleted meanwhile; nothing to do.
    Gone,
    /// It cannot be chunked with its collection's settings; the reason fails the document.
    Refused(String),
}

/// Splits the document into chunks and stores them, in the caller's step.
pub fn chunk_document(item: &WorkItem) -> Result<Chunked, RagError> {
    let Some(text) = store::load_text(item.document_id)? else {
        return Ok(Chunked::Gone);
    };
    match chunks_of(item, text) {
        Ok(chunks) => {
            store::store_chunks(item.document_id, chunks)?;
            Ok(Chunked::Stored)
        }
        Err(reason) => Ok(Chunked::Refused(reason)),
    }
}

/// A document's chunks with its collection's settings, or the reason it cannot be chunked. The text is
/// dropped before the chunks are returned: a large one should not sit beside them while they are stored.
pub fn chunks_of(item: &WorkItem, text: store::DocumentText) -> Result<Vec<NewChunk>, String> {
    let config = chunk_config(item.chunk_size, item.chunk_overlap, &item.chunk_unit)?;
    let offsets = text.page_offsets.unwrap_or_default();
    let chunks = chunk_body(
        &text.body,
        &config,
        &item.provider.kind,
        &item.model,
        &item.document_prefix,
    )?;
    drop(text.body);
    Ok(chunks.into_iter().map(new_chunk(&offsets)).collect())
}

/// 1-based page holding character `position`, from the offsets at which pages start.
fn page_of(page_offsets: &[i32], position: usize) -> Option<i32> {
    if page_offsets.is_empty() {
        return None;
    }
    let index = page_offsets.partition_point(|&start| start as usize <= position);
    Some(index.max(1) as i32)
}
