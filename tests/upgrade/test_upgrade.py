"""The upgrade from the previous release, as a DBA does it: the old package is installed, a database uses it,
the new package replaces the files, the server restarts, and `ALTER EXTENSION rag UPDATE` brings the SQL up.

scripts/lib/upgrade.sh drives it in two phases against one cluster:
  python3 test_upgrade.py fill     with the previous release's library and SQL: makes data of every kind;
  python3 -m unittest test_upgrade with this release's library installed and the server restarted.
The second phase compares the upgraded catalog with a fresh install of this release (tests/upgrade/catalog.sql)
and checks that every row made before the upgrade is still there and still works."""
import json
import os
import re
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "e2e"))
from support import psql, scalar, wait_until  # noqa: E402

DB = "rag_upgrade"
FRESH = "rag_upgrade_fresh"
HERE = os.path.dirname(os.path.abspath(__file__))
STATE = os.path.join(os.environ.get("WORK", "/tmp"), "upgrade-before.json")
OLD_DUMP = os.path.join(os.environ.get("WORK", "/tmp"), "upgrade-before.dump")
# That backup restored under the previous release, with and without owners, then updated in place (the
# previous release's README said so for its backups); the options, and who writes to its tables.
# Writes to the dump's watched tables (a filtered one among them, whose filter notes who ran it), and how many
# times a superuser ran that filter.
WRITES_TO_THE_DUMPS_TABLES = """
    INSERT INTO drafts VALUES (3, 'Published: the reading room is upstairs.'), (4, 'draft: no');
    UPDATE drafts SET body = body || ' Ask at the desk.' WHERE id = 3;
    DELETE FROM drafts WHERE id = 4;
    INSERT INTO pages VALUES (3, 'Lockers are by the stairs.');
    UPDATE pages SET body = 'Parking is free for staff and visitors.' WHERE id = 1;
    DELETE FROM pages WHERE id = 2;
"""
SUPERUSER_GATE_CALLS = "SELECT count(*) FROM gate_calls WHERE superuser"
RESTORED_UNDER_OLD = {"rag_upgrade_restored_old": (["--no-owner"], ""),
                      "rag_upgrade_restored_old_owned": ([], "SET ROLE rag_upgrade_editor;")}

# What a user made, compared before and after the upgrade: only columns both releases have, and only rows that
# existed before (ids up to the highest then; work done after the upgrade adds rows).
FINGERPRINTS = {
    "collections": "SELECT string_agg(format('%s|%s|%s|%s|%s', id, name, embedding_model, dimensions, index_name), ',' ORDER BY id) FROM rag.collections",
    "documents": "SELECT string_agg(format('%s|%s|%s|%s|%s|%s', id, title, md5(body), metadata, watch_id, source_key), ',' ORDER BY id) FROM rag.documents WHERE id <= {documents}",
    "ready documents": "SELECT string_agg(id::text, ',' ORDER BY id) FROM rag.documents WHERE status = 'ready' AND id <= {documents}",
    "chunks": "SELECT count(*) || '|' || md5(string_agg(id || content || coalesce(embedding::text, ''), ',' ORDER BY id)) FROM rag.chunks WHERE id <= {chunks} AND embedding IS NOT NULL",
    "watches": "SELECT string_agg(format('%s|%s|%s|%s', id, source::regclass, content_expr, collection_id), ',' ORDER BY id) FROM rag.watches",
    "providers": "SELECT string_agg(format('%s|%s|%s', name, kind, base_url), ',' ORDER BY name) FROM rag.providers",
    "prices": "SELECT string_agg(format('%s|%s', model, input_usd_per_million), ',' ORDER BY model) FROM rag.prices",
    "conversations": "SELECT string_agg(format('%s|%s', id, owner), ',' ORDER BY id) FROM rag.conversations",
    "messages": "SELECT string_agg(format('%s|%s|%s', id, role, md5(content)), ',' ORDER BY id) FROM rag.messages WHERE id <= {messages}",
    "queries": "SELECT string_agg(format('%s|%s|%s|%s', id, kind, outcome, md5(question)), ',' ORDER BY id) FROM rag.queries WHERE id <= {queries}",
}
LIMITS = ("documents", "chunks", "messages", "queries")


def fingerprint(db, limits):
    return {table: scalar(sql.format(**limits), db=db) for table, sql in FINGERPRINTS.items()}


def catalog(db):
    with open(os.path.join(HERE, "catalog.sql")) as f:
        return ["\t".join(row) for row in psql(f.read(), db=db)]


