"""Tests for the test provider server (stdlib unittest only).

Run from the repository root: ``python3 -m unittest testkit/test_provider_server.py``.
Most tests drive an in-process server on an ephemeral port; the CLI tests start
the script as a subprocess to check the startup line, the port file, signals
and --idle-exit.
"""

from __future__ import annotations

import base64
import http.client
import json
import math
import os
import random
import re
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import provider_server  # noqa: E402  (path set up above)
from provider_server import EncodedEmbeddings, ProviderServer, embed_text, word_count  # noqa: E402

SCRIPT = os.path.join(HERE, "provider_server.py")


def cosine(left: list[float], right: list[float]) -> float:
    return sum(a * b for a, b in zip(left, right))


def norm(vector: list[float]) -> float:
    return math.sqrt(sum(value * value for value in vector))


class Response:
    def __init__(self, status: int, headers: dict[str, str], body: bytes):
        self.status = status
        self.headers = headers
        self.body = body

    def json(self):
        return json.loads(self.body.decode("utf-8"))


def request(port, method, path, body=None, headers=None, timeout=5.0, raw=None) -> Response:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        payload = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        all_headers = {"Content-Type": "application/json"}
        all_headers.update(headers or {})
        connection.request(method, path, body=payload, headers=all_headers)
        response = connection.getresponse()
        data = response.read()
        return Response(response.status, {k.lower(): v for k, v in response.getheaders()}, data)
    finally:
        connection.close()


class ServerTestCase(unittest.TestCase):
    require_key: str | None = None

    @classmethod
    def setUpClass(cls):
        cls.server = ProviderServer(("127.0.0.1", 0), require_key=cls.require_key)
        cls.server.start_background()
        cls.port = cls.server.port

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def setUp(self):
        self.assertEqual(self.post("/_control/reset", {}).status, 200)

    def post(self, path, body, **kwargs) -> Response:
        return request(self.port, "POST", path, body, **kwargs)

    def get(self, path, **kwargs) -> Response:
        return request(self.port, "GET", path, **kwargs)

    def embed(self, model, texts, route="/api/embed", **extra):
        body = {"model": model, "input": texts}
        body.update(extra)
        response = self.post(route, body)
        self.assertEqual(response.status, 200, response.body)
        payload = response.json()
        if route == "/api/embed":
            return payload["embeddings"]
        return [item["embedding"] for item in payload["data"]]

    def chat(self, model, messages, **extra) -> dict:
        body = {"model": model, "messages": messages, "stream": False}
        body.update(extra)
        response = self.post("/api/chat", body)
        self.assertEqual(response.status, 200, response.body)
        return response.json()

    def stats(self) -> dict:
        response = self.get("/_control/stats")
        self.assertEqual(response.status, 200)
        return response.json()


SOURCES_PROMPT = (
    "Answer from the sources only.\n\n"
    "Sources:\n"
    "[1] Employees may resign with four weeks of notice. Managers must confirm in writing.\n"
    "[2] The cafeteria opens at eight.\n\n"
    "Question: How much notice is needed to resign?"
)


class EmbeddingFunctionTests(unittest.TestCase):
    def test_vectors_are_deterministic_unit_length(self):
        first = embed_text("The quick brown fox", 64)
        self.assertEqual(first, embed_text("The quick brown fox", 64))
        self.assertEqual(len(first), 64)
        self.assertAlmostEqual(norm(first), 1.0, places=9)

    def test_shared_words_are_close_and_unrelated_texts_far(self):
        base = embed_text("employee resignation notice period", 384)
        related = embed_text("notice period for an employee", 384)
        unrelated = embed_text("chocolate cake recipe with butter", 384)
        self.assertGreater(cosine(base, related), 0.5)
        self.assertLess(abs(cosine(base, unrelated)), 0.2)

    def test_inflections_share_trigrams(self):
        resign = embed_text("resign", 384)
        self.assertGreater(cosine(resign, embed_text("resignation", 384)), 0.4)
        self.assertLess(abs(cosine(resign, embed_text("banana", 384))), 0.2)

    def test_case_and_stop_words_do_not_matter(self):
        self.assertEqual(embed_text("The Cat", 32), embed_text("cat", 32))

    def test_task_prefixes_are_ignored(self):
        plain = embed_text("cats purr when happy", 128)
        self.assertEqual(embed_text("search_document: cats purr when happy", 128), plain)
        self.assertEqual(embed_text("search_query: cats purr when happy", 128), plain)
        # Only a leading prefix is special: inside the text the word counts.
        self.assertNotEqual(embed_text("cats purr search_query: when happy", 128), plain)

    def test_empty_feature_set_is_fixed_unit_vector(self):
        expected = [1.0] + [0.0] * 15
        self.assertEqual(embed_text("", 16), expected)
        self.assertEqual(embed_text("the and of !!", 16), expected)

    def test_unicode_words(self):
        vector = embed_text("Kündigungsfrist für Angestellte", 64)
        self.assertAlmostEqual(norm(vector), 1.0, places=9)
        self.assertGreater(cosine(vector, embed_text("kündigungsfrist", 64)), 0.4)

    def test_dimension_from_model_name(self):
        self.assertEqual(provider_server.dimension_from_base("hash-16"), 16)
        self.assertEqual(provider_server.dimension_from_base("hash-384:latest"), 384)
        self.assertEqual(provider_server.dimension_from_base("nomic-embed-text"), 384)
        self.assertEqual(provider_server.dimension_from_base("model-v2-1024"), 1024)


