"""A collection's HNSW build parameters changed while its index is being built: the build that started with the
old ones must not stay behind as the collection's index (rag._ensure_index checks the row after the build)."""
import os
import subprocess
import time
import unittest

from support import fresh_database, psql, scalar, wait_until

DB = "rag_e2e_index_parameters"


def session(sql):
    """A psql session that runs `sql` and then waits for more on its standard input."""
    process = subprocess.Popen(["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", DB], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=os.environ.copy())
    process.stdin.write(sql + "\n")
    process.stdin.flush()
    return process


class BuildParametersChangedDuringABuild(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        fresh_database(DB)

    @classmethod
    def tearDownClass(cls):
        psql(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)", db="postgres")

    def test_the_build_with_the_old_parameters_is_dropped(self):
        # No chunks: the idle worker leaves the collection's index alone, so only this test builds it. rag_set_search
        # drops the index rag_create_collection built and records parameters the build below starts from.
        psql("SELECT rag_create_collection('race', embedding_model => 'hash-384', dimensions => 384); "
             "SELECT rag_set_search('race', m => 8, ef_construction => 40)", db=DB)
        self.assertEqual(scalar("SELECT index_name IS NULL FROM rag.collections WHERE name = 'race'", db=DB), "t")
        collection = scalar("SELECT id FROM rag.collections WHERE name = 'race'", db=DB)
        # Writes to rag.chunks held open: a build waits for them after it has read the collection's parameters.
        writer = session("BEGIN; LOCK TABLE rag.chunks IN ROW EXCLUSIVE MODE; SELECT 'locked';")
        try:
            self.assertTrue(wait_until("SELECT EXISTS (SELECT 1 FROM pg_locks l JOIN pg_class c ON c.oid = l.relation "
                                       "WHERE c.relname = 'chunks' AND l.mode = 'RowExclusiveLock' AND l.granted "
                                       "AND l.pid <> pg_backend_pid())", db=DB, seconds=30))
            builder = subprocess.Popen(["psql", "-X", "-At", "-d", DB, "-c",
                                        f"SELECT coalesce(rag._ensure_index({collection}), 'none')"],
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            self.assertTrue(wait_until("SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE query LIKE "
                                       "'%rag._ensure_index%' AND wait_event_type = 'Lock' AND pid <> pg_backend_pid())",
                                       db=DB, seconds=30), "the build did not wait for the open writes")
            # The index is not there yet, so this drops nothing: it only records the new parameters.
            psql("SELECT rag_set_search('race', m => 12, ef_construction => 48)", db=DB)
        finally:
            writer.communicate(input="COMMIT;\n", timeout=60)
        out, err = builder.communicate(timeout=120)
        self.assertEqual(builder.returncode, 0, err)
        self.assertEqual(out.strip(), "none", "the build with the old parameters was kept")
        self.assertEqual(scalar(f"SELECT count(*) FROM pg_indexes WHERE schemaname = 'rag' "
                                f"AND indexname = 'chunks_embedding_c{collection}'", db=DB), "0")
        self.assertEqual(scalar("SELECT index_name IS NULL FROM rag.collections WHERE name = 'race'", db=DB), "t")
        # Built again, it has the parameters that were asked for last.
        self.assertEqual(scalar(f"SELECT rag._ensure_index({collection})", db=DB), f"chunks_embedding_c{collection}")
        definition = scalar(f"SELECT indexdef FROM pg_indexes WHERE indexname = 'chunks_embedding_c{collection}'", db=DB)
        self.assertIn("m='12', ef_construction='48'", definition)


if __name__ == "__main__":
    unittest.main()
