"""The ledger keeps other roles' answers from an admin who may not read the rows they quote, also when the watch
those rows came from ends while an answer is being given (the end is counted, not timed: README, Security). Ledger
rows, conversations and providers belong to a role, not to a name: a role created later under a dropped role's
name, after a DROP ROLE in a database rag's hook does not see, gets nothing of them."""
import hashlib
import json
import os
import time
from functools import partial

from support import InItsOwnDatabase, background_psql, psql, scalar
from support import wait_until as wait_until_in
from support import read_line

DB = "rag_e2e_ledger"
wait_until = partial(wait_until_in, db=DB)


def quote(text):
    return "'" + text.replace("'", "''") + "'"


def waiting_on(key):
    return f"SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND objid = {key} AND NOT granted)"


class Ledger(InItsOwnDatabase):
    DB = DB

    def test_an_answer_whose_search_saw_the_watch_stays_hidden_after_the_unwatch(self):
        psql("""
            CREATE ROLE lg_owner IN ROLE rag_admin;
            CREATE ROLE lg_admin IN ROLE rag_admin;
            CREATE ROLE lg_reader IN ROLE rag_reader;
            CREATE SCHEMA lg AUTHORIZATION lg_owner;
            SET ROLE lg_owner;
            CREATE TABLE lg.tickets (id int PRIMARY KEY, visible_to name, body text);
            INSERT INTO lg.tickets VALUES (1, 'lg_reader', 'The printer on floor two is out of toner.'),
                                          (2, 'nobody', 'The salary review for the printer team is due in March.');
            ALTER TABLE lg.tickets ENABLE ROW LEVEL SECURITY;
            CREATE POLICY own_tickets ON lg.tickets FOR SELECT USING (visible_to = current_user);
            GRANT USAGE ON SCHEMA lg TO lg_reader, lg_admin;
            GRANT SELECT ON lg.tickets TO lg_reader, lg_admin;
            SELECT rag_create_collection('tickets', embedding_model => 'hash-384');
            SELECT rag_watch('lg.tickets', 'tickets', content => 'body');
            SELECT rag_grant('tickets', 'lg_reader', 'read');
            SELECT rag_grant('tickets', 'lg_admin', 'admin');
        """, db=DB)
        holder = unwatcher = asker = None
        try:
            self.assertTrue(wait_until("SELECT rag_wait('tickets', '1 second')", seconds=60))
            question = "Which printer is out of toner?"
            # The admin by grant may not read the table whole (its row-level security), so not its askers'
            # answers either.
            psql(f"SET ROLE lg_reader; SELECT rag_ask('tickets', '{question}')", db=DB)
            self.assertEqual(scalar("SET ROLE lg_admin; SELECT count(*) FROM rag.queries WHERE role = 'lg_reader'",
                                    db=DB), "0")

            # The reader's search takes its snapshot while the admin's rag_unwatch has run but not committed;
            # the answer is written after the commit, from the rows its snapshot still holds.
            holder = background_psql("SELECT pg_advisory_lock(1); SELECT pg_advisory_lock(3);", db=DB)
            self.assertTrue(wait_until("SELECT count(*) = 2 FROM pg_locks WHERE locktype = 'advisory' AND granted"))
            unwatcher = background_psql("""
                SET ROLE lg_admin;
                BEGIN;
                SELECT rag_unwatch(w.source, drop_documents => true) FROM rag.watches w;
                SELECT 'unwatched at ' || clock_timestamp();
                SELECT pg_advisory_lock(1);
                COMMIT;""", db=DB)
            self.assertTrue(wait_until(waiting_on(1)), "the unwatch did not get to its lock")
            asker = background_psql(f"""
                SET ROLE lg_reader;
                BEGIN ISOLATION LEVEL REPEATABLE READ;
                SELECT count(*) FROM rag.collections;
                SELECT pg_advisory_lock(3);
                SELECT outcome FROM rag_ask('tickets', '{question}');
                COMMIT;""", db=DB)
            self.assertTrue(wait_until(waiting_on(3)), "the asker did not take its snapshot")
            holder.stdin.write("SELECT pg_advisory_unlock(1);\n")
            holder.stdin.flush()
            out, err = unwatcher.communicate(timeout=60)
            self.assertEqual(unwatcher.returncode, 0, err)
            unwatched_at = next(line for line in out.splitlines() if line.startswith("unwatched at "))[13:]
            self.assertEqual(scalar("SELECT count(*) FROM rag.watches", db=DB), "0")
            holder.stdin.write("SELECT pg_advisory_unlock(3);\n")
            holder.stdin.flush()
            out, err = asker.communicate(timeout=60)
            self.assertEqual(asker.returncode, 0, err)
            self.assertIn("answered", out.split(), "the late answer should come from the rows its snapshot saw")
            holder.communicate(timeout=30)

            # The late answer quotes the table the collection no longer watches: the admin is not shown it,
            # although it was written after the unwatch committed.
            # Written by a transaction that began after the unwatch had run: a rule by time would show it.
            late = psql("SELECT outcome, sources_sent > 0, created_at > %s::timestamptz FROM rag.queries "
                        "WHERE role = 'lg_reader' ORDER BY id DESC LIMIT 1" % quote(unwatched_at), db=DB)
            self.assertEqual(late, [["answered", "t", "t"]])
            self.assertEqual(scalar("SET ROLE lg_admin; SELECT count(*) FROM rag.queries WHERE role = 'lg_reader'",
                                    db=DB), "0")
            # An answer given from a snapshot after the unwatch is the admin's to read: the collection indexes
            # nothing the admin may not read now.
            psql(f"SET ROLE lg_reader; SELECT rag_ask('tickets', '{question}')", db=DB)
            self.assertEqual(scalar("SET ROLE lg_admin; SELECT count(*) FROM rag.queries WHERE role = 'lg_reader'",
                                    db=DB), "1")
        finally:
            for process in (holder, unwatcher, asker):
                if process is not None and process.poll() is None:
                    process.kill()
                    process.wait()
            psql("""
                SELECT rag_drop_collection('tickets');
                DROP SCHEMA lg CASCADE;
                DROP OWNED BY lg_owner, lg_admin, lg_reader;
                DROP ROLE lg_owner, lg_admin, lg_reader;
            """, db=DB, check=False)

    def test_a_role_dropped_from_another_database_leaves_its_rows_to_nobody(self):
        # rag's utility hook sees only the database it runs in; a role is the cluster's. Who reads a ledger row
        # or a conversation is decided by the role (its oid), not its name, so a role created later under the
        # name is another role here too.
        psql("""
            CREATE ROLE lg_asker IN ROLE rag_reader;
            SELECT rag_create_collection('notes', embedding_model => 'hash-384');
            SELECT rag_grant('notes', 'lg_asker', 'read');
            SELECT rag_ingest('notes', 'Keys', 'The spare key is under the blue mat by the back door.');
        """, db=DB)
        try:
            self.assertTrue(wait_until("SELECT rag_wait('notes', '1 second')", seconds=60))
            psql("SET ROLE lg_asker; SELECT rag_ask('notes', 'Where is the spare key?'); "
                 "SELECT rag_conversation_start('notes')", db=DB)
            self.assertEqual(scalar("SET ROLE lg_asker; SELECT count(*) FROM rag.queries", db=DB), "1")
            psql("DROP ROLE lg_asker; CREATE ROLE lg_asker IN ROLE rag_reader", db="postgres")
            self.assertEqual(scalar("SET ROLE lg_asker; SELECT count(*) FROM rag.queries", db=DB), "0")
            self.assertEqual(scalar("SET ROLE lg_asker; SELECT count(*) FROM rag.conversations", db=DB), "0")
            # The record of who asked stays.
            self.assertEqual(scalar("SELECT count(*) FROM rag.queries WHERE role = 'lg_asker'", db=DB), "1")
        finally:
            psql("SELECT rag_drop_collection('notes'); DROP ROLE IF EXISTS lg_asker", db=DB, check=False)

    def test_a_providers_creator_dropped_from_another_database_is_nobody(self):
        # A provider is its creator's to drop or spend; a role created later under the creator's name is not
        # its creator.
        psql("CREATE ROLE lg_maker IN ROLE rag_admin", db=DB)
        try:
            psql("SET ROLE lg_maker; SELECT rag_create_provider('lg-provider', 'ollama', "
                 "base_url => 'http://127.0.0.1:9')", db=DB)
            psql("DROP ROLE lg_maker; CREATE ROLE lg_maker IN ROLE rag_admin", db="postgres")
            code, _, err = psql("SET ROLE lg_maker; SELECT rag_drop_provider('lg-provider')", db=DB, check=False)
            self.assertNotEqual(code, 0)
            self.assertIn('permission denied for provider "lg-provider"', err)
            self.assertEqual(scalar("SELECT created_by FROM rag.providers WHERE name = 'lg-provider'", db=DB),
                             "lg_maker")
        finally:
            psql("SELECT rag_drop_provider('lg-provider'); DROP ROLE IF EXISTS lg_maker", db=DB, check=False)

    def test_unwatch_takes_the_table_before_the_collection(self):
        # As DROP TABLE does: a session reading the table that then changes the collection must not deadlock
        # with an unwatch (which counts the watch's end on the collection's row).
        psql("""
            CREATE TABLE lg_locks (id int PRIMARY KEY, body text);
            INSERT INTO lg_locks VALUES (1, 'A row to index.');
            SELECT rag_create_collection('locks', embedding_model => 'hash-384');
            SELECT rag_watch('lg_locks', 'locks', content => 'body');
        """, db=DB)
        gate = reader = unwatcher = None
        try:
            self.assertTrue(wait_until("SELECT rag_wait('locks', '1 second')", seconds=60))
            gate = background_psql("SELECT pg_advisory_lock(5);", db=DB)
            self.assertTrue(wait_until("SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' "
                                       "AND objid = 5 AND granted)"))
            reader = background_psql("""
                BEGIN;
                SELECT count(*) FROM lg_locks;
                SELECT pg_advisory_lock(5);
                SELECT rag_set_search('locks', ef_search => 50);
                COMMIT;""", db=DB)
            self.assertTrue(wait_until(waiting_on(5)), "the reader did not get to its lock")
            unwatcher = background_psql("SELECT rag_unwatch('lg_locks', drop_documents => true);", db=DB)
            self.assertTrue(wait_until("SELECT EXISTS (SELECT 1 FROM pg_locks "
                                       "WHERE relation = 'lg_locks'::regclass AND NOT granted)"),
                            "the unwatch did not wait for the table")
            gate.stdin.write("SELECT pg_advisory_unlock(5);\n")
            gate.stdin.flush()
            _, err = reader.communicate(timeout=60)
            self.assertEqual(reader.returncode, 0, err)
            out, err = unwatcher.communicate(timeout=60)
            self.assertEqual(unwatcher.returncode, 0, err)
            self.assertEqual(out.strip(), "t")
            gate.communicate(timeout=30)
        finally:
            for process in (gate, reader, unwatcher):
                if process is not None and process.poll() is None:
                    process.kill()
                    process.wait()
            psql("SELECT rag_unwatch('lg_locks', drop_documents => true); SELECT rag_drop_collection('locks'); "
                 "DROP TABLE IF EXISTS lg_locks", db=DB, check=False)


