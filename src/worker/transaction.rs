//! Transactions for background workers that must survive errors. pgrx's `BackgroundWorker::transaction`
//! lets an ERROR escape, which ends the worker; a worker that serves many documents has to roll back the one
//! that failed and carry on with the next.
use pgrx::pg_sys;
use pgrx::{PgSqlErrorCode, PgTryBuilder};
use std::panic::{RefUnwindSafe, UnwindSafe};

/// Why a step was rolled back: PostgreSQL's message, and whether it was a lock wait given up
/// (`lock_not_available`: the step can simply be done again a little later) or a limit (54000: again only
/// once what it was given changes).
pub struct StepFailure {
    pub message: String,
    pub lock_busy: bool,
    pub limit_exceeded: bool,
}

impl StepFailure {
    pub fn into_error(self) -> crate::error::RagError {
        use crate::error::RagError;
        match (self.lock_busy, self.limit_exceeded) {
            (true, _) => RagError::LockBusy(self.message),
            (false, true) => RagError::LimitExceeded(self.message),
            (false, false) => RagError::Aborted(self.message),
        }
    }
}

/// Whether a caught ERROR is "program limit exceeded" (54000), the SQLSTATE of rag's limits on what a row or
/// document holds. Not the rest of class 54: "stack depth limit exceeded" (54001) depends on how deep the
/// process was when it ran, and "too many columns" on the table, not on the row (review of red team 12).
pub(crate) fn limit_exceeded(caught: &pg_sys::panic::CaughtError) -> bool {
    sqlstate(caught) == Some(PgSqlErrorCode::ERRCODE_PROGRAM_LIMIT_EXCEEDED)
}

/// Runs `body` in a transaction of its own: committed when it returns Ok, rolled back when it returns Err (its
/// error handed back as it is) or raises (the ERROR caught, as a `StepFailure`). A step that found it could not
/// go on (a text it cannot chunk) and said so by returning Err had its writes committed all the same (review of
/// session 35: a changed watched row kept its new text beside its old chunks).
pub fn run<R, E>(
    body: impl FnOnce() -> Result<R, E> + UnwindSafe + RefUnwindSafe,
) -> Result<Result<R, E>, StepFailure> {
    // SAFETY: called from a background worker's main loop between transactions, the state in which
    // PostgreSQL's own workers start one; the snapshot pushed here is popped or released by abort below.
    unsafe {
        pg_sys::SetCurrentStatementStartTimestamp();
        pg_sys::StartTransactionCommand();
        pg_sys::PushActiveSnapshot(pg_sys::GetTransactionSnapshot());
    }
    let outcome = PgTryBuilder::new(|| Ok(body()))
        .catch_others(|caught| {
            Err(StepFailure {
                lock_busy: sqlstate(&caught) == Some(PgSqlErrorCode::ERRCODE_LOCK_NOT_AVAILABLE),
                limit_exceeded: limit_exceeded(&caught),
                message: describe(&caught),
            })
        })
        .execute();
    match outcome {
        Ok(Ok(value)) => {
            // SAFETY: the transaction and snapshot started above are still current: the body ran to its end.
            unsafe {
                pg_sys::PopActiveSnapshot();
                pg_sys::CommitTransactionCommand();
            }
            crate::pg::flush_statistics(false);
            Ok(Ok(value))
        }
        Ok(Err(error)) => {
            // SAFETY: the body returned without raising, so no error state is pending: the transaction is
            // aborted as a background worker aborts one after an error it has handled, releasing the snapshot,
            // locks, SPI state and transaction memory.
            unsafe { pg_sys::AbortCurrentTransaction() };
            crate::pg::flush_statistics(false);
            Ok(Err(error))
        }
        Err(failure) => {
            // Abort releases the snapshot, locks, SPI state and transaction memory in one go.
            // SAFETY: PgTryBuilder caught the error and flushed PostgreSQL's error state, which is the state
            // AbortCurrentTransaction expects, as in PostgreSQL's own error recovery.
            unsafe { pg_sys::AbortCurrentTransaction() };
            // An aborted insert's rows are dead rows for vacuum to find.
            crate::pg::flush_statistics(false);
            Err(failure)
        }
    }
}

pub(crate) fn sqlstate(caught: &pg_sys::panic::CaughtError) -> Option<PgSqlErrorCode> {
    use pg_sys::panic::CaughtError;
    match caught {
        CaughtError::PostgresError(report) | CaughtError::ErrorReport(report) => {
            Some(report.sql_error_code())
        }
        CaughtError::RustPanic { .. } => None,
    }
}

pub fn describe(caught: &pg_sys::panic::CaughtError) -> String {
    use pg_sys::panic::CaughtError;
    let report = match caught {
        CaughtError::PostgresError(report) | CaughtError::ErrorReport(report) => report,
        CaughtError::RustPanic { ereport, .. } => ereport,
    };
    match report.detail() {
        Some(detail) => format!("{} ({detail})", report.message()),
        None => report.message().to_string(),
    }
}
