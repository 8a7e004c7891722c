//! Role commands and what rag records of roles. A collection's owner and grantees are role oids in rag's
//! tables, which PostgreSQL's dependency tracking does not see: without this, `DROP ROLE` left a bare oid
//! behind (a dump writes it as a number, and a restore elsewhere hands the collection to whichever role has
//! that oid there), `REASSIGN OWNED` left collections and a watched table's queue rights with the old role,
//! and `DROP OWNED` left its grants. rag's utility hook (`crate::pg`) shows every utility statement to
//! [`before_command`] and [`after_command`]; each acts through a SQL function of rag's, called as
//! PostgreSQL calls a trigger function (granted to no role, it runs as rag's owner), and does nothing in a
//! database without rag.
use pgrx::prelude::*;
use pgrx::PgList;

/// The oids of the roles a statement's list of `RoleSpec` names that exist.
///
/// # Safety
/// `roles` is NULL or a valid List of RoleSpec nodes.
unsafe fn role_oids(roles: *mut pg_sys::List) -> Vec<pg_sys::Oid> {
    PgList::<pg_sys::RoleSpec>::from_pg(roles)
        .iter_ptr()
        .map(|role| pg_sys::get_rolespec_oid(role, true))
        .filter(|oid| *oid != pg_sys::InvalidOid)
        .collect()
}

/// Calls `rag.<name>(oid[]…)` with the arrays given, when this database has it.
fn call(name: &std::ffi::CStr, arguments: Vec<Vec<pg_sys::Oid>>, argument_types: &[pg_sys::Oid]) {
    let function = crate::pg::rag_function(name, argument_types);
    if function == pg_sys::InvalidOid {
        return;
    }
    let datums: Vec<pg_sys::Datum> = arguments
        .into_iter()
        .map(|oids| oids.into_datum().expect("an array always makes a datum"))
        .collect();
    // SAFETY: `function` takes exactly these argument types (looked up by them) and returns void; its
    // SECURITY DEFINER handler runs it as rag's owner with its pinned search_path.
    unsafe {
        match datums.as_slice() {
            [first] => {
                pg_sys::OidFunctionCall1Coll(function, pg_sys::InvalidOid, *first);
            }
            [first, second] => {
                pg_sys::OidFunctionCall2Coll(function, pg_sys::InvalidOid, *first, *second);
            }
            _ => unreachable!("rag's role functions take one or two arrays"),
        }
    }
}

/// Before a utility statement runs: `DROP ROLE` of a role that owns a collection or holds a grant on one in
/// this database is refused, as PostgreSQL refuses to drop a role that owns objects.
///
/// # Safety
/// `pstmt` is the hook's own statement pointer, NULL or a valid PlannedStmt.
#[pg_guard]
pub unsafe extern "C-unwind" fn before_command(pstmt: *mut pg_sys::PlannedStmt) {
    if pstmt.is_null() || (*pstmt).utilityStmt.is_null() {
        return;
    }
    let node = (*pstmt).utilityStmt;
    if (*node).type_ == pg_sys::NodeTag::T_DropRoleStmt {
        let roles = role_oids((*(node as *mut pg_sys::DropRoleStmt)).roles);
        if !roles.is_empty() {
            call(c"_refuse_drop_role", vec![roles], &[pg_sys::OIDARRAYOID]);
        }
    }
}

/// After a utility statement ran: `REASSIGN OWNED` hands the old roles' collections to the new role and
/// grants a watched table's new owner what its watch's triggers need; `DROP OWNED` takes back the grants
/// the roles held on collections.
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
        pg_sys::NodeTag::T_ReassignOwnedStmt => {
            let statement = node as *mut pg_sys::ReassignOwnedStmt;
            let new_role = pg_sys::get_rolespec_oid((*statement).newrole, false);
            call(
                c"_reassign_owned",
                vec![role_oids((*statement).roles), vec![new_role]],
                &[pg_sys::OIDARRAYOID, pg_sys::OIDARRAYOID],
            );
        }
        pg_sys::NodeTag::T_DropOwnedStmt => {
            let roles = role_oids((*(node as *mut pg_sys::DropOwnedStmt)).roles);
            call(c"_drop_owned", vec![roles], &[pg_sys::OIDARRAYOID]);
        }
        _ => {}
    }
}
