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
//! so no frame is missed. A backend that loads it later (no `shared_preload_libraries`) cannot see the frames
//! that were already running when it loaded: it notes the identity they left current then, and follows it
//! as they return ([`Floor`]). Every function of rag has a planner support function in the library
//! (`rag._load_library`), so a call to rag loads the library when the statement calling it is planned, in
//! the caller's own frame, rather than inside rag's.
use pgrx::pg_sys;
use std::cell::{Cell, RefCell};

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

/// What lies below the frames the hook saw start. Only a backend that loaded the library while functions
/// were running has anything there.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Floor {
    /// No switch of identity: the session's current role.
    Session,
    /// A function running as this role, which started before the library was loaded, is the innermost one
    /// below the frames the hook saw.
    Role(pg_sys::Oid),
    /// A switch of identity that no frame accounts for: a security-restricted operation or a foreign key's
    /// action that began before the library was loaded (they end without a call of the hook, so the identity
    /// they left current cannot be followed), or an unseen frame that ended in an error (before PostgreSQL
    /// restored the identity below it).
    Unknown,
}

thread_local! {
    static FLOOR: Cell<Floor> = const { Cell::new(Floor::Session) };
    /// True in a backend that loaded the library after it started, where frames can end unseen.
    static LOADED_LATE: Cell<bool> = const { Cell::new(false) };
}

static mut PREVIOUS_HOOK: pg_sys::fmgr_hook_type = None;

/// Installs the hook (chaining whatever was installed before) and a transaction callback that empties the
/// stack at every transaction's end. Called once per process from `_PG_init`; `preloaded` is false in a
/// backend that loads the library in the middle of a statement.
pub fn install(preloaded: bool) {
    if !preloaded {
        LOADED_LATE.set(true);
        FLOOR.set(floor_now());
    }
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
        _ => {
            let unseen = FRAMES.with(|frames| {
                let mut frames = frames.borrow_mut();
                let unseen = frames.depth == 0;
                frames.depth = frames.depth.saturating_sub(1);
                unseen
            });
            // A frame that started before the library was loaded returned. At END PostgreSQL has already
            // restored the identity of whatever called it; at ABORT it has not.
            if unseen && LOADED_LATE.get() {
                FLOOR.set(if event == pg_sys::FmgrHookEventType::FHET_END {
                    floor_now()
                } else {
                    Floor::Unknown
                });
            }
        }
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
        FLOOR.set(Floor::Session);
    }
}

/// What the current identity says of the functions running below the ones the hook saw. A SECURITY DEFINER
/// function sets `SECURITY_LOCAL_USERID_CHANGE`; without it and without another role than the session's,
/// nothing changed identity. Does not raise (the hook calls it).
fn floor_now() -> Floor {
    let mut user = pg_sys::InvalidOid;
    let mut context: std::ffi::c_int = 0;
    // SAFETY: pointers to live locals; both calls only read this backend's globals.
    let outer = unsafe {
        pg_sys::GetUserIdAndSecContext(&mut user, &mut context);
        pg_sys::GetOuterUserId()
    };
    let frameless =
        (pg_sys::SECURITY_RESTRICTED_OPERATION | pg_sys::SECURITY_NOFORCE_RLS) as std::ffi::c_int;
    if context & frameless != 0 {
        Floor::Unknown
    } else if context & pg_sys::SECURITY_LOCAL_USERID_CHANGE as std::ffi::c_int == 0
        && user == outer
    {
        Floor::Session
    } else {
        Floor::Role(user)
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
/// cannot say (too deep, the innermost frame is not `rag._calling_role()`, or the frames below the ones seen
/// are unknown).
pub fn innermost_caller(
    describe: impl Fn(pg_sys::Oid) -> Option<FunctionFacts>,
) -> Result<Option<pg_sys::Oid>, CallerUnknown> {
    // Copied out first: the catalog lookups below must not run while the stack is borrowed (the hook borrows
    // it on every call PostgreSQL makes through the definer handler).
    let (own, callers) = FRAMES.with(|frames| {
        let frames = frames.borrow();
        if frames.depth > CAPACITY {
            return Err(CallerUnknown::TooDeep);
        }
        match frames.frames[..frames.depth].split_last() {
            Some((own, rest)) => Ok((*own, rest.to_vec())),
            None => Err(CallerUnknown::NotThroughFmgr),
        }
    })?;
    let own = describe(own.function).ok_or(CallerUnknown::NotInCatalog)?;
    if !own.is_calling_role {
        return Err(CallerUnknown::NotThroughFmgr);
    }
    for frame in callers.iter().rev() {
        if frame.user == own.owner {
            continue;
        }
        if describe(frame.function)
            .ok_or(CallerUnknown::NotInCatalog)?
            .security_definer
        {
            return Ok(Some(frame.user));
        }
    }
    match FLOOR.get() {
        Floor::Session => Ok(None),
        // One of rag's own functions (or another of its owner's) was running when the library loaded: its
        // caller is further down, where nothing can be seen.
        Floor::Role(role) if role == own.owner => Err(CallerUnknown::LoadedInside),
        Floor::Role(role) => Ok(Some(role)),
        Floor::Unknown => Err(CallerUnknown::LoadedInside),
    }
}

/// Why the stack cannot say who called.
#[derive(Debug, PartialEq, Eq)]
pub enum CallerUnknown {
    TooDeep,
    NotThroughFmgr,
    NotInCatalog,
    /// The library was loaded while functions whose callers it cannot see were running.
    LoadedInside,
}

impl CallerUnknown {
    pub fn reason(&self) -> &'static str {
        match self {
            CallerUnknown::TooDeep => "the call stack is too deep to tell who called",
            CallerUnknown::NotThroughFmgr => {
                "rag._calling_role() was not called through PostgreSQL's function manager"
            }
            CallerUnknown::NotInCatalog => "a running function is not in the catalog",
            CallerUnknown::LoadedInside => {
                "the library was loaded in this statement while functions were running whose callers it \
                 cannot see (rag is not in shared_preload_libraries)"
            }
        }
    }

    pub fn hint(&self) -> &'static str {
        match self {
            CallerUnknown::LoadedInside => {
                "Add rag to shared_preload_libraries (or session_preload_libraries), or run the statement \
                 again: the library stays loaded for the rest of the session."
            }
            _ => "Call rag's functions from ordinary SQL.",
        }
    }
}
