//! Whose code is running: the identity of every function PostgreSQL runs through its SECURITY DEFINER /
//! SET-clause call handler (`fmgr_security_definer`), as a stack kept by an `fmgr_hook`.
//!
//! A SECURITY DEFINER function of rag sees the definer as `current_user`, so it asks who called it. The
//! session's current role (`GetOuterUserId`) is the answer only when no other definer function is between
//! the session and rag: a function or trigger that another role wrote as SECURITY DEFINER runs as that role,
//! in PostgreSQL's model, even when a superuser calls it or writes to its table, and rag must not give that
//! code the superuser's rights. The handler switches to the definer before it calls the hook, so the hook
//! records exactly the identity each such function runs as; functions that only have SET clauses (all of
//! rag's) record the identity they were called with, which is also right. [`innermost_caller`] walks the
//! stack down past rag's own frames.
//!
//! Installed in every backend that loads the library; when the library is preloaded that is from the start,
//! so no frame is missed. A backend that loads it later (no `shared_preload_libraries`) misses the frames
//! that were active when it loaded, for that one statement; README "Security" says so.
use pgrx::pg_sys;
use std::cell::RefCell;

/// Deeper than any call chain `max_stack_depth` allows in practice; beyond it frames are counted, not kept,
/// and the caller cannot be told (callers then refuse: [`innermost_caller`] returns `None`).
const CAPACITY: usize = 512;

/// One running function: the identity it runs as and the function itself.
#[derive(Clone, Copy)]
struct Frame {
    user: pg_sys::Oid,
    function: pg_sys::Oid,
}

struct Frames {
    frames: [Frame; CAPACITY],
    depth: usize,
}

thread_local! {
    // PostgreSQL calls the hook on the backend's one thread only; a thread-local avoids `static mut`.
    static FRAMES: RefCell<Frames> = const {
        RefCell::new(Frames {
            frames: [Frame { user: pg_sys::InvalidOid, function: pg_sys::InvalidOid }; CAPACITY],
            depth: 0,
        })
    };
}

static mut PREVIOUS_HOOK: pg_sys::fmgr_hook_type = None;

/// Installs the hook (chaining whatever was installed before) and a transaction callback that empties the
/// stack at every transaction's end. Called once per process from `_PG_init`.
pub fn install() {
    // SAFETY: `_PG_init` runs once per process with a single thread (the postmaster before it forks, or a
    // backend loading the library), so nothing reads or writes the hook variable concurrently; the previous
    // hook is kept and always called. RegisterXactCallback copies the pointer into a list it owns.
    unsafe {
        PREVIOUS_HOOK = pg_sys::fmgr_hook;
        pg_sys::fmgr_hook = Some(track_frame);
        pg_sys::RegisterXactCallback(Some(forget_frames), std::ptr::null_mut());
    }
}

/// Not `#[pg_guard]`: it calls nothing that can raise an ERROR (GetUserId reads a global, the stack is a fixed
/// array), so no `longjmp` crosses it, and it must never turn into one in every SECURITY DEFINER call of the
/// cluster. The previous hook, if any, is called as PostgreSQL would have called it.
// SAFETY (for callers): PostgreSQL calls it from fmgr_security_definer with that call's FmgrInfo and argument.
unsafe extern "C-unwind" fn track_frame(
    event: pg_sys::FmgrHookEventType::Type,
    flinfo: *mut pg_sys::FmgrInfo,
    argument: *mut pg_sys::Datum,
) {
    match event {
        pg_sys::FmgrHookEventType::FHET_START => {
            // SAFETY: GetUserId reads a backend global; `flinfo` is the call's lookup info, valid for the call.
            let frame = unsafe {
                Frame {
                    user: pg_sys::GetUserId(),
                    function: (*flinfo).fn_oid,
                }
            };
            FRAMES.with(|frames| {
                let mut frames = frames.borrow_mut();
                let depth = frames.depth;
                if depth < CAPACITY {
                    frames.frames[depth] = frame;
                }
                frames.depth = depth + 1;
            });
        }
        // END after a normal return, ABORT on the way out of an ERROR: each START has exactly one of them.
        _ => FRAMES.with(|frames| {
            let mut frames = frames.borrow_mut();
            frames.depth = frames.depth.saturating_sub(1);
        }),
    }
    // SAFETY: PREVIOUS_HOOK is written once, in `install`, before any call can reach this hook.
    if let Some(previous) = unsafe { PREVIOUS_HOOK } {
        // SAFETY: the previous hook was installed for exactly these calls and gets our arguments unchanged.
        unsafe { previous(event, flinfo, argument) };
    }
}

