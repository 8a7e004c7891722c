"""Retrieval and refusal quality of the extension on the Debian FAQ (tests/eval/corpus.py), measured the way a user
runs it: rag_create_collection, rag_ingest, rag_query, rag_ask. Prints a Markdown report (also written to
target/eval/results.md); scripts/eval starts the cluster and runs this. Quality is measured here, never in the
test suite, which pins behaviour.

Ranking, per search mode (and hybrid reranked by the collection's cross-encoder), over the FAQ's own questions (each answer was ingested without its question):
  recall@1/5/10  the top 1/5/10 chunks hold a chunk of the answer's document;
  MRR@10         mean of 1/rank of the first such chunk (0 past 10);
  doc recall@5   the answer's document among the first 5 distinct documents.
Refusal, with rag_ask as a user calls it (no chat model, so extractive and no chat call; the distance ceiling, or
with the reranker its relevance threshold), per mode: answerable questions kept, off-domain and
in-domain-unanswerable questions refused. For the reranked mode, a sweep of the relevance threshold over the best
relevance rag_ask reported shows where the default (src/limits.rs) sits."""
import json
import os
import statistics
import sys
import time

import psycopg

from corpus import HANDBOOK, HOUSE_RULES, IN_DOMAIN_UNANSWERABLE, OFF_DOMAIN, sections

COLLECTION = os.environ.get("RAG_EVAL_COLLECTION", "faq")
MODEL = os.environ.get("RAG_EVAL_MODEL", "all-MiniLM-L6-v2")
# Chunks of the same size for every model, so models are compared on the same chunks (NULL: the model's default,
# which for all-MiniLM-L6-v2 is 512 characters and for a 512-token model 1000).
CHUNK_SIZE = os.environ.get("RAG_EVAL_CHUNK_SIZE")
CHUNK_OVERLAP = os.environ.get("RAG_EVAL_CHUNK_OVERLAP")
RERANKER = os.environ.get("RAG_EVAL_RERANKER", "ms-marco-MiniLM-L-12-v2")
# (label, search mode, reranked)
MODES = (("vector", "vector", False), ("keyword", "keyword", False), ("hybrid", "hybrid", False),
         ("hybrid+rerank", "hybrid", True))
THRESHOLDS = (-8, -6, -5, -4, -3, -2, -1, 0, 1)


def percentile(values, p):
    values = sorted(values)
    if not values:
        return float("nan")
    index = min(len(values) - 1, max(0, round(p / 100 * (len(values) - 1))))
    return values[index]


def load(conn, pairs):
    conn.execute("SELECT rag_drop_collection(%s)", (COLLECTION,))
    conn.execute("SELECT rag_create_collection(%s, embedding_provider => 'local', embedding_model => %s, "
                 "chunk_size => %s::integer, chunk_overlap => %s::integer)",
                 (COLLECTION, MODEL, CHUNK_SIZE, CHUNK_OVERLAP))
    for number, _question, answer in pairs:
        conn.execute("SELECT rag_ingest(%s, %s, %s, metadata => %s)",
                     (COLLECTION, f"Debian FAQ {number}", answer, json.dumps({"section": number})))
    started = time.time()
    ready = conn.execute("SELECT rag_wait(%s, '600 seconds')", (COLLECTION,)).fetchone()[0]
    if not ready:
        sys.exit("the collection was not embedded within 600 s")
    chunks = conn.execute("SELECT count(*) FROM rag.chunks ch JOIN rag.collections c ON c.id = ch.collection_id "
                          "WHERE c.name = %s", (COLLECTION,)).fetchone()[0]
    return chunks, time.time() - started


def set_reranker(conn, reranked, gate=True):
    """The reranker on or off; without the gate its threshold is out of the way (as max_distance => 2 puts the
    distance ceiling out of the way), so the ranking measures order, not refusal."""
    conn.execute("SELECT rag_set_reranker(%s, %s, min_relevance => %s)",
                 (COLLECTION, RERANKER if reranked else None,
                  None if gate else -100))


def ranking(conn, pairs, mode):
    ranks, document_hits, latencies = [], 0, []
    for number, question, _answer in pairs:
        started = time.perf_counter()
        rows = conn.execute(
            "SELECT metadata->>'section' FROM rag_query(%s, %s, k => 20, max_distance => 2, mode => %s)",
            (COLLECTION, question, mode)).fetchall()
        latencies.append((time.perf_counter() - started) * 1000)
        sections_found = [row[0] for row in rows]
        rank = next((i + 1 for i, found in enumerate(sections_found) if found == number), None)
        ranks.append(rank)
        distinct = list(dict.fromkeys(sections_found))
        document_hits += number in distinct[:5]
    n = len(pairs)
    return {
        "recall@1": sum(1 for r in ranks if r and r <= 1) / n,
        "recall@5": sum(1 for r in ranks if r and r <= 5) / n,
        "recall@10": sum(1 for r in ranks if r and r <= 10) / n,
        "mrr@10": sum(1 / r for r in ranks if r and r <= 10) / n,
        "doc_recall@5": document_hits / n,
        "p50_ms": percentile(latencies, 50),
        "p95_ms": percentile(latencies, 95),
    }


