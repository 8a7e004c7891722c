//! Safe wrappers over the PostgreSQL globals and calls that the glue reads in many places. Each `unsafe` is
//! here once, with why it is sound, instead of at every call site.
use pgrx::pg_sys;

/// This process's pid, as PostgreSQL knows it.
pub fn my_pid() -> i32 {
    // SAFETY: MyProcPid is set once when the process starts and only read afterwards; reading an i32
    // global on the process's only PostgreSQL thread cannot race.
    unsafe { pg_sys::MyProcPid }
}

/// The database this backend or worker is connected to (InvalidOid before it connects).
pub fn my_database() -> pg_sys::Oid {
    // SAFETY: MyDatabaseId is set once by InitPostgres and only read here, on PostgreSQL's thread.
    unsafe { pg_sys::MyDatabaseId }
}

/// Whether the PL/pgSQL routine running now may COMMIT: a procedure CALLed at top level outside a transaction
/// block (or from a DO block or procedure that was). Asked from inside that routine, whose SPI connection
/// PostgreSQL opened as atomic or not by exactly that rule. One refusal it cannot foresee: a COMMIT inside a
/// FOR loop over a query that writes (the loop's portal cannot be kept), which raises at the COMMIT.
pub fn routine_may_commit() -> bool {
    // SAFETY: reads the innermost SPI connection's flags (or sees there is none), which only this process's
    // thread changes; it makes the same tests (atomic, inside a subtransaction) as SPI_commit.
    unsafe { pg_sys::SPI_inside_nonatomic_context() }
}

/// True once the postmaster asked this process to shut down (SIGTERM in a background worker).
pub fn shutdown_requested() -> bool {
    // SAFETY: the flag is a sig_atomic_t written by PostgreSQL's signal handler; a volatile read of it is how
    // PostgreSQL's own code polls it.
    unsafe { std::ptr::read_volatile(&raw const pg_sys::ShutdownRequestPending) != 0 }
}

/// Releases the session-level advisory locks this worker holds. rag itself takes only transaction-level ones;
/// a session-level one is a table owner's code's (a watch expression's `pg_advisory_lock`), which would
/// otherwise outlive it in the worker for as long as the worker runs, as a setting did.
pub fn release_session_advisory_locks() {
    // SAFETY: what pg_advisory_unlock_all() and DISCARD ALL call; called between the worker's transactions,
    // where no lock of rag's own is held at session level.
    unsafe { pg_sys::LockReleaseSession(pg_sys::USER_LOCKMETHOD as pg_sys::LOCKMETHODID) };
}

/// Whether the worker is running a table owner's code (a watch's expressions), set by
/// `crate::security::RestrictedIdentity`: a SIGTERM then ends that code at once.
static USER_CODE_RUNNING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Marks the start and end of a table owner's code in the worker. Entering it after a SIGTERM came ends it at
/// its first interrupt check.
pub fn user_code_running(running: bool) {
    USER_CODE_RUNNING.store(running, std::sync::atomic::Ordering::SeqCst);
    // The flag the handler reads is stored before the handler's own flag is read back (same thread).
    std::sync::atomic::compiler_fence(std::sync::atomic::Ordering::SeqCst);
    if running && shutdown_requested() {
        terminate_self();
    }
}

