"""End-to-end scenarios against the real cluster that scripts/test started (extension preloaded, worker
running, provider test server answering)."""
import os
import signal
import subprocess
import threading
import time
import unittest
from functools import partial

from support import (background_psql, drop_database, fresh_database, provider_calls, psql, scalar,
                     wait_for_server, wait_until)
from support import read_line

DB = "rag_e2e"


def twenty_megabytes():
    sentence = "Large documents are chunked and embedded without exhausting memory. "
    paragraph = sentence * 40
    # Paragraphs joined by COPY's escaped newlines: the whole text is one row.
    body = "\\n\\n".join([paragraph] * (20 * 1024 * 1024 // (len(paragraph) + 2)))
    assert len(body) > 19 * 1024 * 1024
    return body


def ingest_copied(collection, body, db=DB):
    """rag_ingest of a text too large for a command line, sent through COPY."""
    psql("CREATE TEMP TABLE incoming (body text);\nCOPY incoming FROM STDIN;\n" + body + "\n\\.\n"
         f"SELECT rag_ingest('{collection}', 'Big', body) FROM incoming;\n", db=db)


class WorkerMemory:
    """A database's workers' own memory (RssAnon: what each allocates, not the shared buffers it touches nor the
    library and model files it maps), sampled every 10 ms while the block runs; the peak of any of them. A worker
    that goes away meanwhile fails the measurement rather than leaving it unmeasured."""

    def __init__(self, db=DB):
        self.db = db

    def __enter__(self):
        serving = f"SELECT pid FROM pg_stat_activity WHERE backend_type = 'rag worker' AND datname = '{self.db}'"
        assert wait_until(f"SELECT EXISTS ({serving})", db="postgres", seconds=60), f"no worker serves {self.db}"
        self.pids = [row[0] for row in psql(serving, db="postgres")]
        self.peak = {"RssAnon": 0, "VmRSS": 0}
        self.failure = None
        self.stopping = threading.Event()
        self.sampler = threading.Thread(target=self._sample)
        self.sampler.start()
        return self

    def _read(self, pid):
        with open(f"/proc/{pid}/status") as status:
            return {line.split(":")[0]: line.split(":")[1].strip() for line in status}

    def _sample(self):
        try:
            while not self.stopping.is_set():
                for pid in self.pids:
                    fields = self._read(pid)
                    for key in self.peak:
                        self.peak[key] = max(self.peak[key], int(fields[key].split()[0]))
                time.sleep(0.01)
        except OSError as error:
            self.failure = f"a worker went away while it was measured: {error}"

    def __exit__(self, *_exc):
        self.stopping.set()
        self.sampler.join()
        if self.failure:
            raise AssertionError(self.failure)
        self.high_water = ", ".join(self._read(pid)["VmHWM"] for pid in self.pids)
        return False

    def report(self):
        return (f"peak RssAnon {self.peak['RssAnon'] // 1024} MB, peak VmRSS {self.peak['VmRSS'] // 1024} MB; "
                f"VmHWM {self.high_water}")


class Pipeline(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        fresh_database(DB)

    def test_a_ingest_returns_before_any_provider_call(self):
        model = "hash-384@slow50"
        psql(f"SELECT rag_create_collection('early', embedding_model => '{model}')")
        before = provider_calls(model)
        # While the ingesting transaction is open, the document is invisible to the worker: if anything was
        # embedded, ingest itself called the provider.
        psql(f"""
            BEGIN;
            SELECT rag_ingest('early', 'Doc', 'Ingest must not wait for the embedding provider.');
            SELECT pg_sleep(0.5);
            SELECT '{model}';
            COMMIT;""")
        self.assertEqual(provider_calls(model), before)
        self.assertEqual(scalar("SELECT rag_wait('early', '30 seconds')"), "t")
        self.assertEqual(provider_calls(model)[0], before[0] + 1)

    def test_b_dedup_costs_no_provider_call(self):
        model = "hash-384@slow1"
        psql(f"SELECT rag_create_collection('dedup', embedding_model => '{model}')")
        text = "Identical text is stored once and embedded once. " * 5
        first = scalar(f"SELECT rag_ingest('dedup', 'One', '{text}')")
        self.assertEqual(scalar("SELECT rag_wait('dedup', '30 seconds')"), "t")
        calls = provider_calls(model)
        second = scalar(f"SELECT rag_ingest('dedup', 'Two', '{text}')")
        time.sleep(1.0)
        self.assertEqual(first, second)
        self.assertEqual(provider_calls(model), calls)
        self.assertEqual(scalar("SELECT count(*) FROM rag.documents d JOIN rag.collections c ON c.id = d.collection_id WHERE c.name = 'dedup'"), "1")

    def test_c_new_database_is_served_without_restart(self):
        fresh_database("rag_e2e_later")
        psql("SELECT rag_create_collection('later', embedding_model => 'hash-384')", db="rag_e2e_later")
        psql("SELECT rag_ingest('later', 'Doc', 'A database created after the server started.')", db="rag_e2e_later")
        self.assertEqual(scalar("SELECT rag_wait('later', '30 seconds')", db="rag_e2e_later"), "t")
        self.assertEqual(scalar("SELECT status FROM rag.documents", db="rag_e2e_later"), "ready")
        workers = psql("SELECT datname FROM pg_stat_activity WHERE backend_type = 'rag worker' ORDER BY 1", db="postgres")
        self.assertIn(["rag_e2e_later"], workers)
        psql("DROP DATABASE rag_e2e_later WITH (FORCE)", db="postgres")

    def test_c2_autovacuum_sees_what_the_worker_writes(self):
        # A background worker hands its statistics to the shared ones itself, or they arrive only when it exits:
        # autovacuum and autoanalyze would never see the worker's inserts, updates and deletes while it lives.
        psql("SELECT rag_create_collection('counted', embedding_model => 'hash-384')")
        psql("SELECT rag_ingest('counted', 'Doc ' || i, 'Counted document number ' || i || '.') "
             "FROM generate_series(1, 20) i")
        self.assertEqual(scalar("SELECT rag_wait('counted', '30 seconds')"), "t")
        pid = scalar(f"SELECT pid FROM pg_stat_activity WHERE backend_type = 'rag worker' AND datname = '{DB}'",
                     db="postgres")
        partition = scalar("SELECT rag._chunk_partition(id) FROM rag.collections WHERE name = 'counted'")
        self.assertTrue(wait_until(f"SELECT n_tup_ins >= 20 FROM pg_stat_all_tables WHERE relid = 'rag.{partition}'::regclass",
                                   seconds=15),
                        psql(f"SELECT n_tup_ins, n_live_tup FROM pg_stat_all_tables WHERE relid = 'rag.{partition}'::regclass"))
        # The worker's updates of the documents it made ready are counted too.
        self.assertTrue(wait_until("SELECT n_tup_upd > 0 FROM pg_stat_all_tables WHERE relid = 'rag.documents'::regclass",
                                   seconds=15))
        self.assertEqual(scalar(f"SELECT pid FROM pg_stat_activity WHERE backend_type = 'rag worker' AND datname = '{DB}'",
                                db="postgres"), pid, "the counts came from a worker that exited")

    def test_d_twenty_megabyte_text(self):
        psql("SELECT rag_create_collection('big', embedding_model => 'hash-384', chunk_size => 10000, chunk_overlap => 0)")
        body = twenty_megabytes()
        with WorkerMemory() as memory:
            ingest_copied('big', body)
            self.assertEqual(scalar("SELECT rag_wait('big', '180 seconds')"), "t")
        row = psql("SELECT status, chunks_total, chunks_embedded, octet_length(body) FROM rag.documents d "
                   "JOIN rag.collections c ON c.id = d.collection_id WHERE c.name = 'big'")[0]
        self.assertEqual(row[0], "ready")
        self.assertEqual(row[1], row[2])
        self.assertGreater(int(row[1]), 2000)
        self.assertGreater(int(row[3]), 19 * 1024 * 1024)
        print(f"\n  worker during the 20 MB document: {memory.report()}", end=" ")
        # The text itself is 20 MB; its chunks are made and stored 1 MB at a time. Storing them in one call
        # took 162 MB.
        self.assertLess(memory.peak["RssAnon"], 64 * 1024, "the worker held the document's chunks all at once")

    def test_da_an_ingesting_backend_holds_a_large_text_a_few_times(self):
        # rag_ingest's emptiness check was btrim, which in a UTF-8 database allocates twelve bytes of pointers per
        # byte of text: a 64 MB document took the ingesting backend to 909 MB. Measured as the high-water mark of
        # a backend that reads the text from a table and ingests it, against the same backend's before.
        psql("SELECT rag_create_collection('held', embedding_model => 'hash-384', chunk_size => 10000, chunk_overlap => 0)")
        psql("CREATE TABLE held_text (body text);\nCOPY held_text FROM STDIN;\n" + twenty_megabytes() + "\n\\.\n")
        high_water = "(regexp_match(pg_read_file('/proc/self/status'), 'VmHWM:\\s+(\\d+)'))[1]::bigint"
        rows = psql(f"SELECT {high_water};\n"
                    f"SELECT rag_ingest('held', 'Big', body) IS NOT NULL, octet_length(body), {high_water} FROM held_text;\n")
        before, size, after = int(rows[0][0]), int(rows[1][1]), int(rows[1][2])
        self.assertEqual(rows[1][0], "t")
        grown = (after - before) * 1024
        print(f"\n  ingesting backend grew {grown >> 20} MB for a {size >> 20} MB text", end=" ")
        # Read from the table, checked, hashed, compressed and written: a few copies, not the twelve-fold btrim.
        self.assertLess(grown, 6 * size, "rag_ingest held the text many times over")
        self.assertEqual(scalar("SELECT rag_wait('held', '180 seconds')"), "t")

    def test_db_a_worker_reads_a_large_watched_row_without_copies_of_it(self):
        psql("""
            CREATE TABLE large_rows (id int PRIMARY KEY, body text);
            SELECT rag_create_collection('large_rows', embedding_model => 'hash-384', chunk_size => 10000,
                                         chunk_overlap => 0);
            SELECT rag_watch('large_rows', 'large_rows', content => 'body');
        """)
        body = twenty_megabytes()
        with WorkerMemory() as memory:
            psql("CREATE TEMP TABLE incoming (body text);\nCOPY incoming FROM STDIN;\n" + body + "\n\\.\n"
                 "INSERT INTO large_rows SELECT 1, body FROM incoming;\n")
            self.assertEqual(scalar("SELECT rag_wait('large_rows', '180 seconds')"), "t")
        print(f"\n  worker during a 20 MB watched row: {memory.report()}", end=" ")
        self.assertEqual(scalar("SELECT status FROM rag.documents d JOIN rag.collections c ON c.id = d.collection_id "
                                "WHERE c.name = 'large_rows'"), "ready")
        # The row's text passes through the owner's query, its JSON and the document; its new document is then
        # chunked as an ingested one is, a batch at a time. Handed back to the worker and chunked all at once it
        # took 176 MB; btrim's pointers had added twelve bytes a byte (240 MB), the JSON's round trip more.
        # 77 to 87 MB in release builds (issue 15 asks under 100 MB).
        self.assertLess(memory.peak["RssAnon"], 110 * 1024, "the worker held the watched row many times over")
        # A changed row's old chunks are set aside (their vectors kept for unchanged text) and the new ones stored
        # a batch at a time too; the text is read back from the document rather than handed back by the sync.
        with WorkerMemory() as changed:
            psql("UPDATE large_rows SET body = 'Changed first. ' || body")
            self.assertEqual(scalar("SELECT rag_wait('large_rows', '180 seconds')"), "t")
        print(f"\n  worker during its update: {changed.report()}", end=" ")
        # 87 to 88 MB in release builds (session 36); 97 to 101 MB before the worker mapped its large blocks on
        # their own (serve.rs, return_large_blocks_to_the_system), 176 MB when every chunk was stored in one call
        # beside the sync's reply.
        self.assertLess(changed.peak["RssAnon"], 110 * 1024, "the worker held the changed row many times over")
        # (test_watch's test_editing_one_paragraph_embeds_only_what_changed shows the vectors kept on this path.)
        self.assertEqual(scalar("SELECT status = 'ready' AND chunks_total = chunks_embedded FROM rag.documents d "
                                "JOIN rag.collections c ON c.id = d.collection_id WHERE c.name = 'large_rows'"), "t")
        self.assertEqual(scalar("SELECT body LIKE 'Changed first. %' FROM rag.documents d "
                                "JOIN rag.collections c ON c.id = d.collection_id WHERE c.name = 'large_rows'"), "t")

    def test_d_twenty_megabyte_text_on_the_local_model(self):
        # In process, every chunk is measured with the model's tokenizer before it is stored, and embedding runs
        # in the worker too. Measured up to the first embedded batches (the whole document takes minutes), in a
        # database of its own: a fresh worker, whose memory is this document's alone.
        db = "rag_e2e_local_memory"
        fresh_database(db)
        try:
            psql("SELECT rag_create_collection('big-local', embedding_provider => 'local')", db=db)
            body = twenty_megabytes()
            with WorkerMemory(db) as memory:
                ingest_copied("big-local", body, db=db)
                # The document's chunks are made, measured and stored in one transaction: they show all at once.
                self.assertTrue(wait_until("SELECT chunks_total > 0 FROM rag.documents", db=db, seconds=240),
                                "the document was not chunked in 240 s")
                chunking = memory.peak["RssAnon"]
                embedded = "SELECT coalesce(sum(chunks_embedded), 0) >= 64 FROM rag.documents"
                self.assertTrue(wait_until(embedded, db=db, seconds=240), "the local model embedded nothing in 240 s")
            chunks = int(scalar("SELECT chunks_total FROM rag.documents", db=db))
        finally:
            drop_database(db)
        self.assertGreater(chunks, 20000)
        print(f"\n  worker during the 20 MB document on the local model ({chunks} chunks): chunking: peak RssAnon "
              f"{chunking // 1024} MB; then embedding: {memory.report()}", end=" ")
        # Holding every chunk's text while the tokenizer measured them took 84 MB; bounds alone, 49 MB while
        # chunking (four runs alike). Embedding then adds the model's activations for a batch, 61 to 75 MB in all
        # across runs (how much of them the sampler catches varies), within issue 15's 100 MB.
        self.assertLess(chunking, 65 * 1024, "the worker held the document's chunks all at once")
        self.assertLess(memory.peak["RssAnon"], 100 * 1024, "the worker took more than 100 MB of its own")

    def test_e_refusal_by_distance_makes_no_chat_call(self):
        chat = "chat-test@slow2"
        psql(f"SELECT rag_create_collection('refuse', embedding_model => 'hash-384', chat_model => '{chat}', max_distance => 0.5)")
        psql("SELECT rag_ingest('refuse', 'Handbook', 'All staff must give thirty days notice before resigning.')")
        self.assertEqual(scalar("SELECT rag_wait('refuse', '30 seconds')"), "t")
        row = psql("SELECT outcome, reason FROM rag_ask('refuse', 'Who won the football last night?')")[0]
        self.assertEqual(row[0], "refused")
        self.assertEqual(provider_calls(chat)[0], 0)
        answered = psql("SELECT outcome FROM rag_ask('refuse', 'How much notice must staff give before resigning?')")[0][0]
        self.assertEqual(answered, "answered")
        self.assertEqual(provider_calls(chat)[0], 1)

    def test_f_first_load_is_indexed_once_at_the_end(self):
        # A slow provider stretches the load so its middle can be looked at; 32 documents share each call.
        model = "hash-384@slow250"
        psql(f"SELECT rag_create_collection('bulk', embedding_model => '{model}')")
        calls_before = provider_calls(model)[0]
        psql("BEGIN;"
             + "".join(f"SELECT rag_ingest('bulk', 'Note {i}', 'Bulk note {i} about topic {i % 17}. It has one more sentence.');"
                       for i in range(600))
             + "COMMIT;")
        collection = "(SELECT id FROM rag.collections WHERE name = 'bulk')"
        self.assertTrue(wait_until(f"SELECT count(*) > 0 FROM rag.documents WHERE collection_id = {collection} AND status = 'ready'"))
        # Mid-load: vectors are stored, the collection is searched exactly, and there is no HNSW index to keep up.
        self.assertEqual(psql(f"SELECT dimensions, index_name IS NULL FROM rag.collections WHERE id = {collection}"),
                         [["384", "t"]])
        self.assertEqual(scalar(f"SELECT count(*) FROM pg_indexes WHERE schemaname = 'rag' AND indexdef LIKE '%hnsw%' AND tablename = rag._chunk_partition({collection})"), "0")
        self.assertLess(int(scalar(f"SELECT count(*) FROM rag.documents WHERE collection_id = {collection} AND status = 'ready'")), 600)
        explain = "\n".join(row[0] for row in psql("SELECT * FROM rag_explain('bulk', 'bulk note topic')"))
        self.assertIn("exact search", explain)
        self.assertEqual(scalar("SELECT count(*) FROM rag_query('bulk', 'bulk note about topic 3', k => 5, max_distance => 2)"), "5")
        self.assertEqual(scalar("SELECT rag_wait('bulk', '120 seconds')"), "t")
        # The end of the load built the index once, right after its last documents were ready (test_g2); every
        # document is ready with exact counts.
        self.assertTrue(wait_until(f"SELECT index_name IS NOT NULL FROM rag.collections WHERE id = {collection}"))
        index = scalar(f"SELECT index_name FROM rag.collections WHERE id = {collection}")
        self.assertTrue(index)
        self.assertEqual(scalar(f"SELECT to_regclass('rag.{index}') IS NOT NULL"), "t")
        self.assertEqual(psql(f"SELECT count(*), sum(chunks_total), sum(chunks_embedded) FROM rag.documents WHERE collection_id = {collection} AND status = 'ready'"),
                         [["600", "600", "600"]])
        self.assertEqual(scalar(f"SELECT count(*) FROM rag.chunks WHERE collection_id = {collection} AND embedding IS NULL"), "0")
        # At 600 chunks the planner may rather read the collection's partition whole than walk its index.
        explain = "\n".join(row[0] for row in psql("SET enable_seqscan = off; SELECT * FROM rag_explain('bulk', 'bulk note topic')"))
        self.assertIn(index, explain)
        self.assertNotIn("exact search", explain)
        # Small new documents share provider calls: 600 documents took a few dozen calls, not 600.
        self.assertLess(provider_calls(model)[0] - calls_before, 60)

    def test_g_large_load_into_a_small_collection_rebuilds_its_index(self):
        model = "hash-384@slow200"
        psql(f"SELECT rag_create_collection('grow', embedding_model => '{model}')")
        psql("SELECT rag_ingest('grow', 'Seed ' || g, 'Seed document ' || g || ' of a small collection.') FROM generate_series(1, 3) g")
        self.assertEqual(scalar("SELECT rag_wait('grow', '60 seconds')"), "t")
        collection = "(SELECT id FROM rag.collections WHERE name = 'grow')"
        index = scalar(f"SELECT index_name FROM rag.collections WHERE id = {collection}")
        self.assertTrue(index)
        psql("SELECT rag_ingest('grow', 'More ' || g, 'Another document ' || g || ' loaded in bulk.') FROM generate_series(1, 600) g")
        # Far more waiting than indexed: the first batch drops the index; searches go on exactly.
        self.assertTrue(wait_until(f"SELECT index_name IS NULL FROM rag.collections WHERE id = {collection}", seconds=60))
        self.assertEqual(scalar(f"SELECT to_regclass('rag.{index}') IS NULL"), "t")
        self.assertEqual(scalar("SELECT count(*) FROM rag_query('grow', 'seed document', k => 3, max_distance => 2)"), "3")
        self.assertEqual(scalar("SELECT rag_wait('grow', '120 seconds')"), "t")
        self.assertTrue(wait_until(f"SELECT to_regclass('rag.' || index_name) IS NOT NULL FROM rag.collections WHERE id = {collection}"))
        self.assertEqual(scalar(f"SELECT count(*) FROM rag.documents WHERE collection_id = {collection} AND status = 'ready'"), "603")

    def test_g2_a_bulk_loads_documents_are_ready_before_its_index_is_built(self):
        # A session that has written to rag.chunks (here: holds the lock such a write takes) keeps CREATE INDEX
        # from starting, not the stores. The load's documents must all be ready meanwhile, searched exactly:
        # the build comes after them, in a transaction of its own, and gives up waiting after a second.
        psql("SELECT rag_create_collection('ready-first', embedding_model => 'hash-384')")
        collection = "(SELECT id FROM rag.collections WHERE name = 'ready-first')"
        holder = background_psql("BEGIN; LOCK TABLE rag.chunks IN ROW EXCLUSIVE MODE; SELECT 'held';")
        try:
            self.assertEqual(read_line(holder).strip(), "held")
            psql("SELECT rag_ingest('ready-first', 'Note ' || g, 'Ready first note ' || g || ' about topic ' || g % 13 || '.') "
                 "FROM generate_series(1, 300) g")
            self.assertEqual(scalar("SELECT rag_wait('ready-first', '120 seconds')"), "t")
            self.assertEqual(psql(f"SELECT count(*), sum(chunks_embedded) FROM rag.documents WHERE collection_id = {collection} AND status = 'ready'"),
                             [["300", "300"]])
            self.assertEqual(scalar(f"SELECT index_name IS NULL FROM rag.collections WHERE id = {collection}"), "t")
            explain = "\n".join(row[0] for row in psql("SELECT * FROM rag_explain('ready-first', 'ready first note')"))
            self.assertIn("exact search", explain)
            self.assertEqual(scalar("SELECT count(*) FROM rag_query('ready-first', 'ready first note about topic 4', k => 5, max_distance => 2)"), "5")
        finally:
            _, err = holder.communicate(input="COMMIT;\n", timeout=60)
        self.assertEqual(holder.returncode, 0, err)
        # Released: the worker's next try builds it.
        self.assertTrue(wait_until(f"SELECT to_regclass('rag.' || index_name) IS NOT NULL FROM rag.collections WHERE id = {collection}"))
        explain = "\n".join(row[0] for row in psql("SELECT * FROM rag_explain('ready-first', 'ready first note')"))
        self.assertNotIn("exact search", explain)

    def test_h_a_provider_that_cannot_be_reached_fails_a_whole_group(self):
        # The provider's key is wanted from rag.secrets_file, which this cluster does not set: no client can be
        # made for it. A group of new documents whose first is large (its chunks stored for the regular path)
        # and the rest small must all fail with the reason; none may keep its claim and stay processing.
        psql("SELECT rag_create_provider('keyless-file', 'openai', 'http://127.0.0.1:9/v1', 'file:absent')")
        psql("SELECT rag_create_collection('unreachable', embedding_provider => 'keyless-file', "
             "embedding_model => 'hash-384', chunk_size => 300, chunk_overlap => 0)")
        large = " ".join(f"Paragraph {i} of the large first document has words enough to fill a chunk of its own."
                         for i in range(120))
        psql("BEGIN; "
             f"SELECT rag_ingest('unreachable', 'Large', '{large}'); "
             + "".join(f"SELECT rag_ingest('unreachable', 'Small {i}', 'Small document {i} of the group.'); " for i in range(5))
             + "COMMIT;")
        self.assertEqual(scalar("SELECT rag_wait('unreachable', '60 seconds')"), "t")
        rows = psql("SELECT d.title, d.status, d.failure_reason FROM rag.documents d JOIN rag.collections c "
                    "ON c.id = d.collection_id WHERE c.name = 'unreachable' ORDER BY d.id")
        self.assertEqual([row[:2] for row in rows], [["Large", "failed"]] + [[f"Small {i}", "failed"] for i in range(5)])
        for row in rows:
            self.assertIn("rag.secrets_file is not set", row[2])
        self.assertGreater(int(scalar("SELECT count(*) FROM rag.chunks ch JOIN rag.collections c ON c.id = ch.collection_id "
                                      "WHERE c.name = 'unreachable'")), 32, "the large document was not chunked first")
        self.assertEqual(scalar("SELECT count(*) FROM rag.queue q JOIN rag.collections c ON c.id = q.collection_id "
                                "WHERE c.name = 'unreachable'"), "0")

    def test_z_worker_killed_mid_batch_finishes_with_exact_counts(self):
        # Runs last: SIGKILL makes the postmaster reset every backend.
        model = "hash-384@slow300"
        psql("ALTER SYSTEM SET rag.batch_size = 2; SELECT pg_reload_conf();")
        try:
            psql(f"SELECT rag_create_collection('killed', embedding_model => '{model}', chunk_size => 100, chunk_overlap => 0)")
            paragraphs = "\n\n".join(f"Paragraph {n} talks about topic number {n} in some detail here." for n in range(24))
            doc = scalar(f"SELECT rag_ingest('killed', 'Doc', $${paragraphs}$$)")
            deadline = time.time() + 60
            embedded = 0
            while time.time() < deadline:
                embedded = int(scalar(f"SELECT chunks_embedded FROM rag.documents WHERE id = {doc}"))
                if embedded >= 2:
                    break
                time.sleep(0.1)
            self.assertGreaterEqual(embedded, 2)
            total = int(scalar(f"SELECT chunks_total FROM rag.documents WHERE id = {doc}"))
            self.assertLess(embedded, total, "the document finished before the worker could be killed")
            pid = int(scalar("SELECT pid FROM pg_stat_activity WHERE backend_type = 'rag worker' AND datname = current_database()"))
            os.kill(pid, signal.SIGKILL)
            time.sleep(1.0)
            wait_for_server(db=DB)
            self.assertEqual(scalar("SELECT rag_wait('killed', '90 seconds')"), "t")
            row = psql(f"""SELECT status, chunks_total, chunks_embedded,
                                  (SELECT count(*) FROM rag.chunks WHERE document_id = {doc}),
                                  (SELECT count(*) FROM rag.chunks WHERE document_id = {doc} AND embedding IS NOT NULL),
                                  (SELECT count(DISTINCT ordinal) FROM rag.chunks WHERE document_id = {doc})
                             FROM rag.documents WHERE id = {doc}""")[0]
            self.assertEqual(row[0], "ready")
            self.assertEqual(len(set(row[1:])), 1, f"counts disagree: {row}")
            _, inputs = provider_calls(model)
            # Only what was missing is embedded again: the batch in flight when the worker died, and the batches
            # whose commits had not reached the WAL (the worker commits asynchronously: at most 3 ×
            # wal_writer_delay = 600 ms of them, two batches of two at 300 ms a call). Not the whole document.
            self.assertLessEqual(inputs, total + 2 + 4)
        finally:
            wait_for_server(db=DB)
            psql("ALTER SYSTEM RESET rag.batch_size; SELECT pg_reload_conf();")


class WithoutPreload(unittest.TestCase):
    """A server that cannot preload the library: it still works through rag_process_queue(), and its
    privilege checks still tell who called (each psql call below is a new session, which loads the library
    afresh)."""

    @classmethod
    def setUpClass(cls):
        work = os.environ.get("WORK", "/tmp/rag-test")
        cls.port = port = subprocess.run(
            ["python3", "-c", "import socket; s=socket.socket(); s.bind(('127.0.0.1',0)); print(s.getsockname()[1])"],
            capture_output=True, text=True).stdout.strip()
        cls.data = data = f"{work}/nopreload"
        script = f"""
            set -e
            source {os.environ['ROOT']}/scripts/lib/cluster.sh
            start_cluster {data} {port} "rag.ollama_url = 'http://127.0.0.1:{os.environ['PROVIDER_PORT']}'" \
                "max_prepared_transactions = 2"
            sed -i "s/^shared_preload_libraries = 'rag'/shared_preload_libraries = ''/" {data}/data/postgresql.conf
            as_postgres $PG_BIN/pg_ctl -D {data}/data -w restart -l {data}/server.log >/dev/null
        """
        subprocess.run(["bash", "-c", script], check=True)

    @classmethod
    def tearDownClass(cls):
        subprocess.run(["bash", "-c", f"source {os.environ['ROOT']}/scripts/lib/cluster.sh; stop_cluster {cls.data}"])

    def test_a_key_in_the_configuration_is_not_used(self):
        port = self.port
        secret = "sk-nopreload-5ecret"
        # ALTER SYSTEM knows the setting only in a session that loaded the library.
        psql(f"LOAD 'rag'; ALTER SYSTEM SET rag.openai_api_key = '{secret}'; SELECT pg_reload_conf()", db="postgres",
             port=port)
        time.sleep(0.5)
        try:
            psql("CREATE DATABASE keyless", db="postgres", port=port)
            psql("DROP ROLE IF EXISTS np_peek; CREATE ROLE np_peek LOGIN", db="postgres", port=port)
            # Why: before the library is loaded in a session, the setting is a placeholder anyone may read.
            self.assertEqual(psql("SET ROLE np_peek; SHOW rag.openai_api_key", db="keyless", port=port),
                             [[secret]])
            provider = f"http://127.0.0.1:{os.environ['PROVIDER_PORT']}/v1"
            code, rows, err = psql(f"""CREATE EXTENSION rag CASCADE;
                SELECT rag_create_provider('keyed', 'openai', '{provider}', 'rag.openai_api_key');
                SELECT rag_embed('hello', 'hash-384', 'keyed');""", db="keyless", port=port, check=False)
            self.assertNotEqual(code, 0)
            self.assertIn("rag.openai_api_key is used only when rag is in shared_preload_libraries", err)
            self.assertNotIn(secret, repr(rows) + err)
        finally:
            psql("LOAD 'rag'; ALTER SYSTEM RESET rag.openai_api_key; SELECT pg_reload_conf()", db="postgres", port=port)
            psql("DROP DATABASE IF EXISTS keyless", db="postgres", port=port)
            psql("DROP ROLE IF EXISTS np_peek", db="postgres", port=port)

    def test_definer_functions_running_when_the_library_loads(self):
        port = self.port
        psql("CREATE DATABASE definers", db="postgres", port=port)

        def run(sql, **kwargs):
            return psql(sql, db="definers", port=port, **kwargs)

        run("""CREATE EXTENSION rag CASCADE;
               SELECT rag_create_collection('payroll', embedding_model => 'hash-384', max_distance => 0.9);
               SELECT rag_ingest('payroll', 'Pay day', 'Salaries are paid on the last working day of the month.');
               SELECT rag_process_queue();
               CREATE ROLE np_attacker; GRANT rag_reader TO np_attacker;
               CREATE SCHEMA np_attacker AUTHORIZATION np_attacker;
               SET ROLE np_attacker;
               CREATE FUNCTION np_attacker.lure() RETURNS text LANGUAGE plpgsql SECURITY DEFINER
               SET search_path = pg_catalog AS $f$
               BEGIN
                   PERFORM public.rag_grant('payroll', 'np_attacker', 'admin');
                   RETURN 'granted';
               END $f$;
               RESET ROLE;
               CREATE ROLE np_nobody;
               CREATE FUNCTION public.np_pay_day(question text) RETURNS text LANGUAGE sql SECURITY DEFINER
               SET search_path = pg_catalog AS $f$ SELECT title FROM public.rag_query('payroll', question, 1) $f$;
               GRANT EXECUTE ON FUNCTION public.np_pay_day(text) TO np_nobody;""")
        # The attacker's definer function, called by a superuser as the session's first use of rag: the call
        # to rag is planned in the attacker's frame, which loads the library there, while a function that runs
        # as another role is running; rag cannot see who called that function and refuses.
        code, _, err = run("SELECT np_attacker.lure()", check=False)
        self.assertNotEqual(code, 0)
        self.assertIn("rag cannot tell who is calling", err)
        self.assertEqual(run("SELECT count(*) FROM rag.collection_grants WHERE grantee = 'np_attacker'::regrole"), [["0"]])
        # The library loaded inside a function of rag's owner (a superuser's definer function): whoever called
        # it is further down than can be seen, so the call refuses and says why, and does not act for the
        # function's owner.
        code, _, err = run("SET ROLE np_nobody; SELECT public.np_pay_day('when are salaries paid')", check=False)
        self.assertNotEqual(code, 0)
        self.assertIn("rag cannot tell who is calling", err)
        self.assertIn("shared_preload_libraries", err)
        # Once loaded, the library stays: the same call again in the same session is answered (here for the
        # superuser, whose own function it is; with the library preloaded it is answered the first time).
        _, rows, err = run("""DO $$ BEGIN
                                  PERFORM public.np_pay_day('when are salaries paid');
                                  RAISE NOTICE 'answered';
                              EXCEPTION WHEN insufficient_privilege THEN
                                  RAISE NOTICE 'refused: %', SQLERRM;
                              END $$;
                              SELECT public.np_pay_day('when are salaries paid');""", check=False)
        self.assertIn("refused: rag cannot tell who is calling", err)
        self.assertEqual(rows, [["Pay day"]], err)
        run("DROP FUNCTION public.np_pay_day(text); DROP SCHEMA np_attacker CASCADE; "
            "SELECT rag_drop_collection('payroll'); DROP EXTENSION rag; DROP OWNED BY np_attacker, np_nobody; "
            "DROP ROLE np_attacker, np_nobody")

    def test_partition_keys_when_the_library_loads_inside_the_statement(self):
        """Without preloading, a session's first row trigger of rag loads the library while PostgreSQL runs
        the statement's AFTER triggers, inside an ExecutorFinish that had found no hook to call: the keys that
        statement gathered for a watched partition are queued at the commit, not lost."""
        port = self.port
        psql("CREATE DATABASE partkeys", db="postgres", port=port)

        def run(sql, **kwargs):
            return psql(sql, db="partkeys", port=port, **kwargs)

        run("""CREATE EXTENSION rag CASCADE;
               SELECT rag_create_collection('parts', embedding_model => 'hash-384', max_distance => 0.9);
               CREATE TABLE routed (id integer, body text) PARTITION BY LIST ((id % 2));
               CREATE TABLE routed_even PARTITION OF routed FOR VALUES IN (0);
               CREATE TABLE routed_odd PARTITION OF routed FOR VALUES IN (1);
               ALTER TABLE routed_even ADD PRIMARY KEY (id);
               SELECT rag_watch('routed_even', 'parts', content => 'body');""")
        self.assertEqual(run("SELECT rag._watch_trigger_mode_installed('routed_even'::regclass)"),
                         [["gather_at_end"]])
        # Each psql run is a new session; nothing of rag runs in this one before the INSERT's row triggers. The
        # statement after it, rolled back to a savepoint, has the hooks: its end queues only its own keys (in
        # the savepoint, so they go with it), not the first statement's, which the commit queues.
        code, _, err = run("BEGIN;\n"
                           "INSERT INTO routed SELECT g, 'row ' || g FROM generate_series(1, 5) g;\n"
                           "SAVEPOINT before_six;\n"
                           "INSERT INTO routed VALUES (6, 'rolled back');\n"
                           "ROLLBACK TO SAVEPOINT before_six;\n"
                           "COMMIT;", check=False)
        self.assertEqual(code, 0, err)
        self.assertNotIn("WARNING", err)
        self.assertEqual(run("SELECT key_values FROM rag.row_batches"), [["{2,4}"]])
        # PREPARE TRANSACTION queues them as a commit does (inside the prepared transaction): COMMIT PREPARED
        # makes them due, ROLLBACK PREPARED drops them.
        for prepared, ending in (("keys_10", "COMMIT PREPARED"), ("keys_20", "ROLLBACK PREPARED")):
            first = int(prepared[-2:])
            before = run("SELECT count(*) FROM rag.row_batches")
            code, _, err = run("BEGIN;\n"
                               f"INSERT INTO routed SELECT g, 'row ' || g FROM generate_series({first}, {first + 3}) g;\n"
                               f"PREPARE TRANSACTION '{prepared}';", check=False)
            self.assertEqual(code, 0, err)
            self.assertNotIn("WARNING", err)
            # Not visible before the prepared transaction ends.
            self.assertEqual(run("SELECT count(*) FROM rag.row_batches"), before)
            run(f"{ending} '{prepared}'")
        self.assertEqual(run("SELECT key_values FROM rag.row_batches ORDER BY id"), [["{2,4}"], ["{10,12}"]])
        run("TRUNCATE rag.row_batches")
        # A transaction made read-only after such a write cannot queue its keys at the commit: the COMMIT
        # succeeds, and a WARNING names the rows left out.
        code, _, err = run("BEGIN;\n"
                           "INSERT INTO routed SELECT g, 'row ' || g FROM generate_series(7, 9) g;\n"
                           "SET TRANSACTION READ ONLY;\n"
                           "COMMIT;", check=False)
        self.assertEqual(code, 0, err)
        self.assertIn('the keys of 1 row(s) written to "routed_even" were not queued for indexing: the '
                      "transaction was made read-only after writing them", err)
        self.assertEqual(run("SELECT count(*) FROM routed_even WHERE id = 8"), [["1"]])
        self.assertEqual(run("SELECT key_values FROM rag.row_batches"), [])
        psql("DROP DATABASE partkeys", db="postgres", port=port)

    def test_process_queue_in_session(self):
        port = self.port
        psql("CREATE EXTENSION rag CASCADE", db="postgres", port=port)
        self.assertEqual(scalar("SELECT count(*) FROM pg_stat_activity WHERE backend_type LIKE 'rag%'", db="postgres", port=port), "0")
        psql("SELECT rag_create_collection('manual', embedding_model => 'hash-384', max_distance => 0.9)", db="postgres", port=port)
        psql("SELECT rag_ingest('manual', 'Good', 'Documents can be processed by hand when no worker runs.')", db="postgres", port=port)
        psql("SELECT rag_create_collection('manual-bad', embedding_model => 'hash-384@401')", db="postgres", port=port)
        psql("SELECT rag_ingest('manual-bad', 'Bad', 'This one fails with 401, and must not stop the other.')", db="postgres", port=port)
        self.assertEqual(scalar("SELECT rag_process_queue()", db="postgres", port=port), "2")
        rows = psql("SELECT title, status FROM rag.documents ORDER BY title", db="postgres", port=port)
        self.assertEqual(rows, [["Bad", "failed"], ["Good", "ready"]])
        hit = scalar("SELECT title FROM rag_query('manual', 'processed by hand without a worker', 1)", db="postgres", port=port)
        self.assertEqual(hit, "Good")
        # No worker means no idle repair: an index build that a concurrent store made this session skip
        # (rag._fit_index_to_load) is done by rag_process_queue itself once the queue is empty. The dimension
        # is set up front (stores then share the collection's row), and rag_set_search drops the index that
        # rag_create_collection built.
        psql("SELECT rag_create_collection('manual-held', embedding_model => 'hash-384', dimensions => 384); "
             "SELECT rag_set_search('manual-held', m => 8, ef_construction => 40); "
             "SELECT rag_ingest('manual-held', 'Held', 'Stored while another store shares the collection.')",
             db="postgres", port=port)
        index = "SELECT to_regclass('rag.' || index_name) IS NOT NULL FROM rag.collections WHERE name = 'manual-held'"
        holder = background_psql("BEGIN; SELECT 'held' FROM rag.collections WHERE name = 'manual-held' FOR SHARE;",
                                 db="postgres", port=port)
        try:
            self.assertEqual(read_line(holder).strip(), "held")
            self.assertEqual(scalar("SELECT rag_process_queue()", db="postgres", port=port), "1")
            self.assertEqual(scalar(index, db="postgres", port=port), "f", "built while another store held the row")
        finally:
            _, err = holder.communicate(input="COMMIT;\n", timeout=60)
        self.assertEqual(holder.returncode, 0, err)
        self.assertEqual(scalar("SELECT status FROM rag.documents WHERE title = 'Held'", db="postgres", port=port), "ready")
        self.assertEqual(scalar("SELECT rag_process_queue()", db="postgres", port=port), "0")
        self.assertEqual(scalar(index, db="postgres", port=port), "t", "rag_process_queue left the index unbuilt")
        self.assertIn("m='8', ef_construction='40'",
                      scalar("SELECT indexdef FROM pg_indexes i JOIN rag.collections c ON i.indexname = c.index_name "
                             "WHERE c.name = 'manual-held'", db="postgres", port=port))
        # A bulk load processed by hand: the call that stores its last document builds the index after it,
        # though it stops at max_items before finding the queue empty (its look at the queue must see the
        # writes of its own transaction).
        psql("SELECT rag_create_collection('manual-bulk', embedding_model => 'hash-384'); "
             "SELECT count(rag_ingest('manual-bulk', 'Note ' || g, 'Bulk note ' || g || ' stored by hand.')) "
             "FROM generate_series(1, 210) g", db="postgres", port=port)
        self.assertEqual(scalar("SELECT rag_process_queue(200)", db="postgres", port=port), "200")
        self.assertEqual(scalar("SELECT index_name IS NULL FROM rag.collections WHERE name = 'manual-bulk'",
                                db="postgres", port=port), "t", "built in the middle of the bulk load")
        self.assertEqual(scalar("SELECT rag_process_queue(10)", db="postgres", port=port), "10")
        self.assertEqual(scalar("SELECT to_regclass('rag.' || index_name) IS NOT NULL FROM rag.collections "
                                "WHERE name = 'manual-bulk'", db="postgres", port=port), "t",
                         "the load's index was not built after its last document")


    def test_process_queue_of_another_role(self):
        # rag_process_queue runs the worker's steps as rag's owner in the caller's session. Red team 12: any
        # rag_admin had every collection's queued documents and every owner's watched rows read in its session,
        # where debug_print_plan (which any role may set) printed them with the values bound to each query;
        # spent their providers' keys with nothing recorded once it rolled back; and its statement_timeout,
        # caught by the step, failed the owner's documents.
        port = self.port
        run = partial(psql, db="postgres", port=port)
        run("DROP ROLE IF EXISTS pq_owner; DROP ROLE IF EXISTS pq_other; "
            "CREATE ROLE pq_owner LOGIN IN ROLE rag_admin; CREATE ROLE pq_other LOGIN IN ROLE rag_admin; "
            "GRANT CREATE ON SCHEMA public TO pq_owner")
        run("SELECT rag_create_collection('pq-private', embedding_model => 'hash-384'); "
            "SELECT rag_ingest('pq-private', 'Memo', 'ZEBRA-CODEWORD payroll figures for the fourth quarter.'); "
            "CREATE TABLE pq_rows (id int PRIMARY KEY, body text); "
            "INSERT INTO pq_rows VALUES (1, 'ZEBRA-ROW severance terms of the department.'); "
            "SELECT rag_watch('pq_rows', 'pq-private', content => 'body')", user="pq_owner")
        status, rows, err = psql("SET client_min_messages = log; SET debug_print_plan = on; "
                                 "SET debug_print_parse = on; SET row_security = off; SELECT rag_process_queue()",
                                 db="postgres", port=port, user="pq_other", check=False)
        self.assertEqual((status, rows), (0, [["0"]]), err)
        self.assertNotIn("ZEBRA", err)
        # The caller's own statement and the wrapper's are printed (they run as the caller); no query of rag's,
        # each of which reads a table (a relation's range table entry, rtekind 0).
        self.assertIn("plan:", err)
        self.assertNotIn(":rtekind 0 ", err)
        self.assertEqual(run("SELECT status FROM rag.documents WHERE title = 'Memo'"), [["processing"]])
        self.assertEqual(run("SELECT count(*) FROM rag.row_queue"), [["1"]])
        # Its owner's call is cut short by its own statement_timeout while another transaction holds the
        # document: the call stops and returns, with a WARNING; the document under way is put back untried and
        # unclaimed (before, the timeout was caught as the step's failure and the call went on).
        holder = background_psql("BEGIN; SELECT 'held' FROM rag.documents WHERE title = 'Memo' FOR UPDATE;",
                                 db="postgres", port=port)
        try:
            self.assertEqual(read_line(holder).strip(), "held")
            started = time.time()
            # Three calls in one statement: PostgreSQL raises the statement's timeout once, so the two after the
            # stopped one return at once rather than running on past it.
            status, rows, err = psql("SET statement_timeout = '500ms'; "
                                     "DO $$ BEGIN FOR i IN 1..3 LOOP PERFORM rag_process_queue(); END LOOP; END $$",
                                     db="postgres", port=port, user="pq_owner", check=False)
            self.assertEqual(status, 0, err)
            self.assertEqual(err.count("rag_process_queue stopped: canceling statement due to statement timeout"), 1, err)
            self.assertLess(time.time() - started, 3.5, "the statement ran on past its timeout")
        finally:
            holder.communicate(input="COMMIT;\n", timeout=60)
        self.assertEqual(run("SELECT d.status, q.attempts, q.claimed_by IS NULL FROM rag.documents d "
                             "JOIN rag.queue q ON q.document_id = d.id WHERE d.title = 'Memo'"),
                         [["processing", "0", "t"]])
        self.assertEqual(run("SELECT count(*) FROM rag.row_queue WHERE claimed_by IS NOT NULL"), [["0"]])
        # A table owner's expression that RAISEs the cancel's SQLSTATE is that row's failure, not a cancel: it
        # had ended every call at that row, anyone's (review of red team 12).
        run("CREATE TABLE pq_cancels (id int PRIMARY KEY, body text); "
            "INSERT INTO pq_cancels VALUES (1, 'raises'); "
            "CREATE FUNCTION pq_raise(t text) RETURNS text LANGUAGE plpgsql IMMUTABLE AS $f$ "
            "BEGIN RAISE EXCEPTION 'canceling statement due to user request' USING ERRCODE = 'query_canceled'; END $f$; "
            "SELECT rag_watch('pq_cancels', 'pq-private', content => 'public.pq_raise(body)')", user="pq_owner")
        # A call rolled back leaves each provider call it made in the server log.
        with open(f"{self.data}/server.log") as f:
            f.seek(0, 2)
            run("BEGIN; SELECT rag_process_queue(); ROLLBACK;", user="pq_owner")
            logged = f.read()
        self.assertIn('"provider_call":"embedding documents"', logged)
        self.assertIn('"rolled_back":true', logged)
        self.assertIn('"role":"pq_owner"', logged)
        # A table owner's slow expression: the caller's timeout stops the call inside it, and the row backs off
        # like a failed one, so the next call is not stopped at the same row (it had stopped every call there).
        run("CREATE TABLE pq_slow (id int PRIMARY KEY, body text); INSERT INTO pq_slow VALUES (1, 'slow'); "
            "CREATE FUNCTION pq_sleepy(t text) RETURNS text LANGUAGE plpgsql IMMUTABLE AS $f$ "
            "BEGIN PERFORM pg_catalog.pg_sleep(3); RETURN t; END $f$; "
            "SELECT rag_watch('pq_slow', 'pq-private', content => 'public.pq_sleepy(body)')", user="pq_owner")
        slow_due = ("SELECT bool_and(q.not_before <= now()) FROM rag.row_queue q JOIN rag.watches w ON w.id = q.watch_id "
                    "WHERE w.source_name = 'pq_slow'")
        self.assertTrue(wait_until(slow_due, db="postgres", port=port, seconds=30))
        status, _, err = psql("SET statement_timeout = '1s'; SELECT rag_process_queue()",
                              db="postgres", port=port, user="pq_owner", check=False)
        self.assertEqual(status, 0, err)
        self.assertIn("rag_process_queue stopped", err)
        self.assertEqual(run("SELECT q.not_before > now() AND q.last_error LIKE '%stopped%' FROM rag.row_queue q "
                             "JOIN rag.watches w ON w.id = q.watch_id WHERE w.source_name = 'pq_slow'"), [["t"]])
        # Its owner processes the rest; the raising row fails with its reason, and the call goes on past it.
        run("SELECT rag_process_queue()", user="pq_owner")
        self.assertEqual(run("SELECT count(*) FROM rag.documents d JOIN rag.collections c ON c.id = d.collection_id "
                             "WHERE c.name = 'pq-private' AND d.status = 'ready'"), [["2"]])
        self.assertIn("canceling statement due to user request",
                      run("SELECT last_error FROM rag.watch_status WHERE source = 'pq_cancels'")[0][0])
        # Nor does the other role's call take up another's housekeeping: spreading a watched table's batches of
        # keys in its own transaction, left open, had kept them from everyone else's calls (review of red team 12).
        run("INSERT INTO pq_rows VALUES (2, 'Another row written while another call stays open.')", user="pq_owner")
        other = background_psql("BEGIN; SET ROLE pq_other; SELECT 'held', rag_process_queue();", db="postgres", port=port)
        try:
            self.assertEqual(read_line(other).strip(), "held|0")
            # A written row waits a moment for more writes to it (the watch's delay) before it is due.
            deadline = time.time() + 30
            while run("SELECT count(*) FROM rag.documents WHERE source = 'pq_rows'") != [["2"]]:
                self.assertLess(time.time(), deadline, "the row was not processed while the other call stayed open")
                run("SELECT rag_process_queue()", user="pq_owner")
                time.sleep(0.2)
        finally:
            other.communicate(input="ROLLBACK;\n", timeout=60)

if __name__ == "__main__":
    unittest.main()
