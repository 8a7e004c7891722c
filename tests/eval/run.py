"""Retrieval and refusal quality of the extension, measured the way a user runs it: rag_create_collection,
rag_ingest, rag_query, rag_ask. Two corpora (tests/eval/corpus.py): the Debian FAQ, its own questions asked of its
answers, and 70 pages of the PostgreSQL 15 manual with questions written for them (tests/eval/pgdocs_set.py).
Prints a Markdown report (also written to target/eval/results.md); scripts/eval starts the cluster and runs this.
Quality is measured here, never in the test suite, which pins behaviour.

Ranking, per search mode (and hybrid reranked by the collection's cross-encoder), with rag_query(k => 20), or
k => 10 when reranked (the reranker reads at least k candidates, so k => 20 would rerank 20 whatever the
collection's rerank_candidates; every measure below needs only the first 10):
  recall@1/5/10  the top 1/5/10 chunks hold the answer: on the FAQ a chunk of the answer's document (its gold is a
                 whole section), on the manual the chunk holding the answering sentence's words;
  MRR@10         mean of 1/rank of the first such chunk (0 past 10);
  doc recall@5   the answer's document among the first 5 distinct documents.
Refusal, with rag_ask as a user calls it (no chat model, so extractive and no chat call; the distance ceiling, or
with the reranker its relevance threshold), per mode: answerable questions kept, off-domain and
in-domain-unanswerable questions refused. For the reranked mode, a sweep of the relevance threshold over the best
relevance rag_ask reported shows where the default (src/limits.rs) sits.

RAG_EVAL_CORPORA (default "faq,pgdocs") chooses the corpora; RAG_EVAL_DUMP=FILE writes every ranked candidate
(distance, relevance, whether it holds the answer) as JSON, for trying orderings offline."""
import json
import os
import statistics
import sys
import time

import psycopg

from corpus import HANDBOOK, HOUSE_RULES, OFF_DOMAIN, Corpus, debian_faq, postgresql_manual

MODEL = os.environ.get("RAG_EVAL_MODEL", "all-MiniLM-L6-v2")
# Chunks of the same size for every model, so models are compared on the same chunks (NULL: the model's default,
# which for all-MiniLM-L6-v2 is 768 characters and for a 512-token model 1000).
CHUNK_SIZE = os.environ.get("RAG_EVAL_CHUNK_SIZE")
CHUNK_OVERLAP = os.environ.get("RAG_EVAL_CHUNK_OVERLAP")
RERANKER = os.environ.get("RAG_EVAL_RERANKER", "ms-marco-MiniLM-L-12-v2")
# How many of the search's candidates the reranker rescores (NULL: the collection's default).
CANDIDATES = os.environ.get("RAG_EVAL_CANDIDATES")
CORPORA = {"faq": debian_faq, "pgdocs": postgresql_manual}
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


def normalised(text):
    return " ".join(text.split())


