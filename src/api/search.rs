//! Running the search query `rag._search_sql` builds (`rag._search_rows`), with its plan kept for the session.
//! The query names the collection's id and dimension as literals (its partition, its HNSW index expression),
//! so PL/pgSQL could only run it with EXECUTE, which plans it on every call: 0.13 to 0.16 ms at 100,000
//! chunks against 0.4 to 0.6 ms of running it (BENCHMARKS.md §3). Kept by its text (`crate::kept`), a
//! collection's search is planned once per backend and mode, and again only when PostgreSQL's plan cache
//! says so (a partition attached, an index dropped or built, statistics changed).
//!
//! For the vector side alone without a metadata filter the kept plan is the generic one, always:
//! PostgreSQL's plan cache would otherwise plan every call anew, because a generic plan's estimate for
//! `LIMIT $5` is a tenth of the collection, 30 times a custom plan's cost, though its plan is the same HNSW
//! scan. With a filter or the full-text side its own choice stands: the filter's selectivity can change the
//! plan (the HNSW scan or the metadata first), and the full-text side's generic plans were not measured.
//!
//! The parameters are typed as the query reads them, not passed as text: a generic plan would otherwise
//! parse the question's vector from its text wherever the query uses it, once per row for an exact scan.
use crate::error::{RagError, SpiContext};
use pgrx::datum::DatumWithOid;
use pgrx::prelude::*;
use pgrx::spi::SpiClient;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::ffi::CString;

thread_local! {
    // pgvector's `vector` type, found once: the type moves only with its extension, which rag depends on.
    static VECTOR_TYPE: Cell<Option<pg_sys::Oid>> = const { Cell::new(None) };
    // The queries rag._search_sql built, by what they are built from (rag._search's key: the collection's id,
    // dimension and searched column, the mode and the query's options). Building one cost rag._search more
    // than a tenth of a millisecond at 100,000 chunks, as much as the rest of its own work.
    static SEARCH_SQL: RefCell<HashMap<String, String>> = RefCell::new(HashMap::new());
}

/// Registers the invalidation callbacks that forget what this module keeps. Called once per process from
/// `_PG_init`. A change to any function (an upgrade replacing rag._search_sql), type (pgvector's) or schema
/// (pgvector's renamed) forgets both; they are rare, and finding them again is cheap.
pub fn install() {
    for cache in [
        pg_sys::SysCacheIdentifier::PROCOID,
        pg_sys::SysCacheIdentifier::TYPEOID,
        pg_sys::SysCacheIdentifier::NAMESPACEOID,
    ] {
        // SAFETY: `_PG_init` runs once per process on its only thread; the callback list is the process's own
        // and the function lives as long as the library, which is never unloaded.
        unsafe {
            pg_sys::CacheRegisterSyscacheCallback(
                cache as std::ffi::c_int,
                Some(forget),
                pg_sys::Datum::from(0),
            )
        };
    }
}

// SAFETY (for callers): PostgreSQL calls it when rows of the caches registered change, with the argument
// registered. It only empties this module's own maps.
#[pg_guard]
unsafe extern "C-unwind" fn forget(_argument: pg_sys::Datum, _cache: std::ffi::c_int, _hash: u32) {
    VECTOR_TYPE.with(|cached| cached.set(None));
    SEARCH_SQL.with(|kept| kept.borrow_mut().clear());
}

fn kept_search_sql(key: &str) -> Option<String> {
    SEARCH_SQL.with(|kept| kept.borrow().get(key).cloned())
}

fn keep_search_sql(key: &str, sql: &str) {
    SEARCH_SQL.with(|kept| {
        let mut kept = kept.borrow_mut();
        if kept.len() >= crate::limits::KEPT_STATEMENTS {
            kept.clear();
        }
        kept.insert(key.to_string(), sql.to_string());
    });
}

fn vector_type(client: &SpiClient<'_>) -> Result<pg_sys::Oid, RagError> {
    if let Some(oid) = VECTOR_TYPE.with(Cell::get) {
        return Ok(oid);
    }
    let found = client
        .select(
            "SELECT pg_catalog.to_regtype(pg_catalog.quote_ident(rag._vector_schema()) || '.vector')::pg_catalog.oid",
            Some(1),
            &[],
        )
        .and_then(|table| table.first().get_one::<pg_sys::Oid>())
        .doing(|| "finding pgvector's vector type".to_string())?;
    let Some(oid) = found.filter(|oid| *oid != pg_sys::InvalidOid) else {
        return Err(RagError::undefined(
            "pgvector's type \"vector\" was not found".to_string(),
            "rag needs the vector extension: CREATE EXTENSION vector.",
        ));
    };
    VECTOR_TYPE.with(|cached| cached.set(Some(oid)));
    Ok(oid)
}

/// A parameter of type `type_oid` read from its text, as its input function reads it (typmod -1); NULL stays
/// NULL.
fn from_text(text: Option<&str>, type_oid: pg_sys::Oid) -> DatumWithOid<'static> {
    let Some(text) = text else {
        return DatumWithOid::null_oid(type_oid);
    };
    // The text is the output of a value of the type (a vector, jsonb or tsquery), which never holds NUL.
    let text = CString::new(text).expect("a value's text output holds no NUL byte");
    let mut input = pg_sys::InvalidOid;
    let mut io_param = pg_sys::InvalidOid;
    // SAFETY: the type exists (it was resolved above or is built in); OidInputFunctionCall reads the C string
    // and returns a datum allocated in the current memory context, which outlives the statement run with it.
    unsafe {
        pg_sys::getTypeInputInfo(type_oid, &mut input, &mut io_param);
        let datum = pg_sys::OidInputFunctionCall(input, text.as_ptr().cast_mut(), io_param, -1);
        DatumWithOid::new(datum, type_oid)
    }
}

