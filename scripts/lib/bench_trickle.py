#!/usr/bin/env python3
"""A steady trickle of writes to a watched table: how long from a write's commit until its row is searchable.

Issue 15 asks that a watched table with a few writes a second keeps its latency (a row searchable within 2 s
of commit) while the bulk path exists. One session writes at a fixed rate for a while: two writes in three
insert a new row, the third rewrites an earlier one (a changed row is chunked again). Each write gives the
row a new tag, which the watch makes the document's title; the row counts as searchable once its document
is `ready` under that title (what `rag_wait` waits for: every chunk of that text embedded and stored, in the
transaction that marks it ready). The latency of a write is from its commit returning to the first
poll (every 20 ms) that finds it. Times are the client's clock, so they include the poll's own round trip.

Usage: bench_trickle.py RATE SECONDS SYNCHRONOUS_COMMIT (the libpq environment names the database).
Prints one markdown table row: the writer's synchronous_commit, writes a second, writes, p50 / p95 / max
latency in ms, writes slower than 2 s, writes rewritten before they were searchable (never waited for), writes
never seen within a minute after the last.
"""
import random
import statistics
import sys
import time

import psycopg


def main() -> None:
    rate, seconds, commit_mode = float(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
    random.seed(11)
    setup = psycopg.connect(autocommit=True)
    setup.execute("DROP TABLE IF EXISTS trickle_rows")
    setup.execute("SELECT rag_drop_collection('trickle')")
    setup.execute("CREATE TABLE trickle_rows (id integer PRIMARY KEY, tag text NOT NULL, body text NOT NULL)")
    setup.execute("SELECT rag_create_collection('trickle', embedding_model => 'hash-384')")
    setup.execute("SELECT rag_watch('trickle_rows', 'trickle', content => 'body', title => 'tag')")

    writer = psycopg.connect(autocommit=True)
    writer.execute("SELECT set_config('synchronous_commit', %s, false)", (commit_mode,))
    reader = psycopg.connect(autocommit=True)

    words = ("notice period staff leave holiday policy manager contract salary review office remote travel "
             "expense security password access badge training onboarding benefit pension health").split()
    committed: dict[str, float] = {}
    # A row rewritten before its last write was searchable: that write's text is never indexed, by design (a
    # burst costs one embedding of the final text), so it is counted apart and not waited for.
    pending_of_row: dict[int, str] = {}
    superseded = 0
    latencies: list[float] = []
    rows = 0
    writes = 0
    started = time.monotonic()
    next_write = started
    deadline = started + seconds
    while time.monotonic() < deadline or committed:
        now = time.monotonic()
        if now >= next_write and now < deadline:
            writes += 1
            tag = f"trickletag{writes}"
            body = " ".join(random.choice(words) for _ in range(120)) + f" {tag}."
            if rows and writes % 3 == 0:
                row = random.randint(1, rows)
                writer.execute("UPDATE trickle_rows SET tag = %s, body = %s WHERE id = %s", (tag, body, row))
                earlier = pending_of_row.get(row)
                if earlier in committed:
                    del committed[earlier]
                    superseded += 1
            else:
                rows += 1
                row = rows
                writer.execute("INSERT INTO trickle_rows VALUES (%s, %s, %s)", (row, tag, body))
            committed[tag] = time.monotonic()
            pending_of_row[row] = tag
            next_write += 1.0 / rate
        if committed:
            found = {title for (title,) in reader.execute(
                "SELECT d.title FROM rag.documents d JOIN rag.collections c ON c.id = d.collection_id "
                "WHERE c.name = 'trickle' AND d.status = 'ready' AND d.title = ANY (%s)", (list(committed),))}
            seen = time.monotonic()
            for tag in list(committed):
                if tag in found:
                    latencies.append(seen - committed.pop(tag))
            if time.monotonic() > deadline + 60:
                break
        time.sleep(0.02)

    lost = len(committed)
    latencies.sort()
    quantile = lambda q: latencies[min(len(latencies) - 1, int(q * len(latencies)))] * 1000
    over = sum(1 for latency in latencies if latency > 2.0)
    print(f"| {commit_mode} | {rate:g} | {writes} | {quantile(0.5):.0f} | {quantile(0.95):.0f} | "
          f"{latencies[-1] * 1000:.0f} | {over} | {superseded} | {lost} |")
    setup.execute("SELECT rag_unwatch('trickle_rows', drop_documents => true)")
    setup.execute("SELECT rag_drop_collection('trickle')")
    setup.execute("DROP TABLE trickle_rows")


if __name__ == "__main__":
    main()
