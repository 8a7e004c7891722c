-- Content tables that stay indexed by themselves.
SELECT rag_create_collection('site', embedding_model => 'hash-384', max_distance => 0.9, chunk_size => 200, chunk_overlap => 0) > 0 AS created;
CREATE TABLE articles (id serial PRIMARY KEY, title text, body text, published boolean DEFAULT true,
                       author text, lang text, views integer DEFAULT 0);
INSERT INTO articles (title, body, author, lang) VALUES
  ('Notice periods', '<p>All staff must give <b>thirty days</b> notice.</p><script>track()</script>', 'ana', 'en'),
  ('Canteen', '<p>Lunch is served from noon until two.</p>', 'bo', 'en');
SELECT rag_watch('articles', collection => 'site', content => 'title || E''\n\n'' || body', title => 'title',
                 filter => 'published', metadata => ARRAY['author', 'lang'], format => 'html') > 0 AS watching;
SELECT source_name, key_columns, metadata_columns, format FROM rag.watches;
-- With a filter, inserts are read from a transition table by a statement trigger that runs the filter as the
-- table's owner; updates and deletes queue their keys whatever the filter says (the worker applies it).
SELECT tgname, pg_get_triggerdef(oid) ~ 'REFERENCING' AS transition_table FROM pg_trigger
 WHERE tgrelid = 'articles'::regclass ORDER BY 1;

-- rag_wait waits for the rows a watch queued too, not only for documents already made from them.
SELECT rag_wait('site', '30 seconds') AS settled;
-- HTML became clean text; the row's key and metadata travel with the document.
SELECT title, source, source_key, metadata, body, status FROM rag.documents WHERE watch_id IS NOT NULL ORDER BY source_key;
SELECT title, source, source_key FROM rag_query('site', 'how much notice must staff give', 1);
-- So does a reader's rag_wait, though a reader may not look at the queues: a row written just before is found
-- right after it returns.
CREATE ROLE watch_reader LOGIN IN ROLE rag_reader;
SELECT rag_grant('site', 'watch_reader', 'read');
GRANT SELECT ON articles TO watch_reader;
INSERT INTO articles (title, body, author, lang) VALUES ('Bicycles', '<p>Bicycles are parked in the courtyard shed.</p>', 'ana', 'en');
SET ROLE watch_reader;
SELECT count(*) AS queue_rows_a_reader_sees FROM rag.row_queue;
SELECT rag_wait('site', '30 seconds') AS settled;
SELECT title, source_key FROM rag_query('site', 'where are bicycles parked', 1);
-- A reader who may read the whole table (no row-level security on it) sees its documents in a plain SELECT.
SELECT count(*) AS documents_a_whole_table_reader_sees FROM rag.documents WHERE source = 'articles';
RESET ROLE;
DELETE FROM articles WHERE title = 'Bicycles';
SELECT rag_wait('site', '30 seconds') AS settled;

