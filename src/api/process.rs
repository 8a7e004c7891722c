//! `rag_process_queue()`: the worker's job done in the caller's session, for servers where the library is
//! not in shared_preload_libraries. Each step runs in a subtransaction, so one bad document is recorded as
//! failed and the others still go through. Provider calls happen inside the caller's transaction here,
//! which is the price of having no worker; they still honour cancellation and statement_timeout.
use crate::error::{RagError, SpiContext, UnwrapOrRaise};
use crate::worker::breaker::Providers;
use crate::worker::documents::process_next;
use crate::worker::steps::{Step, Steps};
use pgrx::prelude::*;
use pgrx::PgTryBuilder;
use rag_embed::SplitMix64;
use std::panic::{RefUnwindSafe, UnwindSafe};

struct Subtransactions;

impl Steps for Subtransactions {
    fn run<R, E: Into<RagError>>(
        &self,
        body: impl FnOnce() -> Result<R, E> + UnwindSafe + RefUnwindSafe,
    ) -> Result<R, RagError> {
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
                    // A lock wait given up (a store's 2 s bound) puts the document back, as in the worker.
                    Err(
                        match crate::worker::transaction::sqlstate(&caught)
                            == Some(pgrx::PgSqlErrorCode::ERRCODE_LOCK_NOT_AVAILABLE)
                        {
                            true => RagError::LockBusy(message),
                            false => RagError::Aborted(message),
                        },
                    )
                })
                .execute();
            match outcome {
                Ok(result) => {
                    pg_sys::ReleaseCurrentSubTransaction();
                    pg_sys::MemoryContextSwitchTo(context);
                    pg_sys::CurrentResourceOwner = owner;
                    result.map_err(Into::into)
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
        pgrx::check_for_interrupts!();
        false
    }
}

/// Processes up to `max_items` due documents in this session; returns how many it worked on.
#[pg_extern(volatile, parallel_unsafe, security_definer)]
pub fn rag_process_queue(max_items: default!(i32, 100)) -> i32 {
    // A hot standby cannot write: said with the primary's address rather than with PostgreSQL's "cannot assign
    // TransactionIds during recovery" from the first step.
    if crate::pg::in_recovery() {
        Spi::connect(|client| {
            client
                .select(
                    "SELECT rag._refuse_writes_on_standby('rag_process_queue')",
                    None,
                    &[],
                )
                .map(|_| ())
        })
        .doing(|| "checking for a standby".to_string())
        .unwrap_or_raise();
    }
    let mut providers = Providers::default();
    let mut rng = SplitMix64::from_entropy();
    let mut worked = 0;
    while worked < max_items.max(0) {
        match process_next(&Subtransactions, &mut providers, &mut rng, 1) {
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
