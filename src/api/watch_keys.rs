//! The keys of rows inserted into, updated in or deleted from a watched table, gathered by a row trigger in Rust
//! (`rag._watch_key`) and queued by the watch's statement trigger as one batch per statement
//! (`rag._watch_keys_taken`).
//!
//! For inserts and deletes this replaces a statement trigger with a transition table (`REFERENCING NEW
//! TABLE`, `OLD TABLE`), for which PostgreSQL copies every row, whole, into a tuplestore that spills to disk past `work_mem`, and which the trigger
//! then reads back to build the key array: about 50 ms over a 175 ms INSERT of 100,000 rows of 550 bytes,
//! against 15 ms for a row trigger in C that does nothing (BENCHMARKS.md §3, "Trigger overhead"). For updates
//! it replaces a PL/pgSQL row trigger that queued one batch per changed row. The row trigger reads the key
//! column from the row in hand and appends its text to a buffer of the backend; the statement trigger, which
//! PostgreSQL fires after every row event of its statement, takes the buffer as one array literal.
//!
//! It serves watches whose key is one column of a number type (or of a string type in a UTF-8 database), of a
//! plain table (for inserts, only without a filter: `rag._watch_install` decides) or of a partition or an
//! inheritance child (filter or not). The row trigger runs no expression of the owner's and reads no other
//! column, so it may run as whoever writes. A filter needs the owner's rights in a security-restricted
//! operation (`rag._restrict_to_current_user`), which a statement trigger gives once and a row trigger would
//! have to give per row.
//!
//! A partition or an inheritance child written through its parent fires its own row triggers but none of its
//! statement triggers (PostgreSQL fires the parent's). Its row trigger (third argument `statement_end`) keeps
//! the keys apart, and rag queues them itself when the statement ends: an `ExecutorFinish` hook, which
//! PostgreSQL calls after it has fired every AFTER trigger of the statement, a `ProcessUtility` hook for `COPY
//! … FROM`, and the commit for any row event fired outside both. A logical-replication apply worker is one: it
//! fires row triggers but runs no executor statement of its own, and every watch's replica triggers (enabled
//! `REPLICA`) are such row triggers wherever this one can read the key, so an applied transaction's keys make
//! one batch per table at its commit. Past [`crate::limits::WATCH_KEYS_FLUSH_BYTES`] for one table within one
//! subtransaction the row trigger queues them at once (a subscription's initial copy is one transaction); and
//! once [`crate::limits::WATCH_KEYS_BYTES`] are kept for statements' ends in all (keys of enclosing
//! subtransactions, which cannot be queued from inside a later one, or of many tables), the key's table's
//! keys of the current subtransaction are queued to make room, or the key alone where there are none, instead
//! of failing the write. `rag._queue_gathered_keys` writes the batch as rag's owner, and only for the
//! watch of the table the trigger fired on.
//!
//! What is gathered but not yet taken follows the transaction: a subtransaction's rollback drops the keys
//! gathered since it began (its rows are gone), the end of the transaction drops everything, and a statement
//! trigger, or a statement's end, takes only the keys gathered since its own subtransaction began (`rag_keys`
//! explains why that is right). A commit that finds keys no statement trigger took (that trigger disabled
//! while the row trigger was not) warns: those rows will not be indexed until the table is reindexed.
use crate::error::{RagError, UnwrapOrRaise};
use pgrx::prelude::*;
use pgrx::PgTupleDesc;
use rag_keys::{Key, KeysError, PendingKeys};
use std::cell::RefCell;
use std::collections::HashMap;

/// A watch's id and the oid of the table a row trigger fired on.
type Target = (i32, u32);

/// How a key column's values are written into the array literal.
#[derive(Clone, Copy, PartialEq)]
enum KeyForm {
    /// int2, int4, int8 (or a domain over one): the integer's text, bare.
    Integer(i16),
    /// text or varchar (or a domain over one): its bytes, quoted.
    Text,
    /// numeric or uuid (or a domain over one): its output function's text, quoted. (The key column's type
    /// cannot change under the trigger: the UPDATE trigger's WHEN clause names it.)
    Output(pg_sys::Oid),
}

/// Where a trigger finds its key column, kept from one row to the next: a statement's rows all come through
/// the same trigger, and finding the column by name takes a scan of the table's attributes.
#[derive(Clone, Copy)]
struct KeyColumn {
    trigger: pg_sys::Oid,
    attribute: i32,
    type_oid: pg_sys::Oid,
    form: KeyForm,
}

