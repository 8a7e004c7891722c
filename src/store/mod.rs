//! The worker's calls into the store. Each function runs inside a transaction that its caller opened.
//!
//! Who writes which table: the SQL functions own every `rag` table, and Rust writes none directly. Documents,
//! chunks, the queue and collections are written by `sql/ingest.sql` (and `sql/collections.sql`); watched
//! rows and their queues by `sql/watch.sql`; the ledger by `rag._record_query` and conversations by
//! `rag._record_exchange` (`sql/answer.sql`). This module and `src/api/` only call those functions and read.
use crate::error::{not_null, RagError};
use crate::provider::{Kind, ProviderRow};
use pgrx::prelude::*;
use pgrx::spi::Error as SpiError;

/// A claimed queue item and everything needed to process it.
#[derive(Clone, Debug)]
pub struct WorkItem {
    pub queue_id: i64,
    pub document_id: i64,
    pub collection_id: i32,
    pub needs_chunking: bool,
    pub attempts: i32,
    pub failure_age_seconds: Option<f64>,
    pub retry_deadline_seconds: i32,
    pub provider: ProviderRow,
    pub model: String,
    pub dimensions: Option<i32>,
    pub document_prefix: String,
    pub chunk_size: i32,
    pub chunk_overlap: i32,
    pub chunk_unit: String,
    /// The vectors this claim makes are for the new space of a model change (`model`, `provider`, `dimensions`
    /// and `document_prefix` are then the new model's), not for the space the collection searches.
    pub shadow: bool,
    /// The item's place in the queue's order, with `queue_id` (`ClaimPlaces`).
    pub not_before: TimestampWithTimeZone,
}

/// Where a claim of a collection's items starts in the queue's order: at the item this worker last claimed
/// there (`rag._claim_next` says why).
#[derive(Default)]
pub struct ClaimPlaces {
    places: std::collections::BTreeMap<i32, (TimestampWithTimeZone, i64)>,
}

impl ClaimPlaces {
    pub fn remember(&mut self, item: &WorkItem) {
        self.places
            .insert(item.collection_id, (item.not_before, item.queue_id));
    }

    pub fn forget(&mut self) {
        self.places.clear();
    }

    fn as_arrays(&self) -> (Vec<i32>, Vec<TimestampWithTimeZone>, Vec<i64>) {
        let collections = self.places.keys().copied().collect();
        let not_before = self.places.values().map(|place| place.0).collect();
        let ids = self.places.values().map(|place| place.1).collect();
        (collections, not_before, ids)
    }
}

/// `recently_served`: collections this worker served lately, most recent last; the others go first.
pub fn claim_next(
    worker_pid: i32,
    skip_providers: Vec<String>,
    recently_served: Vec<i32>,
    places: &ClaimPlaces,
) -> Result<Option<WorkItem>, RagError> {
    type Claimed = (
        Option<i64>,
        Option<i64>,
        Option<i32>,
        Option<bool>,
        Option<i32>,
        Option<f64>,
        Option<i32>,
        Option<String>,
        Option<String>,
        Option<String>,
        Option<String>,
        Option<String>,
        Option<i32>,
        Option<String>,
        Option<i32>,
        Option<i32>,
        Option<String>,
        Option<bool>,
        Option<TimestampWithTimeZone>,
    );
    let (place_collections, place_not_before, place_ids) = places.as_arrays();
    let claimed: Option<Claimed> = Spi::connect_mut(|client| {
        let rows = client.update(
            "SELECT * FROM rag._claim_next($1, $2, $3, $4, $5, $6)",
            Some(1),
            &[
                worker_pid.into(),
                skip_providers.into(),
                recently_served.into(),
                place_collections.into(),
                place_not_before.into(),
                place_ids.into(),
            ],
        )?;
        let mut claimed = None;
        for row in rows {
            claimed = Some((
                row.get(1)?,
                row.get(2)?,
                row.get(3)?,
                row.get(4)?,
                row.get(5)?,
                row.get(6)?,
                row.get(7)?,
                row.get(8)?,
                row.get(9)?,
                row.get(10)?,
                row.get(11)?,
                row.get(12)?,
                row.get(13)?,
                row.get(14)?,
                row.get(15)?,
                row.get(16)?,
                row.get(17)?,
                row.get(18)?,
                row.get(19)?,
            ));
        }
        Ok::<_, SpiError>(claimed)
    })?;
    let Some((
        queue_id,
        document_id,
        collection_id,
        needs_chunking,
        attempts,
        failure_age_seconds,
        retry_deadline_seconds,
        provider_name,
        provider_kind,
        provider_url,
        provider_key,
        model,
        dimensions,
        document_prefix,
        chunk_size,
        chunk_overlap,
        chunk_unit,
        shadow,
        not_before,
    )) = claimed
    else {
        return Ok(None);
    };
    Ok(Some(WorkItem {
        queue_id: not_null(queue_id, "queue.id")?,
        document_id: not_null(document_id, "queue.document_id")?,
        collection_id: not_null(collection_id, "documents.collection_id")?,
        needs_chunking: not_null(needs_chunking, "needs_chunking")?,
        attempts: not_null(attempts, "queue.attempts")?,
        failure_age_seconds,
        retry_deadline_seconds: not_null(retry_deadline_seconds, "retry_deadline_seconds")?,
        provider: ProviderRow {
            name: not_null(provider_name, "providers.name")?,
            kind: Kind::from_column(&not_null(provider_kind, "providers.kind")?),
            base_url: provider_url,
            api_key_setting: provider_key,
        },
        model: not_null(model, "collections.embedding_model")?,
        dimensions,
        document_prefix: not_null(document_prefix, "collections.document_prefix")?,
        chunk_size: not_null(chunk_size, "collections.chunk_size")?,
        chunk_overlap: not_null(chunk_overlap, "collections.chunk_overlap")?,
        chunk_unit: not_null(chunk_unit, "collections.chunk_unit")?,
        shadow: not_null(shadow, "shadow")?,
        not_before: not_null(not_before, "queue.not_before")?,
    }))
}

