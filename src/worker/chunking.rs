//! Turning a document's text into chunks with its collection's settings, for a queued document and for a
//! watched row alike.
use crate::error::RagError;
use crate::provider::{self, Kind};
use crate::store::{self, NewChunk, WorkItem};
use rag_chunk::{ChunkBounds, ChunkConfig, SizeUnit};
use std::ops::Range;

/// A collection's chunk settings, validated. An unknown unit is an error (the one parser, `SizeUnit`'s),
/// as it is in `rag_chunk()`: never silently characters.
pub fn chunk_config(size: i32, overlap: i32, unit: &str) -> Result<ChunkConfig, String> {
    let unit: SizeUnit = unit
        .parse()
        .map_err(|error| format!("collection chunk settings are invalid: {error}"))?;
    ChunkConfig::new(size.max(0) as usize, overlap.max(0) as usize, unit)
        .map_err(|error| format!("collection chunk settings are invalid: {error}"))
}

/// Where a document's chunks lie in its text. For a model run in-process the window is known exactly, so
/// every chunk is measured with the model's own tokenizer, document prefix included as it will be embedded,
/// and a chunk over the window is split further here rather than failing at embedding time.
pub fn chunk_bounds(
    body: &str,
    config: &ChunkConfig,
    provider_kind: &Kind,
    model_name: &str,
    document_prefix: &str,
) -> Result<Vec<ChunkBounds>, String> {
    if *provider_kind != Kind::Local {
        return Ok(rag_chunk::chunk_bounds_with_checkpoint(
            body,
            config,
            &mut || {},
        ));
    }
    let model = provider::local_model(model_name)?;
    let mut prefixed = String::new();
    rag_chunk::chunk_bounds_within(body, config, model.max_tokens(), |chunk| {
        prefixed.clear();
        prefixed.push_str(document_prefix);
        prefixed.push_str(chunk);
        model.count_tokens(&prefixed)
    })
    .map_err(|error| format!("chunking for local model \"{model_name}\": {error}"))
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
    match plan_chunks(item, text) {
        Ok(plan) => store_plan(item.document_id, plan),
        Err(reason) => Ok(Chunked::Refused(reason)),
    }
}

/// Stores a document's chunks a batch at a time, in the caller's step (one transaction: a crash stores none).
pub fn store_plan(document_id: i64, plan: ChunkPlan) -> Result<Chunked, RagError> {
    let mut first_ordinal = 0;
    for batch in plan.into_batches() {
        let count = batch.len() as i32;
        match store::store_chunks(document_id, first_ordinal, batch)? {
            store::StoredChunks::Gone => return Ok(Chunked::Gone),
            store::StoredChunks::ChunkedBefore => break,
            store::StoredChunks::Stored => first_ordinal += count,
        }
    }
    Ok(Chunked::Stored)
}

/// How much chunk text one call of `rag._store_chunks` carries: the SQL side holds it two or three times over
/// (the argument array, its unnest, the rows), so a 20 MB document stored in one call took about 100 MB.
const STORE_BATCH_BYTES: usize = 1 << 20;

/// A document's chunks, made into texts a batch at a time.
pub struct ChunkPlan {
    body: String,
    title: String,
    page_offsets: Vec<i32>,
    /// Whether the document's first chunk has been made.
    past_first: bool,
    /// Where each chunk lies in `body` ([`chunk_bounds`]), and the section heading above each
    /// (`rag_chunk::headings_above`), in step.
    bounds: std::vec::IntoIter<ChunkBounds>,
    headings: std::vec::IntoIter<Option<Range<usize>>>,
}

impl ChunkPlan {
    pub fn len(&self) -> usize {
        self.bounds.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The chunks in order, in batches of at most [`STORE_BATCH_BYTES`] of text (or one chunk when it is
    /// bigger).
    pub fn into_batches(mut self) -> impl Iterator<Item = Vec<NewChunk>> {
        std::iter::from_fn(move || {
            let mut batch = Vec::new();
            let mut bytes = 0;
            while bytes < STORE_BATCH_BYTES {
                let (Some(bounds), Some(heading)) = (self.bounds.next(), self.headings.next())
                else {
                    break;
                };
                let chunk = bounds.chunk(&self.body);
                bytes += chunk.text.len();
                let heading = heading.map(|range| &self.body[range]);
                let opens_document = !self.past_first;
                self.past_first = true;
                batch.push(NewChunk {
                    header: rag_chunk::chunk_header(&self.title, heading, opens_document),
                    page: page_of(&self.page_offsets, chunk.char_start),
                    char_start: chunk.char_start as i32,
                    char_end: chunk.char_end as i32,
                    token_estimate: chunk.token_estimate as i32,
                    content: chunk.text,
                });
            }
            (!batch.is_empty()).then_some(batch)
        })
    }
}

/// Cuts a document with its collection's settings, or says why it cannot be cut. Only bounds are kept, for
/// every provider: the texts are made a batch at a time as they are stored, so a large document is never
/// held twice.
pub fn plan_chunks(item: &WorkItem, text: store::DocumentText) -> Result<ChunkPlan, String> {
    let config = chunk_config(item.chunk_size, item.chunk_overlap, &item.chunk_unit)?;
    plan(
        text,
        &config,
        &item.provider.kind,
        &item.model,
        &item.document_prefix,
    )
}

/// [`plan_chunks`] with the settings given apart (a watched row's come from `rag._sync_row`).
pub fn plan(
    text: store::DocumentText,
    config: &ChunkConfig,
    provider_kind: &Kind,
    model_name: &str,
    document_prefix: &str,
) -> Result<ChunkPlan, String> {
    let bounds = chunk_bounds(
        &text.body,
        config,
        provider_kind,
        model_name,
        document_prefix,
    )?;
    let headings = rag_chunk::headings_above(&text.body, &bounds);
    Ok(ChunkPlan {
        body: text.body,
        title: text.title,
        past_first: false,
        page_offsets: text.page_offsets.unwrap_or_default(),
        bounds: bounds.into_iter(),
        headings: headings.into_iter(),
    })
}

/// The text embedded for a chunk of `item`'s document (`rag_chunk::embedding_input`: the document prefix, then
/// the chunk behind its header, as `rag._with_header` indexes and reranks it). Only an in-process model's window
/// is known here; a model that cannot be loaded fails the embedding call itself, with its own message.
pub fn embedding_text(item: &WorkItem, header: Option<&str>, content: &str) -> String {
    rag_chunk::embedding_input(&item.document_prefix, header, content, |input| {
        if item.provider.kind != Kind::Local {
            return true;
        }
        provider::local_model(&item.model)
            .ok()
            .and_then(|model| {
                model
                    .count_tokens(input)
                    .ok()
                    .map(|tokens| tokens <= model.max_tokens())
            })
            .unwrap_or(true)
    })
}

/// 1-based page holding character `position`, from the offsets at which pages start.
fn page_of(page_offsets: &[i32], position: usize) -> Option<i32> {
    if page_offsets.is_empty() {
        return None;
    }
    let index = page_offsets.partition_point(|&start| start as usize <= position);
    Some(index.max(1) as i32)
}
