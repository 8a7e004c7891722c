//! `rag_process_queue()`: the worker's job done in the caller's session, for servers where the library is
//! not in shared_preload_libraries. Each step runs in a subtransaction, so one bad document is recorded as
//! failed and the others still go through. Provider calls happen inside the caller's transaction here,
//! which is the price of having no worker; a cancel or statement_timeout stops the call (the step it lands in is
//! undone and its item put back, what was finished stays, and the call returns with a WARNING), and every server
//! call is held by the ledger trail, so that a rollback of the caller's transaction leaves a `rag ledger:` line
//! for it in the server log.
//!
//! It runs as rag's owner with the caller's session, so what a caller may make it do is bounded: a role that
//! is not a superuser has only the work of the collections it administers *and* may read whole (every row of
//! every table they watch) processed (red team 12: any rag_admin had every collection's documents and every
//! owner's watched rows read in its session, where `debug_print_plan` showed them, and spent their keys).
//! The settings that would let the session see or change the steps (`debug_print_*`, `row_security`) are
//! pinned on the function itself (sql/security.sql).
use crate::error::{RagError, SpiContext, UnwrapOrRaise};
use crate::worker::breaker::Providers;
use crate::worker::documents::process_next;
use crate::worker::steps::{Step, Steps};
use pgrx::prelude::*;
use pgrx::PgTryBuilder;
use rag_embed::SplitMix64;
use std::cell::RefCell;
use std::panic::{RefUnwindSafe, UnwindSafe};

/// What a `rag_process_queue` call running in this backend may process: None outside one (the worker) or
/// for a superuser, else the ids of the collections it may.
#[derive(Clone)]
enum Session {
    Idle,
    Running(Option<Vec<i32>>),
}

thread_local! {
    static SESSION: RefCell<Session> = const { RefCell::new(Session::Idle) };
}

/// Ends a call's session run, an ERROR's unwinding included.
struct SessionRun;

impl SessionRun {
    fn start(scope: Option<Vec<i32>>) -> SessionRun {
        SESSION.replace(Session::Running(scope));
        SessionRun
    }
}

impl Drop for SessionRun {
    fn drop(&mut self) {
        SESSION.replace(Session::Idle);
        INTERRUPTED.set(None);
    }
}

/// A provider call of the worker's steps is about to be sent: inside `rag_process_queue`, the caller's
/// transaction may still roll it back with the documents' call counters, so the ledger trail holds it (a
/// local model spends no key and is not held). The worker's own calls are counted on the documents in
/// transactions of its own.
pub fn embedding_call_sent(item: &crate::store::WorkItem) {
    if !matches!(SESSION.with_borrow(Session::clone), Session::Running(_)) {
        return;
    }
    if matches!(item.provider.kind, crate::provider::Kind::Server(_)) {
        crate::api::ledger_trail::call_sent(
            "embedding documents",
            item.collection_id,
            &item.provider.name,
            &item.model,
        );
    }
}

#[pg_schema]
mod rag {
    use pgrx::prelude::*;

    /// The collections a `rag_process_queue` call running in this backend may process; NULL for the worker
    /// and a superuser's call (everything). rag._claim_next and rag._claim_row read it.
    #[pg_extern(stable, parallel_restricted, name = "_claim_scope")]
    pub fn claim_scope() -> Option<Vec<i32>> {
        match super::SESSION.with_borrow(super::Session::clone) {
            super::Session::Running(scope) => scope,
            super::Session::Idle => None,
        }
    }
}

/// The collections a caller who is not a superuser has processed: those it administers and may read whole.
fn scope_of_caller() -> Option<Vec<i32>> {
    Spi::connect(|client| {
        client
            .select(
                "SELECT CASE WHEN r.rolsuper THEN NULL ELSE \
                        ARRAY(SELECT unnest(rag._collections_with(r.rolname, 'admin')) \
                              INTERSECT SELECT unnest(rag._collections_held_whole(r.rolname)) ORDER BY 1) END \
                   FROM pg_catalog.pg_roles r WHERE r.rolname = rag._calling_role()",
                Some(1),
                &[],
            )?
            .first()
            .get_one::<Vec<i32>>()
    })
    .doing(|| "finding the collections the caller may process".to_string())
    .unwrap_or_raise()
}

/// Whether a caught ERROR is PostgreSQL interrupting the call: the caller's `pg_cancel_backend` or
/// statement_timeout, raised by ProcessInterrupts itself. Only that: a table owner's watch expression may
/// RAISE the same SQLSTATE (57014), and taken as a cancel it ended every call at that row, a superuser's too
/// (review of red team 12); raised by code, it is the row's failure, as in the worker.
fn interrupts_the_call(caught: &pg_sys::panic::CaughtError) -> bool {
    use pg_sys::panic::CaughtError;
    let report = match caught {
        CaughtError::PostgresError(report) | CaughtError::ErrorReport(report) => report,
        CaughtError::RustPanic { .. } => return false,
    };
    report.sql_error_code() == pgrx::PgSqlErrorCode::ERRCODE_QUERY_CANCELED
        && report.function_name() == Some("ProcessInterrupts")
}

