"""From a real driver (psycopg 3), as an application would: bound parameters, citations as JSON objects, and the
SQLSTATE, message and hint of the errors a user hits. This is the README's client example, run."""
import os
import time
import unittest

import psycopg
from psycopg.types.json import Jsonb

from support import fresh_database

DB = "rag_e2e_driver"


def connect():
    return psycopg.connect(host=os.environ["PGHOST"], port=os.environ["PGPORT"], user=os.environ["PGUSER"],
                           dbname=DB, autocommit=True)


class Driver(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        fresh_database(DB)

    @classmethod
    def tearDownClass(cls):
        with psycopg.connect(host=os.environ["PGHOST"], port=os.environ["PGPORT"], user=os.environ["PGUSER"],
                             dbname="postgres", autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")

    def test_ingest_wait_query_and_ask_with_bound_parameters(self):
        with connect() as conn:
            conn.execute("SELECT rag_create_collection(%s, embedding_model => %s, max_distance => 2)",
                         ("handbook", "hash-384"))
            (document_id,) = conn.execute(
                "SELECT rag_ingest(%s, %s, %s, metadata => %s)",
                ("handbook", "Notice", "Staff must give thirty days notice in writing.", Jsonb({"department": "hr"})),
            ).fetchone()
            self.assertIsInstance(document_id, int)
            deadline = time.time() + 60
            while not conn.execute("SELECT rag_wait(%s, '1 second')", ("handbook",)).fetchone()[0]:
                self.assertLess(time.time(), deadline, "the document was not embedded")
            rows = conn.execute("SELECT title, metadata, distance FROM rag_query(%s, %s, k => %s, filter => %s)",
                                ("handbook", "How much notice do I give?", 3, Jsonb({"department": "hr"}))).fetchall()
            self.assertEqual(rows[0][0], "Notice")
            self.assertEqual(rows[0][1], {"department": "hr"})
            self.assertIsInstance(rows[0][2], float)
            outcome, answer, citations, query_id = conn.execute(
                "SELECT outcome, answer, citations, query_id FROM rag_ask(%s, %s)",
                ("handbook", "How much notice do I give?")).fetchone()
            self.assertEqual(outcome, "answered")
            self.assertIn("thirty days", answer)
            self.assertIsInstance(citations, list)
            self.assertEqual(citations[0]["document_id"], document_id)
            self.assertEqual(citations[0]["title"], "Notice")
            self.assertIsInstance(query_id, int)

    def test_errors_carry_sqlstate_message_and_hint(self):
        with connect() as conn:
            conn.execute("SELECT rag_create_collection(%s, embedding_model => %s)", ("errors", "hash-384"))
            cases = [
                ("SELECT * FROM rag_query(%s, %s)", ("no-such-collection", "question"), "42704",
                 'collection "no-such-collection" does not exist', "rag_create_collection"),
                ("SELECT * FROM rag_ask(%s, %s)", ("errors", "   "), "22023", "empty", None),
                ("SELECT * FROM rag_query(%s, %s, filter => %s)", ("errors", "question", Jsonb([1, 2])), "22023",
                 "filter must be a JSON object", "department"),
            ]
            for sql, params, sqlstate, message, hint in cases:
                with self.subTest(sqlstate=sqlstate, message=message):
                    with self.assertRaises(psycopg.Error) as raised:
                        conn.execute(sql, params)
                    diag = raised.exception.diag
                    self.assertEqual(diag.sqlstate, sqlstate)
                    self.assertIn(message, diag.message_primary)
                    self.assertTrue(diag.message_hint, "every user-facing error has a hint")
                    if hint:
                        self.assertIn(hint, diag.message_hint)
                    self.assertNotIn("backtrace", (diag.message_detail or "").lower())


if __name__ == "__main__":
    unittest.main()
