-- Ingest stores the document and queues it; the worker does the rest. Inside one transaction nothing can
-- have been embedded yet: ingest makes no provider call.
BEGIN;
SELECT rag_ingest('docs', 'Employee Handbook 2026',
  E'Notice period. All staff must give thirty days notice before resigning from their post.\n\n'
  'Managers may agree a shorter notice period in writing with the employee.\n\n'
  'Annual leave. Staff receive twenty five days of paid annual leave each calendar year.',
  '{"department": "hr"}') AS handbook \gset
SELECT status, chunks_total, chunks_embedded, embed_calls FROM rag.documents WHERE id = :handbook;
SELECT count(*) AS queued FROM rag.queue WHERE document_id = :handbook;
COMMIT;

SELECT rag_ingest('docs', 'Canteen menu',
  'The canteen serves lunch from noon until two. Vegetarian and vegan dishes are available every day.') AS canteen \gset
SELECT rag_ingest('docs', 'Parking', 'Parking permits for the staff car park are issued by reception.') AS parking \gset

SELECT rag_wait('docs', '30 seconds') AS all_done;
SELECT rag_wait('docs', NULL);
-- The same wait as a procedure, which commits between its checks (e2e test_snapshots shows the horizon moving
-- on), and first of all what its caller wrote before it; where it may not commit (a transaction block, a
-- function) it waits as rag_wait does.
CALL rag_await('docs', '30 seconds');
CALL rag_await('docs', NULL);
CALL rag_await('no such collection');
BEGIN ISOLATION LEVEL REPEATABLE READ;
CALL rag_await('docs', '0');
ROLLBACK;
-- With something still processing: a provider that takes five seconds an embedding.
SELECT rag_create_collection('slow', embedding_model => 'hash-384@slow5000') > 0 AS created;
SELECT rag_ingest('slow', 'Slow', 'Embedded in five seconds.') > 0 AS queued;
CREATE TEMP TABLE written_before_the_wait (n int);
CREATE FUNCTION pg_temp.wait_then_fail(p_fail boolean) RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    v_ready boolean;
BEGIN
    INSERT INTO written_before_the_wait VALUES (1);
    CALL rag_await('slow', '0.2 seconds', v_ready);
    IF p_fail THEN
        RAISE EXCEPTION 'the function fails after a wait';
    END IF;
    RETURN v_ready;
END $$;
SELECT pg_temp.wait_then_fail(false) AS ready_within_a_function;
\set VERBOSITY terse
SELECT pg_temp.wait_then_fail(true);
\set VERBOSITY default
BEGIN;
CALL rag_await('slow', '0.2 seconds');
ROLLBACK;
DO $$
DECLARE
    v_ready boolean;
BEGIN
    INSERT INTO written_before_the_wait VALUES (2);
    CALL rag_await('slow', '0.2 seconds', v_ready);
    RAISE EXCEPTION 'the DO block fails after a wait';
END $$;
-- 1 from the function that returned, 2 committed by rag_await before the DO block failed; none from the
-- function that failed.
SELECT n AS written FROM written_before_the_wait ORDER BY n;
CALL rag_await('slow', '60 seconds');
SELECT rag_drop_collection('slow');
SELECT title, status, failure_reason, chunks_total = chunks_embedded AS complete, embed_calls, metadata
  FROM rag.documents WHERE collection_id = (SELECT id FROM rag.collections WHERE name = 'docs') ORDER BY id;

-- The same text again returns the same document and costs nothing.
SELECT rag_ingest('docs', 'A different title', 'The canteen serves lunch from noon until two. Vegetarian and vegan dishes are available every day.') = :canteen AS deduplicated;
SELECT count(*) AS documents, sum(embed_calls) AS provider_calls FROM rag.documents WHERE collection_id = (SELECT id FROM rag.collections WHERE name = 'docs');