def refusal(conn, pairs, mode):
    conn.execute("UPDATE rag.collections SET search_mode = %s WHERE name = %s", (mode, COLLECTION))
    latencies = []

    def ask(question):
        started = time.perf_counter()
        outcome, nearest, best = conn.execute(
            "SELECT outcome, nearest_distance, best_relevance FROM rag_ask(%s, %s)", (COLLECTION, question)).fetchone()
        latencies.append((time.perf_counter() - started) * 1000)
        return outcome, nearest, best

    answerable = [ask(q) for _n, q, _a in pairs]
    off = [ask(q) for q in OFF_DOMAIN]
    unanswerable = [ask(q) for q in IN_DOMAIN_UNANSWERABLE]
    return {
        "answerable_kept": sum(o == "answered" for o, _, _ in answerable) / len(answerable),
        "off_domain_refused": sum(o != "answered" for o, _, _ in off) / len(off),
        "unanswerable_refused": sum(o != "answered" for o, _, _ in unanswerable) / len(unanswerable),
        "nearest_answerable": [d for _, d, _ in answerable if d is not None],
        "nearest_off_domain": [d for _, d, _ in off if d is not None],
        "nearest_unanswerable": [d for _, d, _ in unanswerable if d is not None],
        "best_answerable": [b for _, _, b in answerable if b is not None],
        "best_off_domain": [b for _, _, b in off if b is not None],
        "best_unanswerable": [b for _, _, b in unanswerable if b is not None],
        "ask_p50_ms": percentile(latencies, 50),
        "ask_p95_ms": percentile(latencies, 95),
    }


def paraphrases(conn, label, passages):
    """A paraphrase set: per way of refusing, how many questions are answered from the right passage, and how
    many of the off-domain questions asked of the same small collection are refused."""
    name = COLLECTION + "-paraphrases"
    conn.execute("SELECT rag_drop_collection(%s)", (name,))
    conn.execute("SELECT rag_create_collection(%s, embedding_provider => 'local', embedding_model => %s)", (name, MODEL))
    for title, passage, _question in passages:
        conn.execute("SELECT rag_ingest(%s, %s, %s)", (name, title, passage))
    if not conn.execute("SELECT rag_wait(%s, '300 seconds')", (name,)).fetchone()[0]:
        sys.exit(f"the {label} was not embedded within 300 s")
    rows = []
    for search, reranked, min_lead in (("hybrid, distance ceiling", False, None),
                                       ("hybrid+rerank, relevance threshold alone", True, 0),
                                       ("hybrid+rerank, threshold and lead (the default)", True, None)):
        conn.execute("SELECT rag_set_reranker(%s, %s, min_lead => coalesce(%s::real, rag._limit('min_lead_default')::real))",
                     (name, RERANKER if reranked else None, min_lead))
        right = 0
        for title, _passage, question in passages:
            outcome, citations = conn.execute("SELECT outcome, citations FROM rag_ask(%s, %s)", (name, question)).fetchone()
            right += outcome == "answered" and bool(citations) and citations[0].get("title") == title
        refused = sum(conn.execute("SELECT outcome FROM rag_ask(%s, %s)", (name, q)).fetchone()[0] != "answered"
                      for q in OFF_DOMAIN)
        rows.append((label, search, right, len(passages), refused))
    conn.execute("SELECT rag_drop_collection(%s)", (name,))
    return rows


def spread(values):
    if not values:
        return "none"
    return f"{min(values):.2f} / {statistics.median(values):.2f} / {max(values):.2f}"


