//! One worker serving one database: it waits for the extension's SQL to match the library, then takes turns
//! with the claim loop (`documents.rs`), repairs missing indexes when idle, and makes room for other
//! databases when it has nothing queued and workers are wanted elsewhere.
use crate::store;
use crate::worker::breaker::Providers;
use crate::worker::documents::process_next;
use crate::worker::registry::{self, SlotState};
use crate::worker::steps::{Step, Steps, WorkerTransactions};
use pgrx::bgworkers::{BackgroundWorker, SignalWakeFlags};
use pgrx::prelude::*;
use rag_embed::SplitMix64;
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use crate::pg::shutdown_requested;

/// After a package upgrade the new library runs against the old SQL until someone runs `ALTER EXTENSION rag
/// UPDATE`: the worker's queries name functions and columns of its own version, so it waits (saying so once in
/// the log) rather than failing every nap. Returns false when asked to shut down while waiting.
fn wait_for_matching_schema(steps: &WorkerTransactions) -> bool {
    let library = env!("CARGO_PKG_VERSION");
    let mut told = false;
    loop {
        match steps.run(store::installed_version) {
            Ok(Some(installed)) if installed == library => return true,
            Ok(Some(installed)) if !told => {
                pgrx::warning!(
                    "rag worker: the extension's SQL in this database is version {installed} but the library is {library}; \
                     pending documents wait until ALTER EXTENSION rag UPDATE"
                );
                told = true;
            }
            // Dropped meanwhile: the error path below notices and stops the worker.
            Ok(None) => return true,
            Ok(Some(_)) => {}
            Err(error) => pgrx::log!("rag worker: reading the extension's version: {error}"),
        }
        let nap = Duration::from_millis(crate::settings::NAPTIME_MS.get().max(1000) as u64);
        if shutdown_requested() || !BackgroundWorker::wait_latch(Some(nap)) {
            return false;
        }
    }
}

/// The worker's commits need not wait for the WAL flush: every step is idempotent and its state is in tables,
/// so a commit lost in a crash is only work done again (and any later synchronous commit, a user's, flushes it
/// anyway). Waiting costs each of a document's steps one WAL flush: nothing to speak of where a flush takes
/// 0.2 ms (this project's machine: scripts/bench-commit measured both modes equal), a lot where flushes are
/// slow or queue behind other writers. `rag.worker_synchronous_commit = on` keeps the server's setting.
/// Users' own commits are never touched.
/// `crate::pg::learn_database_defaults` in a transaction of its own; a failure leaves the settings the database
/// gave (logged: the fixed ones of `settle_worker_session` still apply).
fn learn_database_defaults() {
    if let Err(failure) = crate::worker::transaction::run(crate::pg::learn_database_defaults)
        .map_err(|failure| failure.message)
        .and_then(|learned| learned.map_err(|error| error.to_string()))
    {
        pgrx::log!("rag worker: reading the database's settings to undo: {failure}");
    }
}

fn apply_commit_mode(steps: &WorkerTransactions) {
    let statement = if crate::settings::WORKER_SYNCHRONOUS_COMMIT.get() {
        "SET synchronous_commit TO DEFAULT"
    } else {
        "SET synchronous_commit TO off"
    };
    if let Err(error) = steps.run(|| Spi::run(statement)) {
        pgrx::log!("rag worker: {statement}: {error}");
    }
}

/// Whether this database still has the extension, read the way the version is (read-only, no transaction
/// id); a failed read counts as absent, and the launcher's next probe decides again.
fn extension_present(steps: &WorkerTransactions) -> bool {
    matches!(steps.run(store::installed_version), Ok(Some(_)))
}

/// How often a busy worker does its upkeep (`upkeep_while_busy`).
const BUSY_UPKEEP: Duration = Duration::from_secs(2);

/// A restore without privileges (pg_restore --no-acl) left watched tables' owners without what their triggers
/// need, and every write to those tables failing (red team 23); so can REASSIGN OWNED.
fn grant_watch_owners(steps: &WorkerTransactions) {
    match steps.run(store::grant_watch_owners) {
        Ok(Some(1)) => pgrx::log!(
            "rag worker: granted the owners of watched tables what the watches' triggers need (after a restore without privileges, or a new owner)"
        ),
        Ok(_) => {}
        Err(error) => pgrx::log!("rag worker: granting watched tables' owners: {error}"),
    }
}