class OllamaEmbedTests(ServerTestCase):
    def test_embed_list_and_metadata(self):
        response = self.post("/api/embed", {"model": "hash-16", "input": ["alpha beta", "gamma"], "truncate": True})
        self.assertEqual(response.status, 200)
        payload = response.json()
        self.assertEqual(payload["model"], "hash-16")
        self.assertEqual(len(payload["embeddings"]), 2)
        self.assertEqual([len(v) for v in payload["embeddings"]], [16, 16])
        self.assertEqual(payload["embeddings"][0], embed_text("alpha beta", 16))
        self.assertEqual(payload["prompt_eval_count"], 3)
        self.assertIsInstance(payload["total_duration"], int)
        self.assertIsInstance(payload["load_duration"], int)

    def test_a_text_seen_before_gets_the_same_bytes(self):
        # Vectors are encoded once per text (EncodedEmbeddings): a repeated call, and a text embedded alone
        # before, must answer byte for byte what json.dumps of the computed vectors gives.
        texts = ["Résumé of the notice period, résumé.", "alpha beta", "x" * 50]
        first = self.post("/api/embed", {"model": "hash-384", "input": texts})
        second = self.post("/api/embed", {"model": "hash-384", "input": texts})
        self.assertEqual(first.body, second.body)
        tokens = sum(word_count(text) for text in texts)
        expected = json.dumps({"model": "hash-384", "embeddings": [embed_text(text, 384) for text in texts],
                               "total_duration": 1_000_000 + 1_000 * tokens, "load_duration": 500_000,
                               "prompt_eval_count": tokens}, ensure_ascii=False, allow_nan=False).encode() + b"\n"
        self.assertEqual(first.body, expected)

    def test_encoded_vectors_are_bounded_by_size(self):
        cache = EncodedEmbeddings(max_bytes=1000)
        for i in range(20):
            vector, count = cache.get(f"text number {i}", 16)
            self.assertEqual(json.loads(vector), embed_text(f"text number {i}", 16))
            self.assertEqual(count, 3)
        self.assertLessEqual(cache._bytes, 1000)
        self.assertLess(len(cache._entries), 20)
        self.assertIn(("text number 19", 16), cache._entries)
        self.assertNotIn(("text number 0", 16), cache._entries)

    def test_string_input_and_default_dimension(self):
        vectors = self.embed("nomic-embed-text", "hello world")
        self.assertEqual(len(vectors), 1)
        self.assertEqual(len(vectors[0]), 384)
        self.assertEqual(len(self.embed("hash-384:latest", "x")[0]), 384)

    def test_prefixed_query_matches_document(self):
        doc, query = self.embed("hash-384", ["search_document: tax return deadline", "search_query: tax return deadline"])
        self.assertEqual(doc, query)

    def test_empty_and_missing_input(self):
        self.assertEqual(self.embed("hash-16", []), [])
        self.assertEqual(self.embed("hash-16", ""), [])
        response = self.post("/api/embed", {"model": "hash-16"})
        self.assertEqual(response.status, 200)
        self.assertEqual(response.json()["embeddings"], [])

    def test_invalid_input_type(self):
        for bad in (5, [1, 2], ["ok", None], {"text": "x"}):
            response = self.post("/api/embed", {"model": "hash-16", "input": bad})
            self.assertEqual(response.status, 400, bad)
            self.assertEqual(response.json(), {"error": "invalid input type"})

    def test_model_required(self):
        for body in ({"input": "x"}, {"model": "", "input": "x"}, {"model": 7, "input": "x"}):
            response = self.post("/api/embed", body)
            self.assertEqual(response.status, 400)
            self.assertIsInstance(response.json()["error"], str)

    def test_long_input_without_truncate_is_rejected(self):
        long_text = "word " * 2000  # 10000 characters
        response = self.post("/api/embed", {"model": "hash-16", "input": ["short", long_text], "truncate": False})
        self.assertEqual(response.status, 400)
        self.assertEqual(response.json(), {"error": "the input length exceeds the context length"})

    def test_long_input_with_truncate_embeds_prefix(self):
        long_text = "alpha " * 1000 + "omega " * 1000
        vectors = self.embed("hash-16", [long_text], truncate=True)
        self.assertEqual(vectors[0], embed_text(long_text[:8192], 16))
        self.assertNotEqual(vectors[0], embed_text(long_text, 16))
        # truncate defaults to true, as in Ollama
        self.assertEqual(self.embed("hash-16", [long_text]), vectors)

    def test_exactly_context_length_is_accepted(self):
        text = "a" * 8192
        self.assertEqual(len(self.embed("hash-16", [text], truncate=False)), 1)

    def test_missing_model(self):
        for name in ("missing", "missing:latest"):
            response = self.post("/api/embed", {"model": name, "input": "x"})
            self.assertEqual(response.status, 404)
            self.assertEqual(response.json(), {"error": f'model "{name}" not found, try pulling it first'})

    def test_dimensions_parameter_overrides_name(self):
        self.assertEqual(len(self.embed("hash-16", ["x"], dimensions=8)[0]), 8)

    def test_invalid_dimension(self):
        for model in ("hash-0", "hash-99999999"):
            response = self.post("/api/embed", {"model": model, "input": "x"})
            self.assertEqual(response.status, 400, model)
        response = self.post("/api/embed", {"model": "hash-16", "input": "x", "dimensions": "8"})
        self.assertEqual(response.status, 400)

    def test_legacy_embeddings_route(self):
        response = self.post("/api/embeddings", {"model": "hash-16", "prompt": "legacy text"})
        self.assertEqual(response.status, 200)
        self.assertEqual(response.json(), {"embedding": embed_text("legacy text", 16)})
        empty = self.post("/api/embeddings", {"model": "hash-16", "prompt": ""})
        self.assertEqual(empty.json(), {"embedding": []})
        self.assertEqual(self.post("/api/embeddings", {"model": "hash-16", "prompt": 3}).status, 400)
        self.assertEqual(self.post("/api/embeddings", {"model": "missing", "prompt": "x"}).status, 404)

    def test_tags_version_show_root(self):
        tags = self.get("/api/tags").json()["models"]
        names = [model["name"] for model in tags]
        self.assertIn("hash-384:latest", names)
        self.assertIn("chat-test:latest", names)
        for model in tags:
            self.assertEqual(model["model"], model["name"])
            self.assertEqual(model["modified_at"], "2026-01-01T00:00:00Z")
            self.assertIsInstance(model["size"], int)
            self.assertEqual(model["details"]["family"], "test")
            self.assertEqual(model["details"]["parameter_size"], "0M")
        self.assertEqual(self.get("/api/version").json(), {"version": "0.0.0-test"})
        show = self.post("/api/show", {"model": "hash-16"}).json()
        self.assertEqual(show["model_info"]["testhash.embedding_length"], 16)
        self.assertEqual(show["capabilities"], ["embedding"])
        self.assertEqual(self.post("/api/show", {"model": "missing"}).status, 404)
        root = self.get("/")
        self.assertEqual((root.status, root.body), (200, b"Ollama is running"))


