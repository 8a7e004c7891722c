-- What a restore of a partial dump leaves, and how rag takes it up once the restore is over.
--
-- A dump without the chunks (pg_dump --exclude-table-data 'rag.chunks_c*'): documents that say they were chunked
-- and have no chunk. The worker queues them again (rag._requeue_missing_chunks) by document, so a collection
-- whose other documents were chunked again meanwhile is mended too. Simulated here by deleting one document's
-- chunks, which only rag's owner can do.
SELECT rag_create_collection('leftovers', embedding_model => 'hash-384', max_distance => 2) > 0 AS created;
SELECT rag_ingest('leftovers', 'Notice', 'Staff give thirty days notice in writing.') > 0 AS one,
       rag_ingest('leftovers', 'Lunch', 'Lunch is served from noon until two.') > 0 AS two;
SELECT rag_wait('leftovers', '60 seconds') AS ready;
SELECT EXISTS (SELECT 1 FROM rag._documents_missing_chunks()) AS missing_before;
DELETE FROM rag.chunks ch USING rag.documents d, rag.collections c
 WHERE d.id = ch.document_id AND c.id = d.collection_id AND c.name = 'leftovers' AND d.title = 'Notice';
-- The look passes over a partition whose statistics count as many chunks as its documents do: the delete is
-- counted once this session's statistics reach the server, after this statement.
SELECT pg_stat_force_next_flush();
SELECT d.title, d.status, d.chunks_total FROM rag.documents d JOIN rag.collections c ON c.id = d.collection_id
 WHERE c.name = 'leftovers' ORDER BY d.title;
SELECT count(*) AS found_before FROM rag_query('leftovers', 'thirty days notice') WHERE title = 'Notice';
-- Not while the partition lacks an index it is made with: a restore's post-data section makes them after the
-- keys, and writing into the partition (or dropping and building its HNSW index for a bulk load) before the
-- restore's CREATE INDEX fails the restore.
SELECT format('DROP INDEX rag.%I', rag._keyword_index_name(id)) AS unindex FROM rag.collections WHERE name = 'leftovers' \gset
:unindex;
SELECT EXISTS (SELECT 1 FROM rag._documents_missing_chunks()) AS missing_while_indexes_are_made;
SELECT rag._ensure_keyword_index(id) IS NOT NULL AS reindexed FROM rag.collections WHERE name = 'leftovers';
SELECT EXISTS (SELECT 1 FROM rag._documents_missing_chunks()) AS missing_once_indexed;
-- In one transaction, so that the worker takes the document only once it has been looked at.
BEGIN;
-- Asked about another collection only, it finds nothing to do.
SELECT rag._requeue_missing_chunks(ARRAY[0]) AS queued_elsewhere;
SELECT rag._requeue_missing_chunks(ARRAY[(SELECT id FROM rag.collections WHERE name = 'leftovers')]) AS queued;
SELECT d.title, d.status, d.chunks_total FROM rag.documents d JOIN rag.collections c ON c.id = d.collection_id
 WHERE c.name = 'leftovers' ORDER BY d.title;
