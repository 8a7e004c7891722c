-- Retrieval ranks the relevant document first and honours the distance ceiling.
SELECT title, ordinal, distance < 0.9 AS close, left(content, 40) AS content, metadata
  FROM rag_query('docs', 'How much notice do I have to give before resigning?', 3);

SELECT title FROM rag_query('docs', 'Is there vegetarian food at lunch in the canteen?', 1);

-- Nothing close enough: no rows, not the k nearest regardless.
SELECT count(*) AS unrelated_hits FROM rag_query('docs', 'quantum chromodynamics lattice gauge', 5, max_distance => 0.5);

-- Metadata filters are applied inside the SQL.
SELECT title FROM rag_query('docs', 'notice period lunch canteen', 5, filter => '{"department": "hr"}');

-- The search uses the collection's HNSW index. (Incremental sort off: PostgreSQL 18 picks it for the final
-- ordering, 15 a plain sort; the index scan is what this checks.)
SET enable_seqscan = off;
SET enable_incremental_sort = off;
SELECT * FROM rag_explain('docs');
RESET enable_seqscan;
RESET enable_incremental_sort;

-- Bad calls.
SELECT * FROM rag_query('docs', '');
SELECT * FROM rag_query('docs', 'x', 0);
SELECT * FROM rag_query('missing', 'x');
SELECT * FROM rag_query('docs', 'x', filter => '[1]');

-- A hung provider cannot hang a backend beyond statement_timeout.
SELECT rag_create_collection('hung', embedding_model => 'hash-384@timeout', dimensions => 384) > 0 AS created;
SET statement_timeout = '1s';
SELECT * FROM rag_query('hung', 'anything');
RESET statement_timeout;

-- rag.status: per collection, by status, with queue depth.
SELECT collection, dimensions, documents_processing, documents_ready, documents_failed,
       chunks_embedded = chunks_total AS complete, queue_depth, last_error
  FROM rag.status ORDER BY collection;

-- rag_models lists what the provider serves.
SELECT name FROM rag_models() ORDER BY name LIMIT 3;