/// What a busy worker does every BUSY_UPKEEP between steps. Its cached plans are made again: PL/pgSQL keeps a
/// plan per statement for the life of the process, and the plans made while rag.chunks was empty (the first
/// batches of a first load, or the first after a VACUUM of a table whose collections were dropped) scan it
/// whole to look up one document's chunks: cheap at that moment, 0.5 ms a lookup 9,000 chunks later, until
/// autovacuum's ANALYZE happens to invalidate them (a first load of 3,000 documents took 7.9 s instead of about
/// 4.5 s; scripts/bench, pg_stat_statements). And indexes that a load's last batch could not build (it waits
/// at most a second for the writers of its collection's partition) are built, rather than when this worker is next idle, which
/// work for other collections can put off for hours.
fn upkeep_while_busy(steps: &WorkerTransactions) {
    // SAFETY: called between steps, with no transaction, portal or plan in use; ResetPlanCache only marks the
    // saved plans invalid (what DISCARD PLANS does), and each is planned again when next used.
    unsafe { pg_sys::ResetPlanCache() };
    // A model change whose vectors are all made switches now, not when the database next has nothing to do: any
    // writer's backlog in another collection held a finished change back for minutes (red team 21), its new
    // documents embedded twice meanwhile.
    upkeep(steps, false);
    // A worker that stays busy for days still keeps the ledger to its retention.
    prune_ledger(steps);
}

/// What a worker keeps in order busy or idle: the indexes a collection waits for (`idle`: the caller has
/// nothing it may claim), index rebuilds, dropped collections' partitions, watched tables' owners' grants, and
/// model changes' due steps.
fn upkeep(steps: &WorkerTransactions, idle: bool) {
    if let Err(error) = steps.run(|| store::repair_indexes(idle)) {
        pgrx::debug1!("rag worker: repairing indexes: {error}");
    }
    rebuild_step(steps);
    if let Err(error) = steps.run(store::drop_partitions) {
        pgrx::debug1!("rag worker: dropping the chunks of dropped collections: {error}");
    }
    grant_watch_owners(steps);
    advance_migrations(steps);
}

/// Ledger rows past rag.ledger_retention go, a thousand per call (when it is set: 0 keeps every row).
fn prune_ledger(steps: &WorkerTransactions) {
    let retention = crate::settings::LEDGER_RETENTION_S.get();
    if retention > 0 {
        if let Err(error) = steps.run(|| store::prune_ledger(retention)) {
            pgrx::log!("rag worker: pruning the ledger: {error}");
        }
    }
}

/// Model changes whose vectors are all made switch, and the columns they leave behind are cleared a slice at a
/// time (store::advance_migrations).
fn advance_migrations(steps: &WorkerTransactions) {
    if let Err(error) = steps.run(store::advance_migrations) {
        pgrx::log!("rag worker: advancing model changes: {error}");
    }
}

/// One index rebuild step (store::rebuild_indexes); a collection whose build failed rests in the database
/// (a build that fails on a full disk fails again, and each try costs a whole build).
fn rebuild_step(steps: &WorkerTransactions) {
    if let Err(error) = steps.run(store::rebuild_indexes) {
        pgrx::debug1!("rag worker: rebuilding indexes: {error}");
    }
}

/// How often a busy worker looks whether a bulk load waits (`store::bulk_load_waiting`), and so whether its
/// database wants rag.bulk_load_workers.
const BACKLOG_CHECK: Duration = Duration::from_secs(1);

/// What an idle worker did with its moment.
enum Rest {
    /// Slept; look for work again.
    Again,
    /// Made room for another database's worker (nothing queued here); the process ends.
    Left,
    /// The postmaster asked it to stop.
    ShutDown,
}

/// Whether this worker is one more than its database should have now (rag.workers_per_database, or
/// rag.bulk_load_workers while a bulk load is queued: registry::workers_wanted).
fn surplus(slot: usize) -> bool {
    ranked_beyond(
        slot,
        registry::workers_wanted(registry::slot_database(slot)),
    )
}

