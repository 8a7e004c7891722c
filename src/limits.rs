//! Every limit and default of the extension, in one place: the role `hnsw.h` plays in pgvector. Rust uses the
//! constants; SQL reads the same values through `rag._limit(name)`, so a limit changed here changes for both.
//! The settings' own defaults (`rag.*` GUCs) live in `settings.rs` beside their definitions, but any value
//! that SQL or another module also needs is defined here and used there.

/// `k`, how many nearest chunks a search considers: rag_query, rag_prompt and rag_ask alike.
pub const SEARCH_K_MIN: i32 = 1;
pub const SEARCH_K_MAX: i32 = 1000;

/// Tokens of sources sent to the chat model per question, when the collection does not say.
pub const CONTEXT_BUDGET_DEFAULT: i32 = 3000;
pub const CONTEXT_BUDGET_MIN: i32 = 100;
pub const CONTEXT_BUDGET_MAX: i32 = 1_000_000;
/// The longest question rag_query, rag_prompt, rag_ask and rag_explain take, in bytes. A question is embedded,
/// ranked against every candidate by the reranker and copied into the prompt up to four times
/// (rag_answer::MAX_QUERY_PLACEHOLDERS): an unbounded one made every step allocate with it.
pub const QUESTION_MAX_BYTES: i32 = 32 * 1024;
/// HTML or Markdown up to this size is converted in the calling process; larger texts in a bounded child
/// (src/api/extract.rs `convert_markup`). A megabyte converts in well under a second and a few dozen MB.
pub const MARKUP_IN_PROCESS_MAX_BYTES: usize = 1024 * 1024;
/// A document's title and source as `rag_ingest` takes them: every search and answer returns them, and every
/// answer copies its sources' titles into the ledger, so a writer's 200 MB title made each reader's `rag_ask`
/// take 2 GB (red team 8).
pub const DOCUMENT_TITLE_MAX_BYTES: usize = 4096;
pub const DOCUMENT_SOURCE_MAX_BYTES: usize = 4096;
/// A document's metadata as jsonb text: it travels with every search result the same way.
pub const DOCUMENT_METADATA_MAX_BYTES: usize = 64 * 1024;
/// Pages `rag_ingest` takes for one document: each costs the call an offset and the joined text's separator,
/// and 8 million blank pages took a backend to 753 MB (red team 22). Far above what a file can give
/// (`rag.max_pdf_pages`, `rag.max_archive_entries`).
pub const DOCUMENT_PAGES_MAX: usize = 100_000;

/// Tokens the chat model may answer with, when the collection does not say.
pub const MAX_ANSWER_TOKENS_DEFAULT: i32 = 1024;
pub const MAX_ANSWER_TOKENS_MIN: i32 = 16;
pub const MAX_ANSWER_TOKENS_MAX: i32 = 100_000;

/// The estimate every size in tokens is converted with (the chunker's, re-exported so there is one).
pub const CHARS_PER_TOKEN: usize = rag_chunk::CHARS_PER_TOKEN;

/// Characters of an extractive answer: quoted sentences, never more than this whatever max_answer_tokens says.
pub const EXTRACTIVE_ANSWER_MAX_CHARS: usize = 700;

/// How long a burst of writes to one watched row is coalesced before the worker embeds it: the default of
/// `rag.sync_delay`, and what a watch trigger uses where the library is not loaded (no setting to read).
pub const SYNC_DELAY_DEFAULT_MS: i32 = 500;

