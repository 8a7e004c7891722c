-- One set of limits and defaults (src/limits.rs), read by Rust and by SQL through rag._limit.
SELECT rag._limit('search_k_min') AS k_min, rag._limit('search_k_max') AS k_max,
       rag._limit('context_budget_default') AS budget, rag._limit('max_answer_tokens_default') AS answer_tokens,
       rag._limit('sync_delay_default') AS sync_delay, rag._limit('local_model_default') AS local_model;
SELECT rag._limit('no_such_limit');

SELECT rag_create_collection('limits', embedding_model => 'hash-384', max_distance => 2) > 0 AS created;
SELECT rag_ingest('limits', 'Notice', 'Staff must give thirty days notice in writing.') > 0 AS ingested;
SELECT rag_wait('limits', '60 seconds') AS ready;

-- k has one range for every search: rag_query, rag_prompt and rag_ask (rag_ask allowed only 1..100 before).
SELECT count(*) AS found FROM rag_query('limits', 'thirty days notice', k => 1000);
SELECT outcome FROM rag_ask('limits', 'How much notice do staff give?', k => 1000);
SELECT prompt IS NOT NULL AS prompted FROM rag_prompt('limits', 'thirty days notice', k => 1000);
SELECT count(*) FROM rag_query('limits', 'notice', k => 1001);
SELECT outcome FROM rag_ask('limits', 'notice', k => 1001);
SELECT prompt FROM rag_prompt('limits', 'notice', k => 0);

-- A caller's distance ceiling is a distance: NaN passed every chunk (no ceiling, where rag_create_collection
-- refuses it) and a negative one none; 2 and up is no ceiling, asked for on purpose.
SELECT count(*) FROM rag_query('limits', 'notice', max_distance => 'NaN');
SELECT count(*) FROM rag_query('limits', 'notice', max_distance => -1);
SELECT outcome FROM rag_ask('limits', 'notice', max_distance => 'NaN');
SELECT prompt FROM rag_prompt('limits', 'notice', max_distance => -0.5);
SELECT count(*) AS found FROM rag_query('limits', 'thirty days notice', max_distance => 'Infinity');

-- NULL where a value is needed: an error naming the argument (pgrx's own was "argument 0 must not be null",
-- XX000, for the functions written in Rust).
SELECT outcome FROM rag_ask(NULL, 'notice');
SELECT outcome FROM rag_ask('limits', NULL);
SELECT outcome FROM rag_ask('limits', 'notice', NULL);
SELECT prompt FROM rag_prompt('limits', NULL);
SELECT rag_extract_text(NULL, 'a.txt');
SELECT * FROM rag_extract_sections(NULL);
SELECT rag_ingest_file('limits', NULL, 'text'::bytea);
SELECT rag_create_collection('limits-null-unit', embedding_model => 'hash-384', chunk_unit => NULL);
SELECT rag_create_collection('limits-negative', embedding_model => 'hash-384', retry_deadline => '-1 day');
-- A token count that overflowed integer arithmetic (22003) is measured as the bigint it is.
SELECT rag_create_collection('limits-huge', embedding_provider => 'local', chunk_unit => 'tokens', chunk_size => 1073741824);

