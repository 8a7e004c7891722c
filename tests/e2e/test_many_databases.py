"""More databases use rag than rag.max_workers (4 here): workers of databases with nothing queued make room, and
every database's documents get embedded; a database whose worker left gets one back when work arrives."""
import unittest

from support import drop_database, fresh_database, psql, wait_until

DATABASES = [f"rag_e2e_many_{n}" for n in range(5)]


class ManyDatabases(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        for db in DATABASES:
            fresh_database(db)
            psql("SELECT rag_create_collection('c', embedding_model => 'hash-384')", db=db)

    @classmethod
    def tearDownClass(cls):
        for db in DATABASES:
            drop_database(db)

    def test_every_database_is_served_in_turn(self):
        for round_number in range(2):
            for db in DATABASES:
                psql(f"SELECT rag_ingest('c', 'Round {round_number}', 'Document of round {round_number} in {db}.')", db=db)
            for db in DATABASES:
                self.assertTrue(wait_until("SELECT rag_wait('c', '1 second')", db=db, seconds=90),
                                f"{db} was not served in round {round_number}")
        # Round 1 needed workers back in databases whose workers had made room in round 0.
        workers = int(psql("SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'rag worker'",
                           db="postgres")[0][0])
        self.assertLessEqual(workers, 4, "rag.max_workers was exceeded")


if __name__ == "__main__":
    unittest.main()