/// SIGTERM (shutdown, `pg_terminate_backend`) for a worker that runs other roles' SQL: the main loop's flag, as
/// pgrx's handler sets it, so that the worker finishes its step and leaves; and, while a table owner's code
/// runs, PostgreSQL's own `die`, so that it ends at its next interrupt check with a FATAL no PL/pgSQL
/// exception handler can catch. With the flag alone, a watch expression that looped catching `query_canceled`
/// kept the worker (and `pg_ctl stop -m fast`) waiting forever.
pub fn terminate_on_sigterm() {
    unsafe extern "C-unwind" fn terminate(signal: std::ffi::c_int) {
        // SAFETY: a signal handler writing the sig_atomic_t flags PostgreSQL's own handlers write and reading
        // an atomic; `die` saves and restores errno itself and only sets flags and this process's latch, as
        // SetLatch does.
        unsafe {
            (&raw mut pg_sys::ShutdownRequestPending).write_volatile(1);
            if USER_CODE_RUNNING.load(std::sync::atomic::Ordering::SeqCst) {
                pg_sys::die(signal);
            } else {
                pg_sys::SetLatch(pg_sys::MyLatch);
            }
        }
    }
    // SAFETY: replaces this process's SIGTERM handler, as background workers do at their start.
    unsafe {
        #[cfg(not(feature = "pg18"))]
        pg_sys::pqsignal(pg_sys::SIGTERM as std::ffi::c_int, Some(terminate));
        #[cfg(feature = "pg18")]
        pg_sys::pqsignal_be(pg_sys::SIGTERM as std::ffi::c_int, Some(terminate));
    }
}

/// Makes this process end at its next interrupt check, with the FATAL of a terminated worker: what SIGTERM
/// does ([`terminate_on_sigterm`]), for a deadline the worker set itself.
pub fn terminate_self() {
    // SAFETY: `die` only sets PostgreSQL's interrupt flags and this process's latch (saving errno), which is
    // safe from the main thread and from a timeout handler alike.
    unsafe { pg_sys::die(pg_sys::SIGTERM as std::ffi::c_int) };
}

/// Answers the cluster-wide barriers other backends wait on (DROP DATABASE, ALTER DATABASE SET TABLESPACE, DROP
/// TABLESPACE make every process close its files of the database first), as CHECK_FOR_INTERRUPTS would. A
/// worker waiting for a provider's answer polls this: otherwise a slow provider, or one a `rag_admin` points at
/// a server that answers after an hour, would hold up DROP DATABASE of any database in the cluster that long.
pub fn absorb_signal_barriers() {
    // SAFETY: the flag is a sig_atomic_t set by PostgreSQL's signal handler (a volatile read, as PostgreSQL's
    // INTERRUPTS_PENDING_CONDITION does); ProcessProcSignalBarrier is what ProcessInterrupts calls for it, and
    // the worker polls from a place where an interrupt check is allowed (no lock or borrow of ours held).
    unsafe {
        if std::ptr::read_volatile(&raw const pg_sys::ProcSignalBarrierPending) != 0 {
            pg_sys::ProcessProcSignalBarrier();
        }
    }
}

/// Re-reads postgresql.conf after a SIGHUP, as PostgreSQL's own processes do in their main loops.
pub fn reload_configuration() {
    // SAFETY: called from a background worker's main loop, outside any transaction and with no PostgreSQL
    // state borrowed, which is where PostgreSQL itself calls it.
    unsafe { pg_sys::ProcessConfigFile(pg_sys::GucContext::PGC_SIGHUP) };
}

/// True on a hot standby (and during crash recovery).
pub fn in_recovery() -> bool {
    // SAFETY: a plain function call that reads shared memory under its own locking; it never raises.
    unsafe { pg_sys::RecoveryInProgress() }
}

/// True in a background worker, false in a client backend.
pub fn is_background_worker() -> bool {
    // MyBackendType rather than IsBackgroundWorker, which PostgreSQL 18 removed.
    // SAFETY: MyBackendType is set once at process start and only read afterwards.
    unsafe { pg_sys::MyBackendType == pg_sys::BackendType::B_BG_WORKER }
}

