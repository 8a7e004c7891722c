//! Running SQL that a user wrote (watch expressions) with that user's rights and nothing more, and checking
//! that such SQL is one expression, with PostgreSQL's own parser.
//!
//! The identity switch is the one PostgreSQL makes for code it runs on a table owner's behalf (index
//! expressions, ANALYZE, REFRESH MATERIALIZED VIEW): `SetUserIdAndSecContext` with
//! `SECURITY_RESTRICTED_OPERATION`, inside a new GUC nest level. Inside it `SET ROLE`, `set_config('role', …)`,
//! temporary objects and the other escapes PostgreSQL forbids there all fail, so an expression cannot take
//! more rights than its author has.
use pgrx::pg_sys;
use pgrx::pg_sys::panic::CaughtError;
use pgrx::prelude::*;
use std::ffi::CString;

/// `STATEMENT_TIMEOUT` in PostgreSQL's `TimeoutId` enum (utils/timeout.h), which pgrx does not bind; it has
/// been the fourth entry since the enum was introduced, in every supported major.
const STATEMENT_TIMEOUT_ID: std::ffi::c_int = 3;

/// `USER_TIMEOUT` in the same enum: the first id a module may register. PostgreSQL 17 added
/// TRANSACTION_TIMEOUT before it.
#[cfg(any(feature = "pg17", feature = "pg18"))]
const USER_TIMEOUT_ID: std::ffi::c_int = 13;
#[cfg(not(any(feature = "pg17", feature = "pg18")))]
const USER_TIMEOUT_ID: std::ffi::c_int = 12;

// Declared here because pgrx does not bind utils/timeout.h; the signatures are PostgreSQL's.
extern "C-unwind" {
    fn enable_timeout_after(id: std::ffi::c_int, delay_ms: std::ffi::c_int);
    fn disable_timeout(id: std::ffi::c_int, keep_indicator: bool);
    fn RegisterTimeout(
        id: std::ffi::c_int,
        handler: Option<unsafe extern "C-unwind" fn()>,
    ) -> std::ffi::c_int;
}

/// A watch expression's code may catch the statement timeout's cancel (PL/pgSQL `EXCEPTION WHEN
/// query_canceled`) and go on, holding the worker, its database's other collections and a cluster worker slot
/// for ever. Past this second deadline the worker ends itself (FATAL, which no handler catches) and the
/// launcher starts another; the row backs off (rag._claim_row).
fn hard_deadline_ms(timeout_ms: i32) -> i32 {
    timeout_ms
        .saturating_mul(2)
        .max(timeout_ms.saturating_add(5_000))
}

/// Registers the hard deadline's timeout in this worker now, at its start.
pub fn register_hard_deadline() {
    hard_deadline_timeout();
}

/// The registered id of the hard deadline's timeout in this process, registered on first use.
fn hard_deadline_timeout() -> std::ffi::c_int {
    thread_local! {
        static REGISTERED: std::cell::Cell<Option<std::ffi::c_int>> = const { std::cell::Cell::new(None) };
    }
    unsafe extern "C-unwind" fn passed() {
        // Called from PostgreSQL's SIGALRM handler: only flags and the latch, as `die` does.
        crate::pg::terminate_self();
    }
    REGISTERED.with(|registered| {
        registered.get().unwrap_or_else(|| {
            // SAFETY: registers a handler in this process's timeout table, as modules do. It raises FATAL
            // when all of USER_TIMEOUT's ten slots are taken; the worker registers it when it starts
            // (`register_hard_deadline`), not in the middle of a row.
            let id = unsafe { RegisterTimeout(USER_TIMEOUT_ID, Some(passed)) };
            registered.set(Some(id));
            id
        })
    })
}

