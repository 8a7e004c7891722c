-- Security boundaries, tried as an attacker would, with ordinary roles: an owner of a table and a collection,
-- a second rag_admin as the attacker, a writer, a reader and a role with no rag role at all.
CREATE ROLE sec_owner LOGIN IN ROLE rag_admin;
CREATE ROLE sec_attacker LOGIN IN ROLE rag_admin;
CREATE ROLE sec_writer LOGIN IN ROLE rag_writer;
CREATE ROLE sec_reader LOGIN IN ROLE rag_reader;
CREATE ROLE sec_nobody LOGIN;
CREATE SCHEMA sec_owner AUTHORIZATION sec_owner;
CREATE SCHEMA sec_attacker AUTHORIZATION sec_attacker;
CREATE SCHEMA sec_secret;
CREATE TABLE sec_secret.vault (id int PRIMARY KEY, body text);
INSERT INTO sec_secret.vault VALUES (1, 'the launch code is 0000');
CREATE FUNCTION pg_temp.wait_for(p_condition text) RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    v_done boolean;
BEGIN
    FOR i IN 1..600 LOOP
        EXECUTE p_condition INTO v_done;
        IF v_done THEN
            RETURN true;
        END IF;
        PERFORM pg_sleep(0.05);
    END LOOP;
    RETURN false;
END $$;

------------------------------------------------------------------------------------------------------------
-- 1. A rag_admin cannot become superuser through a watch expression. The attacker's function promotes the
-- attacker whenever it runs as a superuser; it runs when the watch is checked, reindexed, counted (also when
-- a superuser asks for the status) and read by the worker.
SET ROLE sec_attacker;
SELECT rag_create_collection('attacker-notes', embedding_model => 'hash-384') > 0 AS created;
CREATE TABLE sec_attacker.notes (id int PRIMARY KEY, body text);
INSERT INTO sec_attacker.notes VALUES (1, 'an ordinary note');
CREATE FUNCTION sec_attacker.escalate(t text) RETURNS text LANGUAGE plpgsql AS $f$
BEGIN
    IF (SELECT rolsuper FROM pg_roles WHERE rolname = current_user) THEN
        EXECUTE 'ALTER ROLE sec_attacker SUPERUSER';
    END IF;
    RETURN t;
END $f$;
SELECT rag_watch('sec_attacker.notes', 'attacker-notes', content => 'sec_attacker.escalate(body)',
                 filter => 'sec_attacker.escalate(body) IS NOT NULL') > 0 AS watching;
SELECT rag_reindex('sec_attacker.notes'::regclass) > 0 AS queued;
RESET ROLE;
SELECT source, rows_watched FROM rag_watch_status() WHERE source = 'sec_attacker.notes';
SELECT rag_reindex('sec_attacker.notes'::regclass) > 0 AS queued_by_superuser;
SELECT pg_temp.wait_for($$SELECT NOT EXISTS (SELECT 1 FROM rag.row_queue q JOIN rag.watches w ON w.id = q.watch_id
                                              WHERE w.source_name = 'sec_attacker.notes' AND q.last_error IS NULL)$$) AS worker_done;
SELECT rolsuper AS attacker_is_superuser FROM pg_roles WHERE rolname = 'sec_attacker';

-- 1b. Nor through the type of a watched key: the domain's check promotes the attacker whenever it runs as a
-- superuser. The worker reads back the keys a statement trigger wrote as numbers, never through the domain.
SET ROLE sec_attacker;
CREATE FUNCTION sec_attacker.escalate_key(k integer) RETURNS boolean LANGUAGE plpgsql AS $f$
BEGIN
    IF (SELECT rolsuper FROM pg_roles WHERE rolname = current_user) THEN
        EXECUTE 'ALTER ROLE sec_attacker SUPERUSER';
    END IF;
    RETURN true;
END $f$;
CREATE DOMAIN sec_attacker.note_no AS integer CHECK (sec_attacker.escalate_key(VALUE));
CREATE TABLE sec_attacker.keyed (id sec_attacker.note_no PRIMARY KEY, body text);
SELECT rag_watch('sec_attacker.keyed', 'attacker-notes', content => 'body') > 0 AS watching;
INSERT INTO sec_attacker.keyed VALUES (1, 'a keyed note'), (2, 'another keyed note');
DELETE FROM sec_attacker.keyed WHERE id = 2;
RESET ROLE;
SELECT pg_temp.wait_for($$SELECT NOT EXISTS (SELECT 1 FROM rag.row_batches)
                           AND NOT EXISTS (SELECT 1 FROM rag.row_queue q JOIN rag.watches w ON w.id = q.watch_id
                                            WHERE w.source_name = 'sec_attacker.keyed')$$) AS worker_done;
SELECT rolsuper AS attacker_is_superuser FROM pg_roles WHERE rolname = 'sec_attacker';
SELECT source_key, body FROM rag.documents WHERE source = 'sec_attacker.keyed' ORDER BY source_key::text;
SET ROLE sec_attacker;
SELECT rag_unwatch('sec_attacker.keyed', drop_documents => true);
RESET ROLE;

-- 2. An expression cannot leave the owner's rights: set_config('role', ...) and SET ROLE fail inside it, so
-- nothing it reads with more rights reaches the collection.
SET ROLE sec_attacker;
CREATE FUNCTION sec_attacker.steal(t text) RETURNS text LANGUAGE plpgsql AS $f$
BEGIN
    PERFORM set_config('role', 'none', true);
    RETURN (SELECT string_agg(body, ',') FROM sec_secret.vault);
END $f$;
SELECT rag_unwatch('sec_attacker.notes', drop_documents => true);
SELECT rag_watch('sec_attacker.notes', 'attacker-notes', content => 'sec_attacker.steal(body)') > 0 AS watching;
RESET ROLE;
SELECT pg_temp.wait_for($$SELECT EXISTS (SELECT 1 FROM rag.row_queue WHERE last_error IS NOT NULL)$$) AS worker_tried;
SELECT last_error FROM rag.row_queue;
-- A row whose try failed waits out its back-off as failed: rag_wait does not wait for it.
SELECT rag_wait('attacker-notes', '20 seconds') AS failed_row_not_waited_for;
SELECT count(*) AS secret_in_collection FROM rag.documents WHERE body LIKE '%launch code%';
SET ROLE sec_attacker;
SELECT rag_unwatch('sec_attacker.notes', drop_documents => true);

-- 3. An expression is one expression, as PostgreSQL's parser reads it: nothing is smuggled in with a quote
-- trick, a comment, a clause, a second target or a temporary function.
SELECT rag_watch('sec_attacker.notes', 'attacker-notes',
                 content => $$body'\' ) ; CREATE TABLE sec_attacker.pwn AS SELECT rolname FROM pg_authid ; SELECT 1 --'$$);
SELECT rag_watch('sec_attacker.notes', 'attacker-notes', content => 'body FROM pg_authid');
SELECT rag_watch('sec_attacker.notes', 'attacker-notes', content => 'body, body');
SELECT rag_watch('sec_attacker.notes', 'attacker-notes', content => 'body AS x');
SELECT rag_watch('sec_attacker.notes', 'attacker-notes', content => 'pg_temp.f(body)');
SELECT rag_watch('sec_attacker.notes', 'attacker-notes', content => 'body /* unterminated');
SELECT to_regclass('sec_attacker.pwn') AS smuggled_table;
-- A trailing comment is harmless: the expression is read alone, and placed on a line of its own.
SELECT rag_watch('sec_attacker.notes', 'attacker-notes', content => 'body -- the note') > 0 AS watching;
SELECT rag_unwatch('sec_attacker.notes', drop_documents => true);
RESET ROLE;

------------------------------------------------------------------------------------------------------------
-- 4. Collections have an owner; others need a grant.
SET ROLE sec_owner;
SELECT rag_create_collection('owner-docs', embedding_model => 'hash-384', max_distance => 2) > 0 AS created;
SELECT rag_ingest('owner-docs', 'Payroll', 'Salaries are paid on the last working day of the month.') > 0 AS ingested;
RESET ROLE;
SELECT pg_temp.wait_for($$SELECT rag_wait('owner-docs', '30 seconds')$$) AS ready;
SELECT c.name, c.owner FROM rag.collections c WHERE c.name = 'owner-docs';

-- The attacker is a rag_admin, but not of this collection.
SET ROLE sec_attacker;
SELECT rag_drop_collection('owner-docs');
SELECT rag_set_embedding_model('owner-docs', 'hash-768');
SELECT rag_reindex('owner-docs');
SELECT rag_grant('owner-docs', 'sec_attacker', 'admin');
SELECT rag_ingest('owner-docs', 'Planted', 'Planted text.');
SELECT title FROM rag_query('owner-docs', 'when are salaries paid');
SELECT count(*) AS chunks_visible FROM rag.chunks;
SELECT name FROM rag.collections ORDER BY 1;
SELECT collection FROM rag.status ORDER BY 1;
RESET ROLE;

-- Reader and writer without grants: nothing.
SET ROLE sec_reader;
SELECT title FROM rag_query('owner-docs', 'when are salaries paid');
SELECT answer FROM rag_ask('owner-docs', 'when are salaries paid');
SELECT rag_prompt('owner-docs', 'when are salaries paid');
SELECT count(*) AS documents_visible FROM rag.documents;
SELECT count(*) AS chunks_visible FROM rag.chunks;
RESET ROLE;
SELECT min(d.id) AS owner_document FROM rag.documents d JOIN rag.collections c ON c.id = d.collection_id
 WHERE c.name = 'owner-docs' \gset
SET ROLE sec_writer;
-- A document of a collection the writer may not even read: answered as one that does not exist (the refusal
-- named the collection and its owner, so trying ids listed every collection: red team 16).
SELECT rag_delete_document(:owner_document);
SELECT rag_ingest('owner-docs', 'Planted', 'Planted text.');
RESET ROLE;
SET ROLE sec_nobody;
SELECT title FROM rag_query('owner-docs', 'when are salaries paid');
SELECT count(*) FROM rag.chunks;
RESET ROLE;

-- The owner grants; granted roles may then do what their grant says, and no more.
SET ROLE sec_owner;
SELECT rag_grant('owner-docs', 'sec_reader', 'read');
SELECT rag_grant('owner-docs', 'sec_writer', 'write');
SELECT rag_grant('owner-docs', 'sec_reader', 'superpowers');
SELECT rag_grant('owner-docs', 'no_such_role', 'read');
SELECT grantee, privilege FROM rag.collection_grants ORDER BY 1::text;
RESET ROLE;
SET ROLE sec_reader;
SELECT title FROM rag_query('owner-docs', 'when are salaries paid', 1);
SELECT outcome FROM rag_ask('owner-docs', 'when are salaries paid');
SELECT count(*) AS documents_visible FROM rag.documents;
SELECT rag_ingest('owner-docs', 'Planted', 'Planted text.');
SELECT count(*) AS own_ledger_rows FROM rag.queries;
SELECT DISTINCT role FROM rag.queries;
RESET ROLE;
SET ROLE sec_writer;
SELECT rag_ingest('owner-docs', 'Holidays', 'Staff get twenty-five days of paid holiday a year.') > 0 AS ingested;
SELECT rag_drop_collection('owner-docs');
RESET ROLE;
-- A revoked grant is gone at once.
SET ROLE sec_owner;
SELECT rag_revoke('owner-docs', 'sec_writer');
RESET ROLE;
SET ROLE sec_writer;
SELECT rag_ingest('owner-docs', 'After revoke', 'Revoked writers cannot ingest.');
RESET ROLE;

------------------------------------------------------------------------------------------------------------
-- 5. Retrieval honours the source table: a reader sees chunks of watched rows only when they could SELECT
-- the row now, under the table's row-level security and column privileges; k is still filled.
SET ROLE sec_owner;
CREATE TABLE sec_owner.tickets (id int PRIMARY KEY, author name NOT NULL, body text NOT NULL);
ALTER TABLE sec_owner.tickets ENABLE ROW LEVEL SECURITY;
CREATE POLICY own_tickets ON sec_owner.tickets USING (author = current_user);
GRANT SELECT ON sec_owner.tickets TO sec_reader, sec_writer;
GRANT USAGE ON SCHEMA sec_owner TO sec_reader, sec_writer;
INSERT INTO sec_owner.tickets
SELECT i, CASE WHEN i % 4 = 0 THEN 'sec_reader' ELSE 'sec_writer' END,
       'Ticket ' || i || ': the printer on floor ' || i || ' is out of toner again.'
  FROM generate_series(1, 40) i;
SELECT rag_create_collection('tickets', embedding_model => 'hash-384', max_distance => 2) > 0 AS created;
SELECT rag_watch('sec_owner.tickets', 'tickets', content => 'body') > 0 AS watching;
SELECT rag_grant('tickets', 'sec_reader', 'read');
SELECT rag_grant('tickets', 'sec_writer', 'read');
RESET ROLE;
SELECT pg_temp.wait_for($$SELECT (SELECT count(*) FROM rag.documents d JOIN rag.collections c ON c.id = d.collection_id
                                   WHERE c.name = 'tickets' AND d.status = 'ready') = 40$$) AS all_indexed;
SET ROLE sec_reader;
-- Ten of the forty tickets are the reader's: every hit is one of them, and k = 8 is filled.
SELECT count(*) AS hits, count(*) FILTER (WHERE (source_key->>'id')::int % 4 = 0) AS own_hits
  FROM rag_query('tickets', 'printer out of toner', 8);
-- The same in vector mode, whose search skips the join to rag.documents for a collection that watches no
-- table: this one watches one, so its plan joins the documents and every row is checked.
SELECT count(*) AS vector_hits, count(*) FILTER (WHERE (source_key->>'id')::int % 4 = 0) AS own_vector_hits
  FROM rag_query('tickets', 'printer out of toner', 8, mode => 'vector');
SELECT count(*) FILTER (WHERE line ~ 'on documents') > 0 AS rows_checked
  FROM rag_explain('tickets', 'printer out of toner', mode => 'vector') AS line;
