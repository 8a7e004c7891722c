//! Role commands and what rag records of roles. A collection's owner and grantees are role oids in rag's
//! tables, which PostgreSQL's dependency tracking does not see: without this, `DROP ROLE` left a bare oid
//! behind (a dump writes it as a number, and a restore elsewhere hands the collection to whichever role has
//! that oid there), `REASSIGN OWNED` left collections and a watched table's queue rights with the old role,
//! and `DROP OWNED` left its grants. rag's utility hook (`crate::pg`) shows every utility statement to
//! [`before_command`] and [`after_command`]; each acts through a SQL function of the extension's, called as
//! PostgreSQL calls a trigger function (granted to no role, it runs as rag's owner), and does nothing in a
//! database without rag.
use pgrx::prelude::*;
use pgrx::PgList;
use std::cell::RefCell;

thread_local! {
    // PostgreSQL runs a backend's SQL on one thread. The roles a DROP ROLE names, with their names, taken
    // before it runs: once it has run, the catalog no longer knows them.
    static DROPPING: RefCell<Vec<(pg_sys::Oid, String)>> = const { RefCell::new(Vec::new()) };
}

/// The roles a statement's list of `RoleSpec` names that exist, with their names. `PUBLIC` is left to
/// PostgreSQL, which refuses it in these commands with its own error.
///
/// # Safety
/// `roles` is NULL or a valid List of RoleSpec nodes.
unsafe fn named_roles(roles: *mut pg_sys::List) -> Vec<(pg_sys::Oid, String)> {
    PgList::<pg_sys::RoleSpec>::from_pg(roles)
        .iter_ptr()
        .filter(|role| (**role).roletype != pg_sys::RoleSpecType::ROLESPEC_PUBLIC)
        .filter_map(|role| {
            let oid = pg_sys::get_rolespec_oid(role, true);
            let name = pg_sys::GetUserNameFromId(oid, true);
            (oid != pg_sys::InvalidOid && !name.is_null()).then(|| {
                (
                    oid,
                    std::ffi::CStr::from_ptr(name)
                        .to_string_lossy()
                        .into_owned(),
                )
            })
        })
        .collect()
}

/// Calls the extension's `rag.<name>` with the datums given, when this database has it.
fn call(name: &std::ffi::CStr, argument_types: &[pg_sys::Oid], arguments: &[pg_sys::Datum]) {
    let function = crate::pg::rag_function(name, argument_types);
    if function == pg_sys::InvalidOid {
        return;
    }
    // SAFETY: `function` is the extension's own, looked up by exactly these argument types, and returns void;
    // its SECURITY DEFINER handler runs it as rag's owner with its pinned search_path.
    unsafe {
        match arguments {
            [first] => {
                pg_sys::OidFunctionCall1Coll(function, pg_sys::InvalidOid, *first);
            }
            [first, second] => {
                pg_sys::OidFunctionCall2Coll(function, pg_sys::InvalidOid, *first, *second);
            }
            _ => unreachable!("rag's role functions take one or two arguments"),
        }
    }
}

/// Calls one of the extension's own STABLE functions, which read with the active snapshot, under the latest
/// snapshot when `latest` (a transaction that keeps one snapshot must see what committed during a lock wait),
/// else under the statement's, and returns its by-value result.
///
/// # Safety
/// `function` is the extension's own STABLE function, looked up by exactly the types of `arguments` (one or
/// two), returning a by-value type or void. The pushed snapshot is popped right after the call; an ERROR in it
/// pops it with its (sub)transaction.
unsafe fn call_stable(
    function: pg_sys::Oid,
    arguments: &[pg_sys::Datum],
    latest: bool,
) -> pg_sys::Datum {
    // SAFETY: the caller's contract above: the function takes exactly these datums and returns by value, so the
    // fmgr calls read nothing beyond them; the snapshot pushed here is the one popped below, or the
    // (sub)transaction's abort pops it if the function raises.
    if latest {
        pg_sys::PushActiveSnapshot(pg_sys::GetLatestSnapshot());
    }
    let result = match arguments {
        [first] => pg_sys::OidFunctionCall1Coll(function, pg_sys::InvalidOid, *first),
        [first, second] => {
            pg_sys::OidFunctionCall2Coll(function, pg_sys::InvalidOid, *first, *second)
        }
        _ => unreachable!("rag's checks take one or two arguments"),
    };
    if latest {
        pg_sys::PopActiveSnapshot();
    }
    result
}

