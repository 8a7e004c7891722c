"""No user can stall the others: a slow watch expression times out, a huge document is embedded in slices
while other collections' documents go ahead, and rag_chunk stops at a cancel or statement_timeout."""
import os
import signal
import subprocess
import time
import unittest
import zlib

from functools import partial

from support import InItsOwnDatabase, background_psql, psql, scalar
from support import wait_until as wait_until_in

DB = "rag_e2e_isolation"
wait_until = partial(wait_until_in, db=DB)


def memory_bomb_pdf():
    """A 3 KB PDF whose object stream lists one array of a million elements 200 times."""
    header = b" ".join(b"%d 0" % (100 + i) for i in range(200)) + b" "
    data = zlib.compress(header + b"[" + b"0 " * 1_000_000 + b"]", 9)
    bodies = [b"<< /Type /Catalog /Pages 2 0 R >>",
              b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
              b"<< /Type /Page /Parent 2 0 R /Contents 4 0 R /Resources << /Font << /F1 5 0 R >> >> >>",
              b"<< /Length 32 >>\nstream\nBT /F1 12 Tf 72 700 Td (x) Tj ET\nendstream",
              b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
              b"<< /Type /ObjStm /N 200 /First %d /Length %d /Filter /FlateDecode >>\nstream\n" % (len(header), len(data))
              + data + b"\nendstream"]
    pdf = bytearray(b"%PDF-1.7\n")
    offsets = []
    for number, body in enumerate(bodies, start=1):
        offsets.append(len(pdf))
        pdf += b"%d 0 obj\n" % number + body + b"\nendobj\n"
    xref = len(pdf)
    pdf += b"xref\n0 %d\n0000000000 65535 f \n" % (len(bodies) + 1)
    pdf += b"".join(b"%010d 00000 n \n" % offset for offset in offsets)
    pdf += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(bodies) + 1, xref)
    return bytes(pdf)


def children_of(pid):
    return subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()


def wait_gone(pids, seconds=10):
    """Whether every process of `pids` is gone within the time."""
    deadline = time.time() + seconds
    while any(os.path.exists(f"/proc/{pid}") for pid in pids) and time.time() < deadline:
        time.sleep(0.1)
    return not any(os.path.exists(f"/proc/{pid}") for pid in pids)


def process_name(pid):
    try:
        with open(f"/proc/{pid}/comm") as comm:
            return comm.read().strip()
    except OSError:
        return None