/// Whether `wanted` running workers of this slot's database come before it (those in its lower slots).
fn ranked_beyond(slot: usize, wanted: usize) -> bool {
    registry::slots_of(registry::slot_database(slot))
        .into_iter()
        .filter(|&other| registry::slot_state(other) == SlotState::Running)
        .position(|other| other == slot)
        .is_some_and(|rank| rank >= wanted)
}

/// A database waits for a slot (rag.max_workers are all running) while this worker is one of its database's
/// extra workers (beyond rag.workers_per_database, started for a bulk load), or has served its database for
/// SERVING_TURN while a database has no worker at all: it gives its slot up. Asked between two steps, when it
/// holds no claim. The launcher serves the waiting database first and starts the load's extra workers again only
/// when no database waits, so a load's helpers never keep another database from its one worker for the hours a
/// large load can take.
fn gives_way(slot: usize, serving_since: Instant) -> Option<&'static str> {
    if !registry::workers_wanted_elsewhere() {
        None
    } else if ranked_beyond(slot, registry::standing_workers()) {
        Some("a bulk load's extra worker")
    } else if serving_since.elapsed() >= SERVING_TURN && registry::take_turn_to_give_way() {
        Some("a worker that has served its turn")
    } else {
        None
    }
}

/// How often an idle worker looks again at due work it could not claim and no provider's cool-down explains.
/// The wait starts short and doubles up to this while the work stays held: another worker's claim ends within
/// its step (two workers sharing a load lost a third of their speed-up to a fixed second's wait: BENCHMARKS §3),
/// a writer's open transaction may last for hours.
const HELD_WORK_RECHECK: Duration = Duration::from_secs(1);

/// How often a worker held back by a restore half done says so in the server log.
const RESTORE_WAIT_LOG_EVERY: Duration = Duration::from_secs(300);

thread_local! {
    // When this worker last logged that it waits for a restore; None when it does not wait. Some when a rest finds
    // no restore is therefore a restore this worker saw end (`rest` looks for missing chunks again then).
    static RESTORE_WAIT_LOGGED: std::cell::Cell<Option<Instant>> = const { std::cell::Cell::new(None) };
}

/// A restore that never reaches its post-data section (one stopped by an error, or run without it) leaves a
/// collection's partition without its primary key, and the worker waiting for good: an operator learns why
/// from the log, at the start and every few minutes, not from a silent database.
fn log_restore_wait() {
    let due = RESTORE_WAIT_LOGGED
        .get()
        .is_none_or(|logged| logged.elapsed() >= RESTORE_WAIT_LOG_EVERY);
    if due {
        pgrx::log!(
            "rag worker: waiting for a restore of this database to end (a partition of rag.chunks has no primary key yet, a superuser's pg_restore is connected, or rows of rag hold ids their sequence has not given yet, as a restore sets the sequences after the rows); nothing is claimed or tidied meanwhile"
        );
        RESTORE_WAIT_LOGGED.set(Some(Instant::now()));
    }
}
const HELD_WORK_FIRST_RECHECK: Duration = Duration::from_millis(10);

/// The longest an idle worker trusts what it last found in the queue without looking again. Work queued through
/// rag's functions and triggers wakes the worker after its commit, which ends the memo; this bounds the wait
/// for work that arrives without a wake and unseen by the statistics (`store::queue_writes`, which a write to the
/// queue moves within about a second, but not while `track_counts` is off). A prepared transaction's work wakes
/// at its COMMIT PREPARED (`wake::is_commit_prepared`).
const IDLE_MEMO_MAX_AGE: Duration = Duration::from_secs(60);

/// What an idle worker found when it last looked: nothing due, and the first queued item due `first_due` after
/// `taken` (None: nothing queued). Looking costs a walk over every queue entry that finished while some
/// transaction of the database (a pg_dump, a session left in REPEATABLE READ) holds the xmin horizon back:
/// those entries stay until the horizon moves, and an idle worker that looked every naptime read them all each
/// time, about two buffers an entry (6,000 a look after a 3,000-document load). Work queued since is announced
/// by a wake (`registry::wakes`), and any other write to the queue by the statistics' count of its writes
/// (`queue_writes`), so the memo holds until one of them moves, the first item is due, or IDLE_MEMO_MAX_AGE
/// passes.
struct IdleMemo {
    wakes: u64,
    queue_writes: Option<i64>,
    taken: Instant,
    first_due: Option<Duration>,
}

