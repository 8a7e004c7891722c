//! The claim loop: take the next due watched row or queued document, and work on a document for one slice:
//! chunk it if needed, embed its chunks in batches, store the vectors, mark it ready. No transaction is open
//! while a provider call is in flight, and only chunks still lacking a vector are sent, so a retry after a
//! partial success pays only for what is missing.
use crate::error::RagError;
use crate::store::NewChunk;
use crate::store::{self, WorkItem};
use crate::worker::breaker::{breaker_key, Providers};
use crate::worker::chunking::{chunk_document, embedding_text, plan_chunks, store_plan, Chunked};
use crate::worker::row_sync::sync_row;
use crate::worker::steps::{Step, Steps};
use rag_embed::{EmbedOutput, ProviderError, ProviderKind, RetryPolicy, SplitMix64};
use std::time::{Duration, Instant};

/// How long one claim works on one document before giving the others their turn. A document of thousands of
/// chunks is embedded in slices of about this long, so a small document of another collection that arrives
/// meanwhile waits one slice, not the whole document.
const SLICE: Duration = Duration::from_secs(1);

/// How long a document whose store waited out its lock waits before it is tried again, the first time.
const LOCK_RETRY: Duration = Duration::from_secs(2);
/// The longest it waits when that keeps happening.
const LOCK_RETRY_MAX: Duration = Duration::from_secs(60);

thread_local! {
    /// Documents whose store found a lock held, by how many times in a row (forgotten when one is stored).
    static LOCK_WAITS: std::cell::RefCell<std::collections::HashMap<i64, u32>> =
        std::cell::RefCell::new(std::collections::HashMap::new());
}

/// How long a document waits after its store found a lock held `times_in_a_row` times: 2 s, doubling up to a
/// minute. Its chunks were embedded every time (a billed call on a paid provider) and are embedded again at the
/// next try, so a transaction left open on its collection (an admin's uncommitted `rag_set_search`) must not
/// cost a provider call every few seconds for as long as it stays open.
fn lock_retry_after(times_in_a_row: u32) -> Duration {
    // The retry policy's doubling without its jitter (nothing to spread: one document, one lock).
    RetryPolicy {
        base: LOCK_RETRY,
        cap: LOCK_RETRY_MAX,
        deadline: Duration::MAX,
    }
    .ceiling(times_in_a_row)
}

/// Counts one more lock found held for the document; returns how many times in a row.
fn count_lock_wait(document_id: i64) -> u32 {
    LOCK_WAITS.with_borrow_mut(|waits| {
        // Documents deleted while waiting are never stored: the count of a long-lived worker stays bounded.
        if waits.len() >= 10_000 && !waits.contains_key(&document_id) {
            waits.clear();
        }
        let times = waits.entry(document_id).or_insert(0);
        *times = times.saturating_add(1);
        *times
    })
}

fn forget_lock_waits(document_id: i64) {
    LOCK_WAITS.with_borrow_mut(|waits| waits.remove(&document_id));
}

thread_local! {
    /// Collections this process served, least recently first: the claim lets the others go first, so
    /// collections take turns.
    static RECENTLY_SERVED: std::cell::RefCell<Vec<i32>> = const { std::cell::RefCell::new(Vec::new()) };
    /// Where this process's next claim of each collection starts (`store::ClaimPlaces`), and since when it
    /// has kept them.
    static CLAIM_PLACES: std::cell::RefCell<(Instant, store::ClaimPlaces)> =
        std::cell::RefCell::new((Instant::now(), store::ClaimPlaces::default()));
}

/// How long a claim's places are kept: an item behind one (a claim another process gave up, an older
/// transaction's insert that committed late) waits at most this long while the collection has items after it.
const CLAIM_PLACES_KEPT: Duration = Duration::from_secs(2);

/// Documents claimed together at most (`rag._claim_more`): small new documents of one collection share
/// provider calls and transactions, which per document cost more than the work itself (BENCHMARKS.md §3).
pub const GROUP_DOCUMENTS: usize = 32;
/// Documents claimed together at most before this worker has called the provider and model at all (so it
/// knows nothing of their pace): a first group of the full size held a slow provider's documents for a whole
/// slice while the other workers, just woken, found nothing to claim. A small first group takes a call or
/// two, after which the pace sizes the groups (a provider too fast to measure gets the full size).
const FIRST_GROUP_DOCUMENTS: usize = 4;
/// Text of a document claimed beside another, at most: small enough that its chunks fit one provider call at
/// the chunk sizes collections use. A larger one is claimed on its own and takes the regular path.
const COMPANION_MAX_BYTES: i32 = 16 * 1024;

