"""A collection's HNSW build parameters change (rag_set_search): the index in use stays until the worker has
built its successor beside it; a rebuild holds the collection's row, and skips a collection whose row is held."""
import time
import unittest
from functools import partial

from support import background_psql as background_psql_in
from support import InItsOwnDatabase
from support import psql as psql_in
from support import scalar as scalar_in
from support import wait_until as wait_until_in
from support import read_line

DB = "rag_e2e_index_parameters"
psql = partial(psql_in, db=DB)
scalar = partial(scalar_in, db=DB)
background_psql = partial(background_psql_in, db=DB)
wait_until = partial(wait_until_in, db=DB, seconds=30)


def hnsw_indexes(collection):
    return scalar("SELECT string_agg(indexname || ' ' || substring(indexdef FROM 'vector_cosine_ops\\)(.*)$'), "
                  "'; ' ORDER BY indexname) FROM pg_indexes WHERE schemaname = 'rag' AND indexdef LIKE '%USING hnsw%' "
                  f"AND tablename = 'chunks_c{collection}'")


class BuildParametersChanged(InItsOwnDatabase):
    DB = DB

    def test_a_rebuild_holds_the_collection_and_skips_it_when_held(self):
        # No chunks: the worker leaves the collection's index alone (rag._collections_to_rebuild), so only this
        # test rebuilds it.
        psql("SELECT rag_create_collection('race', embedding_model => 'hash-384', dimensions => 384); "
             "SELECT rag_set_search('race', m => 8, ef_construction => 40)")
        collection = scalar("SELECT id FROM rag.collections WHERE name = 'race'")
        index = f"chunks_embedding_c{collection}"
        self.assertEqual(hnsw_indexes(collection), f"{index} ", "rag_set_search dropped or replaced the index itself")
        # A store shares the collection's row (FOR SHARE): the rebuild skips the collection rather than build and
        # then wait for the row (a store takes the row, then the partition; the other order lost whole builds).
        holder = background_psql("BEGIN; SELECT 'held' FROM rag.collections WHERE name = 'race' FOR SHARE;")
        try:
            self.assertEqual(read_line(holder).strip(), "held")
            self.assertEqual(scalar(f"SET lock_timeout = '5s'; SELECT rag._rebuild_index({collection})"), "f")
            self.assertEqual(hnsw_indexes(collection), f"{index} ")
        finally:
            holder.communicate(input="COMMIT;\n", timeout=30)
        # Writes to rag.chunks held open: the rebuild waits for them with the collection's row taken, so a
        # parameter change made meanwhile waits for the rebuild, and the next call builds with it.
        writer = background_psql("BEGIN; LOCK TABLE rag.chunks IN ROW EXCLUSIVE MODE;")
        try:
            self.assertTrue(wait_until("SELECT EXISTS (SELECT 1 FROM pg_locks l JOIN pg_class c ON c.oid = l.relation "
                                       "WHERE c.relname = 'chunks' AND l.mode = 'RowExclusiveLock' AND l.granted "
                                       "AND l.pid <> pg_backend_pid())"))
            builder = background_psql(f"SELECT rag._rebuild_index({collection});")
            self.assertTrue(wait_until("SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE query LIKE "
                                       "'%rag._rebuild_index%' AND wait_event_type = 'Lock' AND pid <> pg_backend_pid())"),
                            "the rebuild did not wait for the open writes")
            changer = background_psql("SELECT rag_set_search('race', m => 12, ef_construction => 48);")
            self.assertTrue(wait_until("SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE query LIKE "
                                       "'%rag_set_search(''race''%' AND wait_event_type = 'Lock' "
                                       "AND pid <> pg_backend_pid())"),
                            "the parameter change did not wait for the rebuild")
        finally:
            writer.communicate(input="COMMIT;\n", timeout=60)
        out, err = builder.communicate(timeout=120)
        self.assertEqual((builder.returncode, out.strip()), (0, "t"), err)
        _, err = changer.communicate(timeout=60)
        self.assertEqual(changer.returncode, 0, err)
        self.assertEqual(hnsw_indexes(collection), f"{index}_r  WITH (m='8', ef_construction='40')")
        # The next call builds with the parameters asked for last, under the other name, and is alone.
        self.assertEqual(scalar(f"SELECT rag._rebuild_index({collection})"), "t")
        self.assertEqual(hnsw_indexes(collection), f"{index}  WITH (m='12', ef_construction='48')")
        self.assertEqual(scalar("SELECT index_name FROM rag.collections WHERE name = 'race'"), index)

    def test_searches_keep_the_index_until_its_successor_is_there(self):
        psql("SELECT rag_create_collection('kept', embedding_model => 'hash-384', dimensions => 384)")
        psql("SELECT rag_ingest('kept', 'Note ' || g, 'Note ' || g || ' about keeping an index.') "
             "FROM generate_series(1, 5) g")
        self.assertEqual(scalar("SELECT rag_wait('kept', '60 seconds')"), "t")
        collection = scalar("SELECT id FROM rag.collections WHERE name = 'kept'")
        index = f"chunks_embedding_c{collection}"
        # A search holds the partition (ACCESS SHARE) in a transaction left open: the worker builds the new index
        # beside the old one, cannot drop the old one, and leaves it for a later try.
        reader = background_psql("BEGIN; SELECT count(*) FROM rag_query('kept', 'keeping', 3, max_distance => 2);")
        try:
            self.assertEqual(read_line(reader).strip(), "3")
            psql("SELECT rag_set_search('kept', m => 8, ef_construction => 40)")
            self.assertTrue(wait_until(f"SELECT index_name = '{index}_r' FROM rag.collections WHERE name = 'kept'"),
                            "the worker did not build the successor: " + repr(hnsw_indexes(collection)))
            time.sleep(1)
            self.assertEqual(hnsw_indexes(collection),
                             f"{index} ; {index}_r  WITH (m='8', ef_construction='40')",
                             "the old index was not kept while a search held it")
            self.assertEqual(scalar("SELECT count(*) FROM rag_query('kept', 'keeping', 3, max_distance => 2)"), "3")
        finally:
            reader.communicate(input="COMMIT;\n", timeout=30)
        # Once the search is over, the worker drops the old one.
        self.assertTrue(wait_until(f"SELECT to_regclass('rag.{index}') IS NULL"), repr(hnsw_indexes(collection)))
        self.assertEqual(hnsw_indexes(collection), f"{index}_r  WITH (m='8', ef_construction='40')")
        self.assertEqual(scalar("SELECT count(*) FROM rag_query('kept', 'keeping', 3, max_distance => 2)"), "3")


    def test_a_collection_held_for_long_does_not_keep_the_others_waiting(self):
        # A pg_dump (or a search left open) holds one collection's partition: its old index cannot be dropped
        # after the rebuild, so it stays due. Taken first every time, it kept every other collection's rebuild
        # waiting for as long as it was held; the worker draws among the due ones.
        for name in ("first-held", "second-free"):
            self.three_notes(name)
        first = scalar("SELECT rag._chunk_partition(id) FROM rag.collections WHERE name = 'first-held'")
        holder = background_psql(f"BEGIN; LOCK TABLE rag.{first} IN ACCESS SHARE MODE; SELECT 'held';")
        try:
            self.assertEqual(read_line(holder).strip(), "held")
            psql("SELECT rag_set_search('first-held', m => 8, ef_construction => 40); "
                 "SELECT rag_set_search('second-free', m => 8, ef_construction => 40)")
            self.assertTrue(wait_until("SELECT rag._hnsw_index_current(c, c.index_name) AND "
                                       "to_regclass('rag.' || rag._hnsw_index_spare(c)) IS NULL "
                                       "FROM rag.collections c WHERE c.name = 'second-free'", seconds=30),
                            "the free collection's rebuild waited for the held one")
        finally:
            holder.communicate(input="COMMIT;\n", timeout=30)
        self.assertTrue(wait_until("SELECT rag._hnsw_index_current(c, c.index_name) AND "
                                   "to_regclass('rag.' || rag._hnsw_index_spare(c)) IS NULL "
                                   "FROM rag.collections c WHERE c.name = 'first-held'", seconds=30))

    def test_a_rebuild_that_fails_is_not_tried_again_at_once(self):
        # A build that fails the same way each time (a full disk) was tried again at every upkeep, every naptime
        # when idle: a whole index build each time, and a WARNING each. The worker leaves the collection alone for
        # a minute now, then twice as long after each failure in a row. Made to fail here by an event trigger
        # that refuses its indexes, counting the tries in a sequence (which a rollback does not undo).
        collection = self.three_notes("failing")
        self.refuse_builds_of(collection, "refuse_rebuilds")
        try:
            psql("SELECT rag_set_search('failing', m => 8, ef_construction => 40)")
            self.assertTrue(wait_until("SELECT last_value = 1 AND is_called FROM public.refuse_rebuilds_tries", seconds=30),
                            "the worker never tried the rebuild")
            # The idle worker looks every 200 ms here: about 30 more tries in 6 s without the pause.
            time.sleep(6)
            self.assertEqual(scalar("SELECT last_value FROM public.refuse_rebuilds_tries"), "1")
            # Searches kept the index in use meanwhile.
            self.assertEqual(scalar("SELECT count(*) FROM rag_query('failing', 'failing rebuild', 3, max_distance => 2)"),
                             "3")
            # The admin sees why, and when the next try is.
            self.assertEqual(scalar("SELECT upkeep_error || ' | ' || (upkeep_retry_at - now() BETWEEN '40 s' AND '60 s') "
                                    "FROM rag.status WHERE collection = 'failing'"),
                             "index rebuild failed 1 time in a row: no space left on device (made up by the test) | true")
            # The pause outlives the worker: one that restarts (or leaves its slot to another database and comes
            # back) built again at once while the pause lived in its memory.
            worker = scalar("SELECT pid FROM pg_stat_activity WHERE backend_type = 'rag worker' "
                            f"AND datname = '{DB}'")
            psql(f"SELECT pg_terminate_backend({worker})")
            self.assertTrue(wait_until("SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE backend_type = 'rag worker' "
                                       f"AND datname = '{DB}' AND pid <> {worker})", seconds=30),
                            "no worker came back")
            time.sleep(3)
            self.assertEqual(scalar("SELECT last_value FROM public.refuse_rebuilds_tries"), "1")
            # New build parameters are a new try, at once; its failure is the second in a row (two minutes).
            psql("SELECT rag_set_search('failing', m => 10, ef_construction => 40)")
            self.assertTrue(wait_until("SELECT last_value = 2 FROM public.refuse_rebuilds_tries", seconds=30),
                            "new build parameters were not tried while the old ones rested")
            self.assertTrue(wait_until("SELECT upkeep_error LIKE 'index rebuild failed 1 time in a row:%' "
                                       "FROM rag.status WHERE collection = 'failing'", seconds=10))
            # The cause mended, the same parameters asked again: built, and the error is gone.
            psql("DROP EVENT TRIGGER refuse_rebuilds")
            psql("SELECT rag_set_search('failing', m => 12, ef_construction => 40)")
            self.assertTrue(wait_until("SELECT rag._hnsw_index_current(c, c.index_name) FROM rag.collections c "
                                       "WHERE c.name = 'failing'", seconds=30))
            self.assertTrue(wait_until("SELECT upkeep_error IS NULL AND upkeep_retry_at IS NULL FROM rag.status "
                                       "WHERE collection = 'failing'", seconds=10))
            self.assertEqual(scalar(f"SELECT count(*) FROM rag.upkeep_failures WHERE collection_id = {collection}"), "0")
        finally:
            self.drop_refusal("refuse_rebuilds")

    def three_notes(self, name):
        """A collection `name` of three ready notes; its id."""
        psql(f"SELECT rag_create_collection('{name}', embedding_model => 'hash-384'); "
             f"SELECT rag_ingest('{name}', 'Note ' || g, 'Note ' || g || ' of {name}.') FROM generate_series(1, 3) g")
        self.assertEqual(scalar(f"SELECT rag_wait('{name}', '60 seconds')"), "t")
        return scalar(f"SELECT id FROM rag.collections WHERE name = '{name}'")

    def refuse_builds_of(self, collection, name, refuse=True):
        """An event trigger that refuses the collection's HNSW index builds (or only counts them, refuse=False),
        counting the tries in the sequence public.<name>_tries (which a rollback does not undo)."""
        refusal = "RAISE EXCEPTION 'no space left on device (made up by the test)';" if refuse else ""
        psql(f"""
            CREATE SEQUENCE public.{name}_tries;
            CREATE FUNCTION public.{name}() RETURNS event_trigger LANGUAGE plpgsql AS $$
            BEGIN
                IF EXISTS (SELECT 1 FROM pg_event_trigger_ddl_commands()
                            WHERE object_identity LIKE 'rag.chunks_embedding_c{collection}%') THEN
                    PERFORM nextval('public.{name}_tries');
                    {refusal}
                END IF;
            END $$;
            CREATE EVENT TRIGGER {name} ON ddl_command_end WHEN TAG IN ('CREATE INDEX')
                EXECUTE FUNCTION public.{name}();""")

    def drop_refusal(self, name):
        psql(f"DROP EVENT TRIGGER IF EXISTS {name}; DROP FUNCTION IF EXISTS public.{name}(); "
             f"DROP SEQUENCE IF EXISTS public.{name}_tries")

    def unbuilt(self, name):
        """A collection of three ready documents whose HNSW index is missing and cannot be built (dropped by hand
        and forgotten by rag_reindex, as after a load whose last build failed, or a restore without its indexes):
        its first failed try done. Returns its id."""
        collection = self.three_notes(name)
        self.refuse_builds_of(collection, f"refuse_{name}")
        psql(f"DROP INDEX rag.chunks_embedding_c{collection}")
        psql(f"SELECT rag_reindex('{name}')")
        self.assertTrue(wait_until(f"SELECT last_value = 1 AND is_called FROM public.refuse_{name}_tries", seconds=30),
                        "the worker never tried the build")
        self.assertEqual(scalar(f"SELECT rag_wait('{name}', '60 seconds')"), "t")
        return collection

    def test_a_missing_index_whose_build_fails_rests_until_retried(self):
        # The idle worker's repair, and every store into the collection, tried such a build each time; now it
        # rests, rag.status says why, and rag_retry_upkeep (what an admin runs once the cause is mended) tries
        # again at once.
        collection = self.unbuilt("unbuilt")
        tries = "SELECT last_value FROM public.refuse_unbuilt_tries"
        try:
            time.sleep(4)
            self.assertEqual(scalar(tries), "1")
            self.assertEqual(scalar("SELECT upkeep_error FROM rag.status WHERE collection = 'unbuilt'"),
                             "index build failed 1 time in a row: no space left on device (made up by the test)")
            # Searched exactly meanwhile, and rag_explain gives the failing build as the reason, not a load.
            self.assertEqual(scalar("SELECT count(*) FROM rag_query('unbuilt', 'index built', 3, max_distance => 2)"),
                             "3")
            self.assertRegex(scalar("SELECT line FROM rag_explain('unbuilt', 'index built') AS line "
                                    "WHERE line LIKE 'Vector side:%'"),
                             r"^Vector side: exact search: building its HNSW index failed 1 time\(s\) in a row "
                             r"\(no space left on device \(made up by the test\)\); the workers try again at .*"
                             r"rag_retry_upkeep\('unbuilt'\)")
            # Its rest over while a session holds the failure's row (a worker trying it, a rag_reindex): the
            # worker neither waits for the row (a rag_reindex that held it deadlocked with a store) nor builds
            # the index at every look meanwhile (a storm of builds), and its other work goes on.
            # The row is locked before its rest ends: made due first, the worker could build in the moment
            # before the holder's lock (seen once in a full run).
            psql(f"UPDATE rag.upkeep_failures SET next_try = now() + interval '3 seconds' "
                 f"WHERE collection_id = {collection}")
            holder = background_psql("BEGIN; SELECT 1 FROM rag.upkeep_failures "
                                     f"WHERE collection_id = {collection} FOR UPDATE;")
            try:
                self.assertEqual(read_line(holder).strip(), "1")
                self.assertTrue(wait_until(f"SELECT next_try <= now() FROM rag.upkeep_failures "
                                           f"WHERE collection_id = {collection}", seconds=10))
                psql("SELECT rag_create_collection('beside', embedding_model => 'hash-384'); "
                     "SELECT rag_ingest('beside', 'Other', 'Another collection goes on meanwhile.')")
                self.assertEqual(scalar("SELECT rag_wait('beside', '30 seconds')"), "t")
                time.sleep(2)
                self.assertEqual(scalar(tries), "1")
            finally:
                holder.communicate(input="COMMIT;\n", timeout=30)
            # Let go: tried once more, and resting twice as long.
            self.assertTrue(wait_until(f"SELECT last_value = 2 FROM public.refuse_unbuilt_tries", seconds=30))
            self.assertTrue(wait_until("SELECT upkeep_error LIKE 'index build failed 2 times in a row:%' "
                                       "AND upkeep_retry_at - now() > '100 s' FROM rag.status "
                                       "WHERE collection = 'unbuilt'", seconds=10))
            psql("DROP EVENT TRIGGER refuse_unbuilt")
            self.assertEqual(scalar("SELECT rag_retry_upkeep('unbuilt')"), "1")
            self.assertTrue(wait_until("SELECT index_name IS NOT NULL FROM rag.collections WHERE name = 'unbuilt'",
                                       seconds=30), "the build was not tried again after rag_retry_upkeep")
            self.assertTrue(wait_until("SELECT upkeep_error IS NULL FROM rag.status WHERE collection = 'unbuilt'",
                                       seconds=10))
            self.assertEqual(scalar("SELECT rag_retry_upkeep('unbuilt')"), "0")
        finally:
            self.drop_refusal("refuse_unbuilt")

    def test_a_missing_index_is_not_built_while_an_admin_holds_the_collection(self):
        # The repair built the index and then recorded it in the collection's row; an admin's open transaction
        # holding that row (an uncommitted rag_set_search) made the record time out after every whole build,
        # each thrown away and tried again at the next round, unrecorded: 23 builds in a minute (red team 20).
        # The repair takes the row first now, without waiting, and leaves a held collection for a later round.
        collection = self.three_notes("held-row")
        self.refuse_builds_of(collection, "count_held_builds", refuse=False)
        # As a restore without its indexes leaves it (the row says no index, the chunks are there), reached while
        # a writer's open transaction keeps the repair from building (its lock_timeout on the partition ends
        # each try before CREATE INDEX, so nothing is built or counted), and the admin's open transaction
        # taken before the writer lets go.
        psql(f"DROP INDEX rag.chunks_embedding_c{collection}")
        writer = background_psql(f"BEGIN; LOCK TABLE rag.chunks_c{collection} IN ROW EXCLUSIVE MODE;")
        holder = None
        try:
            self.assertTrue(wait_until(f"SELECT EXISTS (SELECT 1 FROM pg_locks WHERE relation = 'rag.chunks_c{collection}'::regclass "
                                       "AND mode = 'RowExclusiveLock' AND granted AND pid <> pg_backend_pid())", seconds=10))
            psql(f"UPDATE rag.collections SET index_name = NULL WHERE id = {collection}")
            holder = background_psql("BEGIN; SELECT rag_set_search('held-row', ef_search => 50);")
            self.assertTrue(wait_until("SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE state = 'idle in transaction' "
                                       "AND query LIKE '%rag_set_search%')", seconds=10))
            writer.communicate(input="COMMIT;\n", timeout=30)
            writer = None
            time.sleep(4)
            self.assertEqual(scalar("SELECT is_called FROM public.count_held_builds_tries"), "f",
                             "the index was built while the collection's row was held")
            holder.communicate(input="ROLLBACK;\n", timeout=30)
            holder = None
            self.assertTrue(wait_until("SELECT index_name IS NOT NULL FROM rag.collections WHERE name = 'held-row'",
                                       seconds=30), "the index was not built once the row was let go")
            self.assertEqual(scalar("SELECT last_value FROM public.count_held_builds_tries"), "1")
        finally:
            for session in (writer, holder):
                if session is not None:
                    session.communicate(input="ROLLBACK;\n", timeout=30)
            self.drop_refusal("count_held_builds")

    def test_a_failure_that_no_longer_applies_is_forgotten(self):
        # Every document of the collection deleted: it needs no index any more, and the failure went from
        # rag.status (it stayed there for ever, its next try in the past).
        self.unbuilt("emptied")
        try:
            self.assertTrue(wait_until("SELECT upkeep_error IS NOT NULL FROM rag.status WHERE collection = 'emptied'",
                                       seconds=10))
            psql("SELECT rag_delete_document(id) FROM rag.documents "
                 "WHERE collection_id = (SELECT id FROM rag.collections WHERE name = 'emptied')")
            self.assertTrue(wait_until("SELECT upkeep_error IS NULL AND upkeep_retry_at IS NULL FROM rag.status "
                                       "WHERE collection = 'emptied'", seconds=20))
        finally:
            self.drop_refusal("refuse_emptied")

if __name__ == "__main__":
    unittest.main()