RESET ROLE;
-- The plan a reader is shown is the one the search runs (as the extension's owner, as rag_query does), the
-- same a superuser is shown: not the reader's own row-level security over rag.chunks.
-- (But for the words it searches: the superuser's are pruned by how common they are among all the chunks,
-- and the reader, who may not read every ticket, keeps the question's own, below. "7" is kept for both.)
SELECT string_agg(regexp_replace(line, '''[^:]*::tsquery', 'WORDS', 'g'), E'\n') AS superuser_plan
  FROM rag_explain('tickets', 'toner on floor 7') AS line \gset
SET ROLE sec_reader;
SELECT string_agg(regexp_replace(line, '''[^:]*::tsquery', 'WORDS', 'g'), E'\n') = :'superuser_plan'
           AS readers_plan_is_the_searchs
  FROM rag_explain('tickets', 'toner on floor 7') AS line;
RESET ROLE;
-- Which words the search keeps tells nothing of rows the reader may not read: a word only a hidden ticket holds
-- and a word no ticket holds are both kept for the reader, where a superuser's search drops the one no chunk
-- holds.
SET ROLE sec_owner;
UPDATE sec_owner.tickets SET body = body || ' zanzibar' WHERE id = 2;
RESET ROLE;
SELECT rag_wait('tickets', '30 seconds') AS synced;
SELECT bool_or(line ~ 'zanzibar') AS superuser_keeps_the_hidden_word, bool_or(line ~ 'qqqnowher') AS and_the_absent_one
  FROM rag_explain('tickets', 'zanzibar qqqnowhere', mode => 'keyword') AS line;
SET ROLE sec_reader;
SELECT bool_or(line ~ 'zanzibar') AS reader_keeps_the_hidden_word, bool_or(line ~ 'qqqnowher') AS and_the_absent_one
  FROM rag_explain('tickets', 'zanzibar qqqnowhere', mode => 'keyword') AS line;
RESET ROLE;
-- Nor what the search adds to the reader's own statistics (red team 17): compared around a search, the
-- per-transaction counters of the watched table and of the collection's partition counted one scan per row
-- checked and one fetch per full-text match, hidden rows included, so a word only a hidden ticket holds moved
-- them more than a word no ticket holds. A search by someone who holds the collection whole is counted.
SELECT format($$SELECT coalesce(sum(seq_scan + seq_tup_read + coalesce(idx_scan, 0) + coalesce(idx_tup_fetch, 0)), 0)
                    FROM pg_stat_xact_all_tables WHERE relid IN ('sec_owner.tickets'::regclass, %L::regclass)$$,
              'rag.' || rag._chunk_partition(id)) AS counters
  FROM rag.collections WHERE name = 'tickets' \gset
-- Analyzed first, so that autovacuum's ANALYZE cannot change the plan between the two searches compared.
ANALYZE sec_owner.tickets, rag.chunks, rag.documents, rag.row_queue, rag.row_batches;
BEGIN;
SELECT count(*) >= 0 AS searched FROM rag_query('tickets', 'zanzibar', 5);
SELECT (:counters) > 0 AS whole_holders_search_counted;
ROLLBACK;
SET ROLE sec_reader;
BEGIN;
SELECT (:counters) AS before_hidden \gset
SELECT count(*) AS hidden_word_hits FROM rag_query('tickets', 'zanzibar', 5, mode => 'keyword');
SELECT (:counters) AS after_hidden \gset
SELECT count(*) AS absent_word_hits FROM rag_query('tickets', 'qqqnowhere', 5, mode => 'keyword');
SELECT (:counters) - :after_hidden = :after_hidden - :before_hidden AS counters_tell_nothing;
ROLLBACK;
RESET ROLE;
SET ROLE sec_owner;
UPDATE sec_owner.tickets SET body = replace(body, ' zanzibar', '') WHERE id = 2;
RESET ROLE;
SELECT rag_wait('tickets', '30 seconds') AS synced;
-- The search without row checks returns nothing at all once the collection watches a table, in its own
-- snapshot: a watch made after rag._search looked for one (rag._watched) never lets an unchecked row through,
-- and rag._search runs the checked search when it finds nothing.
SELECT rag._search_sql(c, 'vector', false, true, false, false) AS unchecked_sql,
       (SELECT e.vector FROM rag._embed_query_in(c.id, 'printer out of toner', c.embedding_provider, c.embedding_model, c.query_prefix, c.dimensions) e) AS printer_vector
  FROM rag.collections c WHERE c.name = 'tickets' \gset
PREPARE unchecked_search(text, integer, jsonb, tsquery, integer) AS :unchecked_sql;
EXECUTE unchecked_search(:'printer_vector', 8, NULL, NULL, 8);
DEALLOCATE unchecked_search;
SET ROLE sec_reader;
-- Asked for 12, the reader gets at most its 10 (HNSW is approximate: on this tiny graph, rebuilt by every
-- watched-row sync, an entry can go unreached: one full test run here returned 9).
SELECT count(*) BETWEEN 8 AND 10 AS at_most_its_own, bool_and(content LIKE 'Ticket %') AS all_tickets
  FROM rag_query('tickets', 'printer out of toner', 12);
SELECT count(*) > 0 AS cited, bool_and((c->'source_key'->>'id')::int % 4 = 0) AS cited_only_own
  FROM rag_ask('tickets', 'which printer is out of toner', k => 8) a
 CROSS JOIN LATERAL jsonb_array_elements(a.citations) c;
RESET ROLE;
SET ROLE sec_writer;
SELECT count(*) AS hits, count(*) FILTER (WHERE (source_key->>'id')::int % 4 <> 0) AS own_hits
  FROM rag_query('tickets', 'printer out of toner', 8);
RESET ROLE;
-- The table's policies run as the reader with the reader's own search_path, as in the reader's own SELECT:
-- a policy whose function names a table without its schema (and has no SET search_path) finds it on the
-- reader's path. Here the owner delegates ticket 1 (the writer's) to the reader through such a function.
SET ROLE sec_owner;
CREATE TABLE sec_owner.ticket_delegates (ticket int NOT NULL, who name NOT NULL);
INSERT INTO sec_owner.ticket_delegates VALUES (1, 'sec_reader');
GRANT SELECT ON sec_owner.ticket_delegates TO sec_reader, sec_writer;
CREATE FUNCTION sec_owner.delegated(p_ticket int) RETURNS boolean LANGUAGE sql STABLE
    AS $$ SELECT EXISTS (SELECT 1 FROM ticket_delegates WHERE ticket = p_ticket AND who = current_user) $$;
CREATE POLICY delegated_tickets ON sec_owner.tickets FOR SELECT USING (sec_owner.delegated(id));
RESET ROLE;
SET ROLE sec_reader;
SET search_path = sec_owner, public;
SELECT count(*) AS readable_directly, count(*) FILTER (WHERE id = 1) AS delegated_directly FROM sec_owner.tickets;
-- Ticket 1 is the only one whose text has the word "1" (keyword mode: exact, unlike HNSW on a tiny graph); the
-- reader's own tickets match "floor".
SELECT count(*) FILTER (WHERE source_key->>'id' = '1') AS delegated_hits,
       bool_and(source_key->>'id' = '1' OR (source_key->>'id')::int % 4 = 0) AS only_readable
  FROM rag_query('tickets', 'floor 1', 5, mode => 'keyword');
SELECT count(*) FILTER (WHERE (source_key->>'id')::int % 4 <> 0 AND source_key->>'id' <> '1') AS others_found
  FROM rag_query('tickets', 'printer out of toner', 40, mode => 'keyword');
-- The query that looks a row up is built once per watch and command (rag._row_lookup_sql): a rename later in
-- the same transaction is seen by the next search, which would otherwise name a table that is gone.
BEGIN;
SELECT count(*) FILTER (WHERE source_key->>'id' = '1') AS before_rename FROM rag_query('tickets', 'floor 1', 5, mode => 'keyword');
RESET ROLE;
ALTER TABLE sec_owner.tickets RENAME TO tickets_renamed;
SET ROLE sec_reader;
SELECT count(*) FILTER (WHERE source_key->>'id' = '1') AS after_rename FROM rag_query('tickets', 'floor 1', 5, mode => 'keyword');
ROLLBACK;
-- Where the reader's own SELECT fails (the function's table is not on the path), so does the search, with
-- PostgreSQL's own error.
SET search_path = public;
\set VERBOSITY terse
SELECT count(*) FROM sec_owner.tickets;
SELECT count(*) FROM rag_query('tickets', 'floor 1', 5, mode => 'keyword');
\set VERBOSITY default
RESET search_path;
RESET ROLE;
-- rag's own query for the row names the watched table with its schema: a reader's search_path that puts a
-- schema of theirs with an empty table of the same name first still finds ticket 1 in sec_owner.tickets.
CREATE SCHEMA sec_reader_own AUTHORIZATION sec_reader;
SET ROLE sec_reader;
CREATE TABLE sec_reader_own.tickets (id int PRIMARY KEY, author name, body text);
SET search_path = sec_reader_own, sec_owner, public;
SELECT count(*) FILTER (WHERE source_key->>'id' = '1') AS delegated_hits_behind_own_schema FROM rag_query('tickets', 'floor 1', 5, mode => 'keyword');
RESET search_path;
RESET ROLE;
DROP SCHEMA sec_reader_own CASCADE;
-- The row check's statement is prepared once per backend and kept (rag._query_as): once the owner drops the
-- policy that delegated ticket 1, the reader's next search in the same session, on the same path, no longer
-- finds it.
SET ROLE sec_reader;
SET search_path = sec_owner, public;
SELECT count(*) FILTER (WHERE source_key->>'id' = '1') AS delegated_hits_before_the_policy_is_dropped FROM rag_query('tickets', 'floor 1', 5, mode => 'keyword');
SET ROLE sec_owner;
DROP POLICY delegated_tickets ON sec_owner.tickets;
SET ROLE sec_reader;
SELECT count(*) FILTER (WHERE source_key->>'id' = '1') AS delegated_hits_after_the_policy_is_gone FROM rag_query('tickets', 'floor 1', 5, mode => 'keyword');
RESET search_path;
SET ROLE sec_owner;
DROP FUNCTION sec_owner.delegated(int);
DROP TABLE sec_owner.ticket_delegates;
RESET ROLE;
-- A plain SELECT of the extension's tables keeps the table's rules too. This table shows the reader only
-- some of its rows (row-level security), so a plain SELECT shows none of its documents or chunks, and runs
-- none of the owner's policies to find out which: retrieval, above, checks each row by key.
SET ROLE sec_reader;
SELECT count(*) AS documents_visible, count(*) FILTER (WHERE (d.source_key->>'id')::int % 4 = 0) AS own_documents
  FROM rag.documents d JOIN rag.collections c ON c.id = d.collection_id WHERE c.name = 'tickets';
SELECT count(*) AS chunks_visible, bool_and(substring(ch.content from '^Ticket ([0-9]+):')::int % 4 = 0) AS only_own_chunks
  FROM rag.chunks ch JOIN rag.collections c ON c.id = ch.collection_id WHERE c.name = 'tickets';
SELECT count(*) AS other_tickets_by_any_route
  FROM rag.documents d WHERE d.body ~ '^Ticket [0-9]+:' AND (d.source_key->>'id')::int % 4 <> 0;
RESET ROLE;
-- An admin of the collection who does not own the table may stop the watch, but not keep its rows as ordinary
-- documents that every reader of the collection would read.
SET ROLE sec_owner;
SELECT rag_grant('tickets', 'sec_attacker', 'admin');
RESET ROLE;
SELECT 'sec_owner.tickets'::regclass::oid AS tickets_oid \gset
SET ROLE sec_attacker;
SELECT rag_unwatch(:'tickets_oid');
SELECT rag_unwatch(:'tickets_oid', drop_documents => false);
RESET ROLE;
SET ROLE sec_owner;
SELECT rag_revoke('tickets', 'sec_attacker');
SELECT count(*) AS still_watched FROM rag.watches WHERE source_name = 'sec_owner.tickets';
RESET ROLE;
-- Without SELECT on the column that is indexed, nothing from the table is visible.
SET ROLE sec_owner;
REVOKE SELECT ON sec_owner.tickets FROM sec_reader;
GRANT SELECT (id, author) ON sec_owner.tickets TO sec_reader;
RESET ROLE;
SET ROLE sec_reader;
SELECT count(*) AS hits_without_body_privilege FROM rag_query('tickets', 'printer out of toner', 8);
RESET ROLE;
-- The owner bypasses row-level security on their own table, as PostgreSQL does.
SET ROLE sec_owner;
SELECT count(*) AS owner_hits FROM rag_query('tickets', 'printer out of toner', 8);
RESET ROLE;

-- The attacker cannot unwatch or reindex someone else's table, nor queue keys for it.
SELECT 'sec_owner.tickets'::regclass::oid AS tickets, (SELECT id FROM rag.watches WHERE source_name = 'sec_owner.tickets') AS tickets_watch \gset
SET ROLE sec_attacker;
SELECT rag_unwatch(:'tickets');
SELECT rag_reindex(:'tickets'::regclass);
INSERT INTO rag.row_batches (watch_id, keys) VALUES (:tickets_watch, '[1]');
-- Nor by putting the watch's trigger functions on a table of their own: its statement trigger runs as the
-- watched table's owner and would queue the decoy's keys for that watch. The row trigger that gathers keys may
-- be put there (the owner of a watched table may create it, for a restore), but what it gathers on another
-- table is never taken for the watch: the commit warns instead.
SELECT format('rag.%I', '_watch_' || :tickets_watch) AS tickets_function \gset
CREATE TABLE sec_attacker.decoy (id int PRIMARY KEY);
CREATE FUNCTION pg_temp.attempt(p_sql text) RETURNS text LANGUAGE plpgsql AS $f$
BEGIN
    EXECUTE p_sql;
    RETURN 'done';
EXCEPTION WHEN OTHERS THEN
    -- The watch's number depends on the tests before this one.
    RETURN SQLSTATE || ' ' || regexp_replace(SQLERRM, '_watch_[0-9]+', '_watch_N');
END $f$;
SELECT pg_temp.attempt(format('CREATE TRIGGER decoy_queue AFTER INSERT ON sec_attacker.decoy FOR EACH STATEMENT EXECUTE FUNCTION %s()',
                              :'tickets_function')) AS attaching_the_watch_function;
-- Nor may they execute any watch's statement or row function (a watch in 'statement' or 'rows' mode has both:
-- one of a composite key is made for the look).
RESET ROLE;
SET ROLE sec_owner;
CREATE TABLE sec_owner.ticket_pairs (a int, b int, body text, PRIMARY KEY (a, b));
SELECT rag_create_collection('ticket-pairs', embedding_model => 'hash-384') > 0 AS created;
SELECT rag_watch('sec_owner.ticket_pairs', 'ticket-pairs', content => 'body') > 0 AS watching_pairs;
RESET ROLE;
SET ROLE sec_attacker;
SELECT count(*) FILTER (WHERE p.proname !~ '_row$') > 0 AS statement_functions_exist,
       count(*) FILTER (WHERE p.proname ~ '_row$') > 0 AS row_functions_exist,
       count(*) FILTER (WHERE has_function_privilege('sec_attacker', p.oid, 'EXECUTE')) AS attacker_may_execute
  FROM pg_proc p WHERE p.pronamespace = 'rag'::regnamespace AND p.proname ~ '^_watch_[0-9]+(_row)?$';
RESET ROLE;
SET ROLE sec_owner;
DROP TABLE sec_owner.ticket_pairs;
SELECT rag_drop_collection('ticket-pairs');
RESET ROLE;
SET ROLE sec_attacker;
CREATE TRIGGER decoy_keys AFTER INSERT ON sec_attacker.decoy FOR EACH ROW EXECUTE FUNCTION rag._watch_key(:'tickets_watch', 'id');
-- Counted in the inserting transaction, before the worker could spread a batch into the row queue.
BEGIN;
INSERT INTO sec_attacker.decoy VALUES (424242);
RESET ROLE;
SELECT count(*) AS decoy_batches FROM rag.row_batches
 WHERE watch_id = :tickets_watch AND coalesce(key_values, keys::text) LIKE '%424242%';
COMMIT;
SET ROLE sec_attacker;
DROP TABLE sec_attacker.decoy;
RESET ROLE;
-- Not even the table's owner writes batches outside its triggers.
SET ROLE sec_owner;
INSERT INTO rag.row_batches (watch_id, keys) VALUES (:tickets_watch, '[1]');
RESET ROLE;

------------------------------------------------------------------------------------------------------------
-- 6. Functions and operators created in public by an ordinary user never run inside the extension's code.
GRANT CREATE ON SCHEMA public TO PUBLIC;
SET ROLE sec_nobody;
CREATE TABLE public.sec_shadow_log (what text);
GRANT INSERT ON public.sec_shadow_log TO PUBLIC;
CREATE FUNCTION public.btrim(text) RETURNS text LANGUAGE plpgsql AS $f$
BEGIN INSERT INTO public.sec_shadow_log VALUES (pg_catalog.concat('btrim as ', current_user)); RETURN pg_catalog.btrim($1); END $f$;
CREATE FUNCTION public.jsonb_typeof(jsonb) RETURNS text LANGUAGE plpgsql AS $f$
BEGIN INSERT INTO public.sec_shadow_log VALUES (pg_catalog.concat('jsonb_typeof as ', current_user)); RETURN pg_catalog.jsonb_typeof($1); END $f$;
CREATE FUNCTION public.sha256(bytea) RETURNS bytea LANGUAGE plpgsql AS $f$
BEGIN INSERT INTO public.sec_shadow_log VALUES (pg_catalog.concat('sha256 as ', current_user)); RETURN pg_catalog.sha256($1); END $f$;
CREATE FUNCTION public.trim_scale(numeric) RETURNS numeric LANGUAGE plpgsql AS $f$
BEGIN INSERT INTO public.sec_shadow_log VALUES (pg_catalog.concat('trim_scale as ', current_user)); RETURN pg_catalog.trim_scale($1); END $f$;
CREATE FUNCTION public.sec_texteq(text, text) RETURNS boolean LANGUAGE plpgsql AS $f$
BEGIN INSERT INTO public.sec_shadow_log VALUES (pg_catalog.concat('= as ', current_user)); RETURN pg_catalog.texteq($1, $2); END $f$;
CREATE OPERATOR public.= (LEFTARG = text, RIGHTARG = text, FUNCTION = public.sec_texteq);
-- Closer matches than any built-in for calls rag makes (numeric * integer; pg_sleep of a numeric literal;
-- unknown || name): found first wherever public is on the path, so rag's functions keep it off theirs.
CREATE FUNCTION public.sec_numeric_times(numeric, integer) RETURNS numeric LANGUAGE plpgsql AS $f$
BEGIN INSERT INTO public.sec_shadow_log VALUES (pg_catalog.concat('* as ', current_user)); RETURN $1 OPERATOR(pg_catalog.*) $2::numeric; END $f$;
CREATE OPERATOR public.* (LEFTARG = numeric, RIGHTARG = integer, FUNCTION = public.sec_numeric_times);
CREATE FUNCTION public.pg_sleep(numeric) RETURNS void LANGUAGE plpgsql AS $f$
BEGIN INSERT INTO public.sec_shadow_log VALUES (pg_catalog.concat('pg_sleep as ', current_user)); PERFORM pg_catalog.pg_sleep($1::double precision); END $f$;
CREATE FUNCTION public.sec_text_name(text, name) RETURNS text LANGUAGE plpgsql AS $f$
BEGIN INSERT INTO public.sec_shadow_log VALUES (pg_catalog.concat('|| as ', current_user)); RETURN pg_catalog.textcat($1, $2::text); END $f$;
CREATE OPERATOR public.|| (LEFTARG = text, RIGHTARG = name, FUNCTION = public.sec_text_name);
RESET ROLE;
-- As in a session that starts after the attacker's objects exist: plans made before them are made again.
DISCARD PLANS;
SET ROLE sec_owner;
SELECT rag_ingest('owner-docs', 'Shadowed', 'Shadow functions never run here.', '{"kind": "test"}') > 0 AS ingested;
SELECT rag_wait('owner-docs', '30 seconds') AS embedded;
SELECT count(*) > 0 AS found FROM rag_query('owner-docs', 'when are salaries paid', filter => '{"kind": "test"}');
SELECT outcome FROM rag_ask('owner-docs', 'when are salaries paid');
SELECT rag_drop_collection('attacker-notes');
RESET ROLE;
SELECT rag_process_queue() >= 0 AS processed;
SELECT count(*) >= 0 AS watch_status_read FROM rag_watch_status();
SELECT what AS shadow_that_ran, count(*) FROM public.sec_shadow_log GROUP BY 1 ORDER BY 1;
DROP OPERATOR public.= (text, text);
DROP OPERATOR public.* (numeric, integer);
DROP OPERATOR public.|| (text, name);
DROP FUNCTION public.sec_texteq(text, text), public.btrim(text), public.jsonb_typeof(jsonb), public.sha256(bytea),
              public.trim_scale(numeric), public.sec_numeric_times(numeric, integer), public.pg_sleep(numeric),
              public.sec_text_name(text, name);
DROP TABLE public.sec_shadow_log;
REVOKE CREATE ON SCHEMA public FROM PUBLIC;
-- Every function of the extension runs with pg_catalog, rag and pg_temp on its path and nothing else (no
-- schema others may create objects in), but the planner support function, the row trigger that gathers a
-- watch's keys and the guard of rag's tables, which run no SQL (a SET clause would put every planning of a
-- call to rag, or every row written to a watched table or to rag.chunks, through the definer call handler), and the entry points'
-- wrappers, which run as their caller with the caller's path and call their body by its schema (00_install
-- pins their text).
SELECT count(*) AS functions_with_another_path
  FROM pg_proc p JOIN pg_depend d ON d.objid = p.oid AND d.classid = 'pg_proc'::regclass AND d.deptype = 'e'
 WHERE d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'rag')
   AND NOT EXISTS (SELECT 1 FROM unnest(p.proconfig) s WHERE s = 'search_path=pg_catalog, rag, pg_temp')
   AND p.oid NOT IN ('rag._load_library(internal)'::regprocedure, 'rag._watch_key()'::regprocedure,
                   'rag._written_by_rag_only()'::regprocedure)
   AND p.prokind <> 'p'  -- rag_await, which may not have a SET clause (00_install)
   AND NOT (NOT p.prosecdef AND p.prosrc LIKE 'SELECT %rag\_definer.' || p.proname || '(%'
            AND p.pronamespace IN ((SELECT extnamespace FROM pg_extension WHERE extname = 'rag'), 'rag'::regnamespace));
SELECT p.oid::regprocedure AS function, p.proconfig IS NULL AS unconfigured, NOT p.prosecdef AS invoker,
       p.prolang = (SELECT oid FROM pg_language WHERE lanname = 'c') AS in_c
  FROM pg_proc p WHERE p.oid IN ('rag._load_library(internal)'::regprocedure, 'rag._watch_key()'::regprocedure,
                   'rag._written_by_rag_only()'::regprocedure)
 ORDER BY p.proname;

