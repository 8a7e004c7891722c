SELECT rag_create_collection('docs', embedding_model => 'hash-384', max_distance => 0.9) > 0 AS created;
SELECT name, embedding_provider, embedding_model, dimensions, document_prefix, query_prefix,
       chunk_size, chunk_overlap, chunk_unit, max_distance
  FROM rag.collections WHERE name = 'docs';

-- Defaults come from the settings at creation time.
SET rag.chunk_size = 800;
SET rag.embedding_model = 'hash-64';
SELECT rag_create_collection('defaults') > 0 AS created;
SELECT embedding_model, chunk_size, chunk_overlap, max_distance FROM rag.collections WHERE name = 'defaults';
RESET rag.chunk_size;
RESET rag.embedding_model;

-- Bad input: clear errors with hints.
SELECT rag_create_collection('docs');
SELECT rag_create_collection('bad name!');
SELECT rag_create_collection(repeat('y', 100000));
SELECT rag_create_collection('x', chunk_size => 500, chunk_overlap => 500);
SELECT rag_create_collection('x', chunk_size => 20000);
SELECT rag_create_collection('x', chunk_unit => 'words');
SELECT rag_create_collection('x', embedding_provider => 'nowhere');
SELECT rag_create_collection('x', max_distance => 3);
SELECT rag_create_collection('x', dimensions => 0);

-- Token units: 250 tokens are about 1000 characters.
SELECT rag_create_collection('tokens', embedding_model => 'hash-384', chunk_size => 250, chunk_overlap => 25,
                             chunk_unit => 'tokens') > 0 AS created;

-- A collection created with its dimension gets its HNSW index at once.
SELECT rag_create_collection('sized', embedding_model => 'hash-16', dimensions => 16) > 0 AS created;
SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = 'rag' AND indexname LIKE 'chunks_embedding_c%';
-- Each collection's chunks are a partition of rag.chunks with its own keys and indexes. It is a table of the
-- database, not an extension member (pg_dump writes it and its rows), and only its owner may read or write it
-- directly: everyone else goes through rag.chunks and its policy.
SELECT format('rag.%I', rag._chunk_partition(id)) AS sized_partition FROM rag.collections WHERE name = 'sized' \gset
SELECT pg_get_expr(c.relpartbound, c.oid) AS bound, i.inhparent::regclass AS parent,
       c.reloptions, c.relowner = (SELECT relowner FROM pg_class WHERE oid = 'rag.chunks'::regclass) AS same_owner
  FROM pg_class c JOIN pg_inherits i ON i.inhrelid = c.oid
 WHERE c.oid = :'sized_partition'::regclass AND pg_get_expr(c.relpartbound, c.oid) =
       format('FOR VALUES IN (%s)', (SELECT id FROM rag.collections WHERE name = 'sized'));
SELECT regexp_replace(indexdef, '_c\d+', '_cN', 'g') AS partition_index FROM pg_indexes
 WHERE schemaname = 'rag' AND tablename = rag._chunk_partition((SELECT id FROM rag.collections WHERE name = 'sized'))
 ORDER BY 1;
SELECT EXISTS (SELECT 1 FROM pg_depend WHERE objid = :'sized_partition'::regclass AND deptype = 'e') AS extension_member,
       has_table_privilege('rag_admin', :'sized_partition', 'SELECT, INSERT, UPDATE, DELETE') AS rag_admin_may_touch,
       has_table_privilege('public', :'sized_partition', 'SELECT') AS public_may_read;

-- Per-model defaults (rag_known_models): a ceiling where one was measured, rag.max_distance when it is set,
-- the caller's above both; an unknown model gets the setting's default and no prefix.
SELECT model, document_prefix, query_prefix, pooling, window_tokens, max_distance FROM rag_known_models()
 WHERE model IN ('all-minilm', 'bge-small-en-v1.5', 'nomic-embed-text', 'e5-base-v2', 'text-embedding-3-small')
 ORDER BY model;
SELECT rag_create_collection('ceil-bge', embedding_model => 'BAAI/bge-small-en-v1.5') > 0 AS created;
SELECT rag_create_collection('ceil-unknown', embedding_model => 'hash-384') > 0 AS created;
SET rag.max_distance = 0.5;
SELECT rag_create_collection('ceil-set', embedding_model => 'bge-small-en-v1.5') > 0 AS created;
RESET rag.max_distance;
SELECT rag_create_collection('ceil-arg', embedding_model => 'bge-small-en-v1.5', max_distance => 0.7) > 0 AS created;
SELECT name, max_distance, query_prefix FROM rag.collections WHERE name LIKE 'ceil-%' ORDER BY name;
-- Chunks that can hold more tokens than a served model reads: a NOTICE with the size that fits.
SELECT rag_create_collection('ceil-window', embedding_model => 'all-minilm', chunk_size => 2000, chunk_overlap => 100) > 0 AS created;
SELECT rag_create_collection('ceil-fits', embedding_model => 'nomic-embed-text', chunk_size => 2000, chunk_overlap => 100) > 0 AS created;
SELECT count(*) FILTER (WHERE rag_drop_collection(name)) AS dropped FROM rag.collections WHERE name LIKE 'ceil-%';

SELECT rag_drop_collection('defaults'), rag_drop_collection('sized'), rag_drop_collection('never-existed');
-- The collection is gone at once; its partition is marked for the worker, which drops it a moment later in a
-- transaction of its own (dropping it here would lock all of rag.chunks until this transaction ends).
SELECT to_regclass(:'sized_partition') IS NULL
       OR obj_description(to_regclass(:'sized_partition'), 'pg_class') LIKE 'rag: the collection of these chunks was dropped%' AS dropped_or_marked;
DO $$
BEGIN
    FOR i IN 1..600 LOOP
        EXIT WHEN cardinality(rag._partitions_to_drop()) = 0;
        PERFORM pg_sleep(0.05);
    END LOOP;
END $$;
SELECT count(*) AS leftover_indexes FROM pg_indexes WHERE schemaname = 'rag' AND indexname LIKE 'chunks_embedding_c%';
SELECT to_regclass(:'sized_partition') IS NULL AS partition_dropped;
SELECT name FROM rag.collections ORDER BY name;