class FaultTests(ServerTestCase):
    def assert_status(self, model, expected, route="/api/embed"):
        response = self.post(route, {"model": model, "input": ["one"]})
        self.assertEqual(response.status, expected, (model, response.body))
        return response

    def test_permanent_client_errors_ollama_style(self):
        for status in (400, 401, 403, 404):
            for _ in range(2):
                response = self.assert_status(f"hash-16@{status}", status)
                payload = response.json()
                self.assertIsInstance(payload["error"], str)
        self.assertIn('"hash-16"', self.assert_status("hash-16@404", 404).json()["error"])

    def test_permanent_client_errors_openai_style(self):
        for status in (400, 401, 403, 404):
            response = self.assert_status(f"hash-16@{status}", status, route="/v1/embeddings")
            error = response.json()["error"]
            self.assertIsInstance(error["message"], str)
            self.assertIsInstance(error["type"], str)

    def test_429_then_success_with_retry_after(self):
        for _ in range(3):
            response = self.assert_status("hash-16@429x3", 429)
            self.assertEqual(response.headers.get("retry-after"), "1")
        response = self.assert_status("hash-16@429x3", 200)
        self.assertNotIn("retry-after", response.headers)

    def test_counters_are_per_exact_model_string(self):
        self.assert_status("hash-16@429x1", 429)
        self.assert_status("hash-8@429x1", 429)
        self.assert_status("hash-16@429x1", 200)
        # The same model string counts across routes.
        self.assert_status("hash-32@429x1", 429, route="/v1/embeddings")
        self.assert_status("hash-32@429x1", 200, route="/api/embed")

    def test_reset_restores_counters(self):
        self.assert_status("hash-16@503x1", 503)
        self.assert_status("hash-16@503x1", 200)
        self.assertEqual(self.post("/_control/reset", {}).status, 200)
        self.assert_status("hash-16@503x1", 503)

    def test_503_and_500(self):
        response = self.assert_status("hash-16@503x2", 503)
        self.assertNotIn("retry-after", response.headers)
        self.assert_status("hash-16@503x2", 503)
        self.assert_status("hash-16@503x2", 200)
        for _ in range(3):
            self.assert_status("hash-16@503", 503)
            self.assert_status("hash-16@500", 500)
        self.assert_status("hash-16@500x1", 500)
        self.assert_status("hash-16@500x1", 200)

    def test_unknown_fault_is_rejected(self):
        response = self.assert_status("hash-16@explode", 400)
        self.assertIn("@explode", response.json()["error"])
        self.assert_status("hash-16@", 400)

    def test_slow(self):
        started = time.monotonic()
        self.assert_status("hash-16@slow200", 200)
        self.assertGreaterEqual(time.monotonic() - started, 0.2)

    def test_timeout_makes_client_time_out(self):
        started = time.monotonic()
        with self.assertRaises((socket.timeout, TimeoutError)):
            request(self.port, "POST", "/api/embed", {"model": "hash-16@timeout", "input": "x"}, timeout=0.3)
        self.assertLess(time.monotonic() - started, 2.0)
        # A hanging request does not block other requests.
        self.assert_status("hash-16", 200)

    def test_badjson(self):
        for route, prefix in (("/api/embed", b'{"embeddings": [[0.1, 0.2'), ("/api/embeddings", b'{"embedding": [0.1')):
            body = {"model": "hash-16@badjson", "input": "x", "prompt": "x"}
            response = self.post(route, body)
            self.assertEqual(response.status, 200)
            self.assertTrue(response.body.startswith(prefix), response.body)
            with self.assertRaises(json.JSONDecodeError):
                json.loads(response.body)
        response = self.post("/v1/embeddings", {"model": "hash-16@badjson", "input": "x"})
        self.assertEqual(response.status, 200)
        with self.assertRaises(json.JSONDecodeError):
            json.loads(response.body)

    def test_wrongshape(self):
        response = self.post("/api/embed", {"model": "hash-16@wrongshape", "input": "x"})
        self.assertEqual(response.status, 200)
        self.assertEqual(response.json()["embeddings"], "nope")
        response = self.post("/v1/embeddings", {"model": "hash-16@wrongshape", "input": "x"})
        self.assertEqual(response.json()["data"], "nope")

    def test_dimflip(self):
        first = self.embed("hash-16@dimflip2", ["a", "b"])
        second = self.embed("hash-16@dimflip2", ["a"])
        third = self.embed("hash-16@dimflip2", ["a"])
        self.assertEqual([len(v) for v in first + second], [16, 16, 16])
        self.assertEqual(len(third[0]), 17)
        openai = self.embed("hash-16@dimflip0", ["a"], route="/v1/embeddings", dimensions=8)
        self.assertEqual(len(openai[0]), 9)

    def test_countmismatch(self):
        self.assertEqual(len(self.embed("hash-16@countmismatch", ["a", "b", "c"])), 2)
        self.assertEqual(len(self.embed("hash-16@countmismatch", ["a", "b"], route="/v1/embeddings")), 1)

    def test_nan_gives_zero_vectors(self):
        vectors = self.embed("hash-16@nan", ["a", "b"])
        self.assertEqual(vectors, [[0.0] * 16, [0.0] * 16])

    def test_combined_faults(self):
        self.assert_status("hash-16@429x1@slow50@countmismatch", 429)
        vectors = self.embed("hash-16@429x1@slow50@countmismatch", ["a", "b"])
        self.assertEqual(len(vectors), 1)

    def test_faults_apply_to_chat(self):
        messages = [{"role": "user", "content": "hi"}]
        response = self.post("/api/chat", {"model": "chat-test@500", "messages": messages})
        self.assertEqual(response.status, 500)
        self.assertIsInstance(response.json()["error"], str)
        response = self.post("/v1/chat/completions", {"model": "chat-test@429x1", "messages": messages})
        self.assertEqual(response.status, 429)
        self.assertEqual(response.headers["retry-after"], "1")
        self.assertIsInstance(response.json()["error"]["message"], str)
        response = self.post("/v1/chat/completions", {"model": "chat-test@429x1", "messages": messages})
        self.assertEqual(response.status, 200)
        for route in ("/api/chat", "/v1/chat/completions"):
            bad = self.post(route, {"model": "chat-test@badjson", "messages": messages})
            self.assertEqual(bad.status, 200)
            with self.assertRaises(json.JSONDecodeError):
                json.loads(bad.body)
        shape = self.post("/api/chat", {"model": "chat-test@wrongshape", "messages": messages}).json()
        self.assertEqual(shape["message"], "nope")
        with self.assertRaises((socket.timeout, TimeoutError)):
            request(self.port, "POST", "/api/chat", {"model": "chat-test@timeout", "messages": messages}, timeout=0.3)


