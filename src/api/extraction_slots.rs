//! How many file extractions run at once in the whole cluster (`rag.max_concurrent_extractions`). Each runs in
//! a child process that may take `rag.extraction_memory`; without a bound, N sessions extracting hostile files
//! at once take N times that, and the kernel's OOM killer may then pick a backend and so restart the cluster.
//! A slot holds the pid of the backend extracting and its login (session user); a backend finding every slot taken,
//! or its login holding half of them already, waits on its latch (`wait_event` Extension in pg_stat_activity),
//! where a cancel or statement_timeout ends the wait. The share per login keeps one login's hostile files, in
//! as many sessions (and roles it may SET) as it likes, from holding every other login's extractions back.
use pgrx::prelude::*;
use pgrx::{pg_shmem_init, PgAtomic};
use std::sync::atomic::{AtomicI32, AtomicU32, Ordering};

/// The most `rag.max_concurrent_extractions` may be: the slots that exist in shared memory.
pub const MOST_SLOTS: usize = 64;

// SAFETY: PgAtomic::new only names the shared-memory segment; init_shared_memory attaches it while the library
// is preloaded, and every access checks crate::worker::registry::available() first (both are set up in the
// same _PG_init branch).
static SLOT_HOLDER: PgAtomic<[AtomicI32; MOST_SLOTS]> =
    unsafe { PgAtomic::new(c"rag_extraction_slot_holder") };
/// The login (PostgreSQL's session user, whatever role it has SET or SECURITY DEFINER function runs) of each holder;
/// written after the pid is claimed and cleared before it is given back.
// SAFETY: see SLOT_HOLDER.
static SLOT_ROLE: PgAtomic<[AtomicU32; MOST_SLOTS]> =
    unsafe { PgAtomic::new(c"rag_extraction_slot_role") };

/// The slot this process holds (-1: none), for the exit callback: a backend that ends with FATAL leaves
/// through proc_exit, where no guard runs.
static HELD_SLOT: AtomicI32 = AtomicI32::new(-1);

pub fn init_shared_memory() {
    pg_shmem_init!(SLOT_HOLDER = std::array::from_fn(|_| AtomicI32::new(0)));
    pg_shmem_init!(SLOT_ROLE = std::array::from_fn(|_| AtomicU32::new(0)));
}

/// A slot this backend holds until dropped.
pub struct ExtractionSlot {
    slot: Option<usize>,
}

impl Drop for ExtractionSlot {
    fn drop(&mut self) {
        if let Some(slot) = self.slot.take() {
            release(slot);
        }
    }
}

fn release(slot: usize) {
    // SAFETY: getpid never fails.
    let me = unsafe { libc::getpid() };
    // Only our own claim is cleared: a slot reclaimed from us (it cannot be while we live) stays its holder's.
    if SLOT_HOLDER.get()[slot].load(Ordering::SeqCst) == me {
        SLOT_ROLE.get()[slot].store(0, Ordering::SeqCst);
        let _ = SLOT_HOLDER.get()[slot].compare_exchange(me, 0, Ordering::SeqCst, Ordering::SeqCst);
    }
    HELD_SLOT.store(-1, Ordering::SeqCst);
}

/// Releases the slot of a backend that exits while extracting; called from the extraction's exit callback.
pub fn release_at_exit() {
    let slot = HELD_SLOT.load(Ordering::SeqCst);
    if slot >= 0 && crate::worker::registry::available() {
        release(slot as usize);
    }
}

/// True when `pid` names no process: a holder that died without releasing (it cannot, short of a crash, which
/// makes the postmaster start shared memory afresh) does not keep its slot.
fn is_gone(pid: i32) -> bool {
    // SAFETY: signal 0 checks only that the process exists; backends all run as the same user.
    unsafe {
        libc::kill(pid, 0) != 0
            && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
    }
}

/// The most slots one role may hold: half of them, rounded up (all of one).
fn share_per_role(limit: usize) -> usize {
    limit.div_ceil(2)
}