------------------------------------------------------------------------------------------------------------
-- 7. Keys go only where a superuser allowed them.
SET ROLE sec_attacker;
SELECT rag_create_provider('exfiltrate', 'openai', base_url => 'http://127.0.0.1:9/v1', api_key_setting => 'rag.openai_api_key');
SELECT rag_allow_key('rag.openai_api_key', 'http://127.0.0.1:9/v1');
SELECT rag_create_provider('keyless', 'openai', base_url => 'http://127.0.0.1:9/v1');
-- A provider's URL names a server and a path prefix: a query or fragment would swallow the route rag appends
-- (any path of any server the database reaches), and user-info would be sent as credentials.
SELECT rag_create_provider('anypath', 'openai', base_url => 'http://127.0.0.1:9/admin/secrets?x=');
SELECT rag_create_provider('anypath', 'openai', base_url => 'http://127.0.0.1:9/admin/secrets#');
SELECT rag_create_provider('anypath', 'openai', base_url => 'http://user:pass@127.0.0.1:9/v1');
SELECT name, api_key_setting FROM rag.providers WHERE name = 'keyless';
RESET ROLE;
SELECT rag_allow_key('rag.openai_api_key', 'http://127.0.0.1:9/v1/');
SET ROLE sec_attacker;
SELECT rag_create_provider('allowed', 'openai', base_url => 'http://127.0.0.1:9/v1', api_key_setting => 'rag.openai_api_key');
RESET ROLE;
-- A provider that sends a key bills that key: a reader of no collection using it cannot spend it through
-- rag_embed, nor call the function behind rag_embed; nor write the ledger but through a call it records.
SET ROLE sec_reader;
SELECT rag_embed('spend', 'text-embedding-3-small', 'allowed');
-- Nor list its models: the list is fetched with the key and shows the account behind it (red team 21).
SELECT name FROM rag_models('allowed');
SELECT rag._embed_text('allowed', 'text-embedding-3-small', 'spend');
SELECT rag._record_query(p_collection_id => rag._collection_id('owner-docs', 'read'), p_kind => 'query',
                         p_question => 'forged', p_outcome => 'retrieved', p_embed_tokens => 1000000000);
RESET ROLE;
SELECT rag_disallow_key('rag.openai_api_key', 'http://127.0.0.1:9/v1');
SELECT name, api_key_setting FROM rag.providers WHERE name IN ('allowed', 'keyless') ORDER BY 1;
-- A provider is its creator's to drop: another rag_admin cannot free the name and create it again pointing
-- at a server of their own, nor drop the extension's own providers.
SELECT rag_create_provider('corporate', 'openai', base_url => 'http://127.0.0.1:9/v1');
SET ROLE sec_attacker;
-- Nor set the prices every collection's ledger costs are computed from.
SELECT rag_set_price('hash-384', 1000, 1000);
SELECT rag_drop_provider('corporate');
SELECT rag_drop_provider('ollama');
RESET ROLE;
SET ROLE sec_owner;
SELECT rag_drop_provider('keyless');
RESET ROLE;
SET ROLE sec_attacker;
SELECT rag_drop_provider('keyless') AS dropped_own;
RESET ROLE;
SELECT name, created_by FROM rag.providers WHERE name IN ('allowed', 'corporate', 'keyless', 'ollama') ORDER BY 1;
SELECT rag_drop_provider('allowed'), rag_drop_provider('corporate');

-- A role holding a grant cannot be dropped, as PostgreSQL keeps a role that holds privileges: the oid left
-- in rag.collection_grants would name whichever role a restore elsewhere gives that oid. DROP OWNED takes the
-- grant back. (A grant whose role went anyway, dropped from another database, grants nothing and breaks
-- nothing for the others.)
CREATE ROLE sec_temporary IN ROLE rag_reader;
SELECT rag_grant('owner-docs', 'sec_temporary', 'read');
SET ROLE sec_temporary;
SELECT rag_conversation_start('owner-docs') > 0 AS started;
RESET ROLE;
DROP ROLE sec_temporary;
DROP OWNED BY sec_temporary;
SELECT count(*) AS conversations_left FROM rag.conversations WHERE owner = 'sec_temporary';
DROP ROLE sec_temporary;
-- PostgreSQL lets any member of a group run DROP OWNED BY the group, and revokes only what the member could
-- revoke. rag took back every grant to the group, on every collection (red team 28; a member of rag_reader
-- emptied the grants every owner made to rag_reader): now only those on collections the caller administers.
CREATE ROLE sec_group;
CREATE ROLE sec_member IN ROLE sec_group, rag_reader;
SELECT rag_grant('owner-docs', 'sec_group', 'read');
SELECT rag_grant('owner-docs', 'rag_reader', 'read');
SET ROLE sec_member;
DROP OWNED BY sec_group;
RESET ROLE;
SELECT string_agg(g.grantee::text, ', ' ORDER BY g.grantee::text) AS grants_kept
  FROM rag.collection_grants g JOIN rag.collections c ON c.id = g.collection_id
 WHERE c.name = 'owner-docs' AND g.grantee::text IN ('sec_group', 'rag_reader');
-- The collection's owner, a member of the group too, takes back the grant to the group that way.
GRANT sec_group TO sec_owner;
SET ROLE sec_owner;
DROP OWNED BY sec_group;
RESET ROLE;
SELECT count(*) AS group_grants_left FROM rag.collection_grants WHERE grantee::text = 'sec_group';
SELECT rag_revoke('owner-docs', 'rag_reader');
REVOKE sec_group FROM sec_owner;
DROP ROLE sec_member;
DROP ROLE sec_group;
-- Nor can a role that owns a collection, made a provider or owns a conversation (nothing PostgreSQL tracks;
-- the last two are recorded by name, which a later role of that name would inherit); REASSIGN OWNED hands
-- them over.
CREATE ROLE sec_collector IN ROLE rag_admin;
SET ROLE sec_collector;
SELECT rag_create_collection('collector', embedding_model => 'hash-384') > 0 AS created;
SELECT rag_create_provider('collectors', 'openai', base_url => 'http://127.0.0.1:9/v1') IS NULL AS created;
SELECT rag_conversation_start('collector') > 0 AS started;
RESET ROLE;
DROP ROLE sec_collector;
REASSIGN OWNED BY sec_collector TO sec_owner;
SELECT (SELECT owner::text FROM rag.collections WHERE name = 'collector') AS collection_owner,
       (SELECT created_by FROM rag.providers WHERE name = 'collectors') AS provider_creator,
       (SELECT string_agg(c.owner, ',') FROM rag.conversations c JOIN rag.collections k ON k.id = c.collection_id
         WHERE k.name = 'collector') AS conversation_owner;
DROP ROLE sec_collector;
SELECT rag_drop_collection('collector'), rag_drop_provider('collectors');
-- A rename follows the role where rag records it by name; a REASSIGN to a superuser does not make a
-- provider the server's own (it keeps no creator, and only a superuser may drop it).
CREATE ROLE "Sec Renamed" IN ROLE rag_admin;
SET ROLE "Sec Renamed";
SELECT rag_create_collection('renamed-owner', embedding_model => 'hash-384') > 0 AS created;
SELECT rag_create_provider('renamed-made', 'openai', base_url => 'http://127.0.0.1:9/v1') IS NULL AS created;
SELECT rag_conversation_start('renamed-owner') > 0 AS started;
RESET ROLE;
SELECT owner FROM rag.collections WHERE name = 'renamed-owner';
ALTER ROLE "Sec Renamed" RENAME TO sec_renamed_now;
SELECT (SELECT owner::text FROM rag.collections WHERE name = 'renamed-owner') AS collection_owner,
       (SELECT created_by FROM rag.providers WHERE name = 'renamed-made') AS provider_creator,
       (SELECT string_agg(c.owner, ',') FROM rag.conversations c JOIN rag.collections k ON k.id = c.collection_id
         WHERE k.name = 'renamed-owner') AS conversation_owner;
REASSIGN OWNED BY sec_renamed_now TO postgres;
SELECT created_by IS NULL AS no_creator, rag._provider_is_the_servers(name) AS the_servers
  FROM rag.providers WHERE name = 'renamed-made';
DROP ROLE sec_renamed_now;
SELECT rag_drop_collection('renamed-owner'), rag_drop_provider('renamed-made');
-- A provider made as rag_admin (SET ROLE, as any member can) is not one every watcher made: watching a
-- table into a collection that uses it is still refused.
SET ROLE sec_attacker;
SET ROLE rag_admin;
SELECT rag_create_provider('group-made', 'openai', base_url => 'http://127.0.0.1:9/v1') IS NULL AS created;
SET ROLE sec_attacker;
SELECT rag_create_collection('trap', embedding_provider => 'group-made', embedding_model => 'stolen') > 0 AS created;
SELECT rag_grant('trap', 'sec_owner', 'admin');
RESET ROLE;
SET ROLE sec_owner;
CREATE TABLE sec_owner.trapped (id int PRIMARY KEY, body text);
SELECT rag_watch('sec_owner.trapped', 'trap', content => 'body');
DROP TABLE sec_owner.trapped;
RESET ROLE;
SELECT rag_drop_collection('trap'), rag_drop_provider('group-made');
SELECT count(*) AS grants_to_dropped_roles
  FROM rag.collection_grants g WHERE NOT EXISTS (SELECT 1 FROM pg_roles r WHERE r.oid = g.grantee);
SET ROLE sec_reader;
SELECT count(*) > 0 AS reader_still_reads FROM rag_query('owner-docs', 'when are salaries paid', 1);
RESET ROLE;

------------------------------------------------------------------------------------------------------------
-- 8. Errors stay PostgreSQL's own: position, detail and context survive the extension's utility hook, and
-- no Rust backtrace appears (this server runs with RUST_BACKTRACE=1).
SET ROLE sec_nobody;
CREATE TABLE public.not_allowed (x int);
DO $$ BEGIN EXECUTE 'CREATE TABLE no_such_schema.t (x int)'; END $$;
RESET ROLE;
CREATE TABLESPACE sec_bad LOCATION 'relative/path';
SELECT * FROM rag_query('owner-docs', 'x', filter => '"not an object"');