/// A read-only query of the worker's idle loop. pgrx's other calls ask for a transaction id before they run,
/// and an idle worker that took one every nap would burn through transaction ids and write WAL for nothing
/// (and, measured with PostgreSQL's own regression suite, change what VACUUM in other databases marks
/// all-visible). Only for queries in a transaction of their own: a read-only query does not see earlier
/// writes of the same transaction.
fn idle_read<T: FromDatum + IntoDatum>(query: &str) -> Result<Option<T>, SpiError> {
    Spi::connect(|client| client.select(query, Some(1), &[])?.first().get_one::<T>())
}

/// Builds the HNSW indexes collections are waiting for (a build after a load that could not wait for the
/// writers of the collection's partition); returns how many. `idle`: the caller has
/// nothing it may claim (`rag._collections_missing_indexes`).
pub fn repair_indexes(idle: bool) -> Result<Option<i32>, SpiError> {
    let look =
        format!("SELECT rag._upkeep_due('index build', rag._collections_missing_indexes({idle}))");
    if idle_read::<bool>(&look)? != Some(true) {
        return Ok(Some(0));
    }
    repair_indexes_after_writes(idle)
}

/// Which partitions of rag.chunks there are, each as `collection:table/file/indexes`: a restore makes new ones
/// and then their indexes, a TRUNCATE gives one a new file. The worker looks for documents missing their chunks
/// in the collections whose entry is new.
pub fn chunk_partitions() -> Result<Option<Vec<String>>, SpiError> {
    idle_read::<Vec<String>>(
        "SELECT coalesce(array_agg(substring(x.relname FROM '^chunks_c([0-9]+)$') || ':' || x.oid::text || '/' \
                                   || x.relfilenode::text || '/' \
                                   || (SELECT count(*) FROM pg_catalog.pg_index n WHERE n.indrelid = x.oid)::text \
                                   ORDER BY x.oid), '{}') \
           FROM pg_catalog.pg_inherits i JOIN pg_catalog.pg_class x ON x.oid = i.inhrelid \
          WHERE i.inhparent = 'rag.chunks'::pg_catalog.regclass",
    )
}

/// Queues again the documents of these collections (None: of all) that say they were chunked while none of
/// their chunks is there (`rag._requeue_missing_chunks`: a restore of a dump that left the chunks out); returns
/// how many. It reads their partitions one at a time and waits at most 100 ms for each: whoever holds one (a
/// TRUNCATE or a drop left open) is waited out by a later look, not by every collection's work.
pub fn requeue_missing_chunks(collections: Option<Vec<i32>>) -> Result<Option<i32>, SpiError> {
    let missing = Spi::connect(|client| {
        client.select(
            "SELECT pg_catalog.set_config('lock_timeout', '100ms', true)",
            None,
            &[],
        )?;
        client
            .select(
                "SELECT EXISTS (SELECT 1 FROM rag._documents_missing_chunks($1))",
                Some(1),
                &[collections.clone().into()],
            )?
            .first()
            .get_one::<bool>()
    })?;
    if missing != Some(true) {
        return Ok(Some(0));
    }
    Spi::get_one_with_args::<i32>(
        "SELECT rag._requeue_missing_chunks($1)",
        &[collections.into()],
    )
}

