//! SQL-callable functions implemented in Rust. The SQL-language half of the API (ingest, collections,
//! retrieval, status) lives in `sql/`; these are the parts that need Rust: chunking, provider calls.
pub mod ask;
pub mod chunk;
pub mod extract;
pub mod extraction_slots;
pub mod ledger_trail;
pub mod models;
pub mod process;
pub mod query;
pub mod rerank;
pub mod roles;
pub mod search;
pub mod watch;
pub mod watch_keys;
pub mod written_by_rag;

/// The interrupt hook for a provider call made in a user's session: a cancel request or statement_timeout
/// raises its ERROR from inside the call's wait, like any other statement's.
pub fn on_cancel() -> impl FnMut() -> bool {
    || {
        pgrx::check_for_interrupts!();
        false
    }
}

/// Refuses a call that writes on a hot standby or in a read-only transaction, before it does anything, the way
/// the SQL functions do (`rag._require_writable`): what is refused, where to run it, the primary's address.
pub fn require_writable(what: &str) -> Result<(), crate::error::RagError> {
    require("_require_writable", what, || {
        format!("checking that {what} may write here")
    })
}

/// Raises unless the transaction is READ COMMITTED (`rag._require_read_committed`).
pub fn require_read_committed(what: &str) -> Result<(), crate::error::RagError> {
    require("_require_read_committed", what, || {
        format!("checking the isolation level {what} runs in")
    })
}

/// Runs one of rag's SQL checks, `rag.<check>(what)`, which raises its own error when the call may not go on;
/// `doing` says what was being checked, for an error of the check itself.
fn require(
    check: &str,
    what: &str,
    doing: impl FnOnce() -> String,
) -> Result<(), crate::error::RagError> {
    use crate::error::SpiContext;
    let query = format!("SELECT rag.{check}($1)");
    pgrx::Spi::connect(|client| client.select(&query, None, &[what.into()]).map(|_| ()))
        .doing(doing)
}

/// `rag._load_library(internal)`, the planner support function of every function of rag. It never helps the
/// planner (it answers every request with NULL, "no simplification"); it exists so that planning a call to
/// rag loads the library, in the frame of whoever wrote the call. Without `shared_preload_libraries` the
/// library would otherwise be loaded inside rag's own SECURITY DEFINER function, where the identity of the
/// function that called it can no longer be read (`crate::frames`).
///
/// Written by hand, not with `#[pg_extern]`: pgrx returns an `internal` NULL pointer as SQL NULL, and the
/// planner raises "function returned NULL" for that.
#[no_mangle]
pub extern "C" fn pg_finfo_rag_load_library() -> &'static pgrx::pg_sys::Pg_finfo_record {
    static VERSION_1: pgrx::pg_sys::Pg_finfo_record =
        pgrx::pg_sys::Pg_finfo_record { api_version: 1 };
    &VERSION_1
}

/// See [`pg_finfo_rag_load_library`]. Reads nothing and cannot fail, so it needs no `#[pg_guard]`.
#[no_mangle]
pub extern "C-unwind" fn rag_load_library(
    _fcinfo: pgrx::pg_sys::FunctionCallInfo,
) -> pgrx::pg_sys::Datum {
    pgrx::pg_sys::Datum::from(0usize)
}

pgrx::extension_sql!(
    r#"
CREATE FUNCTION rag._load_library(internal) RETURNS internal
    LANGUAGE c STRICT AS 'MODULE_PATHNAME', 'rag_load_library';
"#,
    name = "load_library",
    requires = ["schema"]
);

#[pgrx::pg_schema]
pub mod rag {
    use pgrx::prelude::*;

    /// The role the caller acts as, seen from inside SECURITY DEFINER code (where current_user is the owner):
    /// every privilege check asks it, and the ledger and conversations record it. Raises inside a
    /// security-restricted operation (see [`crate::security::calling_role`]). Parallel restricted: a parallel
    /// worker does not see the leader's stack of running functions (`crate::frames`).
    #[pg_extern(stable, parallel_restricted, name = "_calling_role")]
    pub fn calling_role() -> String {
        role_name(crate::security::calling_role())
    }