/// Chunks of a document stored with their vectors in one go, at most: a larger one has its chunks stored
/// first, so that `rag.status` shows its progress while it is embedded batch by batch.
const WHOLE_DOCUMENT_MAX_CHUNKS: usize = 32;

thread_local! {
    /// Whether this worker's last step synced a watched row: the next one looks at documents first.
    static LAST_STEP_SYNCED_A_ROW: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Whether this worker's last step synced a watched row (ran a table owner's code).
pub fn last_step_synced_a_row() -> bool {
    LAST_STEP_SYNCED_A_ROW.get()
}

/// Syncs the next due watched row, if any; true when there was one.
fn sync_next_row(steps: &impl Steps, pid: i32) -> Result<bool, RagError> {
    let Some(row) = steps.run(|| store::claim_row(pid))? else {
        return Ok(false);
    };
    crate::pg::report_activity(Some("rag worker: syncing a changed row of a watched table"));
    sync_row(steps, &row);
    LAST_STEP_SYNCED_A_ROW.set(true);
    Ok(true)
}

/// `max_documents`: how many small new documents one round may take together (1: one at a time).
pub fn process_next(
    steps: &impl Steps,
    providers: &mut Providers,
    rng: &mut SplitMix64,
    max_documents: usize,
) -> Result<Step, RagError> {
    let pid = crate::pg::my_pid();
    // Watched rows and documents take turns. Turning a changed row into chunks is usually cheap and feeds the
    // embedding queue, so rows go first; but a row runs its table owner's expressions, which may take up to
    // rag.expression_timeout each, and rows always first let one slow watch hold every document of the
    // database (15 rows of 2 s kept another collection's one-chunk document waiting 30 s).
    let rows_first = !LAST_STEP_SYNCED_A_ROW.get();
    if rows_first && sync_next_row(steps, pid)? {
        return Ok(Step::Worked);
    }
    LAST_STEP_SYNCED_A_ROW.set(false);
    let skip = providers.cooling_down();
    let recent = RECENTLY_SERVED.with(|served| served.borrow().clone());
    let budgets = providers.claim_budgets(SLICE);
    let claimed = steps.run(|| -> Result<_, RagError> {
        // The worker's session lasts: its claims and stores were planned for the tables as they were then (and
        // early in a load they double between two of upkeep_while_busy's resets).
        crate::plans::replan_if_tables_grew();
        let claimed = CLAIM_PLACES.with_borrow_mut(|(since, places)| {
            if since.elapsed() >= CLAIM_PLACES_KEPT {
                places.forget();
                *since = Instant::now();
            }
            store::claim_next(pid, skip, recent, places)
        });
        let Some(item) = claimed? else {
            return Ok(None);
        };
        let mut companions = Vec::new();
        if is_new(&item) && max_documents > 1 {
            // A group embeds in about one slice at the provider's pace, so that with a slow provider the
            // other workers find documents to claim too.
            let (group, budget) = match budgets.get(&breaker_key(&item.provider.name, &item.model))
            {
                Some(budget) => (max_documents, *budget),
                None => (max_documents.min(FIRST_GROUP_DOCUMENTS), None),
            };
            let more = store::claim_more(
                pid,
                item.queue_id,
                (group - 1) as i32,
                COMPANION_MAX_BYTES,
                budget,
            )?;
            companions = more
                .into_iter()
                .map(|(queue_id, document_id)| WorkItem {
                    queue_id,
                    document_id,
                    ..item.clone()
                })
                .collect();
        }
        Ok(Some((item, companions)))
    })?;
    let Some((item, companions)) = claimed else {
        if !rows_first && sync_next_row(steps, pid)? {
            return Ok(Step::Worked);
        }
        return Ok(Step::Idle(providers.next_close()));
    };
    crate::pg::report_activity(Some(&format!(
        "rag worker: embedding {} document{} of collection {} ({})",
        1 + companions.len(),
        if companions.is_empty() { "" } else { "s" },
        item.collection_id,
        item.model
    )));
    CLAIM_PLACES.with_borrow_mut(|(_, places)| places.remember(&item));
    RECENTLY_SERVED.with(|served| {
        let mut served = served.borrow_mut();
        served.retain(|&collection| collection != item.collection_id);
        served.push(item.collection_id);
    });
    let collection_id = item.collection_id;
    let step = if is_new(&item) {
        work_on_new(steps, providers, rng, item, companions)
    } else {
        work_on(steps, providers, rng, &item)
    };
    // The end of a bulk load is built once its last documents are ready, not in their transaction.
    if !matches!(step, Step::Stopped) {
        if let Err(error) = steps.run(|| store::build_index_after_load(collection_id)) {
            pgrx::log!("rag: building the HNSW index of collection {collection_id} after its load: {error}");
        }
    }
    Ok(step)
}

