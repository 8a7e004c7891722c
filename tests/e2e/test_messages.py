"""What reaches a caller in messages from code that runs as rag's owner (red team 16): with auto_explain logging
nested statements, a reader at client_min_messages = log was sent the plans of every statement rag ran for its
search, with the keys of the rows the table's rules hid from them."""
import unittest

from support import InItsOwnDatabase, psql, scalar

DB = "rag_e2e_messages"


class Messages(InItsOwnDatabase):
    DB = DB

    def test_nested_plans_of_rags_own_statements_do_not_reach_the_caller(self):
        status, _, err = psql("LOAD 'auto_explain'", db=DB, check=False)
        if status != 0:
            self.skipTest(f"auto_explain is not installed for this server: {err.strip()}")
        psql("DROP ROLE IF EXISTS msg_reader; CREATE ROLE msg_reader LOGIN IN ROLE rag_reader; "
             "CREATE TABLE hr (id int PRIMARY KEY, person name NOT NULL, body text); "
             "ALTER TABLE hr ENABLE ROW LEVEL SECURITY; "
             "CREATE POLICY own_rows ON hr USING (person = current_user); "
             "GRANT SELECT ON hr TO msg_reader; "
             "INSERT INTO hr VALUES (1, 'msg_reader', 'Leave policy: twenty days a year.'), "
             "(7341, 'postgres', 'Termination plan ZEBRA severance for the department.'); "
             "SELECT rag_create_collection('hr', embedding_model => 'hash-384'); "
             "SELECT rag_watch('hr', 'hr', content => 'body'); "
             "SELECT rag_grant('hr', 'msg_reader', 'read')", db=DB)
        self.assertEqual(scalar("SELECT rag_wait('hr', '60 seconds')", db=DB), "t")
        # What a DBA's auto_explain setup looks like to the reader's session.
        psql("ALTER ROLE msg_reader SET session_preload_libraries = 'auto_explain'; "
             "ALTER ROLE msg_reader SET auto_explain.log_min_duration = 0; "
             "ALTER ROLE msg_reader SET auto_explain.log_nested_statements = on; "
             "ALTER ROLE msg_reader SET auto_explain.log_analyze = on", db=DB)
        try:
            status, rows, err = psql("SET client_min_messages = log; "
                                     "SELECT count(*) FROM rag_query('hr', 'termination zebra severance', 3, "
                                     "mode => 'keyword')", db=DB, user="msg_reader", check=False)
            self.assertEqual(status, 0, err)
            self.assertEqual(rows, [["0"]])
            # auto_explain is at work: the reader's own statement is logged to it.
            self.assertIn("rag_query('hr'", err)
            # Nothing of what rag ran as its owner: no plan over the collection's chunks, no hidden row's key.
            self.assertNotIn("chunks_c", err)
            self.assertNotIn("7341", err)
            self.assertNotIn("ZEBRA", err.upper().replace("'TERMINATION ZEBRA SEVERANCE'", ""))
        finally:
            psql("ALTER ROLE msg_reader RESET ALL", db=DB)
            psql("DROP OWNED BY msg_reader; DROP ROLE msg_reader", db=DB, check=False)


if __name__ == "__main__":
    unittest.main()
