"""Providers: an OpenAI-compatible server beside Ollama, keys nobody but the server can read, and a provider
that is down not stalling collections on another provider."""
import http.server
import os
import subprocess
import threading
import time
import unittest

from support import fresh_database, psql, scalar, wait_until

DB = "rag_e2e_providers"
KEY = "sk-test-5ecret-4f1a-DO-NOT-LEAK"


def start_keyed_provider(work):
    port_file = f"{work}/keyed-provider.port"
    if os.path.exists(port_file):
        os.remove(port_file)
    process = subprocess.Popen(
        ["python3", f"{os.environ['ROOT']}/testkit/provider_server.py", "--port", "0", "--port-file", port_file,
         "--require-key", KEY, "--idle-exit", "600"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(100):
        if os.path.exists(port_file) and open(port_file).read().strip():
            return process, int(open(port_file).read().strip())
        time.sleep(0.05)
    raise AssertionError("keyed provider did not start")


class Providers(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.work = os.environ.get("WORK", "/tmp/rag-test")
        cls.server, cls.port = start_keyed_provider(cls.work)
        fresh_database(DB)
        psql(f"ALTER SYSTEM SET rag.openai_api_key = '{KEY}'", db="postgres")
        secrets = f"{cls.work}/secrets"
        with open(secrets, "w") as handle:
            handle.write(f"# test keys\nopenai = {KEY}\nwrong = sk-wrong\n")
        os.chmod(secrets, 0o600)
        subprocess.run(["chown", "postgres", secrets], check=True)
        psql(f"ALTER SYSTEM SET rag.secrets_file = '{secrets}'", db="postgres")
        psql("SELECT pg_reload_conf()", db="postgres")
        time.sleep(0.5)
        for role, grant in (("leak_reader", "rag_reader"), ("leak_writer", "rag_writer"), ("leak_monitor", "pg_monitor")):
            psql(f"DROP ROLE IF EXISTS {role}; CREATE ROLE {role} LOGIN IN ROLE {grant}", db=DB)

    @classmethod
    def tearDownClass(cls):
        cls.server.terminate()
        psql("ALTER SYSTEM RESET rag.openai_api_key; ALTER SYSTEM RESET rag.secrets_file; SELECT pg_reload_conf()",
             db="postgres")

    def test_a_openai_ingest_and_ask(self):
        url = f"http://127.0.0.1:{self.port}/v1"
        psql(f"SELECT rag_create_provider('oai', 'openai', '{url}', 'rag.openai_api_key')", db=DB)
        psql("""SELECT rag_create_collection('oai', embedding_provider => 'oai', embedding_model => 'hash-384',
                                            chat_provider => 'oai', chat_model => 'chat-test', max_distance => 0.8)""", db=DB)
        psql("SELECT rag_ingest('oai', 'Handbook', 'All staff must give thirty days notice before resigning.')", db=DB)
        self.assertEqual(scalar("SELECT rag_wait('oai', '30 seconds')", db=DB), "t")
        self.assertEqual(scalar("SELECT status FROM rag.documents d JOIN rag.collections c ON c.id = d.collection_id WHERE c.name = 'oai'", db=DB), "ready")
        row = psql("SELECT outcome, prompt_tokens > 0, completion_tokens > 0 FROM rag_ask('oai', 'How much notice must staff give?')", db=DB)[0]
        self.assertEqual(row, ["answered", "t", "t"])
        self.assertEqual(scalar("SELECT title FROM rag_query('oai', 'notice before resigning', 1)", db=DB), "Handbook")

    def test_b_key_from_secrets_file_and_a_wrong_key(self):
        url = f"http://127.0.0.1:{self.port}/v1"
        psql(f"SELECT rag_create_provider('oai-file', 'openai', '{url}', 'file:openai')", db=DB)
        psql(f"SELECT rag_create_provider('oai-wrong', 'openai', '{url}', 'file:wrong')", db=DB)
        psql("SELECT rag_create_collection('oai-file', embedding_provider => 'oai-file', embedding_model => 'hash-384')", db=DB)
        psql("SELECT rag_create_collection('oai-wrong', embedding_provider => 'oai-wrong', embedding_model => 'hash-384')", db=DB)
        psql("SELECT rag_ingest('oai-file', 'Doc', 'Keys can come from a file only the server reads.')", db=DB)
        psql("SELECT rag_ingest('oai-wrong', 'Doc', 'A wrong key fails the document at once.')", db=DB)
        self.assertEqual(scalar("SELECT rag_wait('oai-file', '30 seconds') AND rag_wait('oai-wrong', '30 seconds')", db=DB), "t")
        rows = psql("""SELECT c.name, d.status, coalesce(d.failure_reason, '') FROM rag.documents d
                        JOIN rag.collections c ON c.id = d.collection_id WHERE c.name LIKE 'oai-%' ORDER BY 1""", db=DB)
        self.assertEqual(rows[0][:2], ["oai-file", "ready"])
        self.assertEqual(rows[1][:2], ["oai-wrong", "failed"])
        self.assertIn("401", rows[1][2])
        self.assertNotIn("sk-wrong", rows[1][2])

    def test_h_a_secrets_file_inside_the_data_directory_is_refused(self):
        # A base backup copies the data directory whole, and a role with REPLICATION may take one: a key file
        # there went with every backup and standby (red team 15). Refused, by absolute or relative path.
        data_directory = scalar("SHOW data_directory", db="postgres")
        inside = f"{data_directory}/rag_secrets"
        with open(inside, "w") as handle:
            handle.write(f"openai = {KEY}\n")
        os.chmod(inside, 0o600)
        subprocess.run(["chown", "postgres", inside], check=True)
        url = f"http://127.0.0.1:{self.port}/v1"
        psql(f"SELECT rag_create_provider('inside-key', 'openai', '{url}', 'file:openai')", db=DB)
        psql("SELECT rag_create_collection('inside-key', embedding_provider => 'inside-key', "
             "embedding_model => 'hash-384')", db=DB)
        try:
            for setting, title in ((inside, "Absolute"), ("rag_secrets", "Relative")):
                psql(f"ALTER SYSTEM SET rag.secrets_file = '{setting}'; SELECT pg_reload_conf()", db="postgres")
                time.sleep(0.5)
                psql(f"SELECT rag_ingest('inside-key', '{title}', '{title}: a key file inside the data directory is refused.')",
                     db=DB)
                self.assertEqual(scalar("SELECT rag_wait('inside-key', '30 seconds')", db=DB), "t")
                reason = scalar(f"SELECT d.status || ': ' || coalesce(d.failure_reason, '') FROM rag.documents d "
                                f"WHERE d.title = '{title}'", db=DB)
                self.assertTrue(reason.startswith("failed: ") and "data directory" in reason, reason)
                self.assertNotIn(KEY, reason)
        finally:
            psql(f"ALTER SYSTEM SET rag.secrets_file = '{self.work}/secrets'; SELECT pg_reload_conf()", db="postgres")
            os.remove(inside)
            time.sleep(0.5)

    def test_c_no_route_reveals_the_key(self):
        probes = [
            "SHOW rag.openai_api_key",
            "SELECT current_setting('rag.openai_api_key', true)",
            "SELECT setting FROM pg_settings WHERE name = 'rag.openai_api_key'",
            "SELECT string_agg(name || '=' || coalesce(setting, ''), ',') FROM pg_settings WHERE name LIKE 'rag.%'",
            "SELECT string_agg(coalesce(setting, ''), ',') FROM pg_file_settings",
            "SELECT * FROM rag.providers",
            "SELECT string_agg(coalesce(failure_reason, ''), ',') FROM rag.documents",
            "SELECT string_agg(coalesce(query, ''), ',') FROM pg_stat_activity",
            "SELECT pg_read_file('postgresql.auto.conf')",
            f"SELECT pg_read_file('{self.work}/secrets')",
            "SELECT string_agg(setconfig::text, ',') FROM pg_db_role_setting",
            "SELECT rag._setting('rag.openai_api_key')",
            "SELECT string_agg(reason, ',') FROM rag.queries",
            "SELECT * FROM rag_models('oai')",
        ]
        for role in ("leak_reader", "leak_writer", "leak_monitor"):
            for probe in probes:
                code, rows, stderr = psql(f"SET ROLE {role};\n{probe}", db=DB, check=False)
                seen = repr(rows) + stderr
                self.assertNotIn(KEY, seen, f"{role} read the key with: {probe}")
                self.assertNotIn("5ecret", seen, f"{role} read part of the key with: {probe}")
        # Even a superuser sees only that a key is set.
        self.assertEqual(scalar("SHOW rag.openai_api_key", db=DB), "(hidden)")

    def test_d_only_admins_create_providers(self):
        code, _, stderr = psql("SET ROLE leak_writer; SELECT rag_create_provider('evil', 'ollama', 'http://attacker.invalid')",
                               db=DB, check=False)
        self.assertNotEqual(code, 0)
        self.assertIn("permission denied", stderr)
        code, _, stderr = psql("SELECT rag_create_provider('bad', 'openai', 'http://x/v1', 'sk-literal-key-in-table')", db=DB, check=False)
        self.assertNotEqual(code, 0)
        self.assertIn("api_key_setting must be", stderr)

    def test_e_a_provider_that_hangs_does_not_stall_other_collections(self):
        provider_port = os.environ["PROVIDER_PORT"]
        psql("ALTER SYSTEM SET rag.http_timeout = '3s'; SELECT pg_reload_conf();", db="postgres")
        try:
            time.sleep(0.5)
            psql(f"SELECT rag_create_provider('hanging', 'ollama', 'http://127.0.0.1:{provider_port}')", db=DB)
            psql("SELECT rag_create_collection('stuck', embedding_provider => 'hanging', embedding_model => 'hash-384@timeout')", db=DB)
            psql("SELECT rag_create_collection('fine', embedding_model => 'hash-384')", db=DB)
            for n in range(4):
                psql(f"SELECT rag_ingest('stuck', 'Stuck {n}', 'This document waits for a provider that hangs, number {n}.')", db=DB)
            started = time.time()
            psql("SELECT rag_ingest('fine', 'Fine', 'This document is on a provider that answers.')", db=DB)
            self.assertEqual(scalar("SELECT rag_wait('fine', '60 seconds')", db=DB), "t")
            elapsed = time.time() - started
            # Four hanging documents one after another would take 4 x 3 s before this one; the breaker lets it
            # through after at most the one timeout in flight.
            self.assertLess(elapsed, 9.0, f"the healthy collection waited {elapsed:.1f} s")
            self.assertEqual(scalar("SELECT count(*) FROM rag.documents d JOIN rag.collections c ON c.id = d.collection_id "
                                    "WHERE c.name = 'stuck' AND d.status = 'processing'", db=DB), "4")
        finally:
            psql("SELECT rag_drop_collection('stuck')", db=DB)
            psql("ALTER SYSTEM RESET rag.http_timeout; SELECT pg_reload_conf();", db="postgres")

    def test_f_an_admin_cannot_read_internal_services_through_a_provider(self):
        # An HTTP service only the database server reaches: a page of secrets at any path, and a redirect to it.
        reached = []

        class Internal(http.server.BaseHTTPRequestHandler):
            def _answer(self):
                reached.append(self.path)
                if self.path.startswith("/redirect"):
                    self.send_response(302)
                    self.send_header("Location", f"http://127.0.0.1:{self.server.server_port}/secret/models")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                body = b"INTERNAL-ONLY db_password=hunter2"
                self.send_response(200 if self.command == "GET" else 500)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = _answer

            def log_message(self, *args):
                pass

        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Internal)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        port = server.server_port
        psql("DROP ROLE IF EXISTS ssrf_admin; CREATE ROLE ssrf_admin LOGIN IN ROLE rag_admin", db=DB)
        try:
            # The route rag appends cannot be swallowed by a query or fragment, nor credentials put in the URL.
            for url in (f"http://127.0.0.1:{port}/secret?x=", f"http://127.0.0.1:{port}/secret#",
                        f"http://user:pass@127.0.0.1:{port}/v1"):
                code, _, stderr = psql(f"SET ROLE ssrf_admin; SELECT rag_create_provider('ssrf', 'openai', '{url}')",
                                       db=DB, check=False)
                self.assertNotEqual(code, 0, url)
                self.assertIn("must not carry a query", stderr)
            psql(f"SET ROLE ssrf_admin; SELECT rag_create_provider('ssrf', 'openai', 'http://127.0.0.1:{port}/secret');"
                 f"SELECT rag_create_provider('ssrf-redirect', 'openai', 'http://127.0.0.1:{port}/redirect')", db=DB)
            # What the service answers is not read back: not from a page served with 200, not from an error.
            for probe in ("SELECT * FROM rag_models('ssrf')",
                          "SELECT rag_embed('hello', 'm', 'ssrf')",
                          "SELECT * FROM rag_models('ssrf-redirect')"):
                code, rows, stderr = psql(f"SET ROLE ssrf_admin; {probe}", db=DB, check=False)
                self.assertNotEqual(code, 0, probe)
                self.assertNotIn("hunter2", repr(rows) + stderr, probe)
                self.assertNotIn("INTERNAL-ONLY", repr(rows) + stderr, probe)
            # The redirect was not followed: the page it points to was asked for once, by the first probe only.
            self.assertEqual(reached, ["/secret/models", "/secret/embeddings", "/redirect/models"])
            _, _, stderr = psql("SET ROLE ssrf_admin; SELECT * FROM rag_models('ssrf-redirect')", db=DB, check=False)
            self.assertIn("HTTP 302", stderr)
        finally:
            server.shutdown()
            server.server_close()
            psql("SELECT rag_drop_provider(name) FROM rag.providers WHERE name IN ('ssrf', 'ssrf-redirect')", db=DB)
            psql("DROP ROLE IF EXISTS ssrf_admin", db=DB)

    def test_g_provider_hosts_bound_where_an_admin_points_a_provider(self):
        provider_port = os.environ["PROVIDER_PORT"]
        psql("DROP ROLE IF EXISTS hosts_admin; CREATE ROLE hosts_admin LOGIN IN ROLE rag_admin", db=DB)
        psql("ALTER SYSTEM SET rag.provider_hosts = '10.0.0.0/8, ollama.internal:11434'; SELECT pg_reload_conf()",
             db="postgres")
        try:
            self.assertTrue(wait_until("SELECT current_setting('rag.provider_hosts') <> ''", db=DB, seconds=10))
            # A non-superuser cannot change the list, for a session, their own role or a database they own; nor
            # the provider deadline, which a database owner's default carried into the worker.
            psql(f"ALTER DATABASE {DB} OWNER TO hosts_admin", db="postgres")
            try:
                for attempt in ("SET rag.provider_hosts = ''", "ALTER ROLE hosts_admin SET rag.provider_hosts = ''",
                                f"ALTER DATABASE {DB} SET rag.provider_hosts = ''",
                                "SET rag.http_timeout = '1h'", f"ALTER DATABASE {DB} SET rag.http_timeout = '1h'"):
                    code, _, stderr = psql(f"SET ROLE hosts_admin; {attempt}", db=DB, check=False)
                    self.assertNotEqual(code, 0, attempt)
                    self.assertRegex(stderr, r"permission denied to set parameter|cannot be changed now", attempt)
            finally:
                psql(f"ALTER DATABASE {DB} OWNER TO postgres", db="postgres")
            # An address the list does not hold is refused when the provider is made, with the way out.
            code, _, stderr = psql(f"SET ROLE hosts_admin; SELECT rag_create_provider('probe', 'ollama', "
                                   f"'http://127.0.0.1:{provider_port}')", db=DB, check=False)
            self.assertNotEqual(code, 0)
            self.assertIn(f"127.0.0.1:{provider_port} is not in rag.provider_hosts", stderr)
            self.assertIn("HINT:  A superuser lists the servers", stderr)
            # A name the list does not hold may be made (it may resolve into a listed block), but it reaches only
            # listed addresses: localhost resolves outside 10.0.0.0/8, so no call leaves.
            psql(f"SET ROLE hosts_admin; SELECT rag_create_provider('by-name', 'ollama', 'http://localhost:{provider_port}')",
                 db=DB)
            code, _, stderr = psql("SET ROLE hosts_admin; SELECT * FROM rag_models('by-name')", db=DB, check=False)
            self.assertNotEqual(code, 0)
            self.assertIn("localhost resolves to no address in rag.provider_hosts", stderr)
            # The worker keeps to the list too: a document of a collection on that provider fails with the reason.
            psql("SET ROLE hosts_admin; SELECT rag_create_collection('hosts', embedding_provider => 'by-name', "
                 "embedding_model => 'hash-384'); SELECT rag_ingest('hosts', 'Listed', 'Reached only through the list.')",
                 db=DB)
            self.assertTrue(wait_until("SELECT coalesce(last_error LIKE '%resolves to no address in rag.provider_hosts%', "
                                       "false) FROM rag.status WHERE collection = 'hosts'", db=DB, seconds=30),
                            psql("SELECT * FROM rag.status WHERE collection = 'hosts'", db=DB))
            # rag.ollama_url is the superuser's own: the built-in provider is not held to the list.
            self.assertEqual(scalar("SELECT count(*) > 0 FROM rag_models('ollama')", db=DB), "t")
            # Once the superuser lists the loopback block, the same provider works, in backends and in the worker
            # (which takes the reloaded list for its next call).
            psql("ALTER SYSTEM SET rag.provider_hosts = '127.0.0.0/8'; SELECT pg_reload_conf()", db="postgres")
            self.assertTrue(wait_until("SELECT current_setting('rag.provider_hosts') = '127.0.0.0/8'", db=DB, seconds=10))
            self.assertEqual(scalar("SET ROLE hosts_admin; SELECT count(*) > 0 FROM rag_models('by-name')", db=DB), "t")
            psql("SET ROLE hosts_admin; SELECT rag_reindex('hosts')", db=DB)
            self.assertEqual(scalar("SELECT rag_wait('hosts', '60 seconds')", db=DB), "t",
                             psql("SELECT * FROM rag.status WHERE collection = 'hosts'", db=DB))
            # A list that does not parse refuses every provider it governs rather than allowing them all.
            psql("ALTER SYSTEM SET rag.provider_hosts = '10.1.2.3/8'; SELECT pg_reload_conf()", db="postgres")
            self.assertTrue(wait_until("SELECT current_setting('rag.provider_hosts') = '10.1.2.3/8'", db=DB, seconds=10))
            code, _, stderr = psql("SELECT * FROM rag_models('by-name')", db=DB, check=False)
            self.assertNotEqual(code, 0)
            self.assertIn("rag.provider_hosts is not valid", stderr)
            self.assertIn("did you mean 10.0.0.0/8", stderr)
        finally:
            psql("ALTER SYSTEM RESET rag.provider_hosts; SELECT pg_reload_conf()", db="postgres")
            psql("SELECT rag_drop_collection('hosts') FROM rag.collections WHERE name = 'hosts'", db=DB)
            psql("SELECT rag_drop_provider(name) FROM rag.providers WHERE name IN ('probe', 'by-name')", db=DB)
            psql("DROP ROLE IF EXISTS hosts_admin", db=DB)


if __name__ == "__main__":
    unittest.main()