def fill():
    """Phase one, run against the previous release: data of every kind the previous release could make."""
    psql(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)", db="postgres")
    psql(f"CREATE DATABASE {DB}", db="postgres")
    psql("""
        CREATE EXTENSION rag CASCADE;
        DROP ROLE IF EXISTS rag_upgrade_reader;
        DROP ROLE IF EXISTS rag_upgrade_editor;
        CREATE ROLE rag_upgrade_reader LOGIN IN ROLE rag_reader;
        CREATE ROLE rag_upgrade_editor LOGIN IN ROLE rag_admin;
        DROP ROLE IF EXISTS rag_upgrade_app;
        -- Granted one function by hand, outside rag's roles.
        CREATE ROLE rag_upgrade_app LOGIN;
        GRANT EXECUTE ON FUNCTION rag_watch_status() TO rag_upgrade_app;
        GRANT CREATE ON SCHEMA public TO rag_upgrade_editor;
        SELECT rag_create_collection('kb', embedding_model => 'hash-384', max_distance => 2);
        SELECT rag_ingest('kb', 'Notice', 'Staff must give thirty days notice in writing.', '{"department": "hr"}');
        SELECT rag_ingest('kb', 'Canteen', 'Lunch is served from noon until two.', '{"department": "facilities"}');
        SELECT rag_set_price('hash-384', 1.5, 0);
        SELECT rag_create_provider('elsewhere', 'openai', base_url => 'http://127.0.0.1:9/v1');
        SET ROLE rag_upgrade_editor;
        CREATE TABLE pages (id int PRIMARY KEY, body text);
        INSERT INTO pages VALUES (1, 'Parking is free for staff.'), (2, 'The office opens at eight.');
        SELECT rag_watch('pages', 'kb', content => 'body');
        -- Bound to rag_watch_status's oid, as views, rules and SQL-standard function bodies are.
        CREATE VIEW watched AS SELECT source, rows_watched FROM rag_watch_status();
        -- An expression calling a function of public by its bare name, as the previous release's search_path
        -- allowed: the update names the watch, which no longer evaluates.
        CREATE FUNCTION shout(t text) RETURNS text LANGUAGE sql IMMUTABLE AS $f$ SELECT upper(t) $f$;
        CREATE TABLE notices (id int PRIMARY KEY, body text);
        INSERT INTO notices VALUES (1, 'Fire drill on Friday.');
        SELECT rag_watch('notices', 'kb', content => 'shout(body)');
        -- A partitioned table, which 0.1.0 let be watched and never indexed (it read rows FROM ONLY the parent).
        CREATE TABLE events (id int PRIMARY KEY, body text) PARTITION BY RANGE (id);
        CREATE TABLE events_early PARTITION OF events FOR VALUES FROM (0) TO (100);
        INSERT INTO events VALUES (1, 'The quarterly review is in March.');
        SELECT rag_watch('events', 'kb', content => 'body');
        INSERT INTO events VALUES (2, 'The summer party is in July.');
        -- A partition watched under 0.1.0: rows written through its parent fire none of its statement triggers.
        CREATE TABLE shifts (id int PRIMARY KEY, body text) PARTITION BY RANGE (id);
        CREATE TABLE shifts_day PARTITION OF shifts FOR VALUES FROM (0) TO (100);
        INSERT INTO shifts_day VALUES (1, 'Parking permits are renewed in January.');
        SELECT rag_watch('shifts_day', 'kb', content => 'body');
        -- An index calling its owner's immutable function, which PostgreSQL folds whenever it plans a query on
        -- the table: the update once planned one as the owner to check the watch, and what that code created
        -- then became a member of rag (review of red team 13, F2).
        CREATE FUNCTION planned_check() RETURNS boolean LANGUAGE plpgsql IMMUTABLE AS $f$
            BEGIN RAISE WARNING 'planned_check ran as %', current_user; RETURN true; END $f$;
        CREATE TABLE planned (id int PRIMARY KEY, body text);
        CREATE INDEX planned_folded ON planned ((id > 0 AND public.planned_check()));
        INSERT INTO planned VALUES (1, 'A row of a table whose index calls its owner''s function.');
        SELECT rag_watch('planned', 'kb', content => 'body');
        -- A filter calling a function of the editor's, which records who ran it: the previous release's trigger
        -- bodies evaluate it with no check of who wrote it, and a dump of this database restored by a superuser
        -- without owners must not run it as that superuser (test_a_dump_of_the_previous_release_runs_no_filter).
        CREATE TABLE gate_calls (ran_as name, superuser boolean);
        GRANT INSERT ON gate_calls TO PUBLIC;
        CREATE FUNCTION gate(t text) RETURNS boolean LANGUAGE plpgsql AS $f$
            BEGIN
                INSERT INTO public.gate_calls SELECT current_user, r.rolsuper FROM pg_catalog.pg_roles r
                 WHERE r.rolname = current_user;
                RETURN t NOT LIKE 'draft%';
            END $f$;
        CREATE TABLE drafts (id int PRIMARY KEY, body text);
        INSERT INTO drafts VALUES (1, 'Published: the library opens at nine.'), (2, 'draft: the library may close.');
        SELECT rag_watch('drafts', 'kb', content => 'body', filter => 'public.gate(body)');
        RESET ROLE;
    """, db=DB)
    assert wait_until("SELECT NOT EXISTS (SELECT 1 FROM rag.documents WHERE status <> 'ready') "
                      "AND (SELECT count(*) FROM rag.documents) = 8 AND NOT EXISTS (SELECT 1 FROM rag.row_queue) "
                      "AND NOT EXISTS (SELECT 1 FROM rag.row_batches)", DB), \
        "the previous release did not embed the documents"
    psql("""
        SELECT rag_conversation_start('kb') AS c \\gset
        SELECT outcome FROM rag_ask('kb', 'How much notice do I give?', conversation => :c);
        SELECT count(*) FROM rag_query('kb', 'when is lunch');
        -- Work still pending at upgrade time: a document whose turn comes in an hour.
        BEGIN;
        SELECT rag_create_collection('later', embedding_model => 'hash-384');
        SELECT rag_ingest('later', 'Pending', 'This document was still waiting when the package was upgraded.');
        UPDATE rag.queue SET not_before = now() + interval '1 hour';
        COMMIT;
    """, db=DB)
    # A backup taken under the previous release, restored by the second phase into this release.
    dump = subprocess.run(["pg_dump", "-Fc", "-f", OLD_DUMP, DB], capture_output=True, text=True, timeout=300)
    assert dump.returncode == 0, dump.stderr
    # Restored under the previous release, where a table watched afterwards takes the id of a watch whose
    # triggers the dump brought back (pages', id 1): 0.1.0 replaces the function those triggers run.
    for target, (options, writer) in RESTORED_UNDER_OLD.items():
        psql(f"DROP DATABASE IF EXISTS {target} WITH (FORCE)", db="postgres")
        psql(f"CREATE DATABASE {target}", db="postgres")
        restore = subprocess.run(["pg_restore", *options, "-d", target, OLD_DUMP], capture_output=True, text=True,
                                 timeout=300)
        assert restore.returncode == 0, restore.stderr
        psql(f"""SELECT rag_create_collection('kb', embedding_model => 'hash-384', max_distance => 2);
            {writer}
            CREATE TABLE fresh (id int PRIMARY KEY, body text);
            INSERT INTO fresh VALUES (1, 'Watched after the restore.');
            SELECT rag_watch('fresh', 'kb', content => 'body');""", db=target)
        assert scalar("SELECT id FROM rag.watches WHERE source = 'fresh'::regclass", db=target) == "1"
    limits = {table: int(scalar(f"SELECT coalesce(max(id), 0) FROM rag.{table}", db=DB)) for table in LIMITS}
    with open(STATE, "w") as f:
        json.dump({"limits": limits, "fingerprint": fingerprint(DB, limits),
                   "version": scalar("SELECT extversion FROM pg_extension WHERE extname = 'rag'", db=DB)}, f)