impl IdleMemo {
    /// Without the writes' count: what a rest decides how long to sleep by.
    fn holds(&self, slot: usize) -> bool {
        let age = self.taken.elapsed();
        registry::wakes(slot) == self.wakes
            && age < IDLE_MEMO_MAX_AGE
            && self.first_due.is_none_or(|due| age < due)
    }

    fn until_due(&self) -> Option<Duration> {
        self.first_due
            .map(|due| due.saturating_sub(self.taken.elapsed()))
    }
}

/// What an idle worker carries from one rest to the next.
struct Resting {
    /// How long it waits before looking again at due work it could not claim (doubles up to HELD_WORK_RECHECK).
    held_wait: Duration,
    /// What its last look at the queue found, while nothing was due.
    memo: Option<IdleMemo>,
}

/// Whether there is work to claim now: through the memo while it holds, else by looking (and remembering what
/// the look found when nothing was due). A failed look counts as work, as it always did: the claim that
/// follows finds out.
fn work_due(steps: &WorkerTransactions, slot: usize, memo: &mut Option<IdleMemo>) -> bool {
    // All three read before the look: a wake counted or a write flushed to the statistics after this is for
    // work the look may not have seen (a write's statistics are flushed after its commit), and the first item's
    // delay is measured from the look's now(). The writes are counted only when there is a memo: a busy worker
    // has none, and would pay a transaction a step for it. The memo its first idle look takes then has no count,
    // which never matches one, so the next naptime looks once more and keeps a memo with its count.
    let queue_writes = memo
        .as_ref()
        .and_then(|_| steps.run(store::queue_writes).ok().flatten());
    if memo
        .as_ref()
        .is_some_and(|memo| memo.holds(slot) && memo.queue_writes == queue_writes)
    {
        return false;
    }
    let wakes = registry::wakes(slot);
    let taken = Instant::now();
    match steps.run(store::look_at_queue) {
        Ok(store::QueueLook::NothingDue { first_due_in }) => {
            *memo = Some(IdleMemo {
                wakes,
                queue_writes,
                taken,
                first_due: first_due_in.map(|seconds| Duration::from_secs_f64(seconds.max(0.0))),
            });
            false
        }
        // Not remembered: the restore's end wakes nobody.
        Ok(store::QueueLook::Restoring) => {
            *memo = None;
            false
        }
        Ok(store::QueueLook::DueNow) | Err(_) => {
            *memo = None;
            true
        }
    }
}

/// How long a worker serves a busy database while another database waits for a slot, before it gives its slot
/// up between two steps (the launcher gives it to the database that has waited longest, and this one waits its
/// turn): more databases with work than rag.max_workers take turns instead of the first ones served keeping
/// their slots for as long as they have work (a table owner's provider that answers slowly keeps its worker
/// busy for ever; red team 18).
const SERVING_TURN: Duration = Duration::from_secs(30);

/// Whether an idle worker may leave its database to one waiting for a slot, and if so after how long its
/// database wants a worker again (None: when a backend asks). Not while anything is due now, even what it could
/// not claim (a document a session holds, a provider cooling down): such a database gets its turn
/// (SERVING_TURN) like a busy one, and comes back in the launcher's order, rather than waiting for a wake time
/// that is not its own (the first cool-down to end may be days away, a healthy provider's retry due now).
fn free_to_leave(steps: &WorkerTransactions) -> Option<Option<Duration>> {
    match steps.run(store::seconds_until_needed).ok()? {
        None => Some(None),
        Some(seconds) if seconds > 0.0 => Some(Some(Duration::from_secs_f64(seconds))),
        Some(_) => None,
    }
}

/// What an idle worker keeps in order. An idle moment is when a restored database gets its indexes back, and a
/// load gets the index its last batch could not build (rag._build_index_after_load) or whose last documents an
/// open breaker holds back; before leaving, so that one is never left behind.
fn upkeep_while_idle(steps: &WorkerTransactions) {
    // Before it may leave, so that databases taking turns still get model changes' steps.
    upkeep(steps, true);
    requeue_missing_chunks(steps);
    // How common each collection's words are, for the full-text side of its searches.
    if let Err(error) = steps.run(store::measure_lexemes) {
        pgrx::log!("rag worker: measuring lexemes: {error}");
    }
    prune_ledger(steps);
}