/// While alive, the current user is `role` in a security-restricted operation, with
/// `standard_conforming_strings = on` so that user SQL is tokenised exactly as it was when it was checked.
/// Dropped normally, it restores identity and every setting (whatever the SQL set, for the session too). On an ERROR it restores nothing itself: the
/// (sub)transaction abort that follows every ERROR resets the user id, security context and GUC nest level to
/// what they were when the (sub)transaction began, which is how PostgreSQL's own callers rely on it too.
pub struct RestrictedIdentity {
    saved_user: pg_sys::Oid,
    saved_context: std::ffi::c_int,
    guc_level: std::ffi::c_int,
    timeout_armed: bool,
}

impl RestrictedIdentity {
    /// Becomes `role` for the SQL run while the guard lives. `timeout_ms > 0` arms a statement timeout for
    /// that SQL, for callers (the worker) where no client statement timeout applies. `search_path`, when
    /// given, is in force until the guard drops (it is only ever the path of the role entered, at its call).
    pub fn enter(role: pg_sys::Oid, timeout_ms: i32, search_path: Option<&str>) -> Self {
        let mut saved_user = pg_sys::InvalidOid;
        let mut saved_context: std::ffi::c_int = 0;
        // SAFETY: both pointers are to live locals; these calls only read and write process-global state that
        // PostgreSQL's own callers manipulate the same way, on this (the only PostgreSQL) thread.
        let guc_level = unsafe {
            pg_sys::GetUserIdAndSecContext(&mut saved_user, &mut saved_context);
            pg_sys::SetUserIdAndSecContext(
                role,
                saved_context
                    | pg_sys::SECURITY_LOCAL_USERID_CHANGE as std::ffi::c_int
                    | pg_sys::SECURITY_RESTRICTED_OPERATION as std::ffi::c_int,
            );
            pg_sys::NewGUCNestLevel()
        };
        set_local("standard_conforming_strings", "on");
        if let Some(search_path) = search_path {
            set_local("search_path", search_path);
        }
        let timeout_armed = timeout_ms > 0;
        if timeout_armed {
            crate::pg::user_code_running(true);
            let hard_deadline = hard_deadline_timeout();
            // SAFETY: the STATEMENT_TIMEOUT reason is registered by InitPostgres in every backend and
            // background worker; arming it is what postgres.c does at the start of each statement. The hard
            // deadline's reason was registered just above.
            unsafe {
                enable_timeout_after(STATEMENT_TIMEOUT_ID, timeout_ms);
                enable_timeout_after(hard_deadline, hard_deadline_ms(timeout_ms));
            }
        }
        RestrictedIdentity {
            saved_user,
            saved_context,
            guc_level,
            timeout_armed,
        }
    }
}

impl Drop for RestrictedIdentity {
    fn drop(&mut self) {
        if self.timeout_armed {
            // Always, errors included: no abort path disarms it in a background worker, and a timer left
            // armed would cancel whatever the worker does next.
            // SAFETY: disarming a timeout never raises; it only edits the timeout table of this process.
            unsafe {
                disable_timeout(STATEMENT_TIMEOUT_ID, false);
                disable_timeout(hard_deadline_timeout(), false);
            }
            crate::pg::user_code_running(false);
        }
        if std::thread::panicking() {
            // An ERROR is on its way to the abort that restores everything (see the type's comment); calling
            // into PostgreSQL while unwinding could only raise a second error.
            return;
        }
        // Every setting changed since `enter` is undone, session-level ones included, as PostgreSQL does after
        // an index expression or a materialized view's query: the user's code must not leave a
        // `set_config(…, false)` behind (a search_path naming their schema ahead of pg_catalog stayed in force in
        // the worker, which runs as a superuser, and made the next unqualified `now()` theirs).
        // SAFETY: the values restored are the ones saved in `enter`, on the same thread, at the same
        // transaction nesting (the guard never outlives the SPI call it wraps).
        unsafe {
            pg_sys::AtEOXact_GUC(false, self.guc_level);
            pg_sys::SetUserIdAndSecContext(self.saved_user, self.saved_context);
        }
    }
}

