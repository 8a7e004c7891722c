-- Grounded answering. Each collection holds the same handbook and talks to a scripted chat model of the
-- test provider: 'chat-test' answers from source [1] and cites it; the @suffixes script the failure modes.
CREATE FUNCTION pg_temp.handbook(p_collection text, p_chat text) RETURNS bigint LANGUAGE sql AS $$
    SELECT rag_create_collection(p_collection, embedding_model => 'hash-384', chat_model => p_chat,
                                 max_distance => 0.8, chunk_size => 200, chunk_overlap => 0);
    SELECT rag_ingest(p_collection, 'Employee Handbook 2026', NULL, pages => ARRAY[
        'Welcome. This handbook describes how we work together.',
        'Notice period. All staff must give thirty days notice before resigning. Managers may agree a shorter notice period in writing.',
        'Annual leave. Staff receive twenty five days of paid annual leave each year.'])
$$;
SELECT pg_temp.handbook('ask-ok', 'chat-test') > 0,
       pg_temp.handbook('ask-insufficient', 'chat-test@insufficient') > 0,
       pg_temp.handbook('ask-cite9', 'chat-test@cite9') > 0,
       pg_temp.handbook('ask-citeonly9', 'chat-test@citeonly9') > 0,
       pg_temp.handbook('ask-prose', 'chat-test@prose') > 0,
       pg_temp.handbook('ask-length', 'chat-test@length') > 0,
       pg_temp.handbook('ask-500', 'chat-test@500') > 0,
       pg_temp.handbook('ask-extractive', NULL) > 0;
SELECT bool_and(rag_wait(name, '30 seconds')) AS all_ready FROM rag.collections WHERE name LIKE 'ask-%';

-- The prompt: numbered sources with a header naming the document and the page, the template filled in.
SELECT jsonb_path_query_array(sources, '$[*].n') AS numbers, jsonb_path_query_array(sources, '$[*].locator') AS locators,
       position('[1] Document ' IN prompt) > 0 AS numbered, position('Question: How much notice must staff give?' IN prompt) > 0 AS has_question
  FROM rag_prompt('ask-ok', 'How much notice must staff give?');

-- Answered, with a citation that names the document and the page.
SELECT outcome, answer, jsonb_path_query_array(citations, '$[*].locator') AS locators,
       citations -> 0 ->> 'title' AS cited, reason, prompt_tokens > 0 AS tokens_reported, model
  FROM rag_ask('ask-ok', 'How much notice must staff give before resigning?');

-- Refused by distance: no chunk is close enough, and the model is not called.
SELECT outcome, answer, citations, reason, cost_usd FROM rag_ask('ask-ok', 'Who won the football last night?');

-- The model says the sources are insufficient.
SELECT outcome, answer, reason FROM rag_ask('ask-insufficient', 'How much notice must staff give before resigning?');
-- An invented citation [9] is stripped from the citations and from the text.
SELECT outcome, answer, jsonb_array_length(citations) AS citations FROM rag_ask('ask-cite9', 'How much notice must staff give before resigning?');
-- Only invented citations: downgraded to a refusal.
SELECT outcome, answer, reason FROM rag_ask('ask-citeonly9', 'How much notice must staff give before resigning?');
-- Prose instead of JSON: failed, no partial answer.
SELECT outcome, answer, left(reason, 48) AS reason FROM rag_ask('ask-prose', 'How much notice must staff give before resigning?');
-- Stopped at the output limit: answered, with an explicit note.
SELECT outcome, right(answer, 55) AS answer_ends FROM rag_ask('ask-length', 'How much notice must staff give before resigning?');
-- Provider error: a failed row, not an exception.
SELECT outcome, answer, regexp_replace(reason, '127\.0\.0\.1:[0-9]+', 'PORT') AS reason FROM rag_ask('ask-500', 'How much notice must staff give before resigning?');
-- No chat model: sentences quoted verbatim from the sources, each with its citation.
SELECT outcome, answer, jsonb_path_query_array(citations, '$[*].n') AS cited, model, cost_usd
  FROM rag_ask('ask-extractive', 'How much notice must staff give before resigning?');

-- The ledger: exactly one row per call, with outcome, counts and tokens. The same question on the same
-- embedding model is embedded once per backend (a query-embedding cache): later rows spent no embed tokens.
SELECT collection, kind, outcome, sources_sent > 0 AS had_sources, citations_kept, citations_stripped, chat_calls,
       prompt_tokens IS NOT NULL AS prompt_tokens, completion_tokens IS NOT NULL AS completion_tokens,
       embed_tokens > 0 AS embed_tokens, role
  FROM rag.queries WHERE collection LIKE 'ask-%' ORDER BY id;
-- The cache is per role: on a connection that switches roles, one role cannot tell from its own ledger row (no
-- embed tokens) that another asked the same question before.
CREATE ROLE ask_cache_reader IN ROLE rag_reader;
SELECT rag_grant('ask-ok', 'ask_cache_reader', 'read');
SET ROLE ask_cache_reader;
SELECT count(*) >= 0 AS searched FROM rag_query('ask-ok', 'How much notice must staff give before resigning?');
RESET ROLE;
SELECT embed_tokens > 0 AS other_role_embedded_it_again FROM rag.queries WHERE role = 'ask_cache_reader';
SELECT rag_revoke('ask-ok', 'ask_cache_reader');
DROP ROLE ask_cache_reader;

