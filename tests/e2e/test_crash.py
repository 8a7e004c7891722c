"""Crash safety: `pg_ctl stop -m immediate` (no shutdown checkpoint, every process killed) in the middle of an
ingestion, a burst of writes to a watched table and a model migration, then a start: nothing is lost, no chunk
is duplicated, counters are exact and every document ends ready. A cluster of its own, so the others go on."""
import os
import shutil
import subprocess
import unittest

from support import as_postgres, free_port, psql, scalar, wait_until

PG_BIN = subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True).stdout.strip()
DB = "rag_e2e_crash"


class Crash(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = os.path.join(os.environ.get("WORK", "/tmp"), "crash")
        shutil.rmtree(cls.dir, ignore_errors=True)
        os.makedirs(cls.dir)
        shutil.chown(cls.dir, "postgres", "postgres")
        cls.data = os.path.join(cls.dir, "data")
        made = as_postgres(f"{PG_BIN}/initdb", "-D", cls.data, "-U", "postgres", "--auth=trust", "--encoding=UTF8",
                           "--locale=C.UTF-8")
        assert made.returncode == 0, made.stderr
        cls.port = free_port()
        with open(os.path.join(cls.data, "postgresql.conf"), "a") as conf:
            conf.write(f"\nlisten_addresses = '127.0.0.1'\nport = {cls.port}\nunix_socket_directories = '{cls.dir}'\n"
                       "shared_preload_libraries = 'rag'\nmax_worker_processes = 16\n"
                       f"rag.ollama_url = 'http://127.0.0.1:{os.environ['PROVIDER_PORT']}'\n"
                       "rag.naptime = '200ms'\nrag.launcher_naptime = '2s'\n")
        cls.start()
        psql(f"CREATE DATABASE {DB}", db="postgres", port=cls.port)
        psql("CREATE EXTENSION rag CASCADE", db=DB, port=cls.port)

    @classmethod
    def start(cls):
        started = as_postgres("env", "RUST_BACKTRACE=1", f"{PG_BIN}/pg_ctl", "-D", cls.data, "-l",
                              os.path.join(cls.dir, "server.log"), "-w", "-t", "60", "start")
        assert started.returncode == 0, started.stderr

    @classmethod
    def tearDownClass(cls):
        as_postgres(f"{PG_BIN}/pg_ctl", "-D", cls.data, "-m", "immediate", "-w", "stop")
        shutil.rmtree(cls.dir, ignore_errors=True)

    def sql(self, text):
        return psql(text, db=DB, port=self.port)

    def value(self, text):
        return scalar(text, db=DB, port=self.port)

    def crash_and_restart(self):
        stopped = as_postgres(f"{PG_BIN}/pg_ctl", "-D", self.data, "-m", "immediate", "-w", "stop")
        self.assertEqual(stopped.returncode, 0, stopped.stderr)
        self.start()

    def assert_consistent(self, collection, documents):
        self.assertTrue(wait_until(f"SELECT NOT EXISTS (SELECT 1 FROM rag.documents d JOIN rag.collections c "
                                   f"ON c.id = d.collection_id WHERE c.name = '{collection}' AND d.status <> 'ready') "
                                   "AND NOT EXISTS (SELECT 1 FROM rag.queue) AND NOT EXISTS (SELECT 1 FROM rag.row_queue)",
                                   db=DB, port=self.port, seconds=120), f"{collection} did not finish after the crash")
        # The searched vector column: a model change switches a collection from one to the other.
        searched = "CASE c.vector_column WHEN 'embedding' THEN ch.embedding ELSE ch.embedding_alt END"
        row = self.sql(f"""
            SELECT count(*),
                   count(*) FILTER (WHERE d.chunks_total = (SELECT count(*) FROM rag.chunks ch WHERE ch.document_id = d.id)
                                      AND d.chunks_embedded = (SELECT count(*) FROM rag.chunks ch
                                                                WHERE ch.document_id = d.id AND {searched} IS NOT NULL)
                                      AND d.chunks_total = d.chunks_embedded AND d.chunks_total > 0),
                   (SELECT count(*) FROM rag.chunks ch JOIN rag.documents dd ON dd.id = ch.document_id
                     WHERE dd.collection_id = c.id AND {searched} IS NULL)
              FROM rag.documents d JOIN rag.collections c ON c.id = d.collection_id
             WHERE c.name = '{collection}' GROUP BY c.id""")[0]
        self.assertEqual(int(row[0]), documents, "documents lost or duplicated")
        self.assertEqual(int(row[1]), documents, "a document's counters do not match its chunks")
        self.assertEqual(int(row[2]), 0, "a chunk has no vector")

    def test_crash_during_ingestion(self):
        self.sql("SELECT rag_create_collection('ingest', embedding_model => 'hash-384@slow100', chunk_size => 100, "
                 "chunk_overlap => 0)")
        self.sql("BEGIN;" + "".join(
            f"SELECT rag_ingest('ingest', 'Document {n}', repeat('Sentence {n} of a document about crashes. ', 25));"
            for n in range(30)) + "COMMIT;")
        self.assertTrue(wait_until("SELECT sum(chunks_embedded) > 0 FROM rag.documents", db=DB, port=self.port))
        self.assertEqual(self.value("SELECT bool_or(status = 'processing') FROM rag.documents"), "t")
        self.crash_and_restart()
        self.assert_consistent("ingest", 30)

    def test_crash_during_a_watch_burst(self):
        self.sql("""
            SELECT rag_create_collection('watched', embedding_model => 'hash-384@slow100');
            CREATE TABLE notes (id int PRIMARY KEY, body text);
            SELECT rag_watch('notes', 'watched', content => 'body');
        """)
        for start in range(0, 600, 100):
            self.sql(f"INSERT INTO notes SELECT g, 'Note ' || g || ' about the crash test.' "
                     f"FROM generate_series({start + 1}, {start + 100}) g")
        self.sql("UPDATE notes SET body = body || ' Edited.' WHERE id % 3 = 0")
        self.assertTrue(wait_until("SELECT count(*) > 0 FROM rag.documents d JOIN rag.collections c ON "
                                   "c.id = d.collection_id WHERE c.name = 'watched'", db=DB, port=self.port))
        self.assertEqual(self.value("SELECT EXISTS (SELECT 1 FROM rag.row_queue) OR EXISTS (SELECT 1 FROM rag.row_batches) "
                                    "OR EXISTS (SELECT 1 FROM rag.queue)"), "t", "the burst was over before the crash")
        self.crash_and_restart()
        self.assert_consistent("watched", 600)
        self.assertEqual(self.value("SELECT count(*) FROM rag.documents WHERE source = 'notes' AND body LIKE '% Edited.'"),
                         "200", "an edit made before the crash was lost")

    def test_crash_during_a_model_migration(self):
        self.sql("SELECT rag_create_collection('migrate', embedding_model => 'hash-384', chunk_size => 100, "
                 "chunk_overlap => 0)")
        self.sql("".join(f"SELECT rag_ingest('migrate', 'Doc {n}', repeat('Migration sentence {n}. ', 30));"
                         for n in range(20)))
        self.assertTrue(wait_until("SELECT rag_wait('migrate', '1 second')", db=DB, port=self.port))
        self.sql("SELECT rag_set_embedding_model('migrate', 'hash-768@slow100')")
        # The crash comes while the new space is half filled: queries still use the old one.
        self.assertTrue(wait_until("SELECT count(ch.embedding_alt) > 0 FROM rag.chunks ch JOIN rag.collections c "
                                   "ON c.id = ch.collection_id WHERE c.name = 'migrate'", db=DB, port=self.port))
        self.assertEqual(self.value("SELECT migration_state || '|' || dimensions FROM rag.status WHERE collection = 'migrate'"),
                         "embedding|384", "the migration was over before the crash")
        self.crash_and_restart()
        self.assertTrue(wait_until("SELECT NOT EXISTS (SELECT 1 FROM rag.migrations)", db=DB, port=self.port, seconds=120),
                        "the model change did not finish after the crash")
        self.assert_consistent("migrate", 20)
        self.assertEqual(self.value("SELECT dimensions || '|' || vector_column FROM rag.collections WHERE name = 'migrate'"),
                         "768|embedding_alt")
        self.assertEqual(self.value("SELECT count(*) FILTER (WHERE vector_dims(ch.embedding_alt) IS DISTINCT FROM 768) || '|' "
                                    "|| count(ch.embedding) FROM rag.chunks ch JOIN rag.collections c ON c.id = ch.collection_id "
                                    "WHERE c.name = 'migrate'"), "0|0",
                         "vectors of two models are mixed, or the old space was not cleared")


if __name__ == "__main__":
    unittest.main()