-- Pages: each chunk knows the page it starts on.
SELECT rag_create_collection('paged', embedding_model => 'hash-384', chunk_size => 100, chunk_overlap => 0) > 0 AS created;
SELECT rag_ingest('paged', 'Report', NULL, pages => ARRAY[
  'Page one talks about the budget for the coming year and its risks.',
  'Page two describes the hiring plan for engineers and designers.',
  'Page three lists the office locations in Berlin, Lisbon and Oslo.']) AS report \gset
SELECT rag_wait('paged', '30 seconds') AS done;
SELECT ordinal, page, left(content, 20) AS starts_with FROM rag.chunks WHERE document_id = :report ORDER BY ordinal;

-- Bad input is refused with a clear error, and nothing is written.
SELECT count(*) AS documents_before FROM rag.documents \gset
SELECT rag_ingest('docs', 'Empty', '');
SELECT rag_ingest('docs', 'Blank', E'  \n\t ');
SELECT rag_ingest('docs', 'Null', NULL);
-- Any whitespace is blank, as the chunker sees it: no-break, ideographic and line-separator spaces too.
SELECT rag_ingest('docs', 'Unicode blank', E'\u00a0\u3000\u2028 \u2003');
SELECT rag._has_text(E'\u00a0\u3000'), rag._has_text(E' \u00a0x'), rag._has_text(''), rag._has_text(NULL);
SELECT rag_ingest('nope', 'Unknown collection', 'text');
SELECT rag_ingest('docs', 'NUL byte', E'abc\000def');
SELECT rag_ingest('docs', 'Bad metadata', 'text', '[1, 2]');
SELECT rag_ingest('docs', 'Both', 'body', pages => ARRAY['page']);
SET rag.max_document_size = '1kB';
SELECT rag_ingest('docs', 'Too big', repeat('x', 2000));
RESET rag.max_document_size;
SELECT count(*) - :documents_before AS documents_written FROM rag.documents;
SELECT count(*) AS orphan_chunks FROM rag.chunks ch WHERE NOT EXISTS (SELECT 1 FROM rag.documents d WHERE d.id = ch.document_id);

-- A rolled-back ingest leaves nothing behind.
BEGIN;
SELECT rag_ingest('docs', 'Rolled back', 'This text is never committed.') > 0 AS ingested;
ROLLBACK;
SELECT count(*) AS rolled_back_rows FROM rag.documents WHERE title = 'Rolled back';

-- Deleting a document removes its chunks and queue row in one transaction.
SELECT rag_delete_document(:parking) AS deleted, rag_delete_document(:parking) AS deleted_again;
SELECT count(*) AS parking_chunks FROM rag.chunks WHERE document_id = :parking;
-- However documents are deleted, their chunks go with them, in each collection's partition (rag.chunks has no
-- foreign key: rag._documents_deleted), and only theirs: one statement over two collections.
BEGIN;
SELECT rag_create_collection('cascade_a', embedding_model => 'hash-384') AS cascade_a,
       rag_create_collection('cascade_b', embedding_model => 'hash-384') AS cascade_b \gset
INSERT INTO rag.documents (collection_id, title, body, content_sha256, status)
SELECT c, t, 'body', decode(md5(t), 'hex'), 'ready'
  FROM (VALUES (:cascade_a, 'a1'), (:cascade_a, 'a2'), (:cascade_b, 'b1'), (:cascade_b, 'b2')) v(c, t);
INSERT INTO rag.chunks (document_id, collection_id, ordinal, content, token_estimate, char_start, char_end)
SELECT d.id, d.collection_id, g, d.title || ' part ' || g, 1, 0, 1
  FROM rag.documents d, generate_series(0, 2) g WHERE d.title IN ('a1', 'a2', 'b1', 'b2');
DELETE FROM rag.documents WHERE title IN ('a1', 'b1');
SELECT ch.content FROM rag.chunks ch WHERE ch.collection_id IN (:cascade_a, :cascade_b) ORDER BY 1;
ROLLBACK;

