//! The Rust half of `rag_watch`: checking user expressions with PostgreSQL's parser, and running the SQL
//! built from them as the table's owner in a security-restricted operation (see [`crate::security`]).
use pgrx::prelude::*;
use std::cell::RefCell;
use std::collections::HashMap;

/// The query that finds a watched row by its key, per watch, as built during one command (see
/// `rag._row_lookup_sql`).
struct RowLookups {
    command: pg_sys::CommandId,
    by_watch: HashMap<i32, String>,
}

thread_local! {
    // PostgreSQL runs a backend's SQL on one thread.
    static ROW_LOOKUPS: RefCell<Option<RowLookups>> = const { RefCell::new(None) };
}

/// Registers the transaction callback that forgets the row lookups built in a transaction when it ends.
/// Called once per process from `_PG_init`.
pub fn install() {
    // SAFETY: `_PG_init` runs once per process on its only thread; RegisterXactCallback copies the pointer
    // into a list it owns.
    unsafe { pg_sys::RegisterXactCallback(Some(forget_row_lookups), std::ptr::null_mut()) };
}

// SAFETY (for callers): PostgreSQL calls it at transaction events with the argument registered (NULL).
#[pg_guard]
unsafe extern "C-unwind" fn forget_row_lookups(
    event: pg_sys::XactEvent::Type,
    _argument: *mut std::ffi::c_void,
) {
    if crate::pg::ends_transaction(event) {
        ROW_LOOKUPS.with(|lookups| *lookups.borrow_mut() = None);
    }
}

#[pg_schema]
pub mod rag {
    use crate::error::UnwrapOrRaise;
    use crate::security::{require_single_expression, RestrictedIdentity};
    use pgrx::prelude::*;
    use pgrx::{JsonB, PgSqlErrorCode};
    use std::collections::HashMap;

    /// Raises unless `expression` is one SQL expression; NULL (an absent title or filter) passes.
    #[pg_extern(stable, parallel_safe, name = "_check_expression")]
    pub fn check_expression(expression: Option<&str>, role: Option<&str>) {
        let role = crate::error::required(role, "role").unwrap_or_raise();
        if let Some(expression) = expression {
            require_single_expression(expression, role);
        }
    }

    /// The names of the columns of `source` that the expressions (content, title, filter; NULLs skipped) read,
    /// by PostgreSQL's analysis of them as the table's owner (`crate::security::expression_attributes`); NULL
    /// for every column. Raises when they no longer analyze (`rag._watch_read_columns` then answers every
    /// column). Granted to no role: analysis runs the owner's code and locks the table.
    #[pg_extern(stable, parallel_restricted, name = "_expression_columns")]
    pub fn expression_columns(
        source: pg_sys::Oid,
        expressions: Vec<Option<String>>,
    ) -> Option<Vec<String>> {
        let given: Vec<&str> = expressions.iter().flatten().map(String::as_str).collect();
        let attributes = crate::security::expression_attributes(source, &given)?;
        let names = attributes
            .into_iter()
            .filter_map(|attribute| {
                // SAFETY: a syscache lookup of an attribute of a table the analysis just locked; NULL for a
                // dropped or missing one.
                let name = unsafe { pg_sys::get_attname(source, attribute, true) };
                if name.is_null() {
                    return None;
                }
                // SAFETY: get_attname returned a palloc'd NUL-terminated copy, checked non-NULL above.
                let name = unsafe { std::ffi::CStr::from_ptr(name) };
                Some(name.to_string_lossy().into_owned())
            })
            .collect();
        Some(names)
    }

    /// Whether a row version was written by the running transaction or one of its subtransactions, from its
    /// `xmin`: `ALTER TABLE … DETACH PARTITION` rewrites the detached table's `pg_class` row, which is how
    /// `rag._on_alter_table` tells a table the command just detached from one an owner dressed up to look so.
    #[pg_extern(stable, parallel_safe, name = "_written_by_this_transaction")]
    pub fn written_by_this_transaction(xmin: i64) -> bool {
        let Ok(xid) = u32::try_from(xmin) else {
            return false;
        };
        // SAFETY: compares an xid with the running transaction's own; reads backend-local state only.
        unsafe { pg_sys::TransactionIdIsCurrentTransactionId(pg_sys::TransactionId::from(xid)) }
    }