/// A document never tried and not yet chunked, for the collection's searched space: the whole-document path
/// may take it.
fn is_new(item: &WorkItem) -> bool {
    item.needs_chunking && !item.shadow && item.attempts == 0
}

/// What chunking did to one document of a group.
enum Prepared {
    /// Its chunks fit one provider call: they are embedded and stored with their vectors at once.
    Whole(Vec<NewChunk>),
    /// Too many chunks for that: they are stored, and the regular path embeds them.
    Chunked,
    /// Deleted meanwhile.
    Gone,
    /// It cannot be chunked with its collection's settings.
    Refused(String),
}

/// New documents (the claimed one first, then the ones claimed with it): each is chunked here, and those
/// whose chunks fit one provider call are embedded together, as many per call as fit, and stored with their
/// vectors in one statement per call (`rag._store_documents`): no chunk row is written twice and no
/// document needs a transaction of its own. Whatever goes wrong for a group sends its documents down the
/// regular path one by one, which tells the faulty one from the others.
fn work_on_new(
    steps: &impl Steps,
    providers: &mut Providers,
    rng: &mut SplitMix64,
    head: WorkItem,
    companions: Vec<WorkItem>,
) -> Step {
    let batch_size = crate::settings::BATCH_SIZE.get().max(1) as usize;
    let group: Vec<WorkItem> = std::iter::once(head).chain(companions).collect();
    let prepared = match steps.run(|| prepare(&group, batch_size)) {
        Ok(prepared) => prepared,
        Err(error) => {
            pgrx::log!(
                "rag worker: chunking {} new documents together failed ({error}); taking them one by one",
                group.len()
            );
            return each_alone(steps, providers, rng, &group);
        }
    };
    let mut whole: Vec<(&WorkItem, Vec<NewChunk>)> = Vec::new();
    let mut head_chunked = false;
    for (index, (item, outcome)) in group.iter().zip(prepared).enumerate() {
        match outcome {
            Prepared::Whole(chunks) => whole.push((item, chunks)),
            Prepared::Chunked => head_chunked |= index == 0,
            Prepared::Gone => {}
            Prepared::Refused(reason) => {
                fail(steps, item, reason);
            }
        }
    }
    let client = match providers.client(&group[0].provider, &group[0].model) {
        Ok(client) => client.clone(),
        Err(reason) => {
            for (item, _) in &whole {
                fail(steps, item, reason.clone());
            }
            if head_chunked {
                fail(steps, &group[0], reason);
            }
            return Step::Worked;
        }
    };
    // Claims handed back unworked: the documents of these calls, and the group's first when its chunks were
    // stored for the regular path.
    let unworked = |rest: Vec<(&WorkItem, Vec<NewChunk>)>| -> Vec<WorkItem> {
        rest.into_iter()
            .map(|(item, _)| item.clone())
            .chain(head_chunked.then(|| group[0].clone()))
            .collect()
    };
    let slice_started = Instant::now();
    let mut calls = pack_calls(whole, batch_size).into_iter();
    let mut first_call = true;
    while let Some(call) = calls.next() {
        if steps.interrupted() {
            release_all(
                steps,
                &unworked(std::iter::once(call).chain(calls).flatten().collect()),
            );
            return Step::Stopped;
        }
        // After at least one call, so that every round gets somewhere.
        if !std::mem::take(&mut first_call) && slice_started.elapsed() >= SLICE {
            // A slow provider (the local model, say): the rest goes back to the queue, where the next claim,
            // this worker's or another's, takes it. Workers then share the group's documents instead of one
            // of them holding them all, and other collections get their turn.
            release_all(
                steps,
                &unworked(std::iter::once(call).chain(calls).flatten().collect()),
            );
            crate::worker::registry::wake_workers_of_current_database();
            return Step::Worked;
        }
        match embed_whole(steps, providers, rng, &client, call) {
            Call::Stored => {}
            Call::Stopped(rest) => {
                release_all(
                    steps,
                    &unworked(rest.into_iter().chain(calls.flatten()).collect()),
                );
                return Step::Stopped;
            }
            Call::ProviderDown => {
                // The breaker is open for this model now: the rest waits for it unclaimed, uncounted.
                release_all(steps, &unworked(calls.flatten().collect()));
                return Step::Worked;
            }
        }
    }
    if head_chunked {
        // Its chunks are stored: the regular path goes on with it in this round.
        let head = WorkItem {
            needs_chunking: false,
            ..group[0].clone()
        };
        return work_on(steps, providers, rng, &head);
    }
    Step::Worked
}