/// `rag._refuse_drop_role` looks with the statement's snapshot. A writer of a row naming the role holds the
/// role (`rag._lock_role`), which `DropRole` waits for, so under READ COMMITTED that look, taken after the
/// wait, sees the row. A REPEATABLE READ or SERIALIZABLE transaction keeps the snapshot it took before the
/// wait and missed it: the drop went through with the row's bare oid left behind (review of session 38).
/// Such a transaction looks once more under the latest snapshot and fails, as PostgreSQL fails a write that
/// its snapshot cannot see through, when a row names a dropped role (its own ledger clean-up, done by then,
/// is seen there too).
///
/// # Safety
/// Called from the utility hook after the command, in its transaction.
unsafe fn refuse_rows_committed_during_the_drop(roles: Vec<pg_sys::Oid>) {
    if !keeps_one_snapshot() {
        return;
    }
    let function = crate::pg::rag_function(c"_rows_naming_roles", &[pg_sys::OIDARRAYOID]);
    if function == pg_sys::InvalidOid {
        return;
    }
    // SAFETY: in the hook's transaction, with the extension's own STABLE SQL function looked up by exactly
    // this signature (it returns a bigint by value).
    let rows = call_stable(function, &[oid_array(roles)], true);
    if rows.value() as i64 > 0 {
        crate::error::RagError::SerializationFailure {
            message: "could not serialize access: a transaction that committed during DROP ROLE wrote rows of rag naming the role".into(),
            hint: "Run the DROP ROLE again (its transaction from the start).".into(),
        }
        .raise();
    }
}

/// The existing roles a `REASSIGN OWNED` names, and its new role (InvalidOid when there is none by that name).
///
/// # Safety
/// `statement` is a valid ReassignOwnedStmt.
unsafe fn reassigned_roles(
    statement: *mut pg_sys::ReassignOwnedStmt,
) -> (Vec<pg_sys::Oid>, pg_sys::Oid) {
    let old_roles = named_roles((*statement).roles)
        .into_iter()
        .map(|(oid, _)| oid)
        .collect();
    (
        old_roles,
        pg_sys::get_rolespec_oid((*statement).newrole, true),
    )
}

fn oid_array(oids: Vec<pg_sys::Oid>) -> pg_sys::Datum {
    oids.into_datum().expect("an array always makes a datum")
}

/// Before a utility statement runs: notes the roles a `DROP ROLE` names, for [`after_command`]; hands the
/// watch trigger functions of the roles a `REASSIGN OWNED` names to the new role (`rag._reassign_watch_functions`).
///
/// # Safety
/// `pstmt` is the hook's own statement pointer, NULL or a valid PlannedStmt.
#[pg_guard]
pub unsafe extern "C-unwind" fn before_command(pstmt: *mut pg_sys::PlannedStmt) {
    if pstmt.is_null() || (*pstmt).utilityStmt.is_null() {
        return;
    }
    let node = (*pstmt).utilityStmt;
    match (*node).type_ {
        pg_sys::NodeTag::T_DropRoleStmt => {
            let roles = named_roles((*(node as *mut pg_sys::DropRoleStmt)).roles);
            DROPPING.with(|dropping| *dropping.borrow_mut() = roles);
        }
        pg_sys::NodeTag::T_ReassignOwnedStmt => {
            // Only for a caller PostgreSQL will let run the command (the privileges of every role named):
            // anyone else gets PostgreSQL's own refusal, with nothing of rag's changed or revealed first.
            let (old_roles, new_role) = reassigned_roles(node as *mut pg_sys::ReassignOwnedStmt);
            let caller = pg_sys::GetUserId();
            if new_role != pg_sys::InvalidOid
                && !old_roles.is_empty()
                && pg_sys::has_privs_of_role(caller, new_role)
                && old_roles
                    .iter()
                    .all(|old| pg_sys::has_privs_of_role(caller, *old))
            {
                call(
                    c"_reassign_watch_functions",
                    &[pg_sys::OIDARRAYOID, pg_sys::OIDARRAYOID],
                    &[oid_array(old_roles), oid_array(vec![new_role])],
                );
            }
        }
        _ => {}
    }
}

