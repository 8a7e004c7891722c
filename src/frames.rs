//! Whose code is running: the identity of every function PostgreSQL runs through its SECURITY DEFINER /
//! SET-clause call handler (`fmgr_security_definer`), as a stack kept by an `fmgr_hook`.
//!
//! A SECURITY DEFINER function of rag sees the definer as `current_user`, so it asks who called it. The
//! session's current role (`GetOuterUserId`) is the answer only when nothing between the session and rag
//! switched identity: a function or trigger that another role wrote as SECURITY DEFINER runs as that role, in
//! PostgreSQL's model, even when a superuser calls it or writes to its table, and rag must not give that code
//! the superuser's rights. The handler switches to the definer before it calls the hook, so the hook records
//! exactly the identity each such function runs as; functions that only have SET clauses (all of rag's)
//! record the identity they were called with, which is also right. [`innermost_caller`] walks the stack down
//! past rag's own frames.
//!
//! PostgreSQL also runs trigger functions under another identity without a definer function: a foreign key's
//! cascade runs the referencing table's triggers as that table's owner, and from PostgreSQL 18 every AFTER
//! trigger runs as the role whose statement queued it (a deferred trigger queued inside a definer function
//! fires at COMMIT as that function's owner). So the library also asks PostgreSQL, through `needs_fmgr_hook`,
//! to run every trigger function through the same handler, and a trigger frame whose identity was switched
//! counts as a caller, like a definer frame.
//!
//! Installed in every backend that loads the library; when the library is preloaded that is from the start,
//! so no frame is missed. A backend that loads it later (no `shared_preload_libraries`) cannot see the frames
//! that were already running when it loaded: if any of them had switched identity, it refuses to act until
//! they have returned ([`Floor`]). Every function of rag has a planner support function in the library
//! (`rag._load_library`), so a call to rag loads the library when the statement calling it is planned, in
//! the caller's own frame, rather than inside rag's.
use pgrx::pg_sys;
use std::cell::{Cell, RefCell};

/// Deeper than any call chain `max_stack_depth` allows in practice; beyond it frames are counted, not kept,
/// and the caller cannot be told (callers then refuse: [`innermost_caller`] returns an error).
const CAPACITY: usize = 512;

/// One running function: the identity it runs as, its security context (which switches of identity it runs
/// under), how many triggers deep it runs, and the function itself.
#[derive(Clone, Copy)]
struct Frame {
    user: pg_sys::Oid,
    context: std::ffi::c_int,
    trigger_depth: i32,
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
            frames: [Frame { user: pg_sys::InvalidOid, context: 0, trigger_depth: 0, function: pg_sys::InvalidOid }; CAPACITY],
            depth: 0,
        })
    };
}

/// What lies below the frames the hook saw start. Only a backend that loaded the library while functions
/// were running has anything there.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Floor {
    /// Nothing had switched identity: the session's current role.
    Session,
    /// Something had: a definer function or a trigger that started before the library was loaded, a
    /// security-restricted operation, a foreign key's action, or an unseen frame that ended in an error (at
    /// ABORT PostgreSQL has not restored the identity below it yet). Which role's code that is cannot be read
    /// any more, and such a switch can also end without calling the hook, so rag refuses to act until an
    /// unseen frame returns to an identity that is the session's again, or the transaction ends.
    Switched,
}

thread_local! {
    /// Utility commands running that switch identity without a function frame (see
    /// [`enter_frameless_switch`]); emptied at every transaction's end, like the stack.
    static FRAMELESS_SWITCHES: Cell<u32> = const { Cell::new(0) };
    static FLOOR: Cell<Floor> = const { Cell::new(Floor::Session) };
    /// True in a backend that loaded the library after it started, where frames can end unseen.
    static LOADED_LATE: Cell<bool> = const { Cell::new(false) };
}

static mut PREVIOUS_HOOK: pg_sys::fmgr_hook_type = None;
static mut PREVIOUS_NEEDS_HOOK: pg_sys::needs_fmgr_hook_type = None;

