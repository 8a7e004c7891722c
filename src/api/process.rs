//! `rag_process_queue()`: the worker's job done in the caller's session, for servers where the library is
//! not in shared_preload_libraries. Each step runs in a subtransaction, so one bad document is recorded as
//! failed and the others still go through. Provider calls happen inside the caller's transaction here,
//! which is the price of having no worker; they still honour cancellation and statement_timeout.
use crate::worker::embedder::{process_next, Outcome, ProviderCache, Steps};
use pgrx::prelude::*;
use pgrx::PgTryBuilder;
use rag_embed::SplitMix64;
use std::panic::{RefUnwindSafe, UnwindSafe};

struct Subtransactions;

impl Steps for Subtransactions {
    fn run<R>(
        &self,
        body: impl FnOnce() -> Result<R, pgrx::spi::Error> + UnwindSafe + RefUnwindSafe,
    ) -> Result<R, String> {
        // SAFETY: the pattern PL/pgSQL uses for an exception block: remember the memory context and resource
        // owner, start an internal subtransaction, and restore both after releasing or rolling it back; the
        // body's ERROR is caught by PgTryBuilder before the rollback.
        unsafe {
            let context = pg_sys::CurrentMemoryContext;
            let owner = pg_sys::CurrentResourceOwner;
            pg_sys::BeginInternalSubTransaction(std::ptr::null());
            pg_sys::MemoryContextSwitchTo(context);
            let outcome = PgTryBuilder::new(|| Ok(body()))
                .catch_others(|caught| Err(crate::worker::transaction::describe(&caught)))
                .execute();
            match outcome {
                Ok(result) => {
                    pg_sys::ReleaseCurrentSubTransaction();
                    pg_sys::MemoryContextSwitchTo(context);
                    pg_sys::CurrentResourceOwner = owner;
                    result.map_err(|error| error.to_string())
                }
                Err(message) => {
                    pg_sys::RollbackAndReleaseCurrentSubTransaction();
                    pg_sys::MemoryContextSwitchTo(context);
                    pg_sys::CurrentResourceOwner = owner;
                    Err(message)
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
    let mut cache = ProviderCache::default();
    let mut rng = SplitMix64::from_entropy();
    let mut worked = 0;
    while worked < max_items.max(0) {
        match process_next(&Subtransactions, &mut cache, &mut rng) {
            Ok(Outcome::Worked) => worked += 1,
            Ok(Outcome::Idle(_)) | Ok(Outcome::Stopped) => break,
            Err(message) => crate::api::raise(
                pgrx::PgSqlErrorCode::ERRCODE_INTERNAL_ERROR,
                format!("processing the queue failed: {message}"),
                "",
            ),
        }
    }
    worked
}