thread_local! {
    /// Set when PostgreSQL interrupted this backend's `rag_process_queue` call, with its message: from then on no
    /// step runs (the document or row under way must not be recorded as failed) and the call returns.
    static INTERRUPTED: RefCell<Option<String>> = const { RefCell::new(None) };
    /// The start of the statement a call of which was interrupted: PostgreSQL raises a statement's timeout
    /// once, so the statement's later calls (a loop calling rag_process_queue) return at once instead of
    /// running on past the timeout the first call stopped for (second review of red team 12's fixes).
    static STOPPED_STATEMENT: std::cell::Cell<Option<pg_sys::TimestampTz>> = const { std::cell::Cell::new(None) };
}

fn statement_started() -> pg_sys::TimestampTz {
    // SAFETY: reads the start time PostgreSQL keeps for the current statement; never raises.
    unsafe { pg_sys::GetCurrentStatementStartTimestamp() }
}

struct Subtransactions;

impl Steps for Subtransactions {
    fn run<R, E: Into<RagError>>(
        &self,
        body: impl FnOnce() -> Result<R, E> + UnwindSafe + RefUnwindSafe,
    ) -> Result<R, RagError> {
        if let Some(message) = INTERRUPTED.with_borrow(Clone::clone) {
            return Err(RagError::Aborted(message));
        }
        // SAFETY: the pattern PL/pgSQL uses for an exception block: remember the memory context and resource
        // owner, start an internal subtransaction, and restore both after releasing or rolling it back; the
        // body's ERROR is caught by PgTryBuilder before the rollback.
        unsafe {
            let context = pg_sys::CurrentMemoryContext;
            let owner = pg_sys::CurrentResourceOwner;
            pg_sys::BeginInternalSubTransaction(std::ptr::null());
            pg_sys::MemoryContextSwitchTo(context);
            let outcome = PgTryBuilder::new(|| Ok(body()))
                .catch_others(|caught| {
                    let message = crate::worker::transaction::describe(&caught);
                    if interrupts_the_call(&caught) {
                        INTERRUPTED.set(Some(message.clone()));
                        return Err(RagError::Aborted(message));
                    }
                    // As the worker's steps fail: a lock wait given up (a store's 2 s bound) puts the document
                    // back, a limit fails a watched row until it is written again.
                    Err(crate::worker::transaction::StepFailure {
                        lock_busy: crate::worker::transaction::sqlstate(&caught)
                            == Some(pgrx::PgSqlErrorCode::ERRCODE_LOCK_NOT_AVAILABLE),
                        limit_exceeded: crate::worker::transaction::limit_exceeded(&caught),
                        message,
                    }
                    .into_error())
                })
                .execute();
            match outcome {
                Ok(Ok(value)) => {
                    pg_sys::ReleaseCurrentSubTransaction();
                    pg_sys::MemoryContextSwitchTo(context);
                    pg_sys::CurrentResourceOwner = owner;
                    Ok(value)
                }
                // An error the body returned rolls its writes back, as one it raised does (the worker's steps
                // do the same: `crate::worker::transaction::run`).
                Ok(Err(error)) => {
                    pg_sys::RollbackAndReleaseCurrentSubTransaction();
                    pg_sys::MemoryContextSwitchTo(context);
                    pg_sys::CurrentResourceOwner = owner;
                    Err(error.into())
                }
                Err(error) => {
                    pg_sys::RollbackAndReleaseCurrentSubTransaction();
                    pg_sys::MemoryContextSwitchTo(context);
                    pg_sys::CurrentResourceOwner = owner;
                    Err(error)
                }
            }
        }
    }

    fn interrupted(&self) -> bool {
        // Looked at in a subtransaction of its own, as a step is: a cancel that lands while a provider answers
        // (this is called while waiting for it) is caught there and stops the call like one in a step, instead of
        // ending the caller's statement with every finished step undone.
        let _ = self.run(|| {
            pgrx::check_for_interrupts!();
            Ok::<(), RagError>(())
        });
        INTERRUPTED.with_borrow(Option::is_some)
    }
}

