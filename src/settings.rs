//! The `rag.*` configuration parameters. Collections copy the embedding defaults when they are created, so
//! changing a default later never changes the vector space of an existing collection.
use pgrx::guc::{GucContext, GucFlags, GucRegistry, GucSetting};
use std::ffi::CString;
use std::time::Duration;

pub static OLLAMA_URL: GucSetting<Option<CString>> =
    GucSetting::<Option<CString>>::new(Some(c"http://127.0.0.1:11434"));
pub static EMBEDDING_MODEL: GucSetting<Option<CString>> =
    GucSetting::<Option<CString>>::new(Some(c"nomic-embed-text"));
pub static CHAT_MODEL: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(Some(c""));
pub static OPENAI_API_KEY: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(None);
pub static SECRETS_FILE: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(None);
pub static PROVIDER_HOSTS: GucSetting<Option<CString>> =
    GucSetting::<Option<CString>>::new(Some(c""));
// Empty means "what the collection's model expects" (rag_embed::known_models); set, it wins for new collections.
pub static DOCUMENT_PREFIX: GucSetting<Option<CString>> =
    GucSetting::<Option<CString>>::new(Some(c""));
pub static QUERY_PREFIX: GucSetting<Option<CString>> =
    GucSetting::<Option<CString>>::new(Some(c""));
pub static CHUNK_SIZE: GucSetting<i32> = GucSetting::<i32>::new(1000);
pub static CHUNK_OVERLAP: GucSetting<i32> = GucSetting::<i32>::new(150);
pub static MAX_DISTANCE: GucSetting<f64> = GucSetting::<f64>::new(0.6);
pub static MAX_DOCUMENT_SIZE_KB: GucSetting<i32> = GucSetting::<i32>::new(64 * 1024);
pub static MAX_FILE_SIZE_KB: GucSetting<i32> = GucSetting::<i32>::new(64 * 1024);
pub static MAX_DECOMPRESSED_SIZE_KB: GucSetting<i32> = GucSetting::<i32>::new(256 * 1024);
pub static MAX_ARCHIVE_ENTRIES: GucSetting<i32> = GucSetting::<i32>::new(10_000);
pub static MAX_XML_DEPTH: GucSetting<i32> = GucSetting::<i32>::new(256);
pub static MAX_PDF_PAGES: GucSetting<i32> = GucSetting::<i32>::new(5_000);
pub static MAX_CONCURRENT_EXTRACTIONS: GucSetting<i32> = GucSetting::<i32>::new(4);
pub static EXTRACTION_MEMORY_MB: GucSetting<i32> = GucSetting::<i32>::new(2048);
pub static EXTRACTION_CPU_TIME_S: GucSetting<i32> = GucSetting::<i32>::new(60);
pub static WORKER_SYNCHRONOUS_COMMIT: GucSetting<bool> = GucSetting::<bool>::new(false);
pub static SYNC_DELAY_MS: GucSetting<i32> =
    GucSetting::<i32>::new(crate::limits::SYNC_DELAY_DEFAULT_MS);
pub static EXPRESSION_TIMEOUT_MS: GucSetting<i32> = GucSetting::<i32>::new(30_000);
pub static MODEL_PATH: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(None);
pub static LOCAL_THREADS: GucSetting<i32> = GucSetting::<i32>::new(2);
pub static BATCH_SIZE: GucSetting<i32> = GucSetting::<i32>::new(32);
pub static NAPTIME_MS: GucSetting<i32> = GucSetting::<i32>::new(5000);
pub static HTTP_TIMEOUT_MS: GucSetting<i32> = GucSetting::<i32>::new(60_000);
pub static RETRY_DEADLINE_S: GucSetting<i32> = GucSetting::<i32>::new(3600);
pub static MAX_WORKERS: GucSetting<i32> = GucSetting::<i32>::new(4);
pub static WORKERS_PER_DATABASE: GucSetting<i32> = GucSetting::<i32>::new(1);
pub static BULK_LOAD_WORKERS: GucSetting<i32> = GucSetting::<i32>::new(2);
pub static LAUNCHER_NAPTIME_S: GucSetting<i32> = GucSetting::<i32>::new(30);
pub static LEDGER_RETENTION_S: GucSetting<i32> = GucSetting::<i32>::new(0);

