"""rag acts for the role whose rights the running code has, as PostgreSQL counts them. Triggers that
PostgreSQL runs as another role act through rag as that role. From PostgreSQL 18 an AFTER
trigger runs as the role whose statement queued it, without a SECURITY DEFINER function (a deferred trigger
queued inside a definer function fires at COMMIT as that function's owner); before 18 it runs as whoever is
current when it fires, and rag follows that too. (The foreign key cascade's BEFORE triggers, which run as the
referencing table's owner on every major, are in tests/regress/sql/11_security.sql, section 9h.) A member of a
role that has none of its privileges (PostgreSQL 16's WITH INHERIT FALSE, SET FALSE) is not its owner here."""
import unittest

from support import InItsOwnDatabase, background_psql, psql, scalar, wait_until

DB = "rag_e2e_identity"


class Identity(InItsOwnDatabase):
    DB = DB

    def test_deferred_trigger_queued_in_a_definer_function(self):
        psql("""
            SELECT rag_create_collection('payroll', embedding_model => 'hash-384');
            CREATE ROLE id_attacker IN ROLE rag_reader;
            CREATE SCHEMA id_attacker AUTHORIZATION id_attacker;
            SET ROLE id_attacker;
            CREATE TABLE id_attacker.log (x int);
            CREATE FUNCTION id_attacker.on_log() RETURNS trigger LANGUAGE plpgsql AS $f$
            BEGIN
                PERFORM public.rag_grant('payroll', 'id_attacker', 'admin');
                RETURN NULL;
            END $f$;
            CREATE CONSTRAINT TRIGGER later AFTER INSERT ON id_attacker.log DEFERRABLE INITIALLY DEFERRED
                FOR EACH ROW EXECUTE FUNCTION id_attacker.on_log();
            CREATE FUNCTION id_attacker.harmless() RETURNS int LANGUAGE sql SECURITY DEFINER
                SET search_path = pg_catalog AS $f$ INSERT INTO id_attacker.log VALUES (1); SELECT 1 $f$;
            RESET ROLE;
        """, db=DB)
        try:
            version = int(scalar("SHOW server_version_num", db=DB))
            # A superuser calls the attacker's function; the trigger it queued fires at COMMIT.
            code, _, err = psql("SELECT id_attacker.harmless()", db=DB, check=False)
            grants = scalar("SELECT count(*) FROM rag.collection_grants WHERE grantee = 'id_attacker'::regrole", db=DB)
            if version >= 180000:
                # It runs as the attacker: rag acts for the attacker, who may not grant, and the COMMIT fails.
                self.assertNotEqual(code, 0)
                self.assertIn("permission denied", err)
                self.assertEqual(grants, "0")
            else:
                # It runs as the superuser in PostgreSQL itself (which could do anything with that): rag follows.
                self.assertEqual(code, 0, err)
                self.assertEqual(grants, "1")
        finally:
            psql("SELECT rag_revoke('payroll', 'id_attacker'); DROP SCHEMA id_attacker CASCADE; "
                 "DROP OWNED BY id_attacker; DROP ROLE id_attacker; SELECT rag_drop_collection('payroll')", db=DB)

    def test_deferred_uniqueness_recheck_queued_in_a_definer_function(self):
        # A deferred uniqueness (here exclusion) check is a built-in trigger: at COMMIT it evaluates the table's
        # index expression, the attacker's code, with no function of its own around it. From PostgreSQL 18 it
        # runs as the role that queued it (the attacker, inside their definer function); before 18 as whoever
        # commits. rag acts for exactly that role: it reads the identity its entry point was called with.
        psql("""
            SELECT rag_create_collection('payroll', embedding_model => 'hash-384');
            CREATE ROLE id_attacker IN ROLE rag_reader;
            CREATE SCHEMA id_attacker AUTHORIZATION id_attacker;
            SET ROLE id_attacker;
            CREATE TABLE id_attacker.seen (role name);
            CREATE FUNCTION id_attacker.take_admin() RETURNS void LANGUAGE plpgsql AS $f$
            BEGIN
                INSERT INTO id_attacker.seen VALUES (current_user);
                PERFORM public.rag_grant('payroll', 'id_attacker', 'admin');
            END $f$;
            CREATE FUNCTION id_attacker.key_of(x int) RETURNS int LANGUAGE plpgsql IMMUTABLE AS $f$
            BEGIN
                IF pg_catalog.pg_trigger_depth() > 0 THEN
                    PERFORM id_attacker.take_admin();
                END IF;
                RETURN x;
            END $f$;
            CREATE TABLE id_attacker.unique_later
                (x int, EXCLUDE USING btree ((id_attacker.key_of(x)) WITH =) DEFERRABLE INITIALLY DEFERRED);
            CREATE FUNCTION id_attacker.harmless() RETURNS int LANGUAGE plpgsql SECURITY DEFINER
                SET search_path = pg_catalog AS $f$
            BEGIN
                INSERT INTO id_attacker.unique_later VALUES (1);
                INSERT INTO id_attacker.unique_later VALUES (1);
                DELETE FROM id_attacker.unique_later WHERE ctid = '(0,1)';
                RETURN 1;
            END $f$;
            GRANT ALL ON id_attacker.seen TO PUBLIC;
            RESET ROLE;
        """, db=DB)
        try:
            version = int(scalar("SHOW server_version_num", db=DB))
            code, _, err = psql("SELECT id_attacker.harmless()", db=DB, check=False)
            grants = scalar("SELECT count(*) FROM rag.collection_grants WHERE grantee = 'id_attacker'::regrole", db=DB)
            if version >= 180000:
                self.assertNotEqual(code, 0)
                self.assertIn("permission denied", err)
                self.assertEqual(grants, "0")
            else:
                # The attacker's code runs as the superuser in PostgreSQL itself, which could do anything with
                # that; rag acts for the same role PostgreSQL does, as the table shows.
                self.assertEqual(code, 0, err)
                self.assertEqual(scalar("SELECT string_agg(role, ',') FROM id_attacker.seen", db=DB), "postgres")
                self.assertEqual(grants, "1")
        finally:
            psql("SELECT rag_revoke('payroll', 'id_attacker'); DROP SCHEMA id_attacker CASCADE; "
                 "DROP OWNED BY id_attacker; DROP ROLE id_attacker; SELECT rag_drop_collection('payroll')", db=DB)

    def test_membership_without_the_owners_privileges(self):
        # From PostgreSQL 16 a role can be made a member of another WITH INHERIT FALSE, SET FALSE: it is a
        # member, but has none of that role's privileges and cannot become it. It may not act as the owner of
        # that role's table or collection through rag either (PostgreSQL 15 has no such membership).
        if int(scalar("SHOW server_version_num", db=DB)) < 160000:
            self.skipTest("memberships WITH INHERIT FALSE, SET FALSE arrived in PostgreSQL 16")
        psql("""
            CREATE ROLE id_owner IN ROLE rag_admin;
            CREATE ROLE id_member IN ROLE rag_admin;
            GRANT id_owner TO id_member WITH INHERIT FALSE, SET FALSE;
            CREATE SCHEMA id_owner AUTHORIZATION id_owner;
            GRANT USAGE ON SCHEMA id_owner TO id_member;
            SET ROLE id_owner;
            CREATE TABLE id_owner.notes (id int PRIMARY KEY, body text);
            SELECT rag_create_collection('owned', embedding_model => 'hash-384');
            RESET ROLE;
        """, db=DB)
        try:
            self.assertEqual(scalar("SELECT pg_has_role('id_member', 'id_owner', 'MEMBER')::text || "
                                    "pg_has_role('id_member', 'id_owner', 'USAGE')::text", db=DB), "truefalse")
            # Not the collection's owner: may not administer it.
            code, _, err = psql("SET ROLE id_member; SELECT rag_grant('owned', 'id_member', 'admin')",
                                db=DB, check=False)
            self.assertNotEqual(code, 0)
            # Not even a reader of it: the refusal names neither the collection nor its owner (red team 16).
            self.assertIn("permission denied for a collection you may not read", err)
            self.assertNotIn("id_owner", err)
            # Not the table's owner: may not watch it, even into a collection of its own.
            code, _, err = psql("SET ROLE id_member; SELECT rag_create_collection('mine', embedding_model => 'hash-384'); "
                                "SELECT rag_watch('id_owner.notes', 'mine', content => 'body')", db=DB, check=False)
            self.assertNotEqual(code, 0)
            self.assertIn("only the owner of id_owner.notes may watch it", err)
            self.assertEqual(scalar("SELECT count(*) FROM rag.watches", db=DB), "0")
        finally:
            psql("SELECT rag_drop_collection(name) FROM rag.collections WHERE name IN ('owned', 'mine'); "
                 "DROP SCHEMA id_owner CASCADE; DROP OWNED BY id_owner, id_member; DROP ROLE id_member, id_owner",
                 db=DB)