/// Builds again the HNSW index of one collection that asked for new build parameters (`rag_set_search`), beside
/// the one searches use meanwhile, and drops that one (`rag._rebuild_index`); a collection whose rebuild failed
/// rests (`rag.upkeep_failures`). The worker's alone: a client's transaction would hold the partition from the
/// drop until it ended.
pub fn rebuild_indexes() -> Result<(), SpiError> {
    let look = "SELECT rag._upkeep_due('index rebuild', rag._collections_to_rebuild())";
    if idle_read::<bool>(look)? != Some(true) {
        return Ok(());
    }
    Spi::run("SELECT rag._rebuild_indexes()")
}

/// Drops the partitions of rag.chunks whose collections `rag_drop_collection` dropped
/// (`rag._drop_partitions`); returns how many.
pub fn drop_partitions() -> Result<Option<i32>, SpiError> {
    let look = "SELECT pg_catalog.cardinality(rag._partitions_to_drop()) > 0";
    if idle_read::<bool>(look)? != Some(true) {
        return Ok(Some(0));
    }
    Spi::get_one::<i32>("SELECT rag._drop_partitions()")
}

/// Grants the owners of watched tables what the watches' triggers need, where they lack it
/// (`rag._grant_watch_owners`), and takes PUBLIC's EXECUTE away from any watch's trigger function, its watch
/// there or not (`rag._watch_functions_public`); returns 1 when it did either. Not while a superuser's
/// pg_restore is connected to the database: a restore with privileges grants the same in its last section, and
/// two sessions granting on one object at once fail the second ("tuple concurrently updated"), which would stop
/// a restore run with --exit-on-error. Another role naming its session "pg_restore" does not count. A GRANT
/// waits for any transaction changing the same catalog row (an admin's open rag_watch): at most 100 ms here,
/// then the next upkeep tries again, rather than holding every collection's work (review of session 36).
pub fn grant_watch_owners() -> Result<Option<i32>, SpiError> {
    let look = "SELECT (pg_catalog.cardinality(rag._watch_owners_lacking()) > 0 \
                        OR pg_catalog.cardinality(rag._watch_functions_public()) > 0) \
                AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_stat_activity a \
                                  JOIN pg_catalog.pg_roles r ON r.oid = a.usesysid AND r.rolsuper \
                                 WHERE a.datname = pg_catalog.current_database() AND a.application_name = 'pg_restore')";
    if idle_read::<bool>(look)? != Some(true) {
        return Ok(Some(0));
    }
    Spi::run("SELECT pg_catalog.set_config('lock_timeout', '100ms', true)")?;
    Spi::run("SELECT rag._grant_watch_owners()")?;
    // Every owner's functions, this upkeep's alone: a user's command revokes its own owner's only (a REVOKE waits
    // for another owner's open change to the same catalog row).
    Spi::run("SELECT rag._revoke_watch_functions_public()")?;
    Ok(Some(1))
}

/// The same repair from a session that has written in its transaction (rag_process_queue), where the idle
/// worker's read-only look could miss the chunks it stored.
pub fn repair_indexes_after_writes(idle: bool) -> Result<Option<i32>, SpiError> {
    Spi::get_one_with_args::<i32>("SELECT rag._repair_indexes($1)", &[idle.into()])
}

/// Deletes ledger rows older than rag.ledger_retention, at most a thousand (rag._prune_ledger); returns how many.
pub fn prune_ledger(retention_seconds: i32) -> Result<Option<i32>, SpiError> {
    Spi::get_one_with_args::<i32>(
        "SELECT rag._prune_ledger(pg_catalog.make_interval(secs => $1))",
        &[f64::from(retention_seconds).into()],
    )
}

/// Measures the lexemes of one collection that is due (rag._measure_lexemes), for the full-text side.
pub fn measure_lexemes() -> Result<Option<i32>, SpiError> {
    if idle_read::<i32>("SELECT rag._lexemes_due()")?.is_none() {
        return Ok(None);
    }
    Spi::get_one::<i32>("SELECT rag._measure_lexemes()")
}

/// Takes the due steps of model changes (switching a complete one, clearing a column left behind); returns how
/// many.
pub fn advance_migrations() -> Result<Option<i32>, SpiError> {
    let due = idle_read::<bool>("SELECT rag._upkeep_due('model change', rag._migrations_due())")?;
    if due != Some(true) {
        return Ok(Some(0));
    }
    Spi::get_one::<i32>("SELECT rag._advance_migrations()")
}

