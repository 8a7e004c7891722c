"""A watched table's owner's code runs in the worker, which is a superuser session serving every collection of
its database: nothing that code sets may outlive the expression, an expression that catches its own timeout's
cancel may not hold the worker, a terminate request must end the worker whatever SQL it runs, and watched rows
may not keep documents waiting."""
import time

from support import InItsOwnDatabase, psql, scalar, wait_until

DB = "rag_e2e_hostile_watch"
WORKER = f"SELECT pid FROM pg_stat_activity WHERE backend_type = 'rag worker' AND datname = '{DB}'"


class HostileWatch(InItsOwnDatabase):
    DB = DB

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        psql(f"""
            DROP ROLE IF EXISTS hw_owner;
            CREATE ROLE hw_owner LOGIN IN ROLE rag_admin;
            CREATE SCHEMA hw AUTHORIZATION hw_owner;
            SET ROLE hw_owner;
            -- Lets a test end a stall it made, so that the table can be unwatched without waiting for it.
            CREATE TABLE hw.released (what text PRIMARY KEY);
            CREATE FUNCTION hw.stall(t text) RETURNS text LANGUAGE plpgsql AS $$
            BEGIN
                WHILE NOT EXISTS (SELECT 1 FROM hw.released r WHERE r.what = t) LOOP
                    BEGIN
                        PERFORM pg_sleep(0.2);
                    EXCEPTION WHEN query_canceled THEN NULL;
                    END;
                END LOOP;
                RETURN t;
            END $$;
            RESET ROLE;
            SELECT rag_create_collection('hw_other', embedding_model => 'hash-384');
        """, db=DB)

    @classmethod
    def tearDownClass(cls):
        psql("ALTER SYSTEM RESET rag.expression_timeout; SELECT pg_reload_conf()", db="postgres")
        super().tearDownClass()
        psql("DROP ROLE IF EXISTS hw_owner", db="postgres")

    def watch_with(self, table, expression, rows):
        """As hw_owner: a table hw.<table>, watched into a collection of its name with `expression` as content,
        and `rows` (SQL VALUES) inserted."""
        psql(f"""
            SET ROLE hw_owner;
            CREATE TABLE hw.{table} (id int PRIMARY KEY, body text);
            SELECT rag_create_collection('hw_{table}', embedding_model => 'hash-384');
            SELECT rag_watch('hw.{table}', 'hw_{table}', content => '{expression}');
            INSERT INTO hw.{table} VALUES {rows};
        """, db=DB)

    def worker_sleeps_in_owner_code(self):
        return wait_until(f"SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE backend_type = 'rag worker' "
                          f"AND datname = '{DB}' AND wait_event = 'PgSleep')", db=DB, seconds=30)

    def other_collection_serves(self, title, seconds):
        psql(f"SELECT rag_ingest('hw_other', '{title}', 'A document of another collection: {title}.')", db=DB)
        return wait_until(f"SELECT status = 'ready' FROM rag.documents WHERE title = '{title}'", db=DB, seconds=seconds)

    def test_a_settings_an_expression_makes_do_not_outlive_it(self):
        # The owner's expression puts their schema first on the session's path and names the worker's
        # application; their now() would make them superuser if the worker's next unqualified now() found it.
        psql("""
            SET ROLE hw_owner;
            CREATE TABLE hw.notes (id int PRIMARY KEY, body text);
            CREATE TABLE hw.log (what text);
            CREATE FUNCTION hw.now() RETURNS timestamptz LANGUAGE plpgsql VOLATILE AS $$
            BEGIN
                BEGIN
                    EXECUTE 'ALTER ROLE hw_owner SUPERUSER';
                    INSERT INTO hw.log VALUES ('became superuser');
                EXCEPTION WHEN OTHERS THEN NULL;
                END;
                RETURN pg_catalog.now();
            END $$;
            CREATE FUNCTION hw.mark(t text) RETURNS text LANGUAGE plpgsql AS $$
            BEGIN
                PERFORM pg_catalog.set_config('search_path', 'hw, pg_catalog', false);
                PERFORM pg_catalog.set_config('application_name', 'hw was here', false);
                PERFORM pg_catalog.set_config('lock_timeout', '1ms', false);
                PERFORM pg_catalog.pg_advisory_lock(4242, 4242);
                RETURN t;
            END $$;
            SELECT rag_create_collection('hw_notes', embedding_model => 'hash-384');
            SELECT rag_watch('hw.notes', 'hw_notes', content => 'hw.mark(body)');
            INSERT INTO hw.notes VALUES (1, 'The first note.'), (2, 'The second note.');
        """, db=DB)
        self.assertEqual(scalar("SELECT rag_wait('hw_notes', '60 seconds')", db=DB), "t")
        # The worker goes on through more steps, each of which would call now() unqualified.
        self.assertTrue(self.other_collection_serves("after the notes", 30))
        psql("SET ROLE hw_owner; INSERT INTO hw.notes VALUES (3, 'The third note.')", db=DB)
        self.assertEqual(scalar("SELECT rag_wait('hw_notes', '60 seconds')", db=DB), "t")
        self.assertEqual(scalar("SELECT rolsuper FROM pg_roles WHERE rolname = 'hw_owner'", db=DB), "f")
        self.assertEqual(scalar("SELECT count(*) FROM hw.log", db=DB), "0")
        self.assertEqual(scalar(f"SELECT count(*) FROM pg_stat_activity WHERE application_name = 'hw was here'",
                                db=DB), "0")
        # Nor a session-level advisory lock it took (the worker would hold it for as long as it runs).
        self.assertTrue(wait_until("SELECT NOT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' "
                                   "AND classid = 4242 AND objid = 4242)", db=DB, seconds=10))

    def test_b_an_expression_that_catches_its_cancel_does_not_hold_the_worker(self):
        psql("ALTER SYSTEM SET rag.expression_timeout = '1s'; SELECT pg_reload_conf()", db="postgres")
        time.sleep(0.5)
        self.watch_with("stuck", "hw.stall(body)", "(1, 'stall')")
        self.assertTrue(self.worker_sleeps_in_owner_code())
        # Past twice the timeout (at least 5 s more) the worker ends itself; another one serves the database.
        self.assertTrue(self.other_collection_serves("after the stall", 60))
        # Each worker that takes the row again ends the same way; from the second end on the row backs off,
        # with the reason where its owner looks.
        self.assertTrue(wait_until("SELECT coalesce(bool_or(last_error LIKE 'the worker stopped % times while syncing "
                                   "this row%'), false) FROM rag.row_queue", db=DB, seconds=90),
                        psql("SELECT attempts, claimed_by, not_before, last_error FROM rag.row_queue", db=DB))
        self.assertTrue(self.other_collection_serves("while the row backs off", 30))
        psql("SET ROLE hw_owner; INSERT INTO hw.released VALUES ('stall'); SELECT rag_unwatch('hw.stuck')", db=DB)
        psql("ALTER SYSTEM RESET rag.expression_timeout; SELECT pg_reload_conf()", db="postgres")

    def test_c_a_terminate_request_ends_the_worker_in_the_owners_code(self):
        # With the default timeout (30 s; the hard deadline a minute), only the terminate request ends it.
        self.watch_with("held", "hw.stall(body)", "(1, 'hold')")
        self.assertTrue(self.worker_sleeps_in_owner_code())
        held = scalar(WORKER + " AND wait_event = 'PgSleep'", db=DB)
        self.assertEqual(scalar(f"SELECT pg_terminate_backend({held})", db=DB), "t")
        self.assertTrue(wait_until(f"SELECT NOT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = {held})", db=DB,
                                   seconds=10), "the worker went on after pg_terminate_backend")
        psql("SET ROLE hw_owner; INSERT INTO hw.released VALUES ('hold'); SELECT rag_unwatch('hw.held')", db=DB)

    def test_d_watched_rows_and_documents_take_turns(self):
        psql("""
            SET ROLE hw_owner;
            CREATE FUNCTION hw.slowly(t text) RETURNS text LANGUAGE plpgsql AS $$
            BEGIN PERFORM pg_sleep(1); RETURN t; END $$;
        """, db=DB)
        self.watch_with("slow", "hw.slowly(body)",
                        ", ".join(f"({g}, 'slow row {g}')" for g in range(1, 21)))
        self.assertTrue(self.worker_sleeps_in_owner_code())
        started = time.time()
        self.assertTrue(self.other_collection_serves("between the slow rows", 30))
        waited = time.time() - started
        pending = int(scalar("SELECT count(*) FROM rag.row_queue", db=DB))
        # Served after about one row per worker, not after the twenty: rows were still queued when it was ready.
        self.assertGreater(pending, 5, f"the document waited {waited:.1f} s, until the rows were done")
        psql("SET ROLE hw_owner; SELECT rag_unwatch('hw.slow')", db=DB)

    def test_e_a_large_markup_row_is_converted_under_the_extraction_bounds(self):
        # The worker converted a watched row's Markdown in its own process whatever its size: a table owner's
        # 63 MB row took 2.3 GB and, under a memory limit, aborted the server, and the worker took the row up
        # again after every restart (red team 18). Past a megabyte it converts in a bounded child now: a line of
        # 60 million characters (read as a list of characters, four bytes each, beside the text and its
        # conversion) outgrows rag.extraction_memory at its least, and the row fails with the reason while the
        # worker and the other rows go on. (Short lines no longer do: they were a string each, now one buffer.)
        psql("ALTER SYSTEM SET rag.extraction_memory = 256; SELECT pg_reload_conf()", db="postgres")
        try:
            time.sleep(0.5)
            psql("""
                SET ROLE hw_owner;
                CREATE TABLE hw.pages (id int PRIMARY KEY, body text);
                SELECT rag_create_collection('hw_pages', embedding_model => 'hash-384');
                SELECT rag_watch('hw.pages', 'hw_pages', content => 'body', format => 'markdown');
                INSERT INTO hw.pages VALUES (1, repeat('a', 60000000));
            """, db=DB)
            pid = scalar(WORKER, db=DB)
            self.assertTrue(wait_until("SELECT last_error ~ 'memory' FROM rag.watch_status WHERE source = 'hw.pages'",
                                       db=DB, seconds=90),
                            repr(psql("SELECT * FROM rag.watch_status WHERE source = 'hw.pages'", db=DB)))
            psql("SET ROLE hw_owner; INSERT INTO hw.pages VALUES (2, E'# Small\\n\\nA small page.')", db=DB)
            self.assertTrue(wait_until("SELECT EXISTS (SELECT 1 FROM rag.documents WHERE source = 'hw.pages' "
                                       "AND source_key = '{\"id\": 2}' AND status = 'ready')", db=DB, seconds=30))
            self.assertEqual(scalar(WORKER, db=DB), pid, "the worker was replaced")
        finally:
            psql("ALTER SYSTEM RESET rag.extraction_memory; SELECT pg_reload_conf()", db="postgres")

    def test_f_a_row_larger_than_a_document_may_be_is_refused_and_its_error_is_bounded(self):
        # rag_ingest refuses a text over rag.max_document_size; a watched row did not: a 121 MB row became a
        # document of twice the limit, and a 206 MB one was put into one JSON value (an allocation of 1.7 GB,
        # failed at every retry, the worker at 1.4 GB each time). Now the row fails at once with the reason,
        # for good until it is written again, and nothing of the row's text is read past the limit. And an
        # expression's error of 10 MB was kept whole as the row's error: 2,000 chars are kept.
        psql("ALTER SYSTEM SET rag.max_document_size = '1MB'; SELECT pg_reload_conf()", db="postgres")
        try:
            time.sleep(0.5)
            psql("""
                SET ROLE hw_owner;
                CREATE TABLE hw.big (id int PRIMARY KEY, body text);
                CREATE FUNCTION hw.shout(t text) RETURNS text LANGUAGE plpgsql AS $$
                BEGIN
                    IF t = 'shout' THEN
                        RAISE EXCEPTION '%', repeat('E', 10 * 1024 * 1024);
                    END IF;
                    RETURN t;
                END $$;
                SELECT rag_create_collection('hw_big', embedding_model => 'hash-384');
                SELECT rag_watch('hw.big', 'hw_big', content => 'hw.shout(body)');
                INSERT INTO hw.big VALUES (1, repeat('lorem ipsum ', 200000)), (2, 'shout'), (3, 'A small row.');
            """, db=DB)
            self.assertTrue(wait_until("SELECT EXISTS (SELECT 1 FROM rag.documents WHERE source = 'hw.big' "
                                       "AND source_key = '{\"id\": 3}' AND status = 'ready')", db=DB, seconds=30))
            self.assertTrue(wait_until("SELECT count(*) = 2 FROM rag.row_queue q JOIN rag.watches w ON w.id = q.watch_id "
                                       "WHERE w.source_name = 'hw.big' AND q.last_error IS NOT NULL", db=DB, seconds=30))
            rows = psql("SELECT q.key ->> 'id', q.not_before = 'infinity', length(q.last_error), left(q.last_error, 60) "
                        "FROM rag.row_queue q JOIN rag.watches w ON w.id = q.watch_id "
                        "WHERE w.source_name = 'hw.big' ORDER BY 1", db=DB)
            self.assertEqual(rows[0], ["1", "t", rows[0][2],
                                       "the row's content is 2400000 bytes, above rag.max_document_s"])
            self.assertEqual((rows[1][0], rows[1][2]), ("2", "2000"))
            self.assertEqual(scalar("SELECT count(*) FROM rag.documents WHERE source = 'hw.big' "
                                    "AND source_key = '{\"id\": 1}'", db=DB), "0")
            # Under the limit once written again: indexed.
            psql("SET ROLE hw_owner; UPDATE hw.big SET body = 'Now a short row.' WHERE id = 1", db=DB)
            self.assertTrue(wait_until("SELECT EXISTS (SELECT 1 FROM rag.documents WHERE source = 'hw.big' "
                                       "AND source_key = '{\"id\": 1}' AND status = 'ready')", db=DB, seconds=30))
        finally:
            psql("ALTER SYSTEM RESET rag.max_document_size; SELECT pg_reload_conf()", db="postgres")

    def test_f2_a_rows_expressions_run_once(self):
        # Bounding the content by its size put the expression in three places of the row's query, and the
        # planner copied it into each: three calls a row, and an expression that fit rag.expression_timeout
        # failed. Counted by a function of the owner's that PostgreSQL believes immutable.
        psql("""
            SET ROLE hw_owner;
            CREATE SEQUENCE hw.calls;
            CREATE FUNCTION hw.counted(t text) RETURNS text LANGUAGE plpgsql IMMUTABLE AS $$
            BEGIN
                PERFORM nextval('hw.calls');
                RETURN t;
            END $$;
            CREATE TABLE hw.counted_rows (id int PRIMARY KEY, body text, heading text);
            SELECT rag_create_collection('hw_counted', embedding_model => 'hash-384');
            SELECT rag_watch('hw.counted_rows', 'hw_counted', content => 'hw.counted(body)',
                             title => 'hw.counted(heading)');
            INSERT INTO hw.counted_rows VALUES (1, 'A row whose expressions are counted.', 'Counted');
        """, db=DB)
        self.assertTrue(wait_until("SELECT EXISTS (SELECT 1 FROM rag.documents WHERE source = 'hw.counted_rows' "
                                   "AND status = 'ready')", db=DB, seconds=30))
        self.assertEqual(scalar("SELECT last_value FROM hw.calls", db=DB), "2")

    def test_f3_large_metadata_columns_are_measured_before_their_json_is_built(self):
        # The metadata's JSON was built whole before its 64 kB bound was checked: three 80 MB columns took a
        # worker to 2 GB. Their sizes are added up first now, and the row fails with them.
        psql("""
            SET ROLE hw_owner;
            CREATE TABLE hw.fat (id int PRIMARY KEY, body text, m1 text, m2 text);
            SELECT rag_create_collection('hw_fat', embedding_model => 'hash-384');
            SELECT rag_watch('hw.fat', 'hw_fat', content => 'body', metadata => ARRAY['m1', 'm2']);
            INSERT INTO hw.fat VALUES (1, 'A small body.', repeat('a', 40000), repeat('b', 40000)),
                                      (2, 'Another small body.', 'x', 'y');
        """, db=DB)
        self.assertTrue(wait_until("SELECT EXISTS (SELECT 1 FROM rag.documents WHERE source = 'hw.fat' "
                                   "AND source_key = '{\"id\": 2}' AND status = 'ready')", db=DB, seconds=30))
        self.assertTrue(wait_until("SELECT EXISTS (SELECT 1 FROM rag.row_queue q JOIN rag.watches w ON w.id = q.watch_id "
                                   "WHERE w.source_name = 'hw.fat' AND q.last_error IS NOT NULL)", db=DB, seconds=30))
        self.assertEqual(scalar("SELECT q.last_error FROM rag.row_queue q JOIN rag.watches w ON w.id = q.watch_id "
                                "WHERE w.source_name = 'hw.fat'", db=DB),
                         "the row's metadata takes 80000 bytes or more as JSON, above the 65536 a document's metadata may be")

    def test_g_a_watch_of_many_metadata_columns_indexes_its_rows(self):
        # jsonb_build_object takes at most 100 arguments: a watch of 51 metadata columns was accepted and then
        # failed on every row.
        columns = ", ".join(f"m{i} int DEFAULT {i}" for i in range(60))
        names = ", ".join(f"'m{i}'" for i in range(60))
        psql(f"""
            SET ROLE hw_owner;
            CREATE TABLE hw.wide (id int PRIMARY KEY, body text, {columns});
            SELECT rag_create_collection('hw_wide', embedding_model => 'hash-384');
            SELECT rag_watch('hw.wide', 'hw_wide', content => 'body', metadata => ARRAY[{names}]);
            INSERT INTO hw.wide (id, body) VALUES (1, 'A row of a wide table.');
        """, db=DB)
        self.assertTrue(wait_until("SELECT EXISTS (SELECT 1 FROM rag.documents WHERE source = 'hw.wide' "
                                   "AND status = 'ready')", db=DB, seconds=30),
                        repr(psql("SELECT * FROM rag.watch_status WHERE source = 'hw.wide'", db=DB)))
        self.assertEqual(scalar("SELECT (metadata ->> 'm0') || ',' || (metadata ->> 'm59') FROM rag.documents "
                                "WHERE source = 'hw.wide'", db=DB), "0,59")