-- An update of an unrelated column queues nothing.
UPDATE articles SET views = views + 1 WHERE id = 1;
SELECT (SELECT count(*) FROM rag.row_queue) + (SELECT coalesce(sum(coalesce(jsonb_array_length(keys), cardinality(key_values::text[]))), 0) FROM rag.row_batches) AS queued_after_unrelated_update;
-- An update of indexed content is picked up.
UPDATE articles SET body = '<p>All staff must give <b>sixty days</b> notice.</p>' WHERE id = 1;
SELECT (SELECT count(*) FROM rag.row_queue) + (SELECT coalesce(sum(coalesce(jsonb_array_length(keys), cardinality(key_values::text[]))), 0) FROM rag.row_batches) AS queued_after_content_update;
SELECT rag_wait('site', '30 seconds') AS settled;
SELECT body FROM rag.documents WHERE source_key = '{"id": 1}';
-- Unpublishing takes it out of the index.
UPDATE articles SET published = false WHERE id = 1;
SELECT rag_wait('site', '30 seconds') AS settled;
SELECT count(*) AS unpublished_documents FROM rag.documents WHERE source_key = '{"id": 1}';
-- The filter is applied before the content is built: a draft whose content expression cannot be evaluated yet
-- (no JSON until it is published) is left out, not failed, and costs nothing to build. Evaluating it adds no
-- name the expressions could mean (a column named like a helper of the worker's query made them ambiguous).
CREATE TABLE drafts (id integer PRIMARY KEY, body text, published boolean, pass text, f text, s text, x text);
INSERT INTO drafts VALUES (1, '{"text": "Expenses are repaid within ten days."}', true, 'Finance', 'f', 's', 'x'),
                          (2, 'not JSON yet', false, NULL, NULL, NULL, NULL);
SELECT rag_watch('drafts', collection => 'site',
                 content => 'pass || '': '' || ((body::jsonb)->>''text'') || f || s || x || r.x', filter => 'published') > 0 AS watching;
UPDATE drafts SET body = 'still not JSON' WHERE id = 2;
SELECT rag_wait('site', '30 seconds') AS settled;
SELECT count(*) AS failed_rows FROM rag.row_queue q JOIN rag.watches w ON w.id = q.watch_id
 WHERE w.source_name = 'drafts' AND q.last_error IS NOT NULL;
SELECT source_key, body FROM rag.documents WHERE source = 'drafts' ORDER BY source_key;
-- The filter is asked of the row being read only, not of the other rows a scan of the table passes: a filter
-- that fails on one row fails that row's sync alone.
CREATE TABLE flagged (id integer PRIMARY KEY, body text);
INSERT INTO flagged VALUES (1, '{"ok": true, "text": "Parking permits are renewed each January."}'), (2, '{"ok": false}');
SELECT rag_watch('flagged', collection => 'site', content => '(body::jsonb)->>''text''',
                 filter => '((body::jsonb)->>''ok'')::boolean') > 0 AS watching;
SELECT rag_wait('site', '30 seconds') AS settled;
UPDATE flagged SET body = 'broken' WHERE id = 2;
UPDATE flagged SET body = '{"ok": true, "text": "Parking permits are renewed each February."}' WHERE id = 1;
SELECT rag_wait('site', '30 seconds') AS settled;
SELECT q.key, q.last_error FROM rag.row_queue q JOIN rag.watches w ON w.id = q.watch_id
 WHERE w.source_name = 'flagged' ORDER BY 1;
SELECT source_key, body FROM rag.documents WHERE source = 'flagged' ORDER BY source_key;
-- Counting the watched rows runs the filter on every row: it fails for this table alone, and the other watches
-- are still listed (the whole call failed before).
SELECT source, rows_watched, rows_failed, last_error IS NOT NULL AS says_why FROM rag_watch_status() ORDER BY 1;
SELECT rag_unwatch('flagged', drop_documents => true);
DROP TABLE flagged;
SELECT rag_unwatch('drafts', drop_documents => true);
DROP TABLE drafts;
-- A rolled-back write queues nothing.
BEGIN;
INSERT INTO articles (title, body) VALUES ('Never', '<p>Rolled back.</p>');
ROLLBACK;
SELECT (SELECT count(*) FROM rag.row_queue) + (SELECT coalesce(sum(coalesce(jsonb_array_length(keys), cardinality(key_values::text[]))), 0) FROM rag.row_batches) AS queued_after_rollback;
-- A primary-key change is a delete and an insert.
UPDATE articles SET id = 20 WHERE id = 2;
SELECT rag_wait('site', '30 seconds') AS settled;
SELECT source_key, title FROM rag.documents WHERE watch_id IS NOT NULL ORDER BY source_key;
-- Delete.
DELETE FROM articles WHERE id = 20;
SELECT rag_wait('site', '30 seconds') AS settled;
SELECT count(*) AS documents_after_delete FROM rag.documents WHERE watch_id IS NOT NULL;
-- Truncate.
UPDATE articles SET published = true;
SELECT rag_wait('site', '30 seconds') AS settled;
SELECT count(*) AS documents_before_truncate FROM rag.documents WHERE watch_id IS NOT NULL;
TRUNCATE articles;
SELECT count(*) AS documents_after_truncate FROM rag.documents WHERE watch_id IS NOT NULL;
-- Reindex queues every qualifying row again.
INSERT INTO articles (title, body, author, lang) VALUES ('Parking', '<p>Permits from reception.</p>', 'cy', 'de');
SELECT rag_wait('site', '30 seconds') AS settled;
SELECT rag_reindex('articles') AS queued;
SELECT rag_wait('site', '30 seconds') AS settled;
SELECT * FROM rag_watch_status();

-- Composite keys, found from the primary key.
CREATE TABLE pages (site text, slug text, content text, PRIMARY KEY (site, slug));
INSERT INTO pages VALUES ('a', 'home', 'Welcome to site a.'), ('b', 'home', 'Welcome to site b.');
SELECT rag_watch('pages', 'site', content => 'content') > 0;
SELECT rag_wait('site', '30 seconds') AS settled;
SELECT source_key FROM rag.documents WHERE source = 'pages' ORDER BY source_key;
UPDATE pages SET content = 'Welcome back to site b.' WHERE site = 'b';
SELECT rag_wait('site', '30 seconds') AS settled;
SELECT source_key, body FROM rag.documents WHERE source = 'pages' ORDER BY source_key;

-- A one-column key of a statement's rows travels as the text of an array of the column's type; awkward text
-- values come back intact, and an UPDATE of one lands on the same document.
CREATE TABLE slugs (slug text PRIMARY KEY, content text);
SELECT rag_watch('slugs', 'site', content => 'content') > 0 AS watching;
INSERT INTO slugs VALUES ('plain', 'A plain slug.'), ('with "quotes", {braces} and \back', 'An awkward slug.'),
                         ('NULL', 'A slug spelled NULL.'), ('  spaced  ', 'A slug with spaces.'), ('', 'An empty slug.');
SELECT rag_wait('site', '30 seconds') AS settled;
SELECT source_key, body FROM rag.documents WHERE source = 'slugs' ORDER BY source_key;
UPDATE slugs SET content = 'The awkward slug, updated.' WHERE slug LIKE 'with%';
SELECT rag_wait('site', '30 seconds') AS settled;
SELECT count(*) AS documents, count(*) FILTER (WHERE body = 'The awkward slug, updated.') AS updated
  FROM rag.documents WHERE source = 'slugs';
DROP TABLE slugs;
-- A key of a domain over an integer travels as array text too and comes back a number: the worker casts the text
-- to numeric, never to the owner's domain. A date key, whose text DateStyle changes, travels as jsonb.
CREATE DOMAIN ticket_no AS integer CHECK (VALUE > 0);
CREATE TABLE tickets (id ticket_no PRIMARY KEY, content text);
CREATE TABLE days (day date PRIMARY KEY, content text);
SELECT rag_watch('tickets', 'site', content => 'content') > 0 AS watching_tickets,
       rag_watch('days', 'site', content => 'content') > 0 AS watching_days;
SELECT rag._plain_key_kind('tickets', 'id') AS ticket_key, rag._plain_key_kind('days', 'day') AS day_key,
       rag._plain_key_kind('days', 'no_such_column') AS missing;
INSERT INTO tickets VALUES (7, 'Ticket seven.'), (8, 'Ticket eight.');
SET DateStyle = 'SQL, DMY';
INSERT INTO days VALUES ('01/02/2024', 'The first of February.');
RESET DateStyle;
SELECT rag_wait('site', '30 seconds') AS settled;
SELECT source, source_key, body FROM rag.documents WHERE source IN ('tickets', 'days') ORDER BY source, source_key::text;
UPDATE tickets SET content = 'Ticket seven, updated.' WHERE id = 7;
SELECT rag_wait('site', '30 seconds') AS settled;
SELECT count(*) AS ticket_documents, count(*) FILTER (WHERE body = 'Ticket seven, updated.') AS updated
  FROM rag.documents WHERE source = 'tickets';
DROP TABLE tickets;
DROP TABLE days;
DROP DOMAIN ticket_no;

-- Without a filter, a plain table's one-column keys are gathered by a row trigger in Rust (rag._watch_key) and
-- queued as one batch per statement, for inserts, updates and deletes alike; no transition table copies the rows.
CREATE TABLE gathered (id bigint PRIMARY KEY, body text);
SELECT rag_watch('gathered', 'site', content => 'body') > 0 AS watching;
SELECT tgname, pg_get_triggerdef(oid) ~ 'REFERENCING' AS transition_table,
       pg_get_triggerdef(oid) ~ 'FOR EACH ROW' AS row_level FROM pg_trigger
 WHERE tgrelid = 'gathered'::regclass ORDER BY 1;
-- The batches a watched table's writes queued (not yet spread by the worker), in order.
CREATE FUNCTION pg_temp.watch_batches(p_source text) RETURNS text LANGUAGE sql AS $$
    SELECT string_agg(coalesce(b.key_values, b.keys::text), ' ' ORDER BY b.id) FROM rag.row_batches b
     WHERE b.watch_id = (SELECT w.id FROM rag.watches w WHERE w.source_name = p_source) $$;
BEGIN;
INSERT INTO gathered SELECT g, 'row ' || g FROM generate_series(1, 3) g;
-- A conflict skipped inserts nothing; an upsert gathers the rows it inserts and those it updates.
INSERT INTO gathered VALUES (3, 'three again') ON CONFLICT (id) DO NOTHING;
INSERT INTO gathered VALUES (3, 'three again'), (4, 'four') ON CONFLICT (id) DO UPDATE SET body = excluded.body;
-- An update that leaves the indexed columns as they were gathers nothing; a key change gathers both keys.
UPDATE gathered SET body = body WHERE id = 1;
UPDATE gathered SET id = 20 WHERE id = 2;
DELETE FROM gathered WHERE id IN (1, 3);
-- Rows rolled back to a savepoint leave no key behind.
SAVEPOINT before_six;
INSERT INTO gathered VALUES (6, 'six');
ROLLBACK TO before_six;
COPY gathered FROM STDIN;
7	seven
8	eight
\.
SELECT pg_temp.watch_batches('gathered') AS batches;
ROLLBACK;
-- A session with session_replication_role = replica, as a logical-replication subscriber's apply worker runs,
-- fires none of those triggers (nor any statement trigger but TRUNCATE's): the watch's triggers enabled REPLICA
-- gather the keys of each statement's rows as a partition's do (one batch per statement, not per row), and
-- fire in no other session. Nothing is left for a WARNING at the commit.
BEGIN;
SET LOCAL session_replication_role = replica;
INSERT INTO gathered SELECT g, 'row ' || g FROM generate_series(1, 2) g;
UPDATE gathered SET body = body WHERE id = 1;
UPDATE gathered SET body = 'changed', id = 30 WHERE id = 2;
DELETE FROM gathered WHERE id = 1;
SELECT pg_temp.watch_batches('gathered') AS replica_batches;
TRUNCATE gathered;
SELECT pg_temp.watch_batches('gathered') AS batches_after_truncate;
COMMIT;
-- A statement's keys past 4,000,000 bytes of text (src/limits.rs WATCH_KEYS_FLUSH_BYTES: 500,000 seven-digit
-- keys) go into a batch of their own at once: an apply worker ends no statement before its commit, and a
-- subscription's initial copy of a large table is one transaction. A batch queued so inside a savepoint goes
-- with its rollback, as the rows do.
BEGIN;
SET LOCAL session_replication_role = replica;
INSERT INTO gathered SELECT g, 'x' FROM generate_series(1000001, 1600000) g;
SAVEPOINT before_more;
INSERT INTO gathered SELECT g, 'x' FROM generate_series(2000001, 2500000) g;
SELECT count(*) AS batches_within_the_savepoint FROM rag.row_batches
 WHERE watch_id = (SELECT id FROM rag.watches WHERE source_name = 'gathered');
ROLLBACK TO before_more;
SELECT count(*) AS batches, array_agg(cardinality(key_values::bigint[]) ORDER BY id) AS keys_per_batch,
       sum(cardinality(key_values::bigint[])) AS keys
  FROM rag.row_batches WHERE watch_id = (SELECT id FROM rag.watches WHERE source_name = 'gathered');
ROLLBACK;
-- ENABLE TRIGGER ALL (as pg_restore --disable-triggers ends) makes them ORIGIN triggers, which an apply worker
-- never fires: rag's event trigger makes them REPLICA ones again (red team 27). They would stay idle outside a
-- replica-role session anyway (below), so an ordinary write still queues one batch per statement.
BEGIN;
ALTER TABLE gathered DISABLE TRIGGER ALL;
ALTER TABLE gathered ENABLE TRIGGER ALL;
SELECT string_agg(tgname || ' ' || tgenabled::text, ', ' ORDER BY tgname) AS replica_triggers_now
  FROM pg_trigger WHERE tgrelid = 'gathered'::regclass AND tgname LIKE 'rag\_watch\_replica\_%';
INSERT INTO gathered SELECT g, 'row ' || g FROM generate_series(1, 3) g;
SELECT pg_temp.watch_batches('gathered') AS batches_with_every_trigger_enabled;
ROLLBACK;
-- Enabled ALWAYS by hand, they still gather nothing outside a replica-role session: rag._watch_key asks the
-- setting itself ('replica'; a WHEN clause would be compiled again for every row an apply worker applies).
BEGIN;
ALTER TABLE gathered ENABLE ALWAYS TRIGGER rag_watch_replica_insert, ENABLE ALWAYS TRIGGER rag_watch_replica_update,
                     ENABLE ALWAYS TRIGGER rag_watch_replica_delete;
SELECT string_agg(tgname || ' ' || tgenabled::text || ' ' || coalesce(pg_get_triggerdef(oid) LIKE '% WHEN %', false)::text,
                  ', ' ORDER BY tgname) AS replica_triggers_always
  FROM pg_trigger WHERE tgrelid = 'gathered'::regclass AND tgname LIKE 'rag\_watch\_replica\_%';
INSERT INTO gathered SELECT g, 'row ' || g FROM generate_series(1, 3) g;
UPDATE gathered SET body = 'changed' WHERE id = 1;
DELETE FROM gathered WHERE id = 2;
SELECT pg_temp.watch_batches('gathered') AS batches_with_replica_triggers_always;
ROLLBACK;
-- pg_restore -j creates a table's triggers one at a time but in no fixed order (its ready list is a heap), and
-- the item of each replica trigger ends with ALTER TABLE … ENABLE REPLICA TRIGGER, which runs rag's event
-- trigger. The gathering triggers without their _key triggers looked like a whole set of another kind: the
-- event trigger made the watch's triggers again, and the restore's own CREATE TRIGGER of a _key trigger failed
-- ("already exists"). Here the _key triggers come last, with the replica triggers' ALTER TABLEs before them.
BEGIN;
CREATE TEMP TABLE dumped_triggers ON COMMIT DROP AS
SELECT t.tgname, pg_get_triggerdef(t.oid) AS definition, t.tgenabled
  FROM pg_trigger t WHERE t.tgrelid = 'gathered'::regclass AND t.tgname LIKE 'rag\_watch\_%';
DO $$
DECLARE
    t record;
BEGIN
    FOR t IN SELECT * FROM dumped_triggers LOOP
        EXECUTE format('DROP TRIGGER %I ON gathered', t.tgname);
    END LOOP;
    FOR t IN SELECT * FROM dumped_triggers ORDER BY tgname LIKE '%\_key', tgname LIKE '%\_replica\_%', tgname LOOP
        EXECUTE t.definition;
        IF t.tgenabled = 'R' THEN
            EXECUTE format('ALTER TABLE gathered ENABLE REPLICA TRIGGER %I', t.tgname);
        END IF;
    END LOOP;
END $$;
SELECT count(*) = (SELECT count(*) FROM dumped_triggers) AS every_trigger_restored
  FROM pg_trigger t WHERE t.tgrelid = 'gathered'::regclass AND t.tgname LIKE 'rag\_watch\_%';
ROLLBACK;
-- So rag never remakes a set it finds incomplete by itself: a trigger the owner dropped or disabled would leave
-- writes unindexed without a word. rag.watch_status says so, and rag_reindex of the table, by its owner, puts
-- them back.
BEGIN;
DROP TRIGGER rag_watch_insert_key ON gathered;
SELECT last_error AS a_key_trigger_dropped FROM rag.watch_status WHERE source = 'gathered';
DROP TRIGGER rag_watch_insert ON gathered;
SELECT last_error AS two_dropped FROM rag.watch_status WHERE source = 'gathered';
SELECT rag_reindex('gathered'::regclass) >= 0 AS reindexed;
SELECT last_error IS NULL AS whole_again FROM rag.watch_status WHERE source = 'gathered';
ALTER TABLE gathered DISABLE TRIGGER ALL;
ALTER TABLE gathered ENABLE TRIGGER ALL;
ALTER TABLE gathered DISABLE TRIGGER rag_watch_delete;
SELECT last_error AS enabled_for_other_sessions FROM rag.watch_status WHERE source = 'gathered';
SELECT rag_reindex('gathered'::regclass) >= 0 AS reindexed;
SELECT string_agg(tgname || ' ' || tgenabled::text, ', ' ORDER BY tgname) AS triggers_after_reindex
  FROM pg_trigger WHERE tgrelid = 'gathered'::regclass AND tgname LIKE 'rag\_watch\_%';
ROLLBACK;
-- Watches take turns at the worker: after a row of one watch, the next claim serves the next watch with due rows,
-- however many older rows the first still has (one watch's million keys must not hold every other watch's).
-- Uncommitted, so the worker does not see these rows.
BEGIN;
CREATE TABLE turns_a (id int PRIMARY KEY, body text);
CREATE TABLE turns_b (id int PRIMARY KEY, body text);
SELECT rag_watch('turns_a', 'site', content => 'body') AS a_watch \gset
SELECT rag_watch('turns_b', 'site', content => 'body') AS b_watch \gset
INSERT INTO rag.row_queue (watch_id, key, not_before)
SELECT :a_watch, jsonb_build_object('id', g), now() - interval '1 hour' + g * interval '1 second'
  FROM generate_series(1, 3) g;
INSERT INTO rag.row_queue (watch_id, key, not_before) VALUES (:b_watch, '{"id": 1}', now() - interval '1 minute');
SELECT w.source_name AS first_claim, q.key FROM rag._claim_row(pg_backend_pid(), :a_watch - 1) c
  JOIN rag.row_queue q ON q.id = c.row_queue_id JOIN rag.watches w ON w.id = c.watch_id;
SELECT w.source_name AS claim_after_a, q.key FROM rag._claim_row(pg_backend_pid(), :a_watch) c
  JOIN rag.row_queue q ON q.id = c.row_queue_id JOIN rag.watches w ON w.id = c.watch_id;
-- After the last watch the turn goes back to the first (here turns_a, unless an earlier test left a due row).
SELECT w.source_name <> 'turns_b' AS turn_moved_on FROM rag._claim_row(pg_backend_pid(), :b_watch) c
  JOIN rag.watches w ON w.id = c.watch_id;
ROLLBACK;
-- A watch whose table has none of its triggers (a restore that has not reached its post-data section, which may
-- not have brought the table's rows either) has no key synced: one synced then deleted its row's document for
-- good (red team 27). The keys wait until the triggers are back.
BEGIN;
CREATE TABLE untriggered (id int PRIMARY KEY, body text);
SELECT rag_watch('untriggered', 'site', content => 'body') AS untriggered_watch \gset
SELECT format('DROP TRIGGER %I ON untriggered', tgname) AS drop_trigger
  FROM pg_trigger WHERE tgrelid = 'untriggered'::regclass AND tgname LIKE 'rag\_watch\_%' \gexec
INSERT INTO rag.row_queue (watch_id, key, not_before) VALUES (:untriggered_watch, '{"id": 1}', now() - interval '1 hour');
SELECT coalesce((SELECT c.watch_id = :untriggered_watch
                   FROM rag._claim_row(pg_backend_pid(), :untriggered_watch - 1) c), false) AS claimed_without_triggers;
SELECT rag_reindex('untriggered'::regclass) >= 0 AS triggers_back;
SELECT coalesce((SELECT c.watch_id = :untriggered_watch
                   FROM rag._claim_row(pg_backend_pid(), :untriggered_watch - 1) c), false) AS claimed_with_triggers;
ROLLBACK;
-- A statement run in a subtransaction inside another statement's triggers queues only the keys gathered in that
-- subtransaction: when it rolls back, the outer statement's keys gathered before it are still queued, once.
CREATE FUNCTION gathered_echo() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.id < 100 THEN
        BEGIN
            INSERT INTO gathered VALUES (NEW.id + 100, 'echo');
            IF NEW.id = 2 THEN
                RAISE EXCEPTION 'undone';
            END IF;
        EXCEPTION WHEN raise_exception THEN
            NULL;
        END;
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER zz_echo AFTER INSERT ON gathered FOR EACH ROW EXECUTE FUNCTION gathered_echo();
BEGIN;
INSERT INTO gathered SELECT g, 'row ' || g FROM generate_series(1, 3) g;
SELECT pg_temp.watch_batches('gathered') AS batches;
ROLLBACK;
DROP TRIGGER zz_echo ON gathered;
DROP FUNCTION gathered_echo();
-- Keys whose statement trigger did not run are not lost silently: the commit warns.
ALTER TABLE gathered DISABLE TRIGGER rag_watch_insert;
INSERT INTO gathered VALUES (9, 'nine');
ALTER TABLE gathered ENABLE TRIGGER rag_watch_insert;
SELECT pg_temp.watch_batches('gathered') AS batches;
-- Keys gathered by the row trigger put on another table (a superuser's or a watched table's owner's doing;
-- 11_security tries it as an owner) are not taken by the watch's statement trigger, which takes only what was
-- gathered on its own table.
SELECT id AS gathered_watch FROM rag.watches WHERE source_name = 'gathered' \gset
CREATE TABLE elsewhere (id bigint PRIMARY KEY);
CREATE TRIGGER planted AFTER INSERT ON elsewhere FOR EACH ROW EXECUTE FUNCTION rag._watch_key(:'gathered_watch', 'id');
BEGIN;
INSERT INTO elsewhere VALUES (42);
INSERT INTO gathered VALUES (10, 'ten');
SELECT pg_temp.watch_batches('gathered') AS batches;
COMMIT;
DROP TABLE elsewhere;
-- An ordinary role may neither take a session's gathered keys nor put the row trigger on a table of its own.
SET ROLE watch_reader;
SELECT rag._watch_keys_taken(1, 'gathered'::regclass);
CREATE TEMPORARY TABLE own_rows (id int PRIMARY KEY);
CREATE TRIGGER gather_mine AFTER INSERT ON own_rows FOR EACH ROW EXECUTE FUNCTION rag._watch_key('1', 'id');
SELECT rag._watch_key();
RESET ROLE;
SELECT rag_unwatch('gathered', drop_documents => true);
DROP TABLE gathered;
-- Key types: integers of every width and sign, numeric, uuid (their output function's text), and NULL keys (a
-- key column without NOT NULL); MERGE writes through the same triggers.
CREATE TABLE typed_keys (i2 smallint, i4 integer, n numeric, u uuid, maybe integer, body text);
-- A key must name one row (a unique index covers it); NULLs do not collide in one.
CREATE UNIQUE INDEX ON typed_keys (i2);
CREATE UNIQUE INDEX ON typed_keys (i4);
CREATE UNIQUE INDEX ON typed_keys (n);
CREATE UNIQUE INDEX ON typed_keys (u);
CREATE UNIQUE INDEX ON typed_keys (maybe);
DO $$
DECLARE
    v_column text;
    v_batch text;
BEGIN
    FOREACH v_column IN ARRAY ARRAY['i2', 'i4', 'n', 'u', 'maybe'] LOOP
        PERFORM rag_watch('typed_keys', 'site', content => 'body', key => ARRAY[v_column]);
        BEGIN
            INSERT INTO typed_keys VALUES (-32768, -2147483648, -1.50, '00000000-0000-0000-0000-0000000000ab', NULL, 'a'),
                                          (32767, 2147483647, 1e20, 'ffffffff-ffff-ffff-ffff-ffffffffffff', 7, 'b');
            UPDATE typed_keys SET maybe = NULL, body = 'c' WHERE maybe = 7;
            v_batch := pg_temp.watch_batches('typed_keys');
            RAISE NOTICE '% keys: %', v_column, v_batch;
            RAISE EXCEPTION 'undo' USING ERRCODE = 'P0001';
        EXCEPTION WHEN raise_exception THEN
            NULL;
        END;
        PERFORM rag_unwatch('typed_keys');
    END LOOP;
END $$;
CREATE TABLE merged (id integer PRIMARY KEY, body text);
INSERT INTO merged VALUES (1, 'one'), (2, 'two');
SELECT rag_watch('merged', 'site', content => 'body') > 0 AS watching;
SELECT rag_wait('site', '30 seconds') AS settled;
BEGIN;
MERGE INTO merged m USING (VALUES (2, 'TWO'), (3, 'three')) v(id, body) ON m.id = v.id
 WHEN MATCHED THEN UPDATE SET body = v.body WHEN NOT MATCHED THEN INSERT VALUES (v.id, v.body);
MERGE INTO merged m USING (VALUES (1)) v(id) ON m.id = v.id WHEN MATCHED THEN DELETE;
SELECT pg_temp.watch_batches('merged') AS batches;
ROLLBACK;
SELECT rag_unwatch('merged', drop_documents => true);
DROP TABLE merged;
DROP TABLE typed_keys;
-- A partition, and a table that becomes one, has row triggers only: rows written through the parent fire the
-- partition's row triggers but only the parent's statement triggers. rag._watch_key gathers the keys and rag
-- queues them when the statement ends, one batch per statement and partition ('gather_at_end'). The event
-- trigger on ALTER TABLE makes a watched table's triggers again when it is attached or detached.
CREATE TABLE parted (id integer, body text) PARTITION BY RANGE (id);
CREATE TABLE parted_low PARTITION OF parted FOR VALUES FROM (0) TO (100);
CREATE TABLE parted_high (id integer, body text);
ALTER TABLE parted_low ADD PRIMARY KEY (id);
ALTER TABLE parted_high ADD PRIMARY KEY (id);
SELECT rag_watch('parted_low', 'site', content => 'body') > 0 AS watching_low,
       rag_watch('parted_high', 'site', content => 'body') > 0 AS watching_high;
SELECT rag._watch_trigger_mode_installed('parted_low'::regclass) AS low, rag._watch_trigger_mode_installed('parted_high'::regclass) AS high;
ALTER TABLE parted ATTACH PARTITION parted_high FOR VALUES FROM (100) TO (200);
SELECT rag._watch_trigger_mode_installed('parted_high'::regclass) AS high_attached;
BEGIN;
INSERT INTO parted VALUES (1, 'low'), (2, 'low too'), (150, 'high');
UPDATE parted SET body = body || '!';
DELETE FROM parted;
SELECT w.source_name, string_agg(coalesce(b.key_values, b.keys::text), ' ' ORDER BY b.id) AS batches
  FROM rag.row_batches b JOIN rag.watches w ON w.id = b.watch_id
 WHERE w.source_name LIKE 'parted%' GROUP BY 1 ORDER BY 1;
ROLLBACK;
ALTER TABLE parted DETACH PARTITION parted_high;
SELECT rag._watch_trigger_mode_installed('parted_high'::regclass) AS high_detached;
-- DETACH … CONCURRENTLY finishes in a transaction of its own, after the one that starts it: the table still
-- gets its plain table's triggers back.
ALTER TABLE parted ATTACH PARTITION parted_high FOR VALUES FROM (100) TO (200);
SELECT rag._watch_trigger_mode_installed('parted_high'::regclass) AS high_attached_again;
ALTER TABLE parted DETACH PARTITION parted_high CONCURRENTLY;
SELECT rag._watch_trigger_mode_installed('parted_high'::regclass) AS high_detached_concurrently;
BEGIN;
INSERT INTO parted_high VALUES (150, 'alone again');
SELECT pg_temp.watch_batches('parted_high') AS key_values;
ROLLBACK;
-- Two levels: a watched partition of a partition. Rows written through the top parent, through the middle one
-- or to the leaf itself are all queued, and detaching the middle level from the top changes nothing for it.
CREATE TABLE parted_mid PARTITION OF parted FOR VALUES FROM (200) TO (300) PARTITION BY RANGE (id);
CREATE TABLE parted_leaf PARTITION OF parted_mid FOR VALUES FROM (200) TO (250);
ALTER TABLE parted_leaf ADD PRIMARY KEY (id);
SELECT rag_watch('parted_leaf', 'site', content => 'body') > 0 AS watching_leaf;
SELECT rag._watch_trigger_mode_installed('parted_leaf'::regclass) AS leaf;
BEGIN;
INSERT INTO parted VALUES (201, 'through the top');
INSERT INTO parted_mid VALUES (202, 'through the middle');
INSERT INTO parted_leaf VALUES (203, 'straight in');
UPDATE parted SET body = body || '!' WHERE id = 201;
DELETE FROM parted_mid WHERE id = 202;
SELECT pg_temp.watch_batches('parted_leaf') AS leaf_batches;
ROLLBACK;
ALTER TABLE parted DETACH PARTITION parted_mid;
SELECT rag._watch_trigger_mode_installed('parted_leaf'::regclass) AS leaf_after_the_middle_left;
SELECT rag_unwatch('parted_low'), rag_unwatch('parted_high'), rag_unwatch('parted_leaf');
DROP TABLE parted_mid;
-- Inheritance: a table that starts inheriting gets row triggers (an UPDATE or DELETE of the parent reaches the
-- child's rows through the child's row triggers only), and its plain table's triggers back when it stops.
CREATE TABLE inh_parent (id integer, body text);
CREATE TABLE inh_child (id integer PRIMARY KEY, body text);
SELECT rag_watch('inh_child', 'site', content => 'body') > 0 AS watching_child;
SELECT rag._watch_trigger_mode_installed('inh_child'::regclass) AS child_alone;
ALTER TABLE inh_child INHERIT inh_parent;
SELECT rag._watch_trigger_mode_installed('inh_child'::regclass) AS child_inheriting;
BEGIN;
INSERT INTO inh_child VALUES (1, 'one'), (2, 'two');
UPDATE inh_parent SET body = body || '!' WHERE id = 1;
DELETE FROM inh_parent WHERE id = 2;
SELECT pg_temp.watch_batches('inh_child') AS child_batches;
ROLLBACK;
ALTER TABLE inh_child NO INHERIT inh_parent;
SELECT rag._watch_trigger_mode_installed('inh_child'::regclass) AS child_alone_again;
SELECT rag_unwatch('inh_child');
DROP TABLE inh_child, inh_parent;
-- What a statement's end queues for a watched partition: every statement that writes it, each in a batch of
-- its own, inside a function too; COPY through the parent; rows rolled back to a savepoint or in a failed block
-- leave no keys behind; a writer who owns nothing has its rows queued all the same (rag queues them as its own
-- owner, for the watch of the table the trigger fired on). A partition whose key rag._watch_key cannot read
-- (two columns here) keeps PL/pgSQL row triggers, one batch per row ('rows'). Those triggers run an INSERT
-- for each odd row, between the even rows' trigger calls, and that INSERT's end does not split the even rows'
-- batch: a statement's end takes only keys gathered by triggers deeper than it runs (pg_trigger_depth()).
-- Statements inside another's triggers (a trigger on inbox routing each row) queue their own batches.
CREATE TABLE routed (id integer, body text) PARTITION BY LIST ((id % 2));
CREATE TABLE routed_even PARTITION OF routed FOR VALUES IN (0);
CREATE TABLE routed_odd PARTITION OF routed FOR VALUES IN (1);
ALTER TABLE routed_even ADD PRIMARY KEY (id);
ALTER TABLE routed_odd ADD PRIMARY KEY (id, body);
SELECT rag_watch('routed_even', 'site', content => 'body') > 0 AS watching_even,
       rag_watch('routed_odd', 'site', content => 'body', key => ARRAY['id', 'body']) > 0 AS watching_odd;
SELECT rag._watch_trigger_mode_installed('routed_even'::regclass) AS even,
       rag._watch_trigger_mode_installed('routed_odd'::regclass) AS odd;
GRANT SELECT, INSERT, UPDATE ON routed TO watch_reader;
-- A writer with no rag role at all (no USAGE on schema rag): rag finds its queueing function without it.
CREATE ROLE routed_writer;
GRANT SELECT, INSERT, UPDATE ON routed TO routed_writer;
BEGIN;
INSERT INTO routed SELECT g, 'row ' || g FROM generate_series(1, 6) g;
COPY routed FROM STDIN;
8	eight
9	nine
10	ten
\.
SAVEPOINT before_twelve;
INSERT INTO routed VALUES (12, 'rolled back');
ROLLBACK TO SAVEPOINT before_twelve;
DO $$
BEGIN
    INSERT INTO routed VALUES (14, 'in a function');
    BEGIN
        INSERT INTO routed VALUES (16, 'in a failed block');
        RAISE EXCEPTION 'undo' USING ERRCODE = 'P0001';
    EXCEPTION WHEN raise_exception THEN
        NULL;
    END;
END $$;
CREATE TABLE inbox (id integer);
CREATE FUNCTION pg_temp.route_it() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO routed VALUES (NEW.id, 'routed by a trigger');
    RETURN NULL;
END $$;
CREATE TRIGGER route_it AFTER INSERT ON inbox FOR EACH ROW EXECUTE FUNCTION pg_temp.route_it();
INSERT INTO inbox VALUES (20), (21), (22);
SET ROLE watch_reader;
INSERT INTO routed VALUES (18, 'by a writer who owns nothing');
UPDATE routed SET body = body || '!' WHERE id IN (2, 3);
RESET ROLE;
SET ROLE routed_writer;
INSERT INTO routed VALUES (24, 'by a writer with no rag role');
RESET ROLE;
-- A statement that fails inside a block takes the keys it had gathered with it (row 30's trigger ran before
-- row 32's failed); the next statement's end queues only its own.
CREATE FUNCTION pg_temp.refuse_thirty_two() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.id = 32 THEN
        RAISE EXCEPTION 'not 32' USING ERRCODE = 'P0001';
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER zz_refuse_thirty_two AFTER INSERT ON routed_even FOR EACH ROW EXECUTE FUNCTION pg_temp.refuse_thirty_two();
DO $$
BEGIN
    BEGIN
        INSERT INTO routed VALUES (30, 'kept back with the failed statement'), (32, 'refused');
    EXCEPTION WHEN raise_exception THEN
        NULL;
    END;
    INSERT INTO routed VALUES (34, 'after the failed statement');
END $$;
DROP TRIGGER zz_refuse_thirty_two ON routed_even;
-- MERGE through the parent; a cascade from a foreign key deletes through it (its row events fire inside the
-- DELETE's own trigger firing, and that statement's end queues them).
-- EXPLAIN ANALYZE runs the write through the same executor end: its rows are queued like any other's (the plan's
-- text differs between PostgreSQL versions, so it is not shown).
\o /dev/null
EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) INSERT INTO routed VALUES (44, 'explained'), (45, 'explained');
\o
MERGE INTO routed r USING (VALUES (36, 'merged in'), (4, 'merged over')) v(id, body) ON r.id = v.id
 WHEN MATCHED THEN UPDATE SET body = v.body WHEN NOT MATCHED THEN INSERT (id, body) VALUES (v.id, v.body);
CREATE TABLE kin (id integer PRIMARY KEY);
INSERT INTO kin VALUES (1);
ALTER TABLE routed ADD COLUMN kin integer REFERENCES kin ON DELETE CASCADE;
INSERT INTO routed VALUES (40, 'kin of one', 1), (42, 'kin of one too', 1);
DELETE FROM kin;
SELECT pg_temp.watch_batches('routed_even') AS even_batches;
SELECT pg_temp.watch_batches('routed_odd') AS odd_batches;
ROLLBACK;
-- Rows applied as a subscriber's apply worker applies them, through the parent: a key per row for the partition
-- with a one-column key and for the one with a composite key.
BEGIN;
SET LOCAL session_replication_role = replica;
INSERT INTO routed VALUES (70, 'applied'), (71, 'applied'), (72, 'applied');
SELECT pg_temp.watch_batches('routed_even') AS even_replica_batches, pg_temp.watch_batches('routed_odd') AS odd_replica_batches;
ROLLBACK;
-- Nobody queues keys through rag._queue_gathered_keys from SQL; a row trigger that names another table's watch
-- queues nothing for that watch, and warns (failing the statement failed every write to a watched partition
-- whose watch a restore without rag's rows left out, once another table's watch took the id); a third argument
-- other than 'statement_end' fails.
SET ROLE watch_reader;
SELECT rag._queue_gathered_keys((SELECT id FROM rag.watches WHERE source_name = 'routed_even'),
                                'routed_even'::regclass, '{2}');
RESET ROLE;
SELECT id AS even_watch FROM rag.watches WHERE source_name = 'routed_even' \gset
CREATE TABLE not_watched (id integer);
CREATE TRIGGER borrowed_watch AFTER INSERT ON not_watched FOR EACH ROW
    EXECUTE FUNCTION rag._watch_key(:'even_watch', 'id', 'statement_end');
BEGIN;
-- Terse: the watch's id, in the detail, depends on the tests before this one.
\set VERBOSITY terse
INSERT INTO not_watched VALUES (1);
\set VERBOSITY default
SELECT count(*) AS borrowed_batches FROM rag.row_batches WHERE watch_id = :even_watch;
ROLLBACK;
DROP TRIGGER borrowed_watch ON not_watched;
-- The same through a replica trigger's 'replica', in a replica-role session: warned when the statement's keys
-- are queued, nothing queued.
CREATE TRIGGER borrowed_watch AFTER INSERT ON not_watched FOR EACH ROW
    EXECUTE FUNCTION rag._watch_key(:'even_watch', 'id', 'replica');
ALTER TABLE not_watched ENABLE REPLICA TRIGGER borrowed_watch;
BEGIN;
SET LOCAL session_replication_role = replica;
\set VERBOSITY terse
INSERT INTO not_watched VALUES (1);
\set VERBOSITY default
SELECT count(*) AS borrowed_replica_batches FROM rag.row_batches WHERE watch_id = :even_watch;
ROLLBACK;
DROP TRIGGER borrowed_watch ON not_watched;
CREATE TRIGGER odd_argument AFTER INSERT ON not_watched FOR EACH ROW
    EXECUTE FUNCTION rag._watch_key(:'even_watch', 'id', 'whenever');
INSERT INTO not_watched VALUES (1);
DROP TABLE not_watched;
SELECT count(*) AS batches_left FROM rag.row_batches;
-- A procedure that commits and rolls back as it goes: each statement's end queues its keys in that statement's
-- transaction, so the committed row's key is queued and the rolled-back one's is not. (The worker spreads the
-- batch into rag.row_queue; a sync delay of an hour keeps it there to be looked at.)
SET rag.sync_delay = '1h';
CREATE PROCEDURE pg_temp.routed_in_steps() LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO routed VALUES (50, 'committed');
    COMMIT;
    INSERT INTO routed VALUES (52, 'rolled back');
    ROLLBACK;
END $$;
CALL pg_temp.routed_in_steps();
-- Two-phase commit: the keys are queued inside the prepared transaction, so COMMIT PREPARED makes them due and
-- ROLLBACK PREPARED drops them.
BEGIN;
INSERT INTO routed VALUES (54, 'prepared, then committed');
PREPARE TRANSACTION 'rag_watch_prepared_54';
BEGIN;
INSERT INTO routed VALUES (56, 'prepared, then rolled back');
PREPARE TRANSACTION 'rag_watch_prepared_56';
COMMIT PREPARED 'rag_watch_prepared_54';
ROLLBACK PREPARED 'rag_watch_prepared_56';
RESET rag.sync_delay;
DO $$
BEGIN
    FOR i IN 1..300 LOOP
        EXIT WHEN NOT EXISTS (SELECT 1 FROM rag.row_batches);
        PERFORM pg_sleep(0.1);
    END LOOP;
END $$;
SELECT string_agg(q.key::text, ' ' ORDER BY q.key::text) AS queued_keys
  FROM rag.row_queue q JOIN rag.watches w ON w.id = q.watch_id WHERE w.source_name = 'routed_even';
SELECT rag_unwatch('routed_even'), rag_unwatch('routed_odd');
DROP TABLE routed;
DROP OWNED BY routed_writer;
DROP ROLE routed_writer;
-- A partitioned table itself is refused: it holds no rows of its own to read, and its partitions may be
-- written directly, which fires none of its statement triggers. Its partitions are watched instead.
SELECT rag_watch('parted', 'site', content => 'body', key => ARRAY['id']);
DROP TABLE parted, parted_high;

-- A watched table that changes owner keeps being indexed: the event trigger on ALTER TABLE gives its trigger
-- functions the new owner, whom the queue's row-level policy checks. The grants the old owner made on them go:
-- kept, they let the grantees attach the functions, which run as the new owner, to tables of theirs.
CREATE TABLE handed_over (id int PRIMARY KEY, body text);
SELECT rag_watch('handed_over', 'site', content => 'body') > 0 AS watching;
SELECT format('GRANT EXECUTE ON FUNCTION rag.%I() TO rag_admin', '_watch_' || id) AS grant_on
  FROM rag.watches WHERE source_name = 'handed_over' \gset
:grant_on;
ALTER TABLE handed_over OWNER TO watch_reader;
SELECT DISTINCT pg_get_userbyid(p.proowner) AS trigger_functions_owner,
       (SELECT count(*) FROM aclexplode(p.proacl) a WHERE a.grantee <> p.proowner) AS others_granted
  FROM pg_trigger t JOIN pg_proc p ON p.oid = t.tgfoid
 WHERE t.tgrelid = 'handed_over'::regclass AND p.proname ~ '^_watch_[0-9]+(_row)?$';
BEGIN;
INSERT INTO handed_over VALUES (1, 'still indexed');
SELECT pg_temp.watch_batches('handed_over') AS key_values;
ROLLBACK;
SELECT rag_unwatch('handed_over');
DROP TABLE handed_over;

-- Hostile or broken definitions are refused when the watch is made.
CREATE TABLE notes (id int PRIMARY KEY, txt text);
SELECT rag_watch('notes', 'site', content => 'txt); DROP TABLE articles; --');
SELECT rag_watch('notes', 'site', content => 'txt; DELETE FROM articles');
SELECT rag_watch('notes', 'site', content => 'no_such_column');
SELECT rag_watch('notes', 'site', content => 'txt', filter => '1 +');
-- One value for one row: an aggregate content made a deleted row's document read as present ("0 rows"), and a
-- set-returning one kept its first value only (review of session 35).
SELECT rag_watch('notes', 'site', content => 'count(*)::text || '' rows''');
SELECT rag_watch('notes', 'site', content => 'unnest(ARRAY[txt, ''x''])');
SELECT rag_watch('notes', 'site', content => 'txt', title => 'string_agg(txt, '' '') OVER ()');
SELECT rag_watch('notes', 'site', content => 'txt', metadata => ARRAY['nope']);
SELECT rag_watch('notes', 'site', content => 'txt', format => 'pdf');
SELECT rag_watch('articles', 'site', content => 'body');
CREATE TABLE keyless (txt text);
SELECT rag_watch('keyless', 'site', content => 'txt');
CREATE TEMPORARY TABLE session_notes (id int PRIMARY KEY, txt text);
SELECT rag_watch('session_notes', 'site', content => 'txt');
SELECT count(*) AS articles_still_there FROM articles;

-- DROP TABLE of a watched table cleans up through the event trigger.
DROP TABLE pages;
SELECT count(*) AS pages_documents, (SELECT count(*) FROM rag.watches WHERE source_name = 'pages') AS pages_watches
  FROM rag.documents WHERE source = 'pages';
-- Unwatching removes the triggers, and on request the documents.
SELECT rag_unwatch('articles', drop_documents => true);
SELECT count(*) AS triggers FROM pg_trigger WHERE tgrelid = 'articles'::regclass AND NOT tgisinternal;
SELECT count(*) AS documents FROM rag.documents WHERE source = 'articles';

-- The same HTML and Markdown cleaning is an option of rag_ingest.
SELECT rag_ingest('site', 'From HTML', '<h1>Title</h1><p>First &amp; <i>second</i>.</p><style>p{}</style>', format => 'html') AS html_doc \gset
SELECT rag_ingest('site', 'From Markdown', E'# Heading\n\nSome **bold** text and a [link](http://x).', format => 'markdown') AS md_doc \gset
SELECT id = :html_doc AS html, body FROM rag.documents WHERE id IN (:html_doc, :md_doc) ORDER BY id;

-- Changing a collection's model re-embeds everything with the new one, watched rows included, while the old
-- vectors keep serving; the two spaces never mix (15_migration.sql has the details).
SELECT rag_wait('site', '30 seconds') AS settled;
SELECT dimensions, count(ch.*) AS vectors FROM rag.collections c LEFT JOIN rag.chunks ch ON ch.collection_id = c.id AND ch.embedding IS NOT NULL
 WHERE c.name = 'site' GROUP BY 1;
SELECT rag_set_embedding_model('site', 'hash-64') AS requeued;
SELECT dimensions, count(ch.embedding) AS vectors_serving FROM rag.collections c LEFT JOIN rag.chunks ch ON ch.collection_id = c.id
 WHERE c.name = 'site' GROUP BY 1;
SELECT rag_wait('site', '30 seconds') AS done;
SELECT c.dimensions, count(*) AS vectors, bool_and(vector_dims(ch.embedding_alt) = 64) AS all_new_model,
       c.vector_column, c.index_name = 'chunks_embedding_alt_c' || c.id AS indexed
  FROM rag.collections c JOIN rag.chunks ch ON ch.collection_id = c.id WHERE c.name = 'site'
 GROUP BY c.id, c.dimensions, c.vector_column, c.index_name;
SELECT title FROM rag_query('site', 'markdown heading bold text', 1);

-- Answers cite watched rows by table and key.
CREATE TABLE faq (id int PRIMARY KEY, answer text);
INSERT INTO faq VALUES (7, 'Badges are replaced at the front desk for a fee of five euros.');
SELECT rag_watch('faq', 'site', content => 'answer') > 0;
SELECT rag_wait('site', '30 seconds') AS settled;
SELECT outcome, citations -> 0 -> 'source' AS source, citations -> 0 -> 'source_key' AS source_key
  FROM rag_ask('site', 'Where are badges replaced and what is the fee?');
-- A column whose type's = is not in pg_catalog (pgvector's, here) can be watched: rag's functions run with
-- pg_catalog, rag and pg_temp on their path, and an update is told from the columns' stored images.
CREATE TABLE tagged (id int PRIMARY KEY, body text, tag vector(2));
INSERT INTO tagged VALUES (1, 'The library opens at nine.', '[1,0]');
SELECT rag_watch('tagged', 'site', content => 'body || '' '' || tag::text') > 0 AS watching;
SELECT rag_wait('site', '30 seconds') AS settled;
UPDATE tagged SET tag = '[0,1]' WHERE id = 1;
SELECT rag_wait('site', '30 seconds') AS settled;
SELECT body FROM rag.documents WHERE source = 'tagged';
SELECT rag_unwatch('tagged', drop_documents => true);
DROP TABLE tagged;
-- A key whose type's = is outside pg_catalog (pgvector's btree operator class, here) finds its row: rag names
-- the operator with its schema.
CREATE TABLE vector_keyed (tag vector(2) PRIMARY KEY, body text);
INSERT INTO vector_keyed VALUES ('[1,2]', 'The lift is serviced on Mondays.');
SELECT rag_watch('vector_keyed', 'site', content => 'body') > 0 AS watching;
SELECT rag_wait('site', '30 seconds') AS settled;
SELECT source_key, body, status FROM rag.documents WHERE source = 'vector_keyed';
SELECT rag_unwatch('vector_keyed', drop_documents => true);
DROP TABLE vector_keyed;
-- The worker evaluates watch expressions with rag's own search_path: its session's is pg_catalog, pg_temp,
-- and a function's SET clause replaces that while the function runs.
CREATE TABLE path_probe (id int PRIMARY KEY);
INSERT INTO path_probe VALUES (1);
SELECT rag_watch('path_probe', 'site', content => 'current_setting(''search_path'')') > 0 AS watching;
SELECT rag_wait('site', '30 seconds') AS settled;
SELECT body FROM rag.documents WHERE source = 'path_probe';
SELECT rag_unwatch('path_probe', drop_documents => true);
DROP TABLE path_probe;
SELECT rag_revoke('site', 'watch_reader');
DROP OWNED BY watch_reader;
DROP ROLE watch_reader;
-- REASSIGN OWNED hands a watched table, and its watch's trigger functions, to another role: the new owner's
-- writes are indexed as before. No event trigger fires for that command, so rag's utility hook grants the
-- new owner what rag_watch granted the old one (before, every write failed: permission denied for schema rag),
-- and hands over the old role's collections as well.
CREATE ROLE watch_old_owner IN ROLE rag_admin;
CREATE ROLE watch_new_owner;
GRANT CREATE ON SCHEMA public TO watch_old_owner;
SET ROLE watch_old_owner;
SELECT rag_create_collection('handed-over', embedding_model => 'hash-384') > 0 AS created;
CREATE TABLE public.handed_over (id int PRIMARY KEY, body text);
SELECT rag_watch('public.handed_over', 'handed-over', content => 'body') > 0 AS watching;
RESET ROLE;
-- Run by a role that is no superuser but has the privileges of both, as PostgreSQL asks: the watch's trigger
-- functions live in schema rag, where PostgreSQL lets only a superuser give an object to a role without CREATE
-- there, so rag hands them over first (before, the command failed: permission denied for schema rag).
CREATE ROLE watch_steward IN ROLE watch_old_owner, watch_new_owner;
GRANT CREATE ON SCHEMA public TO watch_new_owner;
SET ROLE watch_steward;
REASSIGN OWNED BY watch_old_owner TO watch_new_owner;
RESET ROLE;
SELECT p.proname ~ '^_watch_[0-9]+(_row)?$' AS trigger_function, pg_get_userbyid(p.proowner) AS owner, count(*)
  FROM pg_proc p WHERE p.pronamespace = 'rag'::regnamespace AND p.proname ~ '^_watch_[0-9]'
   AND p.proowner IN ('watch_old_owner'::regrole, 'watch_new_owner'::regrole) GROUP BY 1, 2;
