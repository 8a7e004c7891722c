//! rag's tables are written by rag's own functions (which run as the tables' owner: SECURITY DEFINER entry
//! points, foreign keys' actions) or by a superuser (the worker, restores), and by nobody else, whatever privileges or
//! policies they pass. Privileges and row-level security keep ordinary roles out, but not a role with
//! `pg_write_all_data` and `BYPASSRLS`, which writes every table past both: it pointed providers at a server
//! of its own and the worker sent their keys there, it rewrote a superuser's watch for the worker to run as
//! that superuser, and it cleared a document's watch (or moved a chunk to another document), so every reader
//! of the collection read rows the watched table's own policies hid (helper-97, helper-98). A privilege cannot
//! stop such a role; a trigger, enabled ALWAYS so that `session_replication_role` does not skip it, can.
//! The one write ordinary roles make, a watch trigger's insert into `rag.row_batches`, has its own policy,
//! which BYPASSRLS skips: [`rag::_row_batches_policy_kept`] applies it to such a role.
use crate::error::{RagError, UnwrapOrRaise};
use pgrx::prelude::*;

/// Whether the current user owns the table being written (rag's functions run as that role) or is a
/// superuser.
///
/// # Safety
/// `data` is the live TriggerData of the current trigger call.
unsafe fn written_by_rag(data: &pg_sys::TriggerData) -> bool {
    // SAFETY: the relation of a trigger call is open and its pg_class form is valid for the call (caller).
    let owner = unsafe { (*(*data.tg_relation).rd_rel).relowner };
    // SAFETY: GetUserId reads a backend global; superuser() looks the current user up in the role cache.
    unsafe { pg_sys::GetUserId() == owner || pg_sys::superuser() }
}

/// Whether a role that row-level security lets past `rag.row_batches`' insert policy may queue this batch,
/// as the policy would decide for anyone else (`rag._may_queue_batch`).
fn batch_queued_by_own_trigger(watch_id: Option<i32>, id: Option<i64>) -> Result<bool, RagError> {
    use crate::error::SpiContext;
    let doing = || format!("checking who may queue a batch for watch {watch_id:?}");
    // This trigger is one level deeper than the insert it checks: the insert came from a trigger (as the
    // policy demands) only if the depth here is past one. EXECUTE is granted to the owners of watched tables
    // only, and the policy needs it too: anyone else is refused with the policy's error, not with a missing
    // privilege, which PostgreSQL checks as it starts a statement, whatever branch would run.
    let may_ask = Spi::get_one::<bool>(
        "SELECT pg_catalog.pg_trigger_depth() > 1 \
            AND pg_catalog.has_function_privilege('rag._may_queue_batch(integer, name, bigint)', 'EXECUTE')",
    )
    .doing(doing)?;
    if may_ask != Some(true) {
        return Ok(false);
    }
    Spi::get_one_with_args::<bool>(
        "SELECT rag._may_queue_batch($1, current_user, $2)",
        &[watch_id.into(), id.into()],
    )
    .map(|allowed| allowed == Some(true))
    .doing(doing)
}

#[pg_schema]
pub mod rag {
    use super::*;
    use pgrx::heap_tuple::PgHeapTuple;
    use pgrx::{AllocatedByPostgres, PgTrigger};

    fn refuse(trigger: &PgTrigger<'_>) -> Result<(), RagError> {
        let table = match (trigger.table_schema(), trigger.table_name()) {
            (Ok(schema), Ok(name)) => format!("{schema}.{name}"),
            _ => "this table".into(),
        };
        let hint = trigger
            .extra_args()
            .ok()
            .and_then(|args| args.into_iter().next());
        Err(RagError::InsufficientPrivilege {
            message: format!("only rag's functions or a superuser may write {table}"),
            hint: hint.unwrap_or_else(|| {
                "rag's tables are written through rag's functions, which check each write.".into()
            }),
        })
    }

    /// The guard of every table of rag's (`BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE` per statement,
    /// without INSERT on `rag.row_batches`; `BEFORE INSERT OR UPDATE OR DELETE` per row on `rag.chunks`, whose
    /// partitions a role may write directly and which take a row trigger of their parent's; optional
    /// argument: the hint naming the functions that write the table). Costs a comparison and a cached role
    /// lookup per call; it has no SET clause, so PostgreSQL calls it directly (sql/security.sql).
    #[pg_trigger]
    fn _written_by_rag_only<'a>(
        trigger: &'a PgTrigger<'a>,
    ) -> Result<Option<PgHeapTuple<'a, AllocatedByPostgres>>, std::convert::Infallible> {
        // SAFETY: PostgreSQL called this as a trigger (PgTrigger checked), so its TriggerData is live for the call.
        if !unsafe { written_by_rag(trigger.trigger_data()) } {
            refuse(trigger).unwrap_or_raise();
        }
        // A BEFORE row trigger that returns no row skips it: the row goes on as written (NEW; OLD for a delete).
        Ok(trigger.new().or_else(|| trigger.old()))
    }

    /// `rag.row_batches`' insert policy (`row_batches_from_own_triggers`: only a watch's own triggers queue
    /// keys, for a table their role owns), kept for a role with BYPASSRLS, which PostgreSQL does not hold to
    /// it (`BEFORE INSERT … FOR EACH ROW`, enabled ALWAYS, after `row_batches_free_id`). Such a role queued a
    /// batch due at infinity for another owner's row, and every later change to that row, a redaction
    /// included, was never indexed: readers were shown the old text (helper-99). Any other role pays two
    /// role lookups in the cache, and the call through PostgreSQL's handler for functions with a SET clause
    /// (the check runs SQL, with rag's search_path).
    #[pg_trigger]
    fn _row_batches_policy_kept<'a>(
        trigger: &'a PgTrigger<'a>,
    ) -> Result<Option<PgHeapTuple<'a, AllocatedByPostgres>>, std::convert::Infallible> {
        let row = trigger.new();
        // Attached anywhere else (a row DELETE: no NEW), returning no row would skip the write without a word.
        if row.is_none() {
            Err::<(), _>(RagError::Internal(
                "rag._row_batches_policy_kept is a BEFORE INSERT … FOR EACH ROW trigger".into(),
            ))
            .unwrap_or_raise();
        }
        // SAFETY: PostgreSQL called this as a trigger (PgTrigger checked), so its TriggerData is live for the
        // call; has_bypassrls_privilege looks the current user up in the role cache.
        let bypasses = unsafe {
            !written_by_rag(trigger.trigger_data())
                && pg_sys::has_bypassrls_privilege(pg_sys::GetUserId())
        };
        if let (true, Some(row)) = (bypasses, row.as_ref()) {
            let watch_id = row.get_by_name::<i32>("watch_id").ok().flatten();
            let id = row.get_by_name::<i64>("id").ok().flatten();
            if !super::batch_queued_by_own_trigger(watch_id, id).unwrap_or_raise() {
                Err::<(), _>(RagError::InsufficientPrivilege {
                    message: "new row violates row-level security policy \"row_batches_from_own_triggers\" \
                              for table \"row_batches\""
                        .into(),
                    hint: "Only a watch's own triggers queue its table's keys; rag_reindex queues a whole table."
                        .into(),
                })
                .unwrap_or_raise();
            }
        }
        Ok(row)
    }
}