-- A second look (another worker's) finds nothing left to queue.
SELECT rag._requeue_missing_chunks() AS queued_again;
COMMIT;
SELECT rag_wait('leftovers', '60 seconds') AS ready_again;
SELECT count(*) AS found_after FROM rag_query('leftovers', 'thirty days notice') WHERE title = 'Notice';
SELECT EXISTS (SELECT 1 FROM rag._documents_missing_chunks()) AS missing_after;
-- A failed document is left to its failure: queued again it would be retried (an abandoned one could stop a
-- worker again, a paid provider be called again).
UPDATE rag.documents d SET status = 'failed', failure_reason = 'given up'
  FROM rag.collections c WHERE c.id = d.collection_id AND c.name = 'leftovers' AND d.title = 'Lunch';
DELETE FROM rag.chunks ch USING rag.documents d, rag.collections c
 WHERE d.id = ch.document_id AND c.id = d.collection_id AND c.name = 'leftovers' AND d.title = 'Lunch';
SELECT pg_stat_force_next_flush();
SELECT rag._requeue_missing_chunks() AS failed_queued;
-- None of it is anyone's but rag's.
SET ROLE rag_admin;
SELECT rag._requeue_missing_chunks();
RESET ROLE;
SELECT rag_drop_collection('leftovers') AS dropped;

-- A dump without rag's rows (pg_dump --exclude-table-data 'rag.*'): the collections' partitions come back
-- without their collections, and the ids' sequence starts again. Simulated by taking a collection's row away
-- behind its partition's back and turning the sequence back to before it.
SELECT rag_create_collection('orphaned', embedding_model => 'hash-384') AS orphan_id \gset
DELETE FROM rag.collections WHERE id = :orphan_id;
SELECT setval('rag.collections_id_seq', :orphan_id - 1) > 0 AS turned_back;
-- The restore is over (the partition has its primary key): the new collection passes over the id.
SELECT rag_create_collection('after-the-restore', embedding_model => 'hash-384') - :orphan_id AS ids_past_the_orphan;
SELECT rag_drop_collection('after-the-restore') AS dropped;
-- Still in a restore (a partition without its primary key): refused as before, nothing made.
SELECT setval('rag.collections_id_seq', :orphan_id - 1) > 0 AS turned_back;
SELECT format('ALTER TABLE rag.%I DROP CONSTRAINT %I', 'chunks_c' || :orphan_id, 'chunks_c' || :orphan_id || '_pkey') AS unkey \gset
:unkey;
DO $$ BEGIN
    PERFORM rag_create_collection('during-the-restore', embedding_model => 'hash-384');
EXCEPTION WHEN object_in_use THEN
    RAISE NOTICE 'refused: %', regexp_replace(SQLERRM, '[0-9]+', 'N', 'g');
END $$;
SELECT count(*) AS made FROM rag.collections WHERE name = 'during-the-restore';
SELECT format('DROP TABLE rag.%I', 'chunks_c' || :orphan_id) AS tidy \gset
:tidy;

-- A data-only restore replayed with psql, after a schema-only one: the keys are there and nobody named
-- pg_restore is connected, and its rows come before their sequences' values, the one sign it gives. The
-- worker would otherwise claim a restored queue row and give the new rows ids the restore's rows have.
-- Simulated by turning a sequence back to the largest id of its table, then setting it as a dump does; the
-- tables are locked meanwhile, so that no worker takes an id from a sequence turned back.
SELECT rag_create_collection('replayed', embedding_model => 'hash-384') AS replayed_id \gset
CREATE TABLE replayed_rows (id integer PRIMARY KEY, body text);
SELECT rag_watch('replayed_rows', 'replayed', content => 'body') > 0 AS watched;
-- A watched row written just before the dump, its key waiting out a sync delay.
SET rag.sync_delay = '1h';
INSERT INTO replayed_rows VALUES (1, 'A row written just before the dump was taken.');
RESET rag.sync_delay;
-- Its key reaches rag.row_queue once the worker has spread the statement's batch.
DO $$ BEGIN
    FOR i IN 1 .. 300 LOOP
        EXIT WHEN NOT EXISTS (SELECT 1 FROM rag.row_batches);
        PERFORM pg_sleep(0.1);
    END LOOP;
END $$;
SELECT count(*) AS keys_waiting FROM rag.row_queue r JOIN rag.watches w ON w.id = r.watch_id
 WHERE w.collection_id = :replayed_id;
BEGIN;
LOCK TABLE rag.documents, rag.queue, rag.row_queue, rag.row_batches IN EXCLUSIVE MODE;
SELECT rag._restore_under_way() AS under_way_before;
SELECT last_value AS documents_last, is_called AS documents_called FROM rag.documents_id_seq \gset
SELECT last_value AS row_queue_last, is_called AS row_queue_called FROM rag.row_queue_id_seq \gset
-- The next id would be one a row has: under way.
SELECT setval('rag.documents_id_seq', (SELECT max(id) FROM rag.documents), false) > 0 AS turned_back;
SELECT rag._restore_under_way() AS documents_past_their_sequence;
SELECT worker_waiting_for LIKE 'a restore of this database is not finished%' AS status_says_so
  FROM rag.status WHERE collection = 'replayed';
-- The sequence at the largest id, given: over.
SELECT setval('rag.documents_id_seq', (SELECT max(id) FROM rag.documents), true) > 0 AS set_as_a_dump_sets_it;
SELECT rag._restore_under_way() AS documents_in_step;
-- A key queued past its sequence, while the documents' sequence has given ids: the documents' rows come first
-- in a restore, so the queues are not looked at.
SELECT setval('rag.row_queue_id_seq', (SELECT max(id) FROM rag.row_queue), false) > 0 AS turned_back;
SELECT rag._restore_under_way() AS keys_past_their_sequence_beside_documents;
-- The documents' sequence as a database that never made a document has it (the next id past every row): the
-- queued key is the sign.
SELECT setval('rag.documents_id_seq', (SELECT max(id) + 1 FROM rag.documents), false) > 0 AS never_given;
SELECT rag._restore_under_way() AS keys_past_their_sequence_without_documents;
SELECT setval('rag.row_queue_id_seq', (SELECT max(id) FROM rag.row_queue), true) > 0 AS set_as_a_dump_sets_it;
SELECT rag._restore_under_way() AS keys_in_step;
-- A batch of keys past its sequence, in a database that never made a document, likewise.
SELECT last_value AS row_batches_last FROM rag.row_batches_id_seq \gset
INSERT INTO rag.row_batches (id, watch_id, keys) OVERRIDING SYSTEM VALUE
SELECT :row_batches_last + 10, id, '[]' FROM rag.watches WHERE source = 'replayed_rows'::regclass;
SELECT rag._restore_under_way() AS batch_past_its_sequence_without_documents;
DELETE FROM rag.row_batches WHERE id = :row_batches_last + 10;
SELECT rag._restore_under_way() AS batches_in_step;
SELECT setval('rag.row_queue_id_seq', :row_queue_last, :'row_queue_called'::boolean) > 0 AS put_back;
SELECT setval('rag.documents_id_seq', :documents_last, :'documents_called'::boolean) > 0 AS put_back;
SELECT rag._restore_under_way() AS under_way_after;
COMMIT;

-- The same replay without --disable-triggers: the watched tables' rows fire their watches' triggers, and the
-- batches those write and rag.row_batches' own rows take ids of one sequence before the restore sets it.
-- Neither may fail on the other's id (rag._row_batch_free_id), whichever comes first, through each way a
-- trigger writes a batch: a statement's keys gathered (replayed_rows), an UPDATE's row by row (a key of two
-- columns), a partition's queued at the statement's end (at the top level, and inside a trigger). In one
-- transaction, so that no worker spreads a batch in between; the restored rows as a dump writes them (COPY,
-- the batch of a watch that is not there: watch 0).
CREATE TABLE replayed_pairs (a integer, b integer, body text, PRIMARY KEY (a, b));
INSERT INTO replayed_pairs VALUES (1, 1, 'A pair.');
SELECT rag_watch('replayed_pairs', 'replayed', content => 'body') > 0 AS watched;
CREATE TABLE replayed_parted (id integer PRIMARY KEY, body text) PARTITION BY RANGE (id);
CREATE TABLE replayed_part PARTITION OF replayed_parted FOR VALUES FROM (0) TO (100);
SELECT rag_watch('replayed_part', 'replayed', content => 'body') > 0 AS watched;
CREATE TABLE replayed_relay (id integer);
CREATE FUNCTION replayed_relay() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO replayed_part VALUES (NEW.id, 'Relayed by a trigger.');
    RETURN NULL;
END $$;
CREATE TRIGGER replayed_relay AFTER INSERT ON replayed_relay FOR EACH ROW EXECUTE FUNCTION replayed_relay();
SELECT source::text, rag._watch_trigger_mode(w) AS mode FROM rag.watches w
 WHERE source::text LIKE 'replayed%' ORDER BY 1;
BEGIN;
SELECT setval('rag.row_batches_id_seq', 1000000, false) > 0 AS a_fresh_sequence;
-- The triggers first, then the restored rows with the ids they took: those go past every row, not to the
-- sequence, which stays behind them as a restore's sequences do until its end.
INSERT INTO replayed_rows VALUES (2, 'Written while the restore ran.');
COPY rag.row_batches (id, watch_id, keys, not_before) FROM stdin;
1000000	0	[]	2026-01-01 00:00:00+00
1000001	0	[]	2026-01-01 00:00:00+00
\.
SELECT id - 1000000 AS id_past, watch_id = 0 AS restored FROM rag.row_batches WHERE id >= 1000000 ORDER BY id;
SELECT last_value - 1000000 AS sequence_past FROM rag.row_batches_id_seq;
-- The restored rows first, then each kind of trigger, taking the ids they hold.
COPY rag.row_batches (id, watch_id, keys, not_before) FROM stdin;
1000004	0	[]	2026-01-01 00:00:00+00
1000005	0	[]	2026-01-01 00:00:00+00
1000007	0	[]	2026-01-01 00:00:00+00
1000008	0	[]	2026-01-01 00:00:00+00
1000009	0	[]	2026-01-01 00:00:00+00
1000011	0	[]	2026-01-01 00:00:00+00
\.
INSERT INTO replayed_rows VALUES (3, 'Written while the restore ran.');
UPDATE replayed_pairs SET body = 'A pair, changed.';
INSERT INTO replayed_part VALUES (1, 'A partition''s row.');
INSERT INTO replayed_relay VALUES (2);
-- The partition's rows pass over the ids taken, the one queued at the top level (key 1, at depth 0, where
-- rag._row_batch_free_id sees it) as the one a trigger relayed (key 2). The first used to be moved past every
-- row instead, as a restored row is, which put it ahead of the sequence.
SELECT b.id - 1000000 AS id_past, coalesce(w.source::text, 'restored') AS batch_of,
       coalesce(b.keys::text, b.key_values) AS keys
  FROM rag.row_batches b LEFT JOIN rag.watches w ON w.id = b.watch_id
 WHERE b.id >= 1000000 ORDER BY b.id;
