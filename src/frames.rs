//! Whose code called into rag: the identity every function that PostgreSQL runs through its SECURITY DEFINER /
//! SET-clause call handler (`fmgr_security_definer`) started with, as a stack kept by an `fmgr_hook`.
//!
//! A SECURITY DEFINER function of rag sees its owner as `current_user`, so it asks who called it. Every entry
//! point of rag that runs as the owner is entered through a wrapper that does not switch identity
//! (sql/security.sql): `rag_query(...)` is a SQL function with SET clauses calling
//! `rag_definer.rag_query(...)`. PostgreSQL runs the wrapper through the handler, which calls the hook
//! before the wrapper's body runs and without changing identity for it, so its frame holds exactly the
//! identity PostgreSQL would check the caller's own statements against at that point: the session's role,
//! a definer function's owner, the role a foreign key's action or a trigger runs as, the owner of a schema
//! being created with AUTHORIZATION. rag does not reason about how that identity came about.
//! [`entry_point_caller`] walks down from `rag._calling_role()` over rag's own frames to the outermost one, which
//! must be such a wrapper (or another function of rag that does not switch identity). The wrapper sets no
//! `search_path` of its own, so its frame also holds the path its caller had, which a reader's row checks
//! run the watched table's policies with (`rag._calling_identity()`).
//!
//! Installed in every backend that loads the library; when the library is preloaded that is from the start,
//! so no frame is missed. A backend that loads it later (no `shared_preload_libraries`) cannot see the frames
//! that were already running when it loaded: if any of them had switched identity (rag's own definer functions
//! among them), it refuses to act until they have returned ([`Floor`]). Every function of rag has a planner
//! support function in the library (`rag._load_library`), so a call to rag loads the library when the
//! statement calling it is planned, before the wrapper starts.
use pgrx::pg_sys;
use std::cell::{Cell, RefCell};
use std::ffi::CStr;
use std::rc::Rc;

/// Deeper than any call chain `max_stack_depth` allows in practice; beyond it frames are counted, not kept,
/// and the caller cannot be told (callers then refuse: [`entry_point_caller`] returns an error).
const CAPACITY: usize = 512;

/// One running function: the identity it runs as, the function itself, and the `search_path` in force when it
/// started. For a wrapper, which sets no `search_path`, that is its caller's: a reader's row checks run the
/// watched table's row-level security policies with it, as PostgreSQL runs them for the reader's own SELECT.
/// Frames that start with the same path as the frame below them share its copy.
#[derive(Clone)]
struct Frame {
    user: pg_sys::Oid,
    function: pg_sys::Oid,
    search_path: Option<Rc<CStr>>,
}

const NO_FRAME: Frame = Frame {
    user: pg_sys::InvalidOid,
    function: pg_sys::InvalidOid,
    search_path: None,
};

struct Frames {
    frames: [Frame; CAPACITY],
    depth: usize,
}

