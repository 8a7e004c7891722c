//! A fixed table of worker slots in shared memory. The launcher fills a slot before it starts a worker and
//! passes the slot number as the worker's argument; the worker publishes its pid there so backends can set
//! its latch without a catalog lookup, and leaves a note of why it stopped so the launcher need not guess.
use pgrx::prelude::*;
use pgrx::{pg_shmem_init, PgAtomic};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub const SLOTS: usize = 64;
/// Databases whose workers are held off at the same time (a DROP DATABASE each, typically one).
const PAUSES: usize = 16;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(i32)]
pub enum SlotState {
    Free = 0,
    Starting = 1,
    Running = 2,
    /// The worker found no `rag` extension in its database and stopped: not worth restarting until woken.
    NoExtension = 3,
    /// The worker stopped for another reason (shutdown, an error it could not handle).
    Exited = 4,
    /// The worker left a database with nothing queued because another database waited for a worker slot;
    /// the database gets one again as soon as a backend there queues work.
    Dormant = 5,
}

impl SlotState {
    fn from_raw(raw: i32) -> SlotState {
        match raw {
            1 => SlotState::Starting,
            2 => SlotState::Running,
            3 => SlotState::NoExtension,
            4 => SlotState::Exited,
            5 => SlotState::Dormant,
            _ => SlotState::Free,
        }
    }
}

// Every PgAtomic below: SAFETY: PgAtomic::new only names the shared-memory segment; the memory is attached
// by pg_shmem_init! in init_shared_memory() while the library is preloaded, and every access goes through
// available() first, so nothing reads a segment that was not set up.
// SAFETY: see above.
static SLOT_DATABASE: PgAtomic<[AtomicU32; SLOTS]> = unsafe { PgAtomic::new(c"rag_slot_database") };
// SAFETY: see SLOT_DATABASE.
static SLOT_PID: PgAtomic<[AtomicI32; SLOTS]> = unsafe { PgAtomic::new(c"rag_slot_pid") };
// SAFETY: see SLOT_DATABASE.
static SLOT_STATE: PgAtomic<[AtomicI32; SLOTS]> = unsafe { PgAtomic::new(c"rag_slot_state") };
/// Set by a slot's worker while it sees a bulk load in its database's queue (`rag.bulk_load_workers`).
// SAFETY: see SLOT_DATABASE.
static SLOT_BACKLOG: PgAtomic<[AtomicBool; SLOTS]> = unsafe { PgAtomic::new(c"rag_slot_backlog") };
// SAFETY: see SLOT_DATABASE.
static LAUNCHER_PID: PgAtomic<AtomicI32> = unsafe { PgAtomic::new(c"rag_launcher_pid") };
/// Databases whose backends found no live worker (they queued work, or ran CREATE EXTENSION rag): the
/// launcher looks at exactly these again, so a cluster of many databases without the extension is not probed
/// again and again. 0 is a free entry.
// SAFETY: see SLOT_DATABASE.
static LAUNCHER_WAKE_DATABASES: PgAtomic<[AtomicU32; WAKE_ENTRIES]> =
    unsafe { PgAtomic::new(c"rag_launcher_wake_databases") };
/// Set when more databases asked at once than there are entries: the launcher then looks at every database.
// SAFETY: see SLOT_DATABASE.
static LAUNCHER_WAKE_OVERFLOW: PgAtomic<AtomicBool> =
    unsafe { PgAtomic::new(c"rag_launcher_wake") };
const WAKE_ENTRIES: usize = 32;
/// Set by the launcher while a database that needs a worker waits because rag.max_workers are all busy: an
/// idle worker with nothing queued then leaves, so more databases than workers take turns.
// SAFETY: see SLOT_DATABASE.
static WORKERS_WANTED: PgAtomic<AtomicBool> = unsafe { PgAtomic::new(c"rag_workers_wanted") };
/// Set by the launcher to how many databases wait for a slot without any worker; a worker that has served its
/// turn and would give its slot up takes one first (`take_turn_to_give_way`), so that one database waiting sends
/// one worker away, not every worker that has served 30 s.
// SAFETY: see SLOT_DATABASE.
static TURNS_TO_GIVE: PgAtomic<AtomicU32> = unsafe { PgAtomic::new(c"rag_turns_to_give") };