class CallsThatRollBack(InItsOwnDatabase):
    """A ledger row is written in the caller's transaction; a provider call whose row is rolled back (ROLLBACK,
    a savepoint, a cancel while the provider works) is written to the server log instead, and a read-only
    transaction logs its calls as a standby does."""
    DB = "rag_e2e_ledger_rollback"

    def log_lines_since(self, start):
        with open(self.log_path, encoding="utf-8", errors="replace") as log:
            log.seek(start)
            found = []
            for line in log.read().splitlines():
                if "rag ledger: " in line:
                    found.append(json.loads(line.split("rag ledger: ", 1)[1]))
            return found

    def wait_for_lines(self, start, predicate, seconds=10):
        deadline = time.time() + seconds
        while time.time() < deadline:
            lines = [line for line in self.log_lines_since(start) if predicate(line)]
            if lines:
                return lines
            time.sleep(0.1)
        return []

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.log_path = os.path.join(os.environ["WORK"], "pg", "server.log")
        psql("""
            DROP ROLE IF EXISTS rb_reader;
            CREATE ROLE rb_reader LOGIN IN ROLE rag_reader;
            SELECT rag_create_collection('rb', embedding_model => 'hash-384', chat_model => 'chat-test');
            SELECT rag_create_collection('rb_slow', embedding_model => 'hash-384', chat_model => 'chat-test@slow4000');
            SELECT rag_grant('rb', 'rb_reader', 'read');
            SELECT rag_grant('rb_slow', 'rb_reader', 'read');
            SELECT rag_ingest('rb', 'Notice', 'Staff give thirty days notice before they resign.');
            SELECT rag_ingest('rb_slow', 'Notice', 'Staff give thirty days notice before they resign.');
            SELECT rag_wait('rb', '60 seconds'), rag_wait('rb_slow', '60 seconds');
        """, db=cls.DB)

    @classmethod
    def tearDownClass(cls):
        super().tearDownClass()
        psql("DROP ROLE IF EXISTS rb_reader", db="postgres")

    def test_rolled_back_calls_are_in_the_server_log(self):
        start = os.path.getsize(self.log_path)
        # ROLLBACK: the answer was given, its row is gone, its line is in the log with the question.
        rows = psql("BEGIN; SELECT outcome FROM rag_ask('rb', 'rolled-back-one: how much notice do staff give?'); "
                    "ROLLBACK;", db=self.DB, user="rb_reader")
        self.assertEqual(rows, [["answered"]])
        lines = self.wait_for_lines(start, lambda line: "rolled-back-one" in line.get("question", ""))
        self.assertEqual(len(lines), 1, lines)
        self.assertTrue(lines[0]["rolled_back"])
        self.assertEqual((lines[0]["role"], lines[0]["collection"], lines[0]["outcome"]), ("rb_reader", "rb", "answered"))
        self.assertIn("query_id", lines[0])
        # A savepoint rolled back around one call, a committed call after it: only the first is logged, only
        # the second is in the ledger.
        psql("BEGIN; SAVEPOINT s; SELECT count(*) FROM rag_query('rb', 'rolled-back-two notice'); "
             "ROLLBACK TO SAVEPOINT s; SELECT count(*) FROM rag_query('rb', 'committed-three notice'); COMMIT;",
             db=self.DB, user="rb_reader")
        self.assertEqual(len(self.wait_for_lines(start, lambda line: line.get("question") == "rolled-back-two notice")), 1)
        self.assertEqual(scalar("SELECT string_agg(question, ',' ORDER BY id) FROM rag.queries "
                                "WHERE question ~ '^(rolled-back|committed)'", db=self.DB), "committed-three notice")
        self.assertEqual([line for line in self.log_lines_since(start) if "committed-three" in line.get("question", "")], [])
        # A read-only transaction searches, and its call goes to the log (no row, nothing rolled back).
        rows = psql("BEGIN READ ONLY; SELECT count(*) > 0 FROM rag_query('rb', 'read-only-four notice', max_distance => 2); COMMIT;",
                    db=self.DB, user="rb_reader")
        self.assertEqual(rows, [["t"]])
        lines = self.wait_for_lines(start, lambda line: line.get("question") == "read-only-four notice")
        self.assertEqual(len(lines), 1, lines)
        self.assertNotIn("rolled_back", lines[0])
        self.assertEqual(scalar("SELECT count(*) FROM rag.queries WHERE question = 'read-only-four notice'", db=self.DB), "0")
        # A conversation writes as it goes: refused in a read-only transaction before any provider call.
        conversation = scalar("SELECT rag_conversation_start('rb')", db=self.DB, user="rb_reader")
        code, _, stderr = psql(f"SET default_transaction_read_only = on; SELECT * FROM rag_ask('rb', 'read-only-five', "
                               f"conversation => {conversation})", db=self.DB, user="rb_reader", check=False)
        self.assertNotEqual(code, 0)
        self.assertIn("a conversation needs a read-write transaction", stderr)
        self.assertEqual([line for line in self.log_lines_since(start) if "read-only-five" in json.dumps(line)], [])

    def test_a_long_question_is_cut_in_its_log_line_and_kept_whole_in_its_row(self):
        # The log has no retention: a reader's loop of 32 kB questions grew it by 32 kB a call (red team 19).
        # A line carries 2,000 characters of a text, with its length and SHA-256 to match it by.
        start = os.path.getsize(self.log_path)
        question = "long-six notice " + "é" * 5000
        rows = psql(f"BEGIN READ ONLY; SELECT count(*) >= 0 FROM rag_query('rb', '{question}', max_distance => 2); COMMIT;",
                    db=self.DB, user="rb_reader")
        self.assertEqual(rows, [["t"]])
        lines = self.wait_for_lines(start, lambda line: line.get("question", "").startswith("long-six"))
        self.assertEqual(len(lines), 1, lines)
        self.assertEqual(lines[0]["question"], question[:2000])
        self.assertEqual(lines[0]["question_chars"], len(question))
        self.assertEqual(lines[0]["question_sha256"], hashlib.sha256(question.encode()).hexdigest())
        # Rolled back, a row's line is cut the same way; committed, the row keeps the question whole.
        psql(f"BEGIN; SELECT count(*) >= 0 FROM rag_query('rb', 'long-seven {question}', max_distance => 2); ROLLBACK;",
             db=self.DB, user="rb_reader")
        lines = self.wait_for_lines(start, lambda line: line.get("question", "").startswith("long-seven"))
        self.assertEqual(len(lines), 1, lines)
        self.assertTrue(lines[0]["rolled_back"])
        self.assertEqual((len(lines[0]["question"]), lines[0]["question_chars"]), (2000, len(question) + 11))
        psql(f"SELECT count(*) >= 0 FROM rag_query('rb', 'long-eight {question}', max_distance => 2)",
             db=self.DB, user="rb_reader")
        self.assertEqual(scalar("SELECT length(question) FROM rag.queries WHERE question LIKE 'long-eight%'", db=self.DB),
                         str(len(question) + 11))
        # A short one has no length or hash beside it.
        psql("BEGIN READ ONLY; SELECT count(*) >= 0 FROM rag_query('rb', 'short-nine notice'); COMMIT;",
             db=self.DB, user="rb_reader")
        lines = self.wait_for_lines(start, lambda line: line.get("question") == "short-nine notice")
        self.assertEqual(len(lines), 1, lines)
        self.assertNotIn("question_chars", lines[0])
        self.assertNotIn("question_sha256", lines[0])

    def test_a_call_cancelled_while_the_provider_works_is_logged(self):
        start = os.path.getsize(self.log_path)
        code, rows, stderr = psql("SET statement_timeout = '1500ms'; "
                                  "SELECT * FROM rag_ask('rb_slow', 'cancelled-six: how much notice?', max_distance => 2)",
                                  db=self.DB, user="rb_reader", check=False)
        self.assertNotEqual(code, 0, rows)
        self.assertIn("statement timeout", stderr)
        lines = self.wait_for_lines(start, lambda line: line.get("provider_call") == "answering")
        self.assertEqual(len(lines), 1, lines)
        self.assertEqual((lines[0]["role"], lines[0]["model"], lines[0]["rolled_back"]),
                         ("rb_reader", "chat-test@slow4000", True))
        self.assertEqual(scalar("SELECT count(*) FROM rag.queries WHERE question ~ 'cancelled-six'", db=self.DB), "0")

    def test_a_conversation_deleted_while_its_question_is_answered(self):
        # Its admin deletes the conversation while the chat model works on the owner's question: the owner gets
        # an error that says so (it was the foreign key's "violates foreign key constraint"), and the call is in
        # the log as a rolled-back line.
        start = os.path.getsize(self.log_path)
        conversation = scalar("SELECT rag_conversation_start('rb_slow')", db=self.DB, user="rb_reader")
        asker = background_psql("SET ROLE rb_reader; SELECT outcome FROM rag_ask('rb_slow', 'deleted-seven: how much "
                                f"notice?', max_distance => 2, conversation => {conversation});", db=self.DB)
        try:
            time.sleep(1.5)
            self.assertEqual(scalar(f"SELECT rag_conversation_delete({conversation})", db=self.DB), "t")
        finally:
            _, stderr = asker.communicate(timeout=60)
        self.assertIn(f"conversation {conversation} was deleted while its question was being answered", stderr)
        self.assertNotIn("foreign key", stderr)
        lines = self.wait_for_lines(start, lambda line: "deleted-seven" in line.get("question", ""))
        self.assertEqual(len(lines), 1, lines)
        self.assertEqual(scalar("SELECT count(*) FROM rag.queries WHERE question ~ 'deleted-seven'", db=self.DB), "0")