/// After a utility statement ran (so PostgreSQL has checked the caller may run it): `DROP ROLE` of a role
/// that rag's rows depend on in this database is undone with an ERROR, as PostgreSQL refuses to drop a role
/// that owns objects; `REASSIGN OWNED` hands the old roles' collections, providers and conversations to the
/// new role and grants a watched table's new owner what its watch's triggers need; `DROP OWNED` takes back
/// the roles' grants on collections and drops their conversations; `ALTER ROLE … RENAME` renames them where
/// rag records a role by name.
///
/// # Safety
/// `pstmt` is the hook's own statement pointer, NULL or a valid PlannedStmt.
#[pg_guard]
pub unsafe extern "C-unwind" fn after_command(pstmt: *mut pg_sys::PlannedStmt) {
    if pstmt.is_null() || (*pstmt).utilityStmt.is_null() {
        return;
    }
    let node = (*pstmt).utilityStmt;
    match (*node).type_ {
        pg_sys::NodeTag::T_DropRoleStmt => {
            let roles = DROPPING.with(|dropping| std::mem::take(&mut *dropping.borrow_mut()));
            if !roles.is_empty() {
                let (oids, names): (Vec<pg_sys::Oid>, Vec<String>) = roles.into_iter().unzip();
                call(
                    c"_refuse_drop_role",
                    &[pg_sys::OIDARRAYOID, pg_sys::TEXTARRAYOID],
                    &[
                        oid_array(oids.clone()),
                        names.into_datum().expect("an array always makes a datum"),
                    ],
                );
                refuse_rows_committed_during_the_drop(oids);
            }
        }
        pg_sys::NodeTag::T_ReassignOwnedStmt => {
            let (old_roles, new_role) = reassigned_roles(node as *mut pg_sys::ReassignOwnedStmt);
            if new_role == pg_sys::InvalidOid {
                return;
            }
            call(
                c"_reassign_owned",
                &[pg_sys::OIDARRAYOID, pg_sys::OIDARRAYOID],
                &[oid_array(old_roles), oid_array(vec![new_role])],
            );
        }
        pg_sys::NodeTag::T_RenameStmt => {
            let statement = node as *mut pg_sys::RenameStmt;
            if (*statement).renameType == pg_sys::ObjectType::OBJECT_ROLE
                && !(*statement).newname.is_null()
            {
                let new_name = std::ffi::CStr::from_ptr((*statement).newname).to_string_lossy();
                call(
                    c"_rename_role",
                    &[pg_sys::TEXTOID],
                    &[new_name
                        .clone()
                        .into_datum()
                        .expect("a string always makes a datum")],
                );
                // A role's old name is the statement's subname.
                if !(*statement).subname.is_null() {
                    let old_name = std::ffi::CStr::from_ptr((*statement).subname).to_string_lossy();
                    call(
                        c"_rename_watch_author",
                        &[pg_sys::TEXTOID, pg_sys::TEXTOID],
                        &[
                            old_name
                                .into_datum()
                                .expect("a string always makes a datum"),
                            new_name
                                .into_datum()
                                .expect("a string always makes a datum"),
                        ],
                    );
                }
            }
        }
        pg_sys::NodeTag::T_DropOwnedStmt => {
            let roles = named_roles((*(node as *mut pg_sys::DropOwnedStmt)).roles)
                .into_iter()
                .map(|(oid, _)| oid)
                .collect();
            // The grants it takes back are those the role running it could revoke (rag._drop_owned).
            let caller = pg_sys::GetUserId();
            call(
                c"_drop_owned",
                &[pg_sys::OIDARRAYOID, pg_sys::OIDOID],
                &[oid_array(roles), pg_sys::Datum::from(caller)],
            );
        }
        _ => {}
    }
}

#[pg_schema]
mod rag {
    use pgrx::prelude::*;