class ChatTests(ServerTestCase):
    def content_json(self, model, messages, **extra):
        reply = self.chat(model, messages, **extra)
        return json.loads(reply["message"]["content"]), reply

    def test_oracle_answers_with_first_sentence_of_source_one(self):
        content, reply = self.content_json("chat-test", [
            {"role": "system", "content": "You answer questions."},
            {"role": "user", "content": SOURCES_PROMPT},
        ])
        self.assertEqual(content, {
            "answer": "Employees may resign with four weeks of notice. [1]",
            "citations": [1],
            "sufficient": True,
        })
        self.assertEqual(reply["message"]["role"], "assistant")
        self.assertTrue(reply["done"])
        self.assertEqual(reply["done_reason"], "stop")
        self.assertEqual(reply["model"], "chat-test")
        self.assertIn("created_at", reply)
        expected_prompt = provider_server.word_count("You answer questions.") + provider_server.word_count(SOURCES_PROMPT)
        self.assertEqual(reply["prompt_eval_count"], expected_prompt)
        self.assertEqual(reply["eval_count"], provider_server.word_count(reply["message"]["content"]))
        self.assertIsInstance(reply["total_duration"], int)

    def test_oracle_uses_last_user_message(self):
        content, _ = self.content_json("chat-test", [
            {"role": "user", "content": "[1] Old source text."},
            {"role": "assistant", "content": "ok"},
            {"role": "user", "content": "[1] New source. Second sentence.\n[2] Other."},
        ])
        self.assertEqual(content["answer"], "New source. [1]")

    def test_multiline_source_and_missing_source_one(self):
        content, _ = self.content_json("chat-test", [
            {"role": "user", "content": "[3] The fee is\n   twelve euros per month. Extra.\n\nQuestion: fee?"},
        ])
        self.assertEqual(content, {"answer": "The fee is twelve euros per month. [3]", "citations": [3], "sufficient": True})

    def test_no_sources(self):
        content, _ = self.content_json("chat-test", [{"role": "user", "content": "What is the capital of France?"}])
        self.assertEqual(content, {"answer": "", "citations": [], "sufficient": False, "reason": "no sources"})

    def test_follow_up_rewrite_from_history_messages(self):
        reply = self.chat("chat-test", [
            {"role": "user", "content": "What is the notice period?"},
            {"role": "assistant", "content": "Four weeks [1]."},
            {"role": "user", "content": "Rewrite the follow-up.\nFollow-up: and for managers?\nStandalone question:"},
        ])
        self.assertEqual(reply["message"]["content"], "What is the notice period? and for managers?")
        self.assertEqual(reply["done_reason"], "stop")

    def test_follow_up_rewrite_from_history_in_prompt(self):
        prompt = (
            "Conversation:\nUser: How much does the plan cost?\nAssistant: Ten euros.\n"
            "Follow-up: what about yearly\n\nStandalone question:"
        )
        reply = self.chat("chat-test@insufficient", [{"role": "user", "content": prompt}])
        self.assertEqual(reply["message"]["content"], "How much does the plan cost? what about yearly")

    def test_follow_up_without_history(self):
        reply = self.chat("chat-test", [{"role": "user", "content": "Follow-up: is it free?\nStandalone question:"}])
        self.assertEqual(reply["message"]["content"], "is it free?")

    def test_insufficient(self):
        content, _ = self.content_json("chat-test@insufficient", [{"role": "user", "content": SOURCES_PROMPT}])
        self.assertEqual(content, {"answer": "", "citations": [], "sufficient": False, "reason": "The sources do not say."})

    def test_cite9(self):
        content, _ = self.content_json("chat-test@cite9", [{"role": "user", "content": SOURCES_PROMPT}])
        self.assertEqual(content["citations"], [1, 9])
        self.assertRegex(content["answer"], r"^Employees may resign with four weeks of notice\. \[1\] .+ \[9\]$")
        self.assertTrue(content["sufficient"])

    def test_citeonly9(self):
        content, _ = self.content_json("chat-test@citeonly9", [{"role": "user", "content": SOURCES_PROMPT}])
        self.assertEqual(content["citations"], [9])
        self.assertTrue(content["answer"].endswith("[9]"))
        self.assertNotIn("[1]", content["answer"])

    def test_prose(self):
        reply = self.chat("chat-test@prose", [{"role": "user", "content": SOURCES_PROMPT}])
        content = reply["message"]["content"]
        self.assertIn("Employees may resign with four weeks of notice. [1]", content)
        with self.assertRaises(json.JSONDecodeError):
            json.loads(content)

    def test_length(self):
        content, reply = self.content_json("chat-test@length", [{"role": "user", "content": SOURCES_PROMPT}])
        self.assertEqual(reply["done_reason"], "length")
        self.assertEqual(content["citations"], [1])
        self.assertTrue("Employees may resign with four weeks of notice.".startswith(content["answer"]))
        self.assertFalse(content["answer"].endswith("."))

    def test_flood_ignores_the_token_limit(self):
        reply = self.chat("chat-test@flood", [{"role": "user", "content": SOURCES_PROMPT}], options={"num_predict": 3})
        self.assertEqual(reply["done_reason"], "stop")
        content = json.loads(reply["message"]["content"])
        self.assertEqual(content["answer"].count(" [1]"), 100_000)

    def test_nul_is_escaped_inside_the_answer(self):
        reply = self.chat("chat-test@nul", [{"role": "user", "content": SOURCES_PROMPT}])
        self.assertIn("\\u0000 hidden after the NUL [1]", reply["message"]["content"])
        content = json.loads(reply["message"]["content"])
        self.assertIn("\x00 hidden after the NUL [1]", content["answer"])

    def test_num_predict_cuts_reply(self):
        reply = self.chat("chat-test", [{"role": "user", "content": SOURCES_PROMPT}], options={"num_predict": 3, "temperature": 0})
        self.assertEqual(reply["done_reason"], "length")
        self.assertEqual(reply["eval_count"], 3)
        self.assertEqual(reply["message"]["content"], '{"answer": "Employees may')
        roomy = self.chat("chat-test", [{"role": "user", "content": SOURCES_PROMPT}], options={"num_predict": 500})
        self.assertEqual(roomy["done_reason"], "stop")

    def test_stream_true_still_answers_once(self):
        response = self.post("/api/chat", {"model": "chat-test", "messages": [{"role": "user", "content": SOURCES_PROMPT}], "stream": True})
        self.assertEqual(response.status, 200)
        self.assertTrue(response.json()["done"])

    def test_format_schema_accepted(self):
        schema = {"type": "object", "properties": {"answer": {"type": "string"}}}
        for fmt in ("json", schema):
            content, _ = self.content_json("chat-test", [{"role": "user", "content": SOURCES_PROMPT}], format=fmt)
            self.assertTrue(content["sufficient"])

    def test_invalid_chat_requests(self):
        for body in (
            {"model": "chat-test"},
            {"model": "chat-test", "messages": []},
            {"model": "chat-test", "messages": "hi"},
            {"model": "chat-test", "messages": [{"content": "no role"}]},
            {"model": "chat-test", "messages": [{"role": "user", "content": 5}]},
            {"messages": [{"role": "user", "content": "x"}]},
        ):
            response = self.post("/api/chat", body)
            self.assertEqual(response.status, 400, body)
            self.assertIsInstance(response.json()["error"], str)
        self.assertEqual(self.post("/api/chat", {"model": "missing", "messages": [{"role": "user", "content": "x"}]}).status, 404)