-- Cost comes from reported usage and the price in force, which is stored beside it.
SELECT rag_set_price('chat-test', 1.50, 6.00, now() - interval '1 day');
SELECT outcome, cost_usd > 0 AS billed FROM rag_ask('ask-ok', 'How much notice must staff give before resigning?');
SELECT cost_usd = (prompt_tokens * 1.50 + completion_tokens * 6.00) / 1000000 AS cost_matches,
       prices -> 'chat' ->> 'input_usd_per_million' AS price_in_force
  FROM rag.queries ORDER BY id DESC LIMIT 1;
SELECT rag_set_price('chat-test', 3.00, 12.00, now() + interval '1 day');
SELECT prices -> 'chat' ->> 'input_usd_per_million' AS earlier_row_unchanged FROM rag.queries WHERE cost_usd > 0 ORDER BY id DESC LIMIT 1;

SELECT collection, calls, asks, answered, refused, failed, refusal_rate FROM rag.ledger_daily WHERE collection LIKE 'ask-%' ORDER BY collection;

-- Conversations: a follow-up is rewritten into a standalone question before retrieval.
SELECT rag_conversation_start('ask-ok') AS conversation \gset
SELECT outcome FROM rag_ask('ask-ok', 'How much notice must staff give?', conversation => :conversation);
SELECT outcome, rewritten_question IS NOT NULL AS rewritten FROM rag_ask('ask-ok', 'and what about managers?', conversation => :conversation);
SELECT role, content, rewritten_question FROM rag_conversation(:conversation);
SELECT question, rewritten_question FROM rag.queries WHERE conversation_id = :conversation ORDER BY id;
SELECT rag_conversation_delete(:conversation) AS deleted;
SELECT * FROM rag_conversation(:conversation);

-- Ledger retention (rag.ledger_retention): the workers call rag._prune_ledger, which deletes the rows older than
-- the retention, the oldest first and at most a batch per call; a retention of 0 keeps every row.
SELECT count(*) AS ledger_rows FROM rag.queries \gset
UPDATE rag.queries SET created_at = now() - interval '10 days'
 WHERE id IN (SELECT id FROM rag.queries ORDER BY id LIMIT 3);
SELECT rag._prune_ledger('0') AS zero_keeps_every_row;
SELECT rag._prune_ledger('1 day', 2) AS at_most_the_batch;
SELECT rag._prune_ledger('1 day', 2) AS the_rest;
SELECT rag._prune_ledger('1 day', 2) AS none_left;
SELECT count(*) = :ledger_rows - 3 AS only_the_old_rows_went FROM rag.queries;

-- Bad arguments are errors.
SELECT * FROM rag_ask('ask-ok', '');
SELECT * FROM rag_ask('nope', 'question');
SELECT rag_create_collection('chat-is-embed', embedding_model => 'hash-384', chat_model => 'hash-384');
SELECT rag_create_collection('bad-template', prompt_template => 'no placeholders here');
-- The sources go in once: a template repeating them would ask one rendering for the context budget times the
-- repeats (a million repeats aborted the server when the allocation failed).
SELECT rag_create_collection('bad-template', prompt_template => '{{query}}' || repeat('{{context}}', 2));
SELECT rag_create_collection('bad-template', prompt_template => '{{context}}' || repeat(' {{query}}', 5));
SELECT rag_create_collection('bad-template', prompt_template => '{{context}} {{query}}' || repeat(' ', 20000));

-- A hostile or broken chat server. One that ignores max_tokens and answers 100,000 citation markers: refused
-- before anything reads the reply (the citation check of a 56 MB one took 1.8 GB and aborted the server where
-- allocations can fail). One whose answer holds an escaped NUL: kept as U+FFFD, so that the caller sees the
-- text after it and the ledger stores text that COPY (and so pg_dump) reads back whole.
SELECT pg_temp.handbook('hostile-flood', 'chat-test@flood') > 0 AS flood,
       pg_temp.handbook('hostile-nul', 'chat-test@nul') > 0 AS nul;
SELECT rag_wait('hostile-flood', '30 seconds') AND rag_wait('hostile-nul', '30 seconds') AS ready;
SELECT outcome, answer, regexp_replace(reason, '127\.0\.0\.1:[0-9]+', 'PORT') AS reason
  FROM rag_ask('hostile-flood', 'How much notice must staff give before resigning?');
SELECT outcome, answer, jsonb_array_length(citations) AS citations
  FROM rag_ask('hostile-nul', 'How much notice must staff give before resigning?');
SELECT answer, position(chr(65533) IN answer) > 0 AS replaced FROM rag.queries
 WHERE collection = 'hostile-nul' ORDER BY id DESC LIMIT 1;