ROLLBACK;
-- The trigger is enabled ALWAYS (a replay in a session_replication_role = replica fires the watches' replica
-- triggers), and the ENABLE TRIGGER ALL that ends a data-only pg_restore --disable-triggers puts it back.
SELECT tgenabled FROM pg_trigger WHERE tgname = 'row_batches_free_id';
BEGIN;
ALTER TABLE rag.row_batches DISABLE TRIGGER ALL;
ALTER TABLE rag.row_batches ENABLE TRIGGER ALL;
SELECT tgenabled FROM pg_trigger WHERE tgname = 'row_batches_free_id';
ROLLBACK;

-- A watched table whose owner is not a superuser, replayed as a restore replays it: with row_security off (a
-- dump's scripts and pg_restore set it), under which the queue's policy fails the triggers' inserts instead
-- of applying, and before rag.watches' rows (a table whose schema sorts before rag). The restore stopped there.
CREATE ROLE replay_owner;
CREATE TABLE replayed_owned (id integer PRIMARY KEY, body text);
SELECT rag_watch('replayed_owned', 'replayed', content => 'body') > 0 AS watched;
ALTER TABLE replayed_owned OWNER TO replay_owner;
SELECT id AS owned_watch FROM rag.watches WHERE source = 'replayed_owned'::regclass \gset
BEGIN;
SET LOCAL row_security = off;
INSERT INTO replayed_owned VALUES (1, 'Restored with row_security off.');
-- The session goes on as it was.
SHOW row_security;
-- The watch not there yet: nothing is queued (its documents come with the dump).
DELETE FROM rag.watches WHERE id = :owned_watch;
INSERT INTO replayed_owned VALUES (2, 'Restored before its watch.');
SELECT coalesce(keys::text, key_values) AS keys FROM rag.row_batches WHERE watch_id = :owned_watch ORDER BY id;
-- Outside such a session the policy refuses it as before: the table's owner queues keys only for a watch of
-- theirs.
SET LOCAL row_security = on;
SAVEPOINT outside;
\set VERBOSITY terse
INSERT INTO replayed_owned VALUES (3, 'Written in an ordinary session.');
\set VERBOSITY default
ROLLBACK TO outside;
ROLLBACK;
-- A batch of one key column's values whose watch is gone (triggers a restore brought back without their watch,
-- fired by a superuser's write) is dropped by the worker, as a batch of key objects was; it stayed for good.
INSERT INTO rag.row_batches (watch_id, key_values) VALUES (2147483000, '{1,2}');
-- No trigger wakes the worker: an idle one notices the insert once this session's statistics reach the server.
SELECT pg_stat_force_next_flush();
DO $$ BEGIN
    FOR i IN 1 .. 300 LOOP
        EXIT WHEN NOT EXISTS (SELECT 1 FROM rag.row_batches WHERE watch_id = 2147483000);
        PERFORM pg_sleep(0.1);
    END LOOP;
END $$;
SELECT count(*) AS left_behind FROM rag.row_batches WHERE watch_id = 2147483000;
SELECT rag_unwatch('replayed_owned') AS unwatched;
DROP TABLE replayed_owned;
DROP OWNED BY replay_owner;
DROP ROLE replay_owner;
SELECT rag_unwatch('replayed_rows') AS unwatched, rag_unwatch('replayed_pairs') AS unwatched,
       rag_unwatch('replayed_part') AS unwatched;
DROP TABLE replayed_rows, replayed_pairs, replayed_parted, replayed_relay;
DROP FUNCTION replayed_relay();
SELECT rag_drop_collection('replayed') AS dropped;

-- A dump without rag's rows again: a watched table's triggers come back without their watch, and the ids start
-- again, so another table's new watch may be given the id they name. Simulated by deleting the watch's row
-- behind its triggers' back and turning the sequence back. Both tables' owners are ordinary roles; the new
-- watch's filter notes every row it is evaluated on.
CREATE ROLE leftover_old IN ROLE rag_admin;
CREATE ROLE leftover_new IN ROLE rag_admin;
CREATE TABLE leftover_a (id integer PRIMARY KEY, body text);
CREATE TABLE leftover_b (id integer PRIMARY KEY, body text);
CREATE TABLE leftover_seen (body text);
ALTER TABLE leftover_a OWNER TO leftover_old;
ALTER TABLE leftover_b OWNER TO leftover_new;
ALTER TABLE leftover_seen OWNER TO leftover_new;
CREATE FUNCTION leftover_noted(p_body text) RETURNS boolean LANGUAGE plpgsql AS $f$
BEGIN
    INSERT INTO public.leftover_seen VALUES (p_body);
    RETURN true;
END $f$;
ALTER FUNCTION leftover_noted(text) OWNER TO leftover_new;
SET ROLE leftover_old;
SELECT rag_create_collection('left-old', embedding_model => 'hash-384') > 0 AS created;
SELECT rag_watch('leftover_a', 'left-old', content => 'body', filter => 'body <> ''''') AS old_watch \gset
RESET ROLE;
DELETE FROM rag.watches WHERE id = :old_watch;
SELECT setval('rag.watches_id_seq', :old_watch, false) > 0 AS turned_back;
SET ROLE leftover_new;
SELECT rag_create_collection('left-new', embedding_model => 'hash-384') > 0 AS created;
SELECT rag_watch('leftover_b', 'left-new', content => 'body', filter => 'public.leftover_noted(body)') = :old_watch
       AS given_the_same_id;
RESET ROLE;
-- The old table's triggers run the old functions, set aside and doing nothing; the new watch has its own.
SELECT t.tgrelid::regclass AS on_table, t.tgname,
       regexp_replace(t.tgfoid::regproc::text, '[0-9]+', 'N', 'g') AS runs,
       pg_get_userbyid(p.proowner) AS as_role
  FROM pg_trigger t JOIN pg_proc p ON p.oid = t.tgfoid
 WHERE t.tgrelid IN ('leftover_a'::regclass, 'leftover_b'::regclass) AND p.proname LIKE '\_watch\_%'
 ORDER BY 1, 2;
-- A write to the old table queues nothing for the new watch and runs nothing of its owner's.
SET ROLE leftover_old;
BEGIN;
INSERT INTO leftover_a VALUES (1, 'Written to the old table.');
UPDATE leftover_a SET body = 'Rewritten in the old table.';
DELETE FROM leftover_a;
RESET ROLE;
SELECT count(*) AS batches_of_the_old_table FROM rag.row_batches WHERE watch_id = :old_watch;
COMMIT;
-- Nor once the old table changes hands: its set-aside statement function keeps the old owner and still takes
-- the keys the table's row triggers gather, as the owner of a function of that watch id's that a trigger on the
-- table runs (rag._watch_keys_taken; the owner of the table alone may take them otherwise).
CREATE ROLE leftover_later;
ALTER TABLE leftover_a OWNER TO leftover_later;
SELECT pg_get_userbyid(p.proowner) AS set_aside_owner, pg_get_userbyid(c.relowner) AS table_owner
  FROM pg_trigger t JOIN pg_proc p ON p.oid = t.tgfoid JOIN pg_class c ON c.oid = t.tgrelid
 WHERE t.tgrelid = 'leftover_a'::regclass AND t.tgname = 'rag_watch_insert';
SET ROLE leftover_later;
INSERT INTO leftover_a VALUES (1, 'Written by its later owner.');
DELETE FROM leftover_a;
RESET ROLE;
ALTER TABLE leftover_a OWNER TO leftover_old;
DROP ROLE leftover_later;
-- The new watch's own table is watched as any other.
SET ROLE leftover_new;
BEGIN;
INSERT INTO leftover_b VALUES (1, 'Written to the new table.');
RESET ROLE;
SELECT coalesce(keys::text, key_values) AS batches_of_the_new_table FROM rag.row_batches WHERE watch_id = :old_watch;
COMMIT;
SELECT body AS filtered FROM leftover_seen ORDER BY body;
-- PUBLIC's EXECUTE, which a restore without privileges gives back to every function, is taken away from a
-- set-aside one as well (the worker's upkeep): it runs as the old table's owner.
SELECT p.oid::regprocedure AS set_aside FROM pg_proc p
 WHERE p.pronamespace = 'rag'::regnamespace AND p.proname ~ '^_watch_[0-9]+_left_' \gset
GRANT EXECUTE ON FUNCTION :set_aside TO PUBLIC;
SELECT pg_stat_force_next_flush();
DO $$ BEGIN
    FOR i IN 1 .. 300 LOOP
        EXIT WHEN cardinality(rag._watch_functions_public()) = 0;
        PERFORM pg_sleep(0.1);
    END LOOP;
END $$;
SELECT has_function_privilege('leftover_new', :'set_aside', 'EXECUTE') AS others_may_run_it;
-- Watched again, the old table has triggers of its own watch, and the set-aside functions go with the last
-- trigger that ran them.
SET ROLE leftover_old;
SELECT rag_watch('leftover_a', 'left-old', content => 'body') > :old_watch AS watched_again;
BEGIN;
INSERT INTO leftover_a VALUES (2, 'Written once watched again.');
RESET ROLE;
SELECT count(*) AS queued_for_the_old_table FROM rag.row_batches b JOIN rag.watches w ON w.id = b.watch_id
 WHERE w.source = 'leftover_a'::regclass;
COMMIT;
SELECT count(*) AS set_aside_left FROM pg_proc
 WHERE pronamespace = 'rag'::regnamespace AND proname ~ '^_watch_[0-9]+(_row)?_left_';
-- A leftover function that no trigger runs any longer (its owner dropped the table, or its triggers), which
-- its owner had granted on: a new watch given its id drops it, so that neither the grant nor a trigger its
-- owner attaches afterwards runs the new watch's body. Replaced in place, it kept its grant and the old owner
-- could attach the new watch's function to a table of theirs.
CREATE TABLE leftover_c (id integer PRIMARY KEY, body text);
CREATE TABLE leftover_d (id integer PRIMARY KEY, body text);
CREATE TABLE leftover_e (id integer PRIMARY KEY, body text);
ALTER TABLE leftover_c OWNER TO leftover_old;
ALTER TABLE leftover_e OWNER TO leftover_old;
ALTER TABLE leftover_d OWNER TO leftover_new;
SET ROLE leftover_old;
SELECT rag_watch('leftover_c', 'left-old', content => 'body', filter => 'body <> ''''') AS gone_watch \gset
RESET ROLE;
DELETE FROM rag.watches WHERE id = :gone_watch;
SELECT setval('rag.watches_id_seq', :gone_watch, false) > 0 AS turned_back;
SELECT format('rag.%I()', '_watch_' || :gone_watch) AS gone_function,
       to_regprocedure(format('rag.%I()', '_watch_' || :gone_watch))::oid AS gone_oid \gset
SELECT set_config('leftover.gone', :'gone_watch', false) IS NOT NULL AS noted;
SET ROLE leftover_old;
DROP TABLE leftover_c;
GRANT EXECUTE ON FUNCTION :gone_function TO rag_admin;
RESET ROLE;
SET ROLE leftover_new;
SELECT rag_watch('leftover_d', 'left-new', content => 'body', filter => 'public.leftover_noted(body)') = :gone_watch
       AS given_the_same_id;
RESET ROLE;
SELECT count(*) AS leftover_kept FROM pg_proc WHERE oid = :gone_oid;
SELECT has_function_privilege('leftover_old', :'gone_function', 'EXECUTE') AS old_owner_may_run_it;
SET ROLE leftover_old;
DO $$ BEGIN
    EXECUTE format('CREATE TRIGGER borrowed AFTER INSERT ON leftover_e REFERENCING NEW TABLE AS new_rows '
                   'FOR EACH STATEMENT EXECUTE FUNCTION rag.%I()', '_watch_' || current_setting('leftover.gone'));
    RAISE NOTICE 'attached';
EXCEPTION WHEN insufficient_privilege THEN
    RAISE NOTICE 'refused: %', regexp_replace(SQLERRM, '_watch_[0-9]+', '_watch_N');
END $$;
RESET ROLE;
SET ROLE leftover_new;
SELECT rag_unwatch('leftover_d', drop_documents => true) AS unwatched;
RESET ROLE;
DROP TABLE leftover_d, leftover_e;
-- The old table's owner may take such triggers away without watching the table again: their rag_unwatch drops
-- them and the functions they ran, and the table takes writes again; another role's call finds nothing to
-- unwatch and touches nothing.
CREATE TABLE leftover_g (id integer PRIMARY KEY, body text);
ALTER TABLE leftover_g OWNER TO leftover_old;
SET ROLE leftover_old;
SELECT rag_watch('leftover_g', 'left-old', content => 'body') AS g_watch \gset
RESET ROLE;
DELETE FROM rag.watches WHERE id = :g_watch;
SET ROLE leftover_old;
\set VERBOSITY terse
INSERT INTO leftover_g VALUES (1, 'Refused while the triggers are left.');
\set VERBOSITY default
RESET ROLE;
SET ROLE leftover_new;
SELECT rag_unwatch('leftover_g') AS by_another_role;
RESET ROLE;
SELECT count(*) AS triggers_kept FROM pg_trigger WHERE tgrelid = 'leftover_g'::regclass;
SET ROLE leftover_old;
SELECT rag_unwatch('leftover_g') AS by_its_owner;
INSERT INTO leftover_g VALUES (1, 'Written once the triggers are gone.');
RESET ROLE;
SELECT count(*) AS triggers_left FROM pg_trigger WHERE tgrelid = 'leftover_g'::regclass;
SELECT count(*) AS functions_left FROM pg_proc WHERE pronamespace = 'rag'::regnamespace
   AND proname IN ('_watch_' || :g_watch, '_watch_' || :g_watch || '_row');
DROP TABLE leftover_g;
-- Not on a view, whose LOCK TABLE would lock what it reads, with rag's owner's rights (security_invoker): any
-- role that made one over a table, or pg_class, and put a trigger named like the watches' on it held that
-- relation for as long as its transaction stayed open.
CREATE VIEW leftover_v WITH (security_invoker = true) AS SELECT * FROM leftover_seen;
ALTER VIEW leftover_v OWNER TO leftover_old;
SET ROLE leftover_old;
CREATE TRIGGER rag_watch_decoy AFTER INSERT ON leftover_v FOR EACH STATEMENT
    EXECUTE FUNCTION suppress_redundant_updates_trigger();
BEGIN;
SELECT rag_unwatch('leftover_v') AS on_a_view;
SELECT count(*) AS locked_beneath FROM pg_locks
 WHERE relation = 'leftover_seen'::regclass AND mode = 'AccessExclusiveLock' AND pid = pg_backend_pid();
ROLLBACK;
RESET ROLE;
DROP VIEW leftover_v;
-- A gathering watch has no row function now. One an earlier build made, which the table's owner runs from a
-- trigger of theirs on the watched table under a name rag_watch does not use (so that the watch's own triggers
-- go and it stays), is set aside when the watch's triggers are made again (rag_reindex after a trigger of the
-- watch was dropped): dropping it failed the re-install.
DO $$
DECLARE
    v_name text := (SELECT '_watch_' || id || '_row' FROM rag.watches WHERE source_name = 'leftover_b');