thread_local! {
    // PostgreSQL runs a backend's SQL on one thread.
    // By watch and by the table the row trigger fired on: a statement trigger takes only what its watch's
    // row trigger gathered on its own table, so a trigger put on another table cannot add keys to a watch.
    static PENDING: RefCell<PendingKeys<Target>> =
        RefCell::new(PendingKeys::with_limit(crate::limits::WATCH_KEYS_BYTES));
    // The keys of partitions and inheritance children, which no statement trigger takes: rag queues them when
    // the statement ends. Apart from PENDING, so that the end of a statement inside another (a trigger's SQL)
    // never queues keys whose statement trigger has yet to run.
    // By the trigger depth its row trigger ran at too (pg_trigger_depth()): a statement's own rows fire their
    // triggers one level below it, so the end of a statement run inside one of those triggers (an audit
    // trigger's INSERT) leaves the keys of the enclosing statement's rows for that statement's own end.
    static AT_STATEMENT_END: RefCell<PendingKeys<(i32, Target)>> =
        RefCell::new(PendingKeys::with_limit(crate::limits::WATCH_KEYS_BYTES));
    // By trigger: two watched tables written in turn (a trigger of one writing the other) keep theirs.
    static KEY_COLUMNS: RefCell<HashMap<pg_sys::Oid, KeyColumn>> = RefCell::new(HashMap::new());
    // The output function of a KeyForm::Output type, looked up once per type; what fmgr_info_cxt allocates
    // lives in TopMemoryContext as long as the entry, which is never dropped (there are a few key types).
    static OUTPUTS: RefCell<HashMap<pg_sys::Oid, Box<pg_sys::FmgrInfo>>> = RefCell::new(HashMap::new());
}

/// PostgreSQL's `TopSubTransactionId` (access/xact.h, a macro pgrx does not bind): the top-level transaction's
/// own number, below every subtransaction's.
const TOP_SUBTRANSACTION: pg_sys::SubTransactionId = 1;

static mut PREVIOUS_EXECUTOR_FINISH: pg_sys::ExecutorFinish_hook_type = None;

/// Registers the callbacks that drop gathered keys when their (sub)transaction ends, and the ExecutorFinish
/// hook that queues a partition's keys when its statement ends (`COPY` comes through rag's ProcessUtility
/// hook, `crate::pg`, to [`after_copy`]). Called once per process from `_PG_init`, preloaded or not: a
/// backend that loads the library when a row trigger first fires queues that statement's partition keys at
/// its next statement's end or at its commit.
pub fn install() {
    // SAFETY: `_PG_init` runs once per process on its only thread, before any statement of ours; the callback
    // calls copy the pointer into lists they own, and the previous hooks are kept and always called.
    unsafe {
        pg_sys::RegisterXactCallback(Some(at_transaction_end), std::ptr::null_mut());
        pg_sys::RegisterSubXactCallback(Some(at_subtransaction_end), std::ptr::null_mut());
        PREVIOUS_EXECUTOR_FINISH = pg_sys::ExecutorFinish_hook;
        pg_sys::ExecutorFinish_hook = Some(queue_keys_after_executor_finish);
    }
}

/// Whether a statement's end may find partition keys to queue; cheap, for every statement of every database.
/// Never panics (the hooks that ask are not guarded).
fn keys_wait_for_statement_end() -> bool {
    AT_STATEMENT_END.with(|pending| {
        pending
            .try_borrow()
            .is_ok_and(|pending| !pending.is_empty())
    })
}

/// Not `#[pg_guard]`, as rag's ProcessUtility hook (`crate::pg`): an ERROR of the statement travels to
/// PostgreSQL's handler untouched. Sound because this frame owns nothing that needs dropping. PostgreSQL has
/// fired every AFTER trigger of the statement (row and statement events) by the time the standard function
/// returns.
// SAFETY (for callers): PostgreSQL calls it with the QueryDesc of ExecutorFinish(), valid for the call.
unsafe extern "C-unwind" fn queue_keys_after_executor_finish(query_desc: *mut pg_sys::QueryDesc) {
    // SAFETY: PostgreSQL's own argument, passed on unchanged, as ExecutorFinish() would without us; the
    // previous hook was stored once by `install` before any statement ran, and is only read since.
    match PREVIOUS_EXECUTOR_FINISH {
        Some(previous) => previous(query_desc),
        None => crate::pg::standard_executor_finish_unguarded(query_desc),
    }
    if keys_wait_for_statement_end() {
        queue_keys_at_statement_end();
    }
}

/// Whether a utility statement is `COPY`: `COPY … FROM` fires row triggers without going through the
/// executor's finish; no other utility statement writes rows that fire them (a procedure's or a prepared
/// statement's own statements each pass ExecutorFinish). Asked by rag's ProcessUtility hook (`crate::pg`)
/// before the command runs.
///
/// # Safety
/// `pstmt` is the hook's own statement pointer, NULL or a valid PlannedStmt.
pub unsafe fn is_copy(pstmt: *mut pg_sys::PlannedStmt) -> bool {
    !pstmt.is_null()
        && !(*pstmt).utilityStmt.is_null()
        && (*(*pstmt).utilityStmt).type_ == pg_sys::NodeTag::T_CopyStmt
}