------------------------------------------------------------------------------------------------------------
-- 9. Code a table's owner wrote acts through rag with the owner's rights at most, whoever runs it. Inside a
-- security-restricted operation (the worker and rag's own checks evaluating watch expressions, a watch's
-- trigger evaluating its filter in another role's statement, REFRESH MATERIALIZED VIEW, index expressions) the
-- role that started the command is not the one whose code runs, so rag refuses to act there at all.
SET ROLE sec_attacker;
SELECT rag_create_collection('attacker-acts', embedding_model => 'hash-384') > 0 AS created;
CREATE FUNCTION sec_attacker.take_admin(t text) RETURNS text LANGUAGE plpgsql AS $f$
BEGIN
    PERFORM public.rag_grant('owner-docs', 'sec_attacker', 'admin');
    RETURN t;
END $f$;
CREATE FUNCTION sec_attacker.take_key(t text) RETURNS boolean LANGUAGE plpgsql AS $f$
BEGIN
    PERFORM public.rag_create_provider('exfiltrate', 'openai', base_url => 'http://127.0.0.1:9/v1',
                                       api_key_setting => 'rag.openai_api_key');
    RETURN true;
END $f$;
-- 9a. The worker (a superuser) evaluates the content expression.
CREATE TABLE sec_attacker.acts (id int PRIMARY KEY, body text);
SELECT rag_watch('sec_attacker.acts', 'attacker-acts', content => 'sec_attacker.take_admin(body)') > 0 AS watching;
INSERT INTO sec_attacker.acts VALUES (1, 'a note the worker reads');
RESET ROLE;
SELECT pg_temp.wait_for($$SELECT EXISTS (SELECT 1 FROM rag.row_queue q JOIN rag.watches w ON w.id = q.watch_id
                                         WHERE w.source_name = 'sec_attacker.acts' AND q.last_error IS NOT NULL)$$) AS worker_tried;
SELECT q.last_error FROM rag.row_queue q JOIN rag.watches w ON w.id = q.watch_id WHERE w.source_name = 'sec_attacker.acts';
-- 9b. A superuser writes to the attacker's watched table, whose filter runs in the superuser's statement.
SET ROLE sec_attacker;
CREATE TABLE sec_attacker.shared (id int PRIMARY KEY, body text);
SELECT rag_watch('sec_attacker.shared', 'attacker-acts', content => 'body', filter => 'sec_attacker.take_key(body)') > 0 AS watching;
RESET ROLE;
-- (terse: the error's context names functions and lines that differ between PostgreSQL versions)
\set VERBOSITY terse
INSERT INTO sec_attacker.shared VALUES (1, 'a superuser''s row');
-- 9c. A superuser refreshes the attacker's materialized view.
SET ROLE sec_attacker;
CREATE MATERIALIZED VIEW sec_attacker.grabbed AS SELECT sec_attacker.take_admin('x') AS x WITH NO DATA;
RESET ROLE;
REFRESH MATERIALIZED VIEW sec_attacker.grabbed;
\set VERBOSITY default
SELECT count(*) AS attacker_grants FROM rag.collection_grants g WHERE g.grantee = 'sec_attacker'::regrole;
SELECT count(*) AS exfiltrating_providers FROM rag.providers WHERE name = 'exfiltrate';
-- 9d. An expression cannot end the trigger function's body early: a string literal holding the quote that
-- delimited it is only a string literal (check_function_bodies off would have let a cut body through).
SET ROLE sec_attacker;
CREATE TABLE sec_attacker.quoted (id int PRIMARY KEY, body text);
SET check_function_bodies = off;
SELECT rag_watch('sec_attacker.quoted', 'attacker-acts', content => 'body',
                 filter => $x$'$body$; ALTER ROLE sec_attacker SUPERUSER; SELECT $body$' IS NOT NULL$x$) > 0 AS watching;
RESET check_function_bodies;
INSERT INTO sec_attacker.quoted VALUES (1, 'quoted');
RESET ROLE;
SELECT rolsuper AS attacker_is_superuser FROM pg_roles WHERE rolname = 'sec_attacker';
-- 9e. Nor through a SECURITY DEFINER function of the attacker's that a superuser calls, or a trigger of that
-- kind fired by a superuser's write: rag acts for the role that function runs as, as PostgreSQL does.
SET ROLE sec_attacker;
CREATE FUNCTION sec_attacker.lure() RETURNS text LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $f$
BEGIN
    PERFORM public.rag_grant('owner-docs', 'sec_attacker', 'admin');
    RETURN 'granted';
END $f$;
CREATE TABLE sec_attacker.guestbook (id int PRIMARY KEY, line text);
CREATE FUNCTION sec_attacker.on_signing() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $f$
BEGIN
    PERFORM public.rag_grant('owner-docs', 'sec_attacker', 'admin');
    RETURN NEW;
END $f$;
CREATE TRIGGER signing AFTER INSERT ON sec_attacker.guestbook FOR EACH ROW EXECUTE FUNCTION sec_attacker.on_signing();
GRANT INSERT ON sec_attacker.guestbook TO PUBLIC;
RESET ROLE;
\set VERBOSITY terse
SELECT sec_attacker.lure();
INSERT INTO sec_attacker.guestbook VALUES (1, 'a superuser was here');
\set VERBOSITY default
SELECT count(*) AS attacker_grants FROM rag.collection_grants g WHERE g.grantee = 'sec_attacker'::regrole;
-- The other way round, a definer function is how an owner lends its rights on purpose: a role with no rag
-- role at all searches the owner's collection through the owner's function, and only through it.
SET ROLE sec_owner;
CREATE FUNCTION sec_owner.payroll_answer(question text) RETURNS text LANGUAGE sql SECURITY DEFINER
SET search_path = pg_catalog AS $f$ SELECT title FROM public.rag_query('owner-docs', question, 1) $f$;
GRANT USAGE ON SCHEMA sec_owner TO sec_nobody;
GRANT EXECUTE ON FUNCTION sec_owner.payroll_answer(text) TO sec_nobody;
RESET ROLE;
SET ROLE sec_nobody;
SELECT sec_owner.payroll_answer('when are salaries paid') AS through_the_owners_function;
SELECT count(*) FROM public.rag_query('owner-docs', 'when are salaries paid');
RESET ROLE;
-- 9f. A function with only SET clauses records the identity it started with; one that then runs SET ROLE to
-- a lesser role runs that role's code, and rag follows the lesser role (a second superuser, not rag's owner,
-- so that its frame is not passed over as rag's own).
CREATE ROLE sec_dba SUPERUSER;
SET ROLE sec_dba;
CREATE FUNCTION public.sec_run_tenant_code() RETURNS text LANGUAGE plpgsql SET search_path = pg_catalog AS $f$
BEGIN
    SET LOCAL ROLE sec_attacker;
    RETURN sec_attacker.take_admin('x');
END $f$;
\set VERBOSITY terse
BEGIN;
SELECT public.sec_run_tenant_code();
ROLLBACK;
\set VERBOSITY default
RESET ROLE;
DROP FUNCTION public.sec_run_tenant_code();
DROP ROLE sec_dba;
-- A parallel worker inherits the leader's role but none of its running functions: rag refuses to act there.
SET ROLE sec_attacker;
CREATE TABLE sec_attacker.one AS SELECT 1 AS x;
CREATE FUNCTION sec_attacker.who() RETURNS text LANGUAGE plpgsql PARALLEL SAFE AS $f$
BEGIN RETURN rag._calling_role(); END $f$;
RESET ROLE;
BEGIN;
SELECT set_config(CASE WHEN current_setting('server_version_num')::int >= 160000 THEN 'debug_parallel_query'
                       ELSE 'force_parallel_mode' END, 'on', true) IS NOT NULL AS forced,
       set_config('parallel_leader_participation', 'off', true) IS NOT NULL AS workers_only;
\set VERBOSITY terse
SELECT sec_attacker.who() FROM sec_attacker.one;
\set VERBOSITY default
ROLLBACK;
-- 9h. A foreign key's action runs its query as the owner of the referencing table, without a function: the
-- attacker's BEFORE trigger there, set off by a superuser deleting their own row, runs as the attacker in
-- PostgreSQL, and acts through rag as the attacker; also when the delete happens inside another role's
-- definer function, and so does code of the action that is not a trigger (a column default). (From
-- PostgreSQL 18 an AFTER trigger runs as the role that queued it: tests/e2e/test_identity.py.)
CREATE TABLE public.sec_parents (id int PRIMARY KEY);
GRANT REFERENCES ON public.sec_parents TO sec_attacker;
INSERT INTO public.sec_parents VALUES (1), (2), (3);
SET ROLE sec_attacker;
CREATE TABLE sec_attacker.children (parent int REFERENCES public.sec_parents ON DELETE CASCADE);
CREATE FUNCTION sec_attacker.on_orphaned() RETURNS trigger LANGUAGE plpgsql AS $f$
BEGIN
    PERFORM sec_attacker.take_admin('x');
    RETURN OLD;
END $f$;
CREATE TRIGGER orphaned BEFORE DELETE ON sec_attacker.children FOR EACH ROW EXECUTE FUNCTION sec_attacker.on_orphaned();
CREATE FUNCTION sec_attacker.default_parent() RETURNS int LANGUAGE plpgsql AS $f$
BEGIN
    PERFORM sec_attacker.take_admin('x');
    RETURN 1;
END $f$;
CREATE TABLE sec_attacker.stepchildren (parent int DEFAULT sec_attacker.default_parent()
                                        REFERENCES public.sec_parents ON DELETE SET DEFAULT);
INSERT INTO sec_attacker.children VALUES (1), (2);
INSERT INTO sec_attacker.stepchildren VALUES (3);
RESET ROLE;
GRANT SELECT, DELETE ON public.sec_parents TO sec_owner;
SET ROLE sec_owner;
CREATE FUNCTION sec_owner.close_parent(p int) RETURNS void LANGUAGE sql SECURITY DEFINER
SET search_path = pg_catalog AS $f$ DELETE FROM public.sec_parents WHERE id = p $f$;
RESET ROLE;
\set VERBOSITY terse
DELETE FROM public.sec_parents WHERE id = 1;
SET ROLE sec_owner;
SELECT sec_owner.close_parent(2);
RESET ROLE;
DELETE FROM public.sec_parents WHERE id = 3;
\set VERBOSITY default
SELECT count(*) AS attacker_grants FROM rag.collection_grants g WHERE g.grantee = 'sec_attacker'::regrole;
DROP TABLE sec_attacker.children, sec_attacker.stepchildren, public.sec_parents;
DROP FUNCTION sec_attacker.on_orphaned(), sec_attacker.default_parent(), sec_owner.close_parent(int);
-- 9j. A definer function that makes itself SECURITY INVOKER while it runs (ALTER FUNCTION, or CREATE OR
-- REPLACE without SECURITY DEFINER) still runs as its owner, and so does a call of it set up before the
-- change: rag takes the identity its entry point was called with, never the catalog of the caller's code.
SET ROLE sec_attacker;
CREATE FUNCTION sec_attacker.turncoat() RETURNS int LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $f$
BEGIN
    ALTER FUNCTION sec_attacker.turncoat() SECURITY INVOKER;
    PERFORM sec_attacker.take_admin('x');
    RETURN 1;
END $f$;
CREATE FUNCTION sec_attacker.replaced() RETURNS int LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $f$
BEGIN
    CREATE OR REPLACE FUNCTION sec_attacker.replaced() RETURNS int LANGUAGE plpgsql SET search_path = pg_catalog
        AS $g$ BEGIN RETURN 0; END $g$;
    PERFORM sec_attacker.take_admin('x');
    RETURN 1;
END $f$;
CREATE FUNCTION sec_attacker.twice(i int) RETURNS int LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $f$
BEGIN
    IF i = 1 THEN
        ALTER FUNCTION sec_attacker.twice(int) SECURITY INVOKER;
    ELSE
        PERFORM sec_attacker.take_admin('x');
    END IF;
    RETURN i;
END $f$;
RESET ROLE;
\set VERBOSITY terse
SELECT sec_attacker.turncoat();
SELECT sec_attacker.replaced();
SELECT sum(sec_attacker.twice(i)) FROM generate_series(1, 2) i;
\set VERBOSITY default
SELECT count(*) AS attacker_grants FROM rag.collection_grants g WHERE g.grantee = 'sec_attacker'::regrole;
DROP FUNCTION sec_attacker.turncoat(), sec_attacker.replaced(), sec_attacker.twice(int);
-- 9l. The half of an entry point that runs as rag's owner, called directly, records that owner and not its
-- caller: rag refuses to act there, for an ordinary role and for a superuser alike.
SET ROLE sec_attacker;
\set VERBOSITY terse
SELECT rag_definer.rag_grant('owner-docs', 'sec_attacker', 'admin');
RESET ROLE;
SELECT count(*) FROM rag_definer.rag_query('owner-docs', 'anything');
\set VERBOSITY default
-- A search_path that names rag (to read rag.status unqualified, say) finds the wrappers all the same.
SET search_path = rag, public;
SELECT count(*) >= 0 AS searched FROM rag_query('owner-docs', 'anything');
RESET search_path;
SELECT count(*) AS attacker_grants FROM rag.collection_grants g WHERE g.grantee = 'sec_attacker'::regrole;
-- 9k. CREATE SCHEMA ... AUTHORIZATION runs its commands as the schema's owner without a function frame: a
-- superuser adding a partition to the attacker's table there makes PostgreSQL evaluate the attacker's
-- partition key over the default partition's rows, as the attacker. rag acts for the attacker there.
-- (The deferred uniqueness recheck, which runs as a different role on PostgreSQL 15 and 18, is in
-- tests/e2e/test_identity.py.)
SET ROLE sec_attacker;
CREATE FUNCTION sec_attacker.part_key(k int) RETURNS int LANGUAGE plpgsql IMMUTABLE AS $f$
BEGIN
    IF coalesce(current_setting('sec.armed', true), '') = 'on' THEN
        PERFORM sec_attacker.take_admin('x');
    END IF;
    RETURN k;
END $f$;
CREATE TABLE sec_attacker.parted (k int) PARTITION BY LIST ((sec_attacker.part_key(k)));
CREATE TABLE sec_attacker.parted_rest PARTITION OF sec_attacker.parted DEFAULT;
INSERT INTO sec_attacker.parted VALUES (1), (3);
RESET ROLE;
SET sec.armed = on;
\set VERBOSITY terse
CREATE SCHEMA sec_late AUTHORIZATION sec_attacker
    CREATE TABLE parted_two PARTITION OF sec_attacker.parted FOR VALUES IN (2);
\set VERBOSITY default
RESET sec.armed;
SELECT count(*) AS attacker_grants FROM rag.collection_grants g WHERE g.grantee = 'sec_attacker'::regrole;
DROP SCHEMA IF EXISTS sec_late CASCADE;
DROP TABLE sec_attacker.parted;
DROP FUNCTION sec_attacker.part_key(int);
-- 9g. The restriction is the trigger's own: called outside a SECURITY DEFINER function it is refused.
SET ROLE sec_attacker;
SELECT rag._restrict_to_current_user();
SELECT rag_unwatch('sec_attacker.acts', drop_documents => true), rag_unwatch('sec_attacker.shared', drop_documents => true),
       rag_unwatch('sec_attacker.quoted', drop_documents => true);
SELECT rag_drop_collection('attacker-acts');
RESET ROLE;

------------------------------------------------------------------------------------------------------------
-- A watch whose expression reads the whole row (r, r.*, to_jsonb(r)) reads every column: a reader granted only
-- some columns finds nothing of it, as in their own SELECT, and an update of any column indexes the row again.
-- The columns are what PostgreSQL's analyzer resolves (rag._expression_columns), not words of the text; an
-- expression with a subquery may read the table again under another name, and counts as reading every column.
SET ROLE sec_owner;
CREATE TABLE sec_owner.staff (id int PRIMARY KEY, name text, salary int);
INSERT INTO sec_owner.staff VALUES (1, 'Bob Builder', 98765), (2, 'Carol Singer', 55555);
SELECT rag_create_collection('staff', embedding_model => 'hash-384', max_distance => 2) > 0 AS created;
SELECT rag_watch('sec_owner.staff', 'staff', content => 'concat_ws('' '', r.*)') > 0 AS watching;
SELECT rag_grant('staff', 'sec_reader', 'read');
GRANT SELECT (id, name) ON sec_owner.staff TO sec_reader;
RESET ROLE;
SELECT rag._watch_columns(w) AS whole_row_columns FROM rag.watches w WHERE w.source_name = 'sec_owner.staff';
SELECT rag._expression_columns('sec_owner.staff'::regclass, ARRAY['"name" || '' '' || r.id', NULL, 'id > 0'])
       AS named_columns,
       rag._expression_columns('sec_owner.staff'::regclass, ARRAY['name || (SELECT s.salary FROM sec_owner.staff s WHERE s.id = r.id)'])
       AS with_a_subquery,
       rag._expression_columns('sec_owner.staff'::regclass, ARRAY['to_jsonb(r)::text']) AS whole_row,
       rag._expression_columns('sec_owner.staff'::regclass, ARRAY['r::text']) AS whole_row_too;
-- A function could read the table by itself: an owner's own (whatever volatility it declares), a volatile one, or
-- one of pg_catalog's that runs a query given as text. Each counts as reading every column.
SET ROLE sec_owner;
CREATE FUNCTION sec_owner.card(p_id int) RETURNS text LANGUAGE sql IMMUTABLE
    AS $f$ SELECT name || ' earns ' || salary FROM sec_owner.staff WHERE id = p_id $f$;
RESET ROLE;
SELECT rag._expression_columns('sec_owner.staff'::regclass, ARRAY['sec_owner.card(id)']) AS own_function,
       rag._expression_columns('sec_owner.staff'::regclass,
           ARRAY[$$pg_catalog.query_to_xml(format('SELECT salary FROM sec_owner.staff WHERE id = %s', id), false, false, '')::text$$])
           AS query_text,
       rag._expression_columns('sec_owner.staff'::regclass, ARRAY['name || random()::text']) AS volatile,
       rag._expression_columns('sec_owner.staff'::regclass, ARRAY['concat_ws('' '', upper(name), id)']) AS catalog_functions;
-- rag._expression_columns is rag's own: no reader may point it at a table (analysis locks it).
SET ROLE sec_reader;
SELECT rag._expression_columns('sec_owner.staff'::regclass, ARRAY['1']);
RESET ROLE;
SELECT pg_temp.wait_for($$SELECT (SELECT count(*) FROM rag.documents d JOIN rag.collections c ON c.id = d.collection_id
                                   WHERE c.name = 'staff' AND d.status = 'ready') = 2$$) AS staff_indexed;
SET ROLE sec_reader;
SELECT count(*) AS salaries_seen FROM rag_query('staff', 'Bob Builder salary', 5);
SELECT count(*) AS staff_documents_seen FROM rag.documents WHERE source = 'sec_owner.staff';
RESET ROLE;
SET ROLE sec_owner;
UPDATE sec_owner.staff SET salary = 11111 WHERE id = 1;
RESET ROLE;
SELECT pg_temp.wait_for($$SELECT EXISTS (SELECT 1 FROM rag.documents WHERE source = 'sec_owner.staff'
                                           AND body LIKE '%11111%')$$) AS salary_update_indexed;
SET ROLE sec_owner;
SELECT rag_unwatch('sec_owner.staff', drop_documents => true), rag_drop_collection('staff');
DROP TABLE sec_owner.staff;
DROP FUNCTION sec_owner.card(int);
RESET ROLE;

-- The columns a watch reads stay what it reads: renaming one away from its expressions is refused (they are
-- text, and would name no column), so the columns that decide who may read the index cannot change under it.
SET ROLE sec_owner;
CREATE TABLE sec_owner.renamed (id int PRIMARY KEY, body text, extra text);
SELECT rag_create_collection('renamed', embedding_model => 'hash-384') > 0 AS created;
SELECT rag_watch('sec_owner.renamed', 'renamed', content => 'body') > 0 AS watching;
SELECT read_columns AS reads FROM rag.watches WHERE source_name = 'sec_owner.renamed';
ALTER TABLE sec_owner.renamed RENAME COLUMN body TO old_body;
ALTER TABLE sec_owner.renamed RENAME COLUMN extra TO other;
SELECT read_columns AS still_reads FROM rag.watches WHERE source_name = 'sec_owner.renamed';
-- PostgreSQL renames a table's columns through ALTER VIEW, ALTER MATERIALIZED VIEW and ALTER FOREIGN TABLE too,
-- and the table itself through ALTER INDEX: the same refusal, and the watch follows the new name.
ALTER VIEW sec_owner.renamed RENAME COLUMN body TO old_body;
ALTER MATERIALIZED VIEW sec_owner.renamed RENAME COLUMN body TO old_body;
ALTER FOREIGN TABLE sec_owner.renamed RENAME COLUMN body TO old_body;
ALTER INDEX sec_owner.renamed RENAME TO renamed_by_index;
SELECT source_name FROM rag.watches WHERE source = 'sec_owner.renamed_by_index'::regclass;
ALTER TABLE sec_owner.renamed_by_index RENAME TO renamed;
-- A typed table's columns are renamed through its type; the command names only the type.
CREATE TYPE sec_owner.renamed_shape AS (id int, body text);
CREATE TABLE sec_owner.typed OF sec_owner.renamed_shape (PRIMARY KEY (id));
SELECT rag_watch('sec_owner.typed', 'renamed', content => 'body') > 0 AS watching;
ALTER TYPE sec_owner.renamed_shape RENAME ATTRIBUTE body TO old_body CASCADE;
SELECT rag_unwatch('sec_owner.typed', drop_documents => true);
DROP TABLE sec_owner.typed;
DROP TYPE sec_owner.renamed_shape;
SELECT rag_unwatch('sec_owner.renamed', drop_documents => true), rag_drop_collection('renamed');
DROP TABLE sec_owner.renamed;
RESET ROLE;
-- Should a column the watch reads disappear all the same (here with the event trigger off, as DROP TYPE …
-- CASCADE or a command rag does not see could), the watch counts as reading every column: a reader granted
-- the columns it read before, but not the renamed one, may no longer read the table's documents.
SET ROLE sec_owner;
CREATE TABLE sec_owner.split (id int PRIMARY KEY, body text, secret text);
SELECT rag_create_collection('split', embedding_model => 'hash-384') > 0 AS created;
SELECT rag_watch('sec_owner.split', 'split', content => 'body || secret') > 0 AS watching;
GRANT SELECT (id, body, secret) ON sec_owner.split TO sec_reader;
RESET ROLE;
SELECT w.id = ANY (rag._watches_readable_whole('sec_reader')) AS reader_may_read_whole
  FROM rag.watches w WHERE w.source_name = 'sec_owner.split';
REVOKE SELECT (secret) ON sec_owner.split FROM sec_reader;
ALTER EVENT TRIGGER rag_watch_alter DISABLE;
ALTER TABLE sec_owner.split RENAME COLUMN secret TO unseen;
ALTER EVENT TRIGGER rag_watch_alter ENABLE;
SELECT rag._watch_columns(w) AS columns_counted, w.id = ANY (rag._watches_readable_whole('sec_reader')) AS reader_may_read_whole
  FROM rag.watches w WHERE w.source_name = 'sec_owner.split';
GRANT SELECT (unseen) ON sec_owner.split TO sec_reader;
SELECT w.id = ANY (rag._watches_readable_whole('sec_reader')) AS reader_granted_every_column
  FROM rag.watches w WHERE w.source_name = 'sec_owner.split';
SET ROLE sec_owner;
SELECT rag_unwatch('sec_owner.split', drop_documents => true), rag_drop_collection('split');
DROP TABLE sec_owner.split;
RESET ROLE;

-- Analysing an expression runs code: a literal of an array of a domain checks the domain's constraints. So it
-- runs as the table's owner in a security-restricted operation, when the watch is made (or its table altered),
-- and never in anyone else's query: here the check records who ran it and tries to use a superuser's rights.
SET ROLE sec_attacker;
SELECT rag_create_collection('attacker-domain', embedding_model => 'hash-384') > 0 AS created;
CREATE TABLE sec_attacker.domain_runs (who name, superuser boolean);
CREATE FUNCTION sec_attacker.checked(p_value int) RETURNS boolean LANGUAGE plpgsql AS $f$
DECLARE
    v_super boolean := (SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user);
BEGIN
    IF v_super THEN
        EXECUTE 'ALTER ROLE sec_attacker SUPERUSER';
    END IF;
    INSERT INTO sec_attacker.domain_runs VALUES (current_user, v_super);
    RETURN true;
END $f$;
CREATE DOMAIN sec_attacker.checked_int AS integer CHECK (sec_attacker.checked(VALUE));
CREATE TABLE sec_attacker.domain_notes (id int PRIMARY KEY, body text);
SELECT rag_watch('sec_attacker.domain_notes', 'attacker-domain',
                 content => $$body || ('{1}'::sec_attacker.checked_int[])::text$$) > 0 AS watching;
RESET ROLE;
SELECT who, superuser, count(*) > 0 AS ran FROM sec_attacker.domain_runs GROUP BY 1, 2;
SELECT rolsuper AS attacker_is_superuser FROM pg_roles WHERE rolname = 'sec_attacker';
TRUNCATE sec_attacker.domain_runs;
-- A reader's plain SELECT of rag.documents (whose policies look at every watch's columns) runs none of it.
SET ROLE sec_reader;
SELECT count(*) >= 0 AS selected FROM rag.documents;
RESET ROLE;
SELECT count(*) AS runs_in_readers_query FROM sec_attacker.domain_runs;
SET ROLE sec_attacker;
SELECT rag_unwatch('sec_attacker.domain_notes', drop_documents => true), rag_drop_collection('attacker-domain');
DROP TABLE sec_attacker.domain_notes, sec_attacker.domain_runs;
DROP DOMAIN sec_attacker.checked_int;
DROP FUNCTION sec_attacker.checked(int);
RESET ROLE;

-- A batch the worker cannot spread is refused; one it can spread but whose keys are odd stops nobody else's
-- indexing. Here the owner of a watched table writes batches for their own watch from a trigger of theirs (the
-- queue's policy lets a watched table's owner do that, inside a trigger).
SET ROLE sec_attacker;
SELECT rag_create_collection('attacker-odd', embedding_model => 'hash-384') > 0 AS created;
CREATE TABLE sec_attacker.odd (id int PRIMARY KEY, body text);
SELECT rag_watch('sec_attacker.odd', 'attacker-odd', content => 'body') > 0 AS watching;
SELECT id AS odd_watch FROM rag.watches WHERE source_name = 'sec_attacker.odd' \gset
CREATE TABLE sec_attacker.odd_trigger (keys jsonb);
CREATE FUNCTION sec_attacker.write_batch() RETURNS trigger LANGUAGE plpgsql AS $f$
BEGIN
    INSERT INTO rag.row_batches (watch_id, keys) VALUES (TG_ARGV[0]::integer, NEW.keys);
    RETURN NULL;
END $f$;
CREATE TRIGGER write_batch AFTER INSERT ON sec_attacker.odd_trigger FOR EACH ROW
    EXECUTE FUNCTION sec_attacker.write_batch(:'odd_watch');
INSERT INTO sec_attacker.odd_trigger VALUES ('"not an array"');
INSERT INTO sec_attacker.odd_trigger VALUES ('[[1, 2], {"nested": {"deeper": [1]}}, "text", null, 1e300]');
-- Nor with an id the queue's sequence has not given (OVERRIDING SYSTEM VALUE): in a database that never made a
-- document, a batch ahead of its sequence is how a restore half done looks (rag._restore_under_way), and the
-- worker stopped for every watch in the database.
CREATE FUNCTION sec_attacker.write_batch_ahead() RETURNS trigger LANGUAGE plpgsql AS $f$
BEGIN
    INSERT INTO rag.row_batches (id, watch_id, keys) OVERRIDING SYSTEM VALUE
    VALUES (TG_ARGV[1]::bigint, TG_ARGV[0]::integer, NEW.keys);
    RETURN NULL;
END $f$;
CREATE TABLE sec_attacker.ahead_trigger (keys jsonb);
CREATE TRIGGER write_batch_ahead AFTER INSERT ON sec_attacker.ahead_trigger FOR EACH ROW
    EXECUTE FUNCTION sec_attacker.write_batch_ahead(:'odd_watch', '9223372036854775000');
\set VERBOSITY terse
INSERT INTO sec_attacker.ahead_trigger VALUES ('[1]');
\set VERBOSITY default
RESET ROLE;
-- The id right after the sequence's last one as well.
SELECT last_value + 1 AS next_batch_id FROM rag.row_batches_id_seq \gset
SET ROLE sec_attacker;
DROP TRIGGER write_batch_ahead ON sec_attacker.ahead_trigger;
CREATE TRIGGER write_batch_ahead AFTER INSERT ON sec_attacker.ahead_trigger FOR EACH ROW
    EXECUTE FUNCTION sec_attacker.write_batch_ahead(:'odd_watch', :'next_batch_id');
\set VERBOSITY terse
INSERT INTO sec_attacker.ahead_trigger VALUES ('[1]');
\set VERBOSITY default
RESET ROLE;
SELECT count(*) AS batches_ahead FROM rag.row_batches
 WHERE id >= (SELECT last_value + is_called::integer FROM rag.row_batches_id_seq);
SET ROLE sec_owner;
SELECT rag_ingest('owner-docs', 'After the odd batch', 'Indexing goes on for everyone else.') > 0 AS ingested;
RESET ROLE;
SELECT pg_temp.wait_for($$SELECT status = 'ready' FROM rag.documents WHERE title = 'After the odd batch'$$)
       AS others_indexed,
       pg_temp.wait_for($$SELECT NOT EXISTS (SELECT 1 FROM rag.row_batches)$$) AS odd_batch_spread;
SET ROLE sec_attacker;
SELECT rag_unwatch('sec_attacker.odd', drop_documents => true), rag_drop_collection('attacker-odd');
DROP TABLE sec_attacker.odd, sec_attacker.odd_trigger, sec_attacker.ahead_trigger;
DROP FUNCTION sec_attacker.write_batch(), sec_attacker.write_batch_ahead();
RESET ROLE;

-- An owner of a watched table who may write another owner's cannot take the keys of their own writes there:
-- every watched table's owner may run rag._watch_keys_taken, and a trigger of theirs fired by a CTE's UPDATE
-- feeding an INSERT into their table runs before the watch's statement trigger. The update was never queued,
-- so the row handed over and redacted in it kept its old text in the index, shown to its new owner
-- (helper-89). Only a role with the table owner's rights may take them now.
SET ROLE sec_owner;
SELECT rag_create_collection('owner-handed', embedding_model => 'hash-384') > 0 AS created;
CREATE TABLE sec_owner.handed (id int PRIMARY KEY, body text);
INSERT INTO sec_owner.handed VALUES (1, 'the vault code is 4711');
SELECT rag_watch('sec_owner.handed', 'owner-handed', content => 'body') AS handed_watch \gset
SELECT rag._watch_trigger_mode_installed('sec_owner.handed'::regclass) AS handed_mode;
GRANT USAGE ON SCHEMA sec_owner TO sec_attacker;
GRANT UPDATE, SELECT ON sec_owner.handed TO sec_attacker;
RESET ROLE;
SELECT pg_temp.wait_for($$SELECT status = 'ready' FROM rag.documents WHERE source = 'sec_owner.handed'$$) AS indexed;
SET ROLE sec_attacker;
SELECT rag_create_collection('attacker-sink', embedding_model => 'hash-384') > 0 AS created;
CREATE TABLE sec_attacker.sink (id int PRIMARY KEY);
SELECT rag_watch('sec_attacker.sink', 'attacker-sink', content => 'id::text') > 0 AS watching;
SELECT has_function_privilege('rag._watch_keys_taken(integer, oid)', 'EXECUTE') AS attacker_may_execute;
CREATE FUNCTION sec_attacker.take_keys() RETURNS trigger LANGUAGE plpgsql AS $f$
BEGIN
    RAISE NOTICE 'took %', rag._watch_keys_taken(TG_ARGV[0]::integer, TG_ARGV[1]::regclass);
    RETURN NULL;
END $f$;
CREATE TRIGGER take_keys AFTER INSERT ON sec_attacker.sink FOR EACH ROW
    EXECUTE FUNCTION sec_attacker.take_keys(:'handed_watch', 'sec_owner.handed');
WITH u AS (UPDATE sec_owner.handed SET body = '[redacted]' RETURNING id) INSERT INTO sec_attacker.sink SELECT id FROM u;
SELECT body FROM sec_owner.handed;
-- Caught inside the trigger, the refusal still leaves the keys to the watch's own statement trigger.
CREATE OR REPLACE FUNCTION sec_attacker.take_keys() RETURNS trigger LANGUAGE plpgsql AS $f$
BEGIN
    BEGIN
        RAISE NOTICE 'took %', rag._watch_keys_taken(TG_ARGV[0]::integer, TG_ARGV[1]::regclass);
    EXCEPTION WHEN insufficient_privilege THEN
        RAISE NOTICE 'refused';
    END;
    RETURN NULL;
END $f$;
WITH u AS (UPDATE sec_owner.handed SET body = '[redacted]' RETURNING id) INSERT INTO sec_attacker.sink SELECT id + 1 FROM u;
RESET ROLE;
SELECT pg_temp.wait_for($$SELECT body = '[redacted]' FROM rag.documents WHERE source = 'sec_owner.handed'$$)
       AS redaction_indexed;
SET ROLE sec_attacker;
SELECT rag_unwatch('sec_attacker.sink', drop_documents => true), rag_drop_collection('attacker-sink');
DROP TABLE sec_attacker.sink;
DROP FUNCTION sec_attacker.take_keys();
RESET ROLE;
SET ROLE sec_owner;
SELECT rag_unwatch('sec_owner.handed', drop_documents => true), rag_drop_collection('owner-handed');
DROP TABLE sec_owner.handed;
REVOKE USAGE ON SCHEMA sec_owner FROM sec_attacker;
RESET ROLE;

-- Triggers that an owner names like a partition's on a table of theirs that is no partition do not make every
-- other role's ALTER TABLE remake them (and wait for the owner's locks on it): only a table the command itself
-- detached is looked at.
SET ROLE sec_attacker;
SELECT rag_create_collection('attacker-dressed', embedding_model => 'hash-384') > 0 AS created;
CREATE TABLE sec_attacker.dressed (id int PRIMARY KEY, body text);
SELECT rag_watch('sec_attacker.dressed', 'attacker-dressed', content => 'body') > 0 AS watching;
CREATE FUNCTION sec_attacker.nothing() RETURNS trigger LANGUAGE plpgsql AS $f$ BEGIN RETURN NULL; END $f$;
DO $$
DECLARE
    v_event text;