BEGIN
    EXECUTE format('CREATE FUNCTION rag.%I() RETURNS trigger LANGUAGE plpgsql AS %L', v_name,
                   rag._watch_body_mark() || E'\nBEGIN RETURN NULL; END');
    EXECUTE format('ALTER FUNCTION rag.%I() OWNER TO leftover_new', v_name);
END $$;
SET ROLE leftover_new;
DO $$
BEGIN
    EXECUTE format('CREATE TRIGGER mine_runs_it AFTER INSERT ON leftover_b FOR EACH ROW EXECUTE FUNCTION rag.%I()',
                   (SELECT '_watch_' || id || '_row' FROM rag.watches WHERE source_name = 'leftover_b'));
END $$;
DROP TRIGGER rag_watch_replica_truncate ON leftover_b;
SELECT rag_reindex('leftover_b'::regclass) IS NOT NULL AS reindexed;
SELECT regexp_replace(tgfoid::regproc::text, '[0-9]+', 'N', 'g') AS mine_runs,
       (SELECT count(*) FROM pg_trigger WHERE tgrelid = 'leftover_b'::regclass AND tgname = 'rag_watch_replica_truncate') AS put_back
  FROM pg_trigger WHERE tgrelid = 'leftover_b'::regclass AND tgname = 'mine_runs_it';
