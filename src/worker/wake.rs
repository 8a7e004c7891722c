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