/// The role the extension acts for when a SECURITY DEFINER function of it checks privileges: the identity the
/// entry point of rag that is running was called with (PostgreSQL's current user at the call, recorded by
/// [`crate::frames`]). Refused in a parallel worker, which has none of the leader's frames, and where the
/// frames cannot say ([`crate::frames::CallerUnknown`]). Called only by `rag._calling_role()`, whose own frame
/// the stack must end with.
///
/// Inside a security-restricted operation rag refuses to act: PostgreSQL (index expressions, REFRESH
/// MATERIALIZED VIEW, VACUUM and ANALYZE) and the extension itself (watch expressions, [`RestrictedIdentity`];
/// a watch's trigger, [`restrict_current_user`]) run a table owner's code there under restrictions that rag's
/// own work (grants, provider calls, writes to its tables) would step outside of.
pub fn calling_role() -> pg_sys::Oid {
    caller().role
}

/// The caller of rag's entry point with the `search_path` it had when it called ([`crate::frames::Caller`]),
/// under the refusals described at [`calling_role`]; the path is `None` where nothing was recorded. A reader's
/// row checks run the watched table's policies as that role with that path (`rag._calling_identity()`).
pub fn caller() -> crate::frames::Caller {
    // SAFETY: reads process-global state of this backend, on its only thread.
    if unsafe { pg_sys::InSecurityRestrictedOperation() } {
        crate::error::RagError::InsufficientPrivilege {
            message: "rag cannot act for a caller inside a security-restricted operation".into(),
            hint: "Index expressions, a materialized view's query, code run by VACUUM or ANALYZE and a watch's \
                   expressions run with their author's rights under PostgreSQL's restrictions, where rag cannot \
                   tell whose rights those are; call rag's functions from ordinary SQL."
                .into(),
        }
        .raise()
    }
    recorded_caller()
}

/// The caller the frames recorded for rag's entry point, or an ERROR saying why they cannot tell. A parallel
/// worker starts with the leader's outer role and none of its running functions: it cannot tell, and nothing
/// in rag needs to act for a caller there.
fn recorded_caller() -> crate::frames::Caller {
    // SAFETY: a backend global, set once when a parallel worker starts (-1 elsewhere).
    if unsafe { pg_sys::ParallelWorkerNumber } >= 0 {
        crate::error::RagError::InsufficientPrivilege {
            message: "rag cannot act for a caller inside a parallel worker".into(),
            hint: "Call rag's functions from a function that is not marked PARALLEL SAFE.".into(),
        }
        .raise()
    }
    match crate::frames::entry_point_caller() {
        Ok(caller) => caller,
        Err(why) => crate::error::RagError::InsufficientPrivilege {
            message: why.message().into(),
            hint: why.hint().into(),
        }
        .raise(),
    }
}

/// Raises unless whoever asks may be told what `role` may see. The policies and views that narrow rag's tables
/// pass `current_user` to the functions that list a role's collections and watches (`rag._collections_with`
/// and the like); those functions run as rag's owner and are executable by every reader, so without this a
/// reader could name another role and learn which collections it may read. Allowed: the role the function's
/// wrapper was called as ([`crate::frames::wrapper_identity`]: the `current_user` of the asking statement,
/// which is what the policies pass), and, for rag's own checks on behalf of the caller of its entry point, that
/// caller, a role whose privileges it has (it could `SET ROLE` and ask) or any role for a superuser.
///
/// Unlike [`caller`], allowed inside a security-restricted operation: there PostgreSQL has made the object's
/// owner the current user (a materialized view's refresh, an index expression), the frames record exactly
/// that identity, and answering what that owner may read is what the policies need to do. Nothing is acted on.
pub fn require_acting_for(role_name: &str) {
    let Ok(name) = CString::new(role_name) else {
        return; // no role has a NUL in its name: nothing to tell
    };
    // SAFETY: `name` is NUL-terminated and alive for the call; with missing_ok the lookup returns InvalidOid
    // instead of raising.
    let role = unsafe { pg_sys::get_role_oid(name.as_ptr(), true) };
    if role == pg_sys::InvalidOid || crate::frames::wrapper_identity() == Some(role) {
        return;
    }
    let caller = recorded_caller().role;
    // SAFETY: the privilege checks read the catalog caches of this backend only.
    let allowed = role == caller
        || unsafe { pg_sys::superuser_arg(caller) || pg_sys::has_privs_of_role(caller, role) };
    if !allowed {
        crate::error::RagError::InsufficientPrivilege {
            message: format!("permission denied to see what role \"{role_name}\" may read in rag"),
            hint: "rag answers this only for the calling role, a role whose privileges it has, or a superuser."
                .into(),
        }
        .raise()
    }
}