    /// Who called rag's entry point and the search_path it had then, from one walk of the frames (see
    /// [`crate::security::caller`]): a reader's check of a watched row (`rag._row_visible`, once per candidate)
    /// runs the table's row-level security policies, and the functions they call, as that role with that path,
    /// as PostgreSQL runs them for the reader's own SELECT of the table. Refused where `rag._calling_role()` is.
    #[pg_extern(stable, parallel_restricted, name = "_calling_identity")]
    pub fn calling_identity(
    ) -> TableIterator<'static, (name!(role, String), name!(search_path, Option<String>))> {
        let caller = crate::security::caller();
        TableIterator::once((role_name(caller.role), caller.search_path))
    }

    /// `role` itself, once the caller of rag's entry point may be told what that role may see (see
    /// [`crate::security::require_acting_for`]); the functions behind rag's row-level security ask it before
    /// they list a role's collections or watches. Parallel restricted, as `rag._calling_role()`.
    #[pg_extern(stable, parallel_restricted, name = "_acting_for")]
    pub fn acting_for(role: Option<&str>) -> String {
        // Not STRICT: a NULL role would otherwise skip the check, and the functions asking would answer for
        // no role in particular (pg_has_role(NULL, ...) is NULL, which a NOT EXISTS turns into "every row").
        let Some(role) = role else {
            crate::error::RagError::invalid(
                "the role asked about must not be NULL",
                "Pass current_user, or the name of a role whose privileges you have.",
            )
            .raise()
        };
        crate::security::require_acting_for(role);
        role.to_owned()
    }

    fn role_name(role: pgrx::pg_sys::Oid) -> String {
        // SAFETY: GetUserNameFromId with noerr returns a palloc'd NUL-terminated string or NULL (checked),
        // which is copied before the memory context can go away.
        unsafe {
            let name = pgrx::pg_sys::GetUserNameFromId(role, true);
            if name.is_null() {
                return String::new();
            }
            std::ffi::CStr::from_ptr(name)
                .to_string_lossy()
                .into_owned()
        }
    }

    /// Puts the rest of the calling SECURITY DEFINER function in a security-restricted operation as its
    /// owner: a watch's trigger calls it before it evaluates the owner's filter in the writer's statement.
    #[pg_extern(volatile, parallel_unsafe, name = "_restrict_to_current_user")]
    pub fn restrict_to_current_user() {
        crate::security::restrict_current_user();
    }

    /// Whether the PL/pgSQL routine calling this may COMMIT (`crate::pg::routine_may_commit`): `CALL
    /// rag_await` commits between its checks where it may, and otherwise waits the way `rag_wait` does.
    #[pg_extern(volatile, parallel_unsafe, name = "_may_commit")]
    pub fn may_commit() -> bool {
        crate::pg::routine_may_commit()
    }

    /// A `rag.*` setting as text, read through Rust so that calling it loads the library first: on a server
    /// without shared_preload_libraries the settings do not exist until then, and SQL code that reads them
    /// with current_setting() would fail on the first call of a session.
    #[pg_extern(stable, parallel_safe, name = "_setting")]
    pub fn setting(name: &str) -> Option<String> {
        if !name.starts_with("rag.") {
            crate::error::RagError::invalid(
                format!("\"{name}\" is not a rag setting"),
                "Only rag.* settings are read through this function.",
            )
            .raise();
        }
        let name = std::ffi::CString::new(name).ok()?;
        // SAFETY: `name` is a NUL-terminated string alive for the call; the result is NULL (checked) or a
        // NUL-terminated string that is copied at once.
        unsafe {
            // The same call as current_setting(): units included, the caller's own privileges applied.
            let value =
                pgrx::pg_sys::GetConfigOptionByName(name.as_ptr(), std::ptr::null_mut(), true);
            (!value.is_null()).then(|| {
                std::ffi::CStr::from_ptr(value)
                    .to_string_lossy()
                    .into_owned()
            })
        }
    }
}
