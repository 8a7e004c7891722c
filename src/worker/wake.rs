//! `rag._wake_worker()`: called by the SQL functions that queue work. The wake-up happens after commit, so the
//! worker never looks for a queue row that is not visible yet, and a rolled-back transaction wakes nobody.
use pgrx::prelude::*;
use std::cell::Cell;

thread_local! {
    static WAKE_REGISTERED: Cell<bool> = const { Cell::new(false) };
}

#[pg_schema]
pub mod rag {
    use super::*;

    #[pg_extern(volatile, parallel_unsafe, name = "_wake_worker")]
    pub fn wake_worker() {
        // One callback per transaction however many rows it queued: a bulk load costs one wake-up.
        if WAKE_REGISTERED.with(|flag| flag.replace(true)) {
            return;
        }
        pgrx::register_xact_callback(pgrx::PgXactCallbackEvent::Commit, || {
            WAKE_REGISTERED.with(|flag| flag.set(false));
            crate::worker::registry::wake_workers_of_current_database();
        });
        pgrx::register_xact_callback(pgrx::PgXactCallbackEvent::Abort, || {
            WAKE_REGISTERED.with(|flag| flag.set(false));
        });
    }

    /// Whether this server runs rag's workers (the library is in shared_preload_libraries): work left to them
    /// is done. Without them (`rag_process_queue` instead), what a worker would do later is done at once.
    #[pg_extern(stable, parallel_safe, name = "_workers_available")]
    pub fn workers_available() -> bool {
        crate::worker::registry::available()
    }
}
pub use rag::wake_worker;

/// Whether the statement is `COMMIT PREPARED`. The transaction it commits may have queued work: that work's
/// wake-up was registered for a commit that never came (PREPARE ends the transaction without one), so rag's
/// ProcessUtility hook (`crate::pg`) wakes the database's workers once the statement has run. Without it an idle
/// worker would find that work only when its memo of an empty queue runs out (serve.rs, IDLE_MEMO_MAX_AGE).
///
/// # Safety
/// `pstmt` is the hook's own statement pointer, NULL or a valid PlannedStmt.
pub unsafe fn is_commit_prepared(pstmt: *mut pg_sys::PlannedStmt) -> bool {
    if pstmt.is_null() || (*pstmt).utilityStmt.is_null() {
        return false;
    }
    let statement = (*pstmt).utilityStmt;
    (*statement).type_ == pg_sys::NodeTag::T_TransactionStmt
        && (*statement.cast::<pg_sys::TransactionStmt>()).kind
            == pg_sys::TransactionStmtKind::TRANS_STMT_COMMIT_PREPARED
}