def reached(session, marker):
    """Reads a background session's output until the line `marker` (True) or its end (False)."""
    for line in session.stdout:
        if line.strip() == marker:
            return True
    return False


class DropRoleRacingAWrite(InItsOwnDatabase):
    """rag records roles by oid (a collection's owner, a grantee, a conversation's owner, a ledger row's role),
    which PostgreSQL's dependency tracking does not see: rag refuses a DROP ROLE after the fact, or empties the
    ledger rows' role, by looking at its tables. A row written by a transaction still open was not there to
    see, so the drop went through and the row kept an oid that a dump writes as a bare number (red team 28).
    Each writer now holds the role as PostgreSQL holds one it records (rag._lock_role)."""
    DB = "rag_e2e_drop_role_race"

    def setUp(self):
        psql("""
            DROP ROLE IF EXISTS race_victim;
            CREATE ROLE race_victim IN ROLE rag_admin;
            SELECT rag_create_collection('race', embedding_model => 'hash-384', max_distance => 2)
             WHERE NOT EXISTS (SELECT 1 FROM rag.collections WHERE name = 'race');
            SELECT rag_grant('race', 'public', 'read');
        """, db=self.DB)

    def tearDown(self):
        psql("""
            SELECT rag_drop_collection(name) FROM rag.collections WHERE name <> 'race';
            DELETE FROM rag.collection_grants;
            DELETE FROM rag.conversations;
            DELETE FROM rag.queries;
            DROP ROLE IF EXISTS race_victim;
        """, db=self.DB)

    def drop_while_written(self, write, isolation="READ COMMITTED"):
        """Runs `write` in an open transaction, then DROP ROLE in another session, then commits the write:
        returns the drop's (exit code, stderr)."""
        writer = background_psql(f"BEGIN; {write}; SELECT 'written';", db=self.DB)
        self.assertTrue(reached(writer, "written"), writer.stderr.read() if writer.poll() is not None else "")
        dropper = background_psql(f"BEGIN ISOLATION LEVEL {isolation}; DROP ROLE race_victim; COMMIT; "
                                  "SELECT 'dropped';", db=self.DB)
        self.assertTrue(wait_until("SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'object' AND NOT granted "
                                   "AND classid = 'pg_authid'::regclass)", db=self.DB),
                        "DROP ROLE did not wait for the writer")
        _, err = writer.communicate("COMMIT;\n", timeout=60)
        self.assertEqual(writer.returncode, 0, err)
        out, err = dropper.communicate(timeout=60)
        return dropper.returncode, out + err

    def test_a_role_written_in_an_open_transaction_is_not_dropped(self):
        for write in ("SELECT rag_grant('race', 'race_victim', 'read')",
                      "SET ROLE race_victim; SELECT rag_conversation_start('race')",
                      "SET ROLE race_victim; SELECT rag_create_collection('race_own', embedding_model => 'hash-384')"):
            with self.subTest(write=write):
                code, output = self.drop_while_written(write)
                self.assertNotEqual(code, 0, output)
                self.assertIn('role "race_victim" cannot be dropped because objects of rag depend on it', output)
                self.tearDown()
                self.setUp()

    def test_a_drop_in_a_repeatable_read_transaction_fails_to_serialize(self):
        # Its snapshot was taken before it waited for the writer, and does not see the row: it looks again
        # under the latest snapshot and fails as PostgreSQL fails what it cannot serialize.
        for isolation in ("REPEATABLE READ", "SERIALIZABLE"):
            for write in ("SELECT rag_grant('race', 'race_victim', 'read')",
                          "SET ROLE race_victim; SELECT count(*) FROM rag_query('race', 'parking')"):
                with self.subTest(isolation=isolation, write=write):
                    code, output = self.drop_while_written(write, isolation)
                    self.assertNotEqual(code, 0, output)
                    self.assertIn("could not serialize access", output)
                    self.assertEqual(scalar("SELECT count(*) FROM pg_roles WHERE rolname = 'race_victim'",
                                            db=self.DB), "1")
                    self.tearDown()
                    self.setUp()

    def test_a_ledger_row_written_in_an_open_transaction_loses_the_dropped_role(self):
        code, output = self.drop_while_written("SET ROLE race_victim; SELECT count(*) FROM rag_query('race', 'parking')")
        self.assertEqual(code, 0, output)
        self.assertEqual(scalar("SELECT count(*) FILTER (WHERE role_id IS NULL) || '/' || count(*) FROM rag.queries "
                                "WHERE role = 'race_victim'", db=self.DB), "1/1")

    def test_a_write_after_the_drop_fails(self):
        dropper = background_psql("BEGIN; DROP ROLE race_victim; SELECT 'dropped';", db=self.DB)
        self.assertTrue(reached(dropper, "dropped"))
        writer = background_psql("SELECT rag_grant('race', 'race_victim', 'read');", db=self.DB)
        self.assertTrue(wait_until("SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'object' AND NOT granted "
                                   "AND classid = 'pg_authid'::regclass)", db=self.DB),
                        "the grant did not wait for the drop")
        _, err = dropper.communicate("COMMIT;\n", timeout=60)
        self.assertEqual(dropper.returncode, 0, err)
        _, err = writer.communicate(timeout=60)
        self.assertNotEqual(writer.returncode, 0)
        self.assertIn("was dropped while this statement ran", err)
        self.assertEqual(scalar("SELECT count(*) FROM rag.collection_grants WHERE grantee <> 0", db=self.DB), "0")


if __name__ == "__main__":
    unittest.main()
