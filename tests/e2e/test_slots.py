"""Worker slots shared between databases: a bulk load's extra worker (rag.bulk_load_workers) gives its slot up
to a database that waits for its one worker, instead of keeping it until the load is worked off. A cluster of
its own with rag.max_workers = 2, so that the load can hold every slot and no other database's idle worker can
make room instead."""
import os
import shutil
import subprocess
import time
import unittest

from support import as_postgres, free_port, psql, scalar, wait_until

PG_BIN = subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True).stdout.strip()
LOADING = "rag_e2e_slots_loading"
WAITING = "rag_e2e_slots_waiting"
THIRD = "rag_e2e_slots_third"


class Slots(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = os.path.join(os.environ.get("WORK", "/tmp"), "slots")
        shutil.rmtree(cls.dir, ignore_errors=True)
        os.makedirs(cls.dir)
        shutil.chown(cls.dir, "postgres", "postgres")
        cls.data = os.path.join(cls.dir, "data")
        made = as_postgres(f"{PG_BIN}/initdb", "-D", cls.data, "-U", "postgres", "--auth=trust", "--encoding=UTF8",
                           "--locale=C.UTF-8")
        assert made.returncode == 0, made.stderr
        cls.port = free_port()
        # One text per provider call and a provider that takes 210 ms a call: the load below lasts minutes
        # with its two workers, so only a worker giving way serves the second database within the test's wait.
        with open(os.path.join(cls.data, "postgresql.conf"), "a") as conf:
            conf.write(f"\nlisten_addresses = '127.0.0.1'\nport = {cls.port}\nunix_socket_directories = '{cls.dir}'\n"
                       "shared_preload_libraries = 'rag'\nmax_worker_processes = 16\n"
                       f"rag.ollama_url = 'http://127.0.0.1:{os.environ['PROVIDER_PORT']}'\n"
                       "rag.naptime = '200ms'\nrag.launcher_naptime = '2s'\n"
                       "rag.max_workers = 2\nrag.workers_per_database = 1\nrag.bulk_load_workers = 2\n"
                       "rag.batch_size = 1\n")
        started = as_postgres("env", "RUST_BACKTRACE=1", f"{PG_BIN}/pg_ctl", "-D", cls.data, "-l",
                              os.path.join(cls.dir, "server.log"), "-w", "-t", "60", "start")
        assert started.returncode == 0, started.stderr

    @classmethod
    def tearDownClass(cls):
        as_postgres(f"{PG_BIN}/pg_ctl", "-D", cls.data, "-m", "immediate", "-w", "stop")
        shutil.rmtree(cls.dir, ignore_errors=True)

    def sql(self, text, db):
        return psql(text, db=db, port=self.port)

    def value(self, text, db):
        return scalar(text, db=db, port=self.port)

    def workers(self, db):
        return (f"SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'rag worker' AND datname = '{db}'")

    def test_a_bulk_loads_extra_worker_gives_way_to_a_database_waiting_for_one(self):
        self.sql(f"CREATE DATABASE {LOADING}", db="postgres")
        self.sql("CREATE EXTENSION rag CASCADE", db=LOADING)
        self.sql("SELECT rag_create_collection('load', embedding_model => 'hash-384@slow210')", db=LOADING)
        self.sql("SELECT count(rag_ingest('load', 'Note ' || g, 'Loaded note ' || g || '.')) "
                 "FROM generate_series(1, 1000) g", db=LOADING)
        all_workers = "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'rag worker'"
        self.assertTrue(wait_until(f"SELECT ({self.workers(LOADING)}) = 2 AND ({all_workers}) = 2", db=LOADING,
                                   port=self.port, seconds=60),
                        "the load did not get its extra worker in both slots")

        self.sql(f"CREATE DATABASE {WAITING}", db="postgres")
        self.sql("CREATE EXTENSION rag CASCADE", db=WAITING)
        self.sql("SELECT rag_create_collection('small', embedding_model => 'hash-384')", db=WAITING)
        self.sql("SELECT rag_ingest('small', 'One', 'The one document of a database that waits for a slot.')",
                 db=WAITING)
        self.assertEqual(self.value("SELECT rag_wait('small', '30 seconds')", db=WAITING), "t",
                         "the database waiting for a slot was not served while the load went on")
        # Served while the load was still under way: the extra worker left, the load did not end first.
        unfinished = int(self.value("SELECT count(*) FROM rag.documents WHERE status <> 'ready'", db=LOADING))
        self.assertGreater(unfinished, 0, "the load had ended: this shows nothing about giving way")
        self.assertEqual(self.value(self.workers(LOADING), db=LOADING), "1")
        with open(os.path.join(self.dir, "server.log"), encoding="utf-8", errors="replace") as log:
            self.assertIn("a bulk load's extra worker leaves its slot to a database waiting for one", log.read())
        # The load goes on with its standing worker; nothing of it is lost.
        self.assertEqual(self.value("SELECT count(*) FROM rag.documents WHERE status = 'failed'", db=LOADING), "0")
        self.assertTrue(wait_until(f"SELECT count(*) < {unfinished} FROM rag.documents WHERE status <> 'ready'",
                                   db=LOADING, port=self.port, seconds=30), "the load stopped")

    def test_b_create_extension_if_not_exists_does_not_wake_a_dormant_database(self):
        # A third database takes the waiting one's slot (its worker, idle, makes room): the waiting database is
        # dormant, without a worker, until work is queued there. Not within 10 s of that database's last request
        # (test_a's): the launcher then takes the worker's leaving for a race with new work and starts it again.
        time.sleep(11)
        self.sql(f"CREATE DATABASE {THIRD}", db="postgres")
        self.sql("CREATE EXTENSION rag CASCADE", db=THIRD)
        self.sql("SELECT rag_create_collection('third', embedding_model => 'hash-384'); "
                 "SELECT rag_ingest('third', 'One', 'The one document of a third database.')", db=THIRD)
        self.assertEqual(self.value("SELECT rag_wait('third', '60 seconds')", db=THIRD), "t")
        self.assertTrue(wait_until(f"SELECT ({self.workers(WAITING)}) = 0", db="postgres", port=self.port, seconds=30),
                        "the waiting database's idle worker did not make room")
        # No worker of the dormant database shows, looked at every 50 ms for as long (a worker that starts
        # and leaves again within a launcher round is seen too).
        no_worker_for = ("DO $$ BEGIN FOR i IN 1..{} LOOP PERFORM pg_stat_clear_snapshot(); "
                         "IF EXISTS (SELECT 1 FROM pg_stat_activity WHERE backend_type = 'rag worker' "
                         f"AND datname = '{WAITING}') THEN RAISE EXCEPTION 'a worker of the dormant database'; "
                         "END IF; PERFORM pg_sleep(0.05); END LOOP; END $$")
        self.sql(no_worker_for.format(60), db="postgres")
        # Any role that may connect runs CREATE EXTENSION IF NOT EXISTS (PostgreSQL skips it before checking a
        # privilege): it woke the launcher, which took a slot back for the dormant database (red team 18).
        self.sql("DROP ROLE IF EXISTS rag_e2e_passerby; CREATE ROLE rag_e2e_passerby LOGIN", db="postgres")
        self.assertEqual(psql("CREATE EXTENSION IF NOT EXISTS rag CASCADE; SELECT 'skipped'", db=WAITING,
                              port=self.port, user="rag_e2e_passerby"), [["skipped"]])
        code, _, err = psql(no_worker_for.format(120), db="postgres", port=self.port, check=False)
        self.assertEqual(code, 0, f"a skipped CREATE EXTENSION started a worker for the dormant database: {err}")
        # Work queued there still brings its worker back.
        self.sql("SELECT rag_ingest('small', 'Two', 'A second document of the dormant database.')", db=WAITING)
        self.assertEqual(self.value("SELECT rag_wait('small', '60 seconds')", db=WAITING), "t")


if __name__ == "__main__":
    unittest.main()