class Isolation(InItsOwnDatabase):
    DB = DB

    def test_slow_watch_expression_times_out_and_other_collections_go_ahead(self):
        psql("ALTER SYSTEM SET rag.expression_timeout = '1s'; SELECT pg_reload_conf();", db="postgres")
        try:
            psql("""
                CREATE FUNCTION slow_text(t text) RETURNS text LANGUAGE sql AS $$ SELECT pg_sleep(20)::text || t $$;
                CREATE TABLE slow_rows (id int PRIMARY KEY, body text);
                INSERT INTO slow_rows VALUES (1, 'a row whose content takes twenty seconds to compute');
                SELECT rag_create_collection('slow-watch', embedding_model => 'hash-384');
                SELECT rag_create_collection('quick', embedding_model => 'hash-384');
                SELECT rag_watch('slow_rows', 'slow-watch', content => 'public.slow_text(body)');
            """, db=DB)
            started = time.time()
            # The worker is now inside the slow expression; a document of another collection still gets done.
            psql("SELECT rag_ingest('quick', 'Quick', 'One sentence that should not wait for anyone.')", db=DB)
            self.assertTrue(wait_until("SELECT rag_wait('quick', '1 second')", seconds=15),
                            "a one-sentence document waited behind a slow watch expression")
            self.assertTrue(wait_until("SELECT EXISTS (SELECT 1 FROM rag.row_queue WHERE last_error IS NOT NULL)",
                                       seconds=15))
            error = scalar("SELECT last_error FROM rag.row_queue", db=DB)
            self.assertIn("rag.expression_timeout", error)
            self.assertLess(time.time() - started, 15, "the expression was not cut off at the timeout")
            # The row backs off instead of taking the worker every 30 seconds.
            self.assertEqual(scalar("SELECT attempts >= 1 AND not_before > now() FROM rag.row_queue", db=DB), "t")
            self.assertEqual(scalar("SELECT count(*) FROM rag.documents WHERE source = 'slow_rows'", db=DB), "0")
        finally:
            psql("ALTER SYSTEM RESET rag.expression_timeout; SELECT pg_reload_conf();", db="postgres")
            psql("SELECT rag_unwatch('slow_rows', drop_documents => true)", db=DB)

    def test_large_document_is_embedded_in_slices(self):
        # About 3,000 chunks at 50 ms a batch of 32: several seconds of embedding for one document.
        psql("""
            SELECT rag_create_collection('big', embedding_model => 'hash-384@slow50', chunk_size => 100, chunk_overlap => 0);
            SELECT rag_create_collection('small', embedding_model => 'hash-384');
            SELECT rag_ingest('big', 'Big', repeat('This sentence is one of very many in a large document. ', 5500));
        """, db=DB)
        self.assertTrue(wait_until("SELECT chunks_embedded > 0 FROM rag.documents WHERE title = 'Big'", seconds=30))
        psql("SELECT rag_ingest('small', 'Small', 'A single short sentence in another collection.')", db=DB)
        self.assertTrue(wait_until("SELECT status = 'ready' FROM rag.documents WHERE title = 'Small'", seconds=30))
        big = psql("SELECT status, chunks_embedded, chunks_total FROM rag.documents WHERE title = 'Big'", db=DB)[0]
        self.assertEqual(big[0], "processing", f"the small document waited for the whole large one: {big}")
        self.assertLess(int(big[1]), int(big[2]))
        self.assertTrue(wait_until("SELECT status = 'ready' FROM rag.documents WHERE title = 'Big'", seconds=120))
        self.assertEqual(scalar("SELECT chunks_embedded = chunks_total FROM rag.documents WHERE title = 'Big'", db=DB), "t")

    def test_rag_chunk_stops_at_statement_timeout(self):
        started = time.time()
        code, _, stderr = psql("SET statement_timeout = '300ms';\n"
                               "SELECT count(*) FROM rag_chunk(repeat('All work and no play makes a dull text. ', 1500000));",
                               db=DB, check=False)
        elapsed = time.time() - started
        self.assertNotEqual(code, 0)
        self.assertIn("canceling statement due to statement timeout", stderr)
        # Without the checkpoint this text takes several seconds to chunk; with it the cancel lands at once.
        self.assertLess(elapsed, 2.5, f"rag_chunk ran {elapsed:.1f} s past a 300 ms statement_timeout")


    def test_extraction_stops_at_statement_timeout(self):
        started = time.time()
        code, _, stderr = psql("SET statement_timeout = '300ms';\n"
                               "SELECT length(rag_extract_text(convert_to(repeat('<p>A paragraph of a very large page.</p>', "
                               "1500000), 'UTF8'), 'big.html'));", db=DB, check=False)
        elapsed = time.time() - started
        self.assertNotEqual(code, 0)
        self.assertIn("canceling statement due to statement timeout", stderr)
        self.assertLess(elapsed, 2.5, f"extraction ran {elapsed:.1f} s past a 300 ms statement_timeout")

    def test_markup_conversion_is_bounded_and_stops_at_statement_timeout(self):
        # A line of 60 million characters takes the converter about a second and six bytes of memory a byte (its
        # characters read as a list): past a megabyte it runs in a child under the extraction bounds, which a
        # cancel ends at once (in the backend it ran to the end).
        text = "repeat('a', 60000000)"
        started = time.time()
        code, _, stderr = psql(f"SET statement_timeout = '300ms';\nSELECT length(rag_markdown_to_text({text}));",
                               db=DB, check=False)
        elapsed = time.time() - started
        self.assertNotEqual(code, 0)
        self.assertIn("canceling statement due to statement timeout", stderr)
        self.assertLess(elapsed, 2.5, f"conversion ran {elapsed:.1f} s past a 300 ms statement_timeout")
        code, _, stderr = psql(f"SET rag.extraction_memory = '256MB';\nSELECT length(rag_markdown_to_text({text}));",
                               db=DB, check=False)
        self.assertNotEqual(code, 0)
        self.assertIn("could not be extracted", stderr)
        self.assertIn("256 MB", stderr)
        # A small text is converted in the session, as before.
        self.assertEqual(scalar("SELECT rag_markdown_to_text(E'# Title\\n\\nSome *text*.')", db=DB), "Title")

    def test_a_file_that_exhausts_memory_fails_alone(self):
        """A 3 KB PDF whose object stream lists one array of a million elements 200 times: the PDF parser
        builds gigabytes from it, which no size limit of the input bounds. Extraction runs in a child process
        with its own address-space limit, so the child ends, the caller gets an ERROR, and the server (and every
        other session) goes on; in the backend itself the failed allocation aborted the whole server."""
        pdf = memory_bomb_pdf()
        started_at = scalar("SELECT pg_postmaster_start_time()", db=DB)
        code, _, stderr = psql(f"SELECT length(rag_extract_text('\\x{pdf.hex()}'::bytea, 'objects.pdf'));",
                               db=DB, check=False)
        self.assertNotEqual(code, 0)
        self.assertIn("could not be extracted: it needed more than 2 GB of memory", stderr)
        self.assertNotIn("server closed the connection", stderr)
        # A superuser's lower bound (rag.extraction_memory) is the child's.
        code, _, stderr = psql(f"SET rag.extraction_memory = '256MB';\n"
                               f"SELECT length(rag_extract_text('\\x{pdf.hex()}'::bytea, 'objects.pdf'));",
                               db=DB, check=False)
        self.assertNotEqual(code, 0)
        self.assertIn("could not be extracted: it needed more than 256 MB of memory", stderr)
        self.assertIn("a superuser may raise rag.extraction_memory", stderr)
        self.assertEqual(scalar("SELECT pg_postmaster_start_time()", db=DB), started_at)
        # A backend that ends with FATAL while its child extracts (here its client is gone: FATAL "connection to
        # client lost", which, unlike pg_terminate_backend, signals no one else) takes the child with it:
        # nothing runs on to its limits, orphaned.
        session = background_psql(f"SET application_name = 'extracting';\n"
                                  f"SET client_connection_check_interval = '100ms';\n"
                                  f"SELECT length(rag_extract_text('\\x{pdf.hex()}'::bytea, 'objects.pdf'));",
                                  db=DB)
        try:
            self.assertTrue(wait_until("SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE application_name = "
                                       "'extracting' AND state = 'active')", seconds=30))
            backend = int(scalar("SELECT pid FROM pg_stat_activity WHERE application_name = 'extracting'", db=DB))
            children = []
            deadline = time.time() + 30
            while not children and time.time() < deadline:
                children = children_of(backend)
                time.sleep(0.05)
            self.assertTrue(children, "no extraction child appeared")
            session.kill()
            self.assertTrue(wait_gone(children), "the extraction child outlived its backend")
        finally:
            session.kill()
            session.communicate(timeout=60)
        self.assertEqual(scalar("SELECT pg_postmaster_start_time()", db=DB), started_at)

    def test_extractions_beyond_the_limit_wait_for_a_slot(self):
        """rag.max_concurrent_extractions bounds how many extraction children (each up to rag.extraction_memory)
        run at once in the cluster: with 1, a second extraction waits (no child of its own, wait event
        Extension) while the first one's child is held stopped; a cancel ends the wait; with 2, one login holds at
        most one slot (whatever role it sets) while another login's extraction goes ahead; and the first backend's end gives its slot
        back (rag_extraction_slots() lists none), so the next extraction goes on."""
        pdf = memory_bomb_pdf()
        waiting = ("SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE application_name = 'slot_waiter' "
                   "AND state = 'active' AND wait_event_type = 'Extension')")
        harmless = ("SET application_name = 'slot_waiter';\n"
                    "SELECT rag_extract_text(convert_to('the waiter''s text', 'UTF8'), 'waiter.txt');")
        psql("ALTER SYSTEM SET rag.max_concurrent_extractions = 1;\nSELECT pg_reload_conf();", db="postgres")
        psql("DROP ROLE IF EXISTS rag_slot_other;\nCREATE ROLE rag_slot_other LOGIN IN ROLE rag_reader;", db=DB)
        sessions, stopped = [], []
        try:
            self.assertTrue(wait_until("SELECT current_setting('rag.max_concurrent_extractions') = '1'"))
            sessions.append(background_psql("SET application_name = 'slot_holder';\n"
                                            "SET client_connection_check_interval = '100ms';\n"
                                            f"SELECT length(rag_extract_text('\\x{pdf.hex()}'::bytea, 'objects.pdf'));",
                                            db=DB))
            self.assertTrue(wait_until("SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE application_name = "
                                       "'slot_holder' AND state = 'active')", seconds=30))
            holder = int(scalar("SELECT pid FROM pg_stat_activity WHERE application_name = 'slot_holder'", db=DB))
            deadline = time.time() + 30
            while not stopped and time.time() < deadline:
                for child in children_of(holder):
                    # Named once it runs (ps and top show it apart from its backend).
                    if process_name(child) == "rag extract":
                        os.kill(int(child), signal.SIGSTOP)
                        stopped.append(int(child))
                time.sleep(0.01)
            self.assertTrue(stopped, "the holder's extraction child never appeared under its name")

            sessions.append(background_psql(harmless, db=DB))
            self.assertTrue(wait_until(waiting, seconds=30), "the second extraction did not wait for a slot")
            waiter = int(scalar("SELECT pid FROM pg_stat_activity WHERE application_name = 'slot_waiter'", db=DB))
            time.sleep(0.5)
            self.assertEqual(scalar(waiting, db=DB), "t")
            self.assertEqual(children_of(waiter), [], "a waiting extraction started its child")
            psql(f"SELECT pg_cancel_backend({waiter})", db=DB)
            _, stderr = sessions[-1].communicate(timeout=30)
            self.assertIn("canceling statement due to user request", stderr)

            # With two slots, one login may hold one of them (half, rounded up): the holder's login waits again
            # with a slot free, also as another role it may SET, and another login's extraction goes ahead at once.
            psql("ALTER SYSTEM SET rag.max_concurrent_extractions = 2;\nSELECT pg_reload_conf();", db="postgres")
            self.assertTrue(wait_until("SELECT current_setting('rag.max_concurrent_extractions') = '2'"))
            sessions.append(background_psql("SET ROLE rag_slot_other;\n" + harmless, db=DB))
            self.assertTrue(wait_until(waiting, seconds=30), "the holder's login took more than its share")
            code, rows, stderr = psql("SELECT rag_extract_text(convert_to('another role''s text', 'UTF8'), 'other.txt');",
                                      db=DB, check=False, timeout=30, user="rag_slot_other")
            self.assertEqual((code, rows), (0, [["another role's text"]]), stderr)
            self.assertEqual(scalar(waiting, db=DB), "t")
            self.assertEqual(psql("SELECT pid FROM rag_extraction_slots()", db=DB), [[str(holder)]])
            psql("SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE application_name = 'slot_waiter'",
                 db=DB)
            sessions[-1].communicate(timeout=30)

            # The holder's end gives its slot back through its exit callback (no waiter is there to find the
            # slot's holder dead and take it), and its stopped child dies with it.
            psql(f"SELECT pg_terminate_backend({holder})", db=DB)
            self.assertTrue(wait_until(f"SELECT NOT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = {holder})"))
            self.assertTrue(wait_gone(stopped), "the stopped child outlived its backend")
            self.assertEqual(psql("SELECT pid FROM rag_extraction_slots()", db=DB), [])
            stdout, stderr = background_psql(harmless, db=DB).communicate(input="", timeout=30)
            self.assertIn("the waiter's text", stdout, stderr)
        finally:
            psql("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                 "WHERE application_name IN ('slot_holder', 'slot_waiter')", db=DB)
            for session in sessions:
                session.kill()
                session.communicate(timeout=60)
            psql("ALTER SYSTEM RESET rag.max_concurrent_extractions;\nSELECT pg_reload_conf();", db="postgres")
            psql("DROP ROLE rag_slot_other;", db=DB)


if __name__ == "__main__":
    unittest.main()
