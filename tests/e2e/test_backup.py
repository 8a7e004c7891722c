"""Backups keep everything a user made: pg_dump / pg_restore (custom format, by section) and a plain SQL dump
replayed with psql bring back collections, documents, chunks with their vectors, the queue, watches whose
triggers still work, providers (never the seeded ones twice), prices, grants, conversations and the ledger;
each collection's partition of rag.chunks comes back with its rows and indexes (the HNSW index included, and
no worker builds one a restore is about to create: every restore here stops at its first error), and the
worker picks up pending work without a restart."""
import os
import shutil
import subprocess
import time
import unittest

from support import background_psql, drop_database, fresh_database, psql, read_line, scalar, wait_until

SOURCE = "rag_e2e_backup"

# One row per table: how its content is compared between the original and a restored copy.
FINGERPRINTS = {
    "collections": "SELECT string_agg(format('%s|%s|%s|%s|%s', id, name, embedding_model, dimensions, owner), ',' ORDER BY id) FROM rag.collections",
    "collection_grants": "SELECT string_agg(format('%s|%s|%s', collection_id, grantee, privilege), ',' ORDER BY collection_id, grantee::text) FROM rag.collection_grants",
    "documents": "SELECT string_agg(format('%s|%s|%s|%s|%s|%s', id, status, md5(body), metadata, watch_id, source_key), ',' ORDER BY id) FROM rag.documents",
    "chunks": "SELECT count(*) || '|' || md5(string_agg(id || content || coalesce(embedding::text, ''), ',' ORDER BY id)) FROM rag.chunks",
    "queue": "SELECT string_agg(format('%s|%s|%s', id, document_id, collection_id), ',' ORDER BY id) FROM rag.queue",
    "watches": "SELECT string_agg(format('%s|%s|%s|%s', id, source, content_expr, collection_id), ',' ORDER BY id) FROM rag.watches",
    "providers": "SELECT string_agg(format('%s|%s|%s', name, kind, base_url), ',' ORDER BY name) FROM rag.providers",
    "prices": "SELECT string_agg(format('%s|%s', model, input_usd_per_million), ',' ORDER BY model) FROM rag.prices",
    "conversations": "SELECT string_agg(format('%s|%s', id, owner), ',' ORDER BY id) FROM rag.conversations",
    "messages": "SELECT string_agg(format('%s|%s|%s', id, role, md5(content)), ',' ORDER BY id) FROM rag.messages",
    "queries": "SELECT string_agg(format('%s|%s|%s|%s', id, kind, outcome, md5(question)), ',' ORDER BY id) FROM rag.queries",
}


def fingerprint(db):
    return {table: scalar(sql, db=db) for table, sql in FINGERPRINTS.items()}


def trigger_states(db):
    return psql("SELECT c.relname, t.tgname, t.tgenabled FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid "
                "WHERE t.tgname LIKE 'rag\\_watch\\_%' ORDER BY 1, 2", db=db)


def run(command):
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    if result.returncode != 0:
        raise AssertionError(f"{command[0]} failed: {result.stderr}")
    return result.stdout


def drop(db):
    drop_database(db)


def sql_literal(text):
    return "'" + text.replace("'", "''") + "'"