BEGIN
    FOREACH v_event IN ARRAY ARRAY['insert', 'update', 'delete'] LOOP
        EXECUTE format('DROP TRIGGER rag_watch_%s_key ON sec_attacker.dressed', v_event);
        EXECUTE format('DROP TRIGGER rag_watch_%s ON sec_attacker.dressed', v_event);
        EXECUTE format('CREATE TRIGGER rag_watch_%s AFTER %s ON sec_attacker.dressed FOR EACH ROW
                        EXECUTE FUNCTION sec_attacker.nothing()', v_event, v_event);
    END LOOP;
END $$;
RESET ROLE;
SELECT rag._watch_trigger_mode_installed('sec_attacker.dressed'::regclass) AS dressed_as;
SET ROLE sec_owner;
CREATE TABLE sec_owner.altered (id int);
ALTER TABLE sec_owner.altered ADD COLUMN note text;
RESET ROLE;
SELECT rag._watch_trigger_mode_installed('sec_attacker.dressed'::regclass) AS still_dressed_as;
SET ROLE sec_attacker;
SELECT rag_unwatch('sec_attacker.dressed', drop_documents => true), rag_drop_collection('attacker-dressed');
DROP TABLE sec_attacker.dressed;
DROP FUNCTION sec_attacker.nothing();
RESET ROLE;
DROP TABLE sec_owner.altered;

-- Unclosed brackets and tags in Markdown are read in one pass (each opener used to search to the end of the
-- line: 47 s, uncancellable, for 200,000 of them).
SET ROLE sec_reader;
SELECT length(rag_markdown_to_text(repeat('[', 200000) || 'x')) AS brackets,
       length(rag_markdown_to_text(repeat('<a', 100000))) AS tags;
RESET ROLE;

------------------------------------------------------------------------------------------------------------
-- 7b. An admin of a collection by grant is not trusted with the rows of another owner's watched table that its
-- row-level security keeps from them: they cannot send the collection's chunks to a provider of their own
-- choosing (the worker would embed every chunk again there), nor have every search's candidates reranked by
-- one, nor read the answers other roles got from those rows, in the ledger or in their conversations.
SET ROLE sec_owner;
SELECT rag_grant('tickets', 'sec_attacker', 'admin');
RESET ROLE;
SET ROLE sec_reader;
SELECT rag_conversation_start('tickets') AS reader_conversation \gset
SELECT outcome FROM rag_ask('tickets', 'which printer is out of toner', k => 8, conversation => :reader_conversation);
RESET ROLE;
SELECT set_config('sec.reader_conversation', :'reader_conversation', false) IS NOT NULL AS noted;
-- Reading the reader's conversation as whoever calls it; refused as if it did not exist.
CREATE FUNCTION pg_temp.try_readers_conversation() RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    PERFORM rag_conversation(current_setting('sec.reader_conversation')::bigint);
EXCEPTION WHEN undefined_object THEN
    RAISE NOTICE 'the reader''s conversation is not the admin''s to read';
END $$;
-- Asking into the reader's conversation as whoever calls it; refused as another role's.
CREATE FUNCTION pg_temp.try_continuing_readers_conversation() RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    PERFORM rag_ask('tickets', 'and on floor 3?', conversation => current_setting('sec.reader_conversation')::bigint);
EXCEPTION WHEN insufficient_privilege THEN
    RAISE NOTICE 'refused: %', regexp_replace(SQLERRM, '[0-9]+', 'N');
END $$;
SET ROLE sec_attacker;
SELECT rag_create_provider('admins-own', 'ollama', base_url => 'http://127.0.0.1:9') IS NULL AS created;
SELECT rag_create_provider('admins-reranker', 'openai', base_url => 'http://127.0.0.1:9/v1') IS NULL AS created;
SELECT rag_set_embedding_model('tickets', 'stolen', 8, 'admins-own');
SELECT rag_set_reranker('tickets', 'stolen', reranker_provider => 'admins-reranker');
-- Naming the provider with the reranker off sends nothing; turning it on afterwards is the same choice.
SELECT rag_set_reranker('tickets', 'none', reranker_provider => 'admins-reranker');
SELECT rag_set_reranker('tickets', 'stolen');
SELECT rag_set_reranker('tickets', 'none', reranker_provider => 'local');
SELECT count(*) AS readers_ledger_rows FROM rag.queries WHERE collection = 'tickets' AND role = 'sec_reader';
-- Nor their totals: prompt tokens would measure how much of the hidden rows' text was sent.
SELECT coalesce(sum(calls), 0) AS calls_in_ledger_daily, coalesce(sum(prompt_tokens), 0) AS prompt_tokens
  FROM rag.ledger_daily WHERE collection = 'tickets';
SELECT count(*) AS readers_conversations FROM rag.conversations WHERE owner = 'sec_reader';
SELECT pg_temp.try_readers_conversation();
RESET ROLE;
-- The table's owner may do all of it.
SET ROLE sec_owner;
SELECT count(*) > 0 AS owner_sees_readers_ledger_rows FROM rag.queries WHERE collection = 'tickets' AND role = 'sec_reader';
SELECT sum(calls) > 0 AS owner_sees_them_in_ledger_daily FROM rag.ledger_daily WHERE collection = 'tickets';
SELECT count(*) AS owner_reads_readers_conversation FROM rag_conversation(current_setting('sec.reader_conversation')::bigint);
-- Reads it, but does not write into it: the reader's history (and the rewriting of their next questions) is
-- theirs alone.
SELECT pg_temp.try_continuing_readers_conversation();
SELECT count(*) AS readers_conversation_unchanged FROM rag_conversation(current_setting('sec.reader_conversation')::bigint);
RESET ROLE;
-- Nor does a superuser: their answer draws on rows the reader may not read, which the reader would then read
-- back in their own history (red team 26). As the reader (SET ROLE) they continue it within its rights.
SELECT pg_temp.try_continuing_readers_conversation();
SELECT count(*) AS readers_conversation_unchanged_by_superuser
  FROM rag_conversation(current_setting('sec.reader_conversation')::bigint);
SET ROLE sec_owner;
SELECT rag_set_reranker('tickets', 'stolen', reranker_provider => 'admins-reranker');
SELECT rag_set_reranker('tickets', 'none', reranker_provider => 'local');
SELECT rag_revoke('tickets', 'sec_attacker');
-- Chosen while a collection watches nothing (every row of it is the admin's to read), the provider is still
-- the admin's: watching a table into it later is refused to the table's owner, who did not choose it.
SELECT rag_create_collection('fresh', embedding_model => 'hash-384') > 0 AS created;
SELECT rag_grant('fresh', 'sec_attacker', 'admin');
CREATE TABLE sec_owner.fresh_rows (id int PRIMARY KEY, body text);
RESET ROLE;
SET ROLE sec_attacker;
SELECT rag_set_reranker('fresh', 'stolen', reranker_provider => 'admins-reranker');
RESET ROLE;
SET ROLE sec_owner;
SELECT rag_watch('sec_owner.fresh_rows', 'fresh', content => 'body');
SELECT rag_set_reranker('fresh', 'none', reranker_provider => 'local');
SELECT rag_watch('sec_owner.fresh_rows', 'fresh', content => 'body') > 0 AS watching;
SELECT rag_unwatch('sec_owner.fresh_rows', drop_documents => true);
SELECT rag_drop_collection('fresh');
DROP TABLE sec_owner.fresh_rows;
RESET ROLE;
SELECT rag_drop_provider('admins-own'), rag_drop_provider('admins-reranker');

-- The status views run as their owner, so their WHERE is what keeps other roles' collections out; they are
-- security barriers, so a function of the caller's in a WHERE of theirs sees only rows the view shows.
SET ROLE sec_reader;
CREATE TEMP TABLE sec_seen (seen text[]);
GRANT INSERT ON sec_seen TO sec_attacker;
CREATE FUNCTION pg_temp.sec_leak(VARIADIC text[]) RETURNS boolean LANGUAGE plpgsql COST 0.0000001
AS $$BEGIN INSERT INTO pg_temp.sec_seen VALUES ($1); RETURN true; END$$;
SELECT count(*) AS status_rows FROM rag.status WHERE pg_temp.sec_leak(collection, embedding_model);
SELECT count(*) AS watch_status_rows FROM rag.watch_status WHERE pg_temp.sec_leak(source::text);
RESET ROLE;
SET ROLE sec_attacker;
SELECT count(*) AS ledger_daily_rows FROM rag.ledger_daily WHERE pg_temp.sec_leak(collection);
RESET ROLE;
SELECT seen FROM pg_temp.sec_seen ORDER BY 1;
SELECT relname, reloptions FROM pg_class
 WHERE relnamespace = 'rag'::regnamespace AND relkind = 'v' ORDER BY 1;

------------------------------------------------------------------------------------------------------------
-- Publications. One FOR ALL TABLES, or given schema rag or one of its tables, would carry rag's own tables to its
-- subscribers: the command runs, with a WARNING naming it. Publishing one's own tables by name or by schema
-- draws none, and neither does an ALTER that leaves rag out; an ordinary role cannot publish rag's tables at all
-- (PostgreSQL asks for their owner; FOR ALL TABLES and FOR TABLES IN SCHEMA are a superuser's in 15).
GRANT CREATE ON DATABASE rag_regress TO sec_owner;
SET ROLE sec_owner;
CREATE PUBLICATION sec_own_tables FOR TABLE sec_owner.tickets;
ALTER PUBLICATION sec_own_tables SET (publish = 'insert, update');
ALTER PUBLICATION sec_own_tables ADD TABLE rag.collections;
RESET ROLE;
ALTER PUBLICATION sec_own_tables ADD TABLE rag.collections;
CREATE PUBLICATION sec_own_schema FOR TABLES IN SCHEMA sec_owner;
CREATE PUBLICATION sec_everything FOR ALL TABLES;
ALTER PUBLICATION sec_own_schema ADD TABLES IN SCHEMA rag;
DROP PUBLICATION sec_own_tables, sec_own_schema, sec_everything;
REVOKE CREATE ON DATABASE rag_regress FROM sec_owner;

------------------------------------------------------------------------------------------------------------
-- An admin by grant who unwatches the table does not get to read the answers its row-level security kept from
-- them: the ledger's rows and the conversations from before a watch of the collection ended are their askers'
-- and superusers' only (the table can no longer be checked against).
SET ROLE sec_owner;
SELECT rag_grant('tickets', 'sec_attacker', 'admin');
RESET ROLE;
SET ROLE sec_attacker;
SELECT rag_unwatch(w.source, drop_documents => true) FROM rag.watches w WHERE w.source_name = 'sec_owner.tickets';
SELECT count(*) AS readers_ledger_rows FROM rag.queries WHERE collection = 'tickets' AND role = 'sec_reader';
SELECT count(*) AS readers_conversations FROM rag.conversations WHERE owner = 'sec_reader';
SELECT count(*) AS readers_messages FROM rag.messages;
SELECT pg_temp.try_readers_conversation();
RESET ROLE;
SET ROLE sec_owner;
SELECT count(*) AS owner_sees_readers_ledger_rows FROM rag.queries WHERE collection = 'tickets' AND role = 'sec_reader';
RESET ROLE;
SET ROLE sec_reader;
SELECT count(*) > 0 AS reader_keeps_own_rows FROM rag.queries WHERE collection = 'tickets';
SELECT count(*) > 0 AS reader_keeps_conversation FROM rag_conversation(current_setting('sec.reader_conversation')::bigint);
RESET ROLE;
SELECT count(*) > 0 AS superuser_sees_them FROM rag.queries WHERE collection = 'tickets' AND role = 'sec_reader';
-- Answers given after the watch ended are the admins' to read again, but not those given in a conversation
-- from before (they are written from its history).
SET ROLE sec_reader;
SELECT count(*) >= 0 AS asked FROM rag_query('tickets', 'toner');
SELECT outcome IS NOT NULL AS asked_in_the_old_conversation
  FROM rag_ask('tickets', 'and the toner?', conversation => current_setting('sec.reader_conversation')::bigint);
RESET ROLE;
SET ROLE sec_attacker;
SELECT count(*) AS readers_later_rows FROM rag.queries WHERE collection = 'tickets' AND role = 'sec_reader';
RESET ROLE;

-- The ledger's asker is a role, not a name: its rows follow a rename of the role (their name too), and a role
-- created later under the old name, or under a dropped role's name, does not read them.
CREATE ROLE sec_asker IN ROLE rag_reader;
SET ROLE sec_owner;
SELECT rag_grant('owner-docs', 'sec_asker', 'read');
RESET ROLE;
SET ROLE sec_asker;
SELECT count(*) >= 0 AS asked FROM rag_query('owner-docs', 'what the owner wrote');
SELECT count(*) AS own_rows FROM rag.queries;
RESET ROLE;
ALTER ROLE sec_asker RENAME TO sec_asker_renamed;
CREATE ROLE sec_asker IN ROLE rag_reader;
SET ROLE sec_asker;
SELECT count(*) AS newcomers_rows FROM rag.queries;
RESET ROLE;
SET ROLE sec_asker_renamed;
SELECT count(*) AS renamed_roles_rows FROM rag.queries;
RESET ROLE;
DROP OWNED BY sec_asker_renamed;
DROP ROLE sec_asker_renamed;
CREATE ROLE sec_asker_renamed IN ROLE rag_reader;
SET ROLE sec_asker_renamed;
SELECT count(*) AS rows_of_the_dropped_role FROM rag.queries;
RESET ROLE;
SELECT role, role_id IS NULL AS role_gone, count(*) FROM rag.queries WHERE role LIKE 'sec_asker%' GROUP BY 1, 2 ORDER BY 1, 2;
DROP ROLE sec_asker, sec_asker_renamed;

-- public is PUBLIC in any case, unless a role has exactly that name.
CREATE ROLE "Public";
SET ROLE sec_owner;
SELECT rag_grant('owner-docs', 'Public', 'read');
SELECT rag_grant('owner-docs', 'PUBLIC', 'read');
RESET ROLE;
SELECT grantee::oid = 0 AS is_public, grantee::oid = 0 OR grantee::text = '"Public"' AS named_right
  FROM rag.collection_grants g JOIN rag.collections c ON c.id = g.collection_id
 WHERE c.name = 'owner-docs' AND (grantee::oid = 0 OR grantee::text = '"Public"') ORDER BY 1;
SET ROLE sec_owner;
SELECT rag_revoke('owner-docs', 'Public'), rag_revoke('owner-docs', 'public');
RESET ROLE;
DROP ROLE "Public";

------------------------------------------------------------------------------------------------------------
-- What another role may see is not a reader's to learn. The functions behind rag's policies run as rag's owner
-- and every reader may call them, with any role name: they answer only for the caller, a role whose privileges
-- the caller has (it could SET ROLE and ask), or anyone for a superuser.
SET ROLE sec_reader;
SELECT rag._collections_with('sec_owner', 'read');
SELECT rag._collections_held_whole('sec_owner');
SELECT rag._watches_readable_whole('sec_owner');
SELECT rag._ledger_keys_visible('sec_owner');
-- Nor for the extension's owner (whose identity rag's own code runs as), nor for no role at all.
SELECT pg_catalog.pg_get_userbyid(extowner) AS extension_owner FROM pg_extension WHERE extname = 'rag' \gset
\set VERBOSITY terse
SELECT rag._ledger_keys_visible(:'extension_owner');
SELECT rag._collections_with(:'extension_owner', 'read');
SELECT rag._collections_held_whole(:'extension_owner');
SELECT rag._watches_readable_whole(:'extension_owner');
SELECT rag._collections_held_whole(NULL);
SELECT rag._watches_readable_whole(NULL);
\set VERBOSITY default
-- The body behind the wrapper cannot tell who calls it, so it refuses everyone.
SELECT rag_definer._collections_with('sec_reader', 'read');
SELECT cardinality(rag._collections_with('sec_reader', 'read')) = (SELECT count(*) FROM rag.collections) AS own_list,
       rag._ledger_keys_visible(current_user) = '{}' AS reader_administers_nothing;
-- The row check cannot be called directly (it could not tell who asks); inside a search, a watch that does not
-- exist shows no row (rag._row_visible fails closed).
SELECT rag._row_visible(1, -1, '{"id": 1}') AS unknown_watch_row_visible;
RESET ROLE;
GRANT sec_reader TO sec_nobody;
SET ROLE sec_nobody;
SELECT cardinality(rag._collections_with('sec_reader', 'read')) > 0 AS member_may_ask;
SELECT rag._collections_with('sec_owner', 'read');
RESET ROLE;
REVOKE sec_reader FROM sec_nobody;
SELECT cardinality(rag._collections_with('sec_owner', 'admin')) > 0 AS superuser_may_ask;
-- The policies still see the role PostgreSQL runs them as: inside a function of another role (SECURITY
-- DEFINER, called by the reader) and in a materialized view's refresh, a security-restricted operation as the
-- view's owner.
SET ROLE sec_attacker;
CREATE FUNCTION sec_attacker.visible_collections() RETURNS text LANGUAGE sql SECURITY DEFINER
    SET search_path = pg_catalog AS $$ SELECT string_agg(name, ', ' ORDER BY name) FROM rag.collections $$;
GRANT EXECUTE ON FUNCTION sec_attacker.visible_collections() TO sec_reader;
GRANT USAGE ON SCHEMA sec_attacker TO sec_reader;
CREATE MATERIALIZED VIEW sec_attacker.visible_collections_view AS SELECT name FROM rag.collections;
REFRESH MATERIALIZED VIEW sec_attacker.visible_collections_view;
SELECT string_agg(name, ', ' ORDER BY name) AS refreshed_as_its_owner FROM sec_attacker.visible_collections_view;
RESET ROLE;
SET ROLE sec_reader;
SELECT sec_attacker.visible_collections() AS as_the_functions_owner,
       (SELECT string_agg(name, ', ' ORDER BY name) FROM rag.collections) AS as_the_reader;
RESET ROLE;
SET ROLE sec_attacker;
DROP MATERIALIZED VIEW sec_attacker.visible_collections_view;
DROP FUNCTION sec_attacker.visible_collections();
REVOKE USAGE ON SCHEMA sec_attacker FROM sec_reader;
RESET ROLE;

------------------------------------------------------------------------------------------------------------
-- A watch's errors quote the values of the row that failed: rag.watch_status and rag.status show them, and
-- the counts of the watch's rows, only to roles that may read the whole table; rag.lexeme_shares (how common
-- each word is among all the chunks) only to roles that may read every row the collection indexes.
SET ROLE sec_owner;
CREATE TABLE sec_owner.pay (id int PRIMARY KEY, person name NOT NULL, amount text NOT NULL);
ALTER TABLE sec_owner.pay ENABLE ROW LEVEL SECURITY;
CREATE POLICY own_pay ON sec_owner.pay USING (person = current_user);
GRANT SELECT ON sec_owner.pay TO sec_reader;
INSERT INTO sec_owner.pay VALUES (1, 'sec_reader', '100'), (2, 'sec_writer', 'USD 250000 bonus');
SELECT rag_create_collection('pay', embedding_model => 'hash-384') > 0 AS created;
SELECT rag_grant('pay', 'sec_reader', 'read');
SELECT rag_watch('sec_owner.pay', 'pay', content => $$person || ' earns ' || (amount::numeric * 12)::text$$) > 0
       AS watching;
RESET ROLE;
SELECT rag_wait('pay', '30 seconds') AS synced;
SELECT rows_indexed, rows_failed, last_error ~ 'USD 250000' AS reason_quotes_the_row
  FROM rag.watch_status WHERE source = 'sec_owner.pay';
SET ROLE sec_reader;
SELECT rows_indexed, rows_failed, last_error FROM rag.watch_status WHERE source = 'sec_owner.pay';
SELECT documents_ready, documents_failed, last_error FROM rag.status WHERE collection = 'pay';
RESET ROLE;
SET ROLE sec_owner;
SELECT source, rows_watched, rows_indexed, last_error ~ 'USD 250000' AS owner_sees_the_reason FROM rag_watch_status()
 WHERE source = 'sec_owner.pay';
-- An admin by grant who may read only their own rows of the table (none here) gets what the view shows a
-- reader: rows_watched is counted with the owner's rights, past the table's policy, so it is not shown either.
SELECT rag_grant('pay', 'sec_attacker', 'admin');
GRANT SELECT ON sec_owner.pay TO sec_attacker;
RESET ROLE;
SET ROLE sec_attacker;
SELECT source, rows_watched, rows_indexed, rows_failed, last_error FROM rag_watch_status() WHERE source = 'sec_owner.pay';
RESET ROLE;
-- A writer of the collection does not delete a watched row's document (it follows its row; and the writer may
-- not even see the row, here the reader's).
SET ROLE sec_owner;
SELECT rag_grant('pay', 'sec_writer', 'write');
RESET ROLE;
SELECT d.id AS watched_document FROM rag.documents d JOIN rag.collections c ON c.id = d.collection_id
 WHERE c.name = 'pay' AND d.watch_id IS NOT NULL LIMIT 1 \gset
-- To the writer, who may not read the whole table, it is answered as a missing document: the refusal told, id
-- by id, which documents of rows hidden from it exist (red team 24). The owner is told why.
SET ROLE sec_writer;
SELECT rag_delete_document(:watched_document) AS writer_deleted, rag_delete_document(-1) AS missing_deleted;
RESET ROLE;
SET ROLE sec_owner;
SELECT set_config('sec.watched_document', :'watched_document', false) IS NOT NULL AS noted;
DO $$
BEGIN
    PERFORM rag_delete_document(current_setting('sec.watched_document')::bigint);
EXCEPTION WHEN object_not_in_prerequisite_state THEN
    RAISE NOTICE 'refused: %', regexp_replace(SQLERRM, '[0-9]+', 'N');
END $$;
RESET ROLE;
SELECT count(*) AS watched_document_kept FROM rag.documents WHERE id = :watched_document;
INSERT INTO rag.lexeme_shares SELECT c.id, 'bonus', 0.5 FROM rag.collections c WHERE c.name IN ('pay', 'owner-docs');
SET ROLE sec_reader;
SELECT c.name, count(s.*) AS shares_shown FROM rag.collections c LEFT JOIN rag.lexeme_shares s ON s.collection_id = c.id
 WHERE c.name IN ('pay', 'owner-docs') GROUP BY 1 ORDER BY 1;
RESET ROLE;
DELETE FROM rag.lexeme_shares WHERE lexeme = 'bonus';
-- A document whose watch is gone without its cascade (triggers off: a replica's apply, a careless restore)
-- is shown to no reader: the row check fails closed for a watch that does not exist.
SET ROLE sec_reader;
SELECT count(*) AS own_row_found FROM rag_query('pay', 'sec_reader earns', 5, max_distance => 2);
RESET ROLE;
SET session_replication_role = replica;
DELETE FROM rag.row_queue WHERE watch_id = (SELECT id FROM rag.watches WHERE source_name = 'sec_owner.pay');
DELETE FROM rag.watches WHERE source_name = 'sec_owner.pay';
RESET session_replication_role;
SET ROLE sec_reader;
SELECT count(*) AS found_without_its_watch FROM rag_query('pay', 'sec_reader earns', 5, max_distance => 2);
RESET ROLE;
SELECT rag_drop_collection('pay');
SET ROLE sec_owner;
DROP TABLE sec_owner.pay;
RESET ROLE;

------------------------------------------------------------------------------------------------------------
-- 10. A watch's key names one row. A reader is shown a watched row's document when they may read the row with
-- its key: a key two tenants share (a slug) let one tenant's reader read the other tenant's row.
SET ROLE sec_attacker;
CREATE TABLE sec_attacker.pages (tenant text, slug text, body text, PRIMARY KEY (tenant, slug));
SELECT rag_watch('sec_attacker.pages', 'attacker-notes', content => 'body', key => ARRAY['slug']);
-- The whole primary key, or any columns a unique index covers, in any order.
SELECT rag_watch('sec_attacker.pages', 'attacker-notes', content => 'body', key => ARRAY['slug', 'tenant']) > 0 AS watching;
INSERT INTO sec_attacker.pages VALUES ('a', 'welcome', 'Welcome to tenant a.');
GRANT USAGE ON SCHEMA sec_attacker TO sec_reader;
GRANT SELECT ON sec_attacker.pages TO sec_reader;
ALTER TABLE sec_attacker.pages ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_a ON sec_attacker.pages FOR SELECT TO sec_reader USING (tenant = 'a');
SELECT rag_grant('attacker-notes', 'sec_reader', 'read');
SELECT rag_wait('attacker-notes', '60 seconds') AS indexed;
RESET ROLE;
SET ROLE sec_reader;
SELECT count(*) AS found_with_a_unique_key
  FROM rag_query('attacker-notes', 'Welcome to tenant a.', max_distance => 2) WHERE content LIKE 'Welcome%';
RESET ROLE;
SET ROLE sec_attacker;
-- Dropping the unique index later (someone else's DROP elsewhere must not fail for it, so it is not refused)
-- leaves the watch's documents to roles that may read the whole table: the row check fails closed.
ALTER TABLE sec_attacker.pages DROP CONSTRAINT pages_pkey;
SELECT last_error FROM rag.watch_status WHERE source = 'sec_attacker.pages';
RESET ROLE;
SET ROLE sec_reader;
SELECT count(*) AS found_without_a_unique_key
  FROM rag_query('attacker-notes', 'Welcome to tenant a.', max_distance => 2) WHERE content LIKE 'Welcome%';
RESET ROLE;
SET ROLE sec_attacker;
CREATE UNIQUE INDEX pages_slug_tenant ON sec_attacker.pages (slug, tenant);
SELECT last_error IS NULL AS unique_again FROM rag.watch_status WHERE source = 'sec_attacker.pages';
RESET ROLE;
SET ROLE sec_reader;
SELECT count(*) AS found_with_a_unique_key_again
  FROM rag_query('attacker-notes', 'Welcome to tenant a.', max_distance => 2) WHERE content LIKE 'Welcome%';
RESET ROLE;
SET ROLE sec_attacker;
SELECT rag_revoke('attacker-notes', 'sec_reader');
SELECT rag_unwatch('sec_attacker.pages');
DROP TABLE sec_attacker.pages;
RESET ROLE;

------------------------------------------------------------------------------------------------------------
-- Between the sections of a restore the collections' partitions exist, their rows and id sequence not yet: a
-- collection made then took a restored one's id, and its chunks, documents and grants (red team 14). The next
-- id's partition is made here as pg_restore --section=pre-data would have made it.
DO $$ BEGIN
    EXECUTE format('CREATE TABLE rag.%I (LIKE rag.chunks)',
                   'chunks_c' || (pg_sequence_last_value('rag.collections_id_seq') + 1));
END $$;
SET ROLE sec_attacker;
DO $$ BEGIN
    PERFORM rag_create_collection('during-a-restore', embedding_model => 'hash-384');
EXCEPTION WHEN object_in_use THEN
    RAISE NOTICE 'refused: %', regexp_replace(SQLERRM, '[0-9]+', 'N', 'g');
END $$;
RESET ROLE;
SELECT count(*) AS made_during_the_restore FROM rag.collections WHERE name = 'during-a-restore';
DO $$ BEGIN
    EXECUTE format('DROP TABLE rag.%I', 'chunks_c' || pg_sequence_last_value('rag.collections_id_seq'));
END $$;

------------------------------------------------------------------------------------------------------------
-- What a role learns of what it may not read from the planner's estimates and from rag's messages (red team 16).
CREATE ROLE sec_curious LOGIN IN ROLE rag_reader;
CREATE ROLE sec_delegate LOGIN IN ROLE rag_admin;
-- 1. Statistics: the planner estimates a leakproof operator (text's = and <, tsvector's @@) from a column's
-- statistics for every role, so EXPLAIN told a reader which words other collections held and rebuilt their text
-- a letter at a time. No statistics are kept on the text of the tables readers see in part.
SELECT rag_create_collection('stats-hidden', embedding_model => 'hash-384') IS NOT NULL AS created;
WITH d AS (
  INSERT INTO rag.documents (collection_id, title, body, content_sha256, status, chunks_total)
  SELECT c.id, 'Ptarmigan report ' || n, 'x', sha256(('ptarmigan ' || n)::bytea), 'ready', 1
    FROM rag.collections c, generate_series(1, 300) n WHERE c.name = 'stats-hidden'
  RETURNING id, collection_id)
INSERT INTO rag.chunks (document_id, collection_id, ordinal, content, token_estimate, char_start, char_end, tsv)
SELECT d.id, d.collection_id, 0, 'ptarmigan quarterly figures', 3, 0, 27,
       to_tsvector('english', 'ptarmigan quarterly figures')
  FROM d;
SELECT format('rag.%I', rag._chunk_partition(id)) AS stats_partition
  FROM rag.collections WHERE name = 'stats-hidden' \gset
ANALYZE rag.documents;
ANALYZE :stats_partition;
CREATE FUNCTION pg_temp.estimated_rows(p_query text) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_plan json;
BEGIN
    EXECUTE 'EXPLAIN (FORMAT JSON) ' || p_query INTO v_plan;
    RETURN (v_plan->0->'Plan'->>'Plan Rows')::bigint;
END $$;
SET ROLE sec_curious;
SELECT pg_temp.estimated_rows($q$SELECT 1 FROM rag.chunks WHERE tsv @@ to_tsquery('english', 'ptarmigan')$q$)
     = pg_temp.estimated_rows($q$SELECT 1 FROM rag.chunks WHERE tsv @@ to_tsquery('english', 'unwritten')$q$)
       AS same_estimate_for_any_word,
       pg_temp.estimated_rows($q$SELECT 1 FROM rag.chunks WHERE content < 'ptarmigan quarterly g'$q$)
     = pg_temp.estimated_rows($q$SELECT 1 FROM rag.chunks WHERE content < 'ptarmigan quarterly f'$q$)
       AS same_estimate_for_any_prefix,
       pg_temp.estimated_rows($q$SELECT 1 FROM rag.documents WHERE title < 'Ptarmigan report 5'$q$)
     = pg_temp.estimated_rows($q$SELECT 1 FROM rag.documents WHERE title < 'A'$q$)
       AS same_estimate_for_any_title;
RESET ROLE;
-- Every such column of every table readers see in part, and of every partition of rag.chunks.
SELECT count(*) AS text_columns_with_statistics
  FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
 WHERE c.relnamespace = 'rag'::regnamespace AND c.relkind IN ('r', 'p')
   AND (c.relispartition OR EXISTS (SELECT 1 FROM pg_policy p WHERE p.polrelid = c.oid))
   AND a.attnum > 0 AND NOT a.attisdropped AND a.atttypid <> ALL (rag._statistics_kept_types())
   AND coalesce(a.attstattarget, -1) <> 0;
SELECT count(*) AS statistics_kept FROM pg_statistic s JOIN pg_attribute a ON a.attrelid = s.starelid AND a.attnum = s.staattnum
 WHERE a.attrelid = :'stats_partition'::regclass AND a.atttypid <> ALL (rag._statistics_kept_types());
-- 2. Code running as rag's owner sends its caller no message below NOTICE, whatever the caller's
-- client_min_messages: with auto_explain's nested statements on, the plans of rag's search reached a reader
-- with the keys of the rows the table's rules hid from them (tests/e2e/test_pipeline.py tries it). The
-- functions made for watches run inside these.
SELECT count(*) AS definer_functions_without_the_pins
  FROM pg_proc p JOIN pg_depend d ON d.classid = 'pg_proc'::regclass AND d.objid = p.oid AND d.deptype = 'e'
 WHERE d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'rag') AND p.prosecdef
   AND NOT p.proconfig @> ARRAY['client_min_messages=notice', 'debug_print_plan=off',
                                'session_replication_role=origin'];
-- 3. A delegated admin's rag_reindex of a watched table: its filter fails on a row the table's rules keep from
-- them, and the error, which quotes the row's value, is not shown to them; the table's owner sees it.
SET ROLE sec_owner;
CREATE TABLE sec_owner.pay (id int PRIMARY KEY, author name NOT NULL DEFAULT current_user, salary text, body text);
ALTER TABLE sec_owner.pay ENABLE ROW LEVEL SECURITY;
CREATE POLICY own_pay ON sec_owner.pay USING (author = current_user);
INSERT INTO sec_owner.pay (id, salary, body) VALUES (1, '100', 'Salary band of the first post.');
SELECT rag_create_collection('pay', embedding_model => 'hash-384') IS NOT NULL AS created;
SELECT rag_watch('sec_owner.pay', 'pay', content => 'body', filter => 'salary::numeric > 0') > 0 AS watching;
SELECT rag_grant('pay', 'sec_delegate', 'admin');
GRANT USAGE ON SCHEMA sec_owner TO sec_delegate;
GRANT SELECT ON sec_owner.pay TO sec_delegate;
UPDATE sec_owner.pay SET salary = 'SECRET-USD 250000 bonus' WHERE id = 1;
RESET ROLE;
SET ROLE sec_delegate;
SELECT rag_reindex('sec_owner.pay'::regclass);
SELECT rag_reindex('pay');
RESET ROLE;
SET ROLE sec_owner;
SELECT rag_reindex('sec_owner.pay'::regclass);
SELECT rag_unwatch('sec_owner.pay', drop_documents => true);
SELECT rag_drop_collection('pay');
DROP TABLE sec_owner.pay;
RESET ROLE;
SELECT rag_drop_collection('stats-hidden');
-- 4. session_replication_role = replica, which a superuser may let a role set (GRANT SET ON PARAMETER, given to
-- ETL and restore roles), switched off rag's own triggers and cascades for what its functions wrote: the dropped
-- collection's documents and watch stayed behind, and an unwatch left the ledger's guard unchanged (red team 15).
GRANT SET ON PARAMETER session_replication_role TO sec_delegate;
SET ROLE sec_delegate;
SELECT rag_create_collection('replica-mode', embedding_model => 'hash-384') IS NOT NULL AS created;
SELECT rag_ingest('replica-mode', 'Doc', 'A document of a collection dropped in replica mode.') IS NOT NULL AS ingested;
SET session_replication_role = replica;
SELECT rag_drop_collection('replica-mode');
RESET session_replication_role;
RESET ROLE;
SELECT count(*) AS documents_left_behind
  FROM rag.documents d WHERE NOT EXISTS (SELECT 1 FROM rag.collections c WHERE c.id = d.collection_id);
REVOKE SET ON PARAMETER session_replication_role FROM sec_delegate;
-- rag's event triggers fire in replica mode too: a watched table dropped then takes its watch with it.
CREATE TABLE sec_owner.replica_dropped (id int PRIMARY KEY, body text);
SELECT rag_create_collection('replica-watched', embedding_model => 'hash-384') IS NOT NULL AS created;
SELECT rag_watch('sec_owner.replica_dropped', 'replica-watched', content => 'body') > 0 AS watching;
SET session_replication_role = replica;
DROP TABLE sec_owner.replica_dropped;
RESET session_replication_role;
SELECT count(*) AS watches_left FROM rag.watches w JOIN rag.collections c ON c.id = w.collection_id
 WHERE c.name = 'replica-watched';
SELECT rag_drop_collection('replica-watched');
DROP OWNED BY sec_curious, sec_delegate;
DROP ROLE sec_curious, sec_delegate;

------------------------------------------------------------------------------------------------------------
-- 5. Index builds are not an admin's to start on any collection (red team 21): rag._ensure_index checks no
-- privilege, and was callable by every rag_admin. It named collections by id, built HNSW indexes during
-- another owner's bulk load, and held a SHARE lock on their partition for as long as a transaction stayed open.
SET ROLE sec_attacker;
SELECT rag._ensure_index(1);
SELECT count(*) AS ensure_index_callers FROM pg_catalog.pg_roles r
 WHERE NOT r.rolsuper AND has_function_privilege(r.oid, 'rag._ensure_index(integer)', 'EXECUTE');
RESET ROLE;

------------------------------------------------------------------------------------------------------------
-- 6. Red team 24. A reader's row checks run the policies of the searched collection's tables only. Another
-- admin's table, watched into a collection the reader may not even read, had its policy run as every reader
-- who searched any watched collection (the search's join checked documents of every collection), and its
-- function recorded what the reader could read and the reader's question.
SET ROLE sec_owner;
CREATE TABLE sec_owner.notes (id int PRIMARY KEY, author name NOT NULL, body text NOT NULL);
ALTER TABLE sec_owner.notes ENABLE ROW LEVEL SECURITY;
CREATE POLICY own_notes ON sec_owner.notes FOR SELECT USING (author = current_user);
CREATE POLICY insert_own_notes ON sec_owner.notes FOR INSERT WITH CHECK (author = current_user);
GRANT SELECT, INSERT ON sec_owner.notes TO sec_reader;
GRANT USAGE ON SCHEMA sec_owner TO sec_reader;
INSERT INTO sec_owner.notes VALUES (1, 'sec_reader', 'The reader parks in spot number seven.'),
    (2, 'sec_owner', 'Project zebracorn: the merger with globex closes on friday.'),
    (3, 'sec_owner', 'The mango takeover is priced at seventy dollars a share.');
INSERT INTO sec_owner.notes SELECT i, 'sec_owner', 'Filler note ' || i || ' about the canteen menu.' FROM generate_series(4, 60) i;
SELECT rag_create_collection('notes', embedding_model => 'hash-384', max_distance => 2) > 0 AS created;
SELECT rag_watch('sec_owner.notes', 'notes', content => 'body') > 0 AS watching;
SELECT rag_grant('notes', 'sec_reader', 'read');
RESET ROLE;
SET ROLE sec_attacker;
CREATE TABLE sec_attacker.caught (who name, what text);
GRANT USAGE ON SCHEMA sec_attacker TO PUBLIC;
GRANT INSERT ON sec_attacker.caught TO PUBLIC;
CREATE FUNCTION sec_attacker.spy() RETURNS boolean LANGUAGE plpgsql AS $f$
BEGIN
    INSERT INTO sec_attacker.caught VALUES (current_user, current_query());
    RETURN true;
END $f$;
CREATE TABLE sec_attacker.bait (id int PRIMARY KEY, body text NOT NULL);
ALTER TABLE sec_attacker.bait ENABLE ROW LEVEL SECURITY;
CREATE POLICY spying ON sec_attacker.bait FOR SELECT USING (sec_attacker.spy());
GRANT SELECT ON sec_attacker.bait TO PUBLIC;
INSERT INTO sec_attacker.bait SELECT i, 'Bait text number ' || i FROM generate_series(1, 20) i;
SELECT rag_create_collection('bait', embedding_model => 'hash-384') > 0 AS created;
SELECT rag_watch('sec_attacker.bait', 'bait', content => 'body') > 0 AS watching;
RESET ROLE;
SELECT rag_wait('notes', '30 seconds') AND rag_wait('bait', '30 seconds') AS indexed;
-- What autovacuum does in time: with the tables' sizes known the planner hashes rag.documents for the join (the
-- plan that checked every collection's documents), where it probed them by key before.
ANALYZE rag.documents, rag.chunks;
SET ROLE sec_reader;
SELECT mode, count(*) AS hits, count(*) FILTER (WHERE content LIKE '%spot number seven%') AS own_note
  FROM unnest(ARRAY['hybrid', 'vector', 'keyword']) mode, rag_query('notes', 'where does the reader park', 5, mode => mode)
 GROUP BY mode ORDER BY mode;
SELECT count(*) AS answered FROM rag_ask('notes', 'where does the reader park', k => 3);
RESET ROLE;
SELECT count(*) AS policy_runs_for_other_collections FROM sec_attacker.caught;
-- Under the table's row-level security the check is on the row's version too. A row handed to the reader and
-- redacted in one UPDATE: until the worker syncs it, its document holds the earlier text, which the policy kept
-- from the reader; it is not found meanwhile, while the write's batch waits and once its key is queued. Each
-- case in a transaction of its own, which the worker cannot see, so that it cannot sync the row first.
SET ROLE sec_reader;
SELECT count(*) AS zebracorn_before FROM rag_query('notes', 'zebracorn merger globex', 5) WHERE content LIKE '%zebracorn%';
RESET ROLE;
BEGIN;
SET LOCAL ROLE sec_owner;
UPDATE sec_owner.notes SET author = 'sec_reader', body = 'Redacted.' WHERE id = 2;
SET LOCAL ROLE sec_reader;
SELECT count(*) AS earlier_text_while_batched FROM rag_query('notes', 'zebracorn merger globex', 5) WHERE content LIKE '%zebracorn%';
RESET ROLE;
SELECT rag._spread_batches() > 0 AS spread;
SET LOCAL ROLE sec_reader;
SELECT count(*) AS earlier_text_while_queued FROM rag_query('notes', 'zebracorn merger globex', 5) WHERE content LIKE '%zebracorn%';
SELECT count(*) AS own_note_still_found FROM rag_query('notes', 'where does the reader park', 5) WHERE content LIKE '%spot number seven%';
-- The table's owner, whom its policies spare, may read every version: the document is not hidden from them.
SET LOCAL ROLE sec_owner;
SELECT count(*) AS owner_finds_it FROM rag_query('notes', 'zebracorn merger globex', 5) WHERE content LIKE '%zebracorn%';
ROLLBACK;
-- A deleted row's key inserted again by the reader (its INSERT policy lets it add its own rows): the deleted
-- row's document is not the reader's row.
BEGIN;
SET LOCAL ROLE sec_owner;
DELETE FROM sec_owner.notes WHERE id = 3;
SET LOCAL ROLE sec_reader;
INSERT INTO sec_owner.notes VALUES (3, 'sec_reader', 'My own note.');
SELECT count(*) AS deleted_text FROM rag_query('notes', 'mango takeover price', 5) WHERE content LIKE '%mango%';
ROLLBACK;
-- A key that rag_reindex only re-reads does not hide the row.
BEGIN;
SET LOCAL ROLE sec_owner;
SELECT rag_reindex('sec_owner.notes'::regclass) >= 3 AS requeued;
SET LOCAL ROLE sec_reader;
SELECT count(*) AS own_note_while_reread FROM rag_query('notes', 'where does the reader park', 5) WHERE content LIKE '%spot number seven%';
ROLLBACK;
-- Red team 25: a key whose JSON a writer's session settings spell differently (TimeZone for timestamptz,
-- extra_float_digits for floats, ...) is refused: a write from another time zone made a second document and
-- left the first, with the earlier text, shown to the reader. Through a domain or an array too.
SET ROLE sec_owner;
CREATE TABLE sec_owner.events (at timestamptz PRIMARY KEY, body text NOT NULL);
SELECT rag_watch('sec_owner.events', 'notes', content => 'body');
CREATE DOMAIN sec_owner.reading AS float8;
CREATE TABLE sec_owner.readings (site int, taken sec_owner.reading[], body text NOT NULL, PRIMARY KEY (site, taken));
SELECT rag_watch('sec_owner.readings', 'notes', content => 'body');
SELECT rag._key_unstable_column('sec_owner.readings', ARRAY['site']) IS NULL AS integer_key_is_stable;
-- A range's JSON is its text, where a date follows DateStyle (review of red team 25); a date alone or in an
-- array is written in ISO form whatever the setting.
CREATE TABLE sec_owner.periods (during daterange PRIMARY KEY, booked tstzmultirange UNIQUE, days date[] UNIQUE,
                                day date UNIQUE, owner_table regclass UNIQUE, body text NOT NULL);
SELECT k AS key_column, rag._key_unstable_column('sec_owner.periods', ARRAY[k]) IS NOT NULL AS refused
  FROM unnest(ARRAY['during', 'booked', 'days', 'day', 'owner_table']) k;
DROP TABLE sec_owner.events, sec_owner.readings, sec_owner.periods;
DROP DOMAIN sec_owner.reading;
SELECT rag_drop_collection('notes');
RESET ROLE;
SET ROLE sec_attacker;
SELECT rag_drop_collection('bait');
RESET ROLE;

------------------------------------------------------------------------------------------------------------
-- 7. rag_await has no SET clause (it commits), so it runs with its caller's search_path, and PL/pgSQL compiles
-- it once per session with the path of its first caller. A type it named without a schema was taken from
-- there: a domain an attacker planted as pg_temp.timestamptz ran the attacker's check as every later caller
-- of the session, another role's SECURITY DEFINER function included (review of session 40). Nothing here may
-- print the spy's notice.
SET ROLE sec_attacker;
CREATE FUNCTION pg_temp.spy(pg_catalog.timestamptz) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    RAISE NOTICE 'the planted domain runs as %', current_user;
    RETURN true;
END $$;
CREATE DOMAIN pg_temp.timestamptz AS pg_catalog.timestamptz CHECK (pg_temp.spy(VALUE));
CREATE DOMAIN pg_temp.int4 AS pg_catalog.int4 CHECK (pg_temp.spy(pg_catalog.now()));
CREATE DOMAIN pg_temp.bool AS pg_catalog.bool CHECK (pg_temp.spy(pg_catalog.now()));
SET search_path = pg_temp, pg_catalog, public;
CALL rag_await('attacker-notes', '0');
RESET search_path;
RESET ROLE;
SET ROLE sec_owner;
CALL rag_await('owner-docs', '0');
RESET ROLE;
DROP DOMAIN pg_temp.timestamptz, pg_temp.int4, pg_temp.bool;

------------------------------------------------------------------------------------------------------------
-- A watch's expressions are not run as a superuser who did not write them. They run as the table's owner, so
-- ALTER TABLE … OWNER TO a superuser, REASSIGN OWNED … TO one, and a superuser's pg_restore --no-owner each
-- made an ordinary role a superuser through a function its watch calls (helper-93). The function here
-- promotes its author whenever it runs as a superuser.
CREATE ROLE sec_handover LOGIN IN ROLE rag_admin;
CREATE SCHEMA sec_handover AUTHORIZATION sec_handover;
SET ROLE sec_handover;
CREATE FUNCTION sec_handover.promote(t text) RETURNS text LANGUAGE plpgsql AS $f$
BEGIN
    IF (SELECT rolsuper FROM pg_roles WHERE rolname = current_user) THEN
        EXECUTE 'ALTER ROLE sec_handover SUPERUSER';
    END IF;
    RETURN t;
END $f$;
SELECT rag_create_collection('handover', embedding_model => 'hash-384') > 0 AS created;
CREATE TABLE sec_handover.notes (id int PRIMARY KEY, body text);
INSERT INTO sec_handover.notes VALUES (1, 'written before the handover');
SELECT rag_watch('sec_handover.notes', 'handover', content => 'sec_handover.promote(body)',
                 filter => 'sec_handover.promote(body) IS NOT NULL') AS handover_watch \gset
SELECT written_by FROM rag.watches WHERE id = :handover_watch;
RESET ROLE;
SELECT pg_temp.wait_for($$SELECT status = 'ready' FROM rag.documents WHERE source = 'sec_handover.notes'$$) AS indexed;
-- Handing the table to a superuser is refused, by either command.
\set VERBOSITY terse
ALTER TABLE sec_handover.notes OWNER TO CURRENT_USER;
REASSIGN OWNED BY sec_handover TO CURRENT_USER;
\set VERBOSITY default
SELECT pg_get_userbyid(relowner) = 'sec_handover' AS still_theirs FROM pg_class WHERE oid = 'sec_handover.notes'::regclass;
-- To a role that is not a superuser it may go: the expressions then run with that role's rights.
CREATE ROLE sec_heir;
ALTER TABLE sec_handover.notes OWNER TO sec_heir;
ALTER TABLE sec_handover.notes OWNER TO sec_handover;
DROP OWNED BY sec_heir;
DROP ROLE sec_heir;
-- What a superuser's pg_restore --no-owner leaves: the table and the watch's functions the superuser's, made
-- without rag's install (simulated with the event trigger that would refuse it turned off).
ALTER EVENT TRIGGER rag_watch_alter DISABLE;
ALTER TABLE sec_handover.notes OWNER TO CURRENT_USER;
DO $$
DECLARE
    v_function regprocedure;
BEGIN
    FOR v_function IN SELECT p.oid::regprocedure FROM pg_proc p JOIN rag.watches w
                          ON p.proname IN ('_watch_' || w.id, '_watch_' || w.id || '_row')
                       WHERE p.pronamespace = 'rag'::regnamespace AND w.source = 'sec_handover.notes'::regclass LOOP
        EXECUTE format('ALTER FUNCTION %s OWNER TO CURRENT_USER', v_function);
    END LOOP;
END $$;
ALTER EVENT TRIGGER rag_watch_alter ENABLE ALWAYS;
-- A write's trigger (the filter, as the table's owner), the worker, rag_reindex and rag_watch_status refuse to
-- run the expressions.
\set VERBOSITY terse
INSERT INTO sec_handover.notes VALUES (2, 'written after the handover');
UPDATE sec_handover.notes SET body = 'changed after the handover' WHERE id = 1;
SELECT rag_reindex('sec_handover.notes'::regclass);
\set VERBOSITY default
SELECT pg_temp.wait_for($$SELECT EXISTS (SELECT 1 FROM rag.row_queue q WHERE q.watch_id = $$ || :handover_watch ||
                        $$ AND q.last_error LIKE '%as a superuser who did not write them%')$$) AS worker_refused;
SELECT rows_watched, last_error FROM rag_watch_status() WHERE source = 'sec_handover.notes';
SELECT rolsuper AS handover_is_superuser FROM pg_roles WHERE rolname = 'sec_handover';
-- Nor when the watch's row is not there (a restore without rag's rows): who wrote the filter is not known, so
-- the trigger runs no filter and queues nothing (there is no watch to queue for).
DELETE FROM rag.watches WHERE id = :handover_watch;
INSERT INTO sec_handover.notes VALUES (2, 'written after the watch''s row went');
SELECT rolsuper AS handover_is_superuser,
       (SELECT count(*) FROM rag.row_batches WHERE watch_id = :handover_watch) AS batches
  FROM pg_roles WHERE rolname = 'sec_handover';