/// After a `COPY` ran: queues what its rows' triggers gathered for a statement's end.
pub fn after_copy() {
    if keys_wait_for_statement_end() {
        queue_keys_at_statement_end();
    }
}

/// Queues, one batch per watch and table, the partition keys gathered since the current subtransaction began:
/// those of the statement that just ended and of any statement inside it that has not queued its own. Keys of
/// an enclosing subtransaction stay for their own statement's end, so that no batch is written where a
/// rollback would undo it while the rows stay.
#[pg_guard]
extern "C-unwind" fn queue_keys_at_statement_end() {
    // SAFETY: reads the transaction's state and the current subtransaction's id; neither raises.
    let (in_transaction, subtransaction) = unsafe {
        (
            pg_sys::IsTransactionState(),
            pg_sys::GetCurrentSubTransactionId(),
        )
    };
    if !in_transaction {
        return;
    }
    queue_keys_since(subtransaction).unwrap_or_raise();
}

/// PostgreSQL's trigger nesting depth now (`pg_trigger_depth()`): 0 in a client's statement, one more inside
/// each trigger function being called. Called once per row written to a watched partition: the call frame is a
/// zeroed local rather than pgrx's palloc'd one.
fn trigger_depth() -> i32 {
    // SAFETY: FunctionCallInfoBaseData is plain data (its argument array is a zero-length tail); a zeroed
    // frame with no arguments is what an argument-less V1 function is called with, and pg_trigger_depth only
    // returns a counter, reading nothing of the frame.
    let depth = unsafe {
        let mut frame: pg_sys::FunctionCallInfoBaseData = std::mem::zeroed();
        pg_sys::pg_trigger_depth(&mut frame)
    };
    depth.value() as i32
}

/// Takes the statement-end keys gathered since `subtransaction` began by row triggers deeper than the current
/// trigger depth (all of them at a commit: [`TOP_SUBTRANSACTION`], at depth 0), then queues them through
/// `rag._queue_gathered_keys` as rag's owner.
fn queue_keys_since(subtransaction: pg_sys::SubTransactionId) -> Result<(), RagError> {
    let depth = trigger_depth();
    // Taken before any SQL runs: the queueing's own statements end too, and find nothing left to queue.
    let taken = AT_STATEMENT_END
        .with(|pending| {
            pending
                .borrow_mut()
                .take_where(subtransaction, |&(gathered_at, _)| gathered_at > depth)
        })
        .map_err(too_many_keys)?;
    if taken.is_empty() {
        return Ok(());
    }
    let function = queue_function()?;
    for ((_, target), literal) in taken {
        queue_batch(function, target, literal)?;
    }
    Ok(())
}

/// Writes one batch of `target`'s keys (an array literal) through `rag._queue_gathered_keys` as rag's owner.
fn queue_batch(function: pg_sys::Oid, target: Target, literal: Vec<u8>) -> Result<(), RagError> {
    let (watch, table) = target;
    // Text keys are gathered this way only in a UTF-8 database (rag._watch_install), numbers are ASCII.
    let literal = String::from_utf8(literal).map_err(|_| {
        RagError::Internal(format!("the keys gathered for watch {watch} are not UTF-8"))
    })?;
    // SAFETY: `function` is rag._queue_gathered_keys(integer, oid, text), looked up by that signature; the
    // datums are of those types (the text palloc'd in the current memory context). It is called as
    // PostgreSQL calls a trigger function, without an EXECUTE check (granted to no one): its SECURITY
    // DEFINER handler runs it as rag's owner with its pinned search_path. It never returns NULL.
    unsafe {
        pg_sys::OidFunctionCall3Coll(
            function,
            pg_sys::InvalidOid,
            pg_sys::Datum::from(watch),
            pg_sys::Datum::from(pg_sys::Oid::from(table)),
            literal.into_datum().expect("a String always makes a datum"),
        );
    }
    Ok(())
}

/// The oid of `rag._queue_gathered_keys(integer, oid, text)`, found in the catalog by schema, name and
/// argument types, as PostgreSQL finds a trigger's function: no privilege of the writer's is checked (who may
/// write the table need not have USAGE on schema rag, and PostgreSQL's name lookup would require it), and no
/// search_path or type name is parsed. An error when the extension's SQL is older than its library.
fn queue_function() -> Result<pg_sys::Oid, RagError> {
    let function = crate::pg::rag_function(
        c"_queue_gathered_keys",
        &[pg_sys::INT4OID, pg_sys::OIDOID, pg_sys::TEXTOID],
    );
    if function == pg_sys::InvalidOid {
        return Err(RagError::undefined(
            "rag._queue_gathered_keys(integer, oid, text) does not exist, so the keys a watched partition \
             gathered cannot be queued"
                .to_string(),
            "Run ALTER EXTENSION rag UPDATE: the rag library is newer than the extension's SQL.",
        ));
    }
    Ok(function)
}