/// Installs the `fmgr_hook` and the `needs_fmgr_hook` (each chaining whatever was installed before) and a
/// transaction callback that empties the stack at every transaction's end. Called once per process from `_PG_init`; `preloaded` is false in a
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
        PREVIOUS_NEEDS_HOOK = pg_sys::needs_fmgr_hook;
        pg_sys::needs_fmgr_hook = Some(frame_triggers);
        pg_sys::RegisterXactCallback(Some(forget_frames), std::ptr::null_mut());
    }
}

/// A utility command that runs user code as another role without a function frame is starting:
/// `CREATE SCHEMA … AUTHORIZATION` runs its subcommands as the schema's owner, and one of them can evaluate
/// that owner's functions (a new partition's constraint over the parent's default partition). Until
/// [`leave_frameless_switch`] (or the transaction's end, when the command fails), rag refuses to act for the
/// session's role. Called by the utility hook, so only where the library is preloaded.
pub fn enter_frameless_switch() {
    FRAMELESS_SWITCHES.set(FRAMELESS_SWITCHES.get() + 1);
}

/// The command of [`enter_frameless_switch`] returned.
pub fn leave_frameless_switch() {
    FRAMELESS_SWITCHES.set(FRAMELESS_SWITCHES.get().saturating_sub(1));
}

/// PostgreSQL asks this, when it looks a function up, whether the function needs the handler that calls the
/// hook (definer and SET-clause functions always get it). Trigger functions do, so that a trigger that
/// PostgreSQL runs under a switched identity has a frame saying so. Built-in functions never reach it.
// SAFETY (for callers): PostgreSQL calls it from fmgr_info with the oid of a function it has just read from the
// catalog, inside a transaction; it may raise an ERROR there, as fmgr_info itself may.
#[pgrx::pg_guard]
unsafe extern "C-unwind" fn frame_triggers(function: pg_sys::Oid) -> bool {
    // SAFETY: PREVIOUS_NEEDS_HOOK is written once, in `install`, before any call can reach this hook.
    if let Some(previous) = unsafe { PREVIOUS_NEEDS_HOOK } {
        // SAFETY: the previous hook was installed for exactly these calls.
        if unsafe { previous(function) } {
            return true;
        }
    }
    describe(function).is_some_and(|facts| facts.trigger)
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
    // SAFETY: PREVIOUS_HOOK is written once, in `install`, before any call can reach this hook.
    let previous = unsafe { PREVIOUS_HOOK };
    match event {
        pg_sys::FmgrHookEventType::FHET_START => {
            // The previous hook first: one that refuses the call raises here, outside PostgreSQL's error
            // handling for the call, and no END or ABORT follows; the frame is pushed only once the call runs.
            if let Some(previous) = previous {
                // SAFETY: the previous hook was installed for exactly these calls and gets our arguments.
                unsafe { previous(event, flinfo, argument) };
            }
            let mut user = pg_sys::InvalidOid;
            let mut context: std::ffi::c_int = 0;
            // SAFETY: GetUserIdAndSecContext writes two locals from backend globals; `flinfo` is the call's
            // lookup info, valid for the call.
            let frame = unsafe {
                pg_sys::GetUserIdAndSecContext(&mut user, &mut context);
                Frame {
                    user,
                    context,
                    trigger_depth: trigger_depth(),
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
            return;
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
                    Floor::Switched
                });
            }
        }
    }
    if let Some(previous) = previous {
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
        FRAMELESS_SWITCHES.set(0);
        FLOOR.set(Floor::Session);
    }
}

/// How many trigger functions are running, as PostgreSQL counts them (`ExecCallTriggerFunc` counts every
/// trigger call, built-in ones and those called before the library was loaded included). Does not raise.
fn trigger_depth() -> i32 {
    // SAFETY: pg_trigger_depth only returns the backend's trigger counter; it reads nothing of its argument.
    let depth = unsafe { pg_sys::pg_trigger_depth(std::ptr::null_mut()) };
    depth.value() as i32
}

/// Whether anything running now has switched identity: a definer function or a switched trigger sets
/// `SECURITY_LOCAL_USERID_CHANGE`, security-restricted operations and foreign key actions set their own flags,
/// and any other switch leaves a role other than the session's. Does not raise (the hook calls it).
fn floor_now() -> Floor {
    let mut user = pg_sys::InvalidOid;
    let mut context: std::ffi::c_int = 0;
    // SAFETY: pointers to live locals; both calls only read this backend's globals.
    let outer = unsafe {
        pg_sys::GetUserIdAndSecContext(&mut user, &mut context);
        pg_sys::GetOuterUserId()
    };
    if context == 0 && user == outer {
        Floor::Session
    } else {
        Floor::Switched
    }
}