/// Hybrid search: candidates each side brings before fusion (at least k), and the constant of reciprocal rank
/// fusion (score = sum of 1 / (RRF_K + rank)); 60 is the value of the paper that introduced it (Cormack et al.,
/// 2009), used by most engines since.
pub const FUSION_POOL: i32 = 40;
pub const RRF_K: i32 = 60;
/// The full-text side's weight in the fusion (the vector side's is 1), and the share of a collection's chunks
/// above which a question's word is too common to search for (see rag._keyword_query). Chosen on the Debian FAQ
/// (BENCHMARKS.md §5) among 0.5/0.7/1.0 and 0.1/0.2/0.3 without tuning further, to leave room for other corpora.
pub const KEYWORD_WEIGHT: &str = "0.5";
pub const KEYWORD_MAX_SHARE: &str = "0.25";
/// Which hybrid candidates a reranker reads: of its N slots, the full-text side's best N / RERANK_KEYWORD_ONE_IN
/// and the vector side's best of the rest go first, then the fused order fills what they leave. The fusion's own
/// top N is mostly the vector side's (the keyword side weighs half), and a chunk that only names the
/// question's identifier then seldom reaches the reranker, which is what tells it is the answer. On the
/// PostgreSQL manual the 15 reranked held the answering chunk for 0.89 of the questions this way against 0.85 as
/// the fusion's top 15, on the Debian FAQ 0.92 either way (offline from scripts/eval's dumps, BENCHMARKS.md §5).
pub const RERANK_KEYWORD_ONE_IN: i32 = 3;
/// How many matches of one question word rag._keyword_query counts at most (each is a row read and rechecked).
/// A collection small enough that its max share is within this count is judged exactly; in a larger one a word
/// found more often is judged by its measured share (rag.lexeme_shares).
pub const KEYWORD_COUNT_CAP: i32 = 200;
/// The largest collection whose max share is within the cap, so that rag._keyword_query judges it exactly:
/// KEYWORD_COUNT_CAP / KEYWORD_MAX_SHARE.
fn keyword_exact_chunks() -> i64 {
    let share: f64 = KEYWORD_MAX_SHARE
        .parse()
        .expect("KEYWORD_MAX_SHARE is a number");
    (f64::from(KEYWORD_COUNT_CAP) / share).floor() as i64
}
/// In a collection larger than KEYWORD_MATCH_BUDGET / KEYWORD_MAX_SHARE chunks (20,000), a question word found
/// in more than this many chunks is left out of the full-text side too: the share ceiling falls with the
/// collection's size (down to LEXEME_SHARE_FLOOR, the least share measured). Ranking every match of a word in a
/// fifth of 100,000 chunks was most of a hybrid search's 36 ms there (BENCHMARKS.md §3), and ts_rank weighs
/// such a word as much as a rare one. Collections of up to 20,000 chunks (every evaluation corpus) are
/// unaffected.
pub const KEYWORD_MATCH_BUDGET: i32 = 5_000;
/// rag._measure_lexemes keeps the share of every lexeme found in more than this share of the sampled chunks.
pub const LEXEME_SHARE_FLOOR: &str = "0.01";
/// At most this many chunks of a collection are read to measure its lexemes (a sample of its documents).
pub const LEXEME_SAMPLE_CHUNKS: i32 = 20_000;
/// A collection's lexemes are measured again when the last measure is this old and its size has changed by a
/// tenth (a bulk load's end asks for a measure at once).
pub const LEXEME_MEASURE_INTERVAL: &str = "10 minutes";
/// A collection last measured while small enough to be judged exactly is looked at again this often: it may
/// have outgrown that, and until it is measured its searches count every match.
pub const LEXEME_SMALL_MEASURE_INTERVAL: &str = "1 minute";

/// The model of the `local` provider when a collection or `rag_embed` names none.
pub const LOCAL_MODEL_DEFAULT: &str = "all-MiniLM-L6-v2";

/// The reranker of new collections on the `local` provider (a cross-encoder under rag.model_path, installed by
/// scripts/fetch-model), how many of the search's candidates it rescores, and the relevance below which a
/// reranked chunk is not used: the refusal threshold, on the cross-encoder's logit. Candidates: 15 chunks of up
/// to 768 characters (the local default) cost what 20 of 512 did (rag_ask p95 653-727 ms against 640-795 ms on
/// scripts/eval's two corpora, BENCHMARKS.md §5), and the reranker found the answer among the best 15 as
/// often as among 20 (recall@5 0.85 and 0.75 against 0.84 and 0.77). The threshold, a logit, was calibrated
/// on scripts/eval's sets (BENCHMARKS.md §5): off-domain questions score -10 to -11 (one on the PostgreSQL
/// manual -4.6, a word the corpus uses), answerable ones mostly above -5 (97-98 %), paraphrases of short
/// passages down to -4.7.
pub const RERANKER_DEFAULT: &str = "ms-marco-MiniLM-L-12-v2";
pub const RERANK_CANDIDATES_DEFAULT: i32 = 15;
pub const RERANK_CANDIDATES_MIN: i32 = 1;
pub const RERANK_CANDIDATES_MAX: i32 = 200;
pub const MIN_RELEVANCE_DEFAULT: &str = "-5";
/// A reranker's first candidate below the threshold still passes when it stands out: it leads the second
/// candidate by at least this many logits, is also the vector side's nearest candidate, and is no further than
/// this below the threshold. Off-domain questions put every candidate at the model's floor (-10 to -11, leads
/// under 2.5), while a paraphrase of a short passage often scores -5 to -8 with a lead of 3 to 9: on
/// scripts/eval's handbook (BENCHMARKS.md §5) 3 logits answer 9 of 12 paraphrases where the threshold alone
/// answers 6 (5 of 10 house rules where it answers 4), and still refuse all 20 off-domain questions. 0 turns
/// the lead off.
pub const MIN_LEAD_DEFAULT: &str = "3";
/// Reranked candidates are ordered by the cross-encoder's logit plus this times their cosine similarity to the
/// question (1 - distance), and the lead above is taken on that sum. The cross-encoder alone misreads some
/// paraphrases that the bi-encoder places right ("How do I reserve the washers downstairs?" went to the bicycle
/// rule, which mentions the laundry) and, on the Debian FAQ, ordered worse than the fused search it reorders.
/// On scripts/eval's sets (BENCHMARKS.md §5) with all-MiniLM-L6-v2: FAQ recall@5 0.80 -> 0.85 and MRR@10
/// 0.62 -> 0.66; the right passage first for 9 of 10 house rules (7 by the logit alone) and 11 of 12 handbook
/// paraphrases (11); 10, 15, 25 and 30 were within 0.02 of 20 on the FAQ. 0 orders by the logit alone. Only
/// the in-process cross-encoder's logits get it: a server's reranker scores on its own scale (a probability would
/// be swamped by it), so its candidates are ordered by its score alone.
pub const RERANK_SIMILARITY_WEIGHT: &str = "20";