// SAFETY (for callers): PostgreSQL calls it at transaction events with the argument registered (NULL).
#[pg_guard]
unsafe extern "C-unwind" fn at_transaction_end(
    event: pg_sys::XactEvent::Type,
    _argument: *mut std::ffi::c_void,
) {
    let committing = matches!(
        event,
        pg_sys::XactEvent::XACT_EVENT_PRE_COMMIT | pg_sys::XactEvent::XACT_EVENT_PRE_PREPARE
    );
    if !committing && !crate::pg::ends_transaction(event) {
        return;
    }
    // SAFETY: XactReadOnly is PostgreSQL's flag for the open transaction, read on its only thread.
    let read_only = pg_sys::XactReadOnly;
    if committing && keys_wait_for_statement_end() && !read_only {
        // Row events fired where no statement end of ours was seen: queued with the transaction still open
        // (after its deferred triggers); an error here rolls the transaction back, as a deferred trigger's.
        // No statement runs now, so no snapshot is active; SQL needs one, as PostgreSQL gives its deferred
        // triggers (an error's abort pops it). A transaction made read-only after its writes (SET
        // TRANSACTION READ ONLY) cannot write the queue: its keys are named in a WARNING below rather than
        // failing its COMMIT.
        // SAFETY: snapshot bookkeeping of the open transaction, pushed and popped in pairs.
        let push_snapshot = !pg_sys::ActiveSnapshotSet();
        if push_snapshot {
            pg_sys::PushActiveSnapshot(pg_sys::GetTransactionSnapshot());
        }
        queue_keys_since(TOP_SUBTRANSACTION).unwrap_or_raise();
        if push_snapshot {
            pg_sys::PopActiveSnapshot();
        }
    }
    // try_borrow_mut: no borrow can be live here (every one is plain Rust that cannot raise), and a panic
    // inside transaction end must not be risked on the chance.
    let left_at_end = AT_STATEMENT_END.with(|pending| match pending.try_borrow_mut() {
        Ok(mut pending) if !pending.is_empty() => pending.clear(),
        _ => Vec::new(),
    });
    let left = PENDING.with(|pending| match pending.try_borrow_mut() {
        Ok(mut pending) if !pending.is_empty() => pending.clear(),
        _ => Vec::new(),
    });
    if committing {
        for ((_, (_, table)), keys) in left_at_end {
            warning!(
                "rag: the keys of {keys} row(s) written to {} were not queued for indexing: the transaction \
                 was made read-only after writing them; rag_reindex on the watched table queues its rows again",
                table_name(table)
            );
        }
        for ((_, table), keys) in left {
            let name = table_name(table);
            warning!(
                "rag: the keys of {keys} row(s) written to {name} were not queued for indexing: the \
                 watch's statement trigger did not run (disabled, or the rows were written through a parent \
                 table, or the trigger is not on the watched table); rag_reindex on the watched table queues \
                 its rows again"
            );
        }
    }
}

/// A table's name for a WARNING at commit, quoted; its oid when the table is gone.
fn table_name(table: u32) -> String {
    // SAFETY: a syscache lookup by oid, still inside the transaction; NULL when the table is gone.
    let name = unsafe { pg_sys::get_rel_name(pg_sys::Oid::from(table)) };
    if name.is_null() {
        format!("the table of oid {table}")
    } else {
        // SAFETY: get_rel_name returns a palloc'd NUL-terminated copy of the name.
        let name = unsafe { std::ffi::CStr::from_ptr(name) };
        format!("\"{}\"", name.to_string_lossy())
    }
}

// SAFETY (for callers): PostgreSQL calls it at subtransaction events with the subtransaction's id.
#[pg_guard]
unsafe extern "C-unwind" fn at_subtransaction_end(
    event: pg_sys::SubXactEvent::Type,
    subtransaction: pg_sys::SubTransactionId,
    _parent: pg_sys::SubTransactionId,
    _argument: *mut std::ffi::c_void,
) {
    if event == pg_sys::SubXactEvent::SUBXACT_EVENT_ABORT_SUB {
        PENDING.with(|pending| {
            if let Ok(mut pending) = pending.try_borrow_mut() {
                if !pending.is_empty() {
                    pending.forget_since(subtransaction);
                }
            }
        });
        AT_STATEMENT_END.with(|pending| {
            if let Ok(mut pending) = pending.try_borrow_mut() {
                if !pending.is_empty() {
                    pending.forget_since(subtransaction);
                }
            }
        });
    }
}