/// Makes the rest of the calling SECURITY DEFINER function a security-restricted operation as its owner (the
/// current user). PostgreSQL's own restore of the definer function's identity and security context when it
/// returns (or the abort of an ERROR) ends it, so nothing is left to undo here. Refused outside a definer
/// function: at the top level the restriction would outlive the statement.
pub fn restrict_current_user() {
    let mut user = pg_sys::InvalidOid;
    let mut context: std::ffi::c_int = 0;
    // SAFETY: pointers to live locals; the same process-global state `RestrictedIdentity` edits.
    unsafe { pg_sys::GetUserIdAndSecContext(&mut user, &mut context) };
    if context & pg_sys::SECURITY_LOCAL_USERID_CHANGE as std::ffi::c_int == 0 {
        crate::error::RagError::invalid(
            "rag._restrict_to_current_user() must be called from a SECURITY DEFINER function",
            "A watch's trigger calls it; it is not meant to be called directly.",
        )
        .raise()
    }
    // SAFETY: as above; only adds a restriction to the current context.
    unsafe {
        pg_sys::SetUserIdAndSecContext(
            user,
            context | pg_sys::SECURITY_RESTRICTED_OPERATION as std::ffi::c_int,
        )
    };
}

/// Sets a parameter for the current GUC nest level only, as a function's `SET` clause does.
pub(crate) fn set_local(name: &str, value: &str) {
    let name = CString::new(name).expect("parameter names have no NUL");
    let value = CString::new(value).expect("parameter values have no NUL");
    // SAFETY: valid C strings that outlive the call; GUC_ACTION_SAVE ties the value to the nest level opened
    // by the caller, so it is undone with it.
    unsafe {
        pg_sys::set_config_option(
            name.as_ptr(),
            value.as_ptr(),
            pg_sys::GucContext::PGC_USERSET,
            pg_sys::GucSource::PGC_S_SESSION,
            pg_sys::GucAction::GUC_ACTION_SAVE,
            true,
            0,
            false,
        );
    }
}

/// Why a string is not one SQL expression, in words for an error message.
fn expression_problem(expression: &str) -> Option<String> {
    if expression.trim().is_empty() {
        return Some("it is empty".into());
    }
    if expression.to_ascii_lowercase().contains("pg_temp") {
        // A writer's own temporary schema would otherwise supply functions that run inside triggers and the
        // worker as the table's owner.
        return Some("it names pg_temp; temporary objects cannot be used".into());
    }
    let Ok(text) = CString::new(expression) else {
        return Some("it contains a NUL character".into());
    };
    let parsed = PgTryBuilder::new(|| {
        // The parse runs with standard_conforming_strings on, the setting every later evaluation uses, so a
        // backslash cannot end a literal here and not there.
        // SAFETY: NewGUCNestLevel/AtEOXact_GUC pair up around the parse; an ERROR inside is caught below and
        // the nest level is then unwound by the (sub)transaction abort the re-raised error causes.
        let level = unsafe { pg_sys::NewGUCNestLevel() };
        set_local("standard_conforming_strings", "on");
        // SAFETY: raw_parser takes a NUL-terminated string and returns a List of RawStmt in the current memory
        // context, or raises a syntax ERROR.
        let tree = unsafe {
            pg_sys::raw_parser(text.as_ptr(), pg_sys::RawParseMode::RAW_PARSE_PLPGSQL_EXPR)
        };
        // SAFETY: closes the nest level opened just above, on the same thread, with nothing opened since.
        unsafe { pg_sys::AtEOXact_GUC(true, level) };
        Ok(tree)
    })
    .catch_others(|caught| match caught {
        CaughtError::PostgresError(report) => Err(report.message().to_string()),
        other => other.rethrow(),
    })
    .execute();
    let tree = match parsed {
        Ok(tree) => tree,
        Err(message) => return Some(message),
    };
    // SAFETY: `tree` is what raw_parser returned: a valid List (or NIL) of RawStmt nodes.
    unsafe { single_expression_problem(tree) }
}