-- The table's owner takes the triggers away, and the table is theirs to use.
SELECT rag_unwatch('sec_handover.notes', drop_documents => true) AS unwatched;
INSERT INTO sec_handover.notes VALUES (3, 'written once unwatched');
SELECT rolsuper AS handover_is_superuser FROM pg_roles WHERE rolname = 'sec_handover';
SELECT rag_drop_collection('handover') AS dropped;
DROP SCHEMA sec_handover CASCADE;
DROP OWNED BY sec_handover;
DROP ROLE sec_handover;
-- A superuser's own watch of a superuser's table runs, its author renamed or not.
CREATE ROLE sec_super SUPERUSER;
SET ROLE sec_super;
SELECT rag_create_collection('super-notes', embedding_model => 'hash-384') > 0 AS created;
CREATE TABLE sec_super_notes (id int PRIMARY KEY, body text);
SELECT rag_watch('sec_super_notes', 'super-notes', content => 'body', filter => 'body IS NOT NULL') > 0 AS watching;
RESET ROLE;
ALTER ROLE sec_super RENAME TO sec_super_renamed;
SELECT written_by FROM rag.watches WHERE source = 'sec_super_notes'::regclass;
INSERT INTO sec_super_notes VALUES (1, 'written once its author was renamed');
SELECT rag_reindex('sec_super_notes'::regclass) AS queued;
SELECT rag_unwatch('sec_super_notes', drop_documents => true) AS unwatched, rag_drop_collection('super-notes') AS dropped;
DROP TABLE sec_super_notes;
DROP OWNED BY sec_super_renamed;
DROP ROLE sec_super_renamed;
-- Nor as a role with a superuser's powers: a member (directly or through another role) of
-- pg_execute_server_program, pg_write_server_files or pg_read_server_files, which PostgreSQL documents as ways
-- to a superuser's access. The author's filter here runs a program as the server when it can, and notes it.
CREATE ROLE sec_author LOGIN IN ROLE rag_admin;
CREATE SCHEMA sec_author AUTHORIZATION sec_author;
SET ROLE sec_author;
CREATE TABLE sec_author.shell_runs (ran_as name);
GRANT INSERT ON sec_author.shell_runs TO PUBLIC;
CREATE FUNCTION sec_author.shell(t text) RETURNS boolean LANGUAGE plpgsql AS $f$
BEGIN
    IF pg_has_role('pg_execute_server_program', 'MEMBER') THEN
        COPY (SELECT 1) TO PROGRAM 'cat > /dev/null';
        INSERT INTO sec_author.shell_runs VALUES (current_user);
    END IF;
    RETURN true;