/// The attribute of `descriptor` at zero-based `index`; None past its `natts` (PostgreSQL 18 lays the
/// attributes out after a compact copy of them, so pgrx finds them).
///
/// # Safety
/// `descriptor` is a live tuple descriptor, which outlives the reference returned ('a).
unsafe fn attribute_at<'a>(
    descriptor: pg_sys::TupleDesc,
    index: usize,
) -> Option<&'a pg_sys::FormData_pg_attribute> {
    // SAFETY: the caller vouches for the descriptor; it is borrowed, not released (the relation owns it), and
    // the attribute lives in it, so the reference may outlive the wrapper.
    let borrowed = PgTupleDesc::from_pg_unchecked(descriptor);
    borrowed
        .get(index)
        .map(|attribute| &*(attribute as *const pg_sys::FormData_pg_attribute))
}

/// The name of an attribute, which PostgreSQL keeps NUL-terminated in its NameData; as bytes, not pgrx's
/// `FormData_pg_attribute::name()`, which unwraps it as UTF-8 and would panic on another encoding's name.
fn attribute_name(attribute: &pg_sys::FormData_pg_attribute) -> &std::ffi::CStr {
    // SAFETY: NameData is a fixed NAMEDATALEN buffer that PostgreSQL always NUL-terminates.
    unsafe { std::ffi::CStr::from_ptr(attribute.attname.data.as_ptr()) }
}

/// The column named `column` of `descriptor`, and how to write its values; an error when it is gone.
///
/// # Safety
/// `descriptor` is the tuple descriptor of the relation the trigger fired on.
unsafe fn find_key_column(
    descriptor: pg_sys::TupleDesc,
    trigger: pg_sys::Oid,
    column: &std::ffi::CStr,
) -> Result<KeyColumn, RagError> {
    // SAFETY: the caller vouches for the descriptor (the trigger's relation, open and locked for the call).
    let natts = (*descriptor).natts;
    for index in 0..natts {
        let Some(attribute) = attribute_at(descriptor, index as usize) else {
            break;
        };
        if attribute.attisdropped || attribute_name(attribute) != column {
            continue;
        }
        let type_oid = attribute.atttypid;
        let form = match pg_sys::getBaseType(type_oid) {
            pg_sys::INT2OID => KeyForm::Integer(2),
            pg_sys::INT4OID => KeyForm::Integer(4),
            pg_sys::INT8OID => KeyForm::Integer(8),
            pg_sys::TEXTOID | pg_sys::VARCHAROID => KeyForm::Text,
            _ => KeyForm::Output(type_oid),
        };
        return Ok(KeyColumn {
            trigger,
            attribute: index + 1,
            type_oid,
            form,
        });
    }
    Err(RagError::undefined(
        format!(
            "the key column \"{}\" of a watched table is gone",
            column.to_string_lossy()
        ),
        "Run rag_watch again for the table (or rag_unwatch it).",
    ))
}

/// Whether the kept column still describes `descriptor` (a column renamed, dropped or altered since changes
/// the table's descriptor between statements, never within one).
///
/// # Safety
/// As for [`find_key_column`].
unsafe fn still_fits(
    kept: &KeyColumn,
    descriptor: pg_sys::TupleDesc,
    trigger: pg_sys::Oid,
    column: &std::ffi::CStr,
) -> bool {
    if kept.trigger != trigger {
        return false;
    }
    // SAFETY: the caller vouches for the descriptor; attribute_at checks the index against its natts.
    match attribute_at(descriptor, kept.attribute as usize - 1) {
        Some(attribute) => {
            !attribute.attisdropped
                && attribute.atttypid == kept.type_oid
                && attribute_name(attribute) == column
        }
        None => false,
    }
}

/// The text of a non-NULL key as its output function writes it.
///
/// # Safety
/// `value` is a datum of type `type_oid`.
unsafe fn output_text(type_oid: pg_sys::Oid, value: pg_sys::Datum) -> Vec<u8> {
    // The FmgrInfo is taken out of the map for the call, so that no borrow is live if the output function
    // raises, and put back after.
    let kept = OUTPUTS.with(|outputs| outputs.borrow_mut().remove(&type_oid));
    let mut info = kept.unwrap_or_else(|| {
        let mut function = pg_sys::InvalidOid;
        let mut varlena = false;
        pg_sys::getTypeOutputInfo(type_oid, &mut function, &mut varlena);
        // SAFETY: FmgrInfo is plain data that fmgr_info_cxt fills in; what it allocates lives in
        // TopMemoryContext, as long as the Box that holds it.
        let mut info: Box<pg_sys::FmgrInfo> = Box::new(std::mem::zeroed());
        pg_sys::fmgr_info_cxt(function, info.as_mut(), pg_sys::TopMemoryContext);
        info
    });
    // SAFETY: the caller vouches that `value` is of `type_oid`, whose output function `info` holds; it returns
    // a palloc'd NUL-terminated string, copied before it is freed.
    let text = pg_sys::OutputFunctionCall(info.as_mut(), value);
    let bytes = std::ffi::CStr::from_ptr(text).to_bytes().to_vec();
    pg_sys::pfree(text.cast());
    OUTPUTS.with(|outputs| outputs.borrow_mut().insert(type_oid, info));
    bytes
}

