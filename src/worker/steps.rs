//! How the steps of one document are made durable: separate transactions in the worker, subtransactions in a
//! user's session (`rag_process_queue`, `src/api/process.rs`). Every step is idempotent, so a step that fails
//! or is interrupted is simply done again.
use crate::error::RagError;
use crate::worker::transaction;
use std::panic::{RefUnwindSafe, UnwindSafe};
use std::time::Duration;

pub trait Steps {
    /// Runs `body` as one step: committed when it returns Ok, rolled back when it returns Err or raises.
    fn run<R, E: Into<RagError>>(
        &self,
        body: impl FnOnce() -> Result<R, E> + UnwindSafe + RefUnwindSafe,
    ) -> Result<R, RagError>;
    /// True when the caller wants the work to stop (shutdown); may also raise (query cancel).
    fn interrupted(&self) -> bool;
}

pub struct WorkerTransactions;

impl Steps for WorkerTransactions {
    fn run<R, E: Into<RagError>>(
        &self,
        body: impl FnOnce() -> Result<R, E> + UnwindSafe + RefUnwindSafe,
    ) -> Result<R, RagError> {
        transaction::run(body)
            .map_err(transaction::StepFailure::into_error)
            .and_then(|result| result.map_err(Into::into))
    }
    fn interrupted(&self) -> bool {
        crate::pg::absorb_signal_barriers();
        crate::pg::shutdown_requested()
    }
}

/// What one round of the worker did.
pub enum Step {
    /// A document or row was worked on (finished, deferred or failed); look for more at once.
    Worked,
    /// Nothing is due; look again after this long at the latest (a provider's cool-down ends).
    Idle(Option<Duration>),
    /// The caller asked us to stop.
    Stopped,
}