thread_local! {
    /// The partitions of rag.chunks as they were when this worker last looked for documents missing their chunks
    /// (`store::chunk_partitions`); None before its first look.
    static PARTITIONS_CHECKED: std::cell::RefCell<Option<BTreeSet<String>>> = const { std::cell::RefCell::new(None) };
    /// When looking for documents missing their chunks last failed: tried again a minute later, not every
    /// naptime with a line in the server log each time.
    static MISSING_CHUNKS_FAILED: std::cell::Cell<Option<Instant>> = const { std::cell::Cell::new(None) };
}

const MISSING_CHUNKS_RETRY: Duration = Duration::from_secs(60);

/// A dump may leave the chunks out (they can be made again from the documents' text): after such a restore the
/// documents say they are chunked and every search finds nothing. Looked for in every collection when the worker
/// starts and when a restore it saw under way ends, then in those whose partition is new, has a new file or
/// another number of indexes (a restore makes them anew and then their indexes, a TRUNCATE empties one), not
/// every naptime: the look may read a chunk of each of their documents.
fn requeue_missing_chunks(steps: &WorkerTransactions) {
    let partitions: BTreeSet<String> = match steps.run(store::chunk_partitions) {
        Ok(listed) => listed.unwrap_or_default().into_iter().collect(),
        Err(error) => {
            pgrx::log!("rag worker: listing the partitions of rag.chunks: {error}");
            return;
        }
    };
    let collections: Option<Vec<i32>> =
        match PARTITIONS_CHECKED.with_borrow(|checked| checked.clone()) {
            None => None,
            Some(checked) => {
                let changed: Vec<i32> = partitions
                    .difference(&checked)
                    .filter_map(|entry| {
                        entry
                            .split_once(':')
                            .and_then(|(collection, _)| collection.parse().ok())
                    })
                    .collect();
                if changed.is_empty() {
                    // Partitions only went (dropped collections): nothing to look at, but remember the smaller set.
                    PARTITIONS_CHECKED.set(Some(partitions));
                    return;
                }
                Some(changed)
            }
        };
    if MISSING_CHUNKS_FAILED
        .get()
        .is_some_and(|failed| failed.elapsed() < MISSING_CHUNKS_RETRY)
    {
        return;
    }
    match steps.run(|| store::requeue_missing_chunks(collections.clone())) {
        Ok(_) => {
            PARTITIONS_CHECKED.set(Some(partitions));
            MISSING_CHUNKS_FAILED.set(None);
        }
        Err(error) => {
            MISSING_CHUNKS_FAILED.set(Some(Instant::now()));
            pgrx::log!("rag worker: queueing documents whose chunks are missing: {error}");
        }
    }
}

