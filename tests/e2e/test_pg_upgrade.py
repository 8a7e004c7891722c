"""pg_upgrade carries a cluster that uses rag to a new data directory: its --check passes (no column of a type
pg_upgrade refuses; it refused the regconfig column rag had), the upgrade itself succeeds (rag starts no
launcher in binary-upgrade mode, which this test does not observe directly), and the new cluster answers
the same questions, grants the same reader, and keeps indexing its watched table. Old and new are
the same major version here (the only binaries a test machine has), which runs every step pg_upgrade runs
between two majors but the catalog conversion."""
import os
import shutil
import subprocess
import time
import unittest

from support import as_postgres, free_port, psql, scalar

PG_BIN = subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True).stdout.strip()
DB = "rag_e2e_pg_upgrade"


class PgUpgrade(unittest.TestCase):
    def setUp(self):
        self.dir = os.path.join(os.environ.get("WORK", "/tmp"), "pg_upgrade")
        shutil.rmtree(self.dir, ignore_errors=True)
        os.makedirs(self.dir)
        shutil.chown(self.dir, "postgres", "postgres")
        self.started = []

    def tearDown(self):
        for data in self.started:
            as_postgres(f"{PG_BIN}/pg_ctl", "-D", data, "-m", "immediate", "-w", "stop")
        shutil.rmtree(self.dir, ignore_errors=True)

    def make_cluster(self, name, port):
        data = os.path.join(self.dir, name)
        made = as_postgres(f"{PG_BIN}/initdb", "-D", data, "-U", "postgres", "--auth=trust", "--encoding=UTF8",
                           "--locale=C.UTF-8")
        self.assertEqual(made.returncode, 0, made.stderr)
        with open(os.path.join(data, "postgresql.conf"), "a") as conf:
            conf.write(f"\nlisten_addresses = '127.0.0.1'\nport = {port}\nunix_socket_directories = '{self.dir}'\n"
                       "shared_preload_libraries = 'rag'\nfsync = off\n"
                       f"rag.ollama_url = 'http://127.0.0.1:{os.environ['PROVIDER_PORT']}'\n"
                       "rag.naptime = '200ms'\nrag.launcher_naptime = '1s'\n")
        return data

    def start(self, data, name):
        started = as_postgres(f"{PG_BIN}/pg_ctl", "-D", data, "-l", os.path.join(self.dir, f"{name}.log"), "-w",
                              "-t", "60", "start")
        self.assertEqual(started.returncode, 0, started.stderr)
        self.started.append(data)

    def stop(self, data):
        stopped = as_postgres(f"{PG_BIN}/pg_ctl", "-D", data, "-w", "stop")
        self.assertEqual(stopped.returncode, 0, stopped.stderr)
        self.started.remove(data)

    def test_a_cluster_with_rag_is_upgraded(self):
        old_port, new_port = free_port(), free_port()
        old = self.make_cluster("old", old_port)
        self.start(old, "old")
        psql(f"CREATE DATABASE {DB}", db="postgres", port=old_port)
        psql("""
            CREATE EXTENSION rag CASCADE;
            DROP ROLE IF EXISTS rag_e2e_upgrade_reader;
            CREATE ROLE rag_e2e_upgrade_reader IN ROLE rag_reader;
            SELECT rag_create_collection('kb', embedding_model => 'hash-384', max_distance => 2);
            SELECT rag_ingest('kb', 'Notice', 'Staff must give thirty days notice in writing to their manager.');
            SELECT rag_ingest('kb', 'Canteen', 'Lunch is served from noon until two in the canteen.');
            SELECT rag_grant('kb', 'rag_e2e_upgrade_reader', 'read');
            CREATE TABLE pages (id int PRIMARY KEY, body text);
            INSERT INTO pages VALUES (1, 'Parking is free for staff.');
            SELECT rag_watch('pages', 'kb', content => 'body');
        """, db=DB, port=old_port)
        settled = ("SELECT (SELECT count(*) FROM rag.documents WHERE status = 'ready') = {n} "
                   "AND NOT EXISTS (SELECT 1 FROM rag.row_queue)")
        self.assertTrue(self.wait(settled.format(n=3), old_port), "the old cluster did not index its documents")
        question = "SELECT title FROM rag_query('kb', 'how much notice must staff give', 1)"
        answer = psql(question, db=DB, port=old_port)
        counts = "SELECT (SELECT count(*) FROM rag.documents), (SELECT count(*) FROM rag.chunks), " \
                 "(SELECT text_search_config FROM rag.collections WHERE name = 'kb')"
        before = psql(counts, db=DB, port=old_port)
        self.stop(old)

        new = self.make_cluster("new", new_port)
        for check in (["--check"], []):
            upgraded = subprocess.run(
                ["runuser", "-u", "postgres", "--", f"{PG_BIN}/pg_upgrade", "-b", PG_BIN, "-B", PG_BIN,
                 "-d", old, "-D", new, "-p", str(old_port), "-P", str(new_port), "-s", self.dir, *check],
                cwd=self.dir, capture_output=True, text=True, timeout=600)
            self.assertEqual(upgraded.returncode, 0, upgraded.stdout[-3000:] + upgraded.stderr)

        self.start(new, "new")
        self.assertEqual(psql(counts, db=DB, port=new_port), before)
        self.assertEqual(psql(question, db=DB, port=new_port), answer)
        self.assertEqual(scalar("SET ROLE rag_e2e_upgrade_reader; SELECT count(*) > 0 FROM rag_query('kb', 'lunch');",
                                db=DB, port=new_port), "t")
        # The new cluster's worker indexes what its watched table gets next.
        psql("INSERT INTO pages VALUES (2, 'Visitors sign in at the front desk.')", db=DB, port=new_port)
        self.assertTrue(self.wait(settled.format(n=4), new_port), "the upgraded cluster's watch did not index")
        self.assertEqual(scalar("SELECT source_key->>'id' FROM rag_query('kb', 'where do visitors sign in', 1)",
                                db=DB, port=new_port), "2")

    def wait(self, sql, port, seconds=60):
        deadline = time.time() + seconds
        while time.time() < deadline:
            code, rows, _ = psql(sql, db=DB, port=port, check=False)
            if code == 0 and rows and rows[0][0] == "t":
                return True
            time.sleep(0.2)
        return False


if __name__ == "__main__":
    unittest.main()