/// Set by a worker that leaves its database to another one waiting for a slot: when (ms since the Unix epoch)
/// its database's first queued document or row is due, for the launcher to start a worker there again unasked;
/// 0 when nothing is queued (a backend that queues work asks for one).
// SAFETY: see SLOT_DATABASE.
static SLOT_WAKE_AT_MS: PgAtomic<[AtomicU64; SLOTS]> =
    unsafe { PgAtomic::new(c"rag_slot_wake_at") };

/// How many times each slot's worker was woken for queued work (`wake_workers_of_current_database`: by backends
/// after their commit, and by workers themselves). Counted for every slot of the database whatever its state,
/// so that a worker between two states misses none. An idle worker that found nothing due keeps what it found
/// for as long as this count stays the same (serve.rs, `IdleMemo`), rather than looking at the queue again
/// every naptime.
// SAFETY: see SLOT_DATABASE.
static SLOT_WAKES: PgAtomic<[AtomicU64; SLOTS]> = unsafe { PgAtomic::new(c"rag_slot_wakes") };

/// Databases the launcher must leave alone until the paired time (ms since the Unix epoch): a command that
/// needs the database to itself is about to run there.
// SAFETY: see SLOT_DATABASE.
static PAUSED_DATABASE: PgAtomic<[AtomicU32; PAUSES]> =
    unsafe { PgAtomic::new(c"rag_paused_database") };
// SAFETY: see SLOT_DATABASE.
static PAUSED_UNTIL_MS: PgAtomic<[AtomicU64; PAUSES]> =
    unsafe { PgAtomic::new(c"rag_paused_until") };

/// Process-local: true only where the library was preloaded and so the shared memory above exists.
static SHARED_MEMORY_READY: AtomicBool = AtomicBool::new(false);

pub fn init_shared_memory() {
    pg_shmem_init!(SLOT_DATABASE = std::array::from_fn(|_| AtomicU32::new(0)));
    pg_shmem_init!(SLOT_PID = std::array::from_fn(|_| AtomicI32::new(0)));
    pg_shmem_init!(SLOT_STATE = std::array::from_fn(|_| AtomicI32::new(0)));
    pg_shmem_init!(SLOT_BACKLOG = std::array::from_fn(|_| AtomicBool::new(false)));
    pg_shmem_init!(SLOT_WAKE_AT_MS = std::array::from_fn(|_| AtomicU64::new(0)));
    pg_shmem_init!(SLOT_WAKES = std::array::from_fn(|_| AtomicU64::new(0)));
    pg_shmem_init!(LAUNCHER_PID = AtomicI32::new(0));
    pg_shmem_init!(LAUNCHER_WAKE_DATABASES = std::array::from_fn(|_| AtomicU32::new(0)));
    pg_shmem_init!(LAUNCHER_WAKE_OVERFLOW = AtomicBool::new(false));
    pg_shmem_init!(WORKERS_WANTED = AtomicBool::new(false));
    pg_shmem_init!(TURNS_TO_GIVE = AtomicU32::new(0));
    pg_shmem_init!(PAUSED_DATABASE = std::array::from_fn(|_| AtomicU32::new(0)));
    pg_shmem_init!(PAUSED_UNTIL_MS = std::array::from_fn(|_| AtomicU64::new(0)));
    SHARED_MEMORY_READY.store(true, Ordering::SeqCst);
}

pub fn available() -> bool {
    SHARED_MEMORY_READY.load(Ordering::SeqCst)
}