-- A bulk load starts at 200 documents waiting for a collection without an HNSW index or with fewer than 200 ready
-- documents (inside one transaction, so the worker sees none of it): its vectors are then stored without the index.
SELECT rag._limit('bulk_load_documents') AS bulk_load_documents;
BEGIN;
SELECT rag_create_collection('bulkcheck', embedding_model => 'hash-384') > 0 AS created;
SELECT count(rag_ingest('bulkcheck', 'Doc ' || g, 'Bulk document number ' || g)) AS queued FROM generate_series(1, 199) g;
SELECT rag._bulk_loading(id) AS bulk_at_199 FROM rag.collections WHERE name = 'bulkcheck';
SELECT rag_ingest('bulkcheck', 'Doc 200', 'Bulk document number 200') > 0 AS queued_200th;
SELECT rag._bulk_loading(id) AS bulk_at_200 FROM rag.collections WHERE name = 'bulkcheck';
-- The end of a load builds nothing while it is still a bulk load, and nothing for a collection without vectors.
SELECT rag._fit_index_to_load(id) AS fit_index_to_load FROM rag.collections WHERE name = 'bulkcheck';
SELECT index_name IS NULL AS still_no_index FROM rag.collections WHERE name = 'bulkcheck';
-- A load under way (no index, at least 200 documents ready or waiting) stays in bulk while any of its documents
-- is due (rag._limit('bulk_load_tail_documents')), not until fewer than 200 wait: its last documents are stored
-- without the index's per-row upkeep too, and do not wait for its build. A document in a retry's back-off does
-- not count: a few stuck ones do not keep the collection without its index.
SELECT rag._limit('bulk_load_tail_documents') AS bulk_load_tail_documents;
SELECT count(rag_ingest('bulkcheck', 'More ' || g, 'More bulk document number ' || g)) AS queued_more
  FROM generate_series(1, 2) g;
WITH done AS (
    UPDATE rag.documents d SET status = 'ready' FROM rag.collections c
     WHERE c.id = d.collection_id AND c.name = 'bulkcheck' AND d.title ~ '^Doc \d\d?$' RETURNING d.id)
DELETE FROM rag.queue q USING done WHERE q.document_id = done.id;
SELECT rag._bulk_loading(id) AS bulk_with_99_ready_103_due FROM rag.collections WHERE name = 'bulkcheck';
WITH done AS (
    UPDATE rag.documents d SET status = 'ready' FROM rag.collections c
     WHERE c.id = d.collection_id AND c.name = 'bulkcheck' AND d.title LIKE 'Doc %' RETURNING d.id)
DELETE FROM rag.queue q USING done WHERE q.document_id = done.id;
SELECT rag._bulk_loading(id) AS bulk_with_200_ready_2_due FROM rag.collections WHERE name = 'bulkcheck';
DELETE FROM rag.queue q USING rag.documents d WHERE d.id = q.document_id AND d.title = 'More 2';
SELECT rag._bulk_loading(id) AS bulk_with_200_ready_1_due FROM rag.collections WHERE name = 'bulkcheck';
-- Its index is not repaired meanwhile by a busy worker; an idle one (nothing it may claim: an open breaker holds
-- the last document back) builds it, unless a worker has that document in hand. Vectors set the dimension.
UPDATE rag.collections SET dimensions = 384 WHERE name = 'bulkcheck';
INSERT INTO rag.chunks (document_id, collection_id, ordinal, content, token_estimate, char_start, char_end)
SELECT d.id, d.collection_id, 0, d.body, 4, 0, char_length(d.body) FROM rag.documents d
  JOIN rag.collections c ON c.id = d.collection_id WHERE c.name = 'bulkcheck' AND d.title = 'Doc 1';
SELECT id = ANY (rag._collections_missing_indexes(false)) AS repaired_while_busy,
       id = ANY (rag._collections_missing_indexes(true)) AS repaired_when_idle
  FROM rag.collections WHERE name = 'bulkcheck';
UPDATE rag.queue q SET claimed_by = pg_backend_pid() FROM rag.documents d WHERE d.id = q.document_id AND d.title = 'More 1';
SELECT id = ANY (rag._collections_missing_indexes(true)) AS repaired_when_idle_while_claimed
  FROM rag.collections WHERE name = 'bulkcheck';