    /// The query that finds watch `watch_id`'s row by its key (`$1`, jsonb), returning one jsonb when the role
    /// running it may see the row: the table, its key's operators and every function named with their
    /// schemas (`rag._qualified_name`, `rag._key_condition`). A reader's search asks it for every candidate
    /// from a watched table, so it is built once per watch and command and kept until the command or the
    /// transaction changes: a rename or a new column type takes a command of its own, and the next command
    /// builds the query again. NULL for a watch that does not exist.
    #[pg_extern(stable, parallel_restricted, name = "_row_lookup_sql")]
    pub fn row_lookup_sql(watch_id: i32) -> Option<String> {
        // SAFETY: reads the current transaction's command counter; never raises.
        let command = unsafe { pg_sys::GetCurrentCommandId(false) };
        let kept = super::ROW_LOOKUPS.with(|lookups| {
            lookups
                .borrow()
                .as_ref()
                .filter(|lookups| lookups.command == command)
                .and_then(|lookups| lookups.by_watch.get(&watch_id).cloned())
        });
        if kept.is_some() {
            return kept;
        }
        // A read-only SPI call: a search runs this on a hot standby too, where `Spi::get_one_with_args` (run as
        // an update) would ask for a transaction id and fail.
        let built = Spi::connect(|client| {
            client
                .select(
                    // A key no unique index covers (a watch made by an older version, or one whose index was
                    // dropped with CONCURRENTLY, which no event trigger can refuse) could find another row with
                    // the same key than the one indexed: such a watch's documents are shown to nobody the
                    // check is asked for (fail closed).
                    // So are a key whose JSON a writer's session settings change (a watch made before
                    // rag_watch refused one, or a key column's type altered since): a write from another time
                    // zone may leave a document with an earlier version's text that no pending write hides.
                    "SELECT CASE WHEN rag._key_is_unique(w.source, w.key_columns) \
                                  AND rag._key_unstable_column(w.source, w.key_columns) IS NULL \
                                 THEN pg_catalog.format('SELECT pg_catalog.to_jsonb(true) FROM ONLY %s AS r WHERE %s', \
                                                        rag._qualified_name(w.source), rag._key_condition(w)) \
                                 ELSE 'SELECT pg_catalog.to_jsonb(true) WHERE false' END \
                       FROM rag.watches w WHERE w.id = $1",
                    Some(1),
                    &[watch_id.into()],
                )?
                .first()
                .get_one::<String>()
        })
        .unwrap_or_else(|error| {
            crate::error::RagError::Spi {
                doing: format!("building the row lookup of watch {watch_id}"),
                error,
            }
            .raise()
        });
        if let Some(sql) = &built {
            super::ROW_LOOKUPS.with(|lookups| {
                let mut lookups = lookups.borrow_mut();
                let lookups = match lookups.as_mut() {
                    Some(kept) if kept.command == command => kept,
                    _ => lookups.insert(super::RowLookups {
                        command,
                        by_watch: HashMap::new(),
                    }),
                };
                lookups.by_watch.insert(watch_id, sql.clone());
            });
        }
        built
    }

    /// Runs `sql` (one query returning one jsonb column, with `$1` bound to `argument`) as `role`, in a
    /// security-restricted operation, and returns its rows. The only door through which watch expressions
    /// are evaluated outside the table's own triggers: creating a watch, reindexing, status and the worker.
    /// In a background worker the query also runs under `rag.expression_timeout`. `search_path`, when given,
    /// is in force for that query alone (a reader's row check passes the reader's own); otherwise the query
    /// sees rag's (`pg_catalog, rag, pg_temp`), so `sql` names everything else with its schema either way.
    #[pg_extern(volatile, parallel_unsafe, name = "_query_as")]
    pub fn query_as(
        role: pg_sys::Oid,
        sql: &str,
        argument: default!(Option<JsonB>, "NULL"),
        search_path: default!(Option<&str>, "NULL"),
    ) -> SetOfIterator<'static, crate::pg::RawJsonb> {
        let in_worker = crate::pg::is_background_worker();
        let timeout_ms = if in_worker {
            crate::settings::EXPRESSION_TIMEOUT_MS.get()
        } else {
            0
        };
        let argument = argument.map(|JsonB(value)| value);
        let rows = PgTryBuilder::new(|| {
            let _identity = RestrictedIdentity::enter(role, timeout_ms, search_path);
            Spi::connect(|client| {
                let statement = crate::kept::statement(client, sql, &[pg_sys::JSONBOID])?;
                let mut table = client.select(&*statement, None, &[argument.clone().map(JsonB).into()])?;
                let mut rows = Vec::with_capacity(table.len());
                let column_type = if table.is_empty() { None } else { Some(table.column_type_oid(1)?) };
                if let Some(other) = column_type.filter(|oid| *oid != PgOid::from(pg_sys::JSONBOID)) {
                    return Err(pgrx::spi::Error::DatumError(pgrx::datum::TryFromDatumError::IncompatibleTypes {
                        rust_type: "jsonb",
                        rust_oid: pg_sys::JSONBOID,
                        datum_type: format!("{other:?}"),
                        datum_oid: other.value(),
                    }));
                }
                // The table's cursor moves to each row in turn; its raw column is read where it stands.
                while table.next().is_some() {
                    if let Some(datum) = table.get_datum_by_ordinal(1)? {
                        // SAFETY: inside Spi::connect; a non-null value of a column checked to be jsonb above.
                        rows.push(unsafe { crate::pg::RawJsonb::transferred(datum) });
                    }
                }
                Ok::<_, pgrx::spi::Error>(rows)
            })
        })
        .catch_when(PgSqlErrorCode::ERRCODE_QUERY_CANCELED, |caught| {
            if timeout_ms > 0 && in_worker {
                crate::error::RagError::Timeout {
                    message: format!("the watch's expressions took longer than rag.expression_timeout ({timeout_ms} ms) for this row"),
                    hint: "Make the content, title or filter expression cheaper, or raise rag.expression_timeout.".to_string(),
                }
                .raise()
            }
            caught.rethrow()
        })
        .execute()
        .unwrap_or_else(|error| {
            crate::error::RagError::Spi {
                doing: "evaluating a watch expression".to_string(),
                error,
            }
            .raise()
        });
        SetOfIterator::new(rows)
    }
}
