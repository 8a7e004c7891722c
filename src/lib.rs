//! `rag`: retrieval-augmented generation inside PostgreSQL.
//!
//! This crate is the Postgres glue only. Each pipeline stage that needs no Postgres lives in its own crate
//! (`crates/extract`, `crates/chunk`, `crates/embed`, `crates/answer`) and is tested with plain `cargo test`;
//! the SQL that stores and retrieves lives in `sql/`, and the modules here wire the two together:
//! - [`settings`]: the `rag.*` GUCs;
//! - [`api`]: SQL-callable functions implemented in Rust (chunk inspection, query embedding, model listing);
//! - [`worker`]: the launcher, the per-database workers and the wake-up registry in shared memory;
//! - [`store`]: the SPI calls the worker makes into the `rag` schema's functions.
use pgrx::prelude::*;

pub mod api;
pub mod error;
pub mod frames;
pub mod kept;
pub mod limits;
pub mod pg;
pub mod plans;
pub mod provider;
pub mod security;
pub mod settings;
pub mod store;
pub mod worker;

::pgrx::pg_module_magic!();

// The tables, views and roles come first; the Rust functions are created after them (pgrx orders them by
// the `requires` lists), and the SQL functions that call Rust ones come last.
extension_sql_file!("../sql/schema.sql", name = "schema", bootstrap);
extension_sql_file!(
    "../sql/collections.sql",
    name = "collections",
    requires = [
        "schema",
        api::chunk::rag::validate_chunking,
        api::query::rag::local_model_window,
        api::rerank::rag::check_reranker,
        api::rerank::rag::reranker_installed,
        api::models::rag::model_prefixes,
        api::rag::setting,
        limits::rag::limit
    ]
);
extension_sql_file!(
    "../sql/ingest.sql",
    name = "ingest",
    requires = [
        "collections",
        worker::wake::rag::wake_worker,
        plans::rag::replan_if_tables_grew,
        api::rag::setting,
        limits::rag::limit
    ]
);
extension_sql_file!(
    "../sql/retrieve.sql",
    name = "retrieve",
    requires = [
        "ingest",
        api::query::rag::embed_query_in,
        api::rerank::rag::rerank
    ]
);
extension_sql_file!(
    "../sql/watch.sql",
    name = "watch",
    requires = [
        "ingest",
        api::watch::rag::check_expression,
        api::watch::rag::query_as,
        api::watch_keys::rag::watch_keys_taken,
        api::rag::restrict_to_current_user,
        api::rag::acting_for,
        api::extract::rag::to_text,
        api::query::rag::local_model_window,
        api::query::rag::embed_text
    ]
);
extension_sql_file!(
    "../sql/answer.sql",
    name = "answer",
    requires = ["retrieve", api::rag::calling_role]
);
extension_sql_file!("../sql/security.sql", name = "security", finalize);

#[pg_guard]
pub extern "C-unwind" fn _PG_init() {
    keep_backtraces_out_of_errors();
    pg::remember_how_loaded();
    settings::define();
    // In every process that loads the library, preloaded or not: rag's privilege checks need to know whose
    // code is running (frames.rs).
    frames::install(pg::preloading());
    api::watch::install();
    api::watch_keys::install();
    api::ledger_trail::install();
    pg::install_process_utility(pg::preloading());
    api::search::install();
    if pg::preloading() {
        worker::registry::init_shared_memory();
        api::extraction_slots::init_shared_memory();
        // pg_upgrade runs both servers in binary-upgrade mode while it dumps the old cluster's schema and
        // restores it into the new one: no worker may write to a database then (an object it made would take
        // an oid the restore is about to assign, or change what is being dumped).
        // SAFETY: a postmaster global, set from its command line before shared_preload_libraries are loaded.
        if !unsafe { pg_sys::IsBinaryUpgrade } {
            worker::launcher::register();
        }
    }
}

/// pgrx's panic hook captures a Rust backtrace whenever the environment allows one (RUST_BACKTRACE set in the
/// shell that started the server is enough) and appends it to the DETAIL of every error that passed through
/// Rust, where every client sees it. `RUST_LIB_BACKTRACE=0` takes precedence over RUST_BACKTRACE for captured
/// backtraces only, so panics on our own threads still print theirs to the server log. Set in the postmaster
/// when preloaded (every backend inherits it, and the decision `std` caches), else in the backend loading us.
fn keep_backtraces_out_of_errors() {
    if std::env::var_os("RUST_LIB_BACKTRACE").as_deref() != Some(std::ffi::OsStr::new("0")) {
        // SAFETY (of the environment write): `_PG_init` runs while the process has a single thread: the
        // postmaster before it forks, or a backend loading the library before any of our threads exist.
        std::env::set_var("RUST_LIB_BACKTRACE", "0");
    }
}
