//! Commands that need a database to themselves: DROP DATABASE, ALTER DATABASE … RENAME TO, ALTER DATABASE …
//! SET TABLESPACE, and CREATE DATABASE … TEMPLATE of a database in use. A rag worker connected to that
//! database would make them fail with "database is being accessed by other users", which no one who runs
//! `dropdb` or a test runner's "drop the test database" expects from an extension.
//!
//! A ProcessUtility hook sees these commands before they run: it holds the launcher off that database for a
//! few seconds and sends the database's workers SIGTERM. PostgreSQL then waits up to 5 seconds for other
//! sessions to leave before it gives up, and the workers are gone by then: each finishes its current step
//! (a transaction, or a provider call that checks for shutdown) and exits. If the command fails for another
//! reason, the launcher starts the workers again once the pause ends.
use crate::worker::registry;
use pgrx::prelude::*;
use pgrx::PgList;
use std::ffi::CStr;
use std::time::Duration;

/// Long enough for PostgreSQL's own 5-second wait for other sessions, and short enough that a failed command
/// leaves the database without its worker only briefly.
const PAUSE: Duration = Duration::from_secs(10);

static mut PREVIOUS_HOOK: pg_sys::ProcessUtility_hook_type = None;

/// Installs the hook; called once from `_PG_init` while the library is preloaded.
pub fn install() {
    // SAFETY: `_PG_init` runs once per process, in the postmaster before any backend exists, so nothing reads
    // or writes the hook variables concurrently; the previous value is kept and always called.
    unsafe {
        PREVIOUS_HOOK = pg_sys::ProcessUtility_hook;
        pg_sys::ProcessUtility_hook = Some(rag_process_utility);
    }
}

/// The hook itself is deliberately not `#[pg_guard]`: an ERROR raised by the command (or by a hook after us)
/// must travel to PostgreSQL's handler as PostgreSQL raised it, with SQLSTATE, message, detail, hint, position
/// and context intact (PG_RE_THROW semantics), not be caught and rebuilt as a Rust panic. That is sound only
/// because this frame owns nothing that needs dropping: it holds raw pointers and copies of them, so a
/// `longjmp` across it skips no destructor. Our own work runs in `hold_workers_off`, which is guarded.
// SAFETY (for callers): PostgreSQL calls it with the arguments of ProcessUtility(), all valid for the call.
#[allow(clippy::too_many_arguments)]
unsafe extern "C-unwind" fn rag_process_utility(
    pstmt: *mut pg_sys::PlannedStmt,
    query_string: *const std::ffi::c_char,
    read_only_tree: bool,
    context: pg_sys::ProcessUtilityContext::Type,
    params: pg_sys::ParamListInfo,
    query_env: *mut pg_sys::QueryEnvironment,
    dest: *mut pg_sys::DestReceiver,
    qc: *mut pg_sys::QueryCompletion,
) {
    hold_workers_off(pstmt);
    let creates_rag = creates_this_extension(pstmt);
    // SAFETY: the arguments are PostgreSQL's own, passed on unchanged to the next hook or to the standard
    // implementation, exactly as `ProcessUtility()` would have called it without us.
    crate::pg::next_process_utility(
        PREVIOUS_HOOK,
        pstmt,
        query_string,
        read_only_tree,
        context,
        params,
        query_env,
        dest,
        qc,
    );
    if creates_rag {
        start_worker_after_commit();
    }
}

/// True for `CREATE EXTENSION rag`: the launcher has to hear of it, since it does not poll databases.
// SAFETY (for callers): `pstmt` is the hook's own statement pointer, NULL or a valid PlannedStmt.
#[pg_guard]
unsafe extern "C-unwind" fn creates_this_extension(pstmt: *mut pg_sys::PlannedStmt) -> bool {
    if pstmt.is_null() || (*pstmt).utilityStmt.is_null() {
        return false;
    }
    let node = (*pstmt).utilityStmt;
    if (*node).type_ != pg_sys::NodeTag::T_CreateExtensionStmt {
        return false;
    }
    let name = (*(node as *mut pg_sys::CreateExtensionStmt)).extname;
    !name.is_null() && CStr::from_ptr(name).to_bytes() == b"rag"
}

/// Asks the launcher for a worker once the extension is committed (a restore brings pending work with it);
/// before commit the worker would not see the extension yet.
#[pg_guard]
extern "C-unwind" fn start_worker_after_commit() {
    pgrx::register_xact_callback(pgrx::PgXactCallbackEvent::Commit, || {
        registry::request_launcher_for_current_database();
    });
}

/// Before DROP DATABASE and friends: pause the database's workers so the command finds it free.
// SAFETY (for callers): `pstmt` is the hook's own statement pointer, NULL or a valid PlannedStmt.
#[pg_guard]
unsafe extern "C-unwind" fn hold_workers_off(pstmt: *mut pg_sys::PlannedStmt) {
    if pstmt.is_null() {
        return;
    }
    if let Some(name) = database_needing_exclusive_access((*pstmt).utilityStmt) {
        let database = pg_sys::get_database_oid(name, true);
        // Only a caller the command itself would allow (the database's owner or a superuser) may
        // hold the workers off; anyone else's attempt fails in PostgreSQL and changes nothing here.
        if database != pg_sys::InvalidOid && crate::pg::current_user_owns_database(database) {
            registry::pause_database(database, PAUSE);
            registry::stop_workers_of(database);
        }
    }
}

/// The name of the database a utility statement needs exclusive access to, if it is one of those commands.
// SAFETY (for callers): `node` is NULL or a valid parse node; it is cast only after its tag is checked.
unsafe fn database_needing_exclusive_access(
    node: *mut pg_sys::Node,
) -> Option<*const std::ffi::c_char> {
    if node.is_null() {
        return None;
    }
    match (*node).type_ {
        pg_sys::NodeTag::T_DropdbStmt => Some((*(node as *mut pg_sys::DropdbStmt)).dbname),
        pg_sys::NodeTag::T_RenameStmt => {
            let statement = node as *mut pg_sys::RenameStmt;
            ((*statement).renameType == pg_sys::ObjectType::OBJECT_DATABASE)
                .then(|| (*statement).subname.cast_const())
        }
        pg_sys::NodeTag::T_AlterDatabaseStmt => {
            let statement = node as *mut pg_sys::AlterDatabaseStmt;
            option(&(*statement).options, "tablespace").map(|_| (*statement).dbname.cast_const())
        }
        pg_sys::NodeTag::T_CreatedbStmt => {
            let statement = node as *mut pg_sys::CreatedbStmt;
            option(&(*statement).options, "template")
                .map(|template| pg_sys::defGetString(template).cast_const())
        }
        _ => None,
    }
}

/// The `DefElem` called `name` in a statement's option list.
// SAFETY (for callers): `options` is a statement's option list, NIL or a List of DefElem.
unsafe fn option(options: &*mut pg_sys::List, name: &str) -> Option<*mut pg_sys::DefElem> {
    PgList::<pg_sys::DefElem>::from_pg(*options)
        .iter_ptr()
        .find(|&element| {
            !element.is_null()
                && !(*element).defname.is_null()
                && CStr::from_ptr((*element).defname).to_bytes() == name.as_bytes()
        })
}
