"""Workers that store into one collection side by side: a store shares the collection's row instead of locking it
(rag._lock_for_store), the index decision is skipped while another store holds the row and left to a
worker's repair (rag._fit_index_to_load, rag._repair_indexes), and a slow provider's documents are claimed in groups of about a
slice's work, so a second worker finds some to take. And the lexeme measure a load's end asks for steps aside
for a drop of the collection (the lock order: the collection's row before rag.chunks)."""
import time
import unittest
from functools import partial

from support import background_psql as background_psql_in
from support import InItsOwnDatabase
from support import psql as psql_in
from support import scalar as scalar_in
from support import wait_until as wait_until_in
from support import read_line

DB = "rag_e2e_concurrent_stores"
psql = partial(psql_in, db=DB)
scalar = partial(scalar_in, db=DB)
background_psql = partial(background_psql_in, db=DB)
wait_until = partial(wait_until_in, db=DB)


class ConcurrentStores(InItsOwnDatabase):
    DB = DB

    def test_a_a_store_goes_ahead_while_another_shares_the_collection(self):
        # The dimension is set up front: a collection's first vectors take its row alone, to set it. The index
        # rag_create_collection built is dropped (as a bulk load drops it) and the parameters recorded for the
        # next build.
        psql("SELECT rag_create_collection('shared', embedding_model => 'hash-384', dimensions => 384, "
             "chunk_size => 200, chunk_overlap => 0); "
             "SELECT rag_set_search('shared', m => 8, ef_construction => 40); "
             "SELECT rag._suspend_index(id) FROM rag.collections WHERE name = 'shared'")
        self.assertEqual(scalar("SELECT index_name IS NULL FROM rag.collections WHERE name = 'shared'"), "t")
        # What another worker's store holds while it writes (rag._lock_for_store): the collection's row, shared.
        holder = background_psql("BEGIN; SELECT 'held' FROM rag.collections WHERE name = 'shared' FOR SHARE;")
        try:
            self.assertEqual(read_line(holder).strip(), "held")
            # Small documents (the whole-document path, rag._store_documents) and one of more chunks than one
            # call takes (the regular path: rag._store_chunks, rag._store_embeddings, rag._finish).
            psql("SELECT rag_ingest('shared', 'Note ' || g, 'Shared note ' || g || ' about topic ' || g % 7 || '.') "
                 "FROM generate_series(1, 20) g")
            psql("SELECT rag_ingest('shared', 'Long', string_agg('Paragraph ' || g || ' of the long document, "
                 "which the regular path embeds batch by batch.', E'\\n\\n')) FROM generate_series(1, 100) g")
            self.assertEqual(scalar("SELECT rag_wait('shared', '30 seconds')"), "t",
                             "the worker's stores waited for another holder of the collection's row")
            self.assertEqual(psql("SELECT count(*), sum(chunks_embedded) = sum(chunks_total) FROM rag.documents d "
                                  "JOIN rag.collections c ON c.id = d.collection_id "
                                  "WHERE c.name = 'shared' AND d.status = 'ready'"), [["21", "t"]])
            self.assertGreater(int(scalar("SELECT chunks_total FROM rag.documents WHERE title = 'Long'")), 32,
                               "the long document should have taken the regular path")
            # The index decision needs the row alone: it was left for later, and searches are exact meanwhile.
            self.assertEqual(scalar("SELECT index_name IS NULL FROM rag.collections WHERE name = 'shared'"), "t")
            self.assertEqual(scalar("SELECT count(*) FROM rag_query('shared', 'shared note about topic 3', k => 3, "
                                    "max_distance => 2)"), "3")
        finally:
            out, err = holder.communicate(input="COMMIT;\n", timeout=60)
        self.assertEqual(holder.returncode, 0, err)
        # Once the row is free, the idle worker's repair builds the index with the collection's parameters.
        self.assertTrue(wait_until("SELECT to_regclass('rag.' || index_name) IS NOT NULL FROM rag.collections "
                                   "WHERE name = 'shared'", seconds=60), "the index was never built")
        self.assertIn("m='8', ef_construction='40'",
                      scalar("SELECT indexdef FROM pg_indexes i JOIN rag.collections c ON i.indexname = c.index_name "
                             "WHERE c.name = 'shared'"))

    def test_b_a_slow_providers_documents_are_spread_over_the_workers(self):
        # 32 documents of 12 chunks, two to a provider call at 290 ms a call: 4.6 s of work, all of which one
        # claim could take at once (up to 32 documents). Claimed that way, nothing is left for a second worker,
        # and the group holds one worker for seconds. A group is given back after a slice (one second), and
        # later claims take about a slice's work at the pace the worker has seen, so documents wait unclaimed
        # while others are worked on and both workers claim some.
        psql("ALTER SYSTEM SET rag.workers_per_database = 2;\nSELECT pg_reload_conf();", db="postgres")
        try:
            self.assertTrue(wait_until_in(f"SELECT count(*) = 2 FROM pg_stat_activity WHERE backend_type = 'rag worker' "
                                          f"AND datname = '{DB}'", db="postgres", seconds=60),
                            "the second worker never started")
            # A model name of its own: the test server counts calls per model name, and other scenarios count theirs.
            model = "hash-384@slow290"
            psql(f"SELECT rag_create_collection('paced', embedding_model => '{model}', dimensions => 384, "
                 "chunk_size => 100, chunk_overlap => 0)")
            # Paragraphs of about 90 characters: one to a chunk of at most 100.
            psql("SELECT rag_ingest('paced', 'Doc ' || d, string_agg('Doc ' || d || ' paragraph ' || p || ' is long "
                 "enough for the chunker to keep it in a chunk of its own.', E'\\n\\n')) "
                 "FROM generate_series(1, 32) d, generate_series(1, 12) p GROUP BY d")
            # Watched from inside the server every 10 ms (a new snapshot each statement) until the queue is
            # empty: who holds claims, and whether documents wait unclaimed beside claimed ones.
            observed = psql("""
                CREATE TEMP TABLE observed (n serial, claimers integer[], unclaimed bigint);
                DO $$
                BEGIN
                    FOR i IN 1..6000 LOOP
                        INSERT INTO observed (claimers, unclaimed)
                        SELECT array_agg(DISTINCT q.claimed_by) FILTER (WHERE q.claimed_by IS NOT NULL),
                               count(*) FILTER (WHERE q.claimed_by IS NULL)
                          FROM rag.queue q JOIN rag.collections c ON c.id = q.collection_id WHERE c.name = 'paced'
                        HAVING count(*) > 0;
                        EXIT WHEN NOT FOUND;
                        PERFORM pg_sleep(0.01);
                    END LOOP;
                END $$;
                SELECT (SELECT count(DISTINCT claimer) FROM observed, unnest(claimers) claimer),
                       (SELECT count(*) FROM observed WHERE cardinality(claimers) > 0 AND unclaimed > 0),
                       (SELECT unclaimed FROM observed WHERE cardinality(claimers) > 0 ORDER BY n LIMIT 1);""")[0]
            self.assertEqual(scalar("SELECT rag_wait('paced', '60 seconds')"), "t")
            self.assertEqual(psql("SELECT count(*), sum(chunks_total), sum(chunks_embedded) FROM rag.documents d "
                                  "JOIN rag.collections c ON c.id = d.collection_id "
                                  "WHERE c.name = 'paced' AND d.status = 'ready'"), [["32", "384", "384"]],
                             "32 documents of 12 chunks, all ready")
            claimers, waiting_beside_claimed, unclaimed_at_first_claim = (int(value) for value in observed)
            # A worker that has not called the provider yet claims a small first group (FIRST_GROUP_DOCUMENTS),
            # not all 32: the other worker finds documents at once.
            self.assertGreater(unclaimed_at_first_claim, 0, "the first claim took every document")
            self.assertGreater(waiting_beside_claimed, 0, "every document was claimed at once and held until stored")
            self.assertEqual(claimers, 2, "one worker claimed every document")
        finally:
            psql("ALTER SYSTEM RESET rag.workers_per_database;\nSELECT pg_reload_conf();", db="postgres")
            # The surplus worker of every database leaves when idle; later scenarios expect one per database.
            wait_until_in("SELECT count(*) = 0 FROM (SELECT datname FROM pg_stat_activity WHERE backend_type = "
                          "'rag worker' GROUP BY datname HAVING count(*) > 1) s", db="postgres", seconds=60)

    def test_c_measuring_lexemes_steps_aside_for_a_drop(self):
        # rag_drop_collection locks the collection's row, then drops its indexes (which locks rag.chunks). The
        # lexeme measure the end of a load asks for read rag.chunks and then waited at a foreign key check for
        # that row: a deadlock, which failed the user's drop. The measure now takes the row first, and skips a
        # collection whose row a drop holds.
        psql("SELECT rag_create_collection('dropped-soon', embedding_model => 'hash-384')")
        psql("SELECT rag_ingest('dropped-soon', 'Note ' || g, 'Note ' || g || ' about lexemes and drops.') "
             "FROM generate_series(1, 3) g")
        self.assertEqual(scalar("SELECT rag_wait('dropped-soon', '60 seconds')"), "t")
        collection = scalar("SELECT id FROM rag.collections WHERE name = 'dropped-soon'")
        holder = background_psql("BEGIN; SELECT 'held' FROM rag.collections WHERE name = 'dropped-soon' FOR UPDATE;")
        try:
            self.assertEqual(read_line(holder).strip(), "held")
            # Due again (the idle worker measures too, and must step aside as well while the row is held).
            psql(f"DELETE FROM rag.lexeme_measures WHERE collection_id = {collection}")
            # Without the fix this waits for the holder (a timeout here); with it, it returns at once.
            self.assertEqual(scalar(f"SET statement_timeout = '10s'; SELECT rag._measure_lexemes({collection}) IS NULL"), "t")
            self.assertEqual(scalar(f"SELECT count(*) FROM rag.lexeme_measures WHERE collection_id = {collection}"), "0")
        finally:
            _, err = holder.communicate(input="ROLLBACK;\n", timeout=60)
        self.assertEqual(holder.returncode, 0, err)
        self.assertEqual(scalar(f"SELECT rag._measure_lexemes({collection}) = {collection}"), "t")
        self.assertEqual(scalar("SELECT rag_drop_collection('dropped-soon')"), "t")

    def test_ca_no_role_can_hold_off_the_lexeme_measure(self):
        # Measures were kept apart by an advisory lock on a key anyone can compute: an ordinary role holding it
        # kept the due collection (always the oldest, so every collection behind it too) from ever being measured,
        # and made a measure of that collection wait for ever. They are kept apart by the collection's
        # rag.lexeme_measures row now, which no role but rag's owner may lock.
        psql("DO $$ BEGIN CREATE ROLE lexeme_squatter LOGIN; EXCEPTION WHEN duplicate_object THEN NULL; END $$")
        psql("SELECT rag_create_collection('measured', embedding_model => 'hash-384')")
        psql("SELECT rag_ingest('measured', 'Note ' || g, 'Note ' || g || ' about lexemes and squatters.') "
             "FROM generate_series(1, 3) g")
        self.assertEqual(scalar("SELECT rag_wait('measured', '60 seconds')"), "t")
        collection = scalar("SELECT id FROM rag.collections WHERE name = 'measured'")
        squatter = background_psql(
            "SET ROLE lexeme_squatter; "
            f"SELECT 'held' FROM pg_advisory_lock(hashtext('rag._measure_lexemes'), {collection});")
        try:
            self.assertEqual(read_line(squatter).strip(), "held")
            psql(f"DELETE FROM rag.lexeme_measures WHERE collection_id = {collection}")
            self.assertEqual(scalar(f"SET statement_timeout = '10s'; SELECT rag._measure_lexemes({collection})"),
                             collection)
            psql(f"UPDATE rag.lexeme_measures SET measured_at = '-infinity' WHERE collection_id = {collection}")
            # The idle worker's call measures what is due, the squatted collection included.
            self.assertTrue(wait_until(f"SELECT measured_at > now() - interval '1 minute' FROM rag.lexeme_measures "
                                       f"WHERE collection_id = {collection}", seconds=30))
            # The role cannot take the lock that does keep two measures apart.
            status, _, err = psql(f"SET ROLE lexeme_squatter; SELECT 1 FROM rag.lexeme_measures "
                                  f"WHERE collection_id = {collection} FOR UPDATE", check=False)
            self.assertNotEqual(status, 0)
            self.assertIn("permission denied", err)
        finally:
            _, err = squatter.communicate(input="SELECT pg_advisory_unlock_all();\n", timeout=60)
        self.assertEqual(squatter.returncode, 0, err)
        # A measure under way (held open here) makes the idle path step aside instead of measuring it twice.
        measuring = background_psql(
            f"UPDATE rag.lexeme_measures SET measured_at = '-infinity' WHERE collection_id = {collection}; "
            f"BEGIN; SELECT 'measuring', rag._measure_lexemes({collection});")
        try:
            self.assertEqual(read_line(measuring).strip(), f"measuring|{collection}")
            # Still the one due (its new measure is not committed), and taken: the idle path leaves it.
            self.assertEqual(scalar("SELECT rag._lexemes_due()"), collection)
            self.assertEqual(scalar("SET statement_timeout = '10s'; "
                                    f"SELECT rag._measure_lexemes() IS DISTINCT FROM {collection}"), "t")
        finally:
            _, err = measuring.communicate(input="COMMIT;\n", timeout=60)
        self.assertEqual(measuring.returncode, 0, err)
        self.assertEqual(scalar("SELECT rag_drop_collection('measured')"), "t")

    def test_d_a_drop_waits_for_a_query_under_way_without_a_deadlock(self):
        # rag_query searches (rag.chunks and its indexes), reranks, then writes its ledger row. A drop that came
        # in between locked the collection's row and waited for the query to leave rag.chunks, while the ledger
        # row's foreign key check waited for that row: PostgreSQL aborted the query with "deadlock detected".
        # The ledger keeps the collection's id without a foreign key now, and the drop no longer waits for the
        # query (the worker drops the partition afterwards): both end, and the query finds the documents it
        # reranked gone (their rows are deleted by then) or, if it read them first, returns its chunk.
        psql("SELECT rag_create_provider('slow-rerank', 'openai', base_url => current_setting('rag.ollama_url') || '/v1'); "
             "SELECT rag_create_collection('queried-then-dropped', embedding_model => 'hash-384', "
             "reranker => 'rerank-test@slow3000', reranker_provider => 'slow-rerank', min_relevance => -10)")
        psql("SELECT rag_ingest('queried-then-dropped', 'Notice', 'Staff give thirty days notice in writing.')")
        self.assertEqual(scalar("SELECT rag_wait('queried-then-dropped', '60 seconds')"), "t")
        query = background_psql("SELECT count(*) FROM rag_query('queried-then-dropped', 'notice in writing', 1, max_distance => 2);")
        try:
            # The query is reranking (3 s at the server) and holds rag.chunks meanwhile.
            self.assertTrue(wait_until("SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE query LIKE '%rag_query(''queried-then-dropped''%' "
                                       "AND state = 'active' AND pid <> pg_backend_pid())", seconds=10))
            time.sleep(0.5)
            self.assertEqual(scalar("SET statement_timeout = '60s'; SELECT rag_drop_collection('queried-then-dropped')"), "t")
        finally:
            out, err = query.communicate(input="", timeout=60)
        self.assertEqual(query.returncode, 0, err)
        self.assertIn(out.strip(), ("0", "1"))
        self.assertEqual(scalar("SELECT count(*) FROM rag.collections WHERE name = 'queried-then-dropped'"), "0")
        self.assertTrue(wait_until("SELECT cardinality(rag._partitions_to_drop()) = 0", seconds=30),
                        "the dropped collection's partition stayed")
        # Its ledger row is written, without the collection's id (and with the id for its name when the drop came
        # first).
        self.assertEqual(psql("SELECT collection_id IS NULL, collection ~ '^(queried-then-dropped|collection "
                              "[0-9]+, dropped during the call)$', kind "
                              "FROM rag.queries WHERE question = 'notice in writing'"),
                         [["t", "t", "query"]])

    def race(self, holder, statement, waiter, rest):
        """`holder` (one session: it takes its locks and prints one line) holds them while `statement` runs in
        another (`deadlock_timeout` 100 ms) until that waits on a lock (`waiter`: a part of its text); then the
        holder runs `rest`, which takes the locks a deadlock would need. Returns what `rest` and `statement`
        printed once both have ended without an error."""
        first = background_psql(holder)
        beside = None
        try:
            self.assertEqual(read_line(first).strip(), "locked", "the holder took no locks")
            beside = background_psql(f"SET deadlock_timeout = '100ms'; {statement}")
            self.assertTrue(wait_until("SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE query LIKE "
                                       f"'%{waiter}%' AND wait_event_type = 'Lock' AND pid <> pg_backend_pid())",
                                       seconds=30), f"{statement} did not wait for the holder")
            held_out, err = first.communicate(input=f"SET deadlock_timeout = '100ms'; {rest}\n", timeout=60)
            self.assertEqual(first.returncode, 0, err)
        finally:
            if first.returncode is None:
                first.communicate(input="ROLLBACK;\n", timeout=60)
            if beside is not None:
                out, err = beside.communicate(input="", timeout=60)
        self.assertEqual(beside.returncode, 0, err)
        return held_out.strip(), out.strip()

    def store_races(self, first, second, statement, waiter):
        """A store under way holds `first` (and the collection's row, shared) and then locks `second`, while
        `statement` runs beside it; `first`'s row has moved past `second`'s before (new index entries too, as an
        update of an indexed column makes, a watched row's new text for one). A statement that locked the
        documents in the order its scan met them held `second` and waited for `first`, the store waited for
        `second`, and PostgreSQL aborted one of the two with "deadlock detected". Returns the statement's
        output once both have ended."""
        psql("DO $$ BEGIN FOR i IN 1..1000 LOOP "
             f"EXIT WHEN (SELECT ctid FROM rag.documents WHERE id = {first}) > (SELECT ctid FROM rag.documents WHERE id = {second}); "
             f"UPDATE rag.documents SET content_sha256 = sha256(content_sha256) WHERE id = {first}; "
             f"UPDATE rag.documents SET content_sha256 = sha256(convert_to(body, 'UTF8')) WHERE id = {first}; "
             "END LOOP; END $$")
        self.assertEqual(scalar(f"SELECT (SELECT ctid FROM rag.documents WHERE id = {first}) > "
                                f"(SELECT ctid FROM rag.documents WHERE id = {second})"), "t")
        # rag._lock_for_store and rag._store_documents, the locks of a worker's store of these two documents.
        stored, out = self.race(
            f"BEGIN; SELECT 'locked' FROM rag._lock_for_store({first});", statement, waiter,
            f"SELECT count(*) FROM rag._store_documents(ARRAY[0, 0]::bigint[], ARRAY[{first}, {second}]::bigint[], "
            "ARRAY[0, 0]::bigint[], '{}', '{}', '{}', '{}', '{}', '{}', '{}', '{}'::real[], 384, 'hash-384', 'ollama'); COMMIT;")
        self.assertEqual(stored, "2")
        return out

    def test_e_a_reindex_waits_for_a_store_under_way_without_a_deadlock(self):
        psql("SELECT rag_create_collection('reindexed', embedding_model => 'hash-384', dimensions => 384)")
        first = scalar("SELECT rag_ingest('reindexed', 'First', 'The first note of the reindexed collection.')")
        second = scalar("SELECT rag_ingest('reindexed', 'Second', 'The second note of the reindexed collection.')")
        self.assertEqual(scalar("SELECT rag_wait('reindexed', '60 seconds')"), "t")
        self.assertEqual(self.store_races(first, second, "SELECT rag_reindex('reindexed');",
                                          "rag_reindex(''reindexed'')"), "2")
        self.assertEqual(scalar("SELECT rag_wait('reindexed', '60 seconds')"), "t")
        self.assertEqual(scalar("SELECT count(*) FROM rag.documents d JOIN rag.collections c ON c.id = d.collection_id "
                                "WHERE c.name = 'reindexed' AND d.status = 'ready' AND d.chunks_total > 0"), "2")

    def test_f_a_truncate_unwatch_or_drop_waits_for_a_store_under_way_without_a_deadlock(self):
        # The same race for the statements that delete a watched table's documents: TRUNCATE of the table
        # (its trigger), rag_unwatch(drop_documents => true) and DROP TABLE (the event trigger).
        psql("SELECT rag_create_collection('truncated', embedding_model => 'hash-384', dimensions => 384)")
        watch = ("CREATE TABLE IF NOT EXISTS truncated_notes (id int PRIMARY KEY, body text); "
                 "SELECT rag_watch('truncated_notes', 'truncated', content => 'body') "
                 "WHERE NOT EXISTS (SELECT 1 FROM rag.watches WHERE source = 'truncated_notes'::regclass)")
        for statement, waiter in (("TRUNCATE truncated_notes;", "TRUNCATE truncated_notes"),
                                  ("SELECT rag_unwatch('truncated_notes', drop_documents => true);",
                                   "rag_unwatch(''truncated_notes''"),
                                  ("DROP TABLE truncated_notes;", "DROP TABLE truncated_notes")):
            psql(watch)
            psql("INSERT INTO truncated_notes VALUES (1, 'The first watched note.'), (2, 'The second watched note.') "
                 "ON CONFLICT (id) DO NOTHING")
            self.assertTrue(wait_until("SELECT count(*) = 2 AND bool_and(d.status = 'ready') FROM rag.documents d "
                                       "JOIN rag.collections c ON c.id = d.collection_id WHERE c.name = 'truncated'",
                                       seconds=60), "the watched rows did not become ready documents")
            ids = psql("SELECT d.id FROM rag.documents d JOIN rag.collections c ON c.id = d.collection_id "
                       "WHERE c.name = 'truncated' ORDER BY d.id")
            self.store_races(ids[0][0], ids[1][0], statement, waiter)
            self.assertEqual(scalar("SELECT count(*) FROM rag.documents d JOIN rag.collections c ON c.id = d.collection_id "
                                    "WHERE c.name = 'truncated'"), "0", statement)

    def test_g_a_reindex_and_the_claim_of_an_abandoned_document_without_a_deadlock(self):
        # A claim holds its queue row and then marks an abandoned document (claimed 5 times without finishing)
        # failed; rag_reindex holds the documents and then re-queues them. The claim waited for the document
        # the reindex held while the reindex waited for the queue row: "deadlock detected". The claim now
        # passes over a document someone holds; and rag_reindex starts the claims' count again, so the document
        # is embedded instead of being given up once more.
        psql("SELECT rag_create_collection('abandoned', embedding_model => 'hash-384', dimensions => 384)")
        document = scalar("SELECT rag_ingest('abandoned', 'Abandoned', 'A note that stopped a worker five times.')")
        self.assertEqual(scalar("SELECT rag_wait('abandoned', '60 seconds')"), "t")
        # The session standing in for a worker queues the item claimed by itself (alive, so the real worker
        # leaves it alone) and commits (inserting it also held the document's key until then), then holds the
        # queue row as a claim does; then it claims.
        claimed, out = self.race(
            "INSERT INTO rag.queue (document_id, collection_id, claimed_by, unfinished_claims) "
            f"SELECT id, collection_id, pg_backend_pid(), 5 FROM rag.documents WHERE id = {document}; "
            f"BEGIN; SELECT 'locked' FROM rag.queue WHERE document_id = {document} FOR UPDATE;",
            "SELECT rag_reindex('abandoned');", "rag_reindex(''abandoned'')",
            f"SELECT count(*) FROM rag._claim_next(pg_backend_pid()) WHERE document_id = {document}; COMMIT;")
        self.assertEqual(claimed, "0", "the claim should have passed over the held document")
        self.assertEqual(out, "1")
        self.assertEqual(scalar("SELECT rag_wait('abandoned', '60 seconds')"), "t")
        self.assertEqual(psql(f"SELECT status, chunks_total > 0 FROM rag.documents WHERE id = {document}"),
                         [["ready", "t"]])

    def test_g2_a_model_change_beside_an_uncommitted_delete(self):
        # rag_set_embedding_model queued the collection's documents from its statement's snapshot: a document
        # whose delete was under way was read, and its queue row's foreign key check waited for the deleter and
        # then failed ("violates foreign key constraint") when the delete committed. The documents are locked
        # first now (before their chunks, as a delete takes them), and one deleted meanwhile is passed over.
        psql("SELECT rag_create_collection('switched', embedding_model => 'hash-384', dimensions => 384)")
        kept = scalar("SELECT rag_ingest('switched', 'Kept', 'A note that stays through the model change.')")
        deleted = scalar("SELECT rag_ingest('switched', 'Deleted', 'A note deleted while the model changes.')")
        self.assertEqual(scalar("SELECT rag_wait('switched', '60 seconds')"), "t")
        _, out = self.race(f"BEGIN; SELECT 'locked' FROM rag_delete_document({deleted});",
                           "SELECT rag_set_embedding_model('switched', 'hash-384:latest');",
                           "rag_set_embedding_model(''switched''", "COMMIT;")
        self.assertEqual(out, "1", "the kept document alone is queued for the new model")
        self.assertTrue(wait_until("SELECT embedding_model = 'hash-384:latest' FROM rag.collections WHERE name = 'switched'",
                                   seconds=60), "the model change did not complete")
        self.assertEqual(psql("SELECT d.id, d.status FROM rag.documents d JOIN rag.collections c ON c.id = d.collection_id "
                              "WHERE c.name = 'switched'"), [[kept, "ready"]])
        self.assertEqual(scalar("SELECT rag_drop_collection('switched')"), "t")

    def test_h_a_bulk_load_brings_a_second_worker_that_leaves_with_it(self):
        # rag.workers_per_database is 1 and rag.bulk_load_workers 2 (the defaults): a worker that finds a bulk
        # load waiting (rag._limit('bulk_load_documents') due documents no worker holds) has the launcher start
        # another for its database, which leaves once the load is worked off.
        workers = ("SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'rag worker' "
                   f"AND datname = '{DB}'")
        self.assertEqual(scalar("SELECT current_setting('rag.workers_per_database') || '/' || "
                                "current_setting('rag.bulk_load_workers')"), "1/2")
        self.assertTrue(wait_until(f"SELECT ({workers}) = 1", seconds=60))
        psql("SELECT rag_create_collection('helped', embedding_model => 'hash-384@slow240')")
        psql("SELECT count(rag_ingest('helped', 'Note ' || g, 'Bulk note ' || g || ' about topic ' || g % 11 || '.')) "
             "FROM generate_series(1, 600) g")
        self.assertTrue(wait_until(f"SELECT ({workers}) = 2", seconds=30), "no second worker came for the load")
        # pg_stat_activity says what a worker does, as it does for autovacuum workers.
        self.assertTrue(wait_until("SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE backend_type = 'rag worker' "
                                   f"AND datname = '{DB}' AND state = 'active' AND query LIKE "
                                   "'rag worker: embedding % of collection % (hash-384@slow240)')", seconds=30),
                        "pg_stat_activity did not show a worker embedding the load")
        self.assertEqual(scalar("SELECT rag_wait('helped', '180 seconds')"), "t")
        self.assertEqual(scalar("SELECT count(*) FROM rag.documents d JOIN rag.collections c ON c.id = d.collection_id "
                                "WHERE c.name = 'helped' AND d.status = 'ready'"), "600")
        self.assertTrue(wait_until(f"SELECT ({workers}) = 1", seconds=60), "the load's second worker stayed")
        # Idle, its last work left in `query` as an idle client session's last statement is.
        self.assertTrue(wait_until(f"SELECT bool_and(state = 'idle' AND query LIKE 'rag worker: %') "
                                   f"FROM pg_stat_activity WHERE backend_type = 'rag worker' AND datname = '{DB}'",
                                   seconds=30),
                        "the idle worker does not show as idle in pg_stat_activity")
        # A few documents are no bulk load: one worker takes them.
        psql("SELECT rag_ingest('helped', 'Late ' || g, 'A late note ' || g || '.') FROM generate_series(1, 5) g")
        self.assertEqual(scalar("SELECT rag_wait('helped', '60 seconds')"), "t")
        self.assertEqual(scalar(workers), "1")

if __name__ == "__main__":
    unittest.main()