thread_local! {
    // PostgreSQL calls the hook on the backend's one thread only; a thread-local avoids `static mut`.
    static FRAMES: RefCell<Frames> = const {
        RefCell::new(Frames {
            frames: [NO_FRAME; CAPACITY],
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
    /// Something had: a function or trigger running as another role that started before the library was
    /// loaded (one of rag's own definer bodies among them), a security-restricted operation, a foreign key's
    /// action, or an unseen frame that ended in an error (at ABORT PostgreSQL has not restored the identity
    /// below it yet). rag's frames above it may then not be all of rag's, so rag refuses to act until an
    /// unseen frame returns to an identity that is the session's again, or the transaction ends.
    Switched,
}

thread_local! {
    static FLOOR: Cell<Floor> = const { Cell::new(Floor::Session) };
    /// True in a backend that loaded the library after it started, where frames can end unseen.
    static LOADED_LATE: Cell<bool> = const { Cell::new(false) };
    /// The extension rag (its oid) and its schema rag_definer, with the schema rag they were read for: a
    /// dropped and re-created extension is another one, with another schema.
    static EXTENSION: Cell<(pg_sys::Oid, pg_sys::Oid, pg_sys::Oid)> =
        const { Cell::new((pg_sys::InvalidOid, pg_sys::InvalidOid, pg_sys::InvalidOid)) };
}

static mut PREVIOUS_HOOK: pg_sys::fmgr_hook_type = None;

/// Installs the `fmgr_hook` (chaining whatever was installed before) and a transaction callback that empties
/// the stack at every transaction's end. Called once per process from `_PG_init`; `preloaded` is false in a
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
            // SAFETY: GetUserId reads a backend global; `flinfo` is the call's lookup info, valid for the call.
            let (user, function) = unsafe { (pg_sys::GetUserId(), (*flinfo).fn_oid) };
            // SAFETY: the search_path parameter's current value, a NUL-terminated string PostgreSQL keeps
            // allocated while it is in force; read here, never kept as a pointer.
            let path = unsafe {
                let value = pg_sys::namespace_search_path;
                (!value.is_null()).then(|| CStr::from_ptr(value))
            };
            FRAMES.with(|frames| {
                let mut frames = frames.borrow_mut();
                let depth = frames.depth;
                if depth < CAPACITY {
                    let below = depth
                        .checked_sub(1)
                        .and_then(|i| frames.frames[i].search_path.clone());
                    let search_path = match (path, below) {
                        (Some(path), Some(below)) if *below == *path => Some(below),
                        (path, _) => path.map(Rc::from),
                    };
                    frames.frames[depth] = Frame {
                        user,
                        function,
                        search_path,
                    };
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
                let depth = frames.depth;
                if !unseen && depth < CAPACITY {
                    frames.frames[depth].search_path = None;
                }
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
    if crate::pg::ends_transaction(event) {
        FRAMES.with(|frames| {
            let mut frames = frames.borrow_mut();
            let kept = frames.depth.min(CAPACITY);
            frames.frames[..kept].fill(NO_FRAME);
            frames.depth = 0;
        });
        FLOOR.set(Floor::Session);
    }
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

/// What the catalog says of a function: its owner, its schema, whether it switches to its owner
/// (SECURITY DEFINER), and whether it is one of the functions that ask who called (`rag._calling_role()`,
/// `rag._calling_identity()`, `rag._acting_for()`).
struct FunctionFacts {
    owner: pg_sys::Oid,
    namespace: pg_sys::Oid,
    definer: bool,
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
        let namespace = (*form).pronamespace;
        let definer = (*form).prosecdef;
        let named_calling_role = matches!(
            std::ffi::CStr::from_ptr((*form).proname.data.as_ptr()).to_bytes(),
            b"_calling_role" | b"_calling_identity" | b"_acting_for"
        );
        pg_sys::ReleaseSysCache(tuple);
        // Only the innermost frame has that name; the other frames need no second lookup.
        let is_calling_role =
            named_calling_role && namespace == pg_sys::get_namespace_oid(c"rag".as_ptr(), true);
        Some(FunctionFacts {
            owner,
            namespace,
            definer,
            is_calling_role,
        })
    }
}

/// Who called into rag, seen from `rag._calling_role()` itself (or `rag._calling_identity()`,
/// `rag._acting_for()`), which must be the innermost frame (it has a
/// SET clause, so the handler runs it and the hook recorded it). Below it lie rag's own frames: functions of
/// rag's owner in the schema `rag` or members of the extension elsewhere; only a superuser can create those
/// and only rag's owner can change them, so their catalog entries can be believed. The outermost of them was
/// called by code that is not rag's, and must not switch identity (a wrapper of sql/security.sql, or another
/// function of rag without SECURITY DEFINER): the identity it recorded is the caller's. A SECURITY DEFINER
/// function of rag called directly records its owner, not its caller, so the walk refuses there.
///
/// An error when the stack cannot say: too deep, the innermost frame is not `rag._calling_role()` (or
/// `rag._calling_identity()`), rag's outermost frame switches identity, the identities rag's inner frames
/// recorded do not follow from the outermost one, or frames that started before the library was loaded had
/// switched identity.
pub fn entry_point_caller() -> Result<Caller, CallerUnknown> {
    // Copied out first: the catalog lookups below must not run while the stack is borrowed (the hook borrows
    // it on every call PostgreSQL makes through the definer handler).
    let (own, callers) = FRAMES.with(|frames| {
        let frames = frames.borrow();
        if frames.depth > CAPACITY {
            return Err(CallerUnknown::TooDeep);
        }
        match frames.frames[..frames.depth].split_last() {
            Some((own, rest)) => Ok((own.clone(), rest.to_vec())),
            None => Err(CallerUnknown::NotThroughFmgr),
        }
    })?;
    let own_function = own.function;
    let own_user = own.user;
    let own = describe(own_function).ok_or(CallerUnknown::NotInCatalog)?;
    if !own.is_calling_role {
        return Err(CallerUnknown::NotThroughFmgr);
    }
    let (extension, bodies) = match EXTENSION.get() {
        (schema, extension, bodies) if schema == own.namespace => (extension, bodies),
        _ => {
            let extension = extension_of(own_function);
            // SAFETY: a syscache lookup by name; with missing_ok it returns InvalidOid rather than raising.
            let bodies = unsafe { pg_sys::get_namespace_oid(c"rag_definer".as_ptr(), true) };
            EXTENSION.set((own.namespace, extension, bodies));
            (extension, bodies)
        }
    };
    // rag's frames from the innermost (`rag._calling_role()` itself) out: the identity each recorded, and
    // whether it switched to rag's owner.
    let mut run = vec![(own_user, false)];
    let mut outermost_path = None;
    for frame in callers.iter().rev() {
        let facts = describe(frame.function).ok_or(CallerUnknown::NotInCatalog)?;
        // The schemas rag and rag_definer are the extension's alone; in the extension's own schema (public,
        // often) the extension's owner may have functions of its own, so membership is asked there.
        let rags = facts.owner == own.owner
            && (facts.namespace == own.namespace
                || facts.namespace == bodies
                || extension_of(frame.function) == extension);
        if !rags {
            break;
        }
        run.push((frame.user, facts.definer));
        outermost_path = frame.search_path.clone();
    }
    let Some(&(caller, false)) = run.last().filter(|_| run.len() > 1) else {
        return Err(CallerUnknown::NotThroughEntryPoint);
    };
    // Inside rag nothing switches identity without a frame: every function of rag that does not switch
    // recorded its caller's identity, which is the entry point's caller until a definer body of rag starts,
    // and rag's owner from there on. Anything else means code that is not rag's ran in between under another
    // identity (an expression rag evaluates as someone else that calls back into rag), and the outermost
    // frame no longer speaks for it.
    let mut inside_definer = false;
    for &(user, definer) in run.iter().rev().skip(1) {
        if definer {
            inside_definer = true;
        } else if user != if inside_definer { own.owner } else { caller } {
            return Err(CallerUnknown::IdentityChangedInside);
        }
    }
    if FLOOR.get() == Floor::Switched {
        return Err(CallerUnknown::LoadedInside);
    }
    Ok(Caller {
        role: caller,
        search_path: outermost_path.map(|path| path.to_string_lossy().into_owned()),
    })
}

/// The identity PostgreSQL called the wrapper of the function asking with: seen from `rag._acting_for()`, which
/// must be the innermost frame, called by a SECURITY DEFINER body in `rag_definer`, itself called by its own
/// wrapper (a function of rag's owner of the same name in schema rag that does not switch identity). That
/// identity is the `current_user` of the statement that called the wrapper: a reader's own query, the owner of
/// a function or materialized view that reads rag's tables, or rag's owner when rag's own code reads its views.
/// `None` when the frames do not have that shape (the body called without its wrapper, among others). The
/// three frames were seen starting by the hook whatever lies below them, so a library loaded late changes
/// nothing here.
pub fn wrapper_identity() -> Option<pg_sys::Oid> {
    let top = FRAMES.with(|frames| {
        let frames = frames.borrow();
        (3..=CAPACITY)
            .contains(&frames.depth)
            .then(|| frames.frames[frames.depth - 3..frames.depth].to_vec())
    })?;
    let [wrapper, body, own] = top.as_slice() else {
        return None;
    };
    let own_facts = describe(own.function)?;
    let body_facts = describe(body.function)?;
    let wrapper_facts = describe(wrapper.function)?;
    // SAFETY: a syscache lookup by name; with missing_ok it returns InvalidOid rather than raising.
    let bodies = unsafe { pg_sys::get_namespace_oid(c"rag_definer".as_ptr(), true) };
    let shaped = own_facts.is_calling_role
        && body_facts.definer
        && body_facts.namespace == bodies
        && body_facts.owner == own_facts.owner
        && !wrapper_facts.definer
        && wrapper_facts.namespace == own_facts.namespace
        && wrapper_facts.owner == own_facts.owner;
    (shaped && same_name(wrapper.function, body.function)).then_some(wrapper.user)
}

/// Whether two functions have the same name: a wrapper and the body it calls.
fn same_name(one: pg_sys::Oid, other: pg_sys::Oid) -> bool {
    // SAFETY: get_func_name returns a palloc'd NUL-terminated copy of the name, or NULL for an unknown oid
    // (checked); both are read before this function returns, and the memory belongs to the current context.
    unsafe {
        let (one, other) = (pg_sys::get_func_name(one), pg_sys::get_func_name(other));
        !one.is_null() && !other.is_null() && CStr::from_ptr(one) == CStr::from_ptr(other)
    }
}

/// Who called into rag, as the outermost frame of rag recorded it: the identity, and the `search_path` the
/// caller had (a wrapper sets none of its own).
pub struct Caller {
    pub role: pg_sys::Oid,
    pub search_path: Option<String>,
}

/// The extension a function belongs to (`InvalidOid` for none): one index scan of `pg_depend`.
fn extension_of(function: pg_sys::Oid) -> pg_sys::Oid {
    // SAFETY: reads the catalog by oid inside the transaction of the calling function; pgrx turns an ERROR
    // into a Rust panic at this boundary, which the calling `#[pg_extern]` raises again.
    unsafe { pg_sys::getExtensionOfObject(pg_sys::ProcedureRelationId, function) }
}

/// Why the stack cannot say who called.
#[derive(Debug, PartialEq, Eq)]
pub enum CallerUnknown {
    TooDeep,
    NotThroughFmgr,
    NotInCatalog,
    /// A function of rag that runs as rag's owner was called directly, not through its wrapper.
    NotThroughEntryPoint,
    /// The library was loaded while functions that had switched identity were running.
    LoadedInside,
    /// The identity changed between two of rag's frames without a frame saying so.
    IdentityChangedInside,
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
            CallerUnknown::NotThroughEntryPoint => {
                "rag cannot tell who is calling: an internal function of rag that runs as its owner was \
                 called directly"
            }
            CallerUnknown::LoadedInside => {
                "rag cannot tell who is calling: the library was loaded while functions that run as another \
                 role were running (rag is not in shared_preload_libraries)"
            }
            CallerUnknown::IdentityChangedInside => {
                "rag cannot tell who is calling: the identity changed inside rag's own functions"
            }
        }
    }

    pub fn hint(&self) -> &'static str {
        match self {
            CallerUnknown::NotThroughEntryPoint => {
                "Call rag's public functions (rag_query, rag_ask, …), which tell the function who called them."
            }
            CallerUnknown::LoadedInside => {
                "Add rag to shared_preload_libraries (or session_preload_libraries), or call rag once at the \
                 start of the session: the library stays loaded, and later calls are told who called."
            }
            _ => "Call rag's functions from ordinary SQL.",
        }
    }
}