class OpenAITests(ServerTestCase):
    def test_embeddings_shape(self):
        response = self.post("/v1/embeddings", {"model": "hash-16", "input": ["alpha beta", "gamma"]})
        self.assertEqual(response.status, 200)
        payload = response.json()
        self.assertEqual(payload["object"], "list")
        self.assertEqual(payload["model"], "hash-16")
        self.assertEqual([item["index"] for item in payload["data"]], [0, 1])
        self.assertEqual([item["object"] for item in payload["data"]], ["embedding", "embedding"])
        self.assertEqual(payload["data"][0]["embedding"], embed_text("alpha beta", 16))
        self.assertEqual(payload["usage"], {"prompt_tokens": 3, "total_tokens": 3})

    def test_same_vectors_as_ollama(self):
        texts = ["search_document: one two", "three"]
        self.assertEqual(self.embed("hash-32", texts), self.embed("hash-32", texts, route="/v1/embeddings"))

    def test_dimensions_and_base64(self):
        vector = self.embed("hash-384", "hello", route="/v1/embeddings", dimensions=12)[0]
        self.assertEqual(len(vector), 12)
        response = self.post("/v1/embeddings", {"model": "hash-384", "input": "hello", "dimensions": 12, "encoding_format": "base64"})
        packed = base64.b64decode(response.json()["data"][0]["embedding"])
        decoded = struct.unpack("<12f", packed)
        for got, want in zip(decoded, vector):
            self.assertAlmostEqual(got, want, places=6)

    def test_invalid_embedding_requests(self):
        for body in (
            {"model": "hash-16"},
            {"model": "hash-16", "input": []},
            {"model": "hash-16", "input": [""]},
            {"model": "hash-16", "input": [1, 2, 3]},
            {"model": "hash-16", "input": "x", "encoding_format": "int8"},
            {"model": "hash-16", "input": "x", "dimensions": 0},
            {"model": "hash-16", "input": "y" * 9000},
        ):
            response = self.post("/v1/embeddings", body)
            self.assertEqual(response.status, 400, body)
            self.assertEqual(response.json()["error"]["type"], "invalid_request_error")

    def test_models(self):
        payload = self.get("/v1/models").json()
        self.assertEqual(payload["object"], "list")
        ids = [item["id"] for item in payload["data"]]
        self.assertIn("chat-test:latest", ids)
        self.assertTrue(all(item["object"] == "model" for item in payload["data"]))

    def test_chat_completion(self):
        body = {
            "model": "chat-test",
            "messages": [{"role": "user", "content": SOURCES_PROMPT}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "object"}}},
            "max_tokens": 400,
        }
        response = self.post("/v1/chat/completions", body)
        self.assertEqual(response.status, 200)
        payload = response.json()
        self.assertEqual(payload["object"], "chat.completion")
        self.assertTrue(payload["id"])
        choice = payload["choices"][0]
        self.assertEqual(choice["index"], 0)
        self.assertEqual(choice["finish_reason"], "stop")
        self.assertEqual(choice["message"]["role"], "assistant")
        content = json.loads(choice["message"]["content"])
        self.assertEqual(content["citations"], [1])
        usage = payload["usage"]
        self.assertEqual(usage["prompt_tokens"], provider_server.word_count(SOURCES_PROMPT))
        self.assertEqual(usage["completion_tokens"], provider_server.word_count(choice["message"]["content"]))
        self.assertEqual(usage["total_tokens"], usage["prompt_tokens"] + usage["completion_tokens"])

    def test_chat_completion_limits_and_content_parts(self):
        messages = [{"role": "user", "content": [{"type": "text", "text": SOURCES_PROMPT}]}]
        for key in ("max_tokens", "max_completion_tokens"):
            payload = self.post("/v1/chat/completions", {"model": "chat-test", "messages": messages, key: 2}).json()
            self.assertEqual(payload["choices"][0]["finish_reason"], "length")
            self.assertEqual(payload["usage"]["completion_tokens"], 2)
        payload = self.post("/v1/chat/completions", {"model": "chat-test@length", "messages": messages,
                                                      "response_format": {"type": "json_object"}}).json()
        self.assertEqual(payload["choices"][0]["finish_reason"], "length")
        json.loads(payload["choices"][0]["message"]["content"])

    def test_no_key_required_by_default(self):
        self.assertEqual(self.get("/v1/models").status, 200)


