-- Retrieval ranks the relevant document first and honours the distance ceiling.
SELECT title, ordinal, distance < 0.9 AS close, left(content, 40) AS content, metadata
  FROM rag_query('docs', 'How much notice do I have to give before resigning?', 3);

SELECT title FROM rag_query('docs', 'Is there vegetarian food at lunch in the canteen?', 1);

-- Nothing close enough: no rows, not the k nearest regardless.
SELECT count(*) AS unrelated_hits FROM rag_query('docs', 'quantum chromodynamics lattice gauge', 5, max_distance => 0.5);

-- Metadata filters are applied inside the SQL.
SELECT title FROM rag_query('docs', 'notice period lunch canteen', 5, filter => '{"department": "hr"}');

-- The search uses the collection's HNSW index (checked in the plan's lines rather than pinned whole: each major
-- prints plans a little differently).
SET enable_seqscan = off;
SELECT count(*) FILTER (WHERE line ~ 'Index Scan using chunks_embedding_c') AS hnsw_scans,
       count(*) FILTER (WHERE line ~ 'Seq Scan on chunks') AS chunk_seq_scans,
       count(*) FILTER (WHERE line ~ '\$1::vector\(384\)') > 0 AS vector_hidden,
       -- A collection that watches no table is searched without the join to rag.documents that checks
       -- watched rows (11_security pins the join for one that does).
       count(*) FILTER (WHERE line ~ 'on documents') AS documents_joined
  FROM rag_explain('docs', mode => 'vector') AS line;
RESET enable_seqscan;

-- Bad calls.
SELECT * FROM rag_query('docs', '');
SELECT * FROM rag_query('docs', E'\n\u3000');
SELECT * FROM rag_query('docs', 'x', 0);
SELECT * FROM rag_query('missing', 'x');
SELECT * FROM rag_query('docs', 'x', filter => '[1]');
SELECT * FROM rag_query('docs', 'x', filter => jsonb_build_object('a', (SELECT jsonb_agg(g) FROM generate_series(1, 20000) g)));

-- A hung provider cannot hang a backend beyond statement_timeout.
SELECT rag_create_collection('hung', embedding_model => 'hash-384@timeout', dimensions => 384) > 0 AS created;
SET statement_timeout = '1s';
SELECT * FROM rag_query('hung', 'anything');
-- rag_explain asks the provider nothing (the plan does not depend on the question's vector): on the hung
-- provider it returns at once, and it spends no call that the ledger would not record.
SELECT count(*) > 0 AS explained FROM rag_explain('hung', 'anything', mode => 'vector');
RESET statement_timeout;
SELECT * FROM rag_explain('docs', 'x', 0);
SELECT * FROM rag_explain('docs', 'x', 2147483647);
SELECT * FROM rag_explain('docs', NULL);
-- A question is at most 32 KB: it is embedded, reranked against each candidate and copied into the prompt.
SELECT * FROM rag_query('docs', repeat('why ', 10000));
SELECT * FROM rag_explain('docs', repeat('why ', 10000));
SELECT * FROM rag_prompt('docs', repeat('why ', 10000));
SELECT outcome FROM rag_ask('docs', repeat('why ', 10000));

-- rag.status: per collection, by status, with queue depth.
SELECT collection, dimensions, documents_processing, documents_ready, documents_failed,
       chunks_embedded = chunks_total AS complete, queue_depth, last_error
  FROM rag.status ORDER BY collection;

-- rag_models lists what the provider serves.
SELECT name FROM rag_models() ORDER BY name LIMIT 3;
