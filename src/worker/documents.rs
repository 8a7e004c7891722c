//! The claim loop: take the next due watched row or queued document, and work on a document for one slice:
//! chunk it if needed, embed its chunks in batches, store the vectors, mark it ready. No transaction is open
//! while a provider call is in flight, and only chunks still lacking a vector are sent, so a retry after a
//! partial success pays only for what is missing.
use crate::error::RagError;
use crate::store::{self, WorkItem};
use crate::worker::breaker::{breaker_key, Providers};
use crate::worker::chunking::{chunk_document, Chunked};
use crate::worker::row_sync::sync_row;
use crate::worker::steps::{Step, Steps};
use rag_embed::{EmbedOutput, ProviderError, ProviderKind, RetryPolicy, SplitMix64};
use std::time::{Duration, Instant};

/// How long one claim works on one document before giving the others their turn. A document of thousands of
/// chunks is embedded in slices of about this long, so a small document of another collection that arrives
/// meanwhile waits one slice, not the whole document.
const SLICE: Duration = Duration::from_secs(1);

thread_local! {
    /// Collections this process served, least recently first: the claim lets the others go first, so
    /// collections take turns.
    static RECENTLY_SERVED: std::cell::RefCell<Vec<i32>> = const { std::cell::RefCell::new(Vec::new()) };
}

pub fn process_next(
    steps: &impl Steps,
    providers: &mut Providers,
    rng: &mut SplitMix64,
) -> Result<Step, RagError> {
    let pid = crate::pg::my_pid();
    // Watched rows first: turning a changed row into chunks is cheap, and it feeds the embedding queue.
    if let Some(row) = steps.run(|| store::claim_row(pid))? {
        sync_row(steps, &row);
        return Ok(Step::Worked);
    }
    let skip = providers.cooling_down();
    let recent = RECENTLY_SERVED.with(|served| served.borrow().clone());
    let Some(item) = steps.run(|| store::claim_next(pid, skip, recent))? else {
        return Ok(Step::Idle(providers.next_close()));
    };
    RECENTLY_SERVED.with(|served| {
        let mut served = served.borrow_mut();
        served.retain(|&collection| collection != item.collection_id);
        served.push(item.collection_id);
    });
    Ok(work_on(steps, providers, rng, &item))
}

/// What to do after one batch of a document.
enum Batch {
    /// Stored; go on with the next batch.
    Stored,
    /// The round for this document is over, with this result.
    Done(Step),
}

/// One slice of work on a claimed document.
fn work_on(
    steps: &impl Steps,
    providers: &mut Providers,
    rng: &mut SplitMix64,
    item: &WorkItem,
) -> Step {
    if item.needs_chunking {
        match steps.run(|| chunk_document(item)) {
            Ok(Chunked::Stored) | Ok(Chunked::Gone) => {}
            Ok(Chunked::Refused(reason)) => return fail(steps, item, reason),
            Err(error) => return fail(steps, item, format!("chunking failed: {error}")),
        }
    }
    let client = match providers.client(&item.provider, &item.model) {
        Ok(client) => client.clone(),
        Err(reason) => return fail(steps, item, reason),
    };
    let batch_size = crate::settings::BATCH_SIZE.get().max(1);
    let slice_started = Instant::now();
    loop {
        if steps.interrupted() {
            release(steps, item);
            return Step::Stopped;
        }
        if slice_started.elapsed() >= SLICE {
            // Back in the queue at once; the claim order lets other collections go first.
            release(steps, item);
            return Step::Worked;
        }
        let batch =
            match steps.run(|| store::pending_chunks(item.document_id, batch_size, item.shadow)) {
                Ok(batch) => batch,
                Err(error) => return fail(steps, item, format!("reading chunks failed: {error}")),
            };
        if batch.is_empty() {
            if let Err(error) = steps.run(|| store::finish(item.queue_id, item.document_id)) {
                pgrx::log!(
                    "rag worker: could not finish document {}: {error}",
                    item.document_id
                );
            }
            return Step::Worked;
        }
        match embed_batch(steps, providers, rng, item, &client, batch) {
            Batch::Stored => {}
            Batch::Done(step) => return step,
        }
    }
}