END $f$;
SELECT rag_create_collection('author-notes', embedding_model => 'hash-384') > 0 AS created;
CREATE TABLE sec_author.notes (id int PRIMARY KEY, body text);
SELECT rag_watch('sec_author.notes', 'author-notes', content => 'body', filter => 'sec_author.shell(body)') > 0 AS watching;
RESET ROLE;
CREATE ROLE sec_files;
GRANT pg_read_server_files TO sec_files;
CREATE ROLE sec_etl IN ROLE sec_files;
CREATE ROLE sec_shell;
GRANT pg_execute_server_program TO sec_shell;
GRANT USAGE ON SCHEMA sec_author TO sec_etl, sec_shell;
-- Before PostgreSQL 16 CREATEROLE counts too: such a role could grant itself pg_execute_server_program.
CREATE ROLE sec_creator CREATEROLE;
SELECT rag._superuser_powers('sec_creator'::regrole)
       = CASE WHEN current_setting('server_version_num')::integer < 160000 THEN ARRAY['CREATEROLE'] ELSE '{}' END
       AS createrole_counted_where_it_grants_itself_those,
       rag._superuser_powers('sec_etl'::regrole) AS through_a_group,
       rag._superuser_powers('sec_author'::regrole) AS author_has_none;
DROP ROLE sec_creator;
-- Handing the table to such a role is refused, by either command, the power named.
\set VERBOSITY terse
ALTER TABLE sec_author.notes OWNER TO sec_etl;
REASSIGN OWNED BY sec_author TO sec_shell;
\set VERBOSITY default
-- Handed to an ordinary role that is given such powers afterwards: a filtered insert's trigger (which runs the
-- filter as that role, whoever writes), rag_reindex and the worker refuse.
CREATE ROLE sec_heir2;
GRANT USAGE ON SCHEMA sec_author TO sec_heir2;
ALTER TABLE sec_author.notes OWNER TO sec_heir2;
GRANT pg_execute_server_program TO sec_heir2;
\set VERBOSITY terse
INSERT INTO sec_author.notes VALUES (1, 'written once its owner could run programs');
SELECT rag_reindex('sec_author.notes'::regclass);
\set VERBOSITY default
SELECT count(*) AS shell_ran FROM sec_author.shell_runs;
-- An author who may act as the new owner already (a member of that role) may hand the table over; an author
-- with powers of their own may not, as theirs may be less than the owner's (pg_read_server_files against a
-- superuser's: helper-97).
REVOKE pg_execute_server_program FROM sec_heir2;
ALTER TABLE sec_author.notes OWNER TO sec_author;
GRANT pg_write_server_files TO sec_author;
\set VERBOSITY terse
ALTER TABLE sec_author.notes OWNER TO sec_etl;
\set VERBOSITY default
GRANT sec_etl TO sec_author;
ALTER TABLE sec_author.notes OWNER TO sec_etl;
SELECT pg_get_userbyid(relowner) AS owner FROM pg_class WHERE oid = 'sec_author.notes'::regclass;
ALTER TABLE sec_author.notes OWNER TO sec_author;
REVOKE sec_etl FROM sec_author;
REVOKE pg_write_server_files FROM sec_author;
-- A member of a superuser role is refused too: it can give a SECURITY DEFINER function of its own to that role
-- and call it (helper-97 ran a program as the server so, from the trigger and from the worker).
CREATE ROLE sec_su SUPERUSER;
CREATE ROLE sec_ops IN ROLE sec_su;
GRANT USAGE ON SCHEMA sec_author TO sec_ops;
SELECT rag._superuser_powers('sec_ops'::regrole) AS through_a_superuser;
\set VERBOSITY terse
ALTER TABLE sec_author.notes OWNER TO sec_ops;
\set VERBOSITY default
REVOKE USAGE ON SCHEMA sec_author FROM sec_ops;
DROP ROLE sec_ops, sec_su;
-- What a watch runs and who wrote it are written by rag's functions or a superuser only. A role that writes
-- every table past its privileges and its policies (pg_write_all_data, BYPASSRLS) rewrote a superuser-owned
-- table's watch, and the worker ran it as that superuser (helper-97).
CREATE ROLE sec_all_writer BYPASSRLS IN ROLE pg_write_all_data, pg_read_all_data;
SET ROLE sec_all_writer;
\set VERBOSITY terse
UPDATE rag.watches SET content_expr = 'sec_author.shell(body)::text' WHERE source = 'sec_author.notes'::regclass;
UPDATE rag.watches SET written_by = 'postgres' WHERE source = 'sec_author.notes'::regclass;
INSERT INTO rag.watches (source, source_name, collection_id, content_expr, key_columns, written_by)
SELECT 'sec_author.shell_runs'::regclass, 'sec_author.shell_runs', collection_id, 'ran_as', '{ran_as}', 'postgres'
  FROM rag.watches WHERE source = 'sec_author.notes'::regclass;