def main():
    pairs = sections()
    with psycopg.connect(autocommit=True) as conn:
        chunks, load_seconds = load(conn, pairs)
        ceiling = conn.execute("SELECT max_distance FROM rag.collections WHERE name = %s", (COLLECTION,)).fetchone()[0]
        chat_calls_before = conn.execute("SELECT coalesce(sum(chat_calls), 0) FROM rag.queries").fetchone()[0]
        min_relevance = conn.execute("SELECT rag._limit('min_relevance_default')").fetchone()[0]
        candidates = conn.execute("SELECT rag._limit('rerank_candidates_default')").fetchone()[0]
        results = {}
        modes = [m for m in MODES if m[0] in os.environ.get("RAG_EVAL_MODES", ",".join(m[0] for m in MODES)).split(",")]
        for label, mode, reranked in modes:
            set_reranker(conn, reranked, gate=False)
            # A new session per mode: each backend caches question embeddings, which would make later modes look
            # faster than the first.
            with psycopg.connect(autocommit=True) as fresh:
                results[label] = ranking(fresh, pairs, mode)
            conn.execute("SELECT rag_set_reranker(%s, %s, min_relevance => %s::real)",
                         (COLLECTION, RERANKER if reranked else None, min_relevance))
            results[label].update(refusal(conn, pairs, mode))
        paraphrased = (paraphrases(conn, "handbook", HANDBOOK)
                       + paraphrases(conn, "house rules", HOUSE_RULES))
        chat_calls = conn.execute("SELECT coalesce(sum(chat_calls), 0) FROM rag.queries").fetchone()[0] - chat_calls_before

    lines = [
        f"Debian FAQ (debian-faq package): {len(pairs)} questions over {len(pairs)} answers ({chunks} chunks), "
        f"{len(OFF_DOMAIN)} off-domain and {len(IN_DOMAIN_UNANSWERABLE)} in-domain unanswerable questions; "
        f"model {MODEL} (provider local), distance ceiling {ceiling}; embedded in {load_seconds:.0f} s. "
        f"Reranked: {RERANKER} over the best {candidates} hybrid candidates, relevance threshold {min_relevance}.",
        "",
        "| mode | recall@1 | recall@5 | recall@10 | MRR@10 | doc recall@5 | rag_query p50 / p95 ms | rag_ask p50 / p95 ms | answerable kept | off-domain refused | unanswerable refused |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for mode, r in results.items():
        lines.append(
            f"| {mode} | {r['recall@1']:.2f} | {r['recall@5']:.2f} | {r['recall@10']:.2f} | {r['mrr@10']:.2f} | "
            f"{r['doc_recall@5']:.2f} | {r['p50_ms']:.1f} / {r['p95_ms']:.1f} | "
            f"{r['ask_p50_ms']:.0f} / {r['ask_p95_ms']:.0f} | {r['answerable_kept']:.2f} | "
            f"{r['off_domain_refused']:.2f} | {r['unanswerable_refused']:.2f} |")
    reranked = results.get("hybrid+rerank")
    lines += [] if reranked is None else [
        "",
        "Best relevance (reranker logit) of the question's candidates, min / median / max: "
        f"answerable {spread(reranked['best_answerable'])}; off-domain {spread(reranked['best_off_domain'])}; "
        f"in-domain unanswerable {spread(reranked['best_unanswerable'])}.",
        "",
        "Relevance threshold sweep (a question passes when its best relevance reaches the threshold; rag_ask also "
        "needs a sentence to quote, so the answered share at the default can be a little lower):",
        "",
        "| threshold | answerable passing | off-domain refused | unanswerable refused |",
        "|---|---|---|---|",
    ]
    for threshold in THRESHOLDS if reranked else ():
        def share(values, passing):
            return sum((v >= threshold) == passing for v in values) / len(values) if values else float("nan")
        lines.append(f"| {threshold} | {share(reranked['best_answerable'], True):.2f} | "
                     f"{share(reranked['best_off_domain'], False):.2f} | "
                     f"{share(reranked['best_unanswerable'], False):.2f} |")
    lines += ["", f"Paraphrases (short passages, each asked about in other words: a {len(HANDBOOK)}-passage staff "
              f"handbook and {len(HOUSE_RULES)} house rules; then the {len(OFF_DOMAIN)} off-domain questions asked of "
              "each collection):", "",
              "| set | search | answered from the right passage | off-domain refused |", "|---|---|---|---|"]
    lines += [f"| {label} | {search} | {right} of {total} | {refused} of {len(OFF_DOMAIN)} |"
              for label, search, right, total, refused in paraphrased]
    lines += ["", f"Chat calls made by all of the above: {chat_calls} (no chat model: answers are extractive)."]
    vector = results.get("vector")
    lines += [] if vector is None else [
        "Nearest distance (vector side) of the question's best chunk, min / median / max: "
        f"answerable {min(vector['nearest_answerable']):.3f} / {statistics.median(vector['nearest_answerable']):.3f} / "
        f"{max(vector['nearest_answerable']):.3f}; off-domain {min(vector['nearest_off_domain']):.3f} / "
        f"{statistics.median(vector['nearest_off_domain']):.3f} / {max(vector['nearest_off_domain']):.3f}; "
        f"in-domain unanswerable {min(vector['nearest_unanswerable']):.3f} / "
        f"{statistics.median(vector['nearest_unanswerable']):.3f} / {max(vector['nearest_unanswerable']):.3f}.",
    ]
    report = "\n".join(lines)
    print(report)
    # The repository's target/ (ignored by git), also when this file is run by hand from its own directory.
    root = os.environ.get("ROOT") or os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
    out = os.path.join(root, "target", "eval")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "results.md"), "w") as f:
        f.write(report + "\n")


if __name__ == "__main__":
    main()