class Backup(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        fresh_database(SOURCE)
        psql("""
            DROP ROLE IF EXISTS rag_e2e_backup_reader;
            CREATE ROLE rag_e2e_backup_reader IN ROLE rag_reader;
            SELECT rag_create_collection('kb', embedding_model => 'hash-384', max_distance => 2);
            SELECT rag_ingest('kb', 'Notice', 'Staff must give thirty days notice in writing.', '{"department": "hr"}');
            SELECT rag_ingest('kb', 'Canteen', 'Lunch is served from noon until two.', '{"department": "facilities"}');
            CREATE TABLE pages (id int PRIMARY KEY, body text);
            INSERT INTO pages VALUES (1, 'Parking is free for staff.'), (2, 'The office opens at eight.');
            SELECT rag_watch('pages', 'kb', content => 'body');
            -- A watched table with two of rag's triggers disabled by its owner: pg_dump makes the triggers one at
            -- a time, each disabled one with an ALTER TABLE right after it, which rag's event trigger on ALTER
            -- TABLE must leave alone (the first and the last of the set in the order a restore makes them).
            -- Into a collection of its own: kb's search plan, checked below, is left as it was.
            SELECT rag_create_collection('drafts', embedding_model => 'hash-384', max_distance => 2);
            CREATE TABLE drafts (id int PRIMARY KEY, body text);
            INSERT INTO drafts VALUES (1, 'Drafts are kept for a year.');
            SELECT rag_watch('drafts', 'drafts', content => 'body');
            ALTER TABLE drafts DISABLE TRIGGER rag_watch_delete, DISABLE TRIGGER rag_watch_update_key;
            SELECT rag_grant('kb', 'rag_e2e_backup_reader', 'read');
            SELECT rag_set_price('hash-384', 1.5, 0);
            SELECT rag_create_provider('elsewhere', 'openai', base_url => 'http://127.0.0.1:9/v1');
        """, db=SOURCE)
        assert wait_until("SELECT NOT EXISTS (SELECT 1 FROM rag.documents WHERE status <> 'ready') "
                          "AND (SELECT count(*) FROM rag.documents) = 5 AND NOT EXISTS (SELECT 1 FROM rag.row_queue)",
                          SOURCE), "the source database did not settle"
        psql("""
            SELECT rag_conversation_start('kb') AS c \\gset
            SELECT outcome FROM rag_ask('kb', 'How much notice do I give?', conversation => :c);
            SELECT count(*) FROM rag_query('kb', 'when is lunch');
            -- Pending work at dump time: a document whose turn comes in an hour.
            BEGIN;
            SELECT rag_create_collection('later', embedding_model => 'hash-384');
            SELECT rag_ingest('later', 'Pending', 'This document was still waiting when the backup was taken.');
            UPDATE rag.queue SET not_before = now() + interval '1 hour';
            COMMIT;
        """, db=SOURCE)
        cls.original = fingerprint(SOURCE)
        cls.triggers = trigger_states(SOURCE)
        cls.dump = os.path.join(os.environ.get("WORK", "/tmp"), "rag_e2e_backup.dump")
        run(["pg_dump", "-Fc", "-f", cls.dump, SOURCE])
        cls.plain = run(["pg_dump", "-Fp", SOURCE])
        # A directory-format dump, made by two jobs, for the parallel restore.
        cls.directory = os.path.join(os.environ.get("WORK", "/tmp"), "rag_e2e_backup.dir")
        shutil.rmtree(cls.directory, ignore_errors=True)
        run(["pg_dump", "-Fd", "-j", "2", "-f", cls.directory, SOURCE])
        # Asked after the dumps: the question itself adds a ledger row to the source.
        cls.top_title = psql("SELECT title FROM rag_query('kb', 'how much notice must staff give', 1)", db=SOURCE)

    @classmethod
    def tearDownClass(cls):
        drop(SOURCE)
        psql("DROP ROLE IF EXISTS rag_e2e_backup_reader", db="postgres")

    def check_restored(self, db):
        self.assertEqual(fingerprint(db), self.original)
        self.assertEqual(scalar("SELECT count(*) FROM rag.providers WHERE name IN ('ollama', 'local')", db=db), "2")
        # The HNSW index came back with the collection's partition, and the search uses it.
        self.assertEqual(scalar("SELECT to_regclass('rag.' || index_name) IS NOT NULL FROM rag.collections "
                                "WHERE name = 'kb'", db=db), "t", "the HNSW index was not restored")
        self.assertEqual(scalar("SELECT count(*) FROM pg_inherits WHERE inhparent = 'rag.chunks'::regclass", db=db), "3")
        plan = "\n".join(row[0] for row in psql("SET enable_seqscan = off; SELECT * FROM rag_explain('kb');", db=db))
        self.assertIn("Index Scan using chunks_embedding_c", plan)
        self.assertEqual(psql("SELECT title FROM rag_query('kb', 'how much notice must staff give', 1)", db=db),
                         self.top_title)
        # Pending work is picked up without a restart once it is due.
        psql("UPDATE rag.queue SET not_before = now()", db=db)
        self.assertTrue(wait_until("SELECT status = 'ready' FROM rag.documents WHERE title = 'Pending'", db))
        # The watch's triggers came back with the table and still feed the worker.
        psql("INSERT INTO pages VALUES (3, 'Visitors sign in at the front desk.')", db=db)
        self.assertTrue(wait_until("SELECT EXISTS (SELECT 1 FROM rag.documents WHERE source_key = '{\"id\": 3}' "
                                   "AND status = 'ready')", db), "an insert into the restored watched table was not indexed")
        # Every trigger of rag came back as it was, the disabled ones disabled: none was made again by rag's
        # event trigger while the restore altered the tables.
        self.assertEqual(trigger_states(db), self.triggers)
        self.assertIn(["drafts", "rag_watch_delete", "D"], self.triggers)
        self.assertIn(["drafts", "rag_watch_update_key", "D"], self.triggers)
        self.assertIn(["drafts", "rag_watch_insert", "O"], self.triggers)
        # Grants came back: the reader reads, the conversation continues.
        self.assertEqual(scalar("SET ROLE rag_e2e_backup_reader; SELECT count(*) > 0 FROM rag_query('kb', 'lunch');",
                                db=db), "t")

    def restore_and_check(self, target, restore):
        drop(target)
        psql(f"CREATE DATABASE {target}", db="postgres")
        try:
            restore(target)
            self.check_restored(target)
        finally:
            drop(target)

    def test_custom_format_restore(self):
        self.restore_and_check("rag_e2e_restored",
                               lambda db: run(["pg_restore", "--exit-on-error", "-d", db, self.dump]))

    def test_restore_by_section(self):
        def by_section(db):
            for section in ("pre-data", "data", "post-data"):
                run(["pg_restore", "--exit-on-error", f"--section={section}", "-d", db, self.dump])
        self.restore_and_check("rag_e2e_sections", by_section)

    def test_parallel_restore_as_the_readme_says(self):
        """pg_restore -j loads tables' data in any order, and rag's tables reference each other (PostgreSQL
        keeps the order only for a serial restore): the README's recipe restores the data section with
        --disable-triggers, which lets the parallel load skip the foreign-key checks of rows a consistent
        dump holds, and runs the other sections in parallel too."""
        directory = self.directory

        def in_parallel(db):
            run(["pg_restore", "--exit-on-error", "--section=pre-data", "-d", db, directory])
            run(["pg_restore", "--exit-on-error", "--section=data", "--disable-triggers", "-j", "2", "-d", db, directory])
            run(["pg_restore", "--exit-on-error", "--section=post-data", "-j", "2", "-d", db, directory])
        try:
            self.restore_and_check("rag_e2e_parallel", in_parallel)
        finally:
            shutil.rmtree(directory, ignore_errors=True)

    def test_plain_sql_dump_replayed_with_psql(self):
        self.restore_and_check("rag_e2e_plain", lambda db: psql(self.plain, db=db))

    def test_a_dump_without_the_chunks_is_chunked_and_embedded_again(self):
        """The chunks can be made again from the documents' text, so a smaller backup may leave them out. The
        restored documents still say they were chunked: before, every search found nothing while rag.status
        counted the chunks, and nothing told the user why. The worker now queues such a collection again."""
        target = "rag_e2e_no_chunks"
        drop(target)
        psql(f"CREATE DATABASE {target}", db="postgres")
        try:
            dump = run(["pg_dump", "-Fp", "--exclude-table-data", "rag.chunks_c*", SOURCE])
            self.assertNotIn("COPY rag.chunks_c", dump)
            psql(dump, db=target)
            # The same chunks as before, made again (their ids are new), with their vectors.
            same_chunks = ("SELECT string_agg(d.title || '|' || coalesce(d.source_key::text, '') || '|' || ch.content "
                           "|| '|' || (ch.embedding IS NOT NULL), ',' ORDER BY d.title, d.source_key::text, ch.ordinal) "
                           "FROM rag.chunks ch JOIN rag.documents d ON d.id = ch.document_id")
            expected = scalar(same_chunks, db=SOURCE)
            self.assertTrue(wait_until(f"SELECT ({same_chunks}) = {sql_literal(expected)} "
                                       "AND NOT EXISTS (SELECT 1 FROM rag.documents "
                                       "WHERE status <> 'ready' AND title <> 'Pending')", target),
                            "the collections whose chunks were left out were not chunked and embedded again")
            restored = fingerprint(target)
            for table in ("collections", "collection_grants", "watches", "providers"):
                self.assertEqual(restored[table], self.original[table], table)
            self.assertEqual(psql("SELECT title FROM rag_query('kb', 'how much notice must staff give', 1)", db=target),
                             self.top_title)
            self.assertEqual(scalar("SET ROLE rag_e2e_backup_reader; SELECT count(*) > 0 FROM rag_query('kb', 'lunch');",
                                    db=target), "t")
            counts = "SELECT string_agg(collection || ':' || chunks_total, ',' ORDER BY collection) FROM rag.status"
            self.assertEqual(scalar(counts, db=target), scalar(counts, db=SOURCE))
        finally:
            drop(target)

    def test_a_dump_without_rags_rows_leaves_no_partition_in_the_way(self):
        """pg_dump --exclude-table-data 'rag.*' restores the collections' partitions (they are tables of the dump)
        without the collections, whose ids come from a sequence that starts again: the first
        rag_create_collection took an id whose partition was there and failed, once for each. The new
        collection passes over them (they stay: the same state is a schema restored before its data)."""
        target = "rag_e2e_no_rag_rows"
        drop(target)
        psql(f"CREATE DATABASE {target}", db="postgres")
        try:
            run_restore = ["pg_restore", "--exit-on-error", "-d", target]
            dump = os.path.join(os.environ.get("WORK", "/tmp"), "rag_e2e_no_rag_rows.dump")
            run(["pg_dump", "-Fc", "--exclude-table-data", "rag.*", "-f", dump, SOURCE])
            run(run_restore + [dump])
            self.assertEqual(scalar("SELECT count(*) FROM pg_inherits WHERE inhparent = 'rag.chunks'::regclass",
                                    db=target), "3")
            self.assertEqual(scalar("SELECT rag_create_collection('fresh', embedding_model => 'hash-384', "
                                    "max_distance => 2)", db=target), "4")
            self.assertEqual(scalar("SELECT string_agg(c.relname::text, ',' ORDER BY 1) "
                                    "FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
                                    "WHERE i.inhparent = 'rag.chunks'::regclass", db=target),
                             "chunks_c1,chunks_c2,chunks_c3,chunks_c4")
            psql("SELECT rag_ingest('fresh', 'Notice', 'Staff must give thirty days notice in writing.')", db=target)
            self.assertTrue(wait_until("SELECT status = 'ready' FROM rag.documents WHERE title = 'Notice'", target))
            self.assertEqual(scalar("SELECT title FROM rag_query('fresh', 'notice', 1)", db=target), "Notice")
            # The watched table's triggers, whose watch did not come back, do not stand in its owner's way, and
            # the table can be watched again.
            psql("INSERT INTO pages VALUES (3, 'Visitors sign in at the front desk.')", db=target)
            self.assertEqual(scalar("SELECT count(*) FROM rag.row_queue", db=target), "0")
            psql("SELECT rag_watch('pages', 'fresh', content => 'body')", db=target)
            self.assertTrue(wait_until("SELECT count(*) = 3 AND bool_and(status = 'ready') FROM rag.documents "
                                       "WHERE watch_id IS NOT NULL", target), "the table was not watched again")
            self.assertEqual(scalar("SELECT d.source_key->>'id' FROM rag_query('fresh', 'front desk visitors', 1) q "
                                    "JOIN rag.documents d ON d.id = q.document_id", db=target), "3")
            os.remove(dump)
        finally:
            drop(target)


class WithoutPrivileges(unittest.TestCase):
    """A watched table's triggers run as its owner, with rights of schema rag that rag_watch granted: a restore
    without privileges (pg_restore --no-acl, pg_dump -x) leaves those out, and every write to the table failed,
    a superuser's too (red team 23). The idle worker grants them again once the restore has ended."""
    SOURCE = "rag_e2e_backup_acl"
    TARGET = "rag_e2e_restored_acl"
    OWNER = "rag_e2e_backup_owner"

    @classmethod
    def setUpClass(cls):
        fresh_database(cls.SOURCE)
        psql(f"""
            DROP ROLE IF EXISTS {cls.OWNER};
            CREATE ROLE {cls.OWNER} LOGIN IN ROLE rag_admin;
            GRANT CREATE ON SCHEMA public TO {cls.OWNER};
        """, db=cls.SOURCE)
        psql("""
            SELECT rag_create_collection('notes', embedding_model => 'hash-384', max_distance => 2);
            CREATE TABLE notes (id int PRIMARY KEY, body text);
            INSERT INTO notes VALUES (1, 'Parking is free for staff.');
            SELECT rag_watch('notes', 'notes', content => 'body');
            CREATE TABLE drafts (id int PRIMARY KEY, body text);
            SELECT rag_watch('drafts', 'notes', content => 'body', filter => $$body <> ''$$);
        """, db=cls.SOURCE, user=cls.OWNER)
        assert wait_until("SELECT EXISTS (SELECT 1 FROM rag.documents WHERE status = 'ready') "
                          "AND NOT EXISTS (SELECT 1 FROM rag.row_queue)", cls.SOURCE), "the source did not settle"
        cls.dump = os.path.join(os.environ.get("WORK", "/tmp"), "rag_e2e_backup_acl.dump")
        run(["pg_dump", "-Fc", "-f", cls.dump, cls.SOURCE])

    @classmethod
    def tearDownClass(cls):
        drop(cls.SOURCE)
        drop(cls.TARGET)
        psql(f"DROP ROLE IF EXISTS {cls.OWNER}", db="postgres")

    def test_a_restore_without_privileges_leaves_watched_tables_writable(self):
        drop(self.TARGET)
        psql(f"CREATE DATABASE {self.TARGET}", db="postgres")
        run(["pg_restore", "--exit-on-error", "--no-acl", "-d", self.TARGET, self.dump])
        # The owner writes to their own table again, without anyone's help, and the row is indexed.
        deadline = time.time() + 60
        while True:
            code, _, stderr = psql("INSERT INTO notes VALUES (2, 'Visitors sign in at the front desk.')",
                                   db=self.TARGET, user=self.OWNER, check=False)
            if code == 0:
                break
            self.assertIn("permission denied", stderr)
            self.assertLess(time.time(), deadline, f"the watched table stayed unwritable: {stderr}")
            time.sleep(0.2)
        self.assertTrue(wait_until("SELECT EXISTS (SELECT 1 FROM rag.documents WHERE source_key = '{\"id\": 2}' "
                                   "AND status = 'ready')", self.TARGET), "the new row was not indexed")
        self.assertEqual(scalar("SELECT rag._watch_owners_lacking()", db=self.TARGET), "{}")
        # Nor may PUBLIC run the watch's trigger functions any longer, which the restore left to it (a function's
        # default): any role could put one on a table of its own and queue keys for this watch as its owner.
        self.assertEqual(scalar("SELECT count(*) FROM pg_proc p WHERE p.pronamespace = 'rag'::regnamespace "
                                "AND p.proname ~ '^_watch_[0-9]+(_row)?$' AND (p.proacl IS NULL OR EXISTS "
                                "(SELECT 1 FROM aclexplode(p.proacl) a WHERE a.grantee = 0))", db=self.TARGET), "0")
        # rag_reindex mends it at once too: the same rights taken away by hand come back with it. In one
        # transaction, so that the worker cannot grant them in between.
        rows = psql(f"""
            BEGIN;
            REVOKE EXECUTE ON FUNCTION rag._restrict_to_current_user() FROM {self.OWNER};
            REVOKE INSERT ON rag.row_batches FROM {self.OWNER};
            SELECT rag._watch_owners_lacking();
            SET ROLE {self.OWNER};
            SELECT rag_reindex('notes'::regclass) >= 0;
            RESET ROLE;
            SELECT rag._watch_owners_lacking();
            COMMIT;""", db=self.TARGET)
        self.assertEqual(rows, [[f"{{{self.OWNER}}}"], ["t"], ["{}"]])
        psql("INSERT INTO notes VALUES (3, 'The office opens at eight.')", db=self.TARGET, user=self.OWNER)

    def test_a_restore_without_owners_runs_no_expression_as_a_superuser(self):
        """A superuser's pg_restore --no-owner makes the superuser own the watched table, so its watch's
        expressions, which an ordinary role wrote, would run as a superuser: in the worker unprompted, with any
        function they call (helper-93 made the author a superuser this way). rag refuses until a superuser takes
        them on, and says why where the owner looks."""
        drop(self.TARGET)
        psql(f"CREATE DATABASE {self.TARGET}", db="postgres")
        run(["pg_restore", "--exit-on-error", "--no-owner", "-d", self.TARGET, self.dump])
        self.assertEqual(psql("SELECT pg_get_userbyid(c.relowner), w.written_by FROM rag.watches w "
                              "JOIN pg_class c ON c.oid = w.source ORDER BY w.id", db=self.TARGET),
                         [["postgres", self.OWNER], ["postgres", self.OWNER]])
        # The filtered table's trigger, restored as the superuser's, refuses to run the filter.
        code, _, stderr = psql("INSERT INTO drafts VALUES (1, 'a draft')", db=self.TARGET, check=False)
        self.assertNotEqual(code, 0)
        self.assertIn("as a superuser who did not write them", stderr)
        code, _, stderr = psql("SELECT rag_reindex('notes'::regclass)", db=self.TARGET, check=False)
        self.assertNotEqual(code, 0)
        self.assertIn("as a superuser who did not write them", stderr)
        # A write is queued (this watch has no filter for its trigger to run), and the worker refuses the row.
        psql("INSERT INTO notes VALUES (2, 'Written after the restore.')", db=self.TARGET)
        self.assertTrue(wait_until("SELECT EXISTS (SELECT 1 FROM rag.row_queue WHERE last_error LIKE "
                                   "'%as a superuser who did not write them%')", self.TARGET),
                        "the worker did not refuse the row")
        self.assertEqual(scalar("SELECT count(*) FROM rag.documents WHERE source_key = '{\"id\": 2}'",
                                db=self.TARGET), "0")
        # Taken on by a superuser, the watch runs again.
        psql("UPDATE rag.watches SET written_by = current_user", db=self.TARGET)
        psql("INSERT INTO drafts VALUES (1, 'a draft')", db=self.TARGET)
        self.assertEqual(scalar("SELECT rag_reindex('notes'::regclass) > 0", db=self.TARGET), "t")
        self.assertTrue(wait_until("SELECT EXISTS (SELECT 1 FROM rag.documents WHERE source_key = '{\"id\": 2}' "
                                   "AND status = 'ready')", self.TARGET, seconds=90), "the row was not indexed")


def fill_with_work_due(source, seconds):
    """Collection kb (five documents) and the watched table web.pages (two rows), settled; then work due a few
    seconds after: a document waiting out a back-off, and a watched row rewritten under a long sync delay."""
    psql("""
        SELECT rag_create_collection('kb', embedding_model => 'hash-384', max_distance => 2);
        SELECT rag_ingest('kb', 'Doc ' || g, 'Restored text number ' || g || '. ' || repeat('Filler words. ', 20))
          FROM generate_series(1, 5) g;
        CREATE SCHEMA web;
        CREATE TABLE web.pages (id int PRIMARY KEY, body text);
        INSERT INTO web.pages VALUES (1, 'Parking is free for staff.'), (2, 'Lunch is served at noon.');
        SELECT rag_watch('web.pages', 'kb', content => 'body');
    """, db=source)
    assert wait_until("SELECT count(*) = 7 FROM rag.documents WHERE status = 'ready' "
                      "AND NOT EXISTS (SELECT 1 FROM rag.row_queue) AND NOT EXISTS (SELECT 1 FROM rag.queue)",
                      source), "the source did not settle"
    psql(f"""
        SET rag.sync_delay = '{seconds}s';
        UPDATE web.pages SET body = 'Parking is free for staff and visitors.' WHERE id = 1;
        BEGIN;
        SELECT rag_ingest('kb', 'Pending', 'This document was waiting out a back-off when the backup was taken.');
        UPDATE rag.queue SET not_before = now() + interval '{seconds} seconds';
        COMMIT;
    """, db=source)


def check_work_due_done(test, target):
    """What fill_with_work_due left due is done in the restored database, with the restored ids, and the watched
    table's triggers index a new row."""
    test.assertTrue(wait_until("SELECT NOT EXISTS (SELECT 1 FROM rag.documents WHERE status <> 'ready') "
                               "AND NOT EXISTS (SELECT 1 FROM rag.row_queue) "
                               "AND NOT EXISTS (SELECT 1 FROM rag.row_batches)", target),
                    "the restored database did not settle")
    test.assertEqual(scalar("SELECT count(*) || '/' || count(DISTINCT id) FROM rag.chunks", db=target),
                     scalar("SELECT count(*) || '/' || count(*) FROM rag.chunks c "
                            "JOIN rag.documents d ON d.id = c.document_id", db=target))
    # Both rows of the watched table are indexed, the rewritten one with its new text.
    test.assertEqual(psql("SELECT d.source_key->>'id', d.body FROM rag.documents d WHERE d.watch_id IS NOT NULL "
                          "ORDER BY 1", db=target),
                     [["1", "Parking is free for staff and visitors."], ["2", "Lunch is served at noon."]])
    test.assertEqual(scalar("SELECT count(*) FROM rag.documents WHERE title = 'Pending' AND status = 'ready'",
                            db=target), "1")
    # The watch's triggers are all there, and a new row is indexed.
    psql("INSERT INTO web.pages VALUES (3, 'Visitors sign in at the front desk.')", db=target)
    test.assertTrue(wait_until("SELECT EXISTS (SELECT 1 FROM rag.documents WHERE source_key->>'id' = '3' "
                               "AND status = 'ready')", target))


class RestoreWithWorkDue(unittest.TestCase):
    """A restore brings rag's rows in its data section and their keys and sequences' values after them, while
    the worker of the new database runs from CREATE EXTENSION on. A document queued at the dump and due by the
    restore was embedded as soon as rag.queue's rows were in: its chunks took ids the restored ones had (the
    sequence was not set yet, and the key that would refuse them is post-data), and the restore failed at the
    partition's primary key, with --exit-on-error before the watches' triggers. A watched row's key due before
    its table's rows were in had its document deleted for good (red team 27). The worker now waits while a
    restore is half done (rag._restore_under_way)."""
    SOURCE = "rag_e2e_backup_due"
    TARGET = "rag_e2e_restored_due"

    @classmethod
    def setUpClass(cls):
        fresh_database(cls.SOURCE)
        psql("DROP ROLE IF EXISTS rag_e2e_due_reader; CREATE ROLE rag_e2e_due_reader IN ROLE rag_reader;",
             db="postgres")
        fill_with_work_due(cls.SOURCE, 5)
        # A large table in a schema after rag's keeps the restore's data section going after rag's rows are in.
        psql("""
            SELECT rag_grant('kb', 'rag_e2e_due_reader', 'read');
            CREATE SCHEMA zz;
            CREATE TABLE zz.filler AS SELECT g AS id, md5(g::text) AS pad FROM generate_series(1, 400000) g;
        """, db=cls.SOURCE)
        cls.dump = os.path.join(os.environ.get("WORK", "/tmp"), "rag_e2e_backup_due.dump")
        run(["pg_dump", "-Fc", "-f", cls.dump, cls.SOURCE])
        cls.dumped_at = time.time()

    @classmethod
    def tearDownClass(cls):
        drop(cls.SOURCE)
        drop(cls.TARGET)
        psql("DROP ROLE IF EXISTS rag_e2e_due_reader", db="postgres")

    def test_work_due_during_a_restore_waits_for_its_end(self):
        time.sleep(max(0.0, self.dumped_at + 6 - time.time()))
        drop(self.TARGET)
        psql(f"CREATE DATABASE {self.TARGET}", db="postgres")
        # The data section in two steps, with a pause between them in which the worker of the new database runs:
        # first rag's own tables' rows, then the rest (the sequences' values, the watched table's rows). Any
        # restore has such a moment, only shorter (its order puts the sequences after every table's rows).
        listing = run(["pg_restore", "-l", self.dump]).splitlines()
        rag_rows = os.path.join(os.environ.get("WORK", "/tmp"), "rag_e2e_backup_due.rag_rows")
        other_rows = os.path.join(os.environ.get("WORK", "/tmp"), "rag_e2e_backup_due.other_rows")
        with open(rag_rows, "w") as first, open(other_rows, "w") as rest:
            for line in listing:
                if line.startswith(";"):
                    continue
                (first if " TABLE DATA rag " in line else rest).write(line + "\n")
        run(["pg_restore", "--exit-on-error", "--section=pre-data", "-d", self.TARGET, self.dump])
        run(["pg_restore", "--exit-on-error", "--section=data", "-L", rag_rows, "-d", self.TARGET, self.dump])
        self.assertTrue(wait_until("SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE backend_type = 'rag worker' "
                                   f"AND datname = '{self.TARGET}')", "postgres"), "no worker came")
        time.sleep(3)
        # rag.status says why nothing moves (a restore that stops here stays so for good), to a reader too.
        for become in ("", "SET ROLE rag_e2e_due_reader; "):
            self.assertEqual(psql(f"{become}SELECT collection, "
                                  "worker_waiting_for LIKE 'a restore of this database is not finished%' "
                                  "FROM rag.status", db=self.TARGET), [["kb", "t"]])
        run(["pg_restore", "--exit-on-error", "--section=data", "-L", other_rows, "-d", self.TARGET, self.dump])
        run(["pg_restore", "--exit-on-error", "--section=post-data", "-d", self.TARGET, self.dump])
        for become in ("", "SET ROLE rag_e2e_due_reader; "):
            self.assertEqual(psql(f"{become}SELECT collection, worker_waiting_for IS NULL FROM rag.status",
                                  db=self.TARGET), [["kb", "t"]])
        check_work_due_done(self, self.TARGET)


class DataOnlyReplay(unittest.TestCase):
    """A schema restored first (`pg_dump --schema-only`), then the data of a plain `pg_dump --data-only` replayed
    with psql: the partitions have their keys and nobody named pg_restore is connected, so neither sign of a
    restore under way was there. The one sign such a restore gives is that rag's rows come before their
    sequences' values (a dump sets its sequences after every table's rows); before it was read, the worker
    claimed a restored document in that gap and gave its chunks ids the restored chunks had."""
    SOURCE = "rag_e2e_backup_dataonly"
    TARGET = "rag_e2e_restored_dataonly"

    @classmethod
    def setUpClass(cls):
        fresh_database(cls.SOURCE)
        fill_with_work_due(cls.SOURCE, 4)
        cls.schema = run(["pg_dump", "--schema-only", cls.SOURCE])
        cls.data = run(["pg_dump", "--data-only", cls.SOURCE])
        cls.data_without_chunks = run(["pg_dump", "--data-only", "--exclude-table-data", "rag.chunks_c*", cls.SOURCE])
        cls.dumped_at = time.time()

    @classmethod
    def tearDownClass(cls):
        drop(cls.SOURCE)
        drop(cls.TARGET)

    def replay(self, text, db=None):
        result = subprocess.run(["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", db or self.TARGET], input=text,
                                capture_output=True, text=True, timeout=300)
        self.assertEqual(result.returncode, 0, result.stderr)

    def test_rows_before_their_sequences_keep_the_worker_waiting(self):
        drop(self.TARGET)
        psql(f"CREATE DATABASE {self.TARGET}", db="postgres")
        self.replay(self.schema)
        # The data in two steps, with the worker of the new database running between them: every table's rows,
        # then the sequences' values. Any such replay has that moment, only shorter.
        cut = self.data.index("SELECT pg_catalog.setval(")
        time.sleep(max(0.0, self.dumped_at + 5 - time.time()))
        self.replay(self.data[:cut])
        self.assertTrue(wait_until("SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE backend_type = 'rag worker' "
                                   f"AND datname = '{self.TARGET}')", "postgres"), "no worker came")
        time.sleep(3)
        self.assertEqual(psql("SELECT collection, worker_waiting_for LIKE 'a restore of this database is not finished%' "
                              "FROM rag.status", db=self.TARGET), [["kb", "t"]])
        # Nothing was claimed: the due document is still as dumped, and no attempt failed.
        self.assertEqual(psql("SELECT d.status, q.attempts, q.last_error IS NULL FROM rag.documents d "
                              "JOIN rag.queue q ON q.document_id = d.id WHERE d.title = 'Pending'", db=self.TARGET),
                         [["processing", "0", "t"]])
        # pg_dump's \restrict line opens the script and its \unrestrict closes it: the second step gets both.
        restrict = [line for line in self.data.splitlines() if line.startswith("\\restrict ")]
        self.replay("\n".join(restrict + [self.data[cut:]]))
        self.assertEqual(psql("SELECT collection, worker_waiting_for IS NULL FROM rag.status", db=self.TARGET),
                         [["kb", "t"]])
        check_work_due_done(self, self.TARGET)

    def test_documents_restored_without_their_chunks_are_chunked_again_once_the_restore_ends(self):
        """A dump without the chunks (--exclude-table-data 'rag.chunks_c*') restored in two parts: the schema,
        then the data. The data makes no partition, which is what had the worker look for documents missing
        their chunks; a worker that saw the restore under way now looks once it ends."""
        target = self.TARGET + "_nochunks"
        drop(target)
        psql(f"CREATE DATABASE {target}", db="postgres")
        try:
            self.replay(self.schema, target)
            # A worker that started with the schema has looked at every collection (empty) before the data comes.
            self.assertTrue(wait_until("SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE backend_type = 'rag worker' "
                                       f"AND datname = '{target}')", "postgres"), "no worker came")
            time.sleep(2)
            cut = self.data_without_chunks.index("SELECT pg_catalog.setval(")
            self.replay(self.data_without_chunks[:cut], target)
            # Ten naptimes of the test cluster's: the worker has seen the restore under way.
            time.sleep(2)
            self.assertEqual(scalar("SELECT worker_waiting_for IS NOT NULL FROM rag.status", db=target), "t")
            restrict = [line for line in self.data_without_chunks.splitlines() if line.startswith("\\restrict ")]
            self.replay("\n".join(restrict + [self.data_without_chunks[cut:]]), target)
            self.assertTrue(wait_until("SELECT (SELECT count(*) FROM rag.chunks) = (SELECT sum(chunks_total) FROM rag.documents) "
                                       "AND NOT EXISTS (SELECT 1 FROM rag.documents WHERE status <> 'ready') "
                                       "AND (SELECT count(*) FROM rag.chunks) > 0", target),
                            "the documents restored without their chunks were not chunked again")
            self.assertEqual(scalar("SELECT count(*) FROM rag_query('kb', 'Restored text number 3', 3)", db=target), "3")
        finally:
            drop(target)


class DataOnlyReplayWithBatches(unittest.TestCase):
    """A data-only dump taken while batches of watched keys waited to be spread, replayed with psql after the
    schema and without --disable-triggers: the watched tables' rows fire their watches' triggers as they come,
    and those triggers and the dump's own rag.row_batches rows take ids before the restore sets the sequence.
    One watched table comes before schema rag in the dump (public.notes, owned by a role that is not a
    superuser, so before its watch's row too), one after it (web.pages). The restore failed at rag.row_batches'
    key ("Key (id)=(1) already exists"), in COPY rag.row_batches or in the watched table's COPY, whichever came
    second: without ON_ERROR_STOP the dumped batches (here, two rows' deletions) were lost and the deleted rows
    stayed searchable. notes' owner had its COPY fail on the queue's row-level security as well (the dump's
    row_security = off; its watch not restored yet)."""
    SOURCE = "rag_e2e_backup_batches"
    TARGET = "rag_e2e_restored_batches"
    # The chunks of the rows left (id 3), which the replay queues again.
    KEPT_CHUNKS = ("SELECT string_agg(c.id || ':' || md5(c.embedding::text), ',' ORDER BY c.id) FROM rag.chunks c "
                   "JOIN rag.documents d ON d.id = c.document_id WHERE d.source_key->>'id' = '3'")

    @classmethod
    def setUpClass(cls):
        fresh_database(cls.SOURCE)
        psql("""
            SELECT rag_create_collection('kb', embedding_model => 'hash-384', max_distance => 2);
            DROP ROLE IF EXISTS rag_e2e_batches_owner;
            CREATE ROLE rag_e2e_batches_owner;
            CREATE TABLE notes (id int PRIMARY KEY, body text);
            ALTER TABLE notes OWNER TO rag_e2e_batches_owner;
            CREATE SCHEMA web;
            CREATE TABLE web.pages (id int PRIMARY KEY, body text);
            INSERT INTO notes SELECT g, 'Note number ' || g FROM generate_series(1, 3) g;
            INSERT INTO web.pages SELECT g, 'Page number ' || g FROM generate_series(1, 3) g;
            SELECT rag_watch('notes', 'kb', content => 'body');
            SELECT rag_watch('web.pages', 'kb', content => 'body');
        """, db=cls.SOURCE)
        assert wait_until("SELECT count(*) = 6 FROM rag.documents WHERE status = 'ready' "
                          "AND NOT EXISTS (SELECT 1 FROM rag.row_queue)", cls.SOURCE), "the source did not settle"
        # Batches the worker has not spread yet: it cannot queue a key whose row in rag.row_queue another
        # transaction is inserting, and leaves that batch for later. The insert is never committed.
        holder = background_psql("BEGIN; INSERT INTO rag.row_queue (watch_id, key) "
                                 "SELECT id, jsonb_build_object('id', 1) FROM rag.watches; SELECT 'held';",
                                 db=cls.SOURCE)
        try:
            while read_line(holder).strip() != "held":
                pass
            psql("DELETE FROM notes WHERE id IN (1, 2); DELETE FROM web.pages WHERE id IN (1, 2);", db=cls.SOURCE)
            time.sleep(1)
            # The database's first batches: the ids a fresh sequence hands out first, as the target's will.
            assert psql("SELECT id, keys FROM rag.row_batches ORDER BY id", db=cls.SOURCE) == \
                [["1", "[1, 2]"], ["2", "[1, 2]"]], "the batches were spread before the dump"
            cls.kept_chunks = scalar(cls.KEPT_CHUNKS, db=cls.SOURCE)
            cls.schema = run(["pg_dump", "--schema-only", cls.SOURCE])
            cls.data = run(["pg_dump", "--data-only", cls.SOURCE])
        finally:
            holder.communicate(input="ROLLBACK;\n", timeout=30)

    @classmethod
    def tearDownClass(cls):
        drop(cls.SOURCE)
        drop(cls.TARGET)

    def replay(self, target, **options):
        """The schema, then the data in one transaction with psql, stopping at the first error, as the README
        says to replay a plain dump; `options` are the data step's session settings. In one transaction the
        worker sees no batch a trigger wrote before the dump's own come in, and cannot spread it first."""
        drop(target)
        psql(f"CREATE DATABASE {target}", db="postgres")
        settings = " ".join(f"-c {name}={value}" for name, value in options.items())
        for text, pgoptions in ((self.schema, ""), (self.data, settings)):
            result = subprocess.run(["psql", "-X", "-q", "-1", "-v", "ON_ERROR_STOP=1", "-d", target], input=text,
                                    capture_output=True, text=True, timeout=300,
                                    env=dict(os.environ, PGOPTIONS=pgoptions))
            self.assertEqual(result.returncode, 0, result.stderr)

    def check_restored(self, target):
        self.assertEqual(psql("SELECT (SELECT string_agg(id::text, ',') FROM notes), "
                              "(SELECT string_agg(id::text, ',') FROM web.pages)", db=target), [["3", "3"]])
        # The dumped batches are spread: the rows deleted before the dump lose their documents.
        self.assertTrue(wait_until("SELECT NOT EXISTS (SELECT 1 FROM rag.row_batches) "
                                   "AND NOT EXISTS (SELECT 1 FROM rag.row_queue) "
                                   "AND NOT EXISTS (SELECT 1 FROM rag.documents WHERE source_key->>'id' IN ('1', '2'))",
                                   target), psql("SELECT id, source_key FROM rag.documents", db=target))
        self.assertEqual(psql("SELECT w.source_name, d.source_key->>'id', d.status FROM rag.documents d "
                              "JOIN rag.watches w ON w.id = d.watch_id ORDER BY 1, 2", db=target),
                         [["notes", "3", "ready"], ["web.pages", "3", "ready"]])
        # The rows the replay queued again were read again and found unchanged: their chunks are the dumped ones.
        self.assertEqual(scalar(self.KEPT_CHUNKS, db=target), self.kept_chunks)
        # The triggers write new batches past every id taken, and a new row of each table is indexed.
        psql("INSERT INTO notes VALUES (4, 'Note number 4'); INSERT INTO web.pages VALUES (4, 'Page number 4');",
             db=target)
        self.assertTrue(wait_until("SELECT count(*) = 2 FROM rag.documents WHERE source_key->>'id' = '4' "
                                   "AND status = 'ready'", target))

    def test_watched_rows_and_waiting_batches_both_come_back(self):
        self.assertLess(self.data.index("COPY public.notes"), self.data.index("COPY rag.row_batches"))
        self.assertLess(self.data.index("COPY rag.row_batches"), self.data.index("COPY web.pages"))
        self.replay(self.TARGET)
        self.check_restored(self.TARGET)

    def test_replayed_as_a_replica_session(self):
        """session_replication_role = replica keeps a table's own triggers quiet during a load, but fires the
        watches' replica triggers (which keep a subscriber's watched tables indexed), one batch per row."""
        target = self.TARGET + "_replica"
        try:
            self.replay(target, session_replication_role="replica")
            self.check_restored(target)
        finally:
            drop(target)


if __name__ == "__main__":
    unittest.main()