DROP TRIGGER mine_runs_it ON leftover_b;
RESET ROLE;
-- A restore of a dump of 0.1.0 brings its watches' trigger functions (ordinary functions of schema rag to
-- pg_dump), whose bodies run the owner's filter with no check of who wrote it, and none of rag's rows. As the
-- restore (here a superuser: pg_restore --no-owner) creates one, it is made to do nothing and named in a
-- WARNING; the filter never runs, as the superuser or at all.
CREATE TABLE leftover_old_dump (id int PRIMARY KEY, body text);
CREATE FUNCTION rag._watch_9999() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $f$
DECLARE
    v_keys jsonb;
BEGIN
    SELECT to_jsonb(array_agg(r.id)) INTO v_keys FROM new_rows r WHERE public.leftover_noted(r.body);
    RETURN NULL;
END $f$;
CREATE FUNCTION rag._watch_9999_row() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER AS $f$
BEGIN
    INSERT INTO rag.row_batches (watch_id, keys) VALUES (9999, jsonb_build_array(jsonb_build_object('id', NEW.id)));
    RETURN NULL;
END $f$;
CREATE TRIGGER rag_watch_insert AFTER INSERT ON leftover_old_dump REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION rag._watch_9999();
CREATE TRIGGER rag_watch_update AFTER UPDATE ON leftover_old_dump FOR EACH ROW EXECUTE FUNCTION rag._watch_9999_row();
INSERT INTO leftover_old_dump VALUES (1, 'restored from 0.1.0');
UPDATE leftover_old_dump SET body = body || '!';
-- (leftover_noted notes each body it is called with; the worker calls it for the other tables' watches.)
SELECT count(*) AS filter_ran, (SELECT count(*) FROM rag.row_batches WHERE watch_id = 9999) AS queued
  FROM leftover_seen WHERE body LIKE 'restored from 0.1.0%';
SELECT p.proname, p.prosrc = rag._watch_body_mark() || E'\n' || 'BEGIN RETURN NULL; END' AS does_nothing,
       p.prosecdef, pg_get_userbyid(p.proowner) = current_user AS kept_its_owner
  FROM pg_proc p WHERE p.pronamespace = 'rag'::regnamespace AND p.proname ~ '^_watch_9999' ORDER BY 1;
-- One whose body starts as rag's own does (a restore of a dump of this release) is left as it is, and so is a
-- function of that name elsewhere, or one of rag's with arguments.
DO $$
BEGIN
    EXECUTE format('CREATE FUNCTION rag._watch_9998() RETURNS trigger LANGUAGE plpgsql AS %L',
                   rag._watch_body_mark() || E'\nBEGIN RAISE NOTICE ''kept''; RETURN NULL; END');
END $$;
CREATE FUNCTION public._watch_9997() RETURNS trigger LANGUAGE plpgsql AS $f$ BEGIN RETURN NULL; END $f$;
CREATE FUNCTION rag._watch_9996(integer) RETURNS integer LANGUAGE sql AS $f$ SELECT 1 $f$;
SELECT p.oid::regprocedure AS untouched FROM pg_proc p
 WHERE p.proname IN ('_watch_9998', '_watch_9997', '_watch_9996')
   AND p.prosrc <> rag._watch_body_mark() || E'\n' || 'BEGIN RETURN NULL; END'
 ORDER BY p.proname;
-- An ordinary role's CREATE FUNCTION (in its temporary schema) fires the event trigger too, which then runs none
-- of rag's internal functions (not the role's to execute).
SET ROLE leftover_new;
CREATE FUNCTION pg_temp._watch_1() RETURNS trigger LANGUAGE plpgsql AS $f$ BEGIN RETURN NULL; END $f$;
DROP FUNCTION pg_temp._watch_1();
RESET ROLE;
-- A function renamed into such a name (by a superuser: nobody else may put one in schema rag) is treated the same.
CREATE FUNCTION rag.leftover_renamed() RETURNS trigger LANGUAGE plpgsql AS $f$
BEGIN
    PERFORM public.leftover_noted('renamed into a watch''s name');
    RETURN NULL;