/// No function frame outlives its transaction (a function with SET clauses or SECURITY DEFINER may not
/// COMMIT), so the stack is empty at every transaction's end; emptying it there keeps a frame that was somehow
/// not popped from standing for a caller later.
// SAFETY (for callers): PostgreSQL calls it at transaction events with the argument registered (NULL).
#[pgrx::pg_guard]
unsafe extern "C-unwind" fn forget_frames(
    event: pg_sys::XactEvent::Type,
    _argument: *mut std::ffi::c_void,
) {
    if matches!(
        event,
        pg_sys::XactEvent::XACT_EVENT_COMMIT
            | pg_sys::XactEvent::XACT_EVENT_ABORT
            | pg_sys::XactEvent::XACT_EVENT_PREPARE
            | pg_sys::XactEvent::XACT_EVENT_PARALLEL_COMMIT
            | pg_sys::XactEvent::XACT_EVENT_PARALLEL_ABORT
    ) {
        FRAMES.with(|frames| frames.borrow_mut().depth = 0);
    }
}

/// What the catalog says of a function: its owner, whether it is SECURITY DEFINER, and whether it is
/// `rag._calling_role()` itself.
pub struct FunctionFacts {
    pub owner: pg_sys::Oid,
    pub security_definer: bool,
    pub is_calling_role: bool,
}

/// Who called into rag, seen from `rag._calling_role()` itself, which must be the innermost frame (it has a
/// SET clause, so the handler runs it and the hook recorded it): the identity of the innermost SECURITY
/// DEFINER frame below it whose identity is not that of `rag._calling_role()`'s owner (the role that owns
/// every function of rag, so its frames are rag's own). Frames of functions that only have SET clauses are
/// passed over: their identity is whatever was current when they started, and such a function may `SET ROLE`
/// to a lesser role afterwards (a definer function may not), which the session's current role then follows.
/// `Ok(None)` when there is no such frame: the session's current role called rag. An error when the stack
/// cannot say (too deep, or the innermost frame is not `rag._calling_role()`).
pub fn innermost_caller(
    describe: impl Fn(pg_sys::Oid) -> Option<FunctionFacts>,
) -> Result<Option<pg_sys::Oid>, &'static str> {
    // Copied out first: the catalog lookups below must not run while the stack is borrowed (the hook borrows
    // it on every call PostgreSQL makes through the definer handler).
    let (own, callers) = FRAMES.with(|frames| {
        let frames = frames.borrow();
        if frames.depth > CAPACITY {
            return Err("the call stack is too deep to tell who called");
        }
        match frames.frames[..frames.depth].split_last() {
            Some((own, rest)) => Ok((*own, rest.to_vec())),
            None => Err(NOT_THROUGH_FMGR),
        }
    })?;
    let own = describe(own.function).ok_or(NOT_IN_CATALOG)?;
    if !own.is_calling_role {
        return Err(NOT_THROUGH_FMGR);
    }
    for frame in callers.iter().rev() {
        if frame.user == own.owner {
            continue;
        }
        if describe(frame.function)
            .ok_or(NOT_IN_CATALOG)?
            .security_definer
        {
            return Ok(Some(frame.user));
        }
    }
    Ok(None)
}

const NOT_THROUGH_FMGR: &str =
    "rag._calling_role() was not called through PostgreSQL's function manager";
const NOT_IN_CATALOG: &str = "a running function is not in the catalog";