/// Nothing is due: make room for another database if workers are wanted elsewhere, repair missing indexes,
/// then sleep until the next item is due, the first provider cool-down ends or the naptime passes.
fn rest(
    steps: &WorkerTransactions,
    slot: usize,
    cool_down_ends: Option<Duration>,
    nap: Duration,
    serving_since: Instant,
    resting: &mut Resting,
) -> Rest {
    // Idle: no bulk load waits for this worker any more.
    registry::set_backlog(slot, false);
    crate::pg::report_activity(None);
    // rag.workers_per_database was lowered, or a bulk load's extra workers are no longer wanted: the surplus
    // workers of this database (those in its highest slots) leave when idle, and the launcher, which counts
    // slots, starts none in their place.
    if surplus(slot) {
        registry::mark_stopped(slot, SlotState::Exited);
        return Rest::Left;
    }
    // No upkeep while a restore is half done (rag._restore_under_way): it would build an index, drop a
    // partition or write rows that the restore is about to bring.
    let restoring = steps.run(store::restore_under_way).unwrap_or(true);
    if restoring {
        log_restore_wait();
    } else {
        // A restore's data may bring documents without their chunks into partitions it did not make (the schema
        // restored first), which no partition's change shows: once a restore this worker saw ends, every
        // collection is looked at again.
        if RESTORE_WAIT_LOGGED.replace(None).is_some() {
            PARTITIONS_CHECKED.set(None);
        }
        upkeep_while_idle(steps);
    }
    // More databases use rag than there are workers: one with nothing due makes room, and tells the launcher
    // when its first queued item is due, for a worker to come back then unasked. Work queued here meanwhile
    // wakes the launcher. Leaving only when nothing at all was queued let one document of a provider that never
    // answers (retried for days) keep a slot for good, and a role that may create databases hold every slot
    // with a copy of its own database each (red team 18). One with due work it cannot do now (held by another
    // session, its provider cooling down) leaves once it has served its turn, as a busy one does.
    if registry::workers_wanted_elsewhere() {
        if let Some(wake_after) = free_to_leave(steps) {
            // Marked first, so a backend queueing work from now on asks the launcher rather than this worker;
            // looked at once more for work that was queued just before.
            registry::set_wake_after(slot, wake_after);
            registry::mark_stopped(slot, SlotState::Dormant);
            if let Some(wake_after) = free_to_leave(steps) {
                registry::set_wake_after(slot, wake_after);
                return Rest::Left;
            }
            registry::mark_running(slot);
        } else if serving_since.elapsed() >= SERVING_TURN && registry::take_turn_to_give_way() {
            pgrx::log!("rag worker: a worker that has served its turn leaves its slot to a database waiting for one");
            registry::mark_stopped(slot, SlotState::Exited);
            return Rest::Left;
        }
    }
    // A memo taken before a restore began would outlive it: the restore's end wakes nobody.
    if restoring {
        resting.memo = None;
    }
    let due = match resting.memo.as_ref().filter(|memo| memo.holds(slot)) {
        Some(memo) => memo.until_due(),
        None => steps
            .run(store::seconds_until_due)
            .ok()
            .flatten()
            .map(|seconds| Duration::from_secs_f64(seconds.max(0.0))),
    };
    let until_due = due.unwrap_or(nap).min(nap);
    // Work that is due but was not claimed belongs to providers cooling down: sleep until the first cool-down
    // ends rather than spinning on it. Due work no cool-down explains is held (another worker's claim, a
    // session's open transaction on the document): looked at again after a wait that doubles up to a second, not
    // every 10 ms for as long as it lasts (a writer's idle transaction kept the worker at a hundred rounds a
    // second); new work sets the latch meanwhile.
    let sleep = match cool_down_ends {
        Some(ends) if until_due < Duration::from_millis(50) => ends.min(nap),
        Some(ends) => until_due.min(ends),
        None if until_due < Duration::from_millis(50) => {
            let wait = resting.held_wait;
            resting.held_wait = (wait * 2).min(HELD_WORK_RECHECK);
            nap.min(wait)
        }
        None => until_due,
    }
    .max(Duration::from_millis(10));
    // What the last second's transactions counted would otherwise wait for the next busy spell.
    crate::pg::flush_statistics(true);
    if BackgroundWorker::wait_latch(Some(sleep)) {
        Rest::Again
    } else {
        Rest::ShutDown
    }
}

/// Blocks of a megabyte or more are mapped and unmapped on their own. glibc's default raises that bound to the
/// size of the largest block freed so far (up to 32 MB), after which a large text's copies come from the heap,
/// which keeps the pages once they are freed: a worker that had taken one 20 MB watched row held its pages
/// while it took the next. A worker's large blocks are a text and its copies, few and short-lived, so a
/// mapping each costs next to nothing beside what is done with them.
fn return_large_blocks_to_the_system() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        const LARGE_BLOCK_BYTES: libc::c_int = 1 << 20;
        // SAFETY: mallopt only changes the allocator's parameters; this process (the worker) has no other
        // threads yet, and glibc takes its own lock for it anyway.
        unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, LARGE_BLOCK_BYTES) };
    }
}

