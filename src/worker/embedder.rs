//! The per-database worker: claim a document, chunk it, embed its chunks in batches, store the vectors, mark
//! it ready. No transaction is open while a provider call is in flight, and every step is idempotent: only
//! chunks still lacking a vector are sent, so a retry after a partial success pays only for what is missing.
//!
//! The same steps run inside a user's session for `rag_process_queue()`, with subtransactions instead of
//! transactions, for servers that cannot preload the library.
use crate::provider;
use crate::store::{self, NewChunk, WorkItem};
use crate::worker::registry::{self, SlotState};
use crate::worker::transaction;
use pgrx::bgworkers::{BackgroundWorker, SignalWakeFlags};
use pgrx::prelude::*;
use rag_embed::{ProviderError, RetryPolicy, SplitMix64};
use std::collections::HashMap;
use std::panic::{RefUnwindSafe, UnwindSafe};
use std::time::{Duration, Instant};

/// How the steps of one document are made durable: separate transactions in the worker, subtransactions
/// in a user's session.
pub trait Steps {
    fn run<R>(
        &self,
        body: impl FnOnce() -> Result<R, pgrx::spi::Error> + UnwindSafe + RefUnwindSafe,
    ) -> Result<R, String>;
    /// True when the caller wants the work to stop (shutdown); may also raise (query cancel).
    fn interrupted(&self) -> bool;
}

pub struct WorkerTransactions;

impl Steps for WorkerTransactions {
    fn run<R>(
        &self,
        body: impl FnOnce() -> Result<R, pgrx::spi::Error> + UnwindSafe + RefUnwindSafe,
    ) -> Result<R, String> {
        transaction::run(body).and_then(|result| result.map_err(|error| error.to_string()))
    }
    fn interrupted(&self) -> bool {
        shutdown_requested()
    }
}

pub use crate::pg::shutdown_requested;

pub enum Outcome {
    /// A document was worked on (finished, deferred or failed); look for more at once.
    Worked,
    /// Nothing is due; look again after this long at the latest (a provider's cool-down ends).
    Idle(Option<Duration>),
    /// The caller asked us to stop.
    Stopped,
}

/// Keeps the last provider client so a run of documents on one provider reuses its connections, and a
/// circuit breaker per provider: after a transient failure (429, 5xx, timeout) the provider's documents wait
/// out a cool-down that grows with consecutive failures, while documents of other providers go ahead. One
/// provider that hangs until the HTTP timeout would otherwise stall every collection behind it.
#[derive(Default)]
pub struct ProviderCache {
    key: Option<(provider::ProviderRow, String, Duration)>,
    client: Option<provider::Embedder>,
    open_until: HashMap<String, (Instant, u32)>,
}

impl ProviderCache {
    fn cooling_down(&mut self) -> Vec<String> {
        let now = Instant::now();
        self.open_until.retain(|_, (until, _)| *until > now);
        self.open_until.keys().cloned().collect()
    }

    /// When the earliest open breaker closes, so an idle worker knows when to look again.
    fn next_close(&self) -> Option<Duration> {
        let now = Instant::now();
        self.open_until
            .values()
            .map(|(until, _)| until.saturating_duration_since(now))
            .min()
    }

    fn trip(&mut self, provider: &str, delay: Duration) {
        let failures = self
            .open_until
            .get(provider)
            .map(|(_, failures)| failures + 1)
            .unwrap_or(1);
        let cool_down = RetryPolicy::default().ceiling(failures).max(delay);
        self.open_until
            .insert(provider.to_string(), (Instant::now() + cool_down, failures));
    }

    fn reset(&mut self, provider: &str) {
        self.open_until.remove(provider);
    }

    fn get(
        &mut self,
        row: &provider::ProviderRow,
        model: &str,
    ) -> Result<&provider::Embedder, String> {
        let timeout = crate::settings::http_timeout();
        let wanted = (row.clone(), model.to_string(), timeout);
        if self.key.as_ref() != Some(&wanted) || self.client.is_none() {
            self.client = Some(provider::embedder(row, model, timeout)?);
            self.key = Some(wanted);
        }
        Ok(self.client.as_ref().expect("client was just set"))
    }
}