/// When this database next needs a worker, asked by one that would leave it to a database waiting for a slot:
/// NULL when nothing is queued at all (a row refused over a limit, which waits to be written again, does not
/// count: `rag._row_refused`), 0 when something is due now (keys to spread, an index to rebuild, a dropped
/// collection's partition to drop, or a document or row whose time has come), else the seconds until the first
/// queued document or row is due (a failure's back-off) or the first failed upkeep step (`rag.upkeep_failures`)
/// is tried again. A rebuild that rests is not due: it kept a database with nothing else to do from letting
/// its worker go. Spelled out for the empty case: least() ignores a NULL argument.
pub fn seconds_until_needed() -> Result<Option<f64>, SpiError> {
    idle_read::<f64>(
        "SELECT CASE WHEN EXISTS (SELECT 1 FROM rag.row_batches)
                       OR rag._upkeep_due('index rebuild', rag._collections_to_rebuild())
                       OR pg_catalog.cardinality(rag._partitions_to_drop()) > 0 THEN 0::float8
                     ELSE (SELECT CASE WHEN n.first IS NOT NULL
                                       THEN greatest(0, extract(epoch FROM n.first - now()))::float8 END
                             FROM (SELECT least((SELECT min(q.not_before) FROM rag.queue q),
                                                (SELECT min(r.not_before) FROM rag.row_queue r
                                                  WHERE r.not_before < 'infinity'),
                                                (SELECT min(f.next_try) FROM rag.upkeep_failures f
                                                  WHERE f.next_try > now())) AS first) n) END",
    )
}

/// How many rows were ever inserted into or updated in the queue tables, as the statistics count them (NULL
/// while `track_counts` is off). Any write that can make work due moves it within about a second of its
/// commit, wake or no wake (a superuser's own UPDATE of `not_before`, a restore's COPY): an idle worker looks at
/// its queue again when it moves (serve.rs, `IdleMemo`). A statistics lookup, no table is read.
pub fn queue_writes() -> Result<Option<i64>, SpiError> {
    idle_read::<i64>(
        "SELECT sum(pg_catalog.pg_stat_get_tuples_inserted(t.oid) + pg_catalog.pg_stat_get_tuples_updated(t.oid))::int8
           FROM (VALUES ('rag.queue'::pg_catalog.regclass), ('rag.row_queue'::pg_catalog.regclass),
                        ('rag.row_batches'::pg_catalog.regclass)) t(oid)
          WHERE pg_catalog.current_setting('track_counts')::bool",
    )
}

/// What the worker finds when it looks at its queue.
pub enum QueueLook {
    /// Keys to spread, a due row or a due document.
    DueNow,
    /// A restore of the database is half done (`rag._restore_under_way`): nothing is claimed meanwhile.
    Restoring,
    /// Nothing due now; the first queued item is due in so many seconds (None: nothing is queued).
    NothingDue { first_due_in: Option<f64> },
}

/// Looks at the queue in one snapshot, so that "nothing due" and when the first item is due describe the same
/// queue: a row that became due between two looks could otherwise be missed by both.
pub fn look_at_queue() -> Result<QueueLook, SpiError> {
    Spi::connect(|client| {
        let row = client
            .select(
                "SELECT l.due_now, l.restoring,
                        CASE WHEN NOT (l.due_now OR l.restoring) THEN rag._seconds_until_due() END
                   FROM (SELECT EXISTS (SELECT 1 FROM rag.row_batches)
                                OR EXISTS (SELECT 1 FROM rag.row_queue WHERE not_before <= now())
                                OR EXISTS (SELECT 1 FROM rag.queue WHERE not_before <= now()) AS due_now,
                                rag._restore_under_way() AS restoring) l",
                Some(1),
                &[],
            )?
            .first();
        let restoring = row.get::<bool>(2)?.unwrap_or(true);
        Ok(if restoring {
            QueueLook::Restoring
        } else if row.get::<bool>(1)?.unwrap_or(true) {
            QueueLook::DueNow
        } else {
            QueueLook::NothingDue {
                first_due_in: row.get::<f64>(3)?,
            }
        })
    })
}

/// Whether a restore of the database is half done (`rag._restore_under_way`): the idle worker's upkeep waits
/// too.
pub fn restore_under_way() -> Result<bool, SpiError> {
    Ok(idle_read::<bool>("SELECT rag._restore_under_way()")?.unwrap_or(true))
}

/// Whether a bulk load waits in the queue: at least `bulk_load_documents` due documents that no worker holds,
/// the size from which a load is stored without index upkeep too (rag._bulk_loading). Then the database wants
/// rag.bulk_load_workers.
pub fn bulk_load_waiting() -> Result<bool, SpiError> {
    Ok(idle_read::<bool>(
        "SELECT EXISTS (SELECT 1 FROM rag.queue WHERE not_before <= now() AND claimed_by IS NULL
                         OFFSET rag._limit('bulk_load_documents')::integer - 1)",
    )?
    .unwrap_or(false))
}

