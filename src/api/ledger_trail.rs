//! What the ledger would lose to a rollback. A ledger row (`rag.queries`) is written in the caller's own
//! transaction, so `BEGIN; SELECT rag_ask(…); ROLLBACK;`, a cancel or an error after the provider answered, or
//! a savepoint rolled back around the call, would leave a provider call (and the key it spent) without a trace.
//! PostgreSQL has no autonomous transactions; what survives a rollback is the server log. So the backend keeps,
//! per (sub)transaction, the ledger rows it wrote and the provider calls no row accounts for yet, and when
//! that (sub)transaction aborts, writes each to the server log as the one line `rag ledger: {json}` a hot
//! standby writes for every call (README, "Operations"), with `"rolled_back": true`. A commit forgets them.

use std::cell::RefCell;

use pgrx::pg_sys;

/// How many entries a transaction keeps in full; past that, a long batch of calls in one transaction is
/// counted rather than held in memory, and the count is logged.
const MAX_HELD: usize = 1000;

struct Held {
    /// The subtransaction that wrote it: rolled back with it or any enclosing one.
    subtransaction: pg_sys::SubTransactionId,
    /// A provider call not yet in a row (true) or a row's own line (false).
    call: bool,
    line: String,
}

#[derive(Default)]
struct Trail {
    held: Vec<Held>,
    /// Entries past MAX_HELD, by subtransaction, in the order they came.
    uncounted: Vec<(pg_sys::SubTransactionId, usize)>,
}

thread_local! {
    static TRAIL: RefCell<Trail> = RefCell::new(Trail::default());
}

/// Registers the (sub)transaction callbacks; once per process, from `_PG_init`.
pub fn install() {
    // SAFETY: `_PG_init` runs once per process on its only thread; the registrations copy the pointers into
    // lists PostgreSQL owns.
    unsafe {
        pg_sys::RegisterXactCallback(Some(at_transaction_end), std::ptr::null_mut());
        pg_sys::RegisterSubXactCallback(Some(at_subtransaction_end), std::ptr::null_mut());
    }
}

fn hold(call: bool, line: String) {
    // SAFETY: reads the current subtransaction's id; never raises.
    let subtransaction = unsafe { pg_sys::GetCurrentSubTransactionId() };
    TRAIL.with(|trail| {
        let Ok(mut trail) = trail.try_borrow_mut() else {
            return;
        };
        if trail.held.len() < MAX_HELD {
            trail.held.push(Held {
                subtransaction,
                call,
                line,
            });
        } else {
            match trail.uncounted.last_mut() {
                Some((last, count)) if *last == subtransaction => *count += 1,
                _ => trail.uncounted.push((subtransaction, 1)),
            }
        }
    });
}