class RerankTests(ServerTestCase):
    def test_scores_every_document_best_first(self):
        documents = ["the cat sat on the mat", "stock prices fell", "a cat on a mat"]
        response = self.post("/v1/rerank", {"model": "rerank", "query": "cat on the mat", "documents": documents})
        self.assertEqual(response.status, 200, response.body)
        results = response.json()["results"]
        self.assertEqual(sorted(r["index"] for r in results), [0, 1, 2])
        scores = [r["relevance_score"] for r in results]
        self.assertEqual(scores, sorted(scores, reverse=True))
        self.assertEqual(results[-1]["index"], 1)
        by_index = {r["index"]: r["relevance_score"] for r in results}
        query = embed_text("cat on the mat", 384)
        self.assertAlmostEqual(by_index[0], 10 * cosine(query, embed_text(documents[0], 384)) - 5, places=9)

    def test_top_n_and_bad_requests(self):
        response = self.post("/v1/rerank", {"model": "rerank", "query": "q", "documents": ["a", "q", "b"], "top_n": 1})
        self.assertEqual([r["index"] for r in response.json()["results"]], [1])
        for body in ({"model": "rerank", "query": "", "documents": ["a"]},
                     {"model": "rerank", "query": "q", "documents": []},
                     {"model": "rerank", "query": "q", "documents": ["a", 1]},
                     {"model": "rerank", "query": "q", "documents": ["a"], "top_n": 0},
                     {"query": "q", "documents": ["a"]}):
            self.assertEqual(self.post("/v1/rerank", body).status, 400, body)

    def test_faults_apply(self):
        self.assertEqual(self.post("/v1/rerank", {"model": "rerank@503", "query": "q", "documents": ["a"]}).status, 503)
        shape = self.post("/v1/rerank", {"model": "rerank@wrongshape", "query": "q", "documents": ["a"]}).json()
        self.assertEqual(shape["results"], "nope")
        short = self.post("/v1/rerank", {"model": "rerank@countmismatch", "query": "q", "documents": ["a", "b"]})
        self.assertEqual(len(short.json()["results"]), 1)

    def test_reversed_puts_the_farthest_first(self):
        documents = ["the cat sat on the mat", "stock prices fell"]
        plain = self.post("/v1/rerank", {"model": "rerank", "query": "cat on the mat", "documents": documents}).json()
        turned = self.post("/v1/rerank", {"model": "rerank@reversed", "query": "cat on the mat",
                                          "documents": documents}).json()
        self.assertEqual([r["index"] for r in plain["results"]], [0, 1])
        self.assertEqual([r["index"] for r in turned["results"]], [1, 0])
        self.assertEqual({r["index"]: -r["relevance_score"] for r in plain["results"]},
                         {r["index"]: r["relevance_score"] for r in turned["results"]})

    def test_extreme_scores_are_finite_floats_at_the_ends_of_the_range(self):
        documents = ["the cat sat on the mat", "stock prices fell", "cats"]
        reply = self.post("/v1/rerank", {"model": "rerank@extreme", "query": "cat on the mat",
                                         "documents": documents}).json()
        self.assertEqual([(r["index"], r["relevance_score"]) for r in reply["results"]],
                         [(0, 3.4e38), (1, -3.4e38), (2, -3.4e38)])


class AuthTests(ServerTestCase):
    require_key = "sk-test-secret-value"

    def test_v1_routes_need_the_key(self):
        body = {"model": "hash-16", "input": "x"}
        missing = self.post("/v1/embeddings", body)
        self.assertEqual(missing.status, 401)
        self.assertEqual(missing.json()["error"]["code"], "invalid_api_key")
        wrong = self.post("/v1/embeddings", body, headers={"Authorization": "Bearer nope"})
        self.assertEqual(wrong.status, 401)
        self.assertEqual(self.get("/v1/models").status, 401)
        chat = self.post("/v1/chat/completions", {"model": "chat-test", "messages": [{"role": "user", "content": "x"}]})
        self.assertEqual(chat.status, 401)
        good = self.post("/v1/embeddings", body, headers={"Authorization": f"Bearer {self.require_key}"})
        self.assertEqual(good.status, 200)
        self.assertEqual(self.get("/v1/models", headers={"Authorization": f"Bearer {self.require_key}"}).status, 200)

    def test_api_routes_ignore_the_key(self):
        self.assertEqual(self.post("/api/embed", {"model": "hash-16", "input": "x"}).status, 200)
        response = self.post("/api/embed", {"model": "hash-16", "input": "x"}, headers={"Authorization": "Bearer nope"})
        self.assertEqual(response.status, 200)

    def test_stats_record_presence_but_never_the_value(self):
        self.post("/v1/embeddings", {"model": "hash-16", "input": "x"}, headers={"Authorization": f"Bearer {self.require_key}"})
        self.post("/api/embed", {"model": "hash-8", "input": "x"})
        response = self.get("/_control/stats")
        self.assertNotIn(self.require_key.encode(), response.body)
        stats = response.json()
        self.assertEqual([entry["authorization"] for entry in stats["recent"]], [True, False])
        self.assertIn("authorization", stats["recent"][0]["headers"])
        self.assertEqual(stats["models"]["hash-16"]["authorization_seen"], 1)
        self.assertEqual(stats["models"]["hash-8"]["authorization_seen"], 0)
        self.assertEqual(stats["totals"]["authorization_seen"], 1)