/// The version of the extension's SQL in this database (`pg_extension.extversion`).
pub fn installed_version() -> Result<Option<String>, SpiError> {
    idle_read::<String>(
        "SELECT extversion::text FROM pg_catalog.pg_extension WHERE extname = 'rag'",
    )
}

pub fn seconds_until_due() -> Result<Option<f64>, SpiError> {
    idle_read::<f64>("SELECT rag._seconds_until_due()")
}

pub struct DocumentText {
    pub title: String,
    pub body: String,
    pub page_offsets: Option<Vec<i32>>,
}

pub fn load_text(document_id: i64) -> Result<Option<DocumentText>, SpiError> {
    // Read-write SPI even for reads: inside rag_process_queue the earlier steps are in the same command,
    // and a read-only SPI query would not see what they wrote.
    Spi::connect_mut(|client| {
        let rows = client.update(
            "SELECT title, body, page_offsets FROM rag.documents WHERE id = $1",
            Some(1),
            &[document_id.into()],
        )?;
        let mut found = None;
        for row in rows {
            let title: Option<String> = row.get(1)?;
            let body: Option<String> = row.get(2)?;
            let offsets: Option<Vec<Option<i32>>> = row.get(3)?;
            found = Some(DocumentText {
                title: title.unwrap_or_default(),
                body: body.unwrap_or_default(),
                page_offsets: offsets
                    .map(|list| list.into_iter().map(|o| o.unwrap_or(0)).collect()),
            });
        }
        Ok(found)
    })
}

pub struct NewChunk {
    pub content: String,
    /// What the chunk sits under (`rag.chunks.header`; `rag_chunk::chunk_header`).
    pub header: Option<String>,
    pub char_start: i32,
    pub char_end: i32,
    pub token_estimate: i32,
    pub page: Option<i32>,
}

/// The chunks as the parallel arrays the SQL side unnests.
struct ChunkColumns {
    contents: Vec<String>,
    headers: Vec<Option<String>>,
    starts: Vec<i32>,
    ends: Vec<i32>,
    tokens: Vec<i32>,
    pages: Vec<Option<i32>>,
}

fn columns(chunks: Vec<NewChunk>) -> ChunkColumns {
    let mut columns = ChunkColumns {
        contents: Vec::with_capacity(chunks.len()),
        headers: Vec::with_capacity(chunks.len()),
        starts: Vec::with_capacity(chunks.len()),
        ends: Vec::with_capacity(chunks.len()),
        tokens: Vec::with_capacity(chunks.len()),
        pages: Vec::with_capacity(chunks.len()),
    };
    for chunk in chunks {
        columns.contents.push(chunk.content);
        columns.headers.push(chunk.header);
        columns.starts.push(chunk.char_start);
        columns.ends.push(chunk.char_end);
        columns.tokens.push(chunk.token_estimate);
        columns.pages.push(chunk.page);
    }
    columns
}

/// What `rag._store_chunks` did with a batch.
pub enum StoredChunks {
    Stored,
    /// The document was deleted meanwhile.
    Gone,
    /// The document had chunks already (an earlier attempt stored them): nothing was stored.
    ChunkedBefore,
}

/// Stores one batch of a document's chunks, numbered from `first_ordinal`; the batches of one document go in
/// one transaction, the first with `first_ordinal` 0.
pub fn store_chunks(
    document_id: i64,
    first_ordinal: i32,
    chunks: Vec<NewChunk>,
) -> Result<StoredChunks, SpiError> {
    let ChunkColumns {
        contents,
        headers,
        starts,
        ends,
        tokens,
        pages,
    } = columns(chunks);
    Spi::connect_mut(|client| {
        let rows = client.update(
            "SELECT rag._store_chunks($1, $2, $3, $4, $5, $6, $7, $8)",
            Some(1),
            &[
                document_id.into(),
                first_ordinal.into(),
                contents.into(),
                starts.into(),
                ends.into(),
                tokens.into(),
                pages.into(),
                headers.into(),
            ],
        )?;
        Ok(match rows.first().get_one::<i32>()? {
            Some(-1) => StoredChunks::Gone,
            Some(-2) => StoredChunks::ChunkedBefore,
            _ => StoredChunks::Stored,
        })
    })
}

/// A stored chunk still to be embedded.
pub struct PendingChunk {
    pub id: i64,
    pub header: Option<String>,
    pub content: String,
}