/// The parse of `RAW_PARSE_PLPGSQL_EXPR` is a SELECT without the keyword; it is one expression only when every
/// clause but a single unnamed target is absent.
// SAFETY (for callers): `tree` is raw_parser's result, NIL or a List of RawStmt; every node is cast only
// after its tag is checked.
unsafe fn single_expression_problem(tree: *mut pg_sys::List) -> Option<String> {
    let statements = pgrx::PgList::<pg_sys::RawStmt>::from_pg(tree);
    if statements.len() != 1 {
        return Some("it is not exactly one expression".into());
    }
    let raw = statements.get_ptr(0)?;
    let node = (*raw).stmt;
    if node.is_null() || (*node).type_ != pg_sys::NodeTag::T_SelectStmt {
        return Some("it is not an expression".into());
    }
    let select = &*(node as *mut pg_sys::SelectStmt);
    let clauses_absent = select.distinctClause.is_null()
        && select.intoClause.is_null()
        && select.fromClause.is_null()
        && select.whereClause.is_null()
        && select.groupClause.is_null()
        && select.havingClause.is_null()
        && select.windowClause.is_null()
        && select.valuesLists.is_null()
        && select.sortClause.is_null()
        && select.limitOffset.is_null()
        && select.limitCount.is_null()
        && select.lockingClause.is_null()
        && select.withClause.is_null()
        && select.op == pg_sys::SetOperation::SETOP_NONE;
    if !clauses_absent {
        return Some("it has clauses (FROM, WHERE, ORDER BY, …) besides the expression".into());
    }
    let targets = pgrx::PgList::<pg_sys::ResTarget>::from_pg(select.targetList);
    if targets.len() != 1 {
        return Some("it is not exactly one expression (a comma at the top level?)".into());
    }
    let target = targets.get_ptr(0)?;
    if !(*target).name.is_null() {
        return Some("it has an alias (AS …)".into());
    }
    let value = (*target).val;
    if value.is_null() {
        return Some("it is not an expression".into());
    }
    if (*value).type_ == pg_sys::NodeTag::T_ColumnRef {
        let fields =
            pgrx::PgList::<pg_sys::Node>::from_pg((*(value as *mut pg_sys::ColumnRef)).fields);
        if fields
            .iter_ptr()
            .any(|field| !field.is_null() && (*field).type_ == pg_sys::NodeTag::T_A_Star)
        {
            return Some("* is not an expression".into());
        }
    }
    None
}

/// Raises an ERROR unless `expression` is exactly one SQL expression; `what` names it in the message.
pub fn require_single_expression(expression: &str, what: &str) {
    if let Some(problem) = expression_problem(expression) {
        crate::error::RagError::invalid(
            format!("the {what} expression is not a single SQL expression: {problem}"),
            "Give one expression over the row's columns, e.g. title || ' ' || body; statements, clauses and temporary objects are not allowed.",
        )
        .raise();
    }
}

