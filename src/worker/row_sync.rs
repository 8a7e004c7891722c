//! Watched rows: bringing the document of one changed row up to date in one step.
use crate::error::RagError;
use crate::store::{self, RowItem, RowSync};
use crate::worker::chunking::{chunk_config, plan};
use crate::worker::steps::Steps;

/// Reads the row as its table's owner, upserts or deletes the document, and re-chunks it keeping the vectors
/// of unchanged chunks. A failure is recorded on the row (it backs off and is tried again).
pub fn sync_row(steps: &impl Steps, row: &RowItem) {
    let synced = steps.run(|| {
        let RowSync::Chunk {
            document_id,
            title,
            body,
            size,
            overlap,
            unit,
            provider_kind,
            model,
            document_prefix,
        } = store::sync_row(row.id)?
        else {
            store::row_done(row.id, row.version, None)?;
            return Ok::<_, RagError>(None);
        };
        let text = store::DocumentText {
            title,
            body,
            page_offsets: None,
        };
        let chunks = match chunk_config(size, overlap, &unit)
            .and_then(|config| plan(text, &config, &provider_kind, &model, &document_prefix))
        {
            Ok(plan) => plan.into_batches().flatten().collect(),
            Err(reason) => return Ok(Some(reason)),
        };
        store::replace_chunks(document_id, chunks)?;
        store::row_done(row.id, row.version, None)?;
        Ok(None)
    });
    let (error, for_good) = match synced {
        Ok(None) => return,
        Ok(Some(reason)) => (reason, false),
        // Over a limit (a title or text too large, markup too deep): the same row gives the same answer, so it
        // waits to be written again (or rag_reindex) instead of being read again at every back-off.
        Err(RagError::LimitExceeded(message)) => (message, true),
        Err(error) => (error.to_string(), false),
    };
    // What is kept of it (rag._row_done keeps 2,000 chars): a table owner's expression can raise an error of
    // any length (100 MB was stored whole), and each copy on the way costs the worker that much.
    let error = bounded_error(error);
    let recorded = steps.run(|| match for_good {
        true => store::row_refused(row.id, row.version, &error),
        false => store::row_done(row.id, row.version, Some(error.clone())),
    });
    if let Err(again) = recorded {
        pgrx::log!(
            "rag worker: could not record the failure of watched row {}: {again} (after: {error})",
            row.id
        );
    }
}

/// The most of a row's error that is stored.
const ROW_ERROR_MAX_CHARS: usize = 2000;

fn bounded_error(error: String) -> String {
    match error.char_indices().nth(ROW_ERROR_MAX_CHARS) {
        Some((cut, _)) => error[..cut].to_string(),
        None => error,
    }
}