/// After an interrupt: the claims this call still holds go back, for the worker or the next call: a document's
/// stops counting as unfinished (five of those give a document up); a watched row's backs off, as below. In a step of its own,
/// waiting at most a second for any lock (the cancel that stopped the call has been used up, so nothing else
/// would bound the wait), and with the foreign key checks off for it: the queue row was updated by the claim
/// earlier in this transaction, so PostgreSQL checks its document again on any update, and a transaction that
/// holds the document (the very thing the call was stopped waiting for) would hold the release too. Only the
/// claim's columns change; the key they check does not.
fn release_claims() {
    let released = Subtransactions.run(|| {
        Spi::connect_mut(|client| {
            let previous = client
                .select(
                    "SELECT pg_catalog.current_setting('lock_timeout'), \
                            pg_catalog.current_setting('session_replication_role')",
                    Some(1),
                    &[],
                )?
                .first()
                .get_two::<String, String>()?;
            client.update(
                "SELECT pg_catalog.set_config('lock_timeout', '1s', true), \
                        pg_catalog.set_config('session_replication_role', 'replica', true)",
                None,
                &[],
            )?;
            client.update(
                "UPDATE rag.queue SET claimed_by = NULL, claimed_at = NULL,
                        unfinished_claims = greatest(unfinished_claims - 1, 0)
                  WHERE claimed_by = pg_catalog.pg_backend_pid()",
                None,
                &[],
            )?;
            // A watched row under way ran its table owner's expressions, which may be what took the time: stopped
            // there, it backs off like a row that failed (its claim counted an attempt), so that a slow expression
            // does not stop every time-bounded call at the same row, a superuser's too, with nothing behind it
            // processed (second review of red team 12's fixes).
            client.update(
                "UPDATE rag.row_queue SET claimed_by = NULL,
                        last_error = 'rag_process_queue was stopped (a cancel or statement_timeout) while syncing this row',
                        not_before = now() + least(interval '30 seconds' * power(2, least(greatest(attempts, 1) - 1, 7)),
                                                   interval '1 hour')
                  WHERE claimed_by = pg_catalog.pg_backend_pid()",
                None,
                &[],
            )?;
            client.update(
                "SELECT pg_catalog.set_config('lock_timeout', $1, true), \
                        pg_catalog.set_config('session_replication_role', $2, true)",
                None,
                &[
                    previous.0.unwrap_or_default().into(),
                    previous.1.unwrap_or_else(|| "origin".to_string()).into(),
                ],
            )?;
            Ok::<_, pgrx::spi::Error>(())
        })
    });
    if let Err(error) = released {
        // They are free once this session ends (claims of gone processes are taken again).
        pgrx::warning!("rag_process_queue: putting back what it had claimed: {error}");
    }
}

/// Processes up to `max_items` due documents in this session; returns how many it worked on.
#[pg_extern(volatile, parallel_unsafe, security_definer)]
pub fn rag_process_queue(max_items: default!(i32, 100)) -> i32 {
    // A hot standby or a read-only transaction cannot write: said at once (with the primary's address on a
    // standby) rather than with PostgreSQL's "cannot assign TransactionIds during recovery" from the first step.
    crate::api::require_writable("rag_process_queue").unwrap_or_raise();
    // Each claim needs what the worker committed since the last: one snapshot for the call claimed what was
    // done already, and failed with a serialization error reported as an internal one (red team 29).
    crate::api::require_read_committed("rag_process_queue").unwrap_or_raise();
    if STOPPED_STATEMENT.get() == Some(statement_started()) {
        return 0;
    }
    let _run = SessionRun::start(scope_of_caller());
    let mut providers = Providers::default();
    let mut rng = SplitMix64::from_entropy();
    let mut worked = 0;
    while worked < max_items.max(0) {
        let step = process_next(&Subtransactions, &mut providers, &mut rng, 1);
        if let Some(message) = INTERRUPTED.with_borrow(Clone::clone) {
            // What the call finished stays; the step under way was undone and its item goes back. The
            // statement returns, so a call under statement_timeout (cron's, say) keeps making progress on a
            // backlog it cannot finish in one go.
            INTERRUPTED.set(None);
            STOPPED_STATEMENT.set(Some(statement_started()));
            release_claims();
            pgrx::warning!(
                "rag_process_queue stopped: {message}; the {worked} items it finished are kept, the one under way was put back"
            );
            return worked;
        }
        match step {
            Ok(Step::Worked) => worked += 1,
            Ok(Step::Idle(_)) => {
                // The queue is empty: what a worker's idle moment does for indexes (a load whose index a
                // concurrent store kept this session from building). A failure here loses nothing.
                if let Err(error) =
                    Subtransactions.run(|| crate::store::repair_indexes_after_writes(true))
                {
                    pgrx::debug1!("rag_process_queue: repairing indexes: {error}");
                }
                break;
            }
            Ok(Step::Stopped) => break,
            Err(error) => Err::<(), _>(RagError::Internal(format!(
                "processing the queue failed: {error}"
            )))
            .unwrap_or_raise(),
        }
    }
    worked
}