class ControlTests(ServerTestCase):
    def test_health(self):
        response = self.get("/_control/health")
        self.assertEqual((response.status, response.body), (200, b"ok"))

    def test_stats_per_model(self):
        long_text = "x" * 200
        self.post("/api/embed", {"model": "hash-16", "input": [long_text, "b", "c"], "truncate": True, "keep_alive": "5m"})
        self.post("/v1/embeddings", {"model": "hash-16", "input": "d"})
        self.post("/api/embed", {"model": "hash-16@429x1", "input": ["e"]})
        self.post("/api/chat", {"model": "chat-test", "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "question"}]})
        self.get("/api/tags")
        stats = self.stats()
        hash16 = stats["models"]["hash-16"]
        self.assertEqual(hash16["calls"], 2)
        self.assertEqual(hash16["inputs"], 4)
        self.assertEqual(hash16["routes"], {"/api/embed": 1, "/v1/embeddings": 1})
        self.assertEqual(stats["models"]["hash-16@429x1"]["statuses"], {"429": 1})
        self.assertEqual(stats["models"]["chat-test"]["inputs"], 2)
        self.assertEqual(stats["totals"]["requests"], 5)
        self.assertEqual(stats["totals"]["model_calls"], 4)
        self.assertEqual(stats["totals"]["inputs"], 7)
        first = stats["recent"][0]
        self.assertEqual(first["route"], "/api/embed")
        self.assertEqual(first["model"], "hash-16")
        self.assertEqual(first["inputs"], 3)
        self.assertEqual(first["first_input"], "x" * 80)
        self.assertEqual(first["params"], {"truncate": True, "keep_alive": "5m"})
        self.assertEqual(first["status"], 200)
        self.assertIn("content-type", first["headers"])
        self.assertEqual(stats["recent"][3]["first_input"], "question")
        self.assertEqual(stats["recent"][4]["route"], "/api/tags")

    def test_recent_keeps_last_fifty(self):
        for index in range(55):
            self.post("/api/embed", {"model": "hash-8", "input": f"text {index}"})
        stats = self.stats()
        self.assertEqual(len(stats["recent"]), 50)
        self.assertEqual(stats["recent"][0]["first_input"], "text 5")
        self.assertEqual(stats["recent"][-1]["first_input"], "text 54")
        self.assertEqual(stats["models"]["hash-8"]["calls"], 55)

    def test_reset_clears_stats(self):
        self.post("/api/embed", {"model": "hash-8", "input": "x"})
        self.post("/_control/reset", {})
        stats = self.stats()
        self.assertEqual(stats["models"], {})
        self.assertEqual(stats["recent"], [])
        self.assertEqual(stats["totals"]["requests"], 0)


class RobustnessTests(ServerTestCase):
    def test_malformed_json(self):
        for route in ("/api/embed", "/api/chat", "/api/embeddings"):
            for raw in (b"{not json", b"", b"[1, 2]", b"\xff\xfe", b"null", b"[" * 100000):
                response = request(self.port, "POST", route, raw=raw)
                self.assertEqual(response.status, 400, (route, raw[:10]))
                self.assertIsInstance(response.json()["error"], str)
        response = request(self.port, "POST", "/v1/embeddings", raw=b"{oops")
        self.assertEqual(response.status, 400)
        self.assertEqual(response.json()["error"]["type"], "invalid_request_error")

    def test_unknown_route_and_wrong_method(self):
        self.assertEqual(self.get("/api/nope").status, 404)
        self.assertEqual(self.post("/v2/embeddings", {}).status, 404)
        response = self.get("/api/embed")
        self.assertEqual(response.status, 405)
        self.assertEqual(response.headers["allow"], "POST")
        self.assertEqual(request(self.port, "DELETE", "/api/tags").status, 405)

    def test_query_string_and_trailing_slash(self):
        self.assertEqual(self.get("/api/version?x=1").status, 200)
        self.assertEqual(self.get("/api/tags/").status, 200)

    def test_content_length_problems(self):
        with socket.create_connection(("127.0.0.1", self.port), timeout=5) as sock:
            sock.sendall(b"POST /api/embed HTTP/1.1\r\nHost: x\r\nContent-Length: 999999999999\r\n\r\n{}")
            self.assertIn(b" 413 ", sock.recv(4096).split(b"\r\n")[0] + b" ")
        with socket.create_connection(("127.0.0.1", self.port), timeout=5) as sock:
            sock.sendall(b"POST /api/embed HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n")
            self.assertTrue(sock.recv(4096).startswith(b"HTTP/1.1 400"))

    def test_chunked_body(self):
        payload = json.dumps({"model": "hash-16", "input": "chunked text"}).encode()
        chunks = b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in (payload[:10], payload[10:])) + b"0\r\n\r\n"
        with socket.create_connection(("127.0.0.1", self.port), timeout=5) as sock:
            sock.sendall(b"POST /api/embed HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n" + chunks)
            data = b""
            while True:
                part = sock.recv(65536)
                if not part:
                    break
                data += part
        head, _, body = data.partition(b"\r\n\r\n")
        self.assertTrue(head.startswith(b"HTTP/1.1 200"), head)
        self.assertEqual(json.loads(body)["embeddings"][0], embed_text("chunked text", 16))

    def test_keep_alive_connection_serves_many_requests(self):
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
        try:
            for index in range(5):
                connection.request("POST", "/api/embed", body=json.dumps({"model": "hash-8", "input": str(index)}))
                response = connection.getresponse()
                self.assertEqual(response.status, 200)
                json.loads(response.read())
            connection.request("POST", "/api/embed", body=b"{bad")
            response = connection.getresponse()
            self.assertEqual(response.status, 400)
            response.read()
            connection.request("GET", "/api/version")
            self.assertEqual(connection.getresponse().status, 200)
        finally:
            connection.close()

    def test_slow_request_does_not_block_others(self):
        results = {}

        def slow():
            results["slow"] = request(self.port, "POST", "/api/embed", {"model": "hash-8@slow500", "input": "x"}).status

        thread = threading.Thread(target=slow)
        thread.start()
        time.sleep(0.1)
        started = time.monotonic()
        self.assertEqual(self.post("/api/embed", {"model": "hash-8", "input": "y"}).status, 200)
        self.assertLess(time.monotonic() - started, 0.5)
        thread.join(5)
        self.assertEqual(results["slow"], 200)

    def test_fuzzed_bodies_never_crash(self):
        rng = random.Random(1234)
        values = [None, True, 0, -1, 1.5, "", "x", [], {}, ["a", 1], {"role": "user"}, "@@", "hash-1@dimflip", "a@slow0"]
        routes = ["/api/embed", "/api/embeddings", "/api/chat", "/api/show", "/v1/embeddings", "/v1/chat/completions"]
        keys = ["model", "input", "prompt", "messages", "truncate", "dimensions", "options", "encoding_format",
                "max_tokens", "format", "name"]
        for _ in range(300):
            body = {key: rng.choice(values) for key in rng.sample(keys, rng.randint(0, len(keys)))}
            if rng.random() < 0.5:
                body["model"] = rng.choice(["hash-8", "chat-test", "hash-8@nan", "missing", "chat-test@prose"])
            route = rng.choice(routes)
            response = self.post(route, body)
            self.assertIn(response.status, (200, 400, 404), (route, body, response.body))
            if response.status != 200:
                self.assertIn("error", response.json())
        for _ in range(50):
            raw = bytes(rng.getrandbits(8) for _ in range(rng.randint(0, 64)))
            self.assertEqual(request(self.port, "POST", rng.choice(routes), raw=raw).status, 400)
        self.assertEqual(self.get("/_control/health").status, 200)


class ShutdownTests(unittest.TestCase):
    def test_stop_does_not_wait_for_sleeping_handler(self):
        server = ProviderServer(("127.0.0.1", 0))
        server.start_background()
        errors = []

        def hang():
            try:
                request(server.port, "POST", "/api/embed", {"model": "hash-8@timeout", "input": "x"}, timeout=10)
            except (OSError, http.client.HTTPException) as error:
                errors.append(error)

        thread = threading.Thread(target=hang)
        thread.start()
        time.sleep(0.2)
        started = time.monotonic()
        server.stop()
        self.assertLess(time.monotonic() - started, 2.0)
        thread.join(5)
        self.assertFalse(thread.is_alive())
        # The client sees the connection drop rather than a (fake) answer.
        self.assertEqual(len(errors), 1)


class CommandLineTests(unittest.TestCase):
    def start(self, *args):
        process = subprocess.Popen(
            [sys.executable, SCRIPT, "--port", "0", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.addCleanup(self.cleanup, process)
        line = process.stdout.readline()
        match = re.fullmatch(r"listening 127\.0\.0\.1:(\d+)\n", line)
        self.assertIsNotNone(match, line)
        return process, int(match.group(1))

    @staticmethod
    def cleanup(process):
        if process.poll() is None:
            process.kill()
            process.wait()
        process.stdout.close()
        process.stderr.close()

    def test_port_file_and_sigterm(self):
        with tempfile.TemporaryDirectory() as directory:
            port_file = os.path.join(directory, "port")
            process, port = self.start("--port-file", port_file)
            with open(port_file, encoding="ascii") as handle:
                self.assertEqual(int(handle.read().strip()), port)
            self.assertEqual(request(port, "GET", "/_control/health").body, b"ok")
            # A hanging request must not delay shutdown.
            hanging = threading.Thread(
                target=lambda: self.swallow(port, {"model": "hash-8@timeout", "input": "x"}), daemon=True
            )
            hanging.start()
            time.sleep(0.2)
            started = time.monotonic()
            process.send_signal(signal.SIGTERM)
            self.assertEqual(process.wait(timeout=5), 0)
            self.assertLess(time.monotonic() - started, 3.0)
            self.assertEqual(process.stdout.read(), "", "stdout must hold exactly one line")
            self.assertEqual(process.stderr.read(), "", "no stderr noise without --verbose")

    @staticmethod
    def swallow(port, body):
        try:
            request(port, "POST", "/api/embed", body, timeout=10)
        except (OSError, http.client.HTTPException):
            pass

    def test_sigint_exits_cleanly(self):
        process, port = self.start()
        request(port, "POST", "/api/embed", {"model": "hash-8", "input": "x"})
        process.send_signal(signal.SIGINT)
        self.assertEqual(process.wait(timeout=5), 0)
        self.assertEqual(process.stderr.read(), "")

    def test_idle_exit(self):
        process, port = self.start("--idle-exit", "0.6")
        time.sleep(0.3)
        self.assertEqual(request(port, "GET", "/_control/health").status, 200)
        self.assertIsNone(process.poll(), "a request resets the idle timer")
        self.assertEqual(process.wait(timeout=5), 0)

    def test_require_key_flag(self):
        process, port = self.start("--require-key", "k1")
        self.assertEqual(request(port, "GET", "/v1/models").status, 401)
        self.assertEqual(request(port, "GET", "/v1/models", headers={"Authorization": "Bearer k1"}).status, 200)

    def test_refuses_non_loopback_host(self):
        result = subprocess.run([sys.executable, SCRIPT, "--port", "0", "--host", "0.0.0.0"],
                                capture_output=True, text=True, timeout=10)
        self.assertEqual(result.returncode, 2)
        self.assertEqual(result.stdout, "")
        self.assertIn("loopback", result.stderr)


if __name__ == "__main__":
    unittest.main()