SQUATTER = "rag_upgrade_squatter"


def plant_overloads(db):
    psql(f"SELECT 'CREATE ROLE {SQUATTER}' WHERE NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{SQUATTER}') "
         f"\\gexec\nGRANT CREATE ON SCHEMA public TO {SQUATTER};", db=db)
    with open(os.path.join(HERE, "hostile_overloads.sql")) as f:
        psql(f"SET ROLE {SQUATTER};\n" + f.read(), db=db)


def overloads_used(db):
    """What the planted overloads recorded and what is bound to them (hostile_bindings.sql); then they go, so
    that the checks after this one run among the built-ins alone."""
    with open(os.path.join(HERE, "hostile_bindings.sql")) as f:
        found = [row[0] for row in psql(f"\\set planter {SQUATTER}\n" + f.read(), db=db)]
    code, _, err = psql(f"DROP OWNED BY {SQUATTER}", db=db, check=False)
    if code != 0:
        found.append(f"the planted objects could not be dropped: {err.strip()}")
    return found


class Upgrade(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        with open(STATE) as f:
            cls.before = json.load(f)
        cls.library_version = os.environ["RAG_NEW_VERSION"]
        # Before ALTER EXTENSION: the new library with the old SQL. Anything queued now must wait, not fail, and
        # searches through the old SQL go on (README, "Upgrades").
        psql("SELECT rag_ingest('kb', 'Between', 'Written after the package upgrade and before the ALTER.')", db=DB)
        cls.query_before_update = psql("SELECT title FROM rag_query('kb', 'Staff must give thirty days notice in "
                                       "writing.', k => 1)", db=DB, check=False)
        cls.ask_before_update = psql("SELECT outcome FROM rag_ask('kb', 'How much notice do I give?')", db=DB, check=False)
        cls.log_before_update = cls.server_log()
        time.sleep(2)
        cls.status_before_update = scalar("SELECT d.status || '|' || EXISTS (SELECT 1 FROM rag.queue q WHERE "
                                          "q.document_id = d.id) FROM rag.documents d WHERE d.title = 'Between'", db=DB)
        cls.warned = "pending documents wait until ALTER EXTENSION rag UPDATE" in cls.server_log()
        # By another superuser than the one who created the extension: the functions the update adds would be
        # that role's, and rag tells its own frames from a caller's by their identity (the catalog comparison
        # below checks every function's owner).
        # Just before, a role that may create objects in public, as the database's owner may, plants overloads of
        # built-ins there (hostile_overloads.sql): the update must neither run nor bind any of them.
        plant_overloads(DB)
        code, _, cls.update_messages = psql(
            "SELECT 'CREATE ROLE rag_upgrader SUPERUSER' WHERE NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = "
            "'rag_upgrader') \\gexec\nSET ROLE rag_upgrader;\nALTER EXTENSION rag UPDATE;", db=DB, check=False)
        assert code == 0, cls.update_messages
        cls.overloads_after_update = overloads_used(DB)
        psql(f"DROP DATABASE IF EXISTS {FRESH} WITH (FORCE)", db="postgres")
        psql(f"CREATE DATABASE {FRESH}", db="postgres")
        # The same before a fresh install (pgvector first: its own script is not rag's to answer for).
        psql("CREATE EXTENSION vector", db=FRESH)
        plant_overloads(FRESH)
        psql("CREATE EXTENSION rag", db=FRESH)
        cls.overloads_after_install = overloads_used(FRESH)
        # The update moved the chunks into each collection's partition and left the HNSW indexes to the worker
        # (searches are exact meanwhile); it builds them under the names they had.
        cls.indexes_rebuilt = wait_until("SELECT NOT EXISTS (SELECT 1 FROM rag.collections WHERE dimensions IS NOT NULL "
                                         "AND (index_name IS NULL OR to_regclass('rag.' || index_name) IS NULL))",
                                         DB, seconds=60)

    @staticmethod
    def server_log():
        path = os.environ.get("RAG_UPGRADE_LOG")
        if not path or not os.path.exists(path):
            return ""
        with open(path, errors="replace") as f:
            return f.read()

    def test_started_from_the_previous_release(self):
        self.assertNotEqual(self.before["version"], self.library_version)
        self.assertEqual(scalar("SELECT extversion FROM pg_extension WHERE extname = 'rag'", db=DB),
                         self.library_version)

    def test_the_worker_waited_for_the_update(self):
        self.assertEqual(self.status_before_update, "processing|true", "queued work was taken before the update")
        self.assertTrue(self.warned, "the worker did not say why it waits")

    def test_searches_went_on_before_the_update(self):
        code, rows, err = self.query_before_update
        self.assertEqual((code, rows), (0, [["Notice"]]), err)
        # rag_ask's Rust side calls the new SQL: until the ALTER it fails with an error saying what is missing,
        # not with a crash or a wrong answer.
        code, _, err = self.ask_before_update
        self.assertNotEqual(code, 0)
        self.assertIn("does not exist", err)

    def test_no_overload_planted_in_public_ran_or_stayed_bound(self):
        # The update and the install run with search_path pinned to pg_catalog, rag (sql/schema.sql): before,
        # the database owner's format(text, text) ran as the superuser in the scripts' DO blocks (it made its
        # owner a superuser), and CHECK constraints, policies and views stayed bound to such operators.
        self.assertEqual(self.overloads_after_update, [], "ALTER EXTENSION rag UPDATE used planted overloads")
        self.assertEqual(self.overloads_after_install, [], "CREATE EXTENSION rag used planted overloads")

    def test_every_sql_file_of_the_install_script_pins_the_search_path(self):
        # The planted overloads above catch an unpinned statement only if it calls one of them; this catches a
        # SQL file added to the install script without the pin (src/lib.rs lists them), or one that forgets to
        # give the extension's schema back to the Rust functions pgrx declares after it.
        root = os.path.join(HERE, "..", "..")
        with open(os.path.join(root, "src", "lib.rs")) as f:
            files = re.findall(r'extension_sql_file!\(\s*"\.\./(sql/[a-z_]+\.sql)"', f.read())
        self.assertGreaterEqual(len(files), 7, files)
        pin = "SET LOCAL search_path = pg_catalog, rag, pg_temp;"
        for name in files:
            with open(os.path.join(root, name)) as f:
                statements = [line for line in f.read().splitlines() if line and not line.startswith("--")]
            self.assertEqual(statements[0], pin, f"{name} does not start by pinning the search_path")
            if not name.endswith("security.sql"):  # the last file: nothing of pgrx's comes after it
                self.assertEqual(statements[-1], "SET LOCAL search_path = @extschema@, pg_temp;",
                                 f"{name} does not give the extension's schema back at its end")
        with open(os.path.join(root, "sql", "rag--0.1.0--0.2.0.sql")) as f:
            statements = [line for line in f.read().splitlines() if line and not line.startswith("--")]
        self.assertEqual(statements[0], pin, "the upgrade script does not start by pinning the search_path")

    def test_no_code_of_a_watched_tables_owner_ran_in_the_update(self):
        # The update checks each watch's expressions by analysing them as the table's owner; planning a query
        # on the table (as it did) folded the owner's functions in the table's index expressions, and anything
        # they created while the script ran became a member of rag, handed to rag's owner by security.sql.
        self.assertNotIn("planned_check ran", self.update_messages)

    def test_catalog_equals_a_fresh_install(self):
        upgraded, fresh = catalog(DB), catalog(FRESH)
        missing = sorted(set(fresh) - set(upgraded))
        extra = sorted(set(upgraded) - set(fresh))
        self.assertEqual((missing, extra), ([], []),
                         "upgraded catalog differs from a fresh install:\n  only in fresh:\n    "
                         + "\n    ".join(missing) + "\n  only in upgraded:\n    " + "\n    ".join(extra))
        self.assertGreater(len(fresh), 300, "the catalog comparison looked at too little")

    def test_chunks_are_in_each_collections_partition(self):
        self.assertTrue(self.indexes_rebuilt, "the worker did not build the HNSW indexes after the update")
        self.assertEqual(scalar("SELECT count(*) FROM rag.collections c WHERE to_regclass('rag.chunks_c' || c.id) IS NULL",
                                db=DB), "0")
        self.assertEqual(scalar("SELECT count(*) FROM pg_depend WHERE deptype = 'e' AND objid IN "
                                "(SELECT inhrelid FROM pg_inherits WHERE inhparent = 'rag.chunks'::regclass)", db=DB), "0",
                         "a partition made by the update is an extension member: pg_dump would leave it out")
        self.assertEqual(scalar("SELECT count(*) FROM ONLY rag.chunks", db=DB), "0")
        # The next chunk's id follows those moved.
        self.assertEqual(scalar("SELECT last_value >= (SELECT max(id) FROM rag.chunks) FROM rag.chunks_id_seq", db=DB), "t")

    def test_every_row_made_before_is_kept(self):
        after = fingerprint(DB, self.before["limits"])
        for table, value in self.before["fingerprint"].items():
            self.assertIsNotNone(value, f"the previous release left rag.{table} empty: the test proves nothing")
            self.assertEqual(after[table], value, f"rag.{table} changed in the upgrade")

    def test_collections_made_before_keep_their_access(self):
        # Under the previous release every rag_reader read every collection and every rag_admin administered
        # them; the upgrade keeps that for collections it finds (owner rag_admin, read granted to rag_reader).
        self.assertEqual(scalar("SELECT string_agg(owner::text, ',' ORDER BY id) FROM rag.collections", db=DB),
                         "rag_admin,rag_admin")
        rows = psql("SET ROLE rag_upgrade_reader; SELECT count(*) FROM rag_query('kb', 'notice in writing')",
                    db=DB)
        self.assertGreater(int(rows[0][0]), 0)
        code, _, err = psql("SET ROLE rag_upgrade_reader; SELECT rag_drop_collection('kb')", db=DB, check=False)
        self.assertNotEqual(code, 0)
        self.assertIn("permission denied", err)

    def test_the_update_names_watches_whose_expressions_no_longer_evaluate(self):
        self.assertIn("the watch of notices no longer evaluates its expressions", self.update_messages)
        self.assertIn("shout(text) does not exist", self.update_messages)
        self.assertNotIn("the watch of pages", self.update_messages)

    def test_the_update_names_watches_of_partitioned_tables(self):
        self.assertIn("the watch of events indexes nothing: events is a partitioned table", self.update_messages)
        self.assertIn("rag_watch each of its partitions", self.update_messages)
        # The watch is kept, and writes to the table (through the parent or straight to a partition) go on.
        psql("SET ROLE rag_upgrade_editor; INSERT INTO events VALUES (3, 'Winter hours start in November.'); "
             "INSERT INTO events_early VALUES (4, 'The canteen closes in August.'); "
             "UPDATE events SET body = body || ' Bring a coat.' WHERE id = 3; DELETE FROM events WHERE id = 4", db=DB)
        self.assertEqual(scalar("SELECT count(*) FROM rag.watches WHERE source = 'events'::regclass", db=DB), "1")
        self.assertNotIn("the watch of pages indexes nothing", self.update_messages)
        # Told again where a user looks at a watch's health, not only once in the update's output.
        status = dict(psql("SET ROLE rag_upgrade_editor; SELECT source, coalesce(last_error, '') FROM rag_watch_status()",
                           db=DB))
        self.assertIn("the watch indexes nothing: events is a partitioned table", status["events"])
        self.assertIn("rag_watch each partition", status["events"])
        self.assertEqual(status["pages"], "")

    def test_a_grant_made_by_hand_still_calls_the_entry_point(self):
        # The wrapper keeps the grant on its oid; the update grants the SECURITY DEFINER body it calls too. The
        # role may read no collection, so it is shown no watch; the call itself is not refused.
        self.assertEqual(psql("SET ROLE rag_upgrade_app; SELECT count(*) FROM rag_watch_status()", db=DB),
                         [["0"]])

    def test_a_view_made_before_calls_the_entry_point(self):
        # The update puts each public function's SECURITY DEFINER body behind a wrapper that keeps the
        # function's oid, so a view made under the previous release calls the wrapper, which tells rag who
        # called, and not the body, which would refuse.
        self.assertEqual(psql("SET ROLE rag_upgrade_editor; SELECT source, rows_watched FROM watched ORDER BY 1",
                              db=DB),
                         # The partitioned table's rows live in its partition, which the watch never reads.
                         [["drafts", "1"], ["events", "0"], ["notices", "1"], ["pages", "2"], ["planned", "1"],
                          ["shifts_day", "1"]])

    def test_collections_made_before_keep_their_search(self):
        # No reranker and vector search, as under the previous release, with the current defaults ready for
        # when an admin turns reranking on.
        self.assertEqual(
            psql("SELECT reranker IS NULL, search_mode, rerank_candidates = rag._limit('rerank_candidates_default')::int,"
                 " min_relevance = rag._limit('min_relevance_default')::real FROM rag.collections ORDER BY id", db=DB),
            [["t", "vector", "t", "t"], ["t", "vector", "t", "t"]])
        self.assertEqual(scalar("SELECT count(*) FROM rag.queries WHERE best_relevance IS NOT NULL", db=DB), "0")

    def test_pending_work_and_new_work_are_embedded(self):
        psql("UPDATE rag.queue SET not_before = now()", db=DB)
        psql("SELECT rag_ingest('kb', 'After', 'Written after the upgrade: bicycles go in the yard.')", db=DB)
        self.assertTrue(wait_until("SELECT NOT EXISTS (SELECT 1 FROM rag.documents WHERE status <> 'ready')", DB,
                                   seconds=60), "documents queued around the upgrade were not embedded")
        self.assertEqual(scalar("SELECT count(*) FROM rag.chunks WHERE embedding IS NULL", db=DB), "0")

    def test_watch_made_before_still_syncs(self):
        psql("SET ROLE rag_upgrade_editor; INSERT INTO pages VALUES (3, 'Visitors sign in at the front desk.')",
             db=DB)
        self.assertTrue(wait_until("SELECT EXISTS (SELECT 1 FROM rag.documents WHERE source_key = '{\"id\": 3}' "
                                   "AND status = 'ready')", DB, seconds=60),
                        "a row inserted into a table watched since the previous release was not embedded")
        rows = psql("SELECT document_id FROM rag_query('kb', 'Visitors sign in at the front desk.', k => 1)", db=DB)
        self.assertEqual(rows, [[scalar("SELECT id FROM rag.documents WHERE source_key = '{\"id\": 3}'", db=DB)]])

    def test_a_partition_watched_before_indexes_rows_written_through_its_parent(self):
        # The update makes every watch's triggers again: the partition's row triggers gather the keys, and rag
        # queues them when the statement ends.
        self.assertEqual(scalar("SELECT rag._watch_trigger_mode_installed('shifts_day'::regclass)", db=DB),
                         "gather_at_end")
        psql("SET ROLE rag_upgrade_editor; INSERT INTO shifts VALUES (50, 'Bicycle racks are behind block C.')",
             db=DB)
        self.assertTrue(wait_until("SELECT EXISTS (SELECT 1 FROM rag.documents d JOIN rag.watches w ON w.id = d.watch_id "
                                   "WHERE w.source = 'shifts_day'::regclass AND d.source_key = '{\"id\": 50}' "
                                   "AND d.status = 'ready')", DB, seconds=60),
                        "a row written through the parent of a partition watched since the previous release was "
                        "not embedded")
        # And its deletion through the parent (which also leaves the other tests the rows they count).
        psql("SET ROLE rag_upgrade_editor; DELETE FROM shifts WHERE id = 50", db=DB)
        self.assertTrue(wait_until("SELECT NOT EXISTS (SELECT 1 FROM rag.documents WHERE source_key = '{\"id\": 50}')",
                                   DB, seconds=60),
                        "a row deleted through the parent of a partition watched since the previous release kept "
                        "its document")

    def test_conversation_goes_on(self):
        conversation = scalar("SELECT max(id) FROM rag.conversations", db=DB)
        rows = psql(f"SELECT outcome FROM rag_ask('kb', 'And when is lunch?', conversation => {conversation})",
                    db=DB)
        self.assertEqual(len(rows), 1)
        self.assertEqual(scalar(f"SELECT count(*) > 2 FROM rag.messages WHERE conversation_id = {conversation}",
                                db=DB), "t")

    def test_upgraded_database_dumps_and_restores(self):
        target = "rag_upgrade_restored"
        psql(f"DROP DATABASE IF EXISTS {target} WITH (FORCE)", db="postgres")
        psql(f"CREATE DATABASE {target}", db="postgres")
        dump = subprocess.run(["pg_dump", "-Fc", DB], capture_output=True, timeout=300)
        self.assertEqual(dump.returncode, 0, dump.stderr.decode())
        restore = subprocess.run(["pg_restore", "-d", target], input=dump.stdout, capture_output=True, timeout=300)
        self.assertEqual(restore.returncode, 0, restore.stderr.decode())
        self.assertEqual(scalar("SELECT count(*) FROM rag.chunks", db=target),
                         scalar("SELECT count(*) FROM rag.chunks", db=DB))

    def test_a_dump_of_the_previous_release_runs_no_filter(self):
        # The previous release's dumps bring its watches' trigger functions (ordinary objects of schema rag to
        # pg_dump) but none of rag's rows. Their bodies evaluate the filter without this release's check of who
        # wrote it: restored by a superuser without owners, the editor's function ran as that superuser; restored
        # with owners, every write to a watched table failed on the queue's policy. This release makes each one
        # do nothing as it is restored, and says so.
        for target, options in (("rag_upgrade_old_dump", ["--no-owner"]), ("rag_upgrade_old_dump_owned", [])):
            with self.subTest(options=options):
                psql(f"DROP DATABASE IF EXISTS {target} WITH (FORCE)", db="postgres")
                psql(f"CREATE DATABASE {target}", db="postgres")
                log_start = len(self.server_log())
                # pg_restore prints no server WARNING (only with --verbose); the server's log has them.
                subprocess.run(["pg_restore", *options, "-d", target, OLD_DUMP], capture_output=True, timeout=300)
                warned = self.server_log()[log_start:]
                functions = psql("SELECT DISTINCT p.oid, format('rag.%I()', p.proname) FROM pg_proc p "
                                 "JOIN pg_trigger t ON t.tgfoid = p.oid WHERE p.pronamespace = 'rag'::regnamespace "
                                 "AND t.tgrelid = 'drafts'::regclass AND p.proname ~ '^_watch_[0-9]' ORDER BY 1",
                                 db=target)
                self.assertEqual(len(functions), 2, "the dump did not bring the watch of drafts' trigger functions")
                for _, function in functions:
                    self.assertIn(f"trigger function {function} was not made by this release of rag: it now does "
                                  "nothing", warned)
                self.assertEqual(scalar("SELECT count(*) FROM rag.watches", db=target), "0")
                writer = "" if options else "SET ROLE rag_upgrade_editor;"
                before = scalar(SUPERUSER_GATE_CALLS, db=target)
                psql(writer + WRITES_TO_THE_DUMPS_TABLES, db=target)
                self.assertEqual(scalar(SUPERUSER_GATE_CALLS, db=target), before,
                                 "a trigger restored from the previous release ran the filter's author's function "
                                 "as a superuser")
                self.assertEqual(scalar("SELECT count(*) FROM rag.row_batches", db=target), "0")
                # Watched again, the table is indexed by this release's triggers, the old ones gone.
                psql(f"""{writer}
                    SELECT rag_create_collection('again', embedding_model => 'hash-384', max_distance => 2);
                    SELECT rag_watch('drafts', 'again', content => 'body', filter => $$body NOT LIKE 'draft%'$$);""",
                     db=target)
                self.assertTrue(wait_until("SELECT count(*) = 2 AND bool_and(status = 'ready') FROM rag.documents",
                                           target, seconds=60), "the table watched again was not indexed")
                old = ",".join(oid for oid, _ in functions)
                self.assertEqual(scalar(f"SELECT count(*) FROM pg_proc WHERE oid IN ({old})", db=target), "0",
                                 "the old trigger functions of drafts outlived its new watch")
                self.assertEqual(scalar(SUPERUSER_GATE_CALLS, db=target), before)

    def test_a_dump_restored_under_the_previous_release_then_updated_runs_no_filter(self):
        # Restored under 0.1.0, the dump's trigger functions are 0.1.0's own, and the update re-makes only those
        # of the watches rag.watches has. The rest no watch has, and would run the editor's filter as the
        # superuser who restored them, or fail every write on the queue's policy; and the update's DROP of the
        # function pages' triggers and fresh's watch shared failed the update.
        for target, (options, writer) in RESTORED_UNDER_OLD.items():
            with self.subTest(options=options):
                code, _, messages = psql("ALTER EXTENSION rag UPDATE", db=target, check=False)
                self.assertEqual(code, 0, messages)
                self.assertIn("was not made by this release of rag: it now does nothing", messages)
                self.assertEqual(scalar("SELECT count(*) FROM pg_proc p WHERE p.pronamespace = 'rag'::regnamespace "
                                        "AND rag._watch_function_unmarked(p.oid)", db=target), "0")
                # pages' triggers ran the function fresh's watch took: it was set aside, and fresh's made anew.
                self.assertEqual(scalar("SELECT bool_and(t.tgfoid::regproc::text ~ '^rag\._watch_1(_row)?_left_[0-9]+$') "
                                        "FROM pg_trigger t WHERE t.tgrelid = 'pages'::regclass "
                                        "AND t.tgname IN ('rag_watch_insert', 'rag_watch_update', 'rag_watch_delete')",
                                        db=target), "t")
                before = scalar(SUPERUSER_GATE_CALLS, db=target)
                psql(writer + WRITES_TO_THE_DUMPS_TABLES + "INSERT INTO fresh VALUES (2, 'Written after the update.');",
                     db=target)
                self.assertEqual(scalar(SUPERUSER_GATE_CALLS, db=target), before,
                                 "a trigger function restored under the previous release ran the filter's author's "
                                 "function as a superuser after the update")
                self.assertTrue(wait_until("SELECT EXISTS (SELECT 1 FROM rag.documents WHERE source_key = "
                                           "'{\"id\": 2}' AND status = 'ready')", target, seconds=60),
                                "the watch made after the restore stopped indexing")
                self.assertEqual(scalar("SELECT count(*) FROM rag.watches", db=target), "1")


if __name__ == "__main__" and sys.argv[1:] == ["fill"]:
    fill()