def load(conn, corpus: Corpus):
    conn.execute("SELECT rag_drop_collection(%s)", (corpus.collection,))
    conn.execute("SELECT rag_create_collection(%s, embedding_provider => 'local', embedding_model => %s, "
                 "chunk_size => %s::integer, chunk_overlap => %s::integer)",
                 (corpus.collection, MODEL, CHUNK_SIZE, CHUNK_OVERLAP))
    for document in corpus.documents:
        conn.execute("SELECT rag_ingest(%s, %s, %s, metadata => %s, format => %s)",
                     (corpus.collection, document.title, document.body, json.dumps({"key": document.key}),
                      document.format))
    started = time.time()
    ready = conn.execute("SELECT rag_wait(%s, '1200 seconds')", (corpus.collection,)).fetchone()[0]
    if not ready:
        sys.exit(f"the collection {corpus.collection} was not embedded within 1200 s")
    contents = [normalised(row[0]) for row in conn.execute(
        "SELECT ch.content FROM rag.chunks ch JOIN rag.collections c ON c.id = ch.collection_id WHERE c.name = %s",
        (corpus.collection,))]
    # The chunker may cut an answering sentence in two: such a question's answer is then held by either part.
    for question in corpus.questions:
        if question.phrase is not None and not any(question.phrase in content for content in contents):
            words = question.phrase.split()
            halves = (" ".join(words[:len(words) // 2]), " ".join(words[len(words) // 2:]))
            if not any(half in content for half in halves for content in contents):
                sys.exit(f"the answer to {question.text!r} is in no chunk of {corpus.collection}")
            question.parts = halves
    return len(contents), time.time() - started


def set_reranker(conn, collection, reranked, gate=True):
    """The reranker on or off; without the gate its threshold is out of the way (as max_distance => 2 puts the
    distance ceiling out of the way), so the ranking measures order, not refusal."""
    conn.execute("SELECT rag_set_reranker(%s, %s, rerank_candidates => %s::integer, min_relevance => %s)",
                 (collection, RERANKER if reranked else None, CANDIDATES, None if gate else -100))


def ranking(conn, corpus: Corpus, mode, reranked, dump):
    ranks, document_hits, latencies = [], 0, []
    for question in corpus.questions:
        started = time.perf_counter()
        rows = conn.execute(
            "SELECT metadata->>'key', content, distance, relevance "
            "FROM rag_query(%s, %s, k => %s, max_distance => 2, mode => %s)",
            (corpus.collection, question.text, 10 if reranked and dump is None else 20, mode)).fetchall()
        latencies.append((time.perf_counter() - started) * 1000)
        hits = [key == question.key and question.held_by(normalised(content))
                for key, content, _distance, _relevance in rows]
        rank = next((i + 1 for i, hit in enumerate(hits) if hit), None)
        ranks.append((rank, question.kind))
        distinct = list(dict.fromkeys(key for key, _content, _distance, _relevance in rows))
        document_hits += question.key in distinct[:5]
        if dump is not None:
            dump.append({"corpus": corpus.name, "mode": mode, "question": question.text, "kind": question.kind,
                         "candidates": [{"key": key, "hit": hit, "distance": distance, "relevance": relevance}
                                        for (key, _content, distance, relevance), hit in zip(rows, hits)]})

    def measures(selected):
        n = len(selected) or 1
        return {
            "n": len(selected),
            "recall@1": sum(1 for r in selected if r and r <= 1) / n,
            "recall@5": sum(1 for r in selected if r and r <= 5) / n,
            "recall@10": sum(1 for r in selected if r and r <= 10) / n,
            "mrr@10": sum(1 / r for r in selected if r and r <= 10) / n,
        }

    result = measures([rank for rank, _kind in ranks])
    result.update({
        "doc_recall@5": document_hits / len(corpus.questions),
        "p50_ms": percentile(latencies, 50),
        "p95_ms": percentile(latencies, 95),
        "kinds": {kind: measures([rank for rank, k in ranks if k == kind])
                  for kind in sorted({kind for _rank, kind in ranks})},
    })
    return result


def candidates(conn, collection, question, mode=None):
    """Every candidate of a question as rag_query ranks it with the gates out of the way (the caller has set
    the reranker's threshold to -100): the first one's relevance, distance and lead are what refusal decides on."""
    return [{"title": title, "distance": distance, "relevance": relevance}
            for title, distance, relevance in conn.execute(
                "SELECT title, distance, relevance FROM rag_query(%s, %s, k => 20, max_distance => 2, mode => %s)",
                (collection, question, mode)).fetchall()]


def dump_refused(conn, corpus: Corpus, mode, dump):
    """For trying refusal rules offline: the off-domain and unanswerable questions' candidates."""
    set_reranker(conn, corpus.collection, True, gate=False)
    for kind, questions in (("off-domain", OFF_DOMAIN), ("unanswerable", corpus.unanswerable)):
        for question in questions:
            dump.append({"corpus": corpus.name, "mode": mode, "question": question, "kind": kind,
                         "candidates": candidates(conn, corpus.collection, question, mode)})


def refusal(conn, corpus: Corpus, mode):
    conn.execute("UPDATE rag.collections SET search_mode = %s WHERE name = %s", (mode, corpus.collection))
    latencies = []

    def ask(question):
        started = time.perf_counter()
        outcome, nearest, best = conn.execute(
            "SELECT outcome, nearest_distance, best_relevance FROM rag_ask(%s, %s)",
            (corpus.collection, question)).fetchone()
        latencies.append((time.perf_counter() - started) * 1000)
        return outcome, nearest, best

    answerable = [ask(q.text) for q in corpus.questions]
    off = [ask(q) for q in OFF_DOMAIN]
    unanswerable = [ask(q) for q in corpus.unanswerable]
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


def paraphrases(conn, label, passages, dump=None):
    """A paraphrase set: per way of refusing, how many questions are answered from the right passage, and how
    many of the off-domain questions asked of the same small collection are refused."""
    name = "paraphrases"
    conn.execute("SELECT rag_drop_collection(%s)", (name,))
    conn.execute("SELECT rag_create_collection(%s, embedding_provider => 'local', embedding_model => %s)", (name, MODEL))
    for title, passage, _question in passages:
        conn.execute("SELECT rag_ingest(%s, %s, %s)", (name, title, passage))
    if not conn.execute("SELECT rag_wait(%s, '300 seconds')", (name,)).fetchone()[0]:
        sys.exit(f"the {label} was not embedded within 300 s")
    if dump is not None:
        set_reranker(conn, name, True, gate=False)
        for kind, asked in (("paraphrase", [(title, question) for title, _passage, question in passages]),
                            ("off-domain", [(None, question) for question in OFF_DOMAIN])):
            for title, question in asked:
                dump.append({"corpus": label, "mode": "hybrid", "question": question, "kind": kind, "gold": title,
                             "candidates": candidates(conn, name, question)})
        conn.execute("SELECT rag_set_reranker(%s, %s, min_relevance => rag._limit('min_relevance_default')::real)",
                     (name, RERANKER))
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


def spread(values, digits=2):
    if not values:
        return "none"
    return " / ".join(f"{value:.{digits}f}" for value in (min(values), statistics.median(values), max(values)))


def spreads(what, result, measure, digits=2):
    """One measure's min / median / max over each group of questions."""
    return (f"{what}, min / median / max: answerable {spread(result[measure + '_answerable'], digits)}; "
            f"off-domain {spread(result[measure + '_off_domain'], digits)}; "
            f"in-domain unanswerable {spread(result[measure + '_unanswerable'], digits)}.")


def evaluate(conn, corpus: Corpus, dump):
    """The report's lines for one corpus."""
    chunks, load_seconds = load(conn, corpus)
    ceiling = conn.execute("SELECT max_distance FROM rag.collections WHERE name = %s",
                           (corpus.collection,)).fetchone()[0]
    min_relevance = conn.execute("SELECT rag._limit('min_relevance_default')").fetchone()[0]
    candidates = CANDIDATES or conn.execute("SELECT rag._limit('rerank_candidates_default')").fetchone()[0]
    results = {}
    wanted = os.environ.get("RAG_EVAL_MODES", ",".join(m[0] for m in MODES)).split(",")
    for label, mode, reranked in [m for m in MODES if m[0] in wanted]:
        set_reranker(conn, corpus.collection, reranked, gate=False)
        # A new session per mode: each backend caches question embeddings, which would make later modes look
        # faster than the first.
        with psycopg.connect(autocommit=True) as fresh:
            results[label] = ranking(fresh, corpus, mode, reranked, dump)
        if dump is not None and reranked:
            dump_refused(conn, corpus, mode, dump)
        conn.execute("SELECT rag_set_reranker(%s, %s, rerank_candidates => %s::integer, min_relevance => %s::real)",
                     (corpus.collection, RERANKER if reranked else None, CANDIDATES, min_relevance))
        results[label].update(refusal(conn, corpus, mode))

    lines = [
        f"{corpus.description}: {len(corpus.questions)} questions over {len(corpus.documents)} documents "
        f"({chunks} chunks), {len(OFF_DOMAIN)} off-domain and {len(corpus.unanswerable)} in-domain unanswerable "
        f"questions; gold: {corpus.gold}. Model {MODEL} (provider local), distance ceiling {ceiling}; embedded in "
        f"{load_seconds:.0f} s. Reranked: {RERANKER} over the best {candidates} hybrid candidates, relevance "
        f"threshold {min_relevance}.",
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
    kinds = sorted({kind for r in results.values() for kind in r["kinds"]})
    if len(kinds) > 1:
        lines += ["", "Per kind of question, recall@5 / MRR@10:", "",
                  "| mode | " + " | ".join(f"{kind} ({results[next(iter(results))]['kinds'][kind]['n']})"
                                          for kind in kinds) + " |",
                  "|---|" + "---|" * len(kinds)]
        for mode, r in results.items():
            lines.append(f"| {mode} | " + " | ".join(
                f"{r['kinds'][kind]['recall@5']:.2f} / {r['kinds'][kind]['mrr@10']:.2f}" for kind in kinds) + " |")
    reranked = results.get("hybrid+rerank")
    lines += [] if reranked is None else [
        "",
        spreads("Best relevance (reranker logit) of the question's candidates", reranked, "best"),
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
    vector = results.get("vector")
    lines += [] if vector is None else [
        "",
        spreads("Nearest distance (vector side) of the question's best chunk", vector, "nearest", 3),
    ]
    conn.execute("SELECT rag_drop_collection(%s)", (corpus.collection,))
    return lines


def main():
    chosen = os.environ.get("RAG_EVAL_CORPORA", ",".join(CORPORA)).split(",")
    unknown = [name for name in chosen if name not in CORPORA]
    if unknown:
        sys.exit(f"unknown corpus {unknown}; known: {', '.join(CORPORA)}")
    dump = [] if os.environ.get("RAG_EVAL_DUMP") else None
    lines = []
    with psycopg.connect(autocommit=True) as conn:
        chat_calls_before = conn.execute("SELECT coalesce(sum(chat_calls), 0) FROM rag.queries").fetchone()[0]
        for name in chosen:
            lines += evaluate(conn, CORPORA[name](), dump) + [""]
        paraphrased = (paraphrases(conn, "handbook", HANDBOOK, dump)
                       + paraphrases(conn, "house rules", HOUSE_RULES, dump))
        chat_calls = conn.execute("SELECT coalesce(sum(chat_calls), 0) FROM rag.queries").fetchone()[0] - chat_calls_before

    lines += [f"Paraphrases (short passages, each asked about in other words: a {len(HANDBOOK)}-passage staff "
              f"handbook and {len(HOUSE_RULES)} house rules; then the {len(OFF_DOMAIN)} off-domain questions asked of "
              "each collection):", "",
              "| set | search | answered from the right passage | off-domain refused |", "|---|---|---|---|"]
    lines += [f"| {label} | {search} | {right} of {total} | {refused} of {len(OFF_DOMAIN)} |"
              for label, search, right, total, refused in paraphrased]
    lines += ["", f"Chat calls made by all of the above: {chat_calls} (no chat model: answers are extractive)."]
    report = "\n".join(lines)
    print(report)
    # The repository's target/ (ignored by git), also when this file is run by hand from its own directory.
    root = os.environ.get("ROOT") or os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
    out = os.path.join(root, "target", "eval")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "results.md"), "w") as f:
        f.write(report + "\n")
    if dump is not None:
        with open(os.environ["RAG_EVAL_DUMP"], "w") as f:
            json.dump(dump, f)


if __name__ == "__main__":
    main()