/// What the catalog says of a function: its owner, whether it is a trigger function, and whether it is
/// `rag._calling_role()` itself.
struct FunctionFacts {
    owner: pg_sys::Oid,
    trigger: bool,
    is_calling_role: bool,
}

/// What the catalog says of a function; `None` when the catalog lacks it.
fn describe(function: pg_sys::Oid) -> Option<FunctionFacts> {
    // SAFETY: a syscache lookup by oid returns a pinned tuple or NULL (checked); its fixed-size part is a
    // FormData_pg_proc, read before the tuple is released; get_namespace_oid with missing_ok never raises.
    unsafe {
        let tuple = pg_sys::SearchSysCache1(
            pg_sys::SysCacheIdentifier::PROCOID as std::ffi::c_int,
            pg_sys::Datum::from(function),
        );
        if tuple.is_null() {
            return None;
        }
        let form = pg_sys::heap_tuple_get_struct::<pg_sys::FormData_pg_proc>(tuple);
        let owner = (*form).proowner;
        let trigger = (*form).prorettype == pg_sys::TRIGGEROID;
        let namespace = (*form).pronamespace;
        let named_calling_role =
            std::ffi::CStr::from_ptr((*form).proname.data.as_ptr()).to_bytes() == b"_calling_role";
        pg_sys::ReleaseSysCache(tuple);
        // Only the innermost frame has that name; the other frames need no second lookup.
        let is_calling_role =
            named_calling_role && namespace == pg_sys::get_namespace_oid(c"rag".as_ptr(), true);
        Some(FunctionFacts {
            owner,
            trigger,
            is_calling_role,
        })
    }
}

/// Who called into rag, seen from `rag._calling_role()` itself, which must be the innermost frame (it has a
/// SET clause, so the handler runs it and the hook recorded it): the identity recorded by the innermost frame
/// below it that ran under a switched identity (`SECURITY_LOCAL_USERID_CHANGE`: a SECURITY DEFINER function,
/// a trigger PostgreSQL runs as another role, or any function called inside either), passing over frames
/// whose identity is that of `rag._calling_role()`'s owner (the role that owns every function of rag, so its
/// frames are rag's own). Frames with no switch are passed over: their identity is whatever was current when
/// they started, and such a function may `SET ROLE` to a lesser role afterwards (not under a switch), which
/// the session's current role then follows.
///
/// Inside a foreign key's action (`SECURITY_NOFORCE_RLS`, set without a frame while PostgreSQL runs the
/// action's query as a table's owner) only a frame that started inside the action tells whose code runs.
/// Every trigger running must have a frame (see the trigger depths below).
///
/// `Ok(None)` when there is no such frame: the session's current role called rag. An error when the stack
/// cannot say (too deep, the innermost frame is not `rag._calling_role()`, a trigger without a frame, a
/// foreign key's action, or frames that started before the library was loaded had switched identity).
pub fn innermost_caller() -> Result<Option<pg_sys::Oid>, CallerUnknown> {
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
    let foreign_key_action = own.context & pg_sys::SECURITY_NOFORCE_RLS as std::ffi::c_int != 0;
    // Every trigger running has a frame, or something ran user code without one: a built-in trigger function
    // (a foreign key's action, a deferred uniqueness recheck evaluating index expressions; PostgreSQL 18 runs
    // those as the role that queued them too) or a trigger looked up before the library was loaded. Walking
    // down, the frames' trigger depths must step down exactly at the trigger frames, to 0 below the last.
    let mut expected_depth = own.trigger_depth;
    let own = describe(own.function).ok_or(CallerUnknown::NotInCatalog)?;
    if !own.is_calling_role {
        return Err(CallerUnknown::NotThroughFmgr);
    }
    for frame in callers.iter().rev() {
        if frame.trigger_depth != expected_depth {
            return Err(CallerUnknown::TriggerWithoutFrame);
        }
        let facts = describe(frame.function).ok_or(CallerUnknown::NotInCatalog)?;
        if facts.trigger {
            expected_depth -= 1;
        }
        if frame.user == own.owner {
            continue;
        }
        // Recorded, not looked up: a definer function may ALTER itself to SECURITY INVOKER while it runs
        // (and its call handler keeps switching for calls already set up), so the catalog cannot say whether
        // a running frame switched. A frame under a switch, its own or one it inherited, runs as the role it
        // recorded, which cannot change while the switch lasts (SET ROLE is refused there).
        if frame.context & pg_sys::SECURITY_LOCAL_USERID_CHANGE as std::ffi::c_int != 0 {
            if foreign_key_action
                && frame.context & pg_sys::SECURITY_NOFORCE_RLS as std::ffi::c_int == 0
            {
                // The frame is below the action: the code running is the action's, as another role.
                return Err(CallerUnknown::ForeignKeyAction);
            }
            return Ok(Some(frame.user));
        }
    }
    if expected_depth != 0 {
        return Err(CallerUnknown::TriggerWithoutFrame);
    }
    if FRAMELESS_SWITCHES.get() > 0 {
        return Err(CallerUnknown::SchemaOwner);
    }
    match FLOOR.get() {
        Floor::Switched => Err(CallerUnknown::LoadedInside),
        Floor::Session if foreign_key_action => Err(CallerUnknown::ForeignKeyAction),
        Floor::Session => Ok(None),
    }
}

