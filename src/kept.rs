//! Statements prepared once per backend and kept (SPI_keepplan), by their text and parameter types: the
//! reader's row checks (`rag._query_as`) and the search (`rag._search_rows`) run the same few statements over
//! and over, and planning the search each time cost a third of running it (BENCHMARKS.md §3). PostgreSQL's plan
//! cache plans a kept statement again when what it reads changes (a partition attached, an index dropped),
//! when the role differs under row-level security and when the search_path differs, so one kept statement
//! serves every role and path.
use pgrx::pg_sys;
use pgrx::spi::{OwnedPreparedStatement, SpiClient, SpiResult};
use pgrx::PgOid;
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

thread_local! {
    // PostgreSQL runs a backend's SQL on one thread. In an `Rc` so that a statement is never freed while it
    // runs (a statement run inside another may fill the map and clear it).
    static KEPT: RefCell<HashMap<String, Rc<OwnedPreparedStatement>>> = RefCell::new(HashMap::new());
}

/// `sql` prepared with parameters of `arg_types`, from the backend's kept statements or prepared now and kept.
/// Past [`crate::limits::KEPT_STATEMENTS`] the lot is dropped and prepared again as needed: a backend that
/// searched many collections or ran many watches' expressions keeps no more than that many plans.
pub fn statement(
    client: &SpiClient<'_>,
    sql: &str,
    arg_types: &[pg_sys::Oid],
) -> SpiResult<Rc<OwnedPreparedStatement>> {
    let key = key(sql, arg_types);
    if let Some(statement) = KEPT.with(|kept| kept.borrow().get(&key).cloned()) {
        return Ok(statement);
    }
    let types: Vec<PgOid> = arg_types
        .iter()
        .map(|oid| PgOid::from_untagged(*oid))
        .collect();
    let statement = Rc::new(client.prepare(sql, &types)?.keep());
    KEPT.with(|kept| {
        let mut kept = kept.borrow_mut();
        if kept.len() >= crate::limits::KEPT_STATEMENTS {
            kept.clear();
        }
        kept.insert(key, Rc::clone(&statement));
    });
    Ok(statement)
}

/// The map's key: the parameter types, then the text (the same text with other types is another statement).
fn key(sql: &str, arg_types: &[pg_sys::Oid]) -> String {
    let mut key = String::with_capacity(sql.len() + 8 * arg_types.len() + 1);
    for oid in arg_types {
        key.push_str(&oid.to_u32().to_string());
        key.push(',');
    }
    key.push('|');
    key.push_str(sql);
    key
}
