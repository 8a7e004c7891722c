"""Commands that need a database to themselves succeed although a rag worker is connected to it: DROP DATABASE
(no FORCE), ALTER DATABASE ... RENAME TO, CREATE DATABASE ... TEMPLATE. Test runners drop and recreate their
databases all the time; an extension's worker must not make that fail with "being accessed by other users"."""
import os
import time
import unittest

from support import drop_database, psql, scalar, wait_until


def worker_connected(db, seconds=30):
    deadline = time.time() + seconds
    while time.time() < deadline:
        if scalar(f"SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'rag worker' AND datname = '{db}'",
                  db="postgres") != "0":
            return True
        time.sleep(0.2)
    return False


def served(db, seconds=60):
    """A new document reaches 'ready': the database has a working worker again."""
    psql("SELECT rag_ingest('c', 'probe', 'A probe document ' || clock_timestamp())", db=db)
    return scalar(f"SELECT rag_wait('c', '{seconds} seconds')", db=db) == "t"


def make_database(name):
    drop_database(name)
    psql(f"CREATE DATABASE {name}", db="postgres")
    psql("CREATE EXTENSION rag CASCADE; SELECT rag_create_collection('c', embedding_model => 'hash-384');", db=name)
    if not served(name):
        raise AssertionError(f"{name} was not served")
    if not worker_connected(name):
        raise AssertionError(f"no worker connected to {name}")