#[pg_guard]
#[no_mangle]
pub extern "C-unwind" fn rag_worker_main(argument: pg_sys::Datum) {
    let slot =
        // SAFETY: the launcher registered this worker with an int4 argument (its slot), and a by-value int4
        // datum is never null.
        unsafe { i32::from_polymorphic_datum(argument, false, pg_sys::INT4OID) }.unwrap_or(-1);
    if slot < 0 || slot as usize >= registry::SLOTS {
        return;
    }
    let slot = slot as usize;
    return_large_blocks_to_the_system();
    BackgroundWorker::attach_signal_handlers(SignalWakeFlags::SIGHUP | SignalWakeFlags::SIGTERM);
    crate::pg::terminate_on_sigterm();
    crate::security::register_hard_deadline();
    let database = registry::slot_database(slot);
    crate::pg::mark_rag_worker();
    BackgroundWorker::connect_worker_to_spi_by_oid(Some(database), None);
    // Settled first (its identity, exit_on_error), then once more with the database's other defaults undone,
    // which takes a transaction to read.
    crate::pg::settle_worker_session();
    learn_database_defaults();
    crate::pg::settle_worker_session();
    registry::mark_running(slot);
    // Started just before a DROP DATABASE (or similar) paused this database: leave it to that command.
    if registry::database_paused(database) {
        registry::mark_stopped(slot, SlotState::Exited);
        return;
    }

    let steps = WorkerTransactions;
    if !extension_present(&steps) {
        registry::mark_stopped(slot, SlotState::NoExtension);
        return;
    }
    apply_commit_mode(&steps);
    if !wait_for_matching_schema(&steps) {
        registry::mark_stopped(slot, SlotState::Exited);
        return;
    }
    let mut providers = Providers::default();
    let mut rng = SplitMix64::from_entropy();
    let mut last_upkeep = Instant::now();
    let serving_since = Instant::now();
    let mut resting = Resting {
        held_wait: HELD_WORK_FIRST_RECHECK,
        memo: None,
    };
    // None while idle: the first step after a rest looks at once.
    let mut last_backlog_check: Option<Instant> = None;
    loop {
        if shutdown_requested() {
            break;
        }
        if BackgroundWorker::sighup_received() {
            crate::pg::reload_configuration();
            // The files' values may have changed: the database's defaults are undone with the new ones.
            learn_database_defaults();
            crate::pg::settle_worker_session();
            apply_commit_mode(&steps);
            providers.forget_client();
        }
        let nap = Duration::from_millis(crate::settings::NAPTIME_MS.get().max(10) as u64);
        // Looked at read-only first: claiming takes a transaction id even when there is nothing to claim.
        let outcome = if work_due(&steps, slot, &mut resting.memo) {
            process_next(
                &steps,
                &mut providers,
                &mut rng,
                crate::worker::documents::GROUP_DOCUMENTS,
            )
        } else {
            Ok(Step::Idle(providers.next_close()))
        };
        // A watched row's sync is the one step that runs a table owner's code (its watch's expressions): nothing
        // it did may leave a setting of this superuser session changed, or a session-level advisory lock held,
        // for the next step. (RestrictedIdentity undoes settings already; this also covers an ERROR's path.)
        if matches!(outcome, Ok(Step::Worked)) && crate::worker::documents::last_step_synced_a_row()
        {
            crate::pg::settle_worker_session();
            crate::pg::release_session_advisory_locks();
        }
        match outcome {
            Ok(Step::Worked) => {
                resting.held_wait = HELD_WORK_FIRST_RECHECK;
                if let Some(reason) = gives_way(slot, serving_since) {
                    pgrx::log!(
                        "rag worker: {reason} leaves its slot to a database waiting for one"
                    );
                    break;
                }
                if last_backlog_check.is_none_or(|checked| checked.elapsed() >= BACKLOG_CHECK) {
                    if let Ok(waiting) = steps.run(store::bulk_load_waiting) {
                        registry::set_backlog(slot, waiting);
                    }
                    last_backlog_check = Some(Instant::now());
                }
                if last_upkeep.elapsed() >= BUSY_UPKEEP {
                    upkeep_while_busy(&steps);
                    last_upkeep = Instant::now();
                }
            }
            Ok(Step::Stopped) => break,
            Ok(Step::Idle(cool_down_ends)) => {
                last_backlog_check = None;
                match rest(
                    &steps,
                    slot,
                    cool_down_ends,
                    nap,
                    serving_since,
                    &mut resting,
                ) {
                    Rest::Again => {}
                    Rest::Left => return,
                    Rest::ShutDown => break,
                }
            }
            Err(error) => {
                // The extension may have been dropped under us; then this database needs no worker.
                if !extension_present(&steps) {
                    registry::mark_stopped(slot, SlotState::NoExtension);
                    return;
                }
                pgrx::log!("rag worker: {error}");
                if !BackgroundWorker::wait_latch(Some(nap)) {
                    break;
                }
            }
        }
    }
    registry::mark_stopped(slot, SlotState::Exited);
}
