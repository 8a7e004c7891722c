"""More databases use rag than rag.max_workers (4 here): workers of databases with nothing queued make room, and
every database's documents get embedded; a database whose worker left gets one back when work arrives."""
import time
import unittest

from support import background_psql, drop_database, fresh_database, psql, scalar, wait_until
from support import read_line

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


class TurnsAmongDatabases(unittest.TestCase):
    """Four databases (rag.max_workers) whose work is not due, or keeps their workers busy, do not keep a worker
    from a fifth (red team 18). A worker left only a database with nothing queued at all, so one document of a
    provider that never answers, retried for a week, kept its slot for good, and a role that may create
    databases took every slot with copies of one database of its own; a busy worker never gave its slot up."""
    HOLDERS = [f"rag_e2e_turns_{n}" for n in range(4)]
    WAITING = "rag_e2e_turns_waiting"

    @classmethod
    def setUpClass(cls):
        for db in cls.HOLDERS:
            fresh_database(db)
            psql("SELECT rag_create_provider('dead', 'ollama', 'http://127.0.0.1:9'); "
                 "SELECT rag_create_collection('never', embedding_model => 'hash-384', embedding_provider => 'dead', "
                 "retry_deadline => '7 days'); "
                 "SELECT rag_ingest('never', 'Never', 'A document whose provider never answers.')", db=db)
        fresh_database(cls.WAITING)
        psql("SELECT rag_create_collection('c', embedding_model => 'hash-384')", db=cls.WAITING)

    @classmethod
    def tearDownClass(cls):
        for db in cls.HOLDERS + [cls.WAITING]:
            drop_database(db)

    def test_a_work_that_is_not_due_makes_room(self):
        for db in self.HOLDERS:
            self.assertTrue(wait_until("SELECT attempts > 0 FROM rag.queue", db=db, seconds=60),
                            f"{db}'s document was never tried")
        psql("SELECT rag_ingest('c', 'Waiting', 'A document of a database that waits for a worker.')", db=self.WAITING)
        self.assertEqual(scalar("SELECT rag_wait('c', '60 seconds')", db=self.WAITING), "t",
                         "the database never got a worker")
        # The holders' documents are still theirs, retried when due.
        for db in self.HOLDERS:
            self.assertEqual(scalar("SELECT status FROM rag.documents", db=db), "processing")

    def test_c_busy_databases_take_turns(self):
        # Each holder gets 45 documents of a provider that takes 2 s an answer, in collections of their own (one
        # call each): 90 s of work. The waiting database is served within a turn (30 s) and the launcher's round.
        for db in self.HOLDERS:
            psql("SELECT rag_create_collection('busy_' || g, embedding_model => 'hash-384@slow2000') "
                 "FROM generate_series(1, 45) g; "
                 "SELECT rag_ingest('busy_' || g, 'Busy', 'Busy document ' || g || '.') FROM generate_series(1, 45) g",
                 db=db)
        self.assertTrue(wait_until("SELECT count(*) = 4 FROM pg_stat_activity WHERE backend_type = 'rag worker' "
                                   "AND datname LIKE 'rag_e2e_turns_%' AND datname <> 'rag_e2e_turns_waiting' "
                                   "AND query LIKE 'rag worker: embedding%'", db="postgres", seconds=60),
                        "the holders' workers did not all get busy")
        started = time.time()
        psql("SELECT rag_ingest('c', 'Waiting again', 'Another document of the database that waits.')", db=self.WAITING)
        self.assertEqual(scalar("SELECT rag_wait('c', '75 seconds')", db=self.WAITING), "t",
                         "the waiting database was not served while the others stayed busy")
        self.assertLess(time.time() - started, 75)
        # Some holder still has work: it was served before the others had finished, not after.
        self.assertTrue(any(scalar("SELECT count(*) FROM rag.documents WHERE status = 'processing' AND title = 'Busy'",
                                   db=db) != "0" for db in self.HOLDERS))

    def test_b_work_held_by_another_session_does_not_keep_the_slot(self):
        # Due work the worker cannot do (a dropped collection's partition that a session keeps open: the worker
        # may not drop it) kept it in its database for as long as the session stayed open: four such copies held
        # every slot. It leaves once it has served its turn now, as a busy worker does.
        holders = []
        try:
            for db in self.HOLDERS:
                # Without test_a's failing provider, whose cool-down would let the worker leave on its own.
                psql("SELECT rag_drop_collection('never')", db=db)
                self.assertTrue(wait_until("SELECT cardinality(rag._partitions_to_drop()) = 0", db=db, seconds=30))
                psql("SELECT rag_create_collection('held', embedding_model => 'hash-384'); "
                     "SELECT rag_ingest('held', 'Held', 'A document of a collection about to be dropped.')", db=db)
                self.assertEqual(scalar("SELECT rag_wait('held', '60 seconds')", db=db), "t")
                partition = scalar("SELECT rag._chunk_partition(id) FROM rag.collections WHERE name = 'held'", db=db)
                holder = background_psql(f"BEGIN; LOCK TABLE rag.{partition} IN ACCESS SHARE MODE; SELECT 'held';",
                                         db=db)
                holders.append(holder)
                self.assertEqual(read_line(holder).strip(), "held")
                psql("SELECT rag_drop_collection('held')", db=db)
            psql("SELECT rag_ingest('c', 'Waiting behind held work', 'A document that waits behind held work.')",
                 db=self.WAITING)
            self.assertEqual(scalar("SELECT rag_wait('c', '75 seconds')", db=self.WAITING), "t",
                             "the waiting database was not served while the others held work their workers could not do")
        finally:
            for holder in holders:
                holder.communicate(input="COMMIT;\n", timeout=30)


if __name__ == "__main__":
    unittest.main()
