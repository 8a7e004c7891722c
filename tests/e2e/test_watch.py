"""Watched content tables under write load: bursts, partial edits, concurrent writers."""
import os
import subprocess
import threading
import time
import unittest

from support import background_psql, drop_database, fresh_database, provider_calls, psql, scalar, wait_until

DB = "rag_e2e_watch"


def settle(seconds=60):
    deadline = time.time() + seconds
    while time.time() < deadline:
        if scalar("SELECT NOT EXISTS (SELECT 1 FROM rag.row_queue) AND NOT EXISTS (SELECT 1 FROM rag.row_batches) "
                  "AND NOT EXISTS (SELECT 1 FROM rag.queue)", db=DB) == "t":
            return
        time.sleep(0.1)
    raise AssertionError("the watched table did not settle")


def log_batches():
    """From now on, every batch of keys queued in DB is also copied into public.batches_seen, which keeps it
    after the worker has spread and deleted it. The trigger is enabled ALWAYS, so it sees an apply worker's; its
    function is SECURITY DEFINER, since a composite key's trigger writes its batches as the table's owner."""
    psql("CREATE TABLE public.batches_seen (n bigserial, watch_id int, key_values text, keys jsonb); "
         "CREATE FUNCTION public.see_batch() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER "
         "SET search_path = pg_catalog, public AS $$BEGIN "
         "INSERT INTO public.batches_seen (watch_id, key_values, keys) VALUES (NEW.watch_id, NEW.key_values, NEW.keys); "
         "RETURN NULL; END$$; "
         "CREATE TRIGGER see_batch AFTER INSERT ON rag.row_batches FOR EACH ROW EXECUTE FUNCTION public.see_batch(); "
         "ALTER TABLE rag.row_batches ENABLE ALWAYS TRIGGER see_batch", db=DB)


def stop_logging_batches():
    psql("DROP TRIGGER IF EXISTS see_batch ON rag.row_batches; DROP FUNCTION IF EXISTS public.see_batch(); "
         "DROP TABLE IF EXISTS public.batches_seen", db=DB)


def batches_seen(since=0):
    """Each watched table's batches logged after `since`: [table, batches, keys], keys counted one per key."""
    return psql(f"""SELECT w.source::regclass::text, count(DISTINCT b.n), count(*)
                      FROM public.batches_seen b JOIN rag.watches w ON w.id = b.watch_id,
                           LATERAL (SELECT unnest(b.key_values::text[]) UNION ALL
                                    SELECT jsonb_array_elements(b.keys)::text) k
                     WHERE b.n > {since} GROUP BY 1 ORDER BY 1""", db=DB)


def last_batch_seen():
    return int(scalar("SELECT coalesce(max(n), 0) FROM public.batches_seen", db=DB))