/// Why the stack cannot say who called.
#[derive(Debug, PartialEq, Eq)]
pub enum CallerUnknown {
    TooDeep,
    NotThroughFmgr,
    NotInCatalog,
    /// Code runs inside a foreign key's action, as a table's owner, and no frame says whose it is.
    ForeignKeyAction,
    /// A trigger is running that has no frame (a built-in trigger function, or one looked up before the
    /// library was loaded): whose identity it runs under cannot be told.
    TriggerWithoutFrame,
    /// Inside `CREATE SCHEMA … AUTHORIZATION`, which runs its commands as the schema's owner.
    SchemaOwner,
    /// The library was loaded while functions that had switched identity were running.
    LoadedInside,
}

impl CallerUnknown {
    pub fn message(&self) -> &'static str {
        match self {
            CallerUnknown::TooDeep => "rag cannot tell who is calling: the call stack is too deep",
            CallerUnknown::NotThroughFmgr => {
                "rag cannot tell who is calling: rag._calling_role() was not called through PostgreSQL's \
                 function manager"
            }
            CallerUnknown::NotInCatalog => {
                "rag cannot tell who is calling: a running function is not in the catalog"
            }
            CallerUnknown::ForeignKeyAction => {
                "rag cannot act for a caller inside a foreign key's action"
            }
            CallerUnknown::TriggerWithoutFrame => {
                "rag cannot act for a caller inside a built-in trigger (a foreign key's action, a deferred \
                 uniqueness check) or a trigger that started before the library was loaded"
            }
            CallerUnknown::SchemaOwner => {
                "rag cannot act for a caller inside CREATE SCHEMA ... AUTHORIZATION, which runs its commands \
                 as the schema's owner"
            }
            CallerUnknown::LoadedInside => {
                "rag cannot tell who is calling: the library was loaded while functions that run as another \
                 role were running (rag is not in shared_preload_libraries)"
            }
        }
    }

    pub fn hint(&self) -> &'static str {
        match self {
            CallerUnknown::ForeignKeyAction => {
                "A foreign key's action runs its query as a table's owner; call rag from a trigger on that \
                 table or from ordinary SQL."
            }
            CallerUnknown::TriggerWithoutFrame => {
                "Call rag from a trigger function of your own (they are tracked) or from ordinary SQL; without \
                 shared_preload_libraries, call any rag function first in the session."
            }
            CallerUnknown::SchemaOwner => {
                "Create the schema first, then its objects in statements of their own."
            }
            CallerUnknown::LoadedInside => {
                "Add rag to shared_preload_libraries (or session_preload_libraries), or call rag once at the \
                 start of the session: the library stays loaded, and later calls are told who called."
            }
            _ => "Call rag's functions from ordinary SQL.",
        }
    }
}