pub fn pending_chunks(
    document_id: i64,
    limit: i32,
    shadow: bool,
) -> Result<Vec<PendingChunk>, SpiError> {
    Spi::connect_mut(|client| {
        let rows = client.update(
            "SELECT chunk_id, header, content FROM rag._pending_chunks($1, $2, $3)",
            None,
            &[document_id.into(), limit.into(), shadow.into()],
        )?;
        let mut batch = Vec::new();
        for row in rows {
            batch.push(PendingChunk {
                id: row.get::<i64>(1)?.unwrap_or_default(),
                header: row.get::<String>(2)?,
                content: row.get::<String>(3)?.unwrap_or_default(),
            });
        }
        Ok(batch)
    })
}

/// More small new documents of the claimed item's collection, claimed with it (`rag._claim_more`): their
/// queue and document ids. `budget_bytes` bounds the text of the whole group, the claimed item's included.
pub fn claim_more(
    worker_pid: i32,
    queue_id: i64,
    limit: i32,
    max_bytes: i32,
    budget_bytes: Option<i32>,
) -> Result<Vec<(i64, i64)>, RagError> {
    let rows: Vec<(Option<i64>, Option<i64>)> = Spi::connect_mut(|client| {
        let rows = client.update(
            "SELECT queue_id, document_id FROM rag._claim_more($1, $2, $3, $4, $5)",
            None,
            &[
                worker_pid.into(),
                queue_id.into(),
                limit.into(),
                max_bytes.into(),
                budget_bytes.into(),
            ],
        )?;
        let mut claimed = Vec::new();
        for row in rows {
            claimed.push((row.get::<i64>(1)?, row.get::<i64>(2)?));
        }
        Ok::<_, SpiError>(claimed)
    })?;
    rows.into_iter()
        .map(|(queue, document)| {
            Ok((
                not_null(queue, "queue.id")?,
                not_null(document, "queue.document_id")?,
            ))
        })
        .collect()
}

/// The texts of several documents at once, by id; deleted ones are missing from the answer.
pub fn load_texts(document_ids: &[i64]) -> Result<Vec<(i64, DocumentText)>, SpiError> {
    Spi::connect_mut(|client| {
        let rows = client.update(
            "SELECT id, title, body, page_offsets FROM rag.documents WHERE id = ANY ($1)",
            None,
            &[document_ids.to_vec().into()],
        )?;
        let mut found = Vec::new();
        for row in rows {
            let Some(id) = row.get::<i64>(1)? else {
                continue;
            };
            let title: Option<String> = row.get(2)?;
            let body: Option<String> = row.get(3)?;
            let offsets: Option<Vec<Option<i32>>> = row.get(4)?;
            found.push((
                id,
                DocumentText {
                    title: title.unwrap_or_default(),
                    body: body.unwrap_or_default(),
                    page_offsets: offsets
                        .map(|list| list.into_iter().map(|o| o.unwrap_or(0)).collect()),
                },
            ));
        }
        Ok(found)
    })
}

/// A small new document's chunks with their vectors, written at once with the others of its provider call
/// (`rag._store_documents`).
pub struct WholeDocument {
    pub queue_id: i64,
    pub document_id: i64,
    pub chunks: Vec<NewChunk>,
    /// One per chunk, each of the call's dimension.
    pub vectors: Vec<Vec<f32>>,
    pub tokens: Option<i64>,
}

/// What became of a whole document.
pub enum StoredDocument {
    /// Stored and ready.
    Ready,
    /// This path no longer applies (deleted, chunked meanwhile, the model changed): the regular path takes it.
    NotApplicable,
    /// The document must fail, for this reason.
    Refused(String),
}

/// Stores the documents of one provider call in one statement; the outcomes come back in the documents' order.
/// `model` of `provider` made the vectors, which all have `dimensions` numbers.
pub fn store_documents(
    documents: Vec<WholeDocument>,
    dimensions: i32,
    model: &str,
    provider: &str,
) -> Result<Vec<StoredDocument>, SpiError> {
    let chunk_count: usize = documents.iter().map(|d| d.chunks.len()).sum();
    let mut queue_ids = Vec::with_capacity(documents.len());
    let mut document_ids = Vec::with_capacity(documents.len());
    let mut embed_tokens = Vec::with_capacity(documents.len());
    let mut chunk_documents = Vec::with_capacity(chunk_count);
    let mut ordinals = Vec::with_capacity(chunk_count);
    let mut vectors = Vec::with_capacity(chunk_count * dimensions.max(0) as usize);
    let mut chunks = Vec::with_capacity(chunk_count);
    for document in documents {
        queue_ids.push(document.queue_id);
        document_ids.push(document.document_id);
        embed_tokens.push(document.tokens);
        for (ordinal, (chunk, vector)) in document
            .chunks
            .into_iter()
            .zip(document.vectors)
            .enumerate()
        {
            chunk_documents.push(document.document_id);
            ordinals.push(ordinal as i32);
            vectors.extend(vector);
            chunks.push(chunk);
        }
    }
    let ChunkColumns {
        contents,
        headers,
        starts,
        ends,
        tokens,
        pages,
    } = columns(chunks);
    let count = document_ids.len();
    Spi::connect_mut(|client| {
        let rows = client.update(
            "SELECT stored, refusal \
               FROM rag._store_documents($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)",
            None,
            &[
                queue_ids.into(),
                document_ids.into(),
                embed_tokens.into(),
                chunk_documents.into(),
                ordinals.into(),
                contents.into(),
                starts.into(),
                ends.into(),
                tokens.into(),
                pages.into(),
                vectors.into(),
                dimensions.into(),
                model.into(),
                provider.into(),
                headers.into(),
            ],
        )?;
        // One row per document, in the order given.
        let mut outcomes = Vec::with_capacity(count);
        for row in rows {
            let stored = row.get::<bool>(1)?.unwrap_or(false);
            outcomes.push(match (stored, row.get::<String>(2)?) {
                (_, Some(reason)) => StoredDocument::Refused(reason),
                (true, None) => StoredDocument::Ready,
                (false, None) => StoredDocument::NotApplicable,
            });
        }
        Ok(outcomes)
    })
}