class LedgerRetention(InItsOwnDatabase):
    """rag.ledger_retention: the worker deletes ledger rows older than the setting and keeps the others; 0 (the
    default) keeps every row."""
    DB = "rag_e2e_ledger_retention"

    def test_the_worker_deletes_rows_past_the_retention(self):
        db = self.DB
        psql("SELECT rag_create_collection('kept', embedding_model => 'hash-384'); "
             "SELECT rag_ingest('kept', 'Note', 'A note about keeping the ledger short.')", db=db)
        self.assertEqual(scalar("SELECT rag_wait('kept', '60 seconds')", db=db), "t")
        for question in ("first", "second", "third"):
            psql(f"SELECT count(*) FROM rag_query('kept', 'ledger {question}', 1, max_distance => 2)", db=db)
        psql("UPDATE rag.queries SET created_at = now() - interval '2 days' WHERE id = (SELECT min(id) FROM rag.queries)",
             db=db)
        # Without the setting nothing goes.
        time.sleep(1)
        self.assertEqual(scalar("SELECT count(*) FROM rag.queries", db=db), "3")
        psql("ALTER SYSTEM SET rag.ledger_retention = '1d'; SELECT pg_reload_conf()", db="postgres")
        try:
            self.assertTrue(wait_until_in("SELECT count(*) = 2 FROM rag.queries", db=db, seconds=30),
                            "the worker did not delete the row past the retention")
            self.assertEqual(scalar("SELECT string_agg(question, ',' ORDER BY id) FROM rag.queries", db=db),
                             "ledger second,ledger third")
            # A row another session holds (an open transaction's lock on it) is skipped, not waited for: the worker
            # waited without limit, and its whole database with it. Held before it is made old (a KEY SHARE lock
            # lets the update of its date through): made old first, the worker could delete it before the hold,
            # and the holder then waited for a row that was gone (session 38, once).
            for question in ("fourth", "fifth"):
                psql(f"SELECT count(*) FROM rag_query('kept', 'ledger {question}', 1, max_distance => 2)", db=db)
            holder = background_psql("BEGIN; SELECT 'held' FROM rag.queries WHERE question = 'ledger second' "
                                     "FOR KEY SHARE;", db=db)
            try:
                self.assertEqual(read_line(holder).strip(), "held")
                psql("UPDATE rag.queries SET created_at = now() - interval '2 days' "
                     "WHERE question IN ('ledger second', 'ledger fourth')", db=db)
                self.assertTrue(wait_until_in("SELECT NOT EXISTS (SELECT 1 FROM rag.queries "
                                              "WHERE question = 'ledger fourth')", db=db, seconds=30),
                                "the worker stopped at the held row")
                psql("SELECT rag_ingest('kept', 'After', 'A note written while a ledger row is held.')", db=db)
                self.assertEqual(scalar("SELECT rag_wait('kept', '30 seconds')", db=db), "t",
                                 "the worker stalled behind the held ledger row")
            finally:
                holder.communicate(input="ROLLBACK;\n", timeout=30)
            self.assertTrue(wait_until_in("SELECT NOT EXISTS (SELECT 1 FROM rag.queries "
                                          "WHERE question = 'ledger second')", db=db, seconds=30))
        finally:
            psql("ALTER SYSTEM RESET rag.ledger_retention; SELECT pg_reload_conf()", db="postgres")