/// Claims a free slot among the first `limit`, then counts the role's holders: over its share, it gives the slot
/// back. Each claimant writes its role before counting, so of two racing for the role's last share the later
/// writer sees the earlier one and yields, and neither can take the role past its share.
fn try_claim(limit: usize, me: i32, role: u32) -> Option<usize> {
    let holders = SLOT_HOLDER.get();
    let roles = SLOT_ROLE.get();
    for slot in 0..limit {
        let current = holders[slot].load(Ordering::SeqCst);
        if !((current == 0 || (current != me && is_gone(current)))
            && holders[slot]
                .compare_exchange(current, me, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok())
        {
            continue;
        }
        roles[slot].store(role, Ordering::SeqCst);
        let held_by_role = (0..MOST_SLOTS)
            .filter(|&other| {
                roles[other].load(Ordering::SeqCst) == role
                    && holders[other].load(Ordering::SeqCst) != 0
            })
            .count();
        if held_by_role > share_per_role(limit) {
            release(slot);
            return None;
        }
        return Some(slot);
    }
    None
}

/// Waits for a free slot among the first `rag.max_concurrent_extractions`. Where rag is not preloaded there is
/// no shared memory to count in, and the extraction runs unbounded (as the README says).
pub fn acquire() -> ExtractionSlot {
    const WAIT_MS: std::ffi::c_long = 20;
    if !crate::worker::registry::available() {
        return ExtractionSlot { slot: None };
    }
    // Counted by the login (the session user), not the role it acts as: any member may `SET ROLE rag_writer` or
    // `rag_reader` in further sessions, and took every slot that way past its own share (red team 8).
    // SAFETY: getpid never fails; GetSessionUserId reads a backend global set when the session started.
    let (me, role) = unsafe { (libc::getpid(), u32::from(pg_sys::GetSessionUserId())) };
    loop {
        // Each backend counts against the limit it has read, and a backend reads a reloaded configuration
        // between statements: just after a change the bound is the larger of the old and the new value.
        let limit =
            (crate::settings::MAX_CONCURRENT_EXTRACTIONS.get().max(1) as usize).min(MOST_SLOTS);
        if let Some(slot) = try_claim(limit, me, role) {
            HELD_SLOT.store(slot as i32, Ordering::SeqCst);
            return ExtractionSlot { slot: Some(slot) };
        }
        // SAFETY: waiting on this backend's own latch with a timeout, as any backend may; the latch is reset
        // before interrupts are checked, so a signal that set it is not lost.
        unsafe {
            pg_sys::WaitLatch(
                pg_sys::MyLatch,
                (pg_sys::WL_LATCH_SET | pg_sys::WL_TIMEOUT | pg_sys::WL_EXIT_ON_PM_DEATH) as i32,
                WAIT_MS,
                pg_sys::PG_WAIT_EXTENSION,
            );
            pg_sys::ResetLatch(pg_sys::MyLatch);
        }
        pgrx::check_for_interrupts!();
    }
}

/// The extractions running now in the cluster: the backend (or parallel worker) holding each slot and the role
/// it counts against. Empty where rag is not preloaded. For a superuser: it names other roles' sessions.
#[pg_extern(volatile, name = "rag_extraction_slots")]
pub fn extraction_slots() -> TableIterator<'static, (name!(pid, i32), name!(role, Option<String>))>
{
    let mut rows = Vec::new();
    if crate::worker::registry::available() {
        let (holders, roles) = (SLOT_HOLDER.get(), SLOT_ROLE.get());
        for slot in 0..MOST_SLOTS {
            let pid = holders[slot].load(Ordering::SeqCst);
            if pid == 0 {
                continue;
            }
            let role = pg_sys::Oid::from(roles[slot].load(Ordering::SeqCst));
            // SAFETY: a syscache lookup of a role by oid; with noerr it returns NULL for one that is gone.
            let name = unsafe { pg_sys::GetUserNameFromId(role, true) };
            let name = if name.is_null() {
                None
            } else {
                // SAFETY: a NUL-terminated name palloc'd by GetUserNameFromId, read at once.
                Some(
                    unsafe { std::ffi::CStr::from_ptr(name) }
                        .to_string_lossy()
                        .into_owned(),
                )
            };
            rows.push((pid, name));
        }
    }
    TableIterator::new(rows)
}