/// A collection with at least this many documents queued and no HNSW index or fewer than this many ready
/// documents (a first load, a rag_reindex, a large load into a small collection) is loaded in bulk: its vectors are stored
/// without the index's per-row upkeep, which costs more than the rest of the pipeline together (BENCHMARKS.md
/// §3), the collection is searched exactly meanwhile, and the index is built once when nothing of the
/// collection is due any more. Below it, the index stays and every document is searchable through it at once.
pub const BULK_LOAD_DOCUMENTS: i32 = 200;

/// A bulk load under way (no HNSW index, and at least BULK_LOAD_DOCUMENTS documents ready or waiting) goes on
/// without the index until fewer than this many of its documents are due (queued and not in a retry's
/// back-off): ending it at BULK_LOAD_DOCUMENTS put the load's last 200 documents (about 600 chunks in
/// scripts/bench) through the per-row index upkeep the bulk path avoids, a tenth of the load's time (and ended
/// a load of 300 documents after its first 100), and ending it at 20 made the last 19 wait for the build.
/// Documents in back-off do not count, and an idle worker does not wait for documents that an open breaker
/// holds back (`rag._collections_missing_indexes`), so a few stuck ones do not keep a large collection without
/// its index for the hour they may take.
pub const BULK_LOAD_TAIL_DOCUMENTS: i32 = 1;

/// Queue items past the group's size that `rag._claim_more` looks at for small new documents to claim together:
/// large or already chunked ones are passed over, and a queue full of them must not make every claim walk it.
pub const CLAIM_MORE_LOOKAHEAD: i32 = 64;

/// Statements a backend keeps prepared (`crate::kept`): the search's, a few per collection searched and mode,
/// and the row checks', a few per watch. Past it the lot is dropped and prepared again as needed.
pub const KEPT_STATEMENTS: usize = 128;

/// Bytes of key text a backend keeps between a watched table's row triggers and its statement trigger
/// (`crate::api::watch_keys`), and as much again for the keys rag queues itself at a statement's end: a
/// statement's keys become one queue row that the worker turns into jsonb, which PostgreSQL caps at 256 MB; a
/// batch past that would be dropped with a warning after its commit. About 18 million bigint keys; past it a
/// statement trigger's statement fails with an error instead, and rag queues early what it can (see
/// [`WATCH_KEYS_FLUSH_BYTES`]).
pub const WATCH_KEYS_BYTES: usize = 200_000_000;

/// Bytes of key text gathered for one watched table within one subtransaction, when rag queues the keys itself
/// at the statement's end (a partition's, an inheritance child's, and every row a logical-replication apply
/// worker applies, which ends no statement before its commit), past which the row trigger queues them at once
/// as a batch of their own: a subscription's initial copy of a large table is one transaction that no one can
/// cut into statements. About 500,000 seven-digit keys a batch, fewer longer ones (about 100,000 uuids).
/// Past [`WATCH_KEYS_BYTES`] in all, what the current subtransaction kept for the key's table is queued to make
/// room, or the key alone where it kept nothing.
pub const WATCH_KEYS_FLUSH_BYTES: usize = 4_000_000;

/// The longest model name a collection takes (embedding, chat, reranker), in bytes: providers' names are tens of
/// bytes (`hf.co/org/model:Q4_K_M`), and each goes into every request and the ledger.
pub const MODEL_NAME_MAX_BYTES: i32 = 256;
/// The longest document or query prefix, in bytes: an instruction put before every chunk and every question
/// (e5's and bge's are about 100 bytes); a 10 MB one made the worker build 320 MB requests.
pub const PREFIX_MAX_BYTES: i32 = 1024;

/// The most of a question, rewritten question or answer that a `rag ledger:` line of the server log carries (a
/// standby's call, a read-only transaction's, a rolled-back one); a longer text is cut there, with its length and
/// SHA-256 beside it. The ledger's row keeps it whole. A reader's loop of 32 kB questions grew the log by 32 kB
/// a call, and no retention bounds the log (red team 19).
pub const LEDGER_LOG_TEXT_MAX_CHARS: i32 = 2000;

