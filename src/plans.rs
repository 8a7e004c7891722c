//! Cached plans made for tables far smaller than they have become.
//!
//! A session keeps the plans of its statements, and of the foreign key checks its inserts run, for as long as
//! nothing invalidates them: a DDL on the table, or an ANALYZE (autovacuum's among them) that changes its
//! statistics. Rows a transaction is still inserting are in no statistics. So a session that began on a small
//! `rag.documents` (one that a VACUUM found empty after a collection was dropped says 0 rows, and the planner
//! then trusts the table's actual size) kept the sequential scan it chose for the foreign key check of
//! `rag.queue`, and read the whole table again for every document it went on to ingest: a load of 3,000
//! documents in one transaction spent a third of its time there, and the cost grows with the square of the
//! load. The worker's own plans (its claims, its stores) are made once per session too and aged the same way.
//!
//! The remedy PostgreSQL's own invalidations apply, applied when the tables grow instead: once rag's queue and
//! documents together have doubled in size since this session last did, every cached plan of the session is
//! marked for planning again, which the next use does with the tables' present size. Doubling keeps it to a
//! few times in a session's life (about 15 between an empty table and a million documents).
//!
//! The busy worker also has every plan made again every 2 s, whatever the sizes (src/worker/serve.rs,
//! `upkeep_while_busy`, for `rag.chunks`, which a reindex empties and refills with the documents unchanged).
//! The worker's claims ask here as well: early in a load the tables double faster than that, and a plan made
//! on the first batch's tables was used for the rest of the first 2 s (`_store_documents`' lookup of its
//! documents: 855 ms and 572K buffers over a 3,000-document load before, 70 ms and 17K with this check;
//! BENCHMARKS.md §3).
//!
//! It helps only where the planner scales a table's statistics to its present size, which it does from the
//! density they record (rows per page) or, when they record no pages (a VACUUM that found the table empty
//! and truncated it), from the rows' width. Statistics of a table found empty but not truncated (a VACUUM or
//! ANALYZE while a snapshot still saw the deleted rows) record 0 rows on some pages: density 0, so one row
//! whatever its size, and planning again makes the same plan. The worker's statements are written to stay
//! cheap under either plan (`rag._claim_more`'s update, for one).
use pgrx::prelude::*;
use std::cell::Cell;

/// The tables whose size the session's plans are checked against: those every document passes through.
const WATCHED_TABLES: [&std::ffi::CStr; 2] = [c"documents", c"queue"];

/// Below this many blocks (128 kB) any plan reads little enough; a session's first look at tables at least
/// this large plans afresh once.
const SMALLEST_BLOCKS: u64 = 16;

thread_local! {
    /// The tables' size, in blocks, when this session last had its plans made again (0: never).
    static BLOCKS_AT_LAST_REPLAN: Cell<u64> = const { Cell::new(0) };
}

/// Whether plans made at `at_last_replan` blocks are due to be made again at `now` blocks.
fn grown_enough(at_last_replan: u64, now: u64) -> bool {
    now >= SMALLEST_BLOCKS && now >= at_last_replan.saturating_mul(2)
}

/// The size growth is measured from: the last replan's, or the tables' present size once they have shrunk
/// below half of it (a dropped collection, then a VACUUM that truncated them). Kept at the old peak, a session
/// that planned again on the small tables waited for them to pass twice that peak (review of session 39: 400
/// sequential scans in a 400-document load, against 71 in a new session).
fn measured_from(at_last_replan: u64, now: u64) -> u64 {
    if now < at_last_replan / 2 {
        now
    } else {
        at_last_replan
    }
}

/// Has this session's cached plans made again when rag's tables have doubled since it last did (the module's
/// comment says why). Never waits: a table locked exclusively (a restore, an ALTER) is left for the next call.
pub fn replan_if_tables_grew() {
    let Some(now) = watched_blocks() else {
        return;
    };
    let from = measured_from(BLOCKS_AT_LAST_REPLAN.get(), now);
    BLOCKS_AT_LAST_REPLAN.set(from);
    if grown_enough(from, now) {
        BLOCKS_AT_LAST_REPLAN.set(now);
        // SAFETY: marks every cached plan of this backend invalid, what an invalidation message for a catalog
        // does at any command's start; plans in use stay valid until released, and the next use plans again.
        unsafe { pg_sys::ResetPlanCache() };
    }
}

/// The blocks of rag's watched tables, or None when the schema or a table is missing or a table is locked
/// against readers.
fn watched_blocks() -> Option<u64> {
    let mut total = 0u64;
    // SAFETY: catalog lookups by name within the caller's transaction; each table is locked (AccessShareLock,
    // held to the end of the transaction, as any reader's) before it is opened, and closed again at once.
    unsafe {
        let namespace = pg_sys::get_namespace_oid(c"rag".as_ptr(), true);
        if namespace == pg_sys::InvalidOid {
            return None;
        }
        for table in WATCHED_TABLES {
            let relid = pg_sys::get_relname_relid(table.as_ptr(), namespace);
            if relid == pg_sys::InvalidOid
                || !pg_sys::ConditionalLockRelationOid(
                    relid,
                    pg_sys::AccessShareLock as pg_sys::LOCKMODE,
                )
            {
                return None;
            }
            let relation = pg_sys::try_relation_open(relid, pg_sys::NoLock as pg_sys::LOCKMODE);
            if relation.is_null() {
                return None;
            }
            total += u64::from(pg_sys::RelationGetNumberOfBlocksInFork(
                relation,
                pg_sys::ForkNumber::MAIN_FORKNUM,
            ));
            pg_sys::relation_close(relation, pg_sys::NoLock as pg_sys::LOCKMODE);
        }
    }
    Some(total)
}

#[pg_schema]
mod rag {
    use pgrx::prelude::*;

    /// `plans::replan_if_tables_grew` for `rag_ingest`, which inserts into rag's tables from a caller's session
    /// one document at a time (`rag_reindex` inserts its documents in one statement planned afresh each call:
    /// `plan_cache_mode = force_custom_plan`, which its foreign key checks follow).
    #[pg_extern(volatile, parallel_unsafe, name = "_replan_if_tables_grew")]
    fn replan_if_tables_grew() {
        super::replan_if_tables_grew();
    }
}