static IN_RAG_WORKER: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Called once by a rag worker when it starts: this process is one of rag's workers (not a parallel worker,
/// which is a background worker as well, nor another extension's).
pub fn mark_rag_worker() {
    IN_RAG_WORKER.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// True in one of rag's own workers.
pub fn is_rag_worker() -> bool {
    IN_RAG_WORKER.load(std::sync::atomic::Ordering::Relaxed)
}

/// Whether a transaction callback's event ends the transaction (committed, aborted or prepared, in a backend or
/// a parallel worker): what the backend keeps per transaction is forgotten there.
pub fn ends_transaction(event: pg_sys::XactEvent::Type) -> bool {
    matches!(
        event,
        pg_sys::XactEvent::XACT_EVENT_COMMIT
            | pg_sys::XactEvent::XACT_EVENT_ABORT
            | pg_sys::XactEvent::XACT_EVENT_PREPARE
            | pg_sys::XactEvent::XACT_EVENT_PARALLEL_COMMIT
            | pg_sys::XactEvent::XACT_EVENT_PARALLEL_ABORT
    )
}

/// What `ALTER DATABASE … SET` gave this worker's session, and the value the server's configuration gives each
/// instead (`learn_database_defaults`); `settle_worker_session` applies them.
#[derive(Default)]
struct DatabaseDefaults {
    /// Every setting ever undone: once undone, its source is this session, so a reload finds it by name.
    names: Vec<String>,
    values: Vec<(std::ffi::CString, std::ffi::CString)>,
}

thread_local! {
    static DATABASE_DEFAULTS: std::cell::RefCell<DatabaseDefaults> =
        std::cell::RefCell::new(DatabaseDefaults::default());
}

/// Reads which settings this worker's session took from its database's defaults (`ALTER DATABASE … SET`, which
/// the database's owner may run, superuser or not) and what the server's configuration (its files, else the
/// built-in default) gives each: a database's owner must not set the session of the superuser process that
/// serves every role of the database (`exit_on_error` made each ERROR the worker catches a FATAL, and another
/// owner's document was given up as one that kept stopping its worker; `maintenance_work_mem` would size its
/// index builds). rag's own settings stay as the database sets them (the database's rag defaults are its
/// owner's to choose, and none of them is one a superuser alone may set), and so do the ones the worker
/// settles itself; nor `client_encoding`, whose built-in default is not the one a session gets (the database's
/// encoding), and which a worker with no client does not use. A value given on the server's command line is not
/// known here once the database overrode it: the file's or PostgreSQL's own is used. Called in a transaction at
/// the worker's start and after a reload (the names are kept: once undone, their source is this session).
pub fn learn_database_defaults() -> Result<(), pgrx::spi::Error> {
    let known = DATABASE_DEFAULTS.with_borrow(|defaults| defaults.names.clone());
    // PL/pgSQL's settings exist only once it is loaded; until then a database's `plpgsql.variable_conflict`
    // waits as a placeholder that pg_settings does not list, and would take effect in rag's functions later.
    pgrx::Spi::run("DO $$ BEGIN END $$")?;
    let rows = pgrx::Spi::connect(|client| {
        let table = client.select(
            "SELECT s.name, coalesce((SELECT f.setting FROM pg_catalog.pg_file_settings f
                                       WHERE pg_catalog.lower(f.name) = pg_catalog.lower(s.name) AND f.error IS NULL
                                       ORDER BY f.seqno DESC LIMIT 1), s.boot_val)
               FROM pg_catalog.pg_settings s
              WHERE (s.source IN ('database', 'database user') OR s.name = ANY ($1))
                AND s.name NOT LIKE 'rag.%'
                AND s.name NOT IN ('role', 'session_authorization', 'synchronous_commit', 'client_encoding')",
            None,
            &[known.into()],
        )?;
        let mut rows = Vec::new();
        for row in table {
            if let (Some(name), Some(value)) = (row.get::<String>(1)?, row.get::<String>(2)?) {
                rows.push((name, value));
            }
        }
        Ok::<_, pgrx::spi::Error>(rows)
    })?;
    let names = rows.iter().map(|(name, _)| name.clone()).collect();
    let values = rows
        .into_iter()
        .filter_map(|(name, value)| {
            Some((
                std::ffi::CString::new(name).ok()?,
                std::ffi::CString::new(value).ok()?,
            ))
        })
        .collect();
    DATABASE_DEFAULTS.set(DatabaseDefaults { names, values });
    Ok(())
}