pub fn slot_database(slot: usize) -> pg_sys::Oid {
    pg_sys::Oid::from(SLOT_DATABASE.get()[slot].load(Ordering::SeqCst))
}

pub fn slot_state(slot: usize) -> SlotState {
    SlotState::from_raw(SLOT_STATE.get()[slot].load(Ordering::SeqCst))
}

/// Launcher side: reserve a free slot for a worker of `database`.
pub fn reserve_slot(database: pg_sys::Oid) -> Option<usize> {
    let states = SLOT_STATE.get();
    for (slot, state) in states.iter().enumerate() {
        if state
            .compare_exchange(
                SlotState::Free as i32,
                SlotState::Starting as i32,
                Ordering::SeqCst,
                Ordering::SeqCst,
            )
            .is_ok()
        {
            SLOT_DATABASE.get()[slot].store(database.to_u32(), Ordering::SeqCst);
            SLOT_PID.get()[slot].store(0, Ordering::SeqCst);
            return Some(slot);
        }
    }
    None
}

pub fn release_slot(slot: usize) {
    SLOT_BACKLOG.get()[slot].store(false, Ordering::SeqCst);
    SLOT_WAKE_AT_MS.get()[slot].store(0, Ordering::SeqCst);
    SLOT_PID.get()[slot].store(0, Ordering::SeqCst);
    SLOT_DATABASE.get()[slot].store(0, Ordering::SeqCst);
    SLOT_STATE.get()[slot].store(SlotState::Free as i32, Ordering::SeqCst);
}

/// Worker side: announce that this process now serves the slot.
pub fn mark_running(slot: usize) {
    SLOT_PID.get()[slot].store(crate::pg::my_pid(), Ordering::SeqCst);
    SLOT_STATE.get()[slot].store(SlotState::Running as i32, Ordering::SeqCst);
}

/// Worker side: leave the reason for stopping behind for the launcher.
pub fn mark_stopped(slot: usize, state: SlotState) {
    SLOT_PID.get()[slot].store(0, Ordering::SeqCst);
    SLOT_STATE.get()[slot].store(state as i32, Ordering::SeqCst);
}

/// Worker side, before leaving as Dormant: when its database wants a worker again though nobody asks (None:
/// only when asked).
pub fn set_wake_after(slot: usize, after: Option<Duration>) {
    let at = after.map_or(0, |after| {
        now_ms().saturating_add(after.as_millis() as u64).max(1)
    });
    SLOT_WAKE_AT_MS.get()[slot].store(at, Ordering::SeqCst);
}

/// Worker side: how many times this slot's worker was woken for queued work (SLOT_WAKES). Read before the
/// queue is looked at: a wake counted after that read is for work the look may not have seen.
pub fn wakes(slot: usize) -> u64 {
    SLOT_WAKES.get()[slot].load(Ordering::SeqCst)
}

/// Launcher side: what a Dormant slot's worker left in `set_wake_after`, as ms since the Unix epoch.
pub fn wake_at(slot: usize) -> Option<u64> {
    Some(SLOT_WAKE_AT_MS.get()[slot].load(Ordering::SeqCst)).filter(|&at| at > 0)
}

/// Worker side: whether this slot's worker sees a bulk load waiting. When it starts to, the launcher is asked
/// for the database's extra workers at once rather than at its next round.
pub fn set_backlog(slot: usize, backlog: bool) {
    let before = SLOT_BACKLOG.get()[slot].swap(backlog, Ordering::SeqCst);
    if backlog && !before {
        request_launcher_for(slot_database(slot).to_u32());
    }
}

/// The workers every database that has the extension keeps: rag.workers_per_database.
pub fn standing_workers() -> usize {
    crate::settings::WORKERS_PER_DATABASE.get().max(1) as usize
}