/// Chunks each document of a group, in the caller's step. A document with more chunks than one call takes (or
/// than WHOLE_DOCUMENT_MAX_CHUNKS) has them stored; when it is not the group's first, its claim is handed back
/// for the regular path.
fn prepare(group: &[WorkItem], batch_size: usize) -> Result<Vec<Prepared>, RagError> {
    let ids: Vec<i64> = group.iter().map(|item| item.document_id).collect();
    let mut texts = store::load_texts(&ids)?;
    let mut prepared = Vec::with_capacity(group.len());
    for (index, item) in group.iter().enumerate() {
        let Some(position) = texts.iter().position(|(id, _)| *id == item.document_id) else {
            prepared.push(Prepared::Gone);
            continue;
        };
        let (_, text) = texts.swap_remove(position);
        let plan = match plan_chunks(item, text) {
            Ok(plan) => plan,
            Err(reason) => {
                prepared.push(Prepared::Refused(reason));
                continue;
            }
        };
        // A document without chunks (only whitespace) has nothing to embed: the regular path finishes it.
        if !plan.is_empty() && plan.len() <= batch_size.min(WHOLE_DOCUMENT_MAX_CHUNKS) {
            prepared.push(Prepared::Whole(plan.into_batches().flatten().collect()));
            continue;
        }
        // A document deleted meanwhile is left to the regular path, which finds it gone.
        store_plan(item.document_id, plan)?;
        if index > 0 {
            store::defer(item.queue_id, 0, None, false)?;
        }
        prepared.push(Prepared::Chunked);
    }
    Ok(prepared)
}

/// Documents packed into provider calls of at most `batch_size` texts, each document whole in one call.
fn pack_calls(
    documents: Vec<(&WorkItem, Vec<NewChunk>)>,
    batch_size: usize,
) -> Vec<Vec<(&WorkItem, Vec<NewChunk>)>> {
    let mut calls: Vec<Vec<(&WorkItem, Vec<NewChunk>)>> = Vec::new();
    let mut texts_in_last = 0;
    for (item, chunks) in documents {
        if calls.is_empty() || texts_in_last + chunks.len() > batch_size {
            calls.push(Vec::new());
            texts_in_last = 0;
        }
        texts_in_last += chunks.len();
        if let Some(last) = calls.last_mut() {
            last.push((item, chunks));
        }
    }
    calls
}