/// The columns of table `source` that `expressions` over its row (named `r`, as every query of a watch names
/// it) read, by attribute number, as PostgreSQL's parser and analyzer resolve them. `None` means every
/// column, those added later included: when one reads the whole row (`r`, `r.*`, `to_jsonb(r)`, `r::text`),
/// has a subquery (which may read the table again under another name), or calls a function that could read
/// the table by itself: any function outside pg_catalog (an owner's own function reads what it likes, whatever
/// volatility it declares), a volatile one, or one of pg_catalog's that runs a query given as text
/// ([`RUNS_QUERY_TEXT`]). A word match over the text (what rag did before) missed all of these.
///
/// Analysis runs code: a literal of an array of a domain checks the domain's constraints, which may call any
/// function. So it runs as the table's owner in a security-restricted operation, as the expressions
/// themselves are evaluated ([`RestrictedIdentity`]),
/// and only where the owner's own code may run: when a watch is made or its table altered (a client's
/// statement), never in a reader's search or the worker. Raises when an expression does not analyze (a column or function gone).
pub fn expression_attributes(source: pg_sys::Oid, expressions: &[&str]) -> Option<Vec<i16>> {
    if expressions.is_empty() {
        return Some(Vec::new());
    }
    // SAFETY: syscache lookups by oid in the current transaction; each returns NULL (or InvalidOid) for a
    // missing relation or namespace, or a palloc'd NUL-terminated copy.
    let (table, owner) = unsafe {
        let name = pg_sys::get_rel_name(source);
        let namespace = pg_sys::get_namespace_name(pg_sys::get_rel_namespace(source));
        let owner = relation_owner(source);
        if name.is_null() || namespace.is_null() || owner == pg_sys::InvalidOid {
            crate::error::RagError::undefined(
                format!(
                    "the watched table of oid {} no longer exists",
                    u32::from(source)
                ),
                "rag_unwatch it, or watch the table again.",
            )
            .raise();
        }
        let quoted = pg_sys::quote_qualified_identifier(namespace, name);
        (
            std::ffi::CStr::from_ptr(quoted)
                .to_string_lossy()
                .into_owned(),
            owner,
        )
    };
    let targets: Vec<String> = expressions.iter().map(|e| format!("({e}\n)")).collect();
    let sql = format!("SELECT {} FROM ONLY {table} AS r", targets.join(", "));
    let Ok(text) = CString::new(sql) else {
        crate::error::RagError::invalid(
            "a watch expression contains a NUL character".to_string(),
            "Watch the table again with expressions over its columns.",
        )
        .raise();
    };
    // No timeout of rag's own: this runs in a client's statement (rag_watch, ALTER TABLE, an upgrade), under the
    // client's statement_timeout, which arming another would disarm.
    let _identity = RestrictedIdentity::enter(owner, 0, None);
    // SAFETY: raw_parser and parse_analyze_fixedparams take a NUL-terminated string that outlives them and
    // return nodes in the current memory context, or raise an ERROR (the guard's drop then leaves the identity
    // to the abort, which restores it); every node is cast only after its tag is checked.
    unsafe {
        let tree = pg_sys::raw_parser(text.as_ptr(), pg_sys::RawParseMode::RAW_PARSE_DEFAULT);
        let statements = pgrx::PgList::<pg_sys::RawStmt>::from_pg(tree);
        let raw = match statements.len() {
            1 => statements.get_ptr(0),
            _ => None,
        };
        let Some(raw) = raw else {
            crate::error::RagError::invalid(
                "a watch expression is not a single SQL expression".to_string(),
                "Watch the table again with one expression for each of content, title and filter.",
            )
            .raise();
        };
        let query = pg_sys::parse_analyze_fixedparams(
            raw,
            text.as_ptr(),
            std::ptr::null(),
            0,
            std::ptr::null_mut(),
        );
        // One expression per target over the one table of the FROM list, as built above; anything else means the
        // text was not what it seemed, and nothing below can be trusted.
        let rtable = pgrx::PgList::<pg_sys::RangeTblEntry>::from_pg((*query).rtable);
        let targets = pgrx::PgList::<pg_sys::TargetEntry>::from_pg((*query).targetList);
        let only_the_table = rtable.len() == 1
            && rtable
                .get_ptr(0)
                .is_some_and(|entry| (*entry).relid == source)
            && targets.len() == expressions.len();
        if !only_the_table {
            crate::error::RagError::invalid(
                "a watch expression is not a single SQL expression over the table's row"
                    .to_string(),
                "Watch the table again with one expression for each of content, title and filter.",
            )
            .raise();
        }
        if (*query).hasSubLinks {
            return None;
        }
        for target in targets.iter_ptr() {
            if calls_a_reading_function((*target).expr.cast(), std::ptr::null_mut()) {
                return None;
            }
        }
        let vars =
            pgrx::PgList::<pg_sys::Node>::from_pg(pg_sys::pull_vars_of_level(query.cast(), 0));
        let mut attributes = std::collections::BTreeSet::new();
        for node in vars.iter_ptr() {
            if node.is_null() || (*node).type_ != pg_sys::NodeTag::T_Var {
                continue;
            }
            let var = &*(node as *const pg_sys::Var);
            if var.varno != 1 {
                continue;
            }
            match var.varattno {
                0 => return None,
                column if column > 0 => {
                    attributes.insert(column);
                }
                _ => {} // System columns (ctid, xmin, …) are not the row's content.
            }
        }
        Some(attributes.into_iter().collect())
    }
}