/// The value of a limit SQL reads, by name, as text (SQL casts it); built from the constants above.
fn for_sql(name: &str) -> Option<String> {
    Some(match name {
        "search_k_min" => SEARCH_K_MIN.to_string(),
        "search_k_max" => SEARCH_K_MAX.to_string(),
        "context_budget_default" => CONTEXT_BUDGET_DEFAULT.to_string(),
        "context_budget_min" => CONTEXT_BUDGET_MIN.to_string(),
        "context_budget_max" => CONTEXT_BUDGET_MAX.to_string(),
        "question_max_bytes" => QUESTION_MAX_BYTES.to_string(),
        "model_name_max_bytes" => MODEL_NAME_MAX_BYTES.to_string(),
        "prefix_max_bytes" => PREFIX_MAX_BYTES.to_string(),
        "document_title_max_bytes" => DOCUMENT_TITLE_MAX_BYTES.to_string(),
        "document_source_max_bytes" => DOCUMENT_SOURCE_MAX_BYTES.to_string(),
        "document_metadata_max_bytes" => DOCUMENT_METADATA_MAX_BYTES.to_string(),
        "document_pages_max" => DOCUMENT_PAGES_MAX.to_string(),
        "ledger_log_text_max_chars" => LEDGER_LOG_TEXT_MAX_CHARS.to_string(),
        // A collection's prompt template (rag_answer::validate_template says why).
        "prompt_template_max_bytes" => rag_answer::MAX_TEMPLATE_BYTES.to_string(),
        "prompt_query_placeholders_max" => rag_answer::MAX_QUERY_PLACEHOLDERS.to_string(),
        "max_answer_tokens_default" => MAX_ANSWER_TOKENS_DEFAULT.to_string(),
        "max_answer_tokens_min" => MAX_ANSWER_TOKENS_MIN.to_string(),
        "max_answer_tokens_max" => MAX_ANSWER_TOKENS_MAX.to_string(),
        "chars_per_token" => CHARS_PER_TOKEN.to_string(),
        "sync_delay_default" => format!("{SYNC_DELAY_DEFAULT_MS}ms"),
        "local_model_default" => LOCAL_MODEL_DEFAULT.to_string(),
        "fusion_pool" => FUSION_POOL.to_string(),
        "rrf_k" => RRF_K.to_string(),
        "keyword_weight" => KEYWORD_WEIGHT.to_string(),
        "keyword_max_share" => KEYWORD_MAX_SHARE.to_string(),
        "rerank_keyword_one_in" => RERANK_KEYWORD_ONE_IN.to_string(),
        "keyword_count_cap" => KEYWORD_COUNT_CAP.to_string(),
        "keyword_match_budget" => KEYWORD_MATCH_BUDGET.to_string(),
        "keyword_exact_chunks" => keyword_exact_chunks().to_string(),
        "lexeme_share_floor" => LEXEME_SHARE_FLOOR.to_string(),
        "lexeme_sample_chunks" => LEXEME_SAMPLE_CHUNKS.to_string(),
        "lexeme_measure_interval" => LEXEME_MEASURE_INTERVAL.to_string(),
        "lexeme_small_measure_interval" => LEXEME_SMALL_MEASURE_INTERVAL.to_string(),
        "reranker_default" => RERANKER_DEFAULT.to_string(),
        "rerank_candidates_default" => RERANK_CANDIDATES_DEFAULT.to_string(),
        "rerank_candidates_min" => RERANK_CANDIDATES_MIN.to_string(),
        "rerank_candidates_max" => RERANK_CANDIDATES_MAX.to_string(),
        "min_relevance_default" => MIN_RELEVANCE_DEFAULT.to_string(),
        "min_lead_default" => MIN_LEAD_DEFAULT.to_string(),
        "rerank_similarity_weight" => RERANK_SIMILARITY_WEIGHT.to_string(),
        "bulk_load_documents" => BULK_LOAD_DOCUMENTS.to_string(),
        "bulk_load_tail_documents" => BULK_LOAD_TAIL_DOCUMENTS.to_string(),
        "claim_more_lookahead" => CLAIM_MORE_LOOKAHEAD.to_string(),
        _ => return None,
    })
}

#[pgrx::pg_schema]
pub mod rag {
    use pgrx::prelude::*;

    /// A limit or default by name, for SQL: `rag._limit('search_k_max')::integer`.
    #[pg_extern(immutable, parallel_safe, name = "_limit")]
    pub fn limit(name: &str) -> String {
        match super::for_sql(name) {
            Some(value) => value,
            None => crate::error::RagError::invalid(
                format!("\"{name}\" is not a limit of rag"),
                "The limits are in src/limits.rs.",
            )
            .raise(),
        }
    }
}
