//! Commands that need a database to themselves: DROP DATABASE, ALTER DATABASE … RENAME TO, ALTER DATABASE …
//! SET TABLESPACE, and CREATE DATABASE … TEMPLATE of a database in use. A rag worker connected to that
//! database would make them fail with "database is being accessed by other users", which no one who runs
//! `dropdb` or a test runner's "drop the test database" expects from an extension.
//!
//! rag's ProcessUtility hook (`crate::pg`) shows these commands to this module before they run: it holds the launcher off that database for a
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

/// Before a utility command runs (rag's ProcessUtility hook, `crate::pg`, while the library is preloaded):
/// holds the workers off a database the command needs to itself; true for a `CREATE EXTENSION rag` that will
/// create it, after which the launcher must hear of the database. Not when the extension is there already: any
/// role that may connect can run `CREATE EXTENSION IF NOT EXISTS rag` (PostgreSQL skips it before checking a
/// privilege), and each woke the launcher, which took a dormant database's worker back (red team 18).
///
/// # Safety
/// `pstmt` is the hook's own statement pointer, NULL or a valid PlannedStmt.
pub unsafe fn before_command(pstmt: *mut pg_sys::PlannedStmt) -> bool {
    hold_workers_off(pstmt);
    creates_this_extension(pstmt) && !installed_here()
}

/// Whether this database has the extension (committed, or created earlier in this transaction).
fn installed_here() -> bool {
    // SAFETY: a catalog lookup by name in a backend inside a transaction (a utility statement runs in one);
    // with missing_ok it returns InvalidOid rather than raising.
    unsafe { pg_sys::get_extension_oid(c"rag".as_ptr(), true) != pg_sys::InvalidOid }
}

/// After `CREATE EXTENSION rag` ran.
pub fn after_create_extension() {
    start_worker_after_commit();
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
    let statement = (*pstmt).utilityStmt;
    if let Some(name) = database_needing_exclusive_access(statement) {
        let database = pg_sys::get_database_oid(name, true);
        // Only a caller the command itself would allow may hold the workers off (the database's owner or a
        // superuser; for a copy, any role that may create databases when the source is a template); anyone
        // else's attempt fails in PostgreSQL and changes nothing here.
        let copying = !statement.is_null() && (*statement).type_ == pg_sys::NodeTag::T_CreatedbStmt;
        // Asked only of a database that exists: PostgreSQL's ownership check raises for one that does not,
        // which turned a non-superuser's DROP DATABASE IF EXISTS of a missing database into an error.
        let allowed = database != pg_sys::InvalidOid
            && if copying {
                crate::pg::current_user_may_copy_database(database)
            } else {
                crate::pg::current_user_owns_database(database)
            };
        if allowed {
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