/// Functions of pg_catalog that run a query given to them as text, and so can read any column of any table
/// their caller may: the SQL/XML export functions, ts_stat and ts_rewrite's query form.
const RUNS_QUERY_TEXT: &[&str] = &[
    "query_to_xml",
    "query_to_xmlschema",
    "query_to_xml_and_xmlschema",
    "cursor_to_xml",
    "cursor_to_xmlschema",
    "table_to_xml",
    "table_to_xmlschema",
    "table_to_xml_and_xmlschema",
    "schema_to_xml",
    "schema_to_xmlschema",
    "schema_to_xml_and_xmlschema",
    "database_to_xml",
    "database_to_xmlschema",
    "database_to_xml_and_xmlschema",
    "ts_stat",
    "ts_rewrite",
];

/// The owner of a relation; InvalidOid when it does not exist.
pub(crate) fn relation_owner(relation: pg_sys::Oid) -> pg_sys::Oid {
    // SAFETY: a syscache lookup by oid; the tuple is released before returning.
    unsafe {
        let tuple = pg_sys::SearchSysCache1(
            pg_sys::SysCacheIdentifier::RELOID as _,
            pg_sys::Datum::from(relation),
        );
        if tuple.is_null() {
            return pg_sys::InvalidOid;
        }
        let form = pg_sys::GETSTRUCT(tuple) as *const pg_sys::FormData_pg_class;
        let owner = (*form).relowner;
        pg_sys::ReleaseSysCache(tuple);
        owner
    }
}

// SAFETY (for callers): `node` is NULL or a node of an analyzed expression tree; PostgreSQL's walker calls it
// back with the same.
unsafe extern "C-unwind" fn calls_a_reading_function(
    node: *mut pg_sys::Node,
    context: *mut std::ffi::c_void,
) -> bool {
    if node.is_null() {
        return false;
    }
    // SAFETY: check_functions_in_node looks at the function oids of this one node (calls, operators,
    // coercions) and asks the callback about each; the walker recurses into the node's children.
    unsafe {
        pg_sys::check_functions_in_node(node, Some(function_may_read), std::ptr::null_mut())
            || pg_sys::expression_tree_walker(node, Some(calls_a_reading_function), context)
    }
}

// SAFETY (for callers): called by check_functions_in_node with a function's oid.
unsafe extern "C-unwind" fn function_may_read(
    function: pg_sys::Oid,
    _context: *mut std::ffi::c_void,
) -> bool {
    // SAFETY: syscache lookups by oid; a function named in an analyzed expression exists.
    unsafe {
        if pg_sys::get_func_namespace(function) != pg_sys::Oid::from(pg_sys::PG_CATALOG_NAMESPACE) {
            return true;
        }
        if pg_sys::func_volatile(function) as u8 == pg_sys::PROVOLATILE_VOLATILE {
            return true;
        }
        let name = pg_sys::get_func_name(function);
        !name.is_null()
            && std::ffi::CStr::from_ptr(name)
                .to_str()
                .is_ok_and(|name| RUNS_QUERY_TEXT.contains(&name))
    }
}