-- Nor delete a watch: its documents lost their watch, and with it the check of the table's own rules, so every
-- reader of the collection read rows those rules hid (helper-98).
DELETE FROM rag.watches WHERE source = 'sec_author.notes'::regclass;
-- Nor may it say where keys go: it pointed every provider at a server of its own, and the worker sent the key
-- there (helper-98).
UPDATE rag.providers SET base_url = 'http://127.0.0.1:9/v1';
INSERT INTO rag.providers (name, kind, base_url, api_key_setting) VALUES ('sec_mine', 'openai', 'http://127.0.0.1:9/v1', 'file:openai');
INSERT INTO rag.key_grants (api_key_setting, base_url, granted_by) VALUES ('file:openai', 'http://127.0.0.1:9/v1', 'postgres');
DELETE FROM rag.key_grants;
\set VERBOSITY default
-- Nor any other column of a watch: two watches given one source_name showed each other's counts.
UPDATE rag.watches SET source_name = source_name WHERE source = 'sec_author.notes'::regclass;
\set VERBOSITY default
RESET ROLE;
SELECT count(*) FILTER (WHERE base_url = 'http://127.0.0.1:9/v1') AS redirected,
       count(*) FILTER (WHERE name = 'sec_mine') AS planted
  FROM rag.providers;
SELECT content_expr, written_by FROM rag.watches WHERE source = 'sec_author.notes'::regclass;
-- Nor any other table of rag's. Cleared, a document's watch_id let every reader of the collection read a row
-- the watched table's own policy hid from them; a chunk moved to a document they may read (written straight
-- to its collection's partition, past the parent's statement triggers) would have done the same; a
-- collection's owner rewritten made the writer its owner; a grant gave it to anyone (helper-98).
SELECT rag_create_collection('sec-all', embedding_model => 'hash-384') > 0 AS created;
CREATE TABLE public.sec_all_rows (id int PRIMARY KEY, body text, public boolean);
ALTER TABLE public.sec_all_rows ENABLE ROW LEVEL SECURITY;
CREATE POLICY only_public ON public.sec_all_rows FOR SELECT USING (public);
INSERT INTO public.sec_all_rows VALUES (1, 'The canteen opens at eight.', true),
                                       (2, 'Hidden text about the merger.', false);
SELECT rag_watch('public.sec_all_rows', 'sec-all', content => 'body') > 0 AS watching;
SELECT rag_wait('sec-all', '30 seconds') AS synced;
CREATE ROLE sec_all_reader IN ROLE rag_reader;
GRANT SELECT ON public.sec_all_rows TO sec_all_reader;
SELECT rag_grant('sec-all', 'sec_all_reader', 'read') IS NULL AS granted;
SELECT set_config('sec.all_partition', (SELECT tableoid::regclass::text FROM rag.chunks LIMIT 1), false) IS NOT NULL
       AS partition_known;
-- Tries a statement on chunks, the partition's name (which holds the collection's id) left out of what it says.
CREATE FUNCTION pg_temp.sec_try(p_statement text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format(p_statement, current_setting('sec.all_partition'));
    RETURN 'written';
EXCEPTION WHEN insufficient_privilege THEN
    RETURN regexp_replace(SQLERRM, 'chunks_[0-9a-z_]+', 'chunks_N');
END $$;
SET ROLE sec_all_writer;
\set VERBOSITY terse
UPDATE rag.documents SET watch_id = NULL;
INSERT INTO rag.collection_grants SELECT * FROM rag.collection_grants;
UPDATE rag.collections SET owner = 'sec_all_writer'::regrole;
UPDATE rag.migrations SET embedding_provider = embedding_provider;
DELETE FROM rag.queries;
DELETE FROM rag.row_batches;
\set VERBOSITY default
-- Chunks, through the parent and straight to the partition.
SELECT pg_temp.sec_try(s) AS outcome
  FROM unnest(ARRAY['UPDATE rag.chunks SET document_id = (SELECT min(document_id) FROM rag.chunks)',
                    'DELETE FROM rag.chunks',
                    'UPDATE %1$s SET document_id = (SELECT max(document_id) FROM %1$s)',
                    'INSERT INTO %1$s OVERRIDING SYSTEM VALUE SELECT * FROM %1$s']) WITH ORDINALITY AS t(s, n)
 ORDER BY n;
-- BYPASSRLS skips the queue's insert policy, which a trigger keeps: a batch due at infinity for another owner's
-- row kept every later change to the row, a redaction included, out of the index (helper-99).
\set VERBOSITY terse
INSERT INTO rag.row_batches (watch_id, keys, not_before)
SELECT id, '[{"id": 1}]', 'infinity' FROM rag.watches WHERE source = 'public.sec_all_rows'::regclass;
\set VERBOSITY default
RESET ROLE;
-- A table's owner with BYPASSRLS still queues its writes, from the watch's own triggers.
CREATE ROLE sec_all_owner BYPASSRLS;
ALTER TABLE public.sec_all_rows OWNER TO sec_all_owner;
UPDATE public.sec_all_rows SET body = 'The canteen opens at nine.' WHERE id = 1;
SELECT rag_wait('sec-all', '30 seconds') AS synced;
SELECT count(*) FILTER (WHERE content ~ 'nine') AS new_text_indexed, count(*) FILTER (WHERE content ~ 'eight') AS old_text_left
  FROM rag.chunks WHERE collection_id = (SELECT id FROM rag.collections WHERE name = 'sec-all');
-- A restore with --disable-triggers ends with ENABLE TRIGGER ALL, which leaves triggers ORIGIN, skipped under
-- session_replication_role = replica (which a superuser may let a role set): rag's are made ALWAYS again.
ALTER TABLE rag.documents DISABLE TRIGGER ALL;
ALTER TABLE rag.documents ENABLE TRIGGER ALL;
ALTER TABLE rag.row_batches DISABLE TRIGGER ALL;
ALTER TABLE rag.row_batches ENABLE TRIGGER ALL;
DO $$
BEGIN
    EXECUTE format('ALTER TABLE %s DISABLE TRIGGER ALL', current_setting('sec.all_partition'));
    EXECUTE format('ALTER TABLE %s ENABLE TRIGGER ALL', current_setting('sec.all_partition'));
END $$;
SELECT CASE WHEN c.relname LIKE 'chunks\_%' THEN 'chunks_N' ELSE c.relname END AS relname, t.tgname, t.tgenabled
  FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
 WHERE c.oid IN ('rag.documents'::regclass, 'rag.row_batches'::regclass, current_setting('sec.all_partition')::regclass)
   AND NOT t.tgisinternal
 ORDER BY 1, 2;
SET ROLE sec_all_reader;
SELECT title, watch_id IS NOT NULL AS watched FROM rag.documents WHERE collection_id = (SELECT id FROM rag.collections WHERE name = 'sec-all');
SELECT count(*) AS chunks_seen, bool_or(content ~ 'merger') AS merger_seen FROM rag.chunks;
SELECT count(*) AS found, bool_or(content ~ 'merger') AS merger_found FROM rag_query('sec-all', 'merger canteen', 5, max_distance => 2);
RESET ROLE;
SELECT pg_get_userbyid(owner) = current_user AS owner_kept FROM rag.collections WHERE name = 'sec-all';
DROP ROLE sec_all_writer;
-- pg_read_all_data passes no policy, but read the tables that had none: a partition of rag.chunks named
-- directly (hidden rows' text, other collections' chunks), the queues (keys and the values their errors quote),
-- the chunks set aside (helper-101). They show it nothing.
CREATE ROLE sec_all_peeker IN ROLE pg_read_all_data;
CREATE FUNCTION pg_temp.sec_count(p_table text) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    v_count bigint;
BEGIN
    EXECUTE format('SELECT count(*) FROM %s', p_table) INTO v_count;
    RETURN v_count;
END $$;
SELECT pg_temp.sec_count(current_setting('sec.all_partition')) > 0 AS partition_holds_rows;
DO $$
BEGIN
    EXECUTE format('ANALYZE %s, rag.row_queue, rag.queue, rag.key_grants', current_setting('sec.all_partition'));
END $$;
SELECT count(*) > 0 AS partition_has_statistics FROM pg_stats
 WHERE schemaname = 'rag' AND tablename = split_part(current_setting('sec.all_partition'), '.', 2);
SET ROLE sec_all_peeker;
SELECT t AS table_read, pg_temp.sec_count(CASE t WHEN 'a partition of rag.chunks' THEN current_setting('sec.all_partition')
                                                ELSE t END) AS rows_seen
  FROM unnest(ARRAY['a partition of rag.chunks', 'rag.row_queue', 'rag.queue', 'rag.set_aside_chunks',
                    'rag.upkeep_failures', 'rag.key_grants', 'rag.row_batches']) AS t;
SELECT count(*) AS statistics_seen FROM pg_stats
 WHERE schemaname = 'rag'
   AND (tablename IN ('row_queue', 'queue', 'set_aside_chunks', 'upkeep_failures', 'key_grants')
        OR tablename = split_part(current_setting('sec.all_partition'), '.', 2));
RESET ROLE;
DROP ROLE sec_all_peeker;
SELECT rag_unwatch('public.sec_all_rows', drop_documents => true) AS unwatched, rag_drop_collection('sec-all') AS dropped;
DROP TABLE public.sec_all_rows;
DROP OWNED BY sec_all_reader, sec_all_owner;
DROP ROLE sec_all_reader, sec_all_owner;
SELECT rag_unwatch('sec_author.notes', drop_documents => true) AS unwatched, rag_drop_collection('author-notes') AS dropped;
DROP SCHEMA sec_author CASCADE;
DROP OWNED BY sec_author, sec_etl, sec_shell, sec_heir2;
DROP ROLE sec_author, sec_etl, sec_files, sec_shell, sec_heir2;

------------------------------------------------------------------------------------------------------------
-- The owner drops their own collection; grants go with it.
SET ROLE sec_owner;
SELECT rag_drop_collection('tickets'), rag_drop_collection('owner-docs');
RESET ROLE;
SELECT count(*) AS grants_left FROM rag.collection_grants;
SELECT rag_drop_collection('attacker-notes');
DROP SCHEMA sec_owner, sec_attacker, sec_secret CASCADE;
DROP OWNED BY sec_owner, sec_attacker, sec_writer, sec_reader, sec_nobody;
DROP ROLE sec_owner, sec_attacker, sec_writer, sec_reader, sec_nobody;