class DatabaseCommands(unittest.TestCase):
    def test_a_new_database_is_left_alone_while_it_is_set_up(self):
        # A probe connecting while the creator loads and vacuums the database kept VACUUM from marking the rows
        # all-visible (PostgreSQL's own regression suite then chose other plans). Watched from one session,
        # every 10 ms for 6 s: the launcher, at a 2 s naptime, used to probe within that.
        psql("DROP DATABASE IF EXISTS rag_e2e_fresh WITH (FORCE)", db="postgres")
        psql("CREATE DATABASE rag_e2e_fresh", db="postgres")
        try:
            _, _, stderr = psql("""
                DO $$
                DECLARE
                    v_seen integer := 0;
                BEGIN
                    FOR i IN 1..600 LOOP
                        PERFORM pg_stat_clear_snapshot();
                        v_seen := v_seen + (SELECT count(*) FROM pg_stat_activity
                                             WHERE backend_type = 'rag worker' AND datname = 'rag_e2e_fresh');
                        PERFORM pg_sleep(0.01);
                    END LOOP;
                    RAISE NOTICE 'rag workers seen: %', v_seen;
                END $$;""", db="postgres", check=False)
            self.assertIn("rag workers seen: 0", stderr)
            # A backend that asks is served at once.
            psql("CREATE EXTENSION rag CASCADE", db="rag_e2e_fresh")
            self.assertTrue(worker_connected("rag_e2e_fresh", seconds=15))
        finally:
            psql("DROP DATABASE IF EXISTS rag_e2e_fresh WITH (FORCE)", db="postgres")

    def test_drop_database_without_force(self):
        make_database("rag_e2e_drop")
        code, _, stderr = psql("DROP DATABASE rag_e2e_drop", db="postgres", check=False)
        self.assertEqual(code, 0, stderr)
        self.assertEqual(scalar("SELECT count(*) FROM pg_database WHERE datname = 'rag_e2e_drop'", db="postgres"), "0")

    def test_a_caller_who_may_not_drop_it_does_not_stop_the_workers(self):
        make_database("rag_e2e_not_yours")
        psql("DROP ROLE IF EXISTS rag_e2e_stranger; CREATE ROLE rag_e2e_stranger LOGIN", db="postgres")
        before = scalar("SELECT string_agg(pid::text, ',' ORDER BY pid) FROM pg_stat_activity "
                        "WHERE backend_type = 'rag worker' AND datname = 'rag_e2e_not_yours'", db="postgres")
        code, _, stderr = psql("SET ROLE rag_e2e_stranger;\nDROP DATABASE rag_e2e_not_yours;", db="postgres", check=False)
        self.assertNotEqual(code, 0)
        self.assertIn("must be owner", stderr)
        time.sleep(1)
        after = scalar("SELECT string_agg(pid::text, ',' ORDER BY pid) FROM pg_stat_activity "
                       "WHERE backend_type = 'rag worker' AND datname = 'rag_e2e_not_yours'", db="postgres")
        self.assertEqual(before, after, "the same workers keep serving the database")
        self.assertTrue(served("rag_e2e_not_yours", seconds=5))
        psql("DROP DATABASE rag_e2e_not_yours", db="postgres")
        psql("DROP ROLE rag_e2e_stranger", db="postgres")

    def test_a_schema_named_rag_in_a_database_without_rag_is_never_called(self):
        """rag's utility hook and its COPY path call rag's own functions by name without a privilege check, as
        PostgreSQL calls a trigger's function. In a database without the extension, anyone with CREATE on it
        can make a schema named rag holding functions of those names: they are not the extension's and must
        never run, least of all as the superuser who runs REASSIGN OWNED / DROP OWNED / DROP ROLE in every
        database to retire a role, as PostgreSQL's documentation says to."""
        db = "rag_e2e_spoof"
        drop_database(db)
        psql(f"CREATE DATABASE {db}", db="postgres")
        psql("DROP ROLE IF EXISTS rag_e2e_spoofer; CREATE ROLE rag_e2e_spoofer;"
             "DROP ROLE IF EXISTS rag_e2e_retired; CREATE ROLE rag_e2e_retired;", db="postgres")
        try:
            psql(f"""
                GRANT CREATE ON DATABASE {db} TO rag_e2e_spoofer;
                SET ROLE rag_e2e_spoofer;
                CREATE SCHEMA rag;
                CREATE TABLE rag.calls (who name, function text);
                GRANT INSERT ON rag.calls TO PUBLIC;
                CREATE FUNCTION rag._drop_owned(oid[]) RETURNS void LANGUAGE sql
                    AS $$ INSERT INTO rag.calls VALUES (current_user, '_drop_owned') $$;
                CREATE FUNCTION rag._reassign_owned(oid[], oid[]) RETURNS void LANGUAGE sql
                    AS $$ INSERT INTO rag.calls VALUES (current_user, '_reassign_owned') $$;
                CREATE FUNCTION rag._refuse_drop_role(oid[], text[]) RETURNS void LANGUAGE sql
                    AS $$ INSERT INTO rag.calls VALUES (current_user, '_refuse_drop_role') $$;
                GRANT USAGE ON SCHEMA rag TO PUBLIC;
                RESET ROLE;
                REASSIGN OWNED BY rag_e2e_retired TO postgres;
                DROP OWNED BY rag_e2e_retired;
                DROP ROLE rag_e2e_retired;
            """, db=db)
            self.assertEqual(scalar("SELECT count(*) FROM rag.calls", db=db), "0")
        finally:
            drop_database(db)
            psql("DROP ROLE IF EXISTS rag_e2e_retired; DROP ROLE IF EXISTS rag_e2e_spoofer;", db="postgres")

    def test_rename_then_the_worker_comes_back(self):
        make_database("rag_e2e_rename_a")
        psql("DROP DATABASE IF EXISTS rag_e2e_rename_b WITH (FORCE)", db="postgres")
        code, _, stderr = psql("ALTER DATABASE rag_e2e_rename_a RENAME TO rag_e2e_rename_b", db="postgres", check=False)
        self.assertEqual(code, 0, stderr)
        # The pause ends after 10 seconds; then the launcher serves the database under its new name.
        self.assertTrue(served("rag_e2e_rename_b", seconds=60))
        psql("DROP DATABASE rag_e2e_rename_b", db="postgres")

    def test_create_database_from_a_template_in_use(self):
        make_database("rag_e2e_template")
        psql("DROP DATABASE IF EXISTS rag_e2e_copy WITH (FORCE)", db="postgres")
        code, _, stderr = psql("CREATE DATABASE rag_e2e_copy TEMPLATE rag_e2e_template", db="postgres", check=False)
        self.assertEqual(code, 0, stderr)
        self.assertTrue(served("rag_e2e_copy", seconds=60))
        self.assertTrue(served("rag_e2e_template", seconds=60))
        psql("DROP DATABASE rag_e2e_copy", db="postgres")
        psql("DROP DATABASE rag_e2e_template", db="postgres")

    def test_fewer_workers_per_database_after_a_reload(self):
        # Lowering rag.workers_per_database takes effect without a restart: the surplus worker leaves when idle.
        def workers(db):
            return int(scalar(f"SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'rag worker' "
                              f"AND datname = '{db}'", db="postgres"))

        def until(predicate, seconds=60):
            deadline = time.time() + seconds
            while time.time() < deadline:
                if predicate():
                    return True
                time.sleep(0.2)
            return False

        psql("ALTER SYSTEM SET rag.workers_per_database = 2;\nSELECT pg_reload_conf();", db="postgres")
        try:
            make_database("rag_e2e_fewer")
            self.assertTrue(until(lambda: workers("rag_e2e_fewer") == 2), "the second worker never started")
            psql("ALTER SYSTEM SET rag.workers_per_database = 1;\nSELECT pg_reload_conf();", db="postgres")
            self.assertTrue(until(lambda: workers("rag_e2e_fewer") == 1), "two workers still run")
            # It stays one, and that one still serves the database.
            time.sleep(3)
            self.assertEqual(workers("rag_e2e_fewer"), 1)
            self.assertTrue(served("rag_e2e_fewer"))
        finally:
            psql("ALTER SYSTEM RESET rag.workers_per_database;\nSELECT pg_reload_conf();", db="postgres")
            psql("DROP DATABASE IF EXISTS rag_e2e_fewer WITH (FORCE)", db="postgres")

    def test_drop_while_the_local_model_embeds_a_large_batch(self):
        # One batch of ~300 chunks takes the in-process model many seconds; the worker must stop between
        # forward passes, within PostgreSQL's 5-second wait, instead of finishing the batch first.
        psql("ALTER SYSTEM SET rag.batch_size = 1024;\nSELECT pg_reload_conf();", db="postgres")
        try:
            make_database("rag_e2e_busy")
            psql("SELECT rag_create_collection('big', embedding_provider => 'local')", db="rag_e2e_busy")
            psql("SELECT rag_ingest('big', 'long', string_agg(format('Paragraph %s describes how table number %s "
                 "is vacuumed, analysed, indexed and backed up, with the settings that govern each step and "
                 "the views that report on it, so that an administrator can check every one of them. Section %s "
                 "adds the monitoring queries for replication lag, lock waits and checkpoints on server %s.', "
                 "g, g, g, g), E'\\n\\n')) FROM generate_series(1, 300) g", db="rag_e2e_busy")
            deadline = time.time() + 60
            while time.time() < deadline:
                if scalar("SELECT chunks_total > 100 FROM rag.documents WHERE title = 'long'", db="rag_e2e_busy") == "t":
                    break
                time.sleep(0.2)
            time.sleep(1.5)
            embedded = scalar("SELECT chunks_embedded FROM rag.documents WHERE title = 'long'", db="rag_e2e_busy")
            self.assertEqual(embedded, "0", "the batch should still be running")
            started = time.time()
            code, _, stderr = psql("DROP DATABASE rag_e2e_busy", db="postgres", check=False)
            self.assertEqual(code, 0, stderr)
            self.assertLess(time.time() - started, 6)
        finally:
            psql("ALTER SYSTEM RESET rag.batch_size;\nSELECT pg_reload_conf();", db="postgres")

    def test_another_database_drops_while_a_worker_waits_for_a_slow_provider(self):
        # DROP DATABASE waits until every process of the cluster has closed the dropped database's files (a
        # ProcSignalBarrier). A worker waiting 30 s for a provider's answer must answer that wait meanwhile,
        # or dropping any database, one without rag among them, waits for the provider.
        make_database("rag_e2e_waiting")
        try:
            # Longer than the provider takes (the tests' server setting is 10 s): the answer comes, after 30 s.
            psql("ALTER SYSTEM SET rag.http_timeout = '60s';\nSELECT pg_reload_conf();", db="postgres")
            time.sleep(0.5)
            psql("SELECT rag_create_collection('slow', embedding_model => 'hash-384@slow30000')", db="rag_e2e_waiting")
            psql("SELECT rag_ingest('slow', 'slow', 'A document whose provider answers after half a minute.')",
                 db="rag_e2e_waiting")
            deadline = time.time() + 30
            while time.time() < deadline and scalar(
                    "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'rag worker' "
                    "AND datname = 'rag_e2e_waiting' AND state = 'active'", db="postgres") == "0":
                time.sleep(0.2)
            time.sleep(1)
            drop_database("rag_e2e_plain")
            psql("CREATE DATABASE rag_e2e_plain", db="postgres")
            psql("DROP DATABASE rag_e2e_plain", db="postgres")
            # Dropped while the provider still had not answered: the document is not embedded yet (without the
            # barrier answered, the drop waited for the answer, and the document was ready by then).
            self.assertEqual(scalar("SELECT status FROM rag.documents WHERE title = 'slow'", db="rag_e2e_waiting"),
                             "processing")
        finally:
            psql("ALTER SYSTEM RESET rag.http_timeout;\nSELECT pg_reload_conf();", db="postgres")
            psql("DROP DATABASE IF EXISTS rag_e2e_waiting WITH (FORCE)", db="postgres")

    def test_a_database_owners_defaults_do_not_reach_the_worker(self):
        # ALTER DATABASE ... SET applies to every session that connects, the workers' too (they run as the
        # bootstrap superuser): a database owner's role, read-only default or timeouts must not stop them.
        make_database("rag_e2e_defaults")
        try:
            psql("DROP ROLE IF EXISTS rag_e2e_nobody; CREATE ROLE rag_e2e_nobody", db="postgres")
            # session_authorization too (a database's owner may set it; red team 13 F2): the worker had run as
            # that role from then on, refused at rag's schema every time.
            psql("ALTER DATABASE rag_e2e_defaults SET role = 'rag_e2e_nobody';"
                 "ALTER DATABASE rag_e2e_defaults SET session_authorization = 'rag_e2e_nobody';"
                 "ALTER DATABASE rag_e2e_defaults SET default_transaction_read_only = on;"
                 "ALTER DATABASE rag_e2e_defaults SET statement_timeout = '1ms';"
                 # Red team 14: every ERROR the worker catches became a FATAL, and a row or document that failed
                 # was counted as one that kept stopping its worker.
                 "ALTER DATABASE rag_e2e_defaults SET exit_on_error = on;"
                 # Any other default the database's owner may set reaches no further than their own sessions: the
                 # worker runs with the server's configuration (a watch expression below reads it).
                 "ALTER DATABASE rag_e2e_defaults SET DateStyle = 'SQL, DMY';"
                 # PL/pgSQL's own, which exist only once it is loaded (a placeholder until then).
                 "ALTER DATABASE rag_e2e_defaults SET plpgsql.variable_conflict = 'use_column';", db="postgres")
            # This test's own sessions undo the defaults at connection (a client's options beat a database's
            # settings), not with SET: the first SETs ran under the 1 ms statement_timeout and exit_on_error, and a
            # timeout that fired as one of them ended left a pending cancel that ended the session (FATAL
            # "canceling statement due to user request", seen once in CI on PostgreSQL 18).
            options = "-c statement_timeout=0 -c exit_on_error=off -c default_transaction_read_only=off"
            session = "SET SESSION AUTHORIZATION DEFAULT; SET ROLE NONE;\n"
            if int(scalar("SHOW server_version_num", db="postgres")) >= 170000:
                # PostgreSQL 17's transaction_timeout ends the whole session (FATAL), a worker's too.
                psql("ALTER DATABASE rag_e2e_defaults SET transaction_timeout = '1ms'", db="postgres")
                options += " -c transaction_timeout=0"
            os.environ["PGOPTIONS"] = options
            # The worker connected before the defaults: a new one connects with them.
            psql("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                 "WHERE backend_type = 'rag worker' AND datname = 'rag_e2e_defaults'", db="postgres")
            time.sleep(1)
            self.assertTrue(worker_connected("rag_e2e_defaults"))
            psql(session + "SELECT rag_ingest('c', 'defaults', 'Indexed although the database says read-only.')",
                 db="rag_e2e_defaults")
            self.assertEqual(psql(session + "SELECT rag_wait('c', '60 seconds')", db="rag_e2e_defaults"), [["t"]])
            self.assertEqual(psql(session + "SELECT status FROM rag.documents WHERE title = 'defaults'",
                                  db="rag_e2e_defaults"), [["ready"]])
            psql(session + "CREATE TABLE styles (id int PRIMARY KEY); INSERT INTO styles VALUES (1); "
                 "SELECT rag_watch('styles', 'c', content => 'pg_catalog.current_setting(''DateStyle'')')",
                 db="rag_e2e_defaults")
            self.assertEqual(psql(session + "SELECT rag_wait('c', '60 seconds')", db="rag_e2e_defaults"), [["t"]])
            self.assertEqual(psql(session + "SELECT body FROM rag.documents WHERE source = 'styles'",
                                  db="rag_e2e_defaults"), [["ISO, MDY"]])
            psql(session + "CREATE TABLE conflicts (id int PRIMARY KEY); INSERT INTO conflicts VALUES (1); "
                 "SELECT rag_watch('conflicts', 'c', "
                 "content => 'pg_catalog.current_setting(''plpgsql.variable_conflict'')')", db="rag_e2e_defaults")
            self.assertEqual(psql(session + "SELECT rag_wait('c', '60 seconds')", db="rag_e2e_defaults"), [["t"]])
            self.assertEqual(psql(session + "SELECT body FROM rag.documents WHERE source = 'conflicts'",
                                  db="rag_e2e_defaults"), [["error"]])
            # A watched row whose expression fails is failed with its reason, the worker going on.
            psql(session + "CREATE TABLE divided (id int PRIMARY KEY, n int); INSERT INTO divided VALUES (1, 0); "
                 "SELECT rag_watch('divided', 'c', content => '(100 / n)::text')", db="rag_e2e_defaults")
            self.assertTrue(wait_until(session.strip() + " SELECT last_error LIKE '%division by zero%' "
                                          "FROM rag.watch_status WHERE source = 'divided'",
                                          db="rag_e2e_defaults", seconds=30),
                            repr(psql(session + "SELECT * FROM rag.watch_status", db="rag_e2e_defaults")))
            pid = scalar("SELECT pid FROM pg_stat_activity WHERE backend_type = 'rag worker' "
                         "AND datname = 'rag_e2e_defaults'", db="postgres")
            psql(session + "SELECT rag_ingest('c', 'after', 'Indexed after a watched row failed.')", db="rag_e2e_defaults")
            self.assertEqual(psql(session + "SELECT rag_wait('c', '60 seconds')", db="rag_e2e_defaults"), [["t"]])
            self.assertEqual(scalar("SELECT pid FROM pg_stat_activity WHERE backend_type = 'rag worker' "
                                    "AND datname = 'rag_e2e_defaults'", db="postgres"), pid,
                             "the worker was replaced: a caught error ended it")
        finally:
            os.environ.pop("PGOPTIONS", None)
            psql("DROP DATABASE IF EXISTS rag_e2e_defaults WITH (FORCE)", db="postgres")
            psql("DROP ROLE IF EXISTS rag_e2e_nobody", db="postgres")

    def test_rag_roles_someone_else_controls_stop_the_install(self):
        # A CREATEROLE role that made rag_reader, rag_writer and rag_admin before rag's first install kept ADMIN
        # OPTION on them (PostgreSQL 16+), which the install adopted: it could grant itself rag_admin (red team
        # 14). The state is made here by a superuser's grant, as on PostgreSQL 15, where CREATEROLE alone does it.
        psql("DROP ROLE IF EXISTS rag_e2e_hr; CREATE ROLE rag_e2e_hr LOGIN CREATEROLE; "
             "GRANT rag_admin TO rag_e2e_hr WITH ADMIN OPTION", db="postgres")
        drop_database("rag_e2e_roles")
        psql("CREATE DATABASE rag_e2e_roles", db="postgres")
        try:
            status, _, err = psql("CREATE EXTENSION rag CASCADE", db="rag_e2e_roles", check=False)
            self.assertNotEqual(status, 0)
            self.assertIn("role rag_e2e_hr may grant rag_admin to anyone (ADMIN OPTION) and is not a superuser", err)
            psql("REVOKE ADMIN OPTION FOR rag_admin FROM rag_e2e_hr; ALTER ROLE rag_reader LOGIN", db="postgres")
            status, _, err = psql("CREATE EXTENSION rag CASCADE", db="rag_e2e_roles", check=False)
            self.assertNotEqual(status, 0)
            self.assertIn("role rag_reader exists with attributes rag does not give it", err)
            psql("ALTER ROLE rag_reader NOLOGIN", db="postgres")
            psql("CREATE EXTENSION rag CASCADE", db="rag_e2e_roles")
        finally:
            psql("ALTER ROLE rag_reader NOLOGIN; REVOKE rag_admin FROM rag_e2e_hr", db="postgres")
            drop_database("rag_e2e_roles")
            psql("DROP ROLE IF EXISTS rag_e2e_hr", db="postgres")

    def test_a_role_that_may_create_databases_copies_a_template_in_use(self):
        # A database marked as a template may be copied by any role with CREATEDB, not only by its owner: the
        # worker connected to it must make way for that role's CREATE DATABASE too.
        make_database("rag_e2e_template")
        try:
            psql("DROP ROLE IF EXISTS rag_e2e_creator; CREATE ROLE rag_e2e_creator CREATEDB;"
                 "ALTER DATABASE rag_e2e_template IS_TEMPLATE true;", db="postgres")
            self.assertTrue(worker_connected("rag_e2e_template"))
            drop_database("rag_e2e_copied")
            code, _, stderr = psql("SET ROLE rag_e2e_creator;\nCREATE DATABASE rag_e2e_copied TEMPLATE rag_e2e_template;",
                                   db="postgres", check=False)
            self.assertEqual(code, 0, stderr)
            self.assertEqual(scalar("SELECT count(*) FROM rag.collections WHERE name = 'c'", db="rag_e2e_copied"), "1")
        finally:
            psql("ALTER DATABASE rag_e2e_template IS_TEMPLATE false", db="postgres")
            psql("DROP DATABASE IF EXISTS rag_e2e_copied WITH (FORCE)", db="postgres")
            psql("DROP DATABASE IF EXISTS rag_e2e_template WITH (FORCE)", db="postgres")
            psql("DROP ROLE IF EXISTS rag_e2e_creator", db="postgres")

    def test_drop_if_exists_of_a_missing_database_by_a_role_that_may_create_databases(self):
        # The hook asks who may hold the workers off only of a database that exists: PostgreSQL's ownership
        # check raises for one that does not, which turned this NOTICE into an error.
        psql("DROP ROLE IF EXISTS rag_e2e_dropper; CREATE ROLE rag_e2e_dropper CREATEDB", db="postgres")
        try:
            code, _, stderr = psql("SET ROLE rag_e2e_dropper;\nDROP DATABASE IF EXISTS rag_e2e_never_made;",
                                   db="postgres", check=False)
            self.assertEqual(code, 0, stderr)
            self.assertIn("does not exist, skipping", stderr)
        finally:
            psql("DROP ROLE IF EXISTS rag_e2e_dropper", db="postgres")

    def test_rag_in_a_schema_a_superuser_owns(self):
        # README, Backups, "Where rag lives": public belongs to the database's owner, so rag may be created in a
        # superuser's schema instead; collections, a reader's search and answer, and a watch work from there.
        drop_database("rag_e2e_ext")
        psql("CREATE DATABASE rag_e2e_ext", db="postgres")
        try:
            psql("CREATE SCHEMA ext; GRANT USAGE ON SCHEMA ext TO PUBLIC;"
                 "CREATE EXTENSION vector SCHEMA ext; CREATE EXTENSION rag SCHEMA ext;"
                 "ALTER DATABASE rag_e2e_ext SET search_path = \"$user\", public, ext;"
                 "DROP ROLE IF EXISTS rag_e2e_ext_reader; CREATE ROLE rag_e2e_ext_reader IN ROLE rag_reader;",
                 db="rag_e2e_ext")
            self.assertEqual(scalar("SELECT extnamespace::regnamespace FROM pg_extension WHERE extname = 'rag'",
                                    db="rag_e2e_ext"), "ext")
            psql("SELECT rag_create_collection('kb', embedding_model => 'hash-384', max_distance => 2);"
                 "SELECT rag_grant('kb', 'rag_e2e_ext_reader', 'read');"
                 "SELECT rag_ingest('kb', 'Notice', 'Staff must give thirty days notice in writing.');"
                 "CREATE TABLE public.pages (id int PRIMARY KEY, body text);"
                 "INSERT INTO public.pages VALUES (1, 'Lunch is served at noon in the canteen.');"
                 "SELECT rag_watch('public.pages', 'kb', content => 'body');", db="rag_e2e_ext")
            self.assertEqual(scalar("SELECT rag_wait('kb', '60 seconds')", db="rag_e2e_ext"), "t")
            self.assertEqual(psql("SET ROLE rag_e2e_ext_reader;\n"
                                  "SELECT title FROM rag_query('kb', 'how much notice must staff give', 1);",
                                  db="rag_e2e_ext"), [["Notice"]])
            self.assertEqual(psql("SET ROLE rag_e2e_ext_reader;\n"
                                  "SELECT outcome FROM rag_ask('kb', 'How much notice must staff give?');",
                                  db="rag_e2e_ext"), [["answered"]])
            self.assertEqual(psql("SELECT content FROM rag_query('kb', 'when is lunch served', 1)", db="rag_e2e_ext"),
                             [["Lunch is served at noon in the canteen."]])
        finally:
            drop_database("rag_e2e_ext")
            psql("DROP ROLE IF EXISTS rag_e2e_ext_reader", db="postgres")


if __name__ == "__main__":
    unittest.main()