thread_local! {
    /// Set while a call no ledger row will account for runs (rag_prompt): its provider calls are not held.
    static NOT_LEDGERED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `body` with its provider calls not held (see `NOT_LEDGERED`); reset on the way out, an ERROR included.
pub fn not_ledgered<R>(body: impl FnOnce() -> R) -> R {
    struct Reset(bool);
    impl Drop for Reset {
        fn drop(&mut self) {
            NOT_LEDGERED.set(self.0);
        }
    }
    let _reset = Reset(NOT_LEDGERED.replace(true));
    body()
}

/// A provider call of a user's rag_query or rag_ask is about to be sent (a server's: a local model spends no
/// key). Until the call's ledger row is written ([`row_written`]), a rollback logs it.
pub fn call_sent(what: &str, collection_id: i32, provider: &str, model: &str) {
    if NOT_LEDGERED.get() {
        return;
    }
    // The role the ledger row would name, asked as the row's own writer asks (the frames need a call through
    // the function manager to tell who is calling).
    // Read-only SPI: a hot standby answers rag_ask too.
    let role_name = pgrx::Spi::connect(|client| {
        client
            .select("SELECT rag._calling_role()::text", Some(1), &[])?
            .first()
            .get_one::<String>()
    })
    .ok()
    .flatten()
    .unwrap_or_default();
    let line = serde_json::json!({
        "collection_id": collection_id,
        "provider_call": what,
        "provider": provider,
        "model": model,
        "role": role_name,
        "rolled_back": true,
    });
    hold(true, line.to_string());
}

/// A ledger row was written, in the line a standby would log for it (None: the line went to the server log
/// at once, a standby's or a read-only transaction's way): the calls held since the current subtransaction
/// began are accounted for by it (a call held at an enclosing level belongs to that level's own call).
fn row_written(line: Option<String>) {
    // SAFETY: reads the current subtransaction's id; never raises.
    let current = unsafe { pg_sys::GetCurrentSubTransactionId() };
    TRAIL.with(|trail| {
        if let Ok(mut trail) = trail.try_borrow_mut() {
            trail
                .held
                .retain(|held| !(held.call && held.subtransaction >= current));
        }
    });
    if let Some(line) = line {
        hold(false, line);
    }
}

/// Logs and forgets what (sub)transactions from `since` on held. Runs inside PostgreSQL's abort processing:
/// LOG raises nothing, and nothing here can panic but an allocation.
fn log_rolled_back(since: pg_sys::SubTransactionId) {
    let (lines, uncounted) = TRAIL.with(|trail| {
        let Ok(mut trail) = trail.try_borrow_mut() else {
            return (Vec::new(), 0);
        };
        let (gone, kept): (Vec<Held>, Vec<Held>) = std::mem::take(&mut trail.held)
            .into_iter()
            .partition(|held| held.subtransaction >= since);
        trail.held = kept;
        let (gone_uncounted, kept_uncounted): (Vec<_>, Vec<_>) =
            std::mem::take(&mut trail.uncounted)
                .into_iter()
                .partition(|(subtransaction, _)| *subtransaction >= since);
        trail.uncounted = kept_uncounted;
        (
            gone.into_iter().map(|held| held.line).collect::<Vec<_>>(),
            gone_uncounted.iter().map(|(_, count)| count).sum::<usize>(),
        )
    });
    for line in lines {
        pgrx::log!("rag ledger: {line}");
    }
    if uncounted > 0 {
        pgrx::log!(
            "rag ledger: {{\"rolled_back\": true, \"not_listed\": {uncounted}, \"note\": \"more calls rolled back in this transaction than are listed one by one\"}}"
        );
    }
}

fn forget_all() {
    TRAIL.with(|trail| {
        if let Ok(mut trail) = trail.try_borrow_mut() {
            trail.held.clear();
            trail.uncounted.clear();
        }
    });
}

/// PostgreSQL's `TopSubTransactionId`: every subtransaction's id is above it.
const TOP_SUBTRANSACTION: pg_sys::SubTransactionId = 1;

// SAFETY (for callers): PostgreSQL calls it at transaction events with the argument registered (NULL).
#[pgrx::pg_guard]
unsafe extern "C-unwind" fn at_transaction_end(
    event: pg_sys::XactEvent::Type,
    _argument: *mut std::ffi::c_void,
) {
    match event {
        pg_sys::XactEvent::XACT_EVENT_ABORT | pg_sys::XactEvent::XACT_EVENT_PARALLEL_ABORT => {
            log_rolled_back(TOP_SUBTRANSACTION)
        }
        // A prepared transaction's rows are on disk; whether it is committed later is the DBA's decision.
        event if crate::pg::ends_transaction(event) => forget_all(),
        _ => {}
    }
}

// SAFETY (for callers): PostgreSQL calls it at subtransaction events with the subtransaction's id.
#[pgrx::pg_guard]
unsafe extern "C-unwind" fn at_subtransaction_end(
    event: pg_sys::SubXactEvent::Type,
    subtransaction: pg_sys::SubTransactionId,
    _parent: pg_sys::SubTransactionId,
    _argument: *mut std::ffi::c_void,
) {
    if event == pg_sys::SubXactEvent::SUBXACT_EVENT_ABORT_SUB {
        log_rolled_back(subtransaction);
    }
}

#[pgrx::pg_schema]
pub mod rag {
    use pgrx::prelude::*;

    /// Called by `rag._record_query` (rag's owner only) with the line a standby would log for the row it just
    /// wrote: held until the transaction ends, logged if it rolls back. NULL when the line was logged already.
    #[pg_extern(volatile, parallel_unsafe, name = "_ledger_row_written")]
    pub fn ledger_row_written(line: Option<&str>) {
        super::row_written(line.map(str::to_string));
    }
}