/// A key's text as the array literal takes it.
#[derive(PartialEq)]
enum KeyText {
    Null,
    /// An integer's text, written as it is.
    Bare(Vec<u8>),
    /// Any other value's text, written in double quotes.
    Quoted(Vec<u8>),
}

/// The key column's text in `tuple`.
///
/// # Safety
/// `tuple` is a row of the relation `descriptor` describes, and `key` was found in that descriptor.
unsafe fn key_text(
    key: &KeyColumn,
    tuple: pg_sys::HeapTuple,
    descriptor: pg_sys::TupleDesc,
) -> KeyText {
    let mut is_null = false;
    // SAFETY: the caller vouches that tuple and descriptor match and that the attribute is the key's; its
    // form was read from the attribute's type, so the datum is an integer of that width, a text varlena
    // (detoasted into the trigger's memory context), or a value of the type output_text is given.
    let value = pg_sys::heap_getattr(tuple, key.attribute, descriptor, &mut is_null);
    if is_null {
        return KeyText::Null;
    }
    match key.form {
        KeyForm::Integer(width) => {
            let number: i64 = match width {
                2 => i64::from(value.value() as i16),
                4 => i64::from(value.value() as i32),
                _ => value.value() as i64,
            };
            KeyText::Bare(number.to_string().into_bytes())
        }
        KeyForm::Text => {
            let detoasted = pg_sys::pg_detoast_datum_packed(value.cast_mut_ptr());
            KeyText::Quoted(pgrx::varlena::varlena_to_byte_slice(detoasted).to_vec())
        }
        KeyForm::Output(type_oid) => KeyText::Quoted(output_text(type_oid, value)),
    }
}

/// Which of the two buffers a row trigger keeps its keys in.
#[derive(Clone, Copy)]
enum TakenBy {
    /// The watch's statement trigger (`rag._watch_keys_taken`).
    StatementTrigger,
    /// rag, when the statement ends or the transaction commits (a partition's or an inheritance child's keys,
    /// and those of a replica trigger), kept by the trigger depth the row trigger runs at, its own call included.
    StatementEnd { depth: i32 },
}

fn keep(
    buffer: TakenBy,
    watch: Target,
    subtransaction: pg_sys::SubTransactionId,
    text: KeyText,
) -> Result<(), RagError> {
    let key = match &text {
        KeyText::Null => Key::Null,
        KeyText::Bare(bytes) => Key::Bare(bytes),
        KeyText::Quoted(bytes) => Key::Quoted(bytes),
    };
    match buffer {
        TakenBy::StatementTrigger => PENDING
            .with(|pending| pending.borrow_mut().push(watch, subtransaction, key))
            .map_err(too_many_keys),
        TakenBy::StatementEnd { depth } => {
            // Taken out while borrowed, queued after: the queueing's own statements end, and that end looks
            // at what is kept. Only what this subtransaction gathered is handed on, so its rollback undoes the
            // batches together with the rows (PendingKeys::keep_or_hand_on).
            let ready = AT_STATEMENT_END
                .with(|pending| {
                    pending.borrow_mut().keep_or_hand_on(
                        (depth, watch),
                        subtransaction,
                        key,
                        crate::limits::WATCH_KEYS_FLUSH_BYTES,
                    )
                })
                .map_err(too_many_keys)?;
            if !ready.is_empty() {
                let function = queue_function()?;
                for literal in ready {
                    queue_batch(function, watch, literal)?;
                }
            }
            Ok(())
        }
    }
}

fn too_many_keys(error: KeysError) -> RagError {
    let message = match error {
        KeysError::TooLarge { limit } => format!(
            "the keys of the rows this statement wrote to a watched table pass {limit} bytes of text"
        ),
        KeysError::OutOfMemory => {
            "out of memory keeping the keys of the rows this statement wrote to a watched table".to_string()
        }
    };
    RagError::Resources {
        message,
        hint: "Write the rows in several statements.".to_string(),
    }
}