SELECT pg_get_userbyid(relowner) AS table_owner FROM pg_class WHERE oid = 'public.handed_over'::regclass;
SELECT owner FROM rag.collections WHERE name = 'handed-over';
REVOKE CREATE ON SCHEMA public FROM watch_old_owner;
DROP OWNED BY watch_old_owner;
SET ROLE watch_new_owner;
INSERT INTO public.handed_over VALUES (1, 'Handed over, still indexed.'), (2, 'Deleted by its new owner.');
UPDATE public.handed_over SET body = 'Updated by its new owner.' WHERE id = 1;
DELETE FROM public.handed_over WHERE id = 2;
RESET ROLE;
SELECT rag_wait('handed-over', '30 seconds') AS settled;
SELECT source_key, body FROM rag.documents WHERE source = 'handed_over' ORDER BY 1;
SELECT rag_unwatch('public.handed_over', drop_documents => true);
SELECT rag_drop_collection('handed-over');
DROP TABLE public.handed_over;
DROP OWNED BY watch_new_owner;
DROP ROLE watch_steward, watch_old_owner, watch_new_owner;
-- A watched table renamed, or moved to another schema, goes by its new name in rag_watch_status and its
-- documents' source; a column the watch reads cannot be renamed away from it (the expressions are text), one
-- it does not read can.
CREATE TABLE renamed_later (id int PRIMARY KEY, body text, note text);
INSERT INTO renamed_later VALUES (1, 'Renamed tables keep their index.', 'unread');
SELECT rag_watch('renamed_later', 'site', content => 'body') > 0 AS watching;
SELECT rag_wait('site', '30 seconds') AS settled;
ALTER TABLE renamed_later RENAME TO renamed_now;
CREATE SCHEMA elsewhere;
ALTER TABLE renamed_now SET SCHEMA elsewhere;
SELECT source FROM rag_watch_status() WHERE source LIKE '%renamed%';
SELECT source, metadata->>'source' AS metadata_source FROM rag.documents WHERE watch_id IS NOT NULL AND source LIKE '%renamed%';
ALTER TABLE elsewhere.renamed_now RENAME COLUMN body TO text_body;
ALTER TABLE elsewhere.renamed_now RENAME COLUMN id TO key_renamed;
ALTER TABLE elsewhere.renamed_now RENAME COLUMN note TO remark;
-- A schema renamed renames the watch too.
ALTER SCHEMA elsewhere RENAME TO elsewhere_now;
SELECT source FROM rag_watch_status() WHERE source LIKE '%renamed%';
SELECT rag_unwatch('elsewhere_now.renamed_now', drop_documents => true);
DROP SCHEMA elsewhere_now CASCADE;
-- Through a parent: a partition's watched column renamed on the parent is refused too, and so is a metadata
-- column.
CREATE TABLE renamed_parent (id int, body text, tag text) PARTITION BY RANGE (id);
CREATE TABLE renamed_part PARTITION OF renamed_parent FOR VALUES FROM (0) TO (1000);
ALTER TABLE renamed_part ADD PRIMARY KEY (id);
SELECT rag_watch('renamed_part', 'site', content => 'body', metadata => ARRAY['tag']) > 0 AS watching;
ALTER TABLE renamed_parent RENAME COLUMN body TO body2;
ALTER TABLE renamed_parent RENAME COLUMN tag TO label;
SELECT rag_unwatch('renamed_part', drop_documents => true);
DROP TABLE renamed_parent;
-- Where the columns read are not known (a function of the owner's), the expressions must still analyse.
CREATE FUNCTION public.shouted(t text) RETURNS text LANGUAGE sql IMMUTABLE AS $$ SELECT upper(t) $$;
CREATE TABLE renamed_through_function (id int PRIMARY KEY, body text, other text);
SELECT rag_watch('renamed_through_function', 'site', content => 'public.shouted(body)') > 0 AS watching;
SELECT read_columns IS NULL AS columns_unknown FROM rag.watches WHERE source = 'renamed_through_function'::regclass;
ALTER TABLE renamed_through_function RENAME COLUMN body TO text_body;
ALTER TABLE renamed_through_function RENAME COLUMN other TO another;
SELECT rag_unwatch('renamed_through_function', drop_documents => true);
DROP TABLE renamed_through_function;
DROP FUNCTION public.shouted(text);

-- A watched row's title and metadata are bounded as rag_ingest's are (whoever may write to the table would
-- otherwise size what every reader's results carry): the row fails, with the reason, and the others index.
CREATE TABLE oversized (id int PRIMARY KEY, heading text, body text);
INSERT INTO oversized VALUES (1, repeat('H', 5000), 'An ordinary body.'), (2, 'Short', 'Another ordinary body.');
SELECT rag_watch('oversized', 'site', content => 'body', title => 'heading') > 0 AS watching;
SELECT rag_wait('site', '30 seconds') AS synced;
SELECT count(*) AS indexed FROM rag.documents WHERE watch_id = (SELECT id FROM rag.watches WHERE source = 'oversized'::regclass);
SELECT rows_indexed, last_error FROM rag_watch_status() WHERE source = 'oversized';
SELECT rag_unwatch('oversized', drop_documents => true);
DROP TABLE oversized;

-- Dropping a collection ends its watches, and their triggers are left on the table doing nothing (dropping
-- them would take the table's ACCESS EXCLUSIVE lock). Left as they were, they queued keys for a watch that was
-- gone, which the queue's policy refuses: every write to the table of an owner who is not a superuser failed
-- from then on.
CREATE ROLE watch_dropped_owner;
SELECT rag_create_collection('dropped_with_watch', embedding_model => 'hash-384') > 0 AS created;
CREATE TABLE watched_then_dropped (id int PRIMARY KEY, body text);
INSERT INTO watched_then_dropped VALUES (1, 'Indexed while the collection was there.');
SELECT rag_watch('watched_then_dropped', 'dropped_with_watch', content => 'body') AS dropped_watch \gset
ALTER TABLE watched_then_dropped OWNER TO watch_dropped_owner;
SELECT rag_drop_collection('dropped_with_watch') AS dropped;
SELECT count(*) > 0 AS triggers_left FROM pg_trigger WHERE tgrelid = 'watched_then_dropped'::regclass;
SELECT p.proname = '_watch_' || :dropped_watch AS statement_function, pg_get_userbyid(p.proowner) AS owner,
       p.prosrc LIKE '%RETURN NULL; END' AS does_nothing
  FROM pg_proc p WHERE p.pronamespace = 'rag'::regnamespace
   AND p.proname IN ('_watch_' || :dropped_watch, '_watch_' || :dropped_watch || '_row') ORDER BY 1;
SET ROLE watch_dropped_owner;
INSERT INTO watched_then_dropped VALUES (2, 'Written after the collection was dropped.');
UPDATE watched_then_dropped SET body = 'Changed after the collection was dropped.' WHERE id = 1;
DELETE FROM watched_then_dropped WHERE id = 2;
RESET ROLE;
SELECT count(*) AS rows_left FROM watched_then_dropped;
SELECT count(*) AS batches FROM rag.row_batches WHERE watch_id = :dropped_watch;
-- Nor after the table changes hands again. Its silenced statement function keeps the owner it had (only a
-- watch's own functions follow the table) and still takes the keys the table's row triggers gather, as a
-- function of that watch's which a trigger on the table runs (rag._watch_keys_taken refused it for a while,
-- and every write to the table failed, a superuser's too: review of helper-89's fix).
CREATE ROLE watch_later_owner;
ALTER TABLE watched_then_dropped OWNER TO watch_later_owner;
SELECT pg_get_userbyid(p.proowner) AS statement_function_owner FROM pg_proc p
 WHERE p.pronamespace = 'rag'::regnamespace AND p.proname = '_watch_' || :dropped_watch;
SET ROLE watch_later_owner;
INSERT INTO watched_then_dropped VALUES (3, 'Written by the later owner.');
UPDATE watched_then_dropped SET body = 'Changed by the later owner.' WHERE id = 3;
DELETE FROM watched_then_dropped WHERE id = 3;
RESET ROLE;
INSERT INTO watched_then_dropped VALUES (4, 'Written by a superuser.');
DELETE FROM watched_then_dropped WHERE id = 4;
SELECT count(*) AS rows_left, (SELECT count(*) FROM rag.row_batches WHERE watch_id = :dropped_watch) AS batches
  FROM watched_then_dropped;
ALTER TABLE watched_then_dropped OWNER TO watch_dropped_owner;
DROP ROLE watch_later_owner;
-- Watched again, it gets triggers of its new watch, and its rows are indexed.
SELECT rag_create_collection('dropped_with_watch', embedding_model => 'hash-384') > 0 AS created_again;
SELECT rag_watch('watched_then_dropped', 'dropped_with_watch', content => 'body') AS second_watch \gset
SELECT :second_watch > :dropped_watch AS watched_again;
SELECT rag_wait('dropped_with_watch', '30 seconds') AS synced;
SELECT body FROM rag.documents WHERE watch_id = (SELECT id FROM rag.watches WHERE source = 'watched_then_dropped'::regclass);
-- The old watch's functions, which nothing ran any more, went with its triggers.
SELECT count(*) AS old_functions_left FROM pg_proc WHERE pronamespace = 'rag'::regnamespace
   AND proname IN ('_watch_' || :dropped_watch, '_watch_' || :dropped_watch || '_row');
SELECT rag_drop_collection('dropped_with_watch') AS dropped_again;
-- The table's owner takes the triggers left behind away with rag_unwatch, and the functions they ran.
GRANT rag_admin TO watch_dropped_owner;
SET ROLE watch_dropped_owner;
SELECT rag_unwatch('watched_then_dropped') AS leftovers_dropped;
SELECT rag_unwatch('watched_then_dropped') AS nothing_left;
RESET ROLE;
SELECT count(*) AS triggers_left FROM pg_trigger WHERE tgrelid = 'watched_then_dropped'::regclass;
SELECT count(*) AS functions_left FROM pg_proc WHERE pronamespace = 'rag'::regnamespace
   AND proname IN ('_watch_' || :second_watch, '_watch_' || :second_watch || '_row');
DROP TABLE watched_then_dropped;
DROP OWNED BY watch_dropped_owner;
DROP ROLE watch_dropped_owner;