class Watch(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        fresh_database(DB)

    def test_burst_of_updates_costs_one_embedding(self):
        model = "hash-384@slow1"
        psql(f"SELECT rag_create_collection('burst', embedding_model => '{model}')", db=DB)
        psql("CREATE TABLE burst (id int PRIMARY KEY, body text); INSERT INTO burst VALUES (1, 'version 0')", db=DB)
        psql("SELECT rag_watch('burst', 'burst', content => 'body')", db=DB)
        settle()
        before = provider_calls(model)[1]
        updates = "".join(f"UPDATE burst SET body = 'version {n} of the text' WHERE id = 1;\n" for n in range(1, 1001))
        psql(updates, db=DB)
        settle()
        self.assertEqual(provider_calls(model)[1] - before, 1)
        self.assertEqual(scalar("SELECT body FROM rag.documents WHERE source = 'burst'", db=DB), "version 1000 of the text")

    def test_a_lone_write_is_indexed_after_the_sync_delay_not_the_naptime(self):
        # An idle worker slept until the next queued document was due, or its naptime: a written row waiting out
        # rag.sync_delay was not counted, so a table written now and then had each row indexed a naptime (5 s by
        # default) after its commit unless another write woke the worker (session 36). With a naptime of an hour
        # such a row would wait an hour; it waits its sync delay.
        psql("SELECT rag_create_collection('lone', embedding_model => 'hash-384');"
             "CREATE TABLE lone (id int PRIMARY KEY, body text);"
             "SELECT rag_watch('lone', 'lone', content => 'body')", db=DB)
        psql("ALTER SYSTEM SET rag.naptime = '1h'; SELECT pg_reload_conf()", db=DB)
        try:
            time.sleep(1)  # the worker rests now, until the next thing due or an hour
            psql("INSERT INTO lone VALUES (1, 'A row written on its own.')", db=DB)
            # Ten seconds: twenty times the sync delay, and short of whatever else woke the idle worker in a run of the old code (25 s).
            self.assertEqual(scalar("SELECT rag_wait('lone', '10 seconds')", db=DB), "t")
            self.assertEqual(scalar("SELECT status FROM rag.documents WHERE source = 'lone'", db=DB), "ready")
        finally:
            psql("ALTER SYSTEM RESET rag.naptime; SELECT pg_reload_conf()", db=DB)

    def test_editing_one_paragraph_embeds_only_what_changed(self):
        model = "hash-384@slow2"
        psql(f"SELECT rag_create_collection('long', embedding_model => '{model}', chunk_size => 200, chunk_overlap => 0)", db=DB)
        paragraphs = [f"Paragraph {n} says something particular about subject number {n} in this long article." for n in range(12)]
        body = "\n\n".join(paragraphs)
        psql(f"CREATE TABLE long_articles (id int PRIMARY KEY, body text); INSERT INTO long_articles VALUES (1, $${body}$$)", db=DB)
        psql("SELECT rag_watch('long_articles', 'long', content => 'body')", db=DB)
        settle()
        chunks = int(scalar("SELECT chunks_total FROM rag.documents WHERE source = 'long_articles'", db=DB))
        self.assertGreaterEqual(chunks, 4)
        before = provider_calls(model)[1]
        paragraphs[5] = "Paragraph 5 was rewritten entirely and now says something else."
        psql(f"UPDATE long_articles SET body = $${chr(10).join(p + chr(10) for p in paragraphs).strip()}$$ WHERE id = 1", db=DB)
        settle()
        embedded = provider_calls(model)[1] - before
        self.assertGreaterEqual(embedded, 1)
        self.assertLessEqual(embedded, 2, f"{embedded} of {chunks} chunks were embedded again")
        row = psql("SELECT status, chunks_total, chunks_embedded FROM rag.documents WHERE source = 'long_articles'", db=DB)[0]
        self.assertEqual(row[0], "ready")
        self.assertEqual(row[1], row[2])

    def test_concurrent_writers_end_with_the_final_committed_text(self):
        psql("SELECT rag_create_collection('busy', embedding_model => 'hash-384')", db=DB)
        psql("CREATE TABLE busy (id int PRIMARY KEY, body text); "
             "INSERT INTO busy SELECT g, 'initial ' || g FROM generate_series(1, 20) g", db=DB)
        psql("SELECT rag_watch('busy', 'busy', content => 'body')", db=DB)

        def writer(name):
            script = "".join(
                f"UPDATE busy SET body = 'writer {name} round {n} row ' || id WHERE id % 3 = {n % 3};\n"
                for n in range(60))
            psql(script, db=DB)

        threads = [threading.Thread(target=writer, args=(name,)) for name in ("a", "b", "c")]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        settle(90)
        mismatched = scalar("""SELECT count(*) FROM busy b
                                 LEFT JOIN rag.documents d ON d.source = 'busy' AND d.source_key = jsonb_build_object('id', b.id)
                                WHERE d.body IS DISTINCT FROM b.body OR d.status <> 'ready'""", db=DB)
        self.assertEqual(mismatched, "0")
        self.assertEqual(scalar("SELECT count(*) FROM rag.documents WHERE source = 'busy'", db=DB), "20")

    def test_truncate_while_the_worker_spreads_a_large_insert(self):
        # The worker spreads a 100,000-key batch for about a second after the INSERT commits; a TRUNCATE in
        # that window used to deadlock with it (the two took batch and queue rows in opposite orders).
        psql("SELECT rag_create_collection('truncated', embedding_model => 'hash-384')", db=DB)
        psql("CREATE TABLE truncated (id int PRIMARY KEY, body text)", db=DB)
        psql("SELECT rag_watch('truncated', 'truncated', content => 'body')", db=DB)
        for round_ in range(4):
            result = subprocess.run(
                ["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", DB, "-c",
                 "INSERT INTO truncated SELECT g, 'row ' || g FROM generate_series(1, 100000) g",
                 "-c", "SELECT pg_sleep(0.2 * random())", "-c", "TRUNCATE truncated"],
                capture_output=True, text=True, timeout=120)
            self.assertEqual(result.returncode, 0, f"round {round_}: {result.stderr}")
        settle(120)
        self.assertEqual(scalar("SELECT count(*) FROM rag.documents WHERE source = 'truncated'", db=DB), "0")
        self.assertEqual(scalar("SELECT count(*) FROM rag.row_queue q JOIN rag.watches w ON w.id = q.watch_id "
                                "WHERE w.source_name = 'truncated'", db=DB), "0")

    def test_a_partition_written_through_its_parent_stays_indexed(self):
        # Its keys are gathered by its row triggers and queued by rag (INSERT … SELECT, COPY, UPDATE and DELETE
        # through the parent, a write straight to the partition); the other partition is not watched. That the
        # queueing happens at each statement's end, not only at the commit, is pinned in 09_watch (one batch
        # per statement): here every statement is its own transaction, so this checks what the worker makes of it.
        psql("SELECT rag_create_collection('routed', embedding_model => 'hash-384', max_distance => 0.9)", db=DB)
        psql("CREATE TABLE routed (id int, body text) PARTITION BY LIST ((id % 2)); "
             "CREATE TABLE routed_even PARTITION OF routed FOR VALUES IN (0); "
             "CREATE TABLE routed_odd PARTITION OF routed FOR VALUES IN (1); "
             "ALTER TABLE routed_even ADD PRIMARY KEY (id)", db=DB)
        psql("SELECT rag_watch('routed_even', 'routed', content => 'body')", db=DB)
        psql("INSERT INTO routed SELECT g, 'row ' || g FROM generate_series(1, 2000) g", db=DB)
        copied = "".join(f"{n}\tcopied row {n}\n" for n in range(2001, 2101))
        result = subprocess.run(["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", DB, "-c", "COPY routed FROM STDIN"],
                                input=copied, capture_output=True, text=True, timeout=60)
        self.assertEqual(result.returncode, 0, result.stderr)
        psql("UPDATE routed SET body = 'rewritten ' || id WHERE id <= 100; DELETE FROM routed WHERE id > 1900 AND id <= 2000; "
             "INSERT INTO routed_even VALUES (5000, 'written to the partition itself')", db=DB)
        settle(120)
        mismatched = scalar("""SELECT count(*) FROM routed_even r
                                 FULL JOIN (SELECT d.* FROM rag.documents d WHERE d.source = 'routed_even') d
                                   ON d.source_key = jsonb_build_object('id', r.id)
                                WHERE d.body IS DISTINCT FROM r.body OR d.status IS DISTINCT FROM 'ready'""", db=DB)
        self.assertEqual(mismatched, "0")
        self.assertEqual(scalar("SELECT count(*) FROM rag.documents WHERE source = 'routed_even'", db=DB), "1001")
        self.assertEqual(scalar("SELECT body FROM rag.documents WHERE source = 'routed_even' "
                                "AND source_key = '{\"id\": 2}'", db=DB), "rewritten 2")
        self.assertEqual(scalar("SELECT title IS NOT NULL FROM rag_query('routed', 'written to the partition itself', 1)",
                                db=DB), "t")

    def test_a_subscribers_watched_tables_stay_indexed(self):
        """A logical-replication subscriber's apply worker (and its initial table copy) runs with
        session_replication_role = replica: the watch's triggers enabled REPLICA index what it applies, for a
        one-column key and a composite one, inserts, updates, deletes and TRUNCATE alike. A one-column key's
        rows are gathered and queued at the applied transaction's commit, one batch for the whole initial
        copy; a composite key's still make one batch per row."""
        publisher = "rag_e2e_publisher"
        port = os.environ["PGPORT"]
        # scripts/test's cluster logs there; only what this test's apply worker logs is looked at.
        log_path = os.path.join(os.environ["WORK"], "pg", "server.log")
        log_start = os.path.getsize(log_path)
        tables = ("CREATE TABLE notes (id int PRIMARY KEY, body text); "
                  "CREATE TABLE pairs (a int, b text, body text, PRIMARY KEY (a, b)); ")
        drop_database(publisher)
        psql(f"CREATE DATABASE {publisher}", db="postgres")
        psql(tables + "INSERT INTO notes SELECT g, 'note number ' || g FROM generate_series(1, 20) g; "
             "INSERT INTO pairs SELECT g, 'k' || g, 'pair number ' || g FROM generate_series(1, 5) g; "
             "CREATE PUBLICATION notes_only FOR TABLE notes, pairs; "
             "SELECT pg_create_logical_replication_slot('rag_e2e_notes', 'pgoutput')", db=publisher)
        psql("SELECT rag_create_collection('replicated', embedding_model => 'hash-384', max_distance => 0.9); " + tables +
             "SELECT rag_watch('notes', 'replicated', content => 'body'), "
             "rag_watch('pairs', 'replicated', content => 'body')", db=DB)
        log_batches()
        psql(f"CREATE SUBSCRIPTION notes_in CONNECTION 'host=127.0.0.1 port={port} dbname={publisher} user=postgres' "
             "PUBLICATION notes_only WITH (create_slot = false, slot_name = 'rag_e2e_notes')", db=DB)

        def indexed():
            settle()
            return psql("SELECT source, count(*) FILTER (WHERE status = 'ready'), count(*) FROM rag.documents "
                        "WHERE source IN ('notes', 'pairs') GROUP BY 1 ORDER BY 1", db=DB)

        try:
            # The initial copy.
            self.assertTrue(wait_until("SELECT (SELECT count(*) FROM notes) = 20 AND (SELECT count(*) FROM pairs) = 5",
                                       db=DB))
            self.assertEqual(indexed(), [["notes", "20", "20"], ["pairs", "5", "5"]])
            # The 20 notes in one batch, the 5 pairs in one each (before, 25 in all).
            self.assertEqual(batches_seen(), [["notes", "1", "20"], ["pairs", "5", "5"]])
            # Changes streamed afterwards, in one transaction of the publisher's: the notes' update and five
            # deletes in one batch, the pairs' insert and delete in one each.
            before_changes = last_batch_seen()
            psql("BEGIN; UPDATE notes SET body = 'rewritten on the publisher' WHERE id = 7; DELETE FROM notes WHERE id > 15; "
                 "INSERT INTO pairs VALUES (9, 'k9', 'a pair written later'); DELETE FROM pairs WHERE a = 1; COMMIT",
                 db=publisher)
            self.assertTrue(wait_until("SELECT count(*) = 15 FROM notes", db=DB))
            self.assertTrue(wait_until("SELECT count(*) = 5 FROM pairs WHERE a = 9 OR a < 6", db=DB))
            self.assertEqual(indexed(), [["notes", "15", "15"], ["pairs", "5", "5"]])
            self.assertEqual(batches_seen(before_changes), [["notes", "1", "6"], ["pairs", "2", "2"]])
            self.assertEqual(scalar("SELECT body FROM rag.documents WHERE source = 'notes' "
                                    "AND source_key = '{\"id\": 7}'", db=DB), "rewritten on the publisher")
            self.assertEqual(scalar("SELECT source_key::text FROM rag_query('replicated', 'rewritten on the publisher', 1)",
                                    db=DB), '{"id": 7}')
            self.assertEqual(scalar("SELECT count(*) FROM rag.documents WHERE source = 'pairs' "
                                    "AND source_key = '{\"a\": 9, \"b\": \"k9\"}'", db=DB), "1")
            psql("TRUNCATE notes", db=publisher)
            self.assertTrue(wait_until("SELECT count(*) = 0 FROM notes", db=DB))
            self.assertEqual(indexed(), [["pairs", "5", "5"]])
            # Nothing was left for a WARNING at the apply worker's commits.
            with open(log_path, encoding="utf-8", errors="replace") as log:
                log.seek(log_start)
                warned = [line for line in log if "were not queued for indexing" in line]
            self.assertEqual(warned, [])
        finally:
            psql("DROP SUBSCRIPTION IF EXISTS notes_in", db=DB)
            stop_logging_batches()
            drop_database(publisher)

    def test_a_subscriber_applies_an_ordinary_owners_tables_streamed_and_prepared(self):
        """The subscriber's tables belong to an ordinary role, as they usually do. Since PostgreSQL 16 the apply
        worker then runs their triggers as that owner inside a security-restricted operation (the owner cannot
        SET ROLE to the subscription's owner). The subscription streams its large transactions while they run
        (to a parallel apply worker where there is one, which applies subtransactions as savepoints) and
        applies prepared transactions as prepared (two_phase). A savepoint rolled back on the publisher leaves
        no key queued, a prepared transaction's keys are queued only when it commits, and a filtered watch's
        applied rows are indexed only where its filter holds. (PostgreSQL 15 spools a streamed transaction and
        applies it at its commit, without the rolled-back rows: there the savepoint reaches rag only on the
        publisher's side.)"""
        publisher = "rag_e2e_publisher_owned"
        owner = "rag_e2e_replica_owner"
        slot = "rag_e2e_owned"
        port = os.environ["PGPORT"]
        version = int(scalar("SHOW server_version_num", db=DB))
        log_path = os.path.join(os.environ["WORK"], "pg", "server.log")
        log_start = os.path.getsize(log_path)
        tables = ("CREATE TABLE owned_notes (id int PRIMARY KEY, body text); "
                  "CREATE TABLE owned_posts (id int PRIMARY KEY, status text, body text); "
                  "CREATE TABLE owned_pairs (a int, b text, body text, PRIMARY KEY (a, b)); ")
        drop_database(publisher)
        psql(f"DROP ROLE IF EXISTS {owner}; CREATE ROLE {owner} IN ROLE rag_admin; CREATE DATABASE {publisher}",
             db="postgres")
        try:
            psql(tables + "INSERT INTO owned_notes SELECT g, 'owned note ' || g FROM generate_series(1, 10) g; "
                 "INSERT INTO owned_posts VALUES (1, 'published', 'a published post'), (2, 'draft', 'a draft post'); "
                 "INSERT INTO owned_pairs VALUES (1, 'k1', 'an owned pair'); "
                 "CREATE PUBLICATION owned_tables FOR TABLE owned_notes, owned_posts, owned_pairs; "
                 # The slot decodes prepared transactions (its fourth argument), as two_phase needs.
                 f"SELECT pg_create_logical_replication_slot('{slot}', 'pgoutput', false, true)", db=publisher)
            psql(f"GRANT CREATE ON SCHEMA public TO {owner}; SET ROLE {owner}; "
                 "SELECT rag_create_collection('owned', embedding_model => 'hash-384', max_distance => 0.9); " + tables +
                 # The owner's own trigger, enabled for the apply worker (which runs with an empty search_path), says
                 # whose rights the apply ran with.
                 "CREATE TABLE applied_as (who name); "
                 "CREATE FUNCTION note_applier() RETURNS trigger LANGUAGE plpgsql AS "
                 "$$BEGIN INSERT INTO public.applied_as VALUES (current_user); RETURN NULL; END$$; "
                 "CREATE TRIGGER note_applier AFTER INSERT ON owned_notes FOR EACH ROW EXECUTE FUNCTION note_applier(); "
                 "ALTER TABLE owned_notes ENABLE REPLICA TRIGGER note_applier; "
                 "SELECT rag_watch('owned_notes', 'owned', content => 'body'), "
                 "rag_watch('owned_posts', 'owned', content => 'body', filter => $$status = 'published'$$), "
                 "rag_watch('owned_pairs', 'owned', content => 'body')", db=DB)

            def documents():
                settle(180)
                return psql("SELECT source, count(*) FILTER (WHERE status = 'ready'), count(*) "
                            "FROM rag.documents WHERE source LIKE 'owned%' GROUP BY 1 ORDER BY 1", db=DB)

            def ids_of(source):
                return scalar(f"SELECT string_agg(source_key->>'id', ',' ORDER BY (source_key->>'id')::int) "
                              f"FROM rag.documents WHERE source = '{source}'", db=DB)

            streaming = "parallel" if version >= 160000 else "on"
            # 64 kB, the least logical_decoding_work_mem, makes the publisher stream a transaction of a few
            # thousand rows while it runs.
            options = "options=''-c logical_decoding_work_mem=64kB''"
            log_batches()
            psql(f"CREATE SUBSCRIPTION owned_in CONNECTION 'host=127.0.0.1 port={port} dbname={publisher} user=postgres "
                 f"{options}' PUBLICATION owned_tables "
                 f"WITH (create_slot = false, slot_name = '{slot}', two_phase = true, streaming = {streaming})", db=DB)
            self.assertTrue(wait_until("SELECT (SELECT count(*) FROM owned_notes) = 10 "
                                       "AND (SELECT count(*) FROM owned_posts) = 2 "
                                       "AND (SELECT count(*) FROM owned_pairs) = 1", db=DB))
            self.assertEqual(documents(), [["owned_notes", "10", "10"], ["owned_pairs", "1", "1"],
                                           ["owned_posts", "1", "1"]])
            self.assertEqual(ids_of("owned_posts"), "1")

            # A streamed transaction with a savepoint rolled back in its middle: one batch per table, and
            # none of the rolled-back rows' keys.
            before = last_batch_seen()
            psql("BEGIN; INSERT INTO owned_notes SELECT g, 'kept before ' || g FROM generate_series(1001, 4000) g; "
                 "SAVEPOINT undone; "
                 "INSERT INTO owned_notes SELECT g, 'rolled back ' || g FROM generate_series(5001, 8000) g; "
                 "ROLLBACK TO undone; "
                 "INSERT INTO owned_notes SELECT g, 'kept after ' || g FROM generate_series(9001, 9100) g; "
                 "UPDATE owned_posts SET status = 'published' WHERE id = 2; "
                 "INSERT INTO owned_posts VALUES (3, 'draft', 'another draft'); "
                 "INSERT INTO owned_pairs VALUES (2, 'k2', 'a later pair'); COMMIT", db=publisher)
            self.assertTrue(wait_until("SELECT (SELECT count(*) FROM owned_notes) = 3110 "
                                       "AND (SELECT count(*) FROM owned_posts) = 3 "
                                       "AND (SELECT count(*) FROM owned_pairs) = 2", db=DB))
            self.assertTrue(wait_until("SELECT stream_txns > 0 FROM pg_stat_replication_slots "
                                       f"WHERE slot_name = '{slot}'", db=publisher), "nothing was streamed")
            if version >= 160000:
                # And applied by a parallel apply worker, which applies the publisher's subtransactions as
                # savepoints (it could have fallen back to spooling, as PostgreSQL 15 does).
                with open(log_path, encoding="utf-8", errors="replace") as log:
                    log.seek(log_start)
                    parallel = [line for line in log if "parallel" in line and '"owned_in"' in line]
                self.assertNotEqual(parallel, [], "no parallel apply worker ran")
            # 3,000 keys before the savepoint and 100 after; the posts' update and insert; the pair's row.
            self.assertEqual(batches_seen(before), [["owned_notes", "1", "3100"], ["owned_pairs", "1", "1"],
                                                    ["owned_posts", "1", "2"]])
            self.assertEqual(documents(), [["owned_notes", "3110", "3110"], ["owned_pairs", "2", "2"],
                                           ["owned_posts", "2", "2"]])
            self.assertEqual(ids_of("owned_posts"), "1,2")

            # Prepared transactions are applied prepared; only the one committed is indexed.
            prepared_here = f"SELECT count(*) FROM pg_prepared_xacts WHERE database = '{DB}'"
            before = last_batch_seen()
            psql("BEGIN; INSERT INTO owned_notes VALUES (20001, 'prepared and committed'); "
                 "PREPARE TRANSACTION 'rag_e2e_committed'", db=publisher)
            self.assertTrue(wait_until(f"SELECT ({prepared_here}) = 1", db=DB))
            settle()
            # Its batch is written in the subscriber's prepared transaction, unseen until it commits.
            self.assertEqual(batches_seen(before), [])
            self.assertEqual(documents()[0], ["owned_notes", "3110", "3110"])
            psql("COMMIT PREPARED 'rag_e2e_committed'", db=publisher)
            psql("BEGIN; INSERT INTO owned_notes VALUES (20002, 'prepared and rolled back'); "
                 "PREPARE TRANSACTION 'rag_e2e_rolled_back'", db=publisher)
            self.assertTrue(wait_until(f"SELECT ({prepared_here}) = 1 AND EXISTS "
                                       "(SELECT 1 FROM owned_notes WHERE id = 20001)", db=DB))
            psql("ROLLBACK PREPARED 'rag_e2e_rolled_back'", db=publisher)
            self.assertTrue(wait_until(f"SELECT ({prepared_here}) = 0", db=DB))
            self.assertEqual(documents()[0], ["owned_notes", "3111", "3111"])
            self.assertEqual(batches_seen(before), [["owned_notes", "1", "1"]])
            # No key of a row rolled back on the publisher was ever queued.
            self.assertEqual(scalar("SELECT count(*) FROM public.batches_seen, unnest(key_values::int[]) k "
                                    "WHERE k BETWEEN 5001 AND 8000 OR k = 20002", db=DB), "0")
            self.assertEqual(scalar("SELECT source_key::text FROM rag_query('owned', 'prepared and committed', 1)",
                                    db=DB), '{"id": 20001}')

            # Whose rights the apply worker's triggers ran with: the table's owner's since PostgreSQL 16.
            self.assertEqual(psql("SELECT DISTINCT who FROM applied_as", db=DB),
                             [[owner if version >= 160000 else "postgres"]])
        finally:
            psql("DROP SUBSCRIPTION IF EXISTS owned_in", db=DB)
            # A failure above may leave prepared transactions, which hold the tables (rag.row_batches and the
            # batch log included) and the database, and the slot, which DROP DATABASE refuses to drop.
            for database in (publisher, DB):
                for (gid,) in psql(f"SELECT gid FROM pg_prepared_xacts WHERE database = '{database}'", db="postgres"):
                    psql(f"ROLLBACK PREPARED '{gid}'", db=database)
            psql(f"SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = '{slot}'",
                 db="postgres")
            stop_logging_batches()
            drop_database(publisher)
            psql("DROP TABLE IF EXISTS owned_notes, owned_posts, owned_pairs, applied_as; DROP FUNCTION IF EXISTS note_applier(); "
                 f"SELECT rag_drop_collection('owned'); DROP OWNED BY {owner}", db=DB)
            psql(f"DROP ROLE {owner}", db="postgres")

    def test_an_open_transaction_holding_queued_keys_does_not_hold_the_worker(self):
        """rag_reindex queues a table's keys in the caller's transaction; left open, it holds those queue
        rows. A later write to the same rows makes a batch whose keys conflict with them: the worker waits for
        them at most lock_timeout, leaves that watch's batch for a later round, and goes on serving every other
        collection and every other watch (found by red-team runs: the worker waited as long as the transaction
        stayed open; then, with more of the held watch's batches than one round spreads, it never reached the
        others)."""
        psql("SELECT rag_create_collection('held', embedding_model => 'hash-384', max_distance => 0.9); "
             "SELECT rag_create_collection('bystander', embedding_model => 'hash-384', max_distance => 0.9); "
             "CREATE TABLE held (id int PRIMARY KEY, body text); "
             "INSERT INTO held SELECT g, 'held row ' || g FROM generate_series(1, 5) g; "
             "SELECT rag_watch('held', 'held', content => 'body'); "
             "CREATE TABLE bystanders (id int PRIMARY KEY, body text); "
             "SELECT rag_watch('bystanders', 'bystander', content => 'body')", db=DB)
        settle()
        holder = background_psql("BEGIN; SELECT rag_reindex('held'::regclass);", db=DB)
        try:
            self.assertTrue(wait_until("SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE state = 'idle in transaction' "
                                       "AND query LIKE '%rag_reindex%')", db=DB, seconds=30))
            # More batches of the held watch than one round spreads, each statement its own.
            psql("DO $$ BEGIN FOR i IN 1..1100 LOOP UPDATE held SET body = 'changed while held ' || i WHERE id = 1; "
                 "END LOOP; END $$", db=DB)
            psql("SELECT rag_ingest('bystander', 'Meanwhile', 'Another collection is served all the same.')", db=DB)
            psql("INSERT INTO bystanders VALUES (1, 'a row of another watched table, written after them')", db=DB)
            self.assertTrue(wait_until("SELECT status = 'ready' FROM rag.documents WHERE title = 'Meanwhile'",
                                       db=DB, seconds=30))
            self.assertTrue(wait_until("SELECT EXISTS (SELECT 1 FROM rag.documents WHERE source = 'bystanders' "
                                       "AND status = 'ready')", db=DB, seconds=30))
            self.assertEqual(scalar("SELECT count(*) FROM rag.row_batches b JOIN rag.watches w ON w.id = b.watch_id "
                                    "WHERE w.source_name = 'held'", db=DB), "1100")
        finally:
            holder.communicate(input="ROLLBACK;\n", timeout=60)
        # Once the transaction ends, the batch it held back is spread and the change indexed.
        self.assertTrue(wait_until("SELECT body = 'changed while held 1100' FROM rag.documents "
                                   "WHERE source = 'held' AND source_key = '{\"id\": 1}'", db=DB, seconds=60))


    def test_a_row_over_a_limit_fails_until_it_is_written_again(self):
        # A row refused over a limit (here a title above the 4 kB a document's title may be; red team 12 had a
        # 72 MB HTML row) gives the same answer every time it is read: it counted as pending for ever and was
        # read again at every back-off. It is failed now, and tried again when it is written to.
        psql("SELECT rag_create_collection('limits', embedding_model => 'hash-384'); "
             "CREATE TABLE limited (id int PRIMARY KEY, title text, body text); "
             "INSERT INTO limited VALUES (1, repeat('t', 5000), 'A row whose title is far too long.'); "
             "SELECT rag_watch('limited', 'limits', content => 'body', title => 'title')", db=DB)
        status = "SELECT rows_failed, pending, last_error FROM rag_watch_status() WHERE source = 'limited'"
        self.assertTrue(wait_until("SELECT rows_failed = 1 AND pending = 0 FROM rag_watch_status() "
                                   "WHERE source = 'limited'", db=DB, seconds=30), repr(psql(status, db=DB)))
        self.assertIn("title", psql(status, db=DB)[0][2])
        self.assertEqual(scalar("SELECT not_before = 'infinity' FROM rag.row_queue q JOIN rag.watches w "
                                "ON w.id = q.watch_id WHERE w.source_name = 'limited'", db=DB), "t")
        self.assertEqual(scalar("SELECT rag_wait('limits', '5 seconds')", db=DB), "t")
        psql("UPDATE limited SET title = 'A short title' WHERE id = 1", db=DB)
        self.assertTrue(wait_until("SELECT rows_failed = 0 AND rows_ready = 1 AND pending = 0 FROM rag_watch_status() "
                                   "WHERE source = 'limited'", db=DB, seconds=30), repr(psql(status, db=DB)))

if __name__ == "__main__":
    unittest.main()
