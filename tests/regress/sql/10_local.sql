-- The embedded default: a sentence-embedding model (all-MiniLM-L6-v2) running inside PostgreSQL.
SELECT name, kind FROM rag.providers WHERE name = 'local';
SELECT name, size_bytes > 80000000 AS has_weights FROM rag_models('local');

-- The embeddings match the reference implementation (sentence-transformers' quickstart).
WITH s(n, t) AS (VALUES (0, 'The weather is lovely today.'), (1, 'It''s so sunny outside!'), (2, 'He drove to the stadium.')),
     e AS (SELECT n, rag_embed(t) AS v FROM s)
SELECT a.n, b.n, round((1 - (a.v <=> b.v))::numeric, 3) AS cosine_similarity
  FROM e a JOIN e b ON a.n < b.n ORDER BY 1, 2;
SELECT vector_dims(rag_embed('dimensions')) AS dimensions;

-- A collection on the local model: no server involved. Chunks are sized to the model's window.
SELECT rag_create_collection('local-docs', embedding_provider => 'local', max_distance => 0.8) > 0 AS created;
SELECT embedding_model, chunk_size, chunk_overlap, document_prefix, query_prefix FROM rag.collections WHERE name = 'local-docs';
SELECT rag_ingest('local-docs', 'Leave', 'Employees receive twenty-five days of paid vacation every year. Unused days may be carried over until March.') > 0,
       rag_ingest('local-docs', 'Resignation', 'Anyone who wants to quit must tell their manager in writing one month in advance.') > 0,
       rag_ingest('local-docs', 'Expenses', 'Train tickets and hotel bills for business trips are refunded within two weeks.') > 0;
SELECT rag_wait('local-docs', '120 seconds') AS ready;
SELECT title, status, chunks_embedded, embed_tokens > 0 AS tokens_counted FROM rag.documents d
  JOIN rag.collections c ON c.id = d.collection_id WHERE c.name = 'local-docs' ORDER BY d.id;

-- Paraphrased questions, with few words in common with the passage, find it.
SELECT (SELECT title FROM rag_query('local-docs', 'How much notice do I have to give before leaving the company?', 1)) AS resign,
       (SELECT title FROM rag_query('local-docs', 'How many holidays do I get?', 1)) AS leave,
       (SELECT title FROM rag_query('local-docs', 'Will I get my travel costs back?', 1)) AS expenses;
-- Extractive answers on the embedded model: quoted sentences, valid citations only.
SELECT outcome, answer, jsonb_path_query_array(citations, '$[*].title') AS cited
  FROM rag_ask('local-docs', 'How far in advance must I tell my manager that I quit?');

-- Mixed providers in one database: a collection on the test server's 768-dimensional model beside the local
-- one, both written in one transaction. Each keeps its own model, dimension and index, and the worker
-- embeds each document with its own collection's provider.
SELECT rag_create_collection('remote-docs', embedding_model => 'hash-768') > 0 AS created;
BEGIN;
SELECT rag_ingest('remote-docs', 'Leave', 'Employees receive twenty-five days of paid vacation every year.') > 0 AS remote,
       rag_ingest('local-docs', 'Parking', 'Staff may leave their cars in the garage behind the building free of charge.') > 0 AS local;
COMMIT;
SELECT rag_wait('remote-docs', '60 seconds') AND rag_wait('local-docs', '120 seconds') AS ready;
SELECT c.name, c.embedding_provider, c.embedding_model, c.dimensions, c.index_name IS NOT NULL AS indexed,
       count(*) FILTER (WHERE vector_dims(ch.embedding) = c.dimensions) AS chunks_of_that_size, count(*) AS chunks
  FROM rag.collections c JOIN rag.documents d ON d.collection_id = c.id JOIN rag.chunks ch ON ch.document_id = d.id
 WHERE c.name IN ('local-docs', 'remote-docs') GROUP BY c.id ORDER BY c.name;
SELECT (SELECT title FROM rag_query('local-docs', 'Where can I park my car at work?', 1)) AS local_top,
       (SELECT title FROM rag_query('remote-docs', 'Employees receive twenty-five days of paid vacation every year.', 1)) AS remote_top;

-- Chunks that could overflow the model's window are refused when the collection is made.
SELECT rag_create_collection('too-big', embedding_provider => 'local', chunk_size => 5000);
-- So are prefixes that leave too little of it: a query prefix of the whole window made every search fail, a
-- reader's short question included, with a hint to shorten the question (review of session 35).
SELECT rag_create_collection('long-prefix', embedding_provider => 'local', query_prefix => repeat('q ', 500));
SELECT rag_create_collection('long-prefix', embedding_provider => 'local', document_prefix => repeat('d ', 200));
SELECT rag_create_collection('short-prefix', embedding_provider => 'local', query_prefix => 'query: ') > 0 AS created;
SELECT rag_drop_collection('short-prefix');
-- The message names the default model directory, under the server's share directory (shown as <sharedir>, so
-- the expected output holds for every PostgreSQL installation).
DO $$
DECLARE
    v_message text;
    v_hint text;
BEGIN
    PERFORM rag_create_collection('no-model', embedding_provider => 'local', embedding_model => 'not-installed');
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS v_message = MESSAGE_TEXT, v_hint = PG_EXCEPTION_HINT;
    RAISE NOTICE 'ERROR (%): % HINT: %', SQLSTATE,
        replace(v_message, (SELECT setting FROM pg_catalog.pg_config WHERE name = 'SHAREDIR'), '<sharedir>'), v_hint;
END $$;
SELECT rag_embed('x', 'no/such/../path');
-- A text far over the model's window is refused before the tokenizer holds two hundred bytes a byte of it.
SELECT rag_embed(repeat('a ', 4000000));
-- So is one of more tokens than the window: the text is the caller's to shorten, a limit (54000), not a
-- problem with the model name or credentials (red team 21).
SELECT rag_embed(repeat('word ', 400));
\set VERBOSITY sqlstate
SELECT rag_embed(repeat('word ', 400));
\set VERBOSITY default

-- Digits and punctuation give about one token per two characters, so 700-character chunks, which the
-- creation check accepts, would overflow the 256-token window. The worker measures every chunk with the
-- model's tokenizer and splits the ones that do not fit: the document embeds whole instead of failing.
SELECT rag_create_collection('dense', embedding_provider => 'local', chunk_size => 700, chunk_overlap => 0) > 0 AS created;
SELECT rag_ingest('dense', 'Readings', string_agg(format('%s,%s;', i, i * 7 % 97), ' ')) > 0 AS ingested
  FROM generate_series(1, 400) i;
SELECT rag_wait('dense', '120 seconds') AS ready;
SELECT d.status, d.failure_reason, d.chunks_embedded = d.chunks_total AS all_embedded,
       d.chunks_total > (SELECT count(*) FROM rag_chunk(d.body, 700, 0)) AS split_further,
       (SELECT max(length(content)) < 700 FROM rag.chunks ch WHERE ch.document_id = d.id) AS shorter
  FROM rag.documents d JOIN rag.collections c ON c.id = d.collection_id WHERE c.name = 'dense';