/// Gathers the key of the row an AFTER INSERT, UPDATE or DELETE row trigger fired for: the new row's, and the
/// old row's too when an UPDATE changed the key (the document of the old key must go); a deleted row's.
///
/// # Safety
/// `data` is the TriggerData PostgreSQL passed to the trigger function.
unsafe fn gather(data: &pg_sys::TriggerData) -> Result<(), RagError> {
    let event = data.tg_event;
    // SAFETY: PostgreSQL's TriggerData points at its live Trigger, relation and tuples for the call; the
    // checks below make sure it is the row event this function is installed for, with its two or three
    // arguments (tgnargs C strings in the trigger's catalog copy) and the tuples read below, before any of
    // them is read.
    let trigger = &*data.tg_trigger;
    let operation = event & pg_sys::TRIGGER_EVENT_OPMASK;
    let is_update = operation == pg_sys::TRIGGER_EVENT_UPDATE;
    if !(operation == pg_sys::TRIGGER_EVENT_INSERT
        || is_update
        || operation == pg_sys::TRIGGER_EVENT_DELETE)
        || event & pg_sys::TRIGGER_EVENT_ROW == 0
        || event & pg_sys::TRIGGER_EVENT_TIMINGMASK != pg_sys::TRIGGER_EVENT_AFTER
        || !(trigger.tgnargs == 2 || trigger.tgnargs == 3)
        || data.tg_trigtuple.is_null()
        || (is_update && data.tg_newtuple.is_null())
    {
        return Err(RagError::invalid(
            "rag._watch_key is only the AFTER INSERT, UPDATE or DELETE row trigger rag_watch installs",
            "Run rag_watch again for the table.",
        ));
    }
    let arguments = std::slice::from_raw_parts(trigger.tgargs, trigger.tgnargs as usize);
    let buffer = match arguments
        .get(2)
        .map(|argument| std::ffi::CStr::from_ptr(*argument))
    {
        None => TakenBy::StatementTrigger,
        Some(taken_by) if taken_by.to_bytes() == b"statement_end" => TakenBy::StatementEnd {
            depth: trigger_depth(),
        },
        // A watch's replica trigger: it gathers only where a logical-replication apply worker (or a session
        // that set the role itself) writes, whoever enabled it ALWAYS or ORIGIN. Asked here rather than in a
        // WHEN clause, which the apply worker compiles again for every row it applies (a new executor state
        // per change): about 4.5 µs a row, half of what the watch added to a streamed transaction
        // (BENCHMARKS.md §3, "Rows a subscriber applies").
        Some(taken_by) if taken_by.to_bytes() == b"replica" => {
            // SAFETY: PostgreSQL's setting of this backend, read by value on its only thread.
            if pg_sys::SessionReplicationRole != pg_sys::SESSION_REPLICATION_ROLE_REPLICA as i32 {
                return Ok(());
            }
            TakenBy::StatementEnd {
                depth: trigger_depth(),
            }
        }
        Some(_) => {
            return Err(RagError::invalid(
                "rag._watch_key's third argument, when given, is 'statement_end' or 'replica'",
                "Run rag_watch again for the table.",
            ))
        }
    };
    let watch: i32 = std::ffi::CStr::from_ptr(arguments[0])
        .to_str()
        .ok()
        .and_then(|text| text.parse().ok())
        .ok_or_else(|| {
            RagError::invalid(
                "rag._watch_key was given no watch id",
                "Run rag_watch again for the table.",
            )
        })?;
    let column = std::ffi::CStr::from_ptr(arguments[1]);
    let descriptor = (*data.tg_relation).rd_att;
    let kept = KEY_COLUMNS.with(|columns| columns.borrow().get(&trigger.tgoid).copied());
    let key = match kept {
        Some(kept) if still_fits(&kept, descriptor, trigger.tgoid, column) => kept,
        _ => {
            let found = find_key_column(descriptor, trigger.tgoid, column)?;
            KEY_COLUMNS.with(|columns| {
                let mut columns = columns.borrow_mut();
                if columns.len() >= crate::limits::KEPT_STATEMENTS {
                    columns.clear();
                }
                columns.insert(trigger.tgoid, found);
            });
            found
        }
    };
    let subtransaction = pg_sys::GetCurrentSubTransactionId();
    let watch = (watch, (*data.tg_relation).rd_id.to_u32());
    // For an UPDATE, tg_trigtuple is the old row and tg_newtuple the new one.
    if is_update {
        let new = key_text(&key, data.tg_newtuple, descriptor);
        let old = key_text(&key, data.tg_trigtuple, descriptor);
        let key_changed = new != old;
        keep(buffer, watch, subtransaction, new)?;
        if key_changed {
            keep(buffer, watch, subtransaction, old)?;
        }
    } else {
        // The inserted row, or the deleted one.
        keep(
            buffer,
            watch,
            subtransaction,
            key_text(&key, data.tg_trigtuple, descriptor),
        )?;
    }
    Ok(())
}

