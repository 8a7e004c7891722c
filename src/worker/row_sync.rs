//! Watched rows: bringing the document of one changed row up to date in one step.
use crate::error::RagError;
use crate::store::{self, RowItem, RowSync};
use crate::worker::chunking::{chunk_config, plan, store_plan};
use crate::worker::steps::Steps;

/// Reads the row as its table's owner, and inserts (then queues, as an ingested one), updates or deletes the
/// document; a changed one is chunked again here, keeping the vectors of unchanged chunks. A failure is
/// recorded on the row (it backs off and is tried again).
pub fn sync_row(steps: &impl Steps, row: &RowItem) {
    let synced = steps.run(|| {
        let RowSync::Chunk {
            document_id,
            size,
            overlap,
            unit,
            provider_kind,
            model,
            document_prefix,
        } = store::sync_row(row.id)?
        else {
            store::row_done(row.id, row.version, None)?;
            return Ok::<_, RagError>(());
        };
        // Read back from the document this transaction just wrote (and holds locked), once the sync's own copies
        // of the text are gone: handed back in its reply, they were all held at once.
        let Some(text) = store::load_text(document_id)? else {
            return Err(RagError::Internal(format!(
                "the document {document_id} of watched row {} was gone right after its sync",
                row.id
            )));
        };
        // A text that cannot be chunked fails the step, which rolls the document back to what it was: kept, its
        // new text sat beside its old chunks and, read again at the retry as unchanged, stayed so (review of
        // session 35).
        let plan = chunk_config(size, overlap, &unit)
            .and_then(|config| plan(text, &config, &provider_kind, &model, &document_prefix))
            .map_err(RagError::Aborted)?;
        // The old chunks go aside and the new ones are stored a batch at a time, taking the vectors of unchanged
        // text: the document's row stays locked from the first step to the commit, so nothing else writes its
        // chunks meanwhile.
        store::set_aside_chunks(document_id)?;
        store_plan(document_id, plan)?;
        store::end_replacing_chunks(document_id)?;
        store::row_done(row.id, row.version, None)?;
        Ok(())
    });
    let (error, for_good) = match synced {
        Ok(()) => return,
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