END $f$;
ALTER FUNCTION rag.leftover_renamed() RENAME TO _watch_9995;
SELECT prosrc = rag._watch_body_mark() || E'\n' || 'BEGIN RETURN NULL; END' AS renamed_does_nothing
  FROM pg_proc WHERE oid = 'rag._watch_9995()'::regprocedure;
DROP FUNCTION rag._watch_9995();
-- A superuser's own body for a live watch's function: replaced by the body rag_drop_collection leaves, which
-- still takes the keys the table's row triggers gathered (so the commit warns of none left over), and named in
-- a WARNING (which names the watch's id, so it is not shown here); rag_reindex by the owner makes it again.
SELECT id AS live_watch FROM rag.watches WHERE source = 'leftover_a'::regclass \gset
SET client_min_messages = error;
DO $$
BEGIN
    EXECUTE format('CREATE OR REPLACE FUNCTION rag.%I() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER AS %L',
                   (SELECT '_watch_' || id FROM rag.watches WHERE source = 'leftover_a'::regclass),
                   'BEGIN RETURN NULL; END');
END $$;
RESET client_min_messages;
SELECT prosrc = rag._watch_body_mark() || E'\n' || rag._silent_watch_body(:live_watch, false) AS takes_the_keys
  FROM pg_proc WHERE oid = format('rag._watch_%s()', :live_watch)::regprocedure;
INSERT INTO leftover_a VALUES (1000, 'written while the watch''s function did nothing');
SELECT rag._watch_triggers_problem('leftover_a'::regclass) AS problem;
SELECT pg_get_userbyid(relowner) AS leftover_a_owner FROM pg_class WHERE oid = 'leftover_a'::regclass \gset
SET ROLE :leftover_a_owner;
SELECT rag_reindex('leftover_a'::regclass) IS NOT NULL AS reindexed;
RESET ROLE;
SELECT starts_with(prosrc, rag._watch_body_mark()) AND prosrc LIKE '%INSERT INTO rag.row_batches%' AS made_again,
       rag._watch_triggers_problem('leftover_a'::regclass) IS NULL AS no_problem
  FROM pg_proc WHERE oid = format('rag._watch_%s()', :live_watch)::regprocedure;
DELETE FROM leftover_a WHERE id = 1000;
DROP TABLE leftover_old_dump;
DROP FUNCTION rag._watch_9999(), rag._watch_9999_row(), rag._watch_9998(), public._watch_9997(), rag._watch_9996(integer);
SET ROLE leftover_old;
SELECT rag_unwatch('leftover_a', drop_documents => true) AS unwatched, rag_drop_collection('left-old') AS dropped;
RESET ROLE;
SET ROLE leftover_new;
SELECT rag_unwatch('leftover_b', drop_documents => true) AS unwatched, rag_drop_collection('left-new') AS dropped;
RESET ROLE;
DROP TABLE leftover_a, leftover_b, leftover_seen;
DROP FUNCTION leftover_noted(text);
DROP OWNED BY leftover_old, leftover_new;
DROP ROLE leftover_old, leftover_new;