/// What SHOW, current_setting() and pg_settings display for a secret, to everyone, superusers included:
/// pg_read_all_settings (and so pg_monitor) may read superuser-only settings, so hiding them from SHOW ALL
/// is not enough.
// SAFETY: a GUC show hook called by PostgreSQL with no arguments; it returns a pointer to a static string,
// which PostgreSQL only reads.
#[pgrx::pg_guard]
unsafe extern "C-unwind" fn show_hidden_secret() -> *const std::ffi::c_char {
    c"(hidden)".as_ptr()
}

pub fn define() {
    GucRegistry::define_bool_guc(
        c"rag.worker_synchronous_commit",
        c"Whether the workers' own commits wait for the WAL flush.",
        c"Off by default: every worker step is idempotent, so a commit lost in a crash is only work done again. On makes a document's ready status durable the moment it is set, at the price of a flush per step.",
        &WORKER_SYNCHRONOUS_COMMIT,
        GucContext::Sighup,
        GucFlags::default(),
    );
    // Secrets: settable only in the server's configuration (SIGHUP: not by SET, not by ALTER DATABASE/ROLE,
    // whose values any user can read in pg_db_role_setting), never displayed.
    // SAFETY: defining a GUC with a show hook is unsafe only because the hook must be a valid function for the
    // process's lifetime; show_hidden_secret is a plain function of this library, which is never unloaded.
    unsafe {
        GucRegistry::define_string_guc_with_hooks(
            c"rag.openai_api_key",
            c"API key for providers whose api_key_setting is 'rag.openai_api_key'; never displayed.",
            c"Prefer a file: key (rag.secrets_file). Set here only in postgresql.conf: ALTER SYSTEM's statement text, key included, is kept by pg_stat_statements for pg_read_all_stats to read.",
            &OPENAI_API_KEY,
            GucContext::Sighup,
            GucFlags::SUPERUSER_ONLY | GucFlags::NO_SHOW_ALL | GucFlags::NO_RESET_ALL,
            None,
            None,
            Some(show_hidden_secret),
        );
    }
    GucRegistry::define_string_guc(
        c"rag.secrets_file",
        c"File of 'name = key' lines read for providers whose api_key_setting is 'file:name'.",
        c"The file must be readable by the server only (mode 0600 or stricter).",
        &SECRETS_FILE,
        GucContext::Sighup,
        GucFlags::SUPERUSER_ONLY,
    );
    // The servers a rag_admin's provider URL may name: the server administrator's, as its network is.
    GucRegistry::define_string_guc(
        c"rag.provider_hosts",
        c"Hosts that providers named by rag_create_provider may connect to; empty allows any.",
        c"Comma-separated host names (*.domain for subdomains), IP addresses or CIDR blocks, each optionally with :port. A name not listed must resolve to listed addresses. rag.ollama_url is exempt.",
        &PROVIDER_HOSTS,
        GucContext::Sighup,
        GucFlags::default(),
    );
    // Where the database sends document text is a superuser's decision: SUSET.
    GucRegistry::define_string_guc(
        c"rag.ollama_url",
        c"Base URL of the Ollama server used by the built-in 'ollama' provider.",
        c"Collections whose provider has no base URL of its own use this one.",
        &OLLAMA_URL,
        GucContext::Suset,
        GucFlags::default(),
    );
    GucRegistry::define_string_guc(
        c"rag.embedding_model",
        c"Embedding model given to new collections that name none.",
        c"",
        &EMBEDDING_MODEL,
        GucContext::Userset,
        GucFlags::default(),
    );
    GucRegistry::define_string_guc(
        c"rag.chat_model",
        c"Chat model given to new collections that name none; empty means extractive answers (no LLM).",
        c"",
        &CHAT_MODEL,
        GucContext::Userset,
        GucFlags::default(),
    );
    GucRegistry::define_string_guc(
        c"rag.document_prefix",
        c"Text put before each chunk when it is embedded, for new collections.",
        c"Empty: the prefix the collection's model expects (nomic-embed-text 'search_document: ', e5 'passage: ', none for unknown models).",
        &DOCUMENT_PREFIX,
        GucContext::Userset,
        GucFlags::default(),
    );
    GucRegistry::define_string_guc(
        c"rag.query_prefix",
        c"Text put before each question when it is embedded, for new collections.",
        c"Empty: the prefix or instruction the collection's model expects; none for unknown models.",
        &QUERY_PREFIX,
        GucContext::Userset,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"rag.chunk_size",
        c"Default chunk size in characters for new collections.",
        c"",
        &CHUNK_SIZE,
        100,
        10_000,
        GucContext::Userset,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"rag.chunk_overlap",
        c"Default chunk overlap in characters for new collections.",
        c"",
        &CHUNK_OVERLAP,
        0,
        5_000,
        GucContext::Userset,
        GucFlags::default(),
    );
    GucRegistry::define_float_guc(
        c"rag.max_distance",
        c"Default cosine-distance ceiling for new collections: chunks farther than this are never returned.",
        c"",
        &MAX_DISTANCE,
        0.0,
        2.0,
        GucContext::Userset,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"rag.max_document_size",
        c"Largest document text rag_ingest accepts.",
        c"",
        &MAX_DOCUMENT_SIZE_KB,
        1,
        1024 * 1024,
        GucContext::Suset,
        GucFlags::UNIT_KB,
    );
    // File extraction limits: every defence against hostile files is one of these. Superuser-only, since
    // raising them lets a caller spend the server's memory.
    GucRegistry::define_int_guc(
        c"rag.max_file_size",
        c"Largest file rag_ingest_file and rag_extract_text accept.",
        c"",
        &MAX_FILE_SIZE_KB,
        1,
        1024 * 1024,
        GucContext::Suset,
        GucFlags::UNIT_KB,
    );
    GucRegistry::define_int_guc(
        c"rag.max_decompressed_size",
        c"Most bytes decompressed from one file (zip members, PDF streams): a zip bomb stops here.",
        c"",
        &MAX_DECOMPRESSED_SIZE_KB,
        1,
        1024 * 1024,
        GucContext::Suset,
        GucFlags::UNIT_KB,
    );
    GucRegistry::define_int_guc(
        c"rag.max_archive_entries",
        c"Most entries an Office or OpenDocument file may list.",
        c"",
        &MAX_ARCHIVE_ENTRIES,
        1,
        1_000_000,
        GucContext::Suset,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"rag.max_xml_depth",
        c"Deepest XML nesting accepted in a file.",
        c"",
        &MAX_XML_DEPTH,
        8,
        10_000,
        GucContext::Suset,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"rag.max_pdf_pages",
        c"Most PDF pages extracted from one file.",
        c"",
        &MAX_PDF_PAGES,
        1,
        1_000_000,
        GucContext::Suset,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"rag.max_concurrent_extractions",
        c"Most files extracted at the same time in the whole cluster; further extractions wait.",
        c"Each extraction runs in a child process that may take rag.extraction_memory. Counted where rag is in shared_preload_libraries.",
        &MAX_CONCURRENT_EXTRACTIONS,
        1,
        crate::api::extraction_slots::MOST_SLOTS as i32,
        GucContext::Sighup,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"rag.extraction_memory",
        c"Memory one file extraction may add to what its backend maps.",
        c"An extraction that needs more ends with an ERROR; the server goes on.",
        &EXTRACTION_MEMORY_MB,
        // Below this the PDF parser's thread (its 64 MB stack and a malloc arena) cannot start.
        256,
        1024 * 1024,
        GucContext::Suset,
        GucFlags::UNIT_MB,
    );
    GucRegistry::define_int_guc(
        c"rag.extraction_cpu_time",
        c"CPU time one file extraction may use; it may take at most twice as long plus 10 s of wall-clock time.",
        c"",
        &EXTRACTION_CPU_TIME_S,
        1,
        3600,
        GucContext::Suset,
        GucFlags::UNIT_S,
    );
    GucRegistry::define_int_guc(
        c"rag.batch_size",
        c"Chunks sent to the embedding provider in one request.",
        c"",
        &BATCH_SIZE,
        1,
        2048,
        GucContext::Sighup,
        GucFlags::default(),
    );
    GucRegistry::define_string_guc(
        c"rag.model_path",
        c"Directory holding local embedding models, one subdirectory per model (config.json, tokenizer.json, model.safetensors).",
        c"Defaults to the rag/models directory under PostgreSQL's share directory.",
        &MODEL_PATH,
        GucContext::Suset,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"rag.local_threads",
        c"Threads one backend uses to run a local embedding model.",
        c"",
        &LOCAL_THREADS,
        1,
        64,
        GucContext::Sighup,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"rag.sync_delay",
        c"How long a changed row of a watched table waits before it is indexed; each new write restarts the wait.",
        c"A burst of updates to one row then costs one embedding of its final text.",
        &SYNC_DELAY_MS,
        0,
        3_600_000,
        GucContext::Userset,
        GucFlags::UNIT_MS,
    );
    // One table owner's slow expression must not stall every collection of the database behind it.
    GucRegistry::define_int_guc(
        c"rag.expression_timeout",
        c"How long the worker lets a watch's content, title or filter expression run for one row.",
        c"A row whose expressions take longer is not indexed; watch status shows the timeout as its error.",
        &EXPRESSION_TIMEOUT_MS,
        1,
        3_600_000,
        GucContext::Sighup,
        GucFlags::UNIT_MS,
    );
    GucRegistry::define_int_guc(
        c"rag.naptime",
        c"How long an idle worker sleeps before it looks at the queue again (it is also woken on new work).",
        c"",
        &NAPTIME_MS,
        10,
        3_600_000,
        GucContext::Sighup,
        GucFlags::UNIT_MS,
    );
    GucRegistry::define_int_guc(
        c"rag.http_timeout",
        c"Deadline for one HTTP request to a provider.",
        c"Inside a user's session statement_timeout and query cancellation also stop a request.",
        &HTTP_TIMEOUT_MS,
        100,
        3_600_000,
        // A superuser's: a database owner's ALTER DATABASE … SET reached the worker (an hour per call to a
        // provider that hangs held the worker and its cluster slot that long; a second put other roles'
        // documents into retries), and a request a session gave up on runs until this deadline.
        GucContext::Suset,
        GucFlags::UNIT_MS,
    );
    GucRegistry::define_int_guc(
        c"rag.retry_deadline",
        c"How long a document keeps being retried after its first transient provider failure (429, 5xx, timeout).",
        c"Collections may override it.",
        &RETRY_DEADLINE_S,
        1,
        7 * 24 * 3600,
        GucContext::Sighup,
        GucFlags::UNIT_S,
    );
    // A postmaster-level setting can only be defined while the library is being preloaded; defining it
    // later (CREATE EXTENSION on a server without shared_preload_libraries) is a FATAL error.
    if crate::pg::preloading() {
        define_postmaster_settings();
    }
}