/// How many workers `database` should have now: rag.workers_per_database, or rag.bulk_load_workers while one
/// of its running workers sees a bulk load waiting. The launcher starts that many and the surplus leave when
/// idle, so the extra workers of a load end with it.
pub fn workers_wanted(database: pg_sys::Oid) -> usize {
    let standing = standing_workers();
    let loading = slots_of(database).into_iter().any(|slot| {
        slot_state(slot) == SlotState::Running && SLOT_BACKLOG.get()[slot].load(Ordering::SeqCst)
    });
    if loading {
        standing.max(crate::settings::BULK_LOAD_WORKERS.get().max(1) as usize)
    } else {
        standing
    }
}

/// Launcher side: whether a database is waiting for a worker slot, and how many of those have no worker at all
/// (the turns busy workers give).
pub fn set_workers_wanted(waiting: bool, without_a_worker: usize) {
    WORKERS_WANTED.get().store(waiting, Ordering::SeqCst);
    TURNS_TO_GIVE.get().store(
        u32::try_from(without_a_worker).unwrap_or(u32::MAX),
        Ordering::SeqCst,
    );
}

/// Worker side: whether this worker, having served its turn, is the one to give its slot up (one per database
/// waiting, until the launcher's next round counts again).
pub fn take_turn_to_give_way() -> bool {
    available()
        && TURNS_TO_GIVE
            .get()
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |left| {
                left.checked_sub(1)
            })
            .is_ok()
}

/// Worker side: should an idle worker make room?
pub fn workers_wanted_elsewhere() -> bool {
    available() && WORKERS_WANTED.get().load(Ordering::SeqCst)
}

pub fn set_launcher_pid(pid: i32) {
    LAUNCHER_PID.get().store(pid, Ordering::SeqCst);
}

/// What backends asked the launcher for since it last looked.
#[derive(Debug, Default)]
pub struct WakeRequests {
    /// Too many databases asked at once to name them all: look at every database again.
    pub every_database: bool,
    pub databases: Vec<pg_sys::Oid>,
}

pub fn take_launcher_wake_requests() -> WakeRequests {
    let databases = LAUNCHER_WAKE_DATABASES
        .get()
        .iter()
        .map(|entry| entry.swap(0, Ordering::SeqCst))
        .filter(|&database| database != 0)
        .map(pg_sys::Oid::from)
        .collect();
    WakeRequests {
        every_database: LAUNCHER_WAKE_OVERFLOW.get().swap(false, Ordering::SeqCst),
        databases,
    }
}

/// Backend side: ask the launcher to look at this database (again).
pub fn request_launcher_for_current_database() {
    if available() {
        request_launcher_for(crate::pg::my_database().to_u32());
    }
}