pub fn process_next(
    steps: &impl Steps,
    cache: &mut ProviderCache,
    rng: &mut SplitMix64,
) -> Result<Outcome, String> {
    let pid = crate::pg::my_pid();
    // Watched rows first: turning a changed row into chunks is cheap, and it feeds the embedding queue.
    if let Some(row) = steps.run(|| store::claim_row(pid))? {
        sync_row(steps, &row);
        return Ok(Outcome::Worked);
    }
    let skip = cache.cooling_down();
    let recent = RECENTLY_SERVED.with(|served| served.borrow().clone());
    let Some(item) = steps.run(|| store::claim_next(pid, skip, recent))? else {
        return Ok(Outcome::Idle(cache.next_close()));
    };
    RECENTLY_SERVED.with(|served| {
        let mut served = served.borrow_mut();
        served.retain(|&collection| collection != item.collection_id);
        served.push(item.collection_id);
    });
    Ok(process_item(steps, cache, rng, &item))
}

thread_local! {
    /// Collections this process served, least recently first: the claim lets the others go first, so
    /// collections take turns.
    static RECENTLY_SERVED: std::cell::RefCell<Vec<i32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// How long one claim works on one document before giving the others their turn. A document of thousands of
/// chunks is embedded in slices of about this long, so a small document of another collection that arrives
/// meanwhile waits one slice, not the whole document.
const SLICE: Duration = Duration::from_secs(1);

fn process_item(
    steps: &impl Steps,
    cache: &mut ProviderCache,
    rng: &mut SplitMix64,
    item: &WorkItem,
) -> Outcome {
    let fail = |reason: String| {
        if let Err(error) = steps.run(|| store::fail(item.queue_id, item.document_id, &reason)) {
            pgrx::log!(
                "rag worker: could not record failure of document {}: {error}",
                item.document_id
            );
        }
        Outcome::Worked
    };

    if item.needs_chunking {
        match steps.run(|| chunk_document(item)) {
            Ok(Ok(_)) => {}
            Ok(Err(reason)) => return fail(reason),
            Err(error) => return fail(format!("chunking failed: {error}")),
        }
    }

    let client = match cache.get(&item.provider, &item.model) {
        Ok(client) => client.clone(),
        Err(reason) => return fail(reason),
    };
    let batch_size = crate::settings::BATCH_SIZE.get().max(1);
    let slice_started = Instant::now();
    loop {
        if steps.interrupted() {
            release(steps, item);
            return Outcome::Stopped;
        }
        if slice_started.elapsed() >= SLICE {
            // Back in the queue at once; the claim order lets other collections go first.
            release(steps, item);
            return Outcome::Worked;
        }
        let batch = match steps.run(|| store::pending_chunks(item.document_id, batch_size)) {
            Ok(batch) => batch,
            Err(error) => return fail(format!("reading chunks failed: {error}")),
        };
        if batch.is_empty() {
            if let Err(error) = steps.run(|| store::finish(item.queue_id, item.document_id)) {
                pgrx::log!(
                    "rag worker: could not finish document {}: {error}",
                    item.document_id
                );
            }
            return Outcome::Worked;
        }
        let (ids, texts): (Vec<i64>, Vec<String>) = batch
            .into_iter()
            .map(|(id, text)| (id, format!("{}{}", item.document_prefix, text)))
            .unzip();
        let mut interrupt = || steps.interrupted();
        // OpenAI-style APIs can shorten vectors to the collection's dimension (text-embedding-3-*); Ollama and
        // local models have a fixed size, which the stored dimension checks instead.
        let dimensions = item
            .dimensions
            .filter(|_| item.provider.kind == "openai")
            .map(|d| d as u32);
        match client.embed(&item.model, &texts, dimensions, &mut interrupt) {
            Ok(output) => {
                let dimensions = output.vectors.first().map(|v| v.len()).unwrap_or(0) as i32;
                let vectors: Vec<String> = output
                    .vectors
                    .iter()
                    .map(|v| crate::api::query::vector_literal(v))
                    .collect();
                let stored = steps.run(|| {
                    store::store_embeddings(
                        item.queue_id,
                        item.document_id,
                        ids,
                        vectors,
                        dimensions,
                        output.prompt_tokens,
                    )
                });
                cache.reset(&item.provider.name);
                match stored {
                    Ok(None) => {}
                    Ok(Some(reason)) => return fail(reason),
                    Err(error) => return fail(format!("storing vectors failed: {error}")),
                }
            }
            Err(ProviderError::Interrupted) => {
                release(steps, item);
                return Outcome::Stopped;
            }
            Err(error @ ProviderError::Permanent { .. }) => {
                return fail(format!(
                    "embedding provider \"{}\": {error}",
                    item.provider.name
                ));
            }
            Err(error @ ProviderError::Transient { .. }) => {
                let retry_after = match &error {
                    ProviderError::Transient { retry_after, .. } => *retry_after,
                    _ => None,
                };
                let policy = RetryPolicy {
                    deadline: Duration::from_secs(item.retry_deadline_seconds.max(1) as u64),
                    ..RetryPolicy::default()
                };
                let elapsed =
                    Duration::from_secs_f64(item.failure_age_seconds.unwrap_or(0.0).max(0.0));
                let attempt = item.attempts.max(0) as u32 + 1;
                let message = format!("embedding provider \"{}\": {error}", item.provider.name);
                return match policy.next_delay(attempt, elapsed, retry_after, rng) {
                    Some(delay) => {
                        cache.trip(&item.provider.name, delay);
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
                        Outcome::Worked
                    }
                    None => fail(format!(
                        "gave up after {} s of transient failures ({attempt} attempts): {message}",
                        item.retry_deadline_seconds
                    )),
                };
            }
        }
    }
}

/// Brings the document of one watched row up to date in one step: read the row as its table's owner,
/// upsert or delete the document, and re-chunk it keeping the vectors of unchanged chunks.
fn sync_row(steps: &impl Steps, row: &store::RowItem) {
    let synced = steps.run(|| {
        let store::RowSync::Chunk {
            document_id,
            body,
            size,
            overlap,
            unit,
            provider_kind,
            model,
            document_prefix,
        } = store::sync_row(row.id)?
        else {
            return store::row_done(row.id, row.version, None).map(|_| Ok(()));
        };
        let config = match chunk_config(size, overlap, &unit) {
            Ok(config) => config,
            Err(reason) => return Ok(Err(reason)),
        };
        let chunks = match chunk_body(&body, &config, &provider_kind, &model, &document_prefix) {
            Ok(chunks) => chunks.into_iter().map(new_chunk(&[])).collect(),
            Err(reason) => return Ok(Err(reason)),
        };
        store::replace_chunks(document_id, chunks)?;
        store::row_done(row.id, row.version, None).map(|_| Ok(()))
    });
    let error = match synced {
        Ok(Ok(())) => return,
        Ok(Err(reason)) => reason,
        Err(error) => error,
    };
    if let Err(again) = steps.run(|| store::row_done(row.id, row.version, Some(error.clone()))) {
        pgrx::log!(
            "rag worker: could not record the failure of watched row {}: {again} (after: {error})",
            row.id
        );
    }
}

fn chunk_config(size: i32, overlap: i32, unit: &str) -> Result<rag_chunk::ChunkConfig, String> {
    let unit = match unit {
        "tokens" => rag_chunk::SizeUnit::Tokens,
        _ => rag_chunk::SizeUnit::Characters,
    };
    rag_chunk::ChunkConfig::new(size.max(0) as usize, overlap.max(0) as usize, unit)
        .map_err(|error| format!("collection chunk settings are invalid: {error}"))
}

/// Splits a document's text into chunks. For a model run in-process the window is known exactly, so
/// every chunk is measured with the model's own tokenizer, document prefix included as it will be
/// embedded, and a chunk over the window is split further here rather than failing at embedding time.
fn chunk_body(
    body: &str,
    config: &rag_chunk::ChunkConfig,
    provider_kind: &str,
    model_name: &str,
    document_prefix: &str,
) -> Result<Vec<rag_chunk::Chunk>, String> {
    if provider_kind != "local" {
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

fn new_chunk(page_offsets: &[i32]) -> impl Fn(rag_chunk::Chunk) -> NewChunk + '_ {
    move |chunk| NewChunk {
        page: page_of(page_offsets, chunk.char_start),
        char_start: chunk.char_start as i32,
        char_end: chunk.char_end as i32,
        token_estimate: chunk.token_estimate as i32,
        content: chunk.text,
    }
}

/// Gives the claim back untouched so the next worker starts on it at once.
fn release(steps: &impl Steps, item: &WorkItem) {
    let _ = steps.run(|| store::defer(item.queue_id, 0, None, false));
}

/// Splits the document into chunks and stores them. Err(reason) means the document cannot be processed.
fn chunk_document(item: &WorkItem) -> Result<Result<i32, String>, pgrx::spi::Error> {
    let Some(text) = store::load_text(item.document_id)? else {
        return Ok(Ok(-1));
    };
    let config = match chunk_config(item.chunk_size, item.chunk_overlap, &item.chunk_unit) {
        Ok(config) => config,
        Err(reason) => return Ok(Err(reason)),
    };
    let offsets = text.page_offsets.unwrap_or_default();
    let chunks = match chunk_body(
        &text.body,
        &config,
        &item.provider.kind,
        &item.model,
        &item.document_prefix,
    ) {
        Ok(chunks) => chunks,
        Err(reason) => return Ok(Err(reason)),
    };
    let chunks: Vec<NewChunk> = chunks.into_iter().map(new_chunk(&offsets)).collect();
    drop(text.body);
    Ok(Ok(store::store_chunks(item.document_id, chunks)?))
}

/// 1-based page holding character `position`, from the offsets at which pages start.
fn page_of(page_offsets: &[i32], position: usize) -> Option<i32> {
    if page_offsets.is_empty() {
        return None;
    }
    let index = page_offsets.partition_point(|&start| start as usize <= position);
    Some(index.max(1) as i32)
}

/// After a package upgrade the new library runs against the old SQL until someone runs `ALTER EXTENSION rag
/// UPDATE`: the worker's queries name functions and columns of its own version, so it waits (saying so once in
/// the log) rather than failing every nap. Returns false when asked to shut down while waiting.
fn wait_for_matching_schema(steps: &WorkerTransactions) -> bool {
    let library = env!("CARGO_PKG_VERSION");
    let mut told = false;
    loop {
        match steps.run(store::installed_version) {
            Ok(Some(installed)) if installed == library => return true,
            Ok(Some(installed)) if !told => {
                pgrx::warning!(
                    "rag worker: the extension's SQL in this database is version {installed} but the library is {library}; \
                     pending documents wait until ALTER EXTENSION rag UPDATE"
                );
                told = true;
            }
            // Dropped meanwhile: the error path below notices and stops the worker.
            Ok(None) => return true,
            Ok(Some(_)) => {}
            Err(error) => pgrx::log!("rag worker: reading the extension's version: {error}"),
        }
        let nap = Duration::from_millis(crate::settings::NAPTIME_MS.get().max(1000) as u64);
        if shutdown_requested() || !BackgroundWorker::wait_latch(Some(nap)) {
            return false;
        }
    }
}

#[pg_guard]
#[no_mangle]
pub extern "C-unwind" fn rag_worker_main(argument: pg_sys::Datum) {
    let slot =
        // SAFETY: the launcher registered this worker with an int4 argument (its slot), and a by-value int4
        // datum is never null.
        unsafe { i32::from_polymorphic_datum(argument, false, pg_sys::INT4OID) }.unwrap_or(-1);
    if slot < 0 || slot as usize >= registry::SLOTS {
        return;
    }
    let slot = slot as usize;
    BackgroundWorker::attach_signal_handlers(SignalWakeFlags::SIGHUP | SignalWakeFlags::SIGTERM);
    let database = registry::slot_database(slot);
    BackgroundWorker::connect_worker_to_spi_by_oid(Some(database), None);
    registry::mark_running(slot);
    // Started just before a DROP DATABASE (or similar) paused this database: leave it to that command.
    if registry::database_paused(database) {
        registry::mark_stopped(slot, SlotState::Exited);
        return;
    }

    if !transaction::run(|| store::extension_installed().unwrap_or(false)).unwrap_or(false) {
        registry::mark_stopped(slot, SlotState::NoExtension);
        return;
    }

    let steps = WorkerTransactions;
    if !wait_for_matching_schema(&steps) {
        registry::mark_stopped(slot, SlotState::Exited);
        return;
    }
    let mut cache = ProviderCache::default();
    let mut rng = SplitMix64::from_entropy();
    loop {
        if shutdown_requested() {
            break;
        }
        if BackgroundWorker::sighup_received() {
            crate::pg::reload_configuration();
        }
        let nap = Duration::from_millis(crate::settings::NAPTIME_MS.get().max(10) as u64);
        // Looked at read-only first: claiming takes a transaction id even when there is nothing to claim.
        let outcome = if steps.run(store::work_waiting).unwrap_or(true) {
            process_next(&steps, &mut cache, &mut rng)
        } else {
            Ok(Outcome::Idle(cache.next_close()))
        };
        match outcome {
            Ok(Outcome::Worked) => continue,
            Ok(Outcome::Stopped) => break,
            Ok(Outcome::Idle(cool_down_ends)) => {
                // More databases use rag than there are workers: one with nothing queued makes room. Work
                // queued here later wakes the launcher, which starts a worker again.
                if registry::workers_wanted_elsewhere()
                    && steps.run(store::nothing_queued).unwrap_or(false)
                {
                    // Marked first, so a backend queueing work from now on asks the launcher rather than
                    // this worker; looked at once more for work that was queued just before.
                    registry::mark_stopped(slot, SlotState::Dormant);
                    if steps.run(store::nothing_queued).unwrap_or(false) {
                        return;
                    }
                    registry::mark_running(slot);
                }
                // An idle moment is when a restored database gets its indexes back; a restore still
                // loading the chunks makes it give up at once (lock_timeout) and try again next time.
                if let Err(error) = steps.run(store::repair_indexes) {
                    pgrx::debug1!("rag worker: repairing indexes: {error}");
                }
                let due = steps.run(store::seconds_until_due).ok().flatten();
                let until_due = due
                    .map(|seconds| Duration::from_secs_f64(seconds.max(0.0)))
                    .unwrap_or(nap)
                    .min(nap);
                // Work that is due but was not claimed belongs to providers cooling down: sleep until the
                // first cool-down ends rather than spinning on it.
                let sleep = match cool_down_ends {
                    Some(ends) if until_due < Duration::from_millis(50) => ends.min(nap),
                    Some(ends) => until_due.min(ends),
                    None => until_due,
                }
                .max(Duration::from_millis(10));
                if !BackgroundWorker::wait_latch(Some(sleep)) {
                    break;
                }
            }
            Err(error) => {
                // The extension may have been dropped under us; then this database needs no worker.
                if !transaction::run(|| store::extension_installed().unwrap_or(false))
                    .unwrap_or(false)
                {
                    registry::mark_stopped(slot, SlotState::NoExtension);
                    return;
                }
                pgrx::log!("rag worker: {error}");
                if !BackgroundWorker::wait_latch(Some(nap)) {
                    break;
                }
            }
        }
    }
    registry::mark_stopped(slot, SlotState::Exited);
}
