"""A collection's HNSW build parameters changed while its index is being built: the build that started with the
old ones must not stay behind as the collection's index (rag._ensure_index checks the row after the build)."""
import unittest
from functools import partial

from support import background_psql as background_psql_in
from support import InItsOwnDatabase
from support import psql as psql_in
from support import scalar as scalar_in
from support import wait_until as wait_until_in

DB = "rag_e2e_index_parameters"
psql = partial(psql_in, db=DB)
scalar = partial(scalar_in, db=DB)
background_psql = partial(background_psql_in, db=DB)
wait_until = partial(wait_until_in, db=DB, seconds=30)


class BuildParametersChangedDuringABuild(InItsOwnDatabase):
    DB = DB

    def test_the_build_with_the_old_parameters_is_dropped(self):
        # No chunks: the idle worker leaves the collection's index alone, so only this test builds it. rag_set_search
        # drops the index rag_create_collection built and records parameters the build below starts from.
        psql("SELECT rag_create_collection('race', embedding_model => 'hash-384', dimensions => 384); "
             "SELECT rag_set_search('race', m => 8, ef_construction => 40)")
        self.assertEqual(scalar("SELECT index_name IS NULL FROM rag.collections WHERE name = 'race'"), "t")
        collection = scalar("SELECT id FROM rag.collections WHERE name = 'race'")
        index = f"chunks_embedding_c{collection}"
        # Writes to rag.chunks held open: a build waits for them after it has read the collection's parameters.
        writer = background_psql("BEGIN; LOCK TABLE rag.chunks IN ROW EXCLUSIVE MODE;")
        try:
            self.assertTrue(wait_until("SELECT EXISTS (SELECT 1 FROM pg_locks l JOIN pg_class c ON c.oid = l.relation "
                                       "WHERE c.relname = 'chunks' AND l.mode = 'RowExclusiveLock' AND l.granted "
                                       "AND l.pid <> pg_backend_pid())"))
            builder = background_psql(f"SELECT coalesce(rag._ensure_index({collection}), 'none');")
            self.assertTrue(wait_until("SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE query LIKE "
                                       "'%rag._ensure_index%' AND wait_event_type = 'Lock' AND pid <> pg_backend_pid())"),
                            "the build did not wait for the open writes")
            # The index is not there yet, so this drops nothing: it only records the new parameters.
            psql("SELECT rag_set_search('race', m => 12, ef_construction => 48)")
        finally:
            writer.communicate(input="COMMIT;\n", timeout=60)
        out, err = builder.communicate(timeout=120)
        self.assertEqual(builder.returncode, 0, err)
        self.assertEqual(out.strip(), "none", "the build with the old parameters was kept")
        self.assertEqual(scalar(f"SELECT count(*) FROM pg_indexes WHERE schemaname = 'rag' AND indexname = '{index}'"), "0")
        self.assertEqual(scalar("SELECT index_name IS NULL FROM rag.collections WHERE name = 'race'"), "t")
        # Built again, it has the parameters that were asked for last.
        self.assertEqual(scalar(f"SELECT rag._ensure_index({collection})"), index)
        self.assertIn("m='12', ef_construction='48'",
                      scalar(f"SELECT indexdef FROM pg_indexes WHERE indexname = '{index}'"))


if __name__ == "__main__":
    unittest.main()