fn request_launcher_for(database: u32) {
    let entries = LAUNCHER_WAKE_DATABASES.get();
    let recorded = entries
        .iter()
        .any(|entry| entry.load(Ordering::SeqCst) == database)
        || entries.iter().any(|entry| {
            entry
                .compare_exchange(0, database, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
        });
    if !recorded {
        LAUNCHER_WAKE_OVERFLOW.get().store(true, Ordering::SeqCst);
    }
    set_latch_of(LAUNCHER_PID.get().load(Ordering::SeqCst));
}

/// Sets the latch of `pid` if it is a live PostgreSQL process; a stale pid is ignored rather than signalled.
fn set_latch_of(pid: i32) -> bool {
    if pid == 0 {
        return false;
    }
    // SAFETY: BackendPidGetProc returns the live PGPROC of that pid or NULL (checked); a PGPROC lives in shared
    // memory for the postmaster's lifetime, and SetLatch on another process's latch is how PostgreSQL wakes it.
    unsafe {
        let proc = pg_sys::BackendPidGetProc(pid);
        if proc.is_null() {
            return false;
        }
        pg_sys::SetLatch(&raw mut (*proc).procLatch);
    }
    true
}

/// Wakes every worker of the current database; when there is none, asks the launcher to start one.
pub fn wake_workers_of_current_database() {
    if !available() {
        return;
    }
    if !wake_slots_of_current_database() {
        request_launcher_for(crate::pg::my_database().to_u32());
    }
}

/// Wakes the current database's workers, if it has any, and asks nothing of the launcher: for `COMMIT
/// PREPARED` (`wake::is_commit_prepared`), which runs in databases that do not use rag too, where asking would
/// start a probe worker each time.
pub fn wake_running_workers_of_current_database() {
    if available() {
        wake_slots_of_current_database();
    }
}

/// Counts a wake for every slot of the current database and sets the latches of those running; whether any
/// was.
fn wake_slots_of_current_database() -> bool {
    let database = crate::pg::my_database().to_u32();
    let mut woke_any = false;
    for slot in 0..SLOTS {
        if SLOT_DATABASE.get()[slot].load(Ordering::SeqCst) != database {
            continue;
        }
        // Counted before the latch is set, so that the worker it wakes sees the count moved.
        SLOT_WAKES.get()[slot].fetch_add(1, Ordering::SeqCst);
        if slot_state(slot) == SlotState::Running {
            woke_any |= set_latch_of(SLOT_PID.get()[slot].load(Ordering::SeqCst));
        }
    }
    woke_any
}

/// Slots currently held for `database`, whatever their state.
pub fn slots_of(database: pg_sys::Oid) -> Vec<usize> {
    (0..SLOTS)
        .filter(|&slot| slot_state(slot) != SlotState::Free && slot_database(slot) == database)
        .collect()
}

pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|since| since.as_millis() as u64)
        .unwrap_or(0)
}

/// Keeps workers away from `database` for `duration`: the launcher starts none there, and one that starts
/// anyway leaves at once. When every pause entry is in use the oldest-ending one is reused.
pub fn pause_database(database: pg_sys::Oid, duration: Duration) {
    if !available() {
        return;
    }
    let now = now_ms();
    let until = now + duration.as_millis() as u64;
    let databases = PAUSED_DATABASE.get();
    let untils = PAUSED_UNTIL_MS.get();
    let entry = (0..PAUSES)
        .find(|&entry| databases[entry].load(Ordering::SeqCst) == database.to_u32())
        .or_else(|| (0..PAUSES).min_by_key(|&entry| untils[entry].load(Ordering::SeqCst)))
        .unwrap_or(0);
    // Clear the time first so that no reader pairs the new database with an old time.
    untils[entry].store(0, Ordering::SeqCst);
    databases[entry].store(database.to_u32(), Ordering::SeqCst);
    untils[entry].store(until, Ordering::SeqCst);
}

pub fn database_paused(database: pg_sys::Oid) -> bool {
    if !available() {
        return false;
    }
    let now = now_ms();
    (0..PAUSES).any(|entry| {
        PAUSED_DATABASE.get()[entry].load(Ordering::SeqCst) == database.to_u32()
            && PAUSED_UNTIL_MS.get()[entry].load(Ordering::SeqCst) > now
    })
}

/// Asks every running worker of `database` to stop (SIGTERM: it finishes its current step and exits).
pub fn stop_workers_of(database: pg_sys::Oid) {
    if !available() {
        return;
    }
    for slot in slots_of(database) {
        let pid = SLOT_PID.get()[slot].load(Ordering::SeqCst);
        // Only a pid PostgreSQL knows as one of its processes is signalled, never a stale one.
        // SAFETY: BackendPidGetProc only looks the pid up in the proc array and returns NULL when it is not there.
        if pid != 0 && !unsafe { pg_sys::BackendPidGetProc(pid) }.is_null() {
            // SAFETY: kill(2) with a pid that is one of this cluster's background workers; SIGTERM is how the
            // postmaster itself asks a worker to finish.
            unsafe {
                libc::kill(pid, libc::SIGTERM);
            }
        }
    }
}