-- Model names and prefixes go into every provider request and come back with every answer: bounded (a 10 MB
-- document prefix made the worker build a 320 MB request, a 50 MB query prefix every reader's question).
SELECT rag_create_collection('limits-prefix', embedding_model => 'hash-384', document_prefix => repeat('x', 1025));
SELECT rag_create_collection('limits-prefix', embedding_model => 'hash-384', query_prefix => repeat('q', 1025));
SELECT rag_create_collection('limits-model', embedding_model => repeat('m', 257));
SELECT rag_create_collection('limits-model', embedding_model => 'hash-384', chat_model => repeat('c', 257));
SELECT rag_set_embedding_model('limits', repeat('m', 257));
SELECT rag_set_reranker('limits', repeat('r', 257));
SELECT rag_create_collection('limits-prefix', embedding_model => 'hash-384', document_prefix => repeat('x', 1024)) > 0
       AS at_the_limit;
SELECT rag_drop_collection('limits-prefix');
-- The chat model that rag.chat_model (which any role may SET) fills in is bounded too, and so is a provider's
-- base_url, which goes into every request.
SET rag.chat_model = 'cccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccc';
SELECT rag_create_collection('limits-chat-setting', embedding_model => 'hash-384');
RESET rag.chat_model;
SELECT rag_create_provider('limits-long-url', 'openai', base_url => 'http://127.0.0.1:9/' || repeat('v', 2100));
-- rag_embed has the same bound on a model's name.
SELECT rag_embed('hi', repeat('m', 257), 'ollama');
-- A server's word that an input is longer than its model reads is a limit (54000) with the hint to shorten it,
-- whatever the status: Ollama's 400 read as a wrong model name or key, and llama.cpp's 500 was retried until
-- the deadline (session 36).
SELECT rag_embed(repeat('x', 8193), 'hash-384', 'ollama');
\set VERBOSITY sqlstate
SELECT rag_embed(repeat('x', 8193), 'hash-384', 'ollama');
\set VERBOSITY default
-- NULL for a collection's name.
SELECT count(*) FROM rag_query(NULL, 'notice');
-- A local model that is not there is refused when it is chosen, as rag_create_collection refuses it.
DO $$
BEGIN
    PERFORM rag_set_embedding_model('limits', 'no-such-model', embedding_provider => 'local');
EXCEPTION WHEN undefined_file THEN
    RAISE NOTICE 'refused: %', SQLSTATE;
END $$;
SELECT count(*) AS no_change_started FROM rag.migrations m JOIN rag.collections c ON c.id = m.collection_id
 WHERE c.name = 'limits';

-- A new collection's answering defaults and ranges are the same limits.
SELECT context_budget::text = rag._limit('context_budget_default') AS budget_default,
       max_answer_tokens::text = rag._limit('max_answer_tokens_default') AS answer_default
  FROM rag.collections WHERE name = 'limits';
SELECT rag_create_collection('limits-big', embedding_model => 'hash-384', context_budget => 1000001);

-- A chunk unit nobody knows is an error for rag_create_collection and for the worker alike (the worker took
-- it for characters before). The table's check keeps such a unit out; a superuser forces one in to show it.
SELECT rag_create_collection('limits-words', embedding_model => 'hash-384', chunk_unit => 'words');
CREATE TABLE limits_rows (id integer PRIMARY KEY, body text);
INSERT INTO limits_rows VALUES (1, 'The first version of the watched row.');
SELECT rag_watch('limits_rows', 'limits', 'body') > 0 AS watching;
SELECT rag_wait('limits', '60 seconds') AS settled;
ALTER TABLE rag.collections DROP CONSTRAINT collections_chunk_unit_check;
UPDATE rag.collections SET chunk_unit = 'words' WHERE name = 'limits';
SELECT rag_ingest('limits', 'Odd', 'A document of a collection whose chunk unit nobody knows.') > 0 AS ingested;
SELECT rag_wait('limits', '60 seconds') AS settled;
SELECT d.status, d.failure_reason FROM rag.documents d WHERE d.title = 'Odd';
-- A changed watched row that cannot be chunked leaves its document as it was, and the row waits with the reason:
-- its new text was kept beside the old chunks, and at the retry the row read as unchanged and was marked done,
-- so searches kept the old text for good (review of session 35).
UPDATE limits_rows SET body = 'The second version of the watched row.';
SELECT rag_wait('limits', '60 seconds') AS settled;
SELECT d.body, d.status, (SELECT string_agg(ch.content, ' ') FROM rag.chunks ch WHERE ch.document_id = d.id) AS chunks
  FROM rag.documents d WHERE d.source = 'limits_rows';
SELECT q.last_error FROM rag.row_queue q JOIN rag.watches w ON w.id = q.watch_id WHERE w.source_name = 'limits_rows';
UPDATE rag.collections SET chunk_unit = 'characters' WHERE name = 'limits';
ALTER TABLE rag.collections ADD CONSTRAINT collections_chunk_unit_check CHECK (chunk_unit IN ('characters', 'tokens'));
-- Read again (here at once, by rag_reindex; else after its back-off), it is indexed with its new text.
SELECT rag_reindex('limits_rows'::regclass) >= 1 AS queued;
SELECT rag_wait('limits', '60 seconds') AS settled;
SELECT d.body, d.status, (SELECT string_agg(ch.content, ' ') FROM rag.chunks ch WHERE ch.document_id = d.id) AS chunks
  FROM rag.documents d WHERE d.source = 'limits_rows';
SELECT rag_unwatch('limits_rows', drop_documents => true);
DROP TABLE limits_rows;

-- A document's pages are bounded (8 million blank pages took a backend to 753 MB: red team 22).
SELECT rag_ingest('limits', 'Many pages', NULL, pages => array_fill(''::text, ARRAY[100001]));
SELECT rag_ingest('limits', 'Enough pages', NULL, pages => array_fill('A page.'::text, ARRAY[3])) > 0 AS ingested;

-- Markdown of many short lines converts within a small extraction memory: it was held as a string per line
-- (sixty million lines took the child 1.5 GB: red team 22; the list of twenty million alone is 480 MB), now as
-- one buffer.
SET rag.extraction_memory = '256MB';
SELECT length(rag_markdown_to_text(repeat(E'a\n', 20000000))) AS converted_length;
RESET rag.extraction_memory;

-- Every call that writes refuses a read-only transaction first, naming itself, with what works there instead:
-- before, PostgreSQL's "cannot execute INSERT in a read-only transaction" came from somewhere inside it, and
-- some calls did work (an extraction, a provider call) before they got there (red team 21).
CREATE TABLE limits_pages (id integer PRIMARY KEY, body text);
SET default_transaction_read_only = on;
\set VERBOSITY default
SELECT rag_ingest('limits', 'Read only', 'A text.');
\set VERBOSITY terse
SELECT rag_ingest_file('limits', 'a.txt', convert_to('A text.', 'UTF8'));
SELECT rag_delete_document(1);
SELECT rag_create_collection('limits-ro', embedding_model => 'hash-384');
SELECT rag_drop_collection('limits');
SELECT rag_grant('limits', 'rag_reader');
SELECT rag_revoke('limits', 'rag_reader');
SELECT rag_reindex('limits');
SELECT rag_retry_upkeep('limits');
SELECT rag_set_search('limits', 'vector');
SELECT rag_set_reranker('limits', 'none');
SELECT rag_set_embedding_model('limits', 'hash-256');
SELECT rag_cancel_embedding_model('limits');
SELECT rag_create_provider('limits-ro', 'ollama', 'http://127.0.0.1:1');
SELECT rag_drop_provider('limits-ro');
SELECT rag_allow_key('rag.limits_key', 'http://127.0.0.1:1');
SELECT rag_disallow_key('rag.limits_key', 'http://127.0.0.1:1');
SELECT rag_set_price('hash-384', 1);
SELECT rag_watch('limits_pages', 'limits', 'body');
SELECT rag_reindex('limits_pages'::regclass);
SELECT rag_unwatch('limits_pages');
SELECT rag_conversation_start('limits');
SELECT rag_conversation_delete(1);
SELECT rag_process_queue();
-- What reads still works in it.
SELECT count(*) >= 0 AS searched FROM rag_query('limits', 'notice');
RESET default_transaction_read_only;
\set VERBOSITY default
DROP TABLE limits_pages;
SELECT rag_drop_collection('limits');