/// `plan_cache_mode = force_generic_plan` while it lives, as a function's `SET` clause sets it: for the
/// statements run meanwhile (the search, and the row checks it calls), and undone when it is dropped or by the
/// abort of an ERROR.
struct GenericPlans {
    guc_level: std::ffi::c_int,
}

impl GenericPlans {
    fn enter() -> Self {
        // SAFETY: opens a GUC nest level on this (PostgreSQL's only) thread; Drop or the abort closes it.
        let guc_level = unsafe { pg_sys::NewGUCNestLevel() };
        crate::security::set_local("plan_cache_mode", "force_generic_plan");
        GenericPlans { guc_level }
    }
}

impl Drop for GenericPlans {
    fn drop(&mut self) {
        if std::thread::panicking() {
            // An ERROR is on its way to the abort, which undoes the setting; calling into PostgreSQL while
            // unwinding could only raise a second error.
            return;
        }
        // SAFETY: closes the nest level `enter` opened, at the same transaction nesting (the guard lives
        // within one SPI call).
        unsafe { pg_sys::AtEOXact_GUC(true, self.guc_level) };
    }
}

/// A found chunk: its id, document, ordinal, vector distance (none for a chunk only the full-text side found,
/// in keyword mode) and rank, the columns of rag._search_sql's query.
type FoundChunk = (i64, i64, i32, Option<f64>, i32);

/// Runs a query of `rag._search_sql` with its parameters: $1 the question's vector, $2 candidates per side,
/// $3 the metadata filter, $4 the question's lexemes, $5 how many to return.
pub fn run(
    sql: &str,
    vector: Option<&str>,
    pool: i32,
    filter: Option<&str>,
    lexemes: Option<&str>,
    k: i32,
) -> Result<Vec<FoundChunk>, RagError> {
    Spi::connect(|client| {
        let vector_type = vector_type(client)?;
        let statement = crate::kept::statement(
            client,
            sql,
            &[
                vector_type,
                pg_sys::INT4OID,
                pg_sys::JSONBOID,
                pg_sys::TSQUERYOID,
                pg_sys::INT4OID,
            ],
        )
        .doing(|| "preparing the search".to_string())?;
        let arguments = [
            from_text(vector, vector_type),
            pool.into(),
            from_text(filter, pg_sys::JSONBOID),
            from_text(lexemes, pg_sys::TSQUERYOID),
            k.into(),
        ];
        let _generic = (filter.is_none() && lexemes.is_none()).then(GenericPlans::enter);
        // Read-only, in the snapshot of the statement that called it (PL/pgSQL takes one per statement), like
        // a STABLE function: a standby runs it too, and `update` would take a transaction id to mark the
        // transaction as writing.
        let table = client
            .select(&*statement, None, &arguments)
            .doing(|| "running the search".to_string())?;
        // Only the distance may be NULL: anything else is a query of rag._search_sql gone wrong, raised
        // rather than returned as chunk 0.
        table
            .map(|row| {
                let read = || "reading the search's rows".to_string();
                let chunk_id = row.get::<i64>(1).doing(read)?;
                let document_id = row.get::<i64>(2).doing(read)?;
                let ordinal = row.get::<i32>(3).doing(read)?;
                let distance = row.get::<f64>(4).doing(read)?;
                let rank = row.get::<i32>(5).doing(read)?;
                match (chunk_id, document_id, ordinal, rank) {
                    (Some(chunk_id), Some(document_id), Some(ordinal), Some(rank)) => {
                        Ok((chunk_id, document_id, ordinal, distance, rank))
                    }
                    _ => Err(RagError::Internal(
                        "the search query returned a row without its chunk, document, ordinal or rank".to_string(),
                    )),
                }
            })
            .collect()
    })
}

#[pg_schema]
pub mod rag {
    use crate::error::UnwrapOrRaise;
    use pgrx::prelude::*;

    /// The search query kept under `key` by rag._keep_search_sql in this backend, or NULL.
    #[pg_extern(volatile, parallel_unsafe, name = "_kept_search_sql")]
    pub fn kept_search_sql(key: &str) -> Option<String> {
        super::kept_search_sql(key)
    }

    /// Keeps `sql` (built by rag._search_sql) under `key` for this backend and returns it.
    #[pg_extern(volatile, parallel_unsafe, name = "_keep_search_sql")]
    pub fn keep_search_sql(key: &str, sql: &str) -> String {
        super::keep_search_sql(key, sql);
        sql.to_string()
    }

    /// The rows of a search query built by `rag._search_sql`, run with its plan kept for the session
    /// (`rag._search` calls it; see the module's comment). Superuser only, like rag._search: it runs the SQL
    /// it is given with the caller's rights.
    #[pg_extern(volatile, parallel_unsafe, name = "_search_rows")]
    pub fn search_rows(
        sql: &str,
        vector: Option<&str>,
        pool: i32,
        filter: Option<&str>,
        lexemes: Option<&str>,
        k: i32,
    ) -> TableIterator<
        'static,
        (
            name!(chunk_id, i64),
            name!(document_id, i64),
            name!(ordinal, i32),
            name!(distance, Option<f64>),
            name!(rank, i32),
        ),
    > {
        TableIterator::new(super::run(sql, vector, pool, filter, lexemes, k).unwrap_or_raise())
    }
}