/// The vectors of one batch, and what made them.
pub struct Embedded {
    pub chunk_ids: Vec<i64>,
    /// The chunks' vectors one after the other, `dimensions` numbers each.
    pub vectors: Vec<f32>,
    pub dimensions: i32,
    pub tokens: Option<i64>,
    /// The model that made them and its provider: a batch whose space changed either meanwhile is not stored.
    pub model: String,
    pub provider: String,
    pub shadow: bool,
}

/// Drops or builds the collection's HNSW index as its load asks (`rag._fit_index_to_load`), once per batch.
pub fn fit_index_to_load(collection_id: i32) -> Result<(), SpiError> {
    Spi::connect_mut(|client| {
        client.update(
            "SELECT rag._fit_index_to_load($1)",
            Some(1),
            &[collection_id.into()],
        )?;
        Ok(())
    })
}

/// Builds the collection's HNSW index when a bulk load of it has just ended (`rag._build_index_after_load`), in
/// a transaction of its own after the batch that made the load's last documents ready. Not a read-only look
/// first: in rag_process_queue's subtransactions that would see the queue as the call began.
pub fn build_index_after_load(collection_id: i32) -> Result<bool, SpiError> {
    Ok(Spi::get_one_with_args::<bool>(
        "SELECT rag._build_index_after_load($1)",
        &[collection_id.into()],
    )?
    .unwrap_or(false))
}

/// Returns Some(reason) when the vectors cannot be stored and the document must fail.
pub fn store_embeddings(
    queue_id: i64,
    document_id: i64,
    batch: Embedded,
) -> Result<Option<String>, SpiError> {
    Spi::connect_mut(|client| {
        let rows = client.update(
            "SELECT rag._store_embeddings($1, $2, $3, $4, $5, $6, $7, $8, $9)",
            Some(1),
            &[
                queue_id.into(),
                document_id.into(),
                batch.chunk_ids.into(),
                batch.vectors.into(),
                batch.dimensions.into(),
                batch.tokens.into(),
                batch.model.into(),
                batch.provider.into(),
                batch.shadow.into(),
            ],
        )?;
        rows.first().get_one::<String>()
    })
}

pub fn finish(queue_id: i64, document_id: i64) -> Result<bool, SpiError> {
    Spi::connect_mut(|client| {
        let rows = client.update(
            "SELECT rag._finish($1, $2)",
            Some(1),
            &[queue_id.into(), document_id.into()],
        )?;
        Ok(rows.first().get_one::<bool>()?.unwrap_or(false))
    })
}

pub fn defer(
    queue_id: i64,
    delay_ms: i64,
    error: Option<String>,
    counts: bool,
) -> Result<(), SpiError> {
    Spi::connect_mut(|client| {
        client.update(
            "SELECT rag._defer($1, $2, $3, $4)",
            None,
            &[
                queue_id.into(),
                delay_ms.into(),
                error.into(),
                counts.into(),
            ],
        )?;
        Ok(())
    })
}

/// `shadow`: the failure was of a model change's vectors, which fails the change, not the document.
pub fn fail(queue_id: i64, document_id: i64, reason: &str, shadow: bool) -> Result<(), SpiError> {
    Spi::connect_mut(|client| {
        client.update(
            "SELECT rag._fail($1, $2, $3, $4)",
            None,
            &[
                queue_id.into(),
                document_id.into(),
                reason.into(),
                shadow.into(),
            ],
        )?;
        Ok(())
    })
}

/// A claimed key of a watched row.
pub struct RowItem {
    pub id: i64,
    pub version: i64,
}