    /// Holds `p_role` for the rest of the transaction against a `DROP ROLE`, as PostgreSQL holds a role it
    /// records as an owner or a grantee, and returns it; NULL stays NULL. Not for `public` (0), which is no role
    /// and which pgrx would return as NULL.
    /// rag's rows name roles by oid, which `rag._refuse_drop_role` (and its ledger clean-up) looks for after a
    /// `DROP ROLE`: a row written in a transaction still open was not seen, the drop went
    /// through, and the row kept the oid, which a dump writes as a bare number (red team 28). `DropRole` takes
    /// this lock exclusively, so a writer either commits first (and the drop then sees its row) or waits for
    /// the drop and fails here.
    #[pg_extern(volatile, parallel_unsafe, name = "_lock_role")]
    fn lock_role(p_role: Option<pg_sys::Oid>) -> Option<pg_sys::Oid> {
        let role = p_role?;
        // SAFETY: a lock on a shared object by its catalog and oid, released at the end of the transaction;
        // LockSharedObject takes in the invalidation messages of a drop it waited for, so the syscache lookup
        // after it sees the catalog as the drop left it. The tuple is released at once.
        let exists = unsafe {
            pg_sys::LockSharedObject(
                pg_sys::AuthIdRelationId,
                role,
                0,
                pg_sys::AccessShareLock as pg_sys::LOCKMODE,
            );
            let tuple = pg_sys::SearchSysCache1(
                pg_sys::SysCacheIdentifier::AUTHOID as std::ffi::c_int,
                pg_sys::Datum::from(role),
            );
            let found = !tuple.is_null();
            if found {
                pg_sys::ReleaseSysCache(tuple);
            }
            found
        };
        if !exists {
            crate::error::RagError::undefined(
                format!(
                    "role with OID {} was dropped while this statement ran",
                    u32::from(role)
                ),
                "Run it again as, or for, a role that exists.",
            )
            .raise();
        }
        Some(role)
    }

    /// Raises unless the caller holds `p_privilege` on the collection (`rag._check_privilege`). A
    /// REPEATABLE READ or SERIALIZABLE transaction keeps the snapshot it began with, where a grant revoked
    /// since was still there: an admin who kept a transaction open went on acting after `rag_revoke`, granted
    /// itself back for good, or dropped the collection (red team 29). PostgreSQL reads privileges from the
    /// catalog as they are now; rag's grants are read under the latest snapshot in such a transaction too.
    #[pg_extern(volatile, parallel_unsafe, name = "_require_privilege")]
    fn require_privilege(p_collection_id: Option<i32>, p_privilege: Option<&str>) {
        // As rag._check_privilege takes them: no collection is nothing to check, no privilege checks read.
        let Some(collection_id) = p_collection_id else {
            return;
        };
        let check =
            crate::pg::rag_function(c"_check_privilege", &[pg_sys::INT4OID, pg_sys::TEXTOID]);
        if check == pg_sys::InvalidOid {
            crate::error::RagError::Internal("rag._check_privilege is missing".into()).raise();
        }
        let privilege = p_privilege
            .unwrap_or("read")
            .into_datum()
            .expect("a string always makes a datum");
        // SAFETY: the extension's own STABLE PL/pgSQL function, looked up by exactly these argument types; it
        // returns void.
        unsafe {
            super::call_stable(
                check,
                &[pg_sys::Datum::from(collection_id), privilege],
                super::keeps_one_snapshot(),
            );
        }
    }

    /// How many rows `rag._count_<what>(p_ids)` counts under the latest snapshot, for the checks that a
    /// transaction keeping one snapshot makes before it acts on rows others committed since (its event
    /// triggers: rag._on_sql_drop, rag._on_alter_table, rag._watch_truncated). Only those functions.
    #[pg_extern(volatile, parallel_unsafe, name = "_count_latest")]
    fn count_latest(p_what: &str, p_ids: Vec<pg_sys::Oid>) -> i64 {
        let name = match p_what {
            "watches_on" => c"_count_watches_on",
            "documents_of_watches_on" => c"_count_documents_of_watches_on",
            _ => crate::error::RagError::invalid(
                format!("rag._count_latest cannot count {p_what}"),
                "Only rag's own checks call it.",
            )
            .raise(),
        };
        let function = crate::pg::rag_function(name, &[pg_sys::OIDARRAYOID]);
        if function == pg_sys::InvalidOid {
            return 0;
        }
        let ids = p_ids.into_datum().expect("an array always makes a datum");
        // SAFETY: the extension's own STABLE SQL counting functions, looked up by exactly this argument type;
        // they return a bigint by value.
        let counted = unsafe { super::call_stable(function, &[ids], true) };
        counted.value() as i64
    }
}

/// Whether this transaction reads with one snapshot from its first statement on (REPEATABLE READ or
/// SERIALIZABLE), so that a statement after a lock wait does not see what was committed meanwhile.
fn keeps_one_snapshot() -> bool {
    // SAFETY: XactIsoLevel is the backend's own setting, read on its one thread.
    unsafe { pg_sys::XactIsoLevel >= pg_sys::XACT_REPEATABLE_READ as i32 }
}