/// How one provider call of a group ended.
enum Call<'a> {
    /// Its documents are stored, refused or handed back, each as it deserved.
    Stored,
    /// Shutdown: these documents of the call were not stored.
    Stopped(Vec<(&'a WorkItem, Vec<NewChunk>)>),
    /// A transient failure: the first document carries it (back-off, breaker); the others are released.
    ProviderDown,
}

fn embed_whole<'a>(
    steps: &impl Steps,
    providers: &mut Providers,
    rng: &mut SplitMix64,
    client: &crate::provider::Embedder,
    call: Vec<(&'a WorkItem, Vec<NewChunk>)>,
) -> Call<'a> {
    let first = call[0].0;
    let texts: Vec<String> = call
        .iter()
        .flat_map(|(item, chunks)| {
            chunks
                .iter()
                .map(|chunk| embedding_text(item, chunk.header.as_deref(), &chunk.content))
        })
        .collect();
    let mut interrupt = || steps.interrupted();
    let dimensions = first
        .dimensions
        .filter(|_| first.provider.kind == crate::provider::Kind::Server(ProviderKind::OpenAi))
        .map(|d| d as u32);
    let embedded = embed_timed(providers, client, first, &texts, dimensions, &mut interrupt);
    let output = match embedded {
        Ok(output) if output.vectors.len() == texts.len() => output,
        Ok(_) => {
            each_alone(steps, providers, rng, &items_of(&call));
            return Call::Stored;
        }
        Err(ProviderError::Interrupted) => return Call::Stopped(call),
        Err(error @ (ProviderError::Permanent { .. } | ProviderError::InputTooLong { .. })) => {
            if call.len() == 1 {
                fail(
                    steps,
                    first,
                    format!("embedding provider \"{}\": {error}", first.provider.name),
                );
            } else {
                // One document's text may be what the provider refuses: the regular path finds which.
                each_alone(steps, providers, rng, &items_of(&call));
            }
            return Call::Stored;
        }
        Err(error @ ProviderError::Transient { .. }) => {
            back_off(steps, providers, rng, first, error);
            for (item, _) in call.iter().skip(1) {
                release(steps, item);
            }
            return Call::ProviderDown;
        }
    };
    providers.reset(&breaker_key(&first.provider.name, &first.model));
    let dimensions = output.vectors.first().map(|v| v.len()).unwrap_or(0) as i32;
    let total_chars: usize = texts.iter().map(|text| text.len()).sum::<usize>().max(1);
    let mut vectors = output.vectors.into_iter();
    let mut texts = texts.iter();
    // The chunks move into what is stored; the documents stay for what comes after.
    let (items, chunk_lists): (Vec<&WorkItem>, Vec<Vec<NewChunk>>) = call.into_iter().unzip();
    let mut documents = Vec::with_capacity(items.len());
    for (item, chunks) in items.iter().zip(chunk_lists) {
        let count = chunks.len();
        let own: Vec<Vec<f32>> = vectors.by_ref().take(count).collect();
        let own_chars: usize = texts.by_ref().take(count).map(|text| text.len()).sum();
        // A provider reports tokens per call: each document is charged its share by length.
        let tokens = output
            .prompt_tokens
            .map(|total| (total as f64 * own_chars as f64 / total_chars as f64).round() as i64);
        documents.push(store::WholeDocument {
            queue_id: item.queue_id,
            document_id: item.document_id,
            chunks,
            vectors: own,
            tokens,
        });
    }
    let collection_id = first.collection_id;
    let model = first.model.clone();
    let provider = first.provider.name.clone();
    let stored = steps.run(move || {
        let outcomes = store::store_documents(documents, dimensions, &model, &provider)?;
        store::fit_index_to_load(collection_id)?;
        Ok::<_, RagError>(outcomes)
    });
    match stored {
        Ok(outcomes) => {
            let mut elsewhere = Vec::new();
            for (item, outcome) in items.iter().zip(outcomes) {
                match outcome {
                    store::StoredDocument::Ready => forget_lock_waits(item.document_id),
                    // Taken on at once rather than released: released, it would come back to this path.
                    store::StoredDocument::NotApplicable => elsewhere.push((*item).clone()),
                    store::StoredDocument::Refused(reason) => {
                        fail(steps, item, reason);
                    }
                }
            }
            if !elsewhere.is_empty() {
                if let Step::Stopped = each_alone(steps, providers, rng, &elsewhere) {
                    return Call::Stopped(Vec::new());
                }
            }
        }
        Err(RagError::LockBusy(_)) => {
            for item in &items {
                wait_for_lock(steps, item);
            }
        }
        Err(error) => {
            pgrx::log!(
                "rag worker: storing {} new documents together failed ({error}); taking them one by one",
                items.len()
            );
            let items: Vec<WorkItem> = items.into_iter().cloned().collect();
            each_alone(steps, providers, rng, &items);
        }
    }
    Call::Stored
}

fn items_of(call: &[(&WorkItem, Vec<NewChunk>)]) -> Vec<WorkItem> {
    call.iter().map(|(item, _)| (*item).clone()).collect()
}

