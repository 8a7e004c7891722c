-- Hybrid retrieval: a full-text side (the question's lexemes joined by OR, ranked by ts_rank_cd, through each
-- collection's GIN index) fused with the vector side by reciprocal rank, in the one search (rag._search).
SELECT rag_create_collection('hybrid', embedding_model => 'hash-384', max_distance => 2) > 0 AS created;
SELECT search_mode, text_search_config FROM rag.collections WHERE name = 'hybrid';
SELECT rag_ingest('hybrid', 'Error codes', 'Error E1234 means the disk is full. Free some space and try again.') > 0 AS a,
       rag_ingest('hybrid', 'Network', 'Routers forward packets between networks; switches connect machines.') > 0 AS b,
       rag_ingest('hybrid', 'Disks', 'A full disk slows every write, and databases stop accepting them.') > 0 AS c,
       rag_ingest('hybrid', 'Printers', 'Printers need paper and toner; a jammed printer shows a blinking light.') > 0 AS d,
       rag_ingest('hybrid', 'Backups', 'Backups of the disk run nightly; restore them with the recovery tool.') > 0 AS e;
SELECT rag_wait('hybrid', '60 seconds') AS ready;
-- Every chunk has its lexemes, and the collection its GIN index beside its HNSW index.
SELECT count(*) FILTER (WHERE ch.tsv IS NOT NULL) = count(*) AS lexemes_stored
  FROM rag.chunks ch JOIN rag.collections c ON c.id = ch.collection_id WHERE c.name = 'hybrid';
SELECT count(*) AS indexes FROM pg_indexes i JOIN rag.collections c ON c.name = 'hybrid'
 WHERE i.schemaname = 'rag' AND i.indexname IN (c.index_name, rag._keyword_index_name(c.id));

-- OR semantics: a question worded unlike the text still matches on the words it shares.
SELECT rag._or_query('english', 'What does the error E1234 mean?');
-- Of those, the side searches for the ones found in the collection (a small one keeps every word it has).
SELECT rag._keyword_query(c, 'What does the error E1234 mean for my cat?') FROM rag.collections c WHERE c.name = 'hybrid';
SELECT rag._or_query('english', 'what is it?') IS NULL AS only_stop_words;
-- Each lexeme is searched for as it is: a URL keeps '/', '?', ':' and '=', and quotes and backslashes are
-- escaped for tsquery's syntax.
SELECT rag._or_query('english', $$Read https://example.org/faq?id=7:notice, O'Brien said$$);
SELECT rag._lexeme_query($$it's a\b$$) AS escaped;
-- The keyword side finds an exact identifier first.
SELECT title FROM rag_query('hybrid', 'what does E1234 mean', k => 1, mode => 'keyword');
-- Every word shared counts: more shared words rank higher.
SELECT title FROM rag_query('hybrid', 'full disk backups', k => 3, mode => 'keyword');

-- Hybrid order is reciprocal rank fusion of the two sides' orders, 1 / (60 + vector rank) + 0.5 / (60 + keyword
-- rank); computed here from the two single-mode results and compared with what the hybrid search returns.
WITH vector_side AS (
    SELECT chunk_id, n FROM rag_query('hybrid', 'is the disk full', k => 40, max_distance => 2, mode => 'vector')
         WITH ORDINALITY AS q(document_id, title, chunk_id, ordinal, content, distance, metadata, page, source, source_key, relevance, n)),
keyword_side AS (
    SELECT chunk_id, n FROM rag_query('hybrid', 'is the disk full', k => 40, max_distance => 2, mode => 'keyword')
         WITH ORDINALITY AS q(document_id, title, chunk_id, ordinal, content, distance, metadata, page, source, source_key, relevance, n)),
expected AS (
    SELECT coalesce(v.chunk_id, k.chunk_id) AS chunk_id,
           coalesce(1.0 / (60 + v.n), 0) + rag._limit('keyword_weight')::numeric * coalesce(1.0 / (60 + k.n), 0) AS score
      FROM vector_side v FULL JOIN keyword_side k ON k.chunk_id = v.chunk_id)
SELECT (SELECT array_agg(chunk_id ORDER BY score DESC, chunk_id) FROM expected)
     = (SELECT array_agg(chunk_id) FROM rag_query('hybrid', 'is the disk full', k => 40, max_distance => 2, mode => 'hybrid'))
       AS fused_by_reciprocal_rank,
       (SELECT count(*) FROM keyword_side) AS keyword_hits;

-- The distance ceiling applies in every mode: a shared word does not let a far chunk through.
SELECT count(*) AS within_tiny_ceiling FROM rag_query('hybrid', 'E1234', mode => 'keyword', max_distance => 0.0001);
-- Only stop words: the keyword side has nothing to say; hybrid is then the vector side alone.
SELECT count(*) AS keyword_only FROM rag_query('hybrid', 'what is it', mode => 'keyword');
SELECT count(*) > 0 AS hybrid_falls_back FROM rag_query('hybrid', 'what is it', mode => 'hybrid');
SELECT rag_ingest('hybrid', 'Link', 'The notice form is at https://example.org/faq?id=7:notice for everyone.') > 0 AS link;
SELECT rag_wait('hybrid', '60 seconds') AS ready;
SELECT title FROM rag_query('hybrid', 'where is example.org/faq?id=7:notice', k => 1, mode => 'keyword');
-- A metadata filter applies on both sides.
SELECT rag_ingest('hybrid', 'Tagged', 'Error E1234 again, in the operations manual.', '{"manual": "ops"}') > 0 AS tagged;
SELECT rag_wait('hybrid', '60 seconds') AS ready;
SELECT title FROM rag_query('hybrid', 'E1234', filter => '{"manual": "ops"}', mode => 'keyword');
SELECT title FROM rag_query('hybrid', 'E1234', filter => '{"manual": "ops"}', mode => 'hybrid');
-- rag_ask and rag_prompt search the same way (the collection's mode).
SELECT outcome, citations->0->>'title' AS cited FROM rag_ask('hybrid', 'What does error E1234 mean?', k => 1);

-- Bad modes.
SELECT * FROM rag_query('hybrid', 'x', mode => 'fuzzy');
SELECT rag_create_collection('bad-mode', embedding_model => 'hash-384', search_mode => 'fuzzy');

-- The plan can use the collection's GIN index for the full-text side and its HNSW index for the vector side,
-- both on the collection's partition of rag.chunks. At five chunks the planner prefers reading the partition
-- through its key and sorting, so the plans are shown with that made dear.
SET enable_seqscan = off;
SET enable_sort = off;
-- Only the collection's own partition is read (planned), with other collections' partitions beside it.
SELECT count(*) FILTER (WHERE line ~ 'Index Scan using chunks_embedding_c\d+ on chunks_c\d+ ') > 0 AS hnsw_used,
       count(DISTINCT substring(line FROM ' on (chunks_c\d+)')) AS partitions_read,
       (SELECT count(*) FROM pg_inherits WHERE inhparent = 'rag.chunks'::regclass) > 1 AS other_partitions_exist
  FROM rag_explain('hybrid', 'disk full', 3, mode => 'vector') AS line;
RESET enable_sort;
SELECT count(DISTINCT substring(line FROM ' on (chunks_c\d+)')) AS partitions_read
  FROM rag_explain('hybrid', 'disk full', 3, mode => 'keyword') AS line;
-- The keyword side's match, through rag.chunks with the collection's id, finds the partition's GIN index (the
-- search's own plan at five chunks depends on the server's version).
CREATE FUNCTION pg_temp.plan_of(p_query text) RETURNS SETOF text LANGUAGE plpgsql AS $$
DECLARE
    v_line text;
BEGIN
    FOR v_line IN EXECUTE 'EXPLAIN (COSTS OFF) ' || p_query LOOP
        RETURN NEXT v_line;
    END LOOP;
END $$;
SET enable_indexscan = off;
SELECT count(*) FILTER (WHERE line ~ 'Bitmap Index Scan on chunks_tsv_c\d+') > 0 AS gin_used,
       count(DISTINCT substring(line FROM ' on (chunks_c\d+)')) AS partitions_read
  FROM rag.collections c,
       pg_temp.plan_of(format('SELECT id FROM rag.chunks WHERE collection_id = %s AND tsv @@ %L::tsquery',
                              c.id, 'disk | full')) AS line
 WHERE c.name = 'hybrid';
RESET enable_indexscan;
RESET enable_seqscan;
-- A collection's own hnsw.ef_search: stored per collection, applied to its searches, and the session's own
-- setting is what it was afterwards. Only an admin of the collection sets it; 0 goes back to the server's.
SET hnsw.ef_search = 17;
SELECT rag_set_search('hybrid', ef_search => 100);
SELECT search_mode, ef_search FROM rag.collections WHERE name = 'hybrid';
SELECT count(*) > 0 AS found FROM rag_query('hybrid', 'disk full', 3);
SELECT count(*) > 0 AS found_by_vector FROM rag_query('hybrid', 'disk full', 3, mode => 'vector');
SHOW hnsw.ef_search;
SELECT rag_set_search('hybrid', ef_search => 1001);
SELECT rag_set_search('hybrid', search_mode => 'fuzzy');
SELECT rag_set_search('hybrid', search_mode => 'vector', ef_search => 0);
SELECT search_mode, ef_search FROM rag.collections WHERE name = 'hybrid';
RESET hnsw.ef_search;
-- The HNSW index's build parameters: set, the index stays (searches keep using it, rag_explain says a rebuild
-- is pending) and the worker builds its successor beside it with them, then drops it; 0 puts pgvector's
-- default back. pgvector's own bounds are checked, ef_construction at least twice m included, and nothing
-- changes then.
CREATE FUNCTION pg_temp.rebuilt_index(p_collection text) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    v_def text;
BEGIN
    FOR i IN 1..600 LOOP
        -- Done when the recorded index has the parameters asked for and is the collection's only HNSW index.
        SELECT x.indexdef INTO v_def FROM rag.collections c JOIN pg_indexes x ON x.schemaname = 'rag' AND x.indexname = c.index_name
         WHERE c.name = p_collection AND rag._hnsw_index_current(c, c.index_name)
           AND (SELECT count(*) FROM pg_indexes y WHERE y.schemaname = 'rag' AND y.indexdef LIKE '%USING hnsw%'
                   AND y.tablename = rag._chunk_partition(c.id)) = 1;
        IF v_def IS NOT NULL THEN
            RETURN substring(v_def FROM 'vector_cosine_ops\)(.*)$');
        END IF;
        PERFORM pg_sleep(0.05);
    END LOOP;
    RETURN 'not rebuilt';
END $$;
SELECT index_name AS before_rebuild FROM rag.collections WHERE name = 'hybrid' \gset
BEGIN;
SELECT rag_set_search('hybrid', m => 8, ef_construction => 40);
-- Nothing of the collection's chunks is locked by the change, and the index in use stays until the new one is there.
SELECT count(*) AS chunk_locks FROM pg_locks l JOIN pg_class x ON x.oid = l.relation
 WHERE l.pid = pg_backend_pid() AND x.relname LIKE 'chunks%' AND l.mode NOT IN ('AccessShareLock', 'RowShareLock');
SELECT to_regclass('rag.' || :'before_rebuild') IS NOT NULL AS old_index_kept;
SELECT regexp_replace(line, '_c\d+', '_cN') AS said FROM rag_explain('hybrid', 'disk full', 3, mode => 'vector') AS line
 WHERE line LIKE 'Vector side%';
COMMIT;
SELECT hnsw_m, hnsw_ef_construction FROM rag.collections WHERE name = 'hybrid';
SELECT pg_temp.rebuilt_index('hybrid') AS built_with;
SELECT index_name <> :'before_rebuild' AS other_name, to_regclass('rag.' || :'before_rebuild') IS NULL AS old_index_dropped
  FROM rag.collections WHERE name = 'hybrid';
SELECT count(*) > 0 AS found FROM rag_query('hybrid', 'disk full', 3, mode => 'vector');
SELECT rag_set_search('hybrid', m => 64, ef_construction => 100);
SELECT rag_set_search('hybrid', m => 1);
SELECT rag_set_search('hybrid', ef_construction => 1001);
SELECT hnsw_m, hnsw_ef_construction FROM rag.collections WHERE name = 'hybrid';
SELECT rag_set_search('hybrid', m => 0);
SELECT pg_temp.rebuilt_index('hybrid') AS built_with;
SELECT rag_set_search('hybrid', ef_construction => 0);
SELECT pg_temp.rebuilt_index('hybrid') = '' AS pgvector_defaults;
-- The same settings keep the index as it is.
SELECT x.oid AS kept_index FROM pg_class x JOIN rag.collections c ON x.relname = c.index_name WHERE c.name = 'hybrid' \gset
SELECT rag_set_search('hybrid', m => 0, ef_construction => 0, ef_search => 0);
SELECT x.oid = :kept_index AS same_index FROM pg_class x JOIN rag.collections c ON x.relname = c.index_name WHERE c.name = 'hybrid';
-- A larger collection: each word's matches are counted only up to rag._limit('keyword_count_cap'), and a word
-- found more often is judged by its share of the collection, measured on a sample (rag._measure_lexemes).
-- 1,200 chunks: "zebra" in all of them, "yak" in a third, "walrus" in a fifth (more than the cap, less than the
-- max share), "quokka" in one in a hundred, "narwhal" in none.
SELECT rag_create_collection('wide', embedding_model => 'hash-384') IS NOT NULL AS created;
WITH d AS (
  INSERT INTO rag.documents (collection_id, title, body, content_sha256, status, chunks_total)
  SELECT c.id, n::text, 'x', sha256(('wide ' || n)::bytea), 'ready', 1
    FROM rag.collections c, generate_series(1, 1200) n WHERE c.name = 'wide'
  RETURNING id, collection_id, title::integer AS n)
INSERT INTO rag.chunks (document_id, collection_id, ordinal, content, token_estimate, char_start, char_end, tsv)
SELECT d.id, d.collection_id, 0, t.content, 10, 0, length(t.content), to_tsvector('english', t.content)
  FROM d CROSS JOIN LATERAL (SELECT concat_ws(' ', 'zebra', CASE WHEN d.n % 3 = 0 THEN 'yak' END,
                                              CASE WHEN d.n % 5 = 0 THEN 'walrus' END,
                                              CASE WHEN d.n % 100 = 0 THEN 'quokka' END) AS content) t;
SELECT rag._ensure_index(id) IS NULL AS done, to_regclass('rag.' || rag._keyword_index_name(id)) IS NOT NULL AS gin_index
  FROM rag.collections WHERE name = 'wide';
SELECT rag._measure_lexemes(id) = id AS measured FROM rag.collections WHERE name = 'wide';
SELECT s.lexeme, round(s.share::numeric, 2) AS share, m.chunks
  FROM rag.lexeme_shares s JOIN rag.lexeme_measures m USING (collection_id)
  JOIN rag.collections c ON c.id = s.collection_id WHERE c.name = 'wide' ORDER BY s.lexeme;
SELECT rag._keyword_query(c, 'zebra yak walrus quokka narwhal') FROM rag.collections c WHERE c.name = 'wide';
-- A word above the cap that the measure did not record (found in too few of the sampled chunks) counts as rare.
DELETE FROM rag.lexeme_shares WHERE lexeme = 'yak' AND collection_id = (SELECT id FROM rag.collections WHERE name = 'wide');
SELECT rag._keyword_query(c, 'zebra yak narwhal') FROM rag.collections c WHERE c.name = 'wide';
-- Not measured since it outgrew the exact size (a new collection, a restored database): every word is counted
-- up to its bound, as before shares existed, with the same result.
DELETE FROM rag.lexeme_measures WHERE collection_id = (SELECT id FROM rag.collections WHERE name = 'wide');
SELECT rag._keyword_query(c, 'zebra yak walrus quokka narwhal') FROM rag.collections c WHERE c.name = 'wide';
-- Readers see the shares of the collections they may read only.
CREATE ROLE wide_reader LOGIN IN ROLE rag_reader;
SELECT rag._measure_lexemes(id) = id AS measured_again FROM rag.collections WHERE name = 'wide';
SET ROLE wide_reader;
SELECT count(*) AS shares_seen_without_read FROM rag.lexeme_shares;
RESET ROLE;
SELECT rag_grant('wide', 'wide_reader', 'read');
SET ROLE wide_reader;
SELECT count(*) AS shares_seen_with_read FROM rag.lexeme_shares;
RESET ROLE;
SELECT rag_drop_collection('wide');
SELECT count(*) AS shares_left FROM rag.lexeme_shares;
DROP ROLE wide_reader;
CREATE ROLE hybrid_reader LOGIN IN ROLE rag_reader;
SELECT rag_grant('hybrid', 'hybrid_reader', 'read');
SET ROLE hybrid_reader;
SELECT rag_set_search('hybrid', ef_search => 5);
SELECT rag_set_search('hybrid', m => 4);
-- The search's kept statements and built queries are rag's own: a reader can neither run SQL through the
-- function that runs them nor plant a query for rag's SECURITY DEFINER search to run later in this session.
SELECT * FROM rag._search_rows('SELECT 1, 1, 1, 1, 1', NULL, 1, NULL, NULL, 1);
SELECT rag._keep_search_sql('1|384|embedding|vector|f|t|f|f|f', 'SELECT 1, 1, 1, 1, 1');
SELECT rag._kept_search_sql('1|384|embedding|vector|f|t|f|f|f');
RESET ROLE;
-- An admin of other collections may not change this one's index (nor drop it by doing so).
CREATE ROLE hybrid_other_admin LOGIN IN ROLE rag_admin;
SET ROLE hybrid_other_admin;
SELECT rag_set_search('hybrid', m => 4);
RESET ROLE;
SELECT hnsw_m, index_name IS NOT NULL AS index_kept FROM rag.collections WHERE name = 'hybrid';
DROP ROLE hybrid_other_admin;
-- An HNSW index that is gone (dropped by hand, or left out of a restore): the worker does not build it by itself
-- (a restore may be about to), rag_explain says the search is exact and why, and rag_reindex has it built again.
SELECT index_name AS hybrid_index FROM rag.collections WHERE name = 'hybrid' \gset
-- The search runs with its plan kept for the session (rag._search_rows); PostgreSQL plans it again when the
-- index goes and when it is back, so this session finds the same chunks through all three (by document and
-- place: rag_reindex embeds the documents again, as new chunks).
SELECT array_agg(document_id || '/' || ordinal ORDER BY distance, document_id, ordinal)::text AS with_index
  FROM rag_query('hybrid', 'disk full', 3, max_distance => 2, mode => 'vector') \gset
DROP INDEX rag.:"hybrid_index";
SELECT array_agg(document_id || '/' || ordinal ORDER BY distance, document_id, ordinal)::text = :'with_index'
       AS same_without_index
  FROM rag_query('hybrid', 'disk full', 3, max_distance => 2, mode => 'vector');
SELECT regexp_replace(line, '_c\d+', '_cN') AS said FROM rag_explain('hybrid', 'disk full', 3, mode => 'vector') AS line
 WHERE line LIKE 'Vector side%';
SELECT pg_sleep(1);
SELECT to_regclass('rag.' || :'hybrid_index') IS NULL AS still_missing;
SELECT rag_reindex('hybrid') > 0 AS requeued;
SELECT rag_wait('hybrid', '60 seconds') AS ready;
SELECT pg_temp.rebuilt_index('hybrid') <> 'not rebuilt' AS rebuilt,
       (SELECT index_name = ANY (rag._hnsw_index_names(c.id, c.vector_column)) FROM rag.collections c WHERE name = 'hybrid') AS named_as_before;
SELECT array_agg(document_id || '/' || ordinal ORDER BY distance, document_id, ordinal)::text = :'with_index'
       AS same_with_index_rebuilt
  FROM rag_query('hybrid', 'disk full', 3, max_distance => 2, mode => 'vector');
SELECT rag_drop_collection('hybrid');
DROP ROLE hybrid_reader;
-- The worker drops the partition of a dropped collection (rag_drop_collection marks it).
DO $$
BEGIN
    FOR i IN 1..600 LOOP
        EXIT WHEN cardinality(rag._partitions_to_drop()) = 0;
        PERFORM pg_sleep(0.05);
    END LOOP;
END $$;
SELECT count(*) AS indexes_left FROM pg_indexes WHERE schemaname = 'rag' AND indexname ~ '^chunks_(tsv|embedding)_c'
   AND indexname NOT IN (SELECT index_name FROM rag.collections WHERE index_name IS NOT NULL
                         UNION ALL SELECT rag._keyword_index_name(id) FROM rag.collections);