/// Settles a background worker's session right after it connects, before anything runs in it. The workers run
/// as the bootstrap superuser, and the database's and role's defaults (`ALTER DATABASE … SET`, which a
/// database's owner may run for settings any user may set) apply to them at connection. So:
/// - `search_path = pg_catalog, pg_temp`: no schema where others may create objects goes on their path (a
///   closer overload there, or one a database owner's setting puts first, would run with that superuser's
///   rights); rag's functions pin their own path themselves;
/// - `role = none`, and the defaults that would stop the worker from doing its job (read-only transactions,
///   SERIALIZABLE, statement, idle and transaction timeouts, non-standard strings) at PostgreSQL's own
///   defaults: `ALTER DATABASE d SET role = x` made every worker of the database run as x and fail from then
///   on;
/// - every other setting the database's defaults gave, at the server's own value (`learn_database_defaults`),
///   rag's own excepted.
///
/// Session-level settings, as SET would make: they outrank the database's and role's defaults, and a
/// function's SET clause (also session-level) still replaces them while that function runs.
pub fn settle_worker_session() {
    DATABASE_DEFAULTS.with_borrow(|defaults| {
        for (name, value) in &defaults.values {
            // WARNING, not ERROR, for a value the server would not take (none is expected: it is the server's
            // own): logged, and the database's value stays for that setting.
            set_for_session(name, value, pg_sys::WARNING as i32);
        }
    });
    // A database's owner may `ALTER DATABASE … SET session_authorization` (any role may set it, the check is
    // whether the session may become that role, which a superuser may): the worker then ran as that role, and
    // every step was refused at rag's schema. It is given back the identity it connected with, before `role`
    // below resolves "none" to the session's user.
    // SAFETY: plain reads of the session's identities, and the assignment PostgreSQL's own
    // `SET SESSION AUTHORIZATION DEFAULT` makes, with no catalog access (this may run between transactions).
    // The launcher and the workers connect without a user name, as the bootstrap superuser: a superuser.
    unsafe {
        let connected_as = pg_sys::GetAuthenticatedUserId();
        if pg_sys::GetSessionUserId() != connected_as {
            pg_sys::SetSessionAuthorization(connected_as, true);
        }
    }
    let settings: &[(&std::ffi::CStr, &std::ffi::CStr)] = &[
        (c"search_path", c"pg_catalog, pg_temp"),
        (c"role", c"none"),
        (c"default_transaction_read_only", c"off"),
        (c"default_transaction_isolation", c"read committed"),
        (c"default_transaction_deferrable", c"off"),
        (c"statement_timeout", c"0"),
        (c"lock_timeout", c"0"),
        (c"idle_in_transaction_session_timeout", c"0"),
        // Set before anything else runs (the database's other defaults are read in a transaction first): with
        // it on, every ERROR the worker catches and records became a FATAL that ended the worker.
        (c"exit_on_error", c"off"),
        // rag's SQL is written for standard strings (its functions pin it too; the worker's own queries do not).
        (c"standard_conforming_strings", c"on"),
        // PostgreSQL 17 added a timeout that ends the whole session (FATAL) when a transaction runs longer.
        #[cfg(any(feature = "pg17", feature = "pg18"))]
        (c"transaction_timeout", c"0"),
    ];
    for (name, value) in settings {
        // None of these settings' check or assign hooks needs a transaction for these values: search_path's
        // only parses and marks the cached path stale, role's resolves "none" without a catalog lookup, the
        // others are plain values.
        set_for_session(name, value, pg_sys::PGERROR as i32);
    }
}

/// A session-level setting, as SET makes it; a value the setting refuses is reported at `elevel`.
fn set_for_session(name: &std::ffi::CStr, value: &std::ffi::CStr, elevel: i32) {
    // SAFETY: NUL-terminated strings that outlive the call; what SetConfigOption does, with the report level
    // chosen by the caller.
    unsafe {
        pg_sys::set_config_option(
            name.as_ptr(),
            value.as_ptr(),
            pg_sys::GucContext::PGC_SUSET,
            pg_sys::GucSource::PGC_S_SESSION,
            pg_sys::GucAction::GUC_ACTION_SET,
            true,
            elevel,
            false,
        )
    };
}

