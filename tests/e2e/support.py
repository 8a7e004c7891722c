"""Helpers for the end-to-end scenarios: psql as a subprocess (no driver to install), and the provider test
server's control API. scripts/test exports PGHOST, PGPORT, PGUSER, PROVIDER_PORT and WORK."""
import json
import os
import socket
import subprocess
import threading
import time
import unittest
import urllib.request


def psql(sql, db="rag_e2e", check=True, port=None, timeout=120, user=None):
    """Runs SQL and returns the rows as lists of strings (unaligned, tab-separated); `user` logs in as that role."""
    env = dict(os.environ)
    if port is not None:
        env["PGPORT"] = str(port)
    if user is not None:
        env["PGUSER"] = user
    result = subprocess.run(
        ["psql", "-X", "-q", "-A", "-t", "-F", "\t", "-v", "ON_ERROR_STOP=1", "-d", db],
        input=sql, capture_output=True, text=True, env=env, timeout=timeout)
    if check and result.returncode != 0:
        raise AssertionError(f"psql failed ({result.returncode}): {result.stderr}\nSQL: {sql[:500]}")
    rows = [line.split("\t") for line in result.stdout.splitlines() if line != ""]
    return rows if check else (result.returncode, rows, result.stderr)


def background_psql(sql, db="rag_e2e", port=None):
    """A psql session running `sql`, left open: it reads more from its standard input until that is closed
    (communicate(input=...) ends it), so a test can hold a lock or a transaction while it looks elsewhere."""
    env = dict(os.environ)
    if port is not None:
        env["PGPORT"] = str(port)
    process = subprocess.Popen(["psql", "-X", "-q", "-At", "-v", "ON_ERROR_STOP=1", "-d", db], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    process.stdin.write(sql + "\n")
    process.stdin.flush()
    return process


def read_line(process, seconds=120):
    """The next line `process` (a background_psql) prints. A session that never prints it (a race the test did
    not foresee, a lock it waits for) fails the test after `seconds` instead of hanging the whole run: it is
    killed, which ends the read."""
    line = []
    reader = threading.Thread(target=lambda: line.append(process.stdout.readline()), daemon=True)
    reader.start()
    reader.join(seconds)
    if reader.is_alive():
        process.kill()
        reader.join(10)
        raise AssertionError(f"the background session printed nothing in {seconds} s: {process.stderr.read()}")
    if not line or not line[0]:
        # The session ended (an error with ON_ERROR_STOP, say): what it said is the test's best clue.
        process.kill()
        raise AssertionError(f"the background session ended without printing: {process.stderr.read()}")
    return line[0]


def scalar(sql, **kwargs):
    rows = psql(sql, **kwargs)
    return rows[0][0] if rows else None


def wait_until(sql, db="rag_e2e", seconds=60, port=None):
    """Polls a boolean query until it says true; returns whether it did within the time."""
    deadline = time.time() + seconds
    while time.time() < deadline:
        if scalar(sql, db=db, port=port) == "t":
            return True
        time.sleep(0.1)
    return False


def wait_for_server(db="postgres", port=None, seconds=60):
    deadline = time.time() + seconds
    while time.time() < deadline:
        code, _, _ = psql("SELECT 1", db=db, check=False, port=port)
        if code == 0:
            return
        time.sleep(0.2)
    raise AssertionError("the server did not come back")


def provider(path, body=None):
    url = f"http://127.0.0.1:{os.environ['PROVIDER_PORT']}{path}"
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method="GET" if body is None else "POST")
    with urllib.request.urlopen(request, timeout=10) as response:
        text = response.read().decode()
    try:
        return json.loads(text)
    except ValueError:
        return text


def provider_calls(model):
    stats = provider("/_control/stats")
    entry = stats.get("models", stats).get(model) if isinstance(stats, dict) else None
    return (entry or {}).get("calls", 0), (entry or {}).get("inputs", 0)


def drop_database(name):
    """Drops a scenario's own database, with any worker connected to it (its slot is free for the next one)."""
    psql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)", db="postgres")


def fresh_database(name):
    drop_database(name)
    psql(f"CREATE DATABASE {name}", db="postgres")
    psql("CREATE EXTENSION rag CASCADE", db=name)


def as_postgres(*command, timeout=120):
    """Runs a PostgreSQL program as the postgres user (the server refuses to run as root)."""
    return subprocess.run(["runuser", "-u", "postgres", "--", *command], capture_output=True, text=True,
                          timeout=timeout)


def free_port():
    """A TCP port on 127.0.0.1 that nothing listens on now, for a cluster a scenario starts itself."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class InItsOwnDatabase(unittest.TestCase):
    """Scenarios in a database of their own, the class's DB: made fresh before them and dropped after, so that
    its worker does not hold one of rag.max_workers' slots for the scenarios that follow."""
    DB = None

    @classmethod
    def setUpClass(cls):
        fresh_database(cls.DB)

    @classmethod
    def tearDownClass(cls):
        drop_database(cls.DB)