thread_local! {
    // The watch whose row this worker synced last: watches take turns (rag._claim_row). A backend runs on one
    // thread.
    static LAST_ROW_WATCH: std::cell::Cell<Option<i32>> = const { std::cell::Cell::new(None) };
}

pub fn claim_row(worker_pid: i32) -> Result<Option<RowItem>, SpiError> {
    let after_watch = LAST_ROW_WATCH.with(std::cell::Cell::get);
    let item = Spi::connect_mut(|client| {
        client.update("SELECT rag._spread_batches()", None, &[])?;
        let rows = client.update(
            "SELECT row_queue_id, version, watch_id FROM rag._claim_row($1, $2)",
            Some(1),
            &[worker_pid.into(), after_watch.into()],
        )?;
        let mut item = None;
        for row in rows {
            item = Some((
                RowItem {
                    id: row.get(1)?.unwrap_or_default(),
                    version: row.get(2)?.unwrap_or_default(),
                },
                row.get::<i32>(3)?,
            ));
        }
        Ok::<_, SpiError>(item)
    })?;
    Ok(item.map(|(item, watch)| {
        if watch.is_some() {
            LAST_ROW_WATCH.with(|last| last.set(watch));
        }
        item
    }))
}

/// What `_sync_row` decided for a row: settled, or a changed document to chunk again.
pub enum RowSync {
    Settled,
    /// A changed document: its new text is in `rag.documents`, to be chunked with these settings.
    Chunk {
        document_id: i64,
        size: i32,
        overlap: i32,
        unit: String,
        provider_kind: crate::provider::Kind,
        model: String,
        document_prefix: String,
    },
}

pub fn sync_row(row_queue_id: i64) -> Result<RowSync, RagError> {
    Spi::connect_mut(|client| {
        let rows = client.update(
            "SELECT action, document_id, chunk_size, chunk_overlap, chunk_unit, provider_kind, \
             embedding_model, document_prefix FROM rag._sync_row($1)",
            Some(1),
            &[row_queue_id.into()],
        )?;
        let row = rows.first();
        if row.get_by_name::<String, _>("action")?.as_deref() != Some("chunk") {
            return Ok(RowSync::Settled);
        }
        Ok(RowSync::Chunk {
            document_id: not_null(row.get_by_name("document_id")?, "documents.id")?,
            size: not_null(row.get_by_name("chunk_size")?, "collections.chunk_size")?,
            overlap: not_null(
                row.get_by_name("chunk_overlap")?,
                "collections.chunk_overlap",
            )?,
            unit: not_null(row.get_by_name("chunk_unit")?, "collections.chunk_unit")?,
            provider_kind: Kind::from_column(&not_null::<String>(
                row.get_by_name("provider_kind")?,
                "providers.kind",
            )?),
            model: not_null(
                row.get_by_name("embedding_model")?,
                "collections.embedding_model",
            )?,
            document_prefix: not_null(
                row.get_by_name("document_prefix")?,
                "collections.document_prefix",
            )?,
        })
    })
}

/// Sets a changed document's chunks aside (`rag._set_aside_chunks`) before its new ones are stored a batch at a
/// time (`store_chunks`), which take the vectors of unchanged text from them.
pub fn set_aside_chunks(document_id: i64) -> Result<(), SpiError> {
    Spi::connect_mut(|client| {
        client.update(
            "SELECT rag._set_aside_chunks($1)",
            None,
            &[document_id.into()],
        )?;
        Ok(())
    })
}

/// Ends a replacement once every new chunk is stored (`rag._end_replacing_chunks`): the document is queued for
/// the chunks that still need a vector.
pub fn end_replacing_chunks(document_id: i64) -> Result<(), SpiError> {
    Spi::connect_mut(|client| {
        client.update(
            "SELECT rag._end_replacing_chunks($1)",
            None,
            &[document_id.into()],
        )?;
        Ok(())
    })
}

/// The row was refused over a limit (`rag._row_refused`): it waits until it is written again.
pub fn row_refused(row_queue_id: i64, version: i64, error: &str) -> Result<(), SpiError> {
    Spi::connect_mut(|client| {
        client.update(
            "SELECT rag._row_refused($1, $2, $3)",
            None,
            &[row_queue_id.into(), version.into(), error.into()],
        )?;
        Ok(())
    })
}

pub fn row_done(row_queue_id: i64, version: i64, error: Option<String>) -> Result<(), SpiError> {
    Spi::connect_mut(|client| {
        client.update(
            "SELECT rag._row_done($1, $2, $3)",
            None,
            &[row_queue_id.into(), version.into(), error.into()],
        )?;
        Ok(())
    })
}
