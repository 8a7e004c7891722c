"""Transactions that keep one snapshot from their first statement on (REPEATABLE READ, SERIALIZABLE) get what
PostgreSQL gives them: a privilege revoked since they began no longer counts, a command that would act on rows
others committed since fails with a serialization error they can retry, and the calls that must read what
others commit while they run refuse to run there (red team 29)."""
import time
import unittest

from support import InItsOwnDatabase, background_psql, psql, read_line, scalar, wait_until

DB = "rag_e2e_snapshots"


def snapshot_session(role=None):
    """A session that took its REPEATABLE READ snapshot (as `role`, when given) and waits for more input."""
    become = f"SET ROLE {role}; " if role else ""
    session = background_psql(f"{become}BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 'snapshot taken';", db=DB)
    for line in session.stdout:
        if line.strip() == "snapshot taken":
            return session
    raise AssertionError(f"the session did not begin: {session.stderr.read()}")


class Snapshots(InItsOwnDatabase):
    DB = DB

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        psql("""
            DROP ROLE IF EXISTS sn_owner, sn_admin, sn_reader;
            CREATE ROLE sn_owner IN ROLE rag_admin;
            CREATE ROLE sn_reader IN ROLE rag_reader;
            CREATE ROLE sn_admin IN ROLE rag_admin;
            GRANT CREATE ON SCHEMA public TO sn_owner;
        """, db=DB)

    @classmethod
    def tearDownClass(cls):
        psql("SELECT rag_drop_collection(name) FROM rag.collections; DROP TABLE IF EXISTS notes, later, drafts; "
             "DROP OWNED BY sn_owner, sn_admin, sn_reader; DROP ROLE sn_owner, sn_admin, sn_reader", db=DB)
        super().tearDownClass()

    def test_a_revoked_admin_with_an_older_snapshot_may_do_nothing(self):
        psql("SET ROLE sn_owner; SELECT rag_create_collection('owned', embedding_model => 'hash-384'); "
             "SELECT rag_grant('owned', 'sn_admin', 'admin')", db=DB)
        for attempt in ("SELECT rag_grant('owned', 'sn_admin', 'admin')",
                        "SELECT rag_ingest('owned', 'After the revoke', 'Written by a revoked admin.')",
                        "SELECT rag_drop_collection('owned')"):
            with self.subTest(attempt=attempt):
                psql("SET ROLE sn_owner; SELECT rag_grant('owned', 'sn_admin', 'admin')", db=DB)
                admin = snapshot_session("sn_admin")
                psql("SET ROLE sn_owner; SELECT rag_revoke('owned', 'sn_admin')", db=DB)
                _, err = admin.communicate(f"{attempt}; COMMIT;\n", timeout=60)
                self.assertNotEqual(admin.returncode, 0)
                self.assertIn("permission denied", err)
                self.assertEqual(scalar("SELECT count(*) FROM rag.collection_grants g JOIN rag.collections c "
                                        "ON c.id = g.collection_id WHERE c.name = 'owned'", db=DB), "0")
                self.assertEqual(scalar("SELECT count(*) FROM rag.documents", db=DB), "0")
        psql("SELECT rag_drop_collection('owned')", db=DB)

    def test_a_table_watched_after_the_snapshot_is_not_dropped_or_truncated_behind_the_watch(self):
        psql("""
            SELECT rag_create_collection('notes', embedding_model => 'hash-384');
            CREATE TABLE later (id int PRIMARY KEY, body text);
            INSERT INTO later VALUES (1, 'Parking is free for staff.');
        """, db=DB)
        for command in ("DROP TABLE later", "TRUNCATE later", "ALTER TABLE later RENAME COLUMN body TO text_body"):
            with self.subTest(command=command):
                session = snapshot_session()
                psql("SELECT rag_watch('later', 'notes', content => 'body')", db=DB)
                self.assertTrue(wait_until("SELECT count(*) = 1 FROM rag.documents WHERE status = 'ready'", db=DB))
                _, err = session.communicate(f"{command}; COMMIT;\n", timeout=60)
                self.assertNotEqual(session.returncode, 0)
                self.assertIn("could not serialize access", err)
                # Nothing changed: the table, its watch and its document are all there, and writes still work.
                self.assertEqual(scalar("SELECT count(*) FROM rag.watches w JOIN rag.documents d ON d.watch_id = w.id "
                                        "WHERE w.source = 'later'::regclass", db=DB), "1")
                psql("UPDATE later SET body = body WHERE id = 1", db=DB)
                psql("SELECT rag_unwatch('later', drop_documents => true)", db=DB)
        psql("DROP TABLE later; SELECT rag_drop_collection('notes')", db=DB)

    def test_calls_that_read_what_others_commit_refuse_one_snapshot(self):
        psql("""
            SELECT rag_create_collection('drafts', embedding_model => 'hash-384');
            CREATE TABLE drafts (id int PRIMARY KEY, body text);
        """, db=DB)
        for call in ("SELECT rag_watch('drafts', 'drafts', content => 'body')",
                     "SELECT rag_wait('drafts', '1 second')",
                     "SELECT rag_set_embedding_model('drafts', 'hash-256')",
                     "SELECT rag_process_queue()"):
            for isolation in ("REPEATABLE READ", "SERIALIZABLE"):
                with self.subTest(call=call, isolation=isolation):
                    code, _, err = psql(f"BEGIN ISOLATION LEVEL {isolation}; {call}; COMMIT;", db=DB, check=False)
                    self.assertNotEqual(code, 0)
                    self.assertIn("needs a READ COMMITTED transaction", err)
        # As a single statement under a database default of SERIALIZABLE too; READ COMMITTED says it runs.
        code, _, err = psql("SET default_transaction_isolation = 'serializable'; "
                            "SELECT rag_watch('drafts', 'drafts', content => 'body')", db=DB, check=False)
        self.assertIn("needs a READ COMMITTED transaction", err)
        psql("SET default_transaction_isolation = 'serializable'; BEGIN ISOLATION LEVEL READ COMMITTED; "
             "SELECT rag_watch('drafts', 'drafts', content => 'body'); COMMIT;", db=DB)
        psql("SELECT rag_unwatch('drafts', drop_documents => true); DROP TABLE drafts; "
             "SELECT rag_drop_collection('drafts')", db=DB)

    def test_an_idle_worker_does_not_walk_the_finished_queue_while_a_snapshot_holds_it_back(self):
        """A REPEATABLE READ session (a pg_dump, say) holds the xmin horizon, so every queue entry a load finishes
        stays behind as a dead row until it ends. An idle worker that looked at its queue every naptime walked
        them all each time (about two buffers an entry: 6,000 a look after 3,000 documents). It now keeps what
        it found until a backend wakes it, and work queued meanwhile is still taken at once."""
        psql("SELECT rag_create_collection('idle', embedding_model => 'hash-384')", db=DB)
        session = snapshot_session()
        try:
            psql("SELECT count(rag_ingest('idle', 'Note ' || g, 'Note number ' || g || ' is about parking.')) "
                 "FROM generate_series(1, 600) g", db=DB)
            self.assertEqual(scalar("SELECT rag_wait('idle', '120 seconds')", db=DB), "t")
            self.assertEqual(scalar("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                                    "AND backend_xmin IS NOT NULL AND state = 'idle in transaction'", db=DB), "1")
            # Scans, not buffers: autovacuum and ANALYZE may read the queue's pages meanwhile, but scan nothing.
            scans = ("SELECT sum(coalesce(seq_scan, 0) + coalesce(idx_scan, 0)) FROM pg_stat_all_tables "
                     "WHERE relid IN ('rag.queue'::regclass, 'rag.row_queue'::regclass)")
            # Settled first: after rag_wait returns, the load's index is built and its extra worker leaves,
            # which look at the queue once or twice more. A worker that looks every naptime never settles.
            settled_at, last = time.time() + 20, None
            while time.time() < settled_at:
                count = int(scalar(scans, db=DB))
                if count == last:
                    break
                last = count
                time.sleep(1)
            before = int(scalar(scans, db=DB))
            # Fifteen naptimes of the test cluster's 200 ms; one look scans the queues four times.
            time.sleep(3)
            after = int(scalar(scans, db=DB))
            self.assertLessEqual(after - before, 4, "the idle worker looked at its queue again and again")
            psql("SELECT rag_ingest('idle', 'Late', 'A late note about bicycles.')", db=DB)
            self.assertTrue(wait_until("SELECT status = 'ready' FROM rag.documents WHERE title = 'Late'", db=DB,
                                       seconds=10))
        finally:
            session.communicate("COMMIT;\n", timeout=60)
            psql("SELECT rag_drop_collection('idle')", db=DB)

    def test_work_of_a_prepared_transaction_is_taken_at_its_commit_prepared(self):
        """An idle worker keeps what it found in its queue until it is woken, and a transaction's wake comes with
        its commit. PREPARE ends a transaction without one, so COMMIT PREPARED wakes the worker: the document is
        ready within seconds, not when the worker's memo of an empty queue runs out (a minute)."""
        psql("SELECT rag_create_collection('prepared', embedding_model => 'hash-384')", db=DB)
        try:
            # Idle, with its memo taken after the collection's own wake.
            time.sleep(1)
            psql("BEGIN; SELECT rag_ingest('prepared', 'Prepared', 'Written in a prepared transaction.'); "
                 "PREPARE TRANSACTION 'rag_e2e_prepared'", db=DB)
            time.sleep(1)
            self.assertEqual(scalar("SELECT count(*) FROM rag.documents WHERE title = 'Prepared'", db=DB), "0")
            psql("COMMIT PREPARED 'rag_e2e_prepared'", db=DB)
            self.assertTrue(wait_until("SELECT status = 'ready' FROM rag.documents WHERE title = 'Prepared'", db=DB,
                                       seconds=10))
        finally:
            # Left prepared only when the test failed before its COMMIT PREPARED; it would hold the drop.
            psql("ROLLBACK PREPARED 'rag_e2e_prepared'", db=DB, check=False)
            psql("SELECT rag_drop_collection('prepared')", db=DB)

    def test_rag_await_holds_back_no_vacuum_while_it_waits(self):
        """A SELECT of rag_wait keeps its statement's snapshot, and so the database's xmin horizon, for as long
        as it waits; CALL rag_await commits between its checks, so the horizon moves on while it waits."""
        psql("""
            SELECT rag_create_collection('slow', embedding_model => 'hash-384@slow4000');
            SELECT rag_grant('slow', 'sn_reader', 'read');
            SELECT rag_ingest('slow', 'Slow', 'Each embedding takes the provider four seconds.');
        """, db=DB)
        waiters = {}
        self.addCleanup(lambda: [session.kill() for session, _ in waiters.values()])
        for call in ("SELECT rag_wait('slow', '60 seconds')", "CALL rag_await('slow', '60 seconds')"):
            session = background_psql(f"SET ROLE sn_reader; SELECT pg_backend_pid(); {call};", db=DB)
            waiters[call.split()[1].split("(")[0]] = (session, read_line(session).strip())
        xmin = {name: f"SELECT backend_xmin FROM pg_stat_activity WHERE pid = {pid}"
                for name, (_, pid) in waiters.items()}
        self.assertTrue(wait_until("SELECT " + " AND ".join(f"({sql}) IS NOT NULL" for sql in xmin.values()), db=DB))
        before = {name: int(scalar(sql, db=DB)) for name, sql in xmin.items()}
        # A transaction that ends after both began: only a session that took a new snapshot since is past it.
        written = int(scalar("CREATE TABLE IF NOT EXISTS horizon (x int); INSERT INTO horizon VALUES (1); "
                             "SELECT pg_current_xact_id()::text::bigint", db=DB))
        self.assertTrue(wait_until(f"SELECT ({xmin['rag_await']})::text::bigint > {written}", db=DB, seconds=10))
        self.assertEqual(int(scalar(xmin["rag_wait"], db=DB)), before["rag_wait"])
        self.assertLessEqual(before["rag_wait"], written)
        for name, (session, _) in waiters.items():
            with self.subTest(waiter=name):
                self.assertEqual(read_line(session).strip(), "t")
                session.communicate(timeout=60)
                self.assertEqual(session.returncode, 0)
        # Where it cannot commit (a transaction block, a function) it waits as rag_wait does, READ COMMITTED only.
        psql("SELECT rag_ingest('slow', 'Slower', 'Another four seconds of embedding.')", db=DB)
        rows = psql("SET ROLE sn_reader; BEGIN; CALL rag_await('slow', '60 seconds'); COMMIT;", db=DB)
        self.assertEqual(rows, [["t"]])
        code, _, err = psql("SET ROLE sn_reader; BEGIN ISOLATION LEVEL REPEATABLE READ; "
                            "CALL rag_await('slow', '0'); COMMIT;", db=DB, check=False)
        self.assertNotEqual(code, 0)
        self.assertIn("needs a READ COMMITTED transaction", err)
        psql("DROP TABLE horizon; SELECT rag_drop_collection('slow')", db=DB)


if __name__ == "__main__":
    unittest.main()