/// Embeds one batch of a document's chunks and stores the vectors; on a provider failure, fails the
/// document (permanent) or defers it with back-off and trips the provider's breaker (transient).
fn embed_batch(
    steps: &impl Steps,
    providers: &mut Providers,
    rng: &mut SplitMix64,
    item: &WorkItem,
    client: &crate::provider::Embedder,
    batch: Vec<(i64, String)>,
) -> Batch {
    let (ids, texts): (Vec<i64>, Vec<String>) = batch
        .into_iter()
        .map(|(id, text)| (id, format!("{}{}", item.document_prefix, text)))
        .unzip();
    let mut interrupt = || steps.interrupted();
    // OpenAI-style APIs can shorten vectors to the collection's dimension (text-embedding-3-*); Ollama and
    // local models have a fixed size, which the stored dimension checks instead.
    let dimensions = item
        .dimensions
        .filter(|_| item.provider.kind == crate::provider::Kind::Server(ProviderKind::OpenAi))
        .map(|d| d as u32);
    match client.embed(&item.model, &texts, dimensions, &mut interrupt) {
        Ok(output) => {
            providers.reset(&breaker_key(&item.provider.name, &item.model));
            match store_batch(steps, item, ids, output) {
                Ok(None) => Batch::Stored,
                Ok(Some(reason)) => Batch::Done(fail(steps, item, reason)),
                Err(error) => Batch::Done(fail(
                    steps,
                    item,
                    format!("storing vectors failed: {error}"),
                )),
            }
        }
        Err(ProviderError::Interrupted) => {
            release(steps, item);
            Batch::Done(Step::Stopped)
        }
        Err(error @ ProviderError::Permanent { .. }) => Batch::Done(fail(
            steps,
            item,
            format!("embedding provider \"{}\": {error}", item.provider.name),
        )),
        Err(error @ ProviderError::Transient { .. }) => {
            Batch::Done(back_off(steps, providers, rng, item, error))
        }
    }
}

/// Stores a batch's vectors; Some(reason) when the document must fail (a vector of another dimension).
fn store_batch(
    steps: &impl Steps,
    item: &WorkItem,
    ids: Vec<i64>,
    output: EmbedOutput,
) -> Result<Option<String>, RagError> {
    let dimensions = output.vectors.first().map(|v| v.len()).unwrap_or(0) as i32;
    let vectors: Vec<String> = output
        .vectors
        .iter()
        .map(|v| crate::api::query::vector_literal(v))
        .collect();
    steps.run(|| {
        store::store_embeddings(
            item.queue_id,
            item.document_id,
            store::Embedded {
                chunk_ids: ids,
                vectors,
                dimensions,
                tokens: output.prompt_tokens,
                model: item.model.clone(),
                shadow: item.shadow,
            },
        )
    })
}

/// A transient provider failure: the document waits (the provider asked for a time, or the retry policy's
/// back-off) and the provider's breaker opens; past the collection's retry deadline the document fails.
fn back_off(
    steps: &impl Steps,
    providers: &mut Providers,
    rng: &mut SplitMix64,
    item: &WorkItem,
    error: ProviderError,
) -> Step {
    let policy = RetryPolicy {
        deadline: Duration::from_secs(item.retry_deadline_seconds.max(1) as u64),
        ..RetryPolicy::default()
    };
    let elapsed = Duration::from_secs_f64(item.failure_age_seconds.unwrap_or(0.0).max(0.0));
    let attempt = item.attempts.max(0) as u32 + 1;
    let message = format!("embedding provider \"{}\": {error}", item.provider.name);
    match policy.next_delay(attempt, elapsed, error.retry_after(), rng) {
        Some(delay) => {
            providers.trip(&breaker_key(&item.provider.name, &item.model), delay);
            let deferred = steps.run(|| {
                store::defer(
                    item.queue_id,
                    delay.as_millis() as i64,
                    Some(message.clone()),
                    true,
                )
            });
            if let Err(error) = deferred {
                pgrx::log!(
                    "rag worker: could not defer document {}: {error}",
                    item.document_id
                );
            }
            Step::Worked
        }
        None => fail(
            steps,
            item,
            format!(
                "gave up after {} s of transient failures ({attempt} attempts): {message}",
                item.retry_deadline_seconds
            ),
        ),
    }
}

/// Marks the document failed with its reason.
fn fail(steps: &impl Steps, item: &WorkItem, reason: String) -> Step {
    if let Err(error) =
        steps.run(|| store::fail(item.queue_id, item.document_id, &reason, item.shadow))
    {
        pgrx::log!(
            "rag worker: could not record failure of document {}: {error}",
            item.document_id
        );
    }
    Step::Worked
}

/// Gives the claim back untouched so the next worker starts on it at once.
fn release(steps: &impl Steps, item: &WorkItem) {
    if let Err(error) = steps.run(|| store::defer(item.queue_id, 0, None, false)) {
        // The claim dies with this process anyway (claims of gone processes are free to take).
        pgrx::log!(
            "rag worker: could not release document {}: {error}",
            item.document_id
        );
    }
}