static LOADED_BY_POSTMASTER: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// Called from `_PG_init`: remembers, for every backend the postmaster forks afterwards, that the library came
/// from shared_preload_libraries.
pub fn remember_how_loaded() {
    if preloading() {
        LOADED_BY_POSTMASTER.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Whether rag was in shared_preload_libraries, so that its settings existed in this backend before any SQL
/// ran. Otherwise a `rag.*` value from the configuration is, until the library loads in a session, a
/// placeholder PostgreSQL shows to every role.
pub fn loaded_by_postmaster() -> bool {
    LOADED_BY_POSTMASTER.load(std::sync::atomic::Ordering::Relaxed)
}

/// True while the postmaster loads shared_preload_libraries, the only time shared memory, background
/// workers and hooks may be registered.
pub fn preloading() -> bool {
    // SAFETY: a bool global set and cleared by the postmaster around loading the preload libraries; _PG_init
    // reads it in the same single-threaded process.
    unsafe { pg_sys::process_shared_preload_libraries_in_progress }
}

/// Whether the current user owns the database (or is a superuser): who PostgreSQL lets drop or rename it.
/// PostgreSQL 16 folded the per-kind ownership checks into `object_ownercheck`.
pub fn current_user_owns_database(database: pg_sys::Oid) -> bool {
    // SAFETY: both calls read the syscache by oid; for an oid with no database they raise (callers pass only an
    // existing database's oid), as on a corrupt catalog, which reaches the caller's pg_guard.
    #[cfg(any(feature = "pg13", feature = "pg14", feature = "pg15"))]
    unsafe {
        pg_sys::pg_database_ownercheck(database, pg_sys::GetUserId())
    }
    // SAFETY: as above.
    #[cfg(not(any(feature = "pg13", feature = "pg14", feature = "pg15")))]
    unsafe {
        pg_sys::object_ownercheck(pg_sys::DatabaseRelationId, database, pg_sys::GetUserId())
    }
}

/// Whether the current user may copy the database with CREATE DATABASE … TEMPLATE, as PostgreSQL decides it: a
/// role that may create databases (a superuser or CREATEDB), and the database marked as a template or owned by
/// the role.
pub fn current_user_may_copy_database(database: pg_sys::Oid) -> bool {
    // SAFETY: syscache lookups by oid of the current user and of a valid database oid; each tuple is checked for
    // NULL, read as its catalog's fixed-size struct and released before returning.
    unsafe {
        let user = pg_sys::GetUserId();
        let may_create = pg_sys::superuser() || {
            let role = pg_sys::SearchSysCache1(
                pg_sys::SysCacheIdentifier::AUTHOID as std::ffi::c_int,
                pg_sys::Datum::from(user),
            );
            if role.is_null() {
                false
            } else {
                let createdb = (*pg_sys::heap_tuple_get_struct::<pg_sys::FormData_pg_authid>(role))
                    .rolcreatedb;
                pg_sys::ReleaseSysCache(role);
                createdb
            }
        };
        if !may_create {
            return false;
        }
        let row = pg_sys::SearchSysCache1(
            pg_sys::SysCacheIdentifier::DATABASEOID as std::ffi::c_int,
            pg_sys::Datum::from(database),
        );
        if row.is_null() {
            return false;
        }
        let template =
            (*pg_sys::heap_tuple_get_struct::<pg_sys::FormData_pg_database>(row)).datistemplate;
        pg_sys::ReleaseSysCache(row);
        template || current_user_owns_database(database)
    }
}

/// What this process is doing, as `pg_stat_activity` shows it: `state` active with `query` set to `activity`,
/// or idle (the last activity stays in `query`, as an idle client session's last statement does). Background workers report nothing unless they call this (only a client backend's
/// statements are reported by PostgreSQL itself), so without it a DBA sees a rag worker with an empty query.
pub fn report_activity(activity: Option<&str>) {
    match activity {
        Some(text) => {
            // An interior NUL cannot come from the texts the worker builds (numbers and fixed words); should one
            // appear, the report is cut there rather than skipped.
            let text = std::ffi::CString::new(text.split('\0').next().unwrap_or_default())
                .unwrap_or_default();
            // SAFETY: called on PostgreSQL's thread of a process attached to shared memory; the string is
            // NUL-terminated and lives across the call, which copies it (truncated to track_activity_query_size).
            unsafe {
                pg_sys::pgstat_report_activity(pg_sys::BackendState::STATE_RUNNING, text.as_ptr())
            };
        }
        // SAFETY: as above; a null command is how PostgreSQL itself reports a backend gone idle.
        None => unsafe {
            pg_sys::pgstat_report_activity(pg_sys::BackendState::STATE_IDLE, std::ptr::null())
        },
    }
}

/// Hands what this process's transactions counted (rows inserted, updated and deleted, dead rows, scans) to the
/// shared statistics, outside a transaction. A backend does it as it goes idle (PostgresMain); a background
/// worker must do it itself, and rag's workers never did: while a worker lived, autovacuum and autoanalyze saw
/// none of its writes (dead rows of rag.queue and rag.documents piled up unvacuumed, a new partition of
/// rag.chunks was never analyzed), and the counts came in only when it exited (red team 17). Unforced, a call
/// within a second of the last flush, or while another process holds the shared entries, leaves the counts
/// pending for a later call rather than waiting.
pub fn flush_statistics(force: bool) {
    // SAFETY: called on PostgreSQL's thread of a background worker attached to shared memory, between
    // transactions (after a commit or an abort), where PostgreSQL's own workers flush theirs.
    unsafe {
        pg_sys::pgstat_report_stat(force);
    }
}

// PostgreSQL's own entry points for rag's hooks, declared here rather than taken from `pg_sys`: pgrx's bindings
// catch any ERROR raised below them and re-raise a copy without the error's cursor position and context lines.
// Every statement of every database passes through these hooks, so their errors must reach clients untouched.
extern "C-unwind" {
    #[link_name = "standard_ExecutorFinish"]
    pub fn standard_executor_finish_unguarded(query_desc: *mut pg_sys::QueryDesc);
    #[link_name = "standard_ProcessUtility"]
    fn standard_process_utility_unguarded(
        pstmt: *mut pg_sys::PlannedStmt,
        query_string: *const std::ffi::c_char,
        read_only_tree: bool,
        context: pg_sys::ProcessUtilityContext::Type,
        params: pg_sys::ParamListInfo,
        query_env: *mut pg_sys::QueryEnvironment,
        dest: *mut pg_sys::DestReceiver,
        qc: *mut pg_sys::QueryCompletion,
    );
}

/// The oid of function `rag.<name>(argument_types)` of the `rag` extension, found in the catalog by schema,
/// name and argument types as PostgreSQL finds a trigger's function: no privilege of the caller's is checked
/// (rag calls such functions for roles without USAGE on its schema, and they run as rag's owner) and no
/// search_path or type name is parsed. InvalidOid when this database has no such member of the extension: a
/// schema named `rag` that anyone with CREATE on a database made, holding a function of that name, is not
/// rag's and is never called (it would run with the rights of whoever ran the command).
pub fn rag_function(name: &std::ffi::CStr, argument_types: &[pg_sys::Oid]) -> pg_sys::Oid {
    // SAFETY: catalog lookups by key inside a transaction; get_extension_oid and get_namespace_oid with
    // missing_ok never raise, buildoidvector copies the array into a palloc'd vector, and the syscache reads
    // the NUL-terminated name and the vector only for the call; getExtensionOfObject reads pg_depend.
    unsafe {
        let extension = pg_sys::get_extension_oid(c"rag".as_ptr(), true);
        let schema = pg_sys::get_namespace_oid(c"rag".as_ptr(), true);
        if extension == pg_sys::InvalidOid || schema == pg_sys::InvalidOid {
            return pg_sys::InvalidOid;
        }
        let arguments = pg_sys::buildoidvector(
            argument_types.as_ptr(),
            argument_types.len() as std::ffi::c_int,
        );
        let function = pg_sys::GetSysCacheOid(
            pg_sys::SysCacheIdentifier::PROCNAMEARGSNSP as std::ffi::c_int,
            pg_sys::Anum_pg_proc_oid as pg_sys::AttrNumber,
            pg_sys::Datum::from(name.as_ptr()),
            pg_sys::Datum::from(arguments),
            pg_sys::Datum::from(schema),
            pg_sys::Datum::from(0),
        );
        if function == pg_sys::InvalidOid
            || pg_sys::getExtensionOfObject(pg_sys::ProcedureRelationId, function) != extension
        {
            return pg_sys::InvalidOid;
        }
        function
    }
}

static mut PREVIOUS_PROCESS_UTILITY: pg_sys::ProcessUtility_hook_type = None;
static mut SERVES_DATABASE_COMMANDS: bool = false;

/// Installs rag's one ProcessUtility hook; called once per process from `_PG_init`. Every backend that loads
/// the library needs its `COPY … FROM` part (`crate::api::watch_keys`); the part that keeps workers out of a
/// database's way (`crate::worker::database_commands`) only a preloaded library serves, the launcher and its
/// shared memory being there.
pub fn install_process_utility(preloaded: bool) {
    // SAFETY: `_PG_init` runs once per process on its only thread, before any statement: nothing reads or
    // writes these variables concurrently; the previous hook is kept and always called.
    unsafe {
        SERVES_DATABASE_COMMANDS = preloaded;
        PREVIOUS_PROCESS_UTILITY = pg_sys::ProcessUtility_hook;
        pg_sys::ProcessUtility_hook = Some(rag_process_utility);
    }
}

/// The hook itself is deliberately not `#[pg_guard]`: an ERROR raised by the command (or by a hook after us)
/// must travel to PostgreSQL's handler as PostgreSQL raised it, with SQLSTATE, message, detail, hint, position
/// and context intact (PG_RE_THROW semantics), not be caught and rebuilt as a Rust panic. That is sound only
/// because this frame owns nothing that needs dropping: it holds raw pointers and copies of them, so a
/// `longjmp` across it skips no destructor. rag's own work runs in guarded functions.
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
    // SAFETY: set once by `install_process_utility` before any statement, only read since; `pstmt` is the
    // hook's own statement pointer, read (never freed) before the command runs.
    let creates_rag =
        SERVES_DATABASE_COMMANDS && crate::worker::database_commands::before_command(pstmt);
    // SAFETY: as above.
    let is_copy = crate::api::watch_keys::is_copy(pstmt);
    // SAFETY: as above.
    let commits_prepared = crate::worker::wake::is_commit_prepared(pstmt);
    // SAFETY: as above.
    crate::api::roles::before_command(pstmt);
    let next = PREVIOUS_PROCESS_UTILITY.unwrap_or(standard_process_utility_unguarded);
    // SAFETY: PostgreSQL's own arguments passed on unchanged to the next hook or to the standard
    // implementation, exactly as ProcessUtility() would have called it without us.
    next(
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
        crate::worker::database_commands::after_create_extension();
    }
    if is_copy {
        crate::api::watch_keys::after_copy();
    }
    if commits_prepared {
        crate::worker::registry::wake_running_workers_of_current_database();
    }
    // SAFETY: as above; the statement is the one that just ran.
    crate::api::roles::after_command(pstmt);
}

/// A jsonb value as PostgreSQL holds it, passed through without pgrx's `JsonB`, which prints it and parses it
/// into serde values (and back again to return it). `rag._query_as` returns its query's value this way (four
/// copies of a watched row's content fewer: the worker held a 20 MB row about ten times over), and
/// `rag_ingest_file` takes its metadata this way, so that 44 MB of JSON is measured against its 64 kB bound before
/// anything copies it (the serde tree took 880 MB more, and a failed allocation there aborted the server: red
/// team 22).
pub struct RawJsonb(pg_sys::Datum);

impl RawJsonb {
    /// The same datum again, to pass to a query while this one is kept for another.
    pub fn borrowed(&self) -> RawJsonb {
        RawJsonb(self.0)
    }

    /// The value of a column of an SPI result row, copied out of SPI's memory into the memory that was current
    /// when the connection opened. In `rag._query_as` that is the set-returning function's own (pgrx runs its
    /// first call in `multi_call_memory_ctx`), which lasts until its last row is read; called from Rust
    /// directly, the copy would live only as long as the caller's context.
    ///
    /// # Safety
    /// An SPI connection is open, and `datum` is a non-null varlena (a jsonb) of its current result.
    pub unsafe fn transferred(datum: pg_sys::Datum) -> RawJsonb {
        // SAFETY: the caller's promise above; SPI_datumTransfer copies the value into the upper executor context
        // and returns the copy.
        RawJsonb(unsafe { pg_sys::SPI_datumTransfer(datum, false, -1) })
    }
}

impl pgrx::datum::IntoDatum for RawJsonb {
    fn into_datum(self) -> Option<pg_sys::Datum> {
        Some(self.0)
    }

    fn type_oid() -> pg_sys::Oid {
        pg_sys::JSONBOID
    }
}

impl pgrx::datum::FromDatum for RawJsonb {
    unsafe fn from_polymorphic_datum(
        datum: pg_sys::Datum,
        is_null: bool,
        _: pg_sys::Oid,
    ) -> Option<Self> {
        // The datum stays the caller's: valid for the call it is an argument of, which is as long as it is used.
        (!is_null).then_some(RawJsonb(datum))
    }
}

// SAFETY: an argument declared jsonb (SqlTranslatable below), taken as its datum; NULL is None.
unsafe impl<'fcx> pgrx::callconv::ArgAbi<'fcx> for RawJsonb {
    unsafe fn unbox_arg_unchecked(arg: pgrx::callconv::Arg<'_, 'fcx>) -> Self {
        let index = arg.index();
        // SAFETY: the caller's promise that the argument is a jsonb datum.
        unsafe { arg.unbox_arg_using_from_datum() }
            .unwrap_or_else(|| panic!("argument {index} must not be null"))
    }

    unsafe fn unbox_nullable_arg(
        arg: pgrx::callconv::Arg<'_, 'fcx>,
    ) -> pgrx::nullable::Nullable<Self> {
        // SAFETY: as above.
        unsafe { arg.unbox_arg_using_from_datum() }.into()
    }
}

// SAFETY: the datum is a jsonb allocated in memory that outlives the call (see `transferred`), returned as is.
unsafe impl pgrx::callconv::BoxRet for RawJsonb {
    unsafe fn box_into<'fcx>(
        self,
        fcinfo: &mut pgrx::callconv::FcInfo<'fcx>,
    ) -> pgrx::datum::Datum<'fcx> {
        // SAFETY: a valid jsonb datum, see above.
        unsafe { fcinfo.return_raw_datum(self.0) }
    }
}

// SAFETY: it is a jsonb in SQL, as `type_oid` says.
unsafe impl pgrx::pgrx_sql_entity_graph::metadata::SqlTranslatable for RawJsonb {
    const TYPE_IDENT: &'static str = pgrx::pgrx_resolved_type!(RawJsonb);
    const TYPE_ORIGIN: pgrx::pgrx_sql_entity_graph::metadata::TypeOrigin =
        pgrx::pgrx_sql_entity_graph::metadata::TypeOrigin::External;
    const ARGUMENT_SQL: Result<
        pgrx::pgrx_sql_entity_graph::metadata::SqlMappingRef,
        pgrx::pgrx_sql_entity_graph::metadata::ArgumentError,
    > = Ok(pgrx::pgrx_sql_entity_graph::metadata::SqlMappingRef::literal("jsonb"));
    const RETURN_SQL: Result<
        pgrx::pgrx_sql_entity_graph::metadata::ReturnsRef,
        pgrx::pgrx_sql_entity_graph::metadata::ReturnsError,
    > = Ok(pgrx::pgrx_sql_entity_graph::metadata::ReturnsRef::One(
        pgrx::pgrx_sql_entity_graph::metadata::SqlMappingRef::literal("jsonb"),
    ));
}