fn define_postmaster_settings() {
    GucRegistry::define_int_guc(
        c"rag.max_workers",
        c"Most embedding workers the launcher runs at once, over all databases.",
        c"Each also takes one of max_worker_processes.",
        &MAX_WORKERS,
        1,
        crate::worker::registry::SLOTS as i32 - 1,
        GucContext::Postmaster,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"rag.workers_per_database",
        c"Embedding workers per database that has the extension.",
        c"",
        &WORKERS_PER_DATABASE,
        1,
        16,
        GucContext::Sighup,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"rag.bulk_load_workers",
        c"Embedding workers per database while its queue holds a bulk load; never fewer than rag.workers_per_database.",
        c"A worker that finds many documents waiting asks the launcher for more, up to this many for its database; the extra ones leave when the queue is worked off.",
        &BULK_LOAD_WORKERS,
        1,
        16,
        GucContext::Sighup,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"rag.launcher_naptime",
        c"How often the launcher looks for databases that need a worker when nothing wakes it.",
        c"",
        &LAUNCHER_NAPTIME_S,
        1,
        3600,
        GucContext::Sighup,
        GucFlags::UNIT_S,
    );
    GucRegistry::define_int_guc(
        c"rag.ledger_retention",
        c"How long the ledger (rag.queries) keeps a call's row; 0 keeps every row.",
        c"The workers delete older rows, the oldest first, a thousand at a time when they have a moment; rag.ledger_daily is a view of those rows, so its totals for those days go with them.",
        &LEDGER_RETENTION_S,
        0,
        i32::MAX,
        GucContext::Sighup,
        GucFlags::UNIT_S,
    );
}

pub fn string(setting: &GucSetting<Option<CString>>) -> String {
    setting
        .get()
        .map(|value| value.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// Where local models live: rag.model_path, or rag/models under the share directory (where
/// scripts/fetch-model puts the default model).
pub fn model_path() -> String {
    let configured = string(&MODEL_PATH);
    if !configured.trim().is_empty() {
        return configured;
    }
    let mut buffer = [0 as std::ffi::c_char; pgrx::pg_sys::MAXPGPATH as usize];
    // SAFETY: get_share_path writes at most MAXPGPATH bytes, NUL-terminated, into `buffer`, which is that size;
    // my_exec_path is a NUL-terminated global set at process start.
    unsafe {
        pgrx::pg_sys::get_share_path(
            (&raw const pgrx::pg_sys::my_exec_path).cast(),
            buffer.as_mut_ptr(),
        );
        format!(
            "{}/rag/models",
            std::ffi::CStr::from_ptr(buffer.as_ptr()).to_string_lossy()
        )
    }
}

pub fn http_timeout() -> Duration {
    Duration::from_millis(HTTP_TIMEOUT_MS.get().max(1) as u64)
}