/// The regular path for each document, one after the other (their claims are this worker's).
fn each_alone(
    steps: &impl Steps,
    providers: &mut Providers,
    rng: &mut SplitMix64,
    items: &[WorkItem],
) -> Step {
    for (index, item) in items.iter().enumerate() {
        if steps.interrupted() {
            for rest in &items[index..] {
                release(steps, rest);
            }
            return Step::Stopped;
        }
        if let Step::Stopped = work_on(steps, providers, rng, item) {
            for rest in &items[index + 1..] {
                release(steps, rest);
            }
            return Step::Stopped;
        }
    }
    Step::Worked
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
            Batch::Stored => forget_lock_waits(item.document_id),
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
    batch: Vec<store::PendingChunk>,
) -> Batch {
    let (ids, texts): (Vec<i64>, Vec<String>) = batch
        .into_iter()
        .map(|chunk| {
            let text = embedding_text(item, chunk.header.as_deref(), &chunk.content);
            (chunk.id, text)
        })
        .unzip();
    let mut interrupt = || steps.interrupted();
    // OpenAI-style APIs can shorten vectors to the collection's dimension (text-embedding-3-*); Ollama and
    // local models have a fixed size, which the stored dimension checks instead.
    let dimensions = item
        .dimensions
        .filter(|_| item.provider.kind == crate::provider::Kind::Server(ProviderKind::OpenAi))
        .map(|d| d as u32);
    match embed_timed(providers, client, item, &texts, dimensions, &mut interrupt) {
        Ok(output) => {
            providers.reset(&breaker_key(&item.provider.name, &item.model));
            match store_batch(steps, item, ids, output) {
                Ok(None) => Batch::Stored,
                Ok(Some(reason)) => Batch::Done(fail(steps, item, reason)),
                Err(RagError::LockBusy(_)) => Batch::Done(wait_for_lock(steps, item)),
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
        Err(error @ (ProviderError::Permanent { .. } | ProviderError::InputTooLong { .. })) => {
            Batch::Done(fail(
                steps,
                item,
                format!("embedding provider \"{}\": {error}", item.provider.name),
            ))
        }
        Err(error @ ProviderError::Transient { .. }) => {
            Batch::Done(back_off(steps, providers, rng, item, error))
        }
    }
}

/// One provider call for `item`'s provider and model, whose pace (text per second) is noted when it succeeds:
/// the claims that follow are sized by it (`Providers::claim_budgets`).
fn embed_timed(
    providers: &mut Providers,
    client: &crate::provider::Embedder,
    item: &WorkItem,
    texts: &[String],
    dimensions: Option<u32>,
    interrupt: &mut dyn FnMut() -> bool,
) -> Result<EmbedOutput, ProviderError> {
    crate::api::process::embedding_call_sent(item);
    let started = Instant::now();
    let embedded = client.embed(&item.model, texts, dimensions, interrupt);
    if embedded.is_ok() {
        providers.note_call(
            &breaker_key(&item.provider.name, &item.model),
            texts.iter().map(String::len).sum(),
            started.elapsed(),
        );
    }
    embedded
}

/// Stores a batch's vectors; Some(reason) when the document must fail (a vector of another dimension).
fn store_batch(
    steps: &impl Steps,
    item: &WorkItem,
    ids: Vec<i64>,
    output: EmbedOutput,
) -> Result<Option<String>, RagError> {
    let dimensions = output.vectors.first().map(|v| v.len()).unwrap_or(0) as i32;
    let vectors: Vec<f32> = output.vectors.into_iter().flatten().collect();
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
                provider: item.provider.name.clone(),
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

/// Another transaction holds a lock the store needs (a writer's uncommitted delete of the document, an
/// admin's uncommitted model change): the document waits a little (longer each time in a row,
/// `lock_retry_after`), its attempts uncounted, and the worker goes on with other work.
fn wait_for_lock(steps: &impl Steps, item: &WorkItem) -> Step {
    let note = "waiting for a lock another transaction holds on the document or its collection"
        .to_string();
    let wait = lock_retry_after(count_lock_wait(item.document_id));
    if let Err(error) = steps.run(|| {
        store::defer(
            item.queue_id,
            wait.as_millis() as i64,
            Some(note.clone()),
            false,
        )
    }) {
        pgrx::log!(
            "rag worker: could not put document {} back: {error}",
            item.document_id
        );
    }
    Step::Worked
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
    release_all(steps, std::slice::from_ref(item));
}

/// Gives claims back untouched, in one step.
fn release_all(steps: &impl Steps, items: &[WorkItem]) {
    if items.is_empty() {
        return;
    }
    let released = steps.run(|| {
        items
            .iter()
            .try_for_each(|item| store::defer(item.queue_id, 0, None, false))
    });
    if let Err(error) = released {
        // The claims die with this process anyway (claims of gone processes are free to take).
        let documents: Vec<i64> = items.iter().map(|item| item.document_id).collect();
        pgrx::log!("rag worker: could not release documents {documents:?}: {error}");
    }
}