UPDATE rag.queue q SET claimed_by = NULL FROM rag.documents d WHERE d.id = q.document_id AND d.title = 'More 1';
UPDATE rag.queue q SET not_before = now() + interval '1 minute', attempts = 1
  FROM rag.documents d WHERE d.id = q.document_id AND d.title = 'More 1';
SELECT rag._bulk_loading(id) AS bulk_with_200_ready_1_backing_off FROM rag.collections WHERE name = 'bulkcheck';
-- Such a collection's index is not built in the store's transaction (rag._fit_index_to_load leaves it to the
-- worker's next transaction, rag._build_index_after_load).
SELECT rag._fit_index_to_load(id) AS fit_index_to_load_at_the_end FROM rag.collections WHERE name = 'bulkcheck';
SELECT index_name IS NULL AS not_built_with_the_batch FROM rag.collections WHERE name = 'bulkcheck';
SELECT rag._build_index_after_load(id) AS built_after_the_load FROM rag.collections WHERE name = 'bulkcheck';
SELECT index_name = 'chunks_embedding_c' || id AS index_named, to_regclass('rag.' || index_name) IS NOT NULL AS index_exists
  FROM rag.collections WHERE name = 'bulkcheck';
SELECT rag._build_index_after_load(id) AS built_again FROM rag.collections WHERE name = 'bulkcheck';
ROLLBACK;

-- Small new documents claimed together (rag._claim_more): oldest first, and with a budget (what the worker's
-- provider embeds in about a second) no more text in the whole group than that, its first document included.
-- Inside one transaction, so the worker sees none of it; bodies of 100, 200, 300, 400 and 500 bytes.
BEGIN;
SELECT rag_create_collection('claimcheck', embedding_model => 'hash-384') > 0 AS created;
SELECT count(rag_ingest('claimcheck', 'Doc ' || g, rpad('Document ' || g || ' ', 100 * g, 'x'))) AS queued
  FROM generate_series(1, 5) g;
CREATE FUNCTION pg_temp.claimed(p_budget integer, p_limit integer DEFAULT 31, p_max_bytes integer DEFAULT 16384)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    v_titles text;
BEGIN
    -- Each call looks at the claims as they were before it: they are handed back afterwards.
    SELECT coalesce(string_agg(d.title, ', ' ORDER BY d.title), '-') INTO v_titles
      FROM rag._claim_more(pg_backend_pid(),
                           (SELECT q.id FROM rag.queue q JOIN rag.documents d ON d.id = q.document_id
                              JOIN rag.collections c ON c.id = d.collection_id
                             WHERE c.name = 'claimcheck' AND d.title = 'Doc 1'),
                           p_limit, p_max_bytes, p_budget) c
      JOIN rag.documents d ON d.id = c.document_id;
    UPDATE rag.queue q SET claimed_by = NULL, claimed_at = NULL, unfinished_claims = 0
      FROM rag.collections c WHERE c.id = q.collection_id AND c.name = 'claimcheck';
    RETURN v_titles;
END $$;
SELECT pg_temp.claimed(NULL) AS no_budget,
       pg_temp.claimed(600) AS within_600_bytes,
       pg_temp.claimed(599) AS within_599_bytes,
       pg_temp.claimed(100) AS only_the_first,
       pg_temp.claimed(NULL, 2) AS two_at_most,
       pg_temp.claimed(NULL, 31, 350) AS none_over_350_bytes;
ROLLBACK;

-- The small new documents of one provider call are stored in one statement (rag._store_documents): their chunks
-- with their vectors (chunk i's are the i-th run of p_dimensions numbers), the documents ready and off the queue.
-- A document chunked by another path meanwhile, or deleted, is left to the regular path (stored false); all are
-- when the collection's model changed since the call; numbers that do not make one whole vector per chunk refuse
-- every document. Inside one transaction, so the worker sees none of it.
BEGIN;
SELECT rag_create_collection('storecheck', embedding_model => 'hash-384') > 0 AS created;
SELECT count(rag_ingest('storecheck', 'Doc ' || g, 'Stored document number ' || g)) AS queued FROM generate_series(1, 4) g;
CREATE TEMP TABLE storecheck AS
SELECT d.title, d.id AS document_id, q.id AS queue_id
  FROM rag.documents d JOIN rag.queue q ON q.document_id = d.id JOIN rag.collections c ON c.id = d.collection_id
 WHERE c.name = 'storecheck';
-- Doc 1 has two chunks, the others one each; chunk n's vector is [n, 1, 0].
CREATE FUNCTION pg_temp.store(p_model text, p_vectors real[] DEFAULT NULL, p_provider text DEFAULT 'ollama')
RETURNS TABLE (title text, stored boolean, refusal text) LANGUAGE sql AS $$
    WITH chunks AS (
        SELECT s.document_id, g - 1 AS ordinal, s.title || ', part ' || g AS content,
               row_number() OVER (ORDER BY s.title, g) AS n
          FROM storecheck s, generate_series(1, CASE s.title WHEN 'Doc 1' THEN 2 ELSE 1 END) g)
    SELECT s.title, r.stored, r.refusal
      FROM rag._store_documents(
               (SELECT array_agg(queue_id ORDER BY title) FROM storecheck),
               (SELECT array_agg(document_id ORDER BY title) FROM storecheck),
               (SELECT array_agg(7::bigint) FROM storecheck),
               (SELECT array_agg(document_id ORDER BY n) FROM chunks),
               (SELECT array_agg(ordinal ORDER BY n) FROM chunks),
               (SELECT array_agg(content ORDER BY n) FROM chunks),
               (SELECT array_agg(0 ORDER BY n) FROM chunks),
               (SELECT array_agg(char_length(content) ORDER BY n) FROM chunks),
               (SELECT array_agg(3 ORDER BY n) FROM chunks),
               (SELECT array_agg(NULL::integer ORDER BY n) FROM chunks),
               coalesce(p_vectors, (SELECT array_agg(x.v ORDER BY c.n, x.k)
                                      FROM chunks c, LATERAL (VALUES (1, c.n::real), (2, 1::real), (3, 0::real)) x(k, v))),
               3, p_model, p_provider) r
      JOIN storecheck s ON s.document_id = r.document_id
     ORDER BY s.title
$$;
-- Doc 3 chunked by another path meanwhile, Doc 4 deleted.
INSERT INTO rag.chunks (document_id, collection_id, ordinal, content, token_estimate, char_start, char_end)
SELECT d.id, d.collection_id, 0, d.body, 4, 0, char_length(d.body) FROM rag.documents d
  JOIN storecheck s ON s.document_id = d.id WHERE s.title = 'Doc 3';
SELECT rag_delete_document(document_id) AS deleted FROM storecheck WHERE title = 'Doc 4';
SELECT * FROM pg_temp.store('another-model');
-- The same model's name from another provider (another server's weights, perhaps): not stored either.
SELECT * FROM pg_temp.store('hash-384', NULL, 'local');
SELECT * FROM pg_temp.store('hash-384', '{1, 2}');
SELECT dimensions IS NULL AS no_dimension_yet FROM rag.collections WHERE name = 'storecheck';
SELECT * FROM pg_temp.store('hash-384');
SELECT s.title, ch.ordinal, ch.content, ch.embedding::text, ch.tsv IS NOT NULL AS has_lexemes
  FROM rag.chunks ch JOIN storecheck s ON s.document_id = ch.document_id ORDER BY s.title, ch.ordinal;
SELECT s.title, d.status, d.chunks_total, d.chunks_embedded, d.embed_calls, d.embed_tokens,
       EXISTS (SELECT 1 FROM rag.queue q WHERE q.id = s.queue_id) AS still_queued
  FROM storecheck s JOIN rag.documents d ON d.id = s.document_id ORDER BY s.title;
SELECT dimensions FROM rag.collections WHERE name = 'storecheck';
-- A chunk's row stays whole in the heap up to a page: a 384-d vector with a 1,000-character chunk and its
-- lexemes writes nothing to the TOAST table (with the default target every such vector went there). The
-- setting is each collection's partition's.
SELECT format('rag.%I', rag._chunk_partition(id)) AS partition FROM rag.collections WHERE name = 'storecheck' \gset
SELECT reloptions FROM pg_class WHERE oid = :'partition'::regclass;
SELECT pg_relation_size(reltoastrelid) AS toast_bytes_before FROM pg_class WHERE oid = :'partition'::regclass \gset
INSERT INTO rag.chunks (document_id, collection_id, ordinal, content, token_estimate, char_start, char_end, tsv,
                        embedding)
SELECT s.document_id, c.id, 9, t.text, 250, 0, 1000, to_tsvector('english', t.text),
       (SELECT array_agg(sin(g)::real) FROM generate_series(1, 384) g)::vector
  FROM storecheck s, rag.collections c,
       LATERAL (SELECT string_agg(md5(g::text), ' ') AS text FROM generate_series(1, 30) g) t
 WHERE s.title = 'Doc 2' AND c.name = 'storecheck';
SELECT pg_relation_size(reltoastrelid) = :toast_bytes_before AS nothing_toasted,
       (SELECT pg_column_size(ch.*) > 3000 FROM rag.chunks ch WHERE ch.ordinal = 9
           AND ch.document_id = (SELECT document_id FROM storecheck WHERE title = 'Doc 2')) AS row_over_the_default_target
  FROM pg_class WHERE oid = :'partition'::regclass;
ROLLBACK;

-- rag._seconds_until_due, which an idle worker sleeps by: NULL with nothing queued (it then naps for
-- rag.naptime; a 0 here made every idle worker wake every 10 ms), else the seconds until the first queued
-- document is due, never below 0.
BEGIN;
DELETE FROM rag.queue;
SELECT rag._seconds_until_due() IS NULL AS nothing_queued;
INSERT INTO rag.queue (document_id, collection_id, not_before)
SELECT d.id, d.collection_id, now() + interval '1 hour' FROM rag.documents d ORDER BY d.id LIMIT 1;
SELECT round(rag._seconds_until_due()) AS seconds_until_due;
UPDATE rag.queue SET not_before = now() - interval '1 minute';
SELECT rag._seconds_until_due() AS overdue;
-- A watched row waiting out rag.sync_delay counts too (the worker slept its naptime past it), one waiting for
-- its next write (infinity) does not.
DELETE FROM rag.queue;
INSERT INTO rag.watches (source, source_name, collection_id, key_columns, content_expr)
SELECT 'pg_class'::regclass, 'pg_class', id, '{oid}', 'relname' FROM rag.collections ORDER BY id LIMIT 1;
INSERT INTO rag.row_queue (watch_id, key, not_before)
SELECT max(id), '{"oid": 1}', 'infinity' FROM rag.watches;
SELECT rag._seconds_until_due() IS NULL AS only_a_row_waiting_for_its_next_write;
INSERT INTO rag.row_queue (watch_id, key, not_before)
SELECT max(id), '{"oid": 2}', now() + interval '30 minutes' FROM rag.watches;
SELECT round(rag._seconds_until_due()) AS seconds_until_the_row_is_due;
ROLLBACK;

-- Title, source and metadata come back with every search result and answer: a writer may not make them huge
-- (a 200 MB title made every reader's rag_ask take 2 GB). Converted markup is measured as the text it gives.
\set VERBOSITY terse
SELECT rag_ingest('docs', repeat('T', 4097), 'A body.');
SELECT rag_ingest('docs', 'Title', 'A body.', source => repeat('s', 4097));
SELECT rag_ingest('docs', 'Title', 'A body.', metadata => jsonb_build_object('k', repeat('m', 70000)));
BEGIN;
SET LOCAL rag.max_document_size = '1kB';
SELECT rag_ingest('docs', 'Title', repeat('# heading' || E'\n', 200), format => 'markdown');
ROLLBACK;
\set VERBOSITY default
SELECT rag_ingest('docs', repeat('T', 4096), 'A body at the title''s limit.', source => repeat('s', 4096)) > 0 AS at_the_limits;
SELECT rag_delete_document(id) FROM rag.documents WHERE body = 'A body at the title''s limit.';

-- A queue item's claim is held by a live process connected to this database: not by any process of the cluster
-- with that pid (an item restored into another database while its worker in the first one ran was never taken).
SELECT rag._claim_held(pg_backend_pid()) AS this_backend_holds,
       rag._claim_held((SELECT pid FROM pg_stat_activity WHERE backend_type = 'checkpointer')) AS checkpointer_holds,
       rag._claim_held(2147483647) AS no_such_process_holds;

-- A session that began while rag.documents was small, after a VACUUM had counted its rows, planned the foreign
-- key check of each queued document as a sequential scan and kept that plan for as long as the session lasted:
-- a load in one transaction read the whole table again for every document. Once rag's tables have doubled,
-- the session plans again (src/plans.rs), and the check goes by the key.
VACUUM (ANALYZE) rag.documents, rag.queue;
\c
BEGIN;
SELECT count(rag_ingest('docs', 'Load ' || i, i || repeat(' A sentence of a document that fills its page.', 30)))
  FROM generate_series(1, 400) i;
SELECT seq_scan < 200 AS documents_scanned_for_few_checks
  FROM pg_stat_xact_user_tables WHERE relid = 'rag.documents'::regclass;
ROLLBACK;

-- A claim starts at the place where this process last claimed in the collection, not at the queue's front
-- (whose finished items a long snapshot keeps as index entries to walk past), and from the front again when
-- nothing is due from that place on (rag._claim_next).
BEGIN;
CREATE TEMP TABLE placed_documents AS
SELECT rag_ingest('docs', 'Placed ' || i, 'The text of placed document ' || i) AS id FROM generate_series(1, 3) i;
CREATE TEMP TABLE placed AS
SELECT q.id, q.not_before, q.collection_id, row_number() OVER (ORDER BY q.not_before, q.id) AS n
  FROM rag.queue q WHERE q.document_id IN (SELECT id FROM placed_documents);
SELECT p.n AS claimed_from_the_second
  FROM placed second, rag._claim_next(pg_backend_pid(), '{}', '{}', ARRAY[second.collection_id],
                                      ARRAY[second.not_before], ARRAY[second.id]) c
  JOIN placed p ON p.id = c.queue_id
 WHERE second.n = 2;
SELECT count(*) AS claimed_from_the_front
  FROM placed last_one, rag._claim_next(pg_backend_pid(), '{}', '{}', ARRAY[last_one.collection_id],
                                        ARRAY['infinity'::timestamptz], ARRAY[9223372036854775807::bigint]) c
 WHERE last_one.n = 3;
ROLLBACK;

-- Statistics that say the queue has pages but no rows (a VACUUM or ANALYZE that found it empty while a snapshot
-- still saw its deleted rows; here a VACUUM told not to truncate) make the planner count one row at any size.
-- rag._claim_more's update then ran its locking query once per queue row, as a join (a load 8 times slower):
-- it locks its items into an array first.
BEGIN;
SELECT count(rag_ingest('docs', 'Emptied ' || i, 'The text of emptied document ' || i)) FROM generate_series(1, 300) i;
ROLLBACK;
VACUUM (TRUNCATE false, ANALYZE) rag.queue;
SELECT relpages > 0 AND reltuples = 0 AS queue_says_pages_without_rows FROM pg_class WHERE oid = 'rag.queue'::regclass;
\c
BEGIN;
CREATE TEMP TABLE claimable AS
SELECT rag_ingest('docs', 'Claimable ' || i, 'The text of claimable document ' || i) AS id FROM generate_series(1, 300) i;
SELECT count(*) AS claimed_with_companions
  FROM (SELECT q.id FROM rag.queue q JOIN claimable c ON c.id = q.document_id ORDER BY q.not_before, q.id LIMIT 1) first_one,
       rag._claim_more(pg_backend_pid(), first_one.id, 31, 100000) more;
SELECT seq_scan < 10 AS queue_scanned_a_few_times
  FROM pg_stat_xact_user_tables WHERE relid = 'rag.queue'::regclass;
ROLLBACK;
