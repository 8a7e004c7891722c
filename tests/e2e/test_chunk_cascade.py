"""A document's chunks go with it although rag.chunks, partitioned by collection, has no foreign key to
rag.documents (rag._ensure_partition says why): the statement trigger rag._documents_deleted deletes them, and
every writer of chunks locks and updates the document's row first. So a delete that meets a store under way
waits for it and then deletes what it stored (read committed), or fails as a serialization error and deletes
nothing (repeatable read): never a document gone with its chunks left behind, which a search that does not
join the documents would still return."""
import unittest
from functools import partial

from support import background_psql as background_psql_in
from support import InItsOwnDatabase
from support import psql as psql_in
from support import scalar as scalar_in
from support import wait_until as wait_until_in
from support import read_line

DB = "rag_e2e_chunk_cascade"
psql = partial(psql_in, db=DB)
scalar = partial(scalar_in, db=DB)
background_psql = partial(background_psql_in, db=DB)
wait_until = partial(wait_until_in, db=DB)

# What the worker's first batch of a document does (rag._store_chunks): lock the document, write its chunks,
# update its counts.
STORE = ("SELECT rag._store_chunks({id}, 0, ARRAY['first part', 'second part'], ARRAY[0, 11], ARRAY[10, 22], "
         "ARRAY[2, 2], ARRAY[NULL, NULL]::integer[]) AS stored;")


class ChunkCascade(InItsOwnDatabase):
    DB = DB

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        psql("SELECT rag_create_collection('cascade', embedding_model => 'hash-384', dimensions => 384)")

    def document(self, title):
        # Not queued, so that the worker leaves it to the test.
        return scalar("INSERT INTO rag.documents (collection_id, title, body, content_sha256, status) "
                      f"SELECT id, '{title}', 'first part second part', decode(md5('{title}'), 'hex'), 'processing' "
                      "FROM rag.collections WHERE name = 'cascade' RETURNING id")

    def wait_for_lock(self, marker):
        self.assertTrue(wait_until("SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                                   f"AND query LIKE '%{marker}%' AND pid <> pg_backend_pid())", seconds=30),
                        "the delete did not wait for the store")

    def test_a_delete_waits_for_a_store_and_takes_its_chunks(self):
        document = self.document("read committed")
        store = background_psql("BEGIN;\n" + STORE.format(id=document))
        try:
            self.assertEqual(read_line(store).strip(), "2")
            delete = background_psql(f"SELECT rag_delete_document({document}) AS deleted_while_stored;")
            self.wait_for_lock("deleted_while_stored")
        finally:
            out, err = store.communicate(input="COMMIT;\n", timeout=60)
        self.assertEqual(store.returncode, 0, err)
        out, err = delete.communicate(timeout=60)
        self.assertEqual((delete.returncode, out.strip()), (0, "t"), err)
        self.assertEqual(scalar(f"SELECT count(*) FROM rag.documents WHERE id = {document}"), "0")
        self.assertEqual(scalar(f"SELECT count(*) FROM rag.chunks WHERE document_id = {document}"), "0",
                         "the document is gone and its chunks are left")

    def test_b_a_repeatable_read_delete_that_missed_a_store_fails_and_keeps_both(self):
        document = self.document("repeatable read")
        # The delete's snapshot is taken before the store begins; it cannot see the chunks stored after it.
        delete = background_psql("BEGIN ISOLATION LEVEL REPEATABLE READ;\nSELECT 'snapshot taken';")
        try:
            self.assertEqual(read_line(delete).strip(), "snapshot taken")
            self.assertEqual(scalar(STORE.format(id=document)), "2")
            out, err = delete.communicate(input=f"SELECT rag_delete_document({document});\nCOMMIT;\n", timeout=60)
        finally:
            if delete.poll() is None:
                delete.kill()
        self.assertNotEqual(delete.returncode, 0)
        self.assertIn("could not serialize access due to concurrent update", err)
        self.assertEqual(scalar(f"SELECT count(*) FROM rag.documents WHERE id = {document}"), "1")
        self.assertEqual(scalar(f"SELECT count(*) FROM rag.chunks WHERE document_id = {document}"), "2")
        # Deleted again, afresh: both go.
        self.assertEqual(scalar(f"SELECT rag_delete_document({document})"), "t")
        self.assertEqual(scalar(f"SELECT count(*) FROM rag.chunks WHERE document_id = {document}"), "0")


if __name__ == "__main__":
    unittest.main()