/// Who may take the keys gathered on `table` for `watch`: the table's owner (or a role with their rights), or
/// the owner of a function of that watch's in schema rag that a trigger on the table runs. Every caller rag
/// makes is such a function, SECURITY DEFINER as its owner: the watch's statement trigger, which its install
/// gives the table's owner, and the silenced or set-aside ones a dropped collection or a reused watch id
/// leaves on the table, which keep the owner they had when the table changes hands (refused, every write to
/// the table failed). EXECUTE is granted to every owner of a watched table and the keys are the writer's
/// session's, so without this check an owner of some watched table who may write another owner's took the
/// keys of their own writes there from a trigger of theirs that fired before the watch's statement trigger (a
/// CTE's UPDATE feeding an INSERT into their table): those writes were never queued, and a row handed to them
/// and redacted in the same UPDATE kept its old text in the index, shown to them (helper-89). Nobody but rag
/// makes functions in schema rag, and a role's own watch functions are named after its own watches.
fn may_take_keys_of(watch: i32, table: pg_sys::Oid) -> Result<(), RagError> {
    let owner = crate::security::relation_owner(table);
    // SAFETY: GetUserId reads a backend global.
    let user = unsafe { pg_sys::GetUserId() };
    // SAFETY: has_privs_of_role reads the role cache and raises nothing for existing roles (the owner came
    // from the catalog, the user is the current one).
    if owner != pg_sys::InvalidOid && unsafe { pg_sys::has_privs_of_role(user, owner) } {
        return Ok(());
    }
    // Catalogs only, which row-level security never hides.
    let runs_it = Spi::connect(|client| {
        client
            .select(
                "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_trigger t \
                                  JOIN pg_catalog.pg_proc p ON p.oid = t.tgfoid \
                                 WHERE t.tgrelid = $1 AND p.proowner = $2 \
                                   AND p.pronamespace = 'rag'::pg_catalog.regnamespace \
                                   AND p.proname ~ $3)",
                Some(1),
                &[
                    table.into(),
                    user.into(),
                    format!("^_watch_{watch}(_left_[0-9]+)?$").into(),
                ],
            )?
            .first()
            .get_one::<bool>()
    })
    .map_err(|error| RagError::Spi {
        doing: format!("checking who may take the keys gathered for watch {watch}"),
        error,
    })?;
    if runs_it == Some(true) {
        return Ok(());
    }
    Err(RagError::InsufficientPrivilege {
        message: format!(
            "only the owner of {} may take the keys gathered for its watch",
            table_name(table.to_u32())
        ),
        hint: "rag._watch_keys_taken is for the statement trigger functions rag makes for the watch, which run \
               as the table's owner (or, left by a watch that is gone, as their own)."
            .into(),
    })
}

/// The keys of `watch` gathered on `table` since the current subtransaction began, as array text.
fn take(watch: i32, table: pg_sys::Oid) -> Result<Option<String>, RagError> {
    // SAFETY: reads the current subtransaction's id; never raises.
    let subtransaction = unsafe { pg_sys::GetCurrentSubTransactionId() };
    let Some(literal) = PENDING
        .with(|pending| {
            pending
                .borrow_mut()
                .take((watch, table.to_u32()), subtransaction)
        })
        .map_err(too_many_keys)?
    else {
        return Ok(None);
    };
    // Text keys are gathered this way only in a UTF-8 database (rag._watch_install), numbers are ASCII.
    String::from_utf8(literal).map(Some).map_err(|_| {
        RagError::Internal(format!("the keys gathered for watch {watch} are not UTF-8"))
    })
}

#[pg_schema]
pub mod rag {
    use super::*;
    use pgrx::heap_tuple::PgHeapTuple;
    use pgrx::{AllocatedByRust, PgTrigger};

    /// The row trigger of a watch's writes (`AFTER INSERT`, `UPDATE` or `DELETE … FOR EACH ROW`,
    /// arguments: the watch's id, its key column, and for a partition or an inheritance child
    /// `'statement_end'`, for a replica trigger `'replica'`): keeps the row's key for the watch's statement
    /// trigger, or for rag to queue when the statement ends or the transaction commits; a replica trigger
    /// does nothing unless `session_replication_role` is `replica`. Runs as whoever writes, reads only the key
    /// column, and runs no SQL but to queue keys rag keeps for a statement's end early (past
    /// `WATCH_KEYS_FLUSH_BYTES` for a table, or `WATCH_KEYS_BYTES` in all).
    #[pg_trigger]
    fn _watch_key<'a>(
        trigger: &'a PgTrigger<'a>,
    ) -> Result<Option<PgHeapTuple<'a, AllocatedByRust>>, std::convert::Infallible> {
        // SAFETY: PostgreSQL called this as a trigger (PgTrigger checked), so its TriggerData is live for the call.
        unsafe { gather(trigger.trigger_data()) }.unwrap_or_raise();
        Ok(None)
    }

    /// The keys of rows inserted into, updated in or deleted from `source` that watch `watch_id`'s row trigger gathered
    /// there since the current subtransaction began, as the text of an array; NULL when there are none. They
    /// are forgotten here, so that each is queued once. Called by the watch's statement trigger with its
    /// TG_RELID, and refused to any caller `may_take_keys_of` does not accept.
    #[pg_extern(volatile, parallel_unsafe, name = "_watch_keys_taken")]
    pub fn watch_keys_taken(watch_id: i32, source: pg_sys::Oid) -> Option<String> {
        super::may_take_keys_of(watch_id, source).unwrap_or_raise();
        super::take(watch_id, source).unwrap_or_raise()
    }
}
