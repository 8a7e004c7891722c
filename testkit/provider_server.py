#!/usr/bin/env python3
"""Deterministic Ollama- and OpenAI-compatible test server for the rag extension.

No real model server runs on the test machines, so every end-to-end test of the
extension talks to this process instead. It answers the embedding and chat
routes of both APIs with deterministic results (feature-hashed bag-of-words
embeddings and a scripted "oracle" chat model), and lets a test choose faults
purely through the model name (``hash-384@429x3``), because SQL tests can set a
model name but have no side channel to the server. A small control API
(``/_control/...``) exposes call statistics for test drivers.

Standard library only, so it runs on any Python 3.11 without installing anything.
See README.md next to this file for the route list and the fault grammar.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import math
import os
import re
import signal
import socket
import struct
import sys
import threading
import time
from dataclasses import dataclass, field
from functools import lru_cache
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

# The test model's "context length", in characters (stands in for tokens).
CONTEXT_CHARS = 8192
DEFAULT_DIMENSION = 384
MAX_DIMENSION = 65536
# Requests larger than this are refused before being read, so a broken client
# cannot make the test server allocate without bound.
MAX_BODY_BYTES = 64 * 1024 * 1024
RECENT_LIMIT = 50
FIRST_INPUT_PREVIEW = 80
HANG_SECONDS = 30.0
# Idle keep-alive connections are dropped after this long; longer than the
# @timeout hang so that fault is never cut short by the socket timeout.
CONNECTION_IDLE_SECONDS = 120.0
FIXED_CREATED_AT = "2026-01-01T00:00:00Z"
FIXED_CREATED_UNIX = 1767225600

WORD = re.compile(r"\w+")
# Embedding-model task prefixes (nomic style "search_document: ", E5 style
# "query: ") must not pull unrelated texts together, so the leading one is
# ignored when building features.
TASK_PREFIX = re.compile(r"^\s*(?:search_document|search_query|document|query)\s*:\s*")
STOP_WORDS = frozenset(
    """a an and are as at be been but by can could did do does for from had has
    have he her his i if in into is it its me my no not of on or our she so
    than that the their them then there these they this those to was we were
    what when where which who whom why will with would you your""".split()
)

# Models listed by /api/tags and /v1/models. Any other name embeds too; the
# list only exists so that discovery code has something realistic to parse.
CATALOG = (
    ("hash-384:latest", 384, "embedding"),
    ("hash-768:latest", 768, "embedding"),
    ("hash-16:latest", 16, "embedding"),
    ("nomic-embed-text:latest", 384, "embedding"),
    ("chat-test:latest", 384, "completion"),
)

CHAT_MODES = ("insufficient", "cite9", "citeonly9", "prose", "length", "flood", "nul")
BODY_FAULTS = ("badjson", "wrongshape", "countmismatch", "nan", "reversed", "extreme")

OLLAMA = "ollama"
OPENAI = "openai"


# --------------------------------------------------------------------------
# Embeddings


def _text_features(text: str) -> dict[str, float]:
    lowered = text.lower()
    prefix = TASK_PREFIX.match(lowered)
    if prefix:
        lowered = lowered[prefix.end() :]
    features: dict[str, float] = {}
    for token in WORD.findall(lowered):
        if token in STOP_WORDS:
            continue
        # Separate namespaces keep the word "res" and the trigram "res" apart.
        key = "w:" + token
        features[key] = features.get(key, 0.0) + 1.0
        # Shared trigrams make inflections ("resign"/"resignation") similar.
        for start in range(len(token) - 2):
            key = "c:" + token[start : start + 3]
            features[key] = features.get(key, 0.0) + 0.5
    return features


@lru_cache(maxsize=1 << 17)
def _feature_hash(feature: str) -> tuple[int, float]:
    digest = hashlib.sha256(feature.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big"), (1.0 if digest[8] & 1 else -1.0)


@lru_cache(maxsize=1 << 16)
def _token_contributions(token: str, dimension: int) -> tuple[tuple[int, float], ...]:
    """What one occurrence of ``token`` adds to a vector: its word feature and its trigrams (as
    ``_text_features`` counts them), each at its bucket with its sign. Every weight is a multiple of 0.5, so
    adding them token by token gives bit for bit the sums of adding each feature's total: the bulk benchmarks
    need a provider that costs little, and most of its time went to counting features text by text."""
    features = [("w:" + token, 1.0)]
    features.extend(("c:" + token[start : start + 3], 0.5) for start in range(len(token) - 2))
    contributions = []
    for feature, weight in features:
        bucket, sign = _feature_hash(feature)
        contributions.append((bucket % dimension, sign * weight))
    return tuple(contributions)


def embed_text(text: str, dimension: int) -> list[float]:
    """Return the deterministic unit-length embedding of ``text``."""
    vector = [0.0] * dimension
    lowered = text.lower()
    prefix = TASK_PREFIX.match(lowered)
    if prefix:
        lowered = lowered[prefix.end() :]
    for token in WORD.findall(lowered):
        if token in STOP_WORDS:
            continue
        for bucket, value in _token_contributions(token, dimension):
            vector[bucket] += value
    norm = math.sqrt(sum(value * value for value in vector))
    if norm == 0.0:
        # No features (or features that cancelled out): still a valid unit
        # vector, so clients never see a zero vector unless they asked (@nan).
        vector = [0.0] * dimension
        vector[0] = 1.0
        return vector
    return [value / norm for value in vector]


class EncodedEmbeddings:
    """Each text's vector as the JSON the server sends it as, with its word count, for texts embedded before.
    The bulk benchmarks load the same documents several times (scripts/bench), and computing and formatting
    vectors took this server about 3 s of CPU per 9,000-chunk load: on a 2-core machine that competes with the
    pipeline being measured against "a provider that answers at once". Bounded by size, oldest out first;
    the JSON is what json.dumps gives the list, so responses are byte for byte the same as without it."""

    def __init__(self, max_bytes: int) -> None:
        self._max_bytes = max_bytes
        self._bytes = 0
        self._entries: dict[tuple[str, int], tuple[str, int]] = {}
        self._lock = threading.Lock()

    def get(self, text: str, dimension: int) -> tuple[str, int]:
        key = (text, dimension)
        with self._lock:
            found = self._entries.get(key)
        if found is not None:
            return found
        found = (json.dumps(embed_text(text, dimension), allow_nan=False), word_count(text))
        size = len(text) + len(found[0])
        with self._lock:
            if key not in self._entries:
                self._entries[key] = found
                self._bytes += size
                while self._bytes > self._max_bytes and self._entries:
                    oldest = next(iter(self._entries))
                    old_json, _ = self._entries.pop(oldest)
                    self._bytes -= len(oldest[0]) + len(old_json)
        return found


ENCODED = EncodedEmbeddings(192 * 1024 * 1024)


def word_count(text: str) -> int:
    """Deterministic stand-in for a tokenizer's token count."""
    return len(WORD.findall(text))


# --------------------------------------------------------------------------
# Model names and the fault grammar


class RequestError(Exception):
    """A request the server refuses with an HTTP error status."""

    def __init__(self, status: int, message: str, headers: tuple = ()):
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers


class ServerStopping(Exception):
    """The server shuts down while a handler sleeps; drop the connection."""


@dataclass(frozen=True)
class ModelSpec:
    """A model name split into its base name, dimension and ``@fault`` suffixes."""

    raw: str
    base: str
    dimension: int
    status_faults: tuple[tuple[int, int | None], ...] = ()
    delay_ms: int = 0
    hang: bool = False
    body_faults: frozenset[str] = field(default_factory=frozenset)
    dimflip_after: int | None = None
    chat_mode: str | None = None

    @property
    def is_missing(self) -> bool:
        return self.base.split(":", 1)[0] == "missing"


_STATUS_FAULT = re.compile(r"^([45]\d\d)(?:x(\d+))?$")
_SLOW_FAULT = re.compile(r"^slow(\d+)$")
_DIMFLIP_FAULT = re.compile(r"^dimflip(\d+)$")


def dimension_from_base(base: str) -> int:
    """``hash-16`` -> 16, ``hash-384:latest`` -> 384, no numeric suffix -> 384."""
    name = base.rsplit(":", 1)[0] if ":" in base else base
    match = re.search(r"-(\d+)$", name)
    if not match:
        return DEFAULT_DIMENSION
    return int(match.group(1))


def check_dimension(dimension: int, origin: str) -> int:
    if not 1 <= dimension <= MAX_DIMENSION:
        raise RequestError(400, f"{origin}: dimension {dimension} is outside 1..{MAX_DIMENSION}")
    return dimension


def parse_model(raw: str) -> ModelSpec:
    """Split ``base@fault@fault`` and validate every fault suffix."""
    base, *suffixes = raw.split("@")
    status_faults: list[tuple[int, int | None]] = []
    delay_ms = 0
    hang = False
    body_faults: set[str] = set()
    dimflip_after = None
    chat_mode = None
    for suffix in suffixes:
        status = _STATUS_FAULT.match(suffix)
        slow = _SLOW_FAULT.match(suffix)
        dimflip = _DIMFLIP_FAULT.match(suffix)
        if status:
            count = int(status.group(2)) if status.group(2) is not None else None
            status_faults.append((int(status.group(1)), count))
        elif slow:
            delay_ms += int(slow.group(1))
        elif suffix == "timeout":
            hang = True
        elif dimflip:
            dimflip_after = int(dimflip.group(1))
        elif suffix in BODY_FAULTS:
            body_faults.add(suffix)
        elif suffix in CHAT_MODES:
            # First chat mode wins so that appending modes never changes
            # the behaviour a test already relies on.
            chat_mode = chat_mode or suffix
        else:
            raise RequestError(400, f"unknown fault suffix '@{suffix}' in model name {raw!r}")
    dimension = check_dimension(dimension_from_base(base), f"model {raw!r}")
    return ModelSpec(
        raw=raw,
        base=base,
        dimension=dimension,
        status_faults=tuple(status_faults),
        delay_ms=delay_ms,
        hang=hang,
        body_faults=frozenset(body_faults),
        dimflip_after=dimflip_after,
        chat_mode=chat_mode,
    )


_OLLAMA_FAULT_MESSAGES = {
    400: "invalid request (injected test fault)",
    401: "unauthorized",
    403: "forbidden",
    429: "too many requests, please retry later",
    500: "internal server error (injected test fault)",
    503: "server busy, please try again.  maximum pending requests exceeded",
}
_OPENAI_ERROR_TYPES = {
    400: ("invalid_request_error", None),
    401: ("invalid_request_error", "invalid_api_key"),
    403: ("permission_error", None),
    404: ("invalid_request_error", "model_not_found"),
    413: ("invalid_request_error", None),
    429: ("requests", "rate_limit_exceeded"),
    500: ("server_error", None),
    503: ("server_error", "service_unavailable"),
}


def fault_error(spec: ModelSpec, status: int) -> RequestError:
    if status == 404:
        message = f'model "{spec.base}" not found, try pulling it first'
    else:
        message = _OLLAMA_FAULT_MESSAGES.get(status, f"injected test fault {status}")
    headers = (("Retry-After", "1"),) if status == 429 else ()
    return RequestError(status, message, headers)


def error_payload(style: str, status: int, message: str) -> dict:
    if style == OPENAI:
        error_type, code = _OPENAI_ERROR_TYPES.get(
            status, ("server_error" if status >= 500 else "invalid_request_error", None)
        )
        return {"error": {"message": message, "type": error_type, "param": None, "code": code}}
    return {"error": message}


# --------------------------------------------------------------------------
# Shared state: fault counters and statistics


class ServerState:
    """Per-model request counters (for ``xN`` faults) and call statistics."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._reset_locked()

    def _reset_locked(self) -> None:
        self._request_numbers: dict[str, int] = {}
        self._models: dict[str, dict] = {}
        self._totals = {
            "requests": 0,
            "model_calls": 0,
            "inputs": 0,
            "authorization_seen": 0,
            "statuses": {},
        }
        self._recent: list[dict] = []

    def reset(self) -> None:
        with self._lock:
            self._reset_locked()

    def next_request_number(self, model: str) -> int:
        """1-based number of this request among those for the exact model string."""
        with self._lock:
            number = self._request_numbers.get(model, 0) + 1
            self._request_numbers[model] = number
            return number

    def record(self, entry: dict) -> None:
        status_key = str(entry["status"])
        with self._lock:
            totals = self._totals
            totals["requests"] += 1
            totals["statuses"][status_key] = totals["statuses"].get(status_key, 0) + 1
            if entry["authorization"]:
                totals["authorization_seen"] += 1
            model = entry.get("model")
            if model is not None:
                totals["model_calls"] += 1
                totals["inputs"] += entry["inputs"]
                stats = self._models.setdefault(
                    model,
                    {"calls": 0, "inputs": 0, "routes": {}, "statuses": {}, "authorization_seen": 0},
                )
                stats["calls"] += 1
                stats["inputs"] += entry["inputs"]
                stats["routes"][entry["route"]] = stats["routes"].get(entry["route"], 0) + 1
                stats["statuses"][status_key] = stats["statuses"].get(status_key, 0) + 1
                if entry["authorization"]:
                    stats["authorization_seen"] += 1
            self._recent.append(entry)
            del self._recent[:-RECENT_LIMIT]

    def snapshot(self) -> dict:
        with self._lock:
            return json.loads(
                json.dumps({"models": self._models, "totals": self._totals, "recent": self._recent})
            )


class Activity:
    """Tracks in-flight requests and the last activity time for --idle-exit."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._in_flight = 0
        self._last = time.monotonic()

    def begin(self) -> None:
        with self._lock:
            self._in_flight += 1
            self._last = time.monotonic()

    def end(self) -> None:
        with self._lock:
            self._in_flight -= 1
            self._last = time.monotonic()

    def idle_seconds(self) -> float:
        with self._lock:
            if self._in_flight:
                return 0.0
            return time.monotonic() - self._last


# --------------------------------------------------------------------------
# Scripted chat model


_SOURCE_LINE = re.compile(r"^\s*\[(\d{1,6})\]\s+(.*)$")
# Prompt labels that end a source block even without a blank line before them.
_PROMPT_LABEL = re.compile(
    r"^\s*(?:question|answer|instructions?|follow-up|standalone question|sources|context)\s*:",
    re.IGNORECASE,
)
_FIRST_SENTENCE = re.compile(r"^(.*?[.!?])(?=\s|$)", re.DOTALL)
_HISTORY_QUESTION = re.compile(r"^\s*(?:user|human|question|q)\s*:\s*(\S.*)$", re.IGNORECASE)
_QUESTION_LINE = re.compile(r"^\s*question\s*:\s*(\S.*)$", re.IGNORECASE)
_FOLLOW_UP = re.compile(r"follow-up\s*:", re.IGNORECASE)
_STANDALONE = re.compile(r"standalone question\s*:", re.IGNORECASE)
MAX_SENTENCE_CHARS = 1000
NO_SOURCE_SENTENCE = "No source text was provided."


def message_text(content) -> str:
    """Message content as text: a string, or OpenAI-style content parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(part["text"])
            elif isinstance(part, str):
                parts.append(part)
        return "\n".join(parts)
    return ""


def collapse(text: str) -> str:
    return " ".join(text.split())


_SOURCE_HEADER = re.compile(r'^Document \d+ ".*"')


def find_sources(text: str) -> dict[int, str]:
    """Numbered source blocks ``[n] text`` (continued until a blank line)."""
    blocks: dict[int, list[str]] = {}
    current = None
    for line in text.splitlines():
        match = _SOURCE_LINE.match(line)
        if match:
            number = int(match.group(1))
            # A repeated number is most likely a citation in running text,
            # not a new source: keep the first block.
            current = None if number in blocks else number
            if current is not None:
                # The extension's source header (`[1] Document 7 "Title", p. 12`) names the source; the text
                # to quote starts on the next line.
                first = match.group(2)
                blocks[current] = [] if _SOURCE_HEADER.match(first) else [first]
        elif current is not None:
            if not line.strip() or _PROMPT_LABEL.match(line):
                current = None
            else:
                blocks[current].append(line)
    return {number: collapse(" ".join(lines)) for number, lines in blocks.items()}


def first_sentence(text: str) -> str:
    text = collapse(text)
    match = _FIRST_SENTENCE.match(text)
    sentence = match.group(1) if match else text
    if len(sentence) > MAX_SENTENCE_CHARS:
        sentence = sentence[:MAX_SENTENCE_CHARS].rsplit(" ", 1)[0]
    return sentence


def _last_user_index(messages: list[dict]) -> int | None:
    for index in range(len(messages) - 1, -1, -1):
        if messages[index].get("role") == "user":
            return index
    return None


def _previous_question(history_text: str, earlier_messages: list[dict]) -> str:
    in_prompt = [
        match.group(1)
        for match in map(_HISTORY_QUESTION.match, history_text.splitlines())
        if match
    ]
    if in_prompt:
        return collapse(in_prompt[-1])
    for message in reversed(earlier_messages):
        if message.get("role") != "user":
            continue
        text = message_text(message.get("content"))
        questions = [m.group(1) for m in map(_QUESTION_LINE.match, text.splitlines()) if m]
        return collapse(questions[-1] if questions else text)[:500]
    return ""


def rewrite_reply(prompt: str, earlier_messages: list[dict]) -> str:
    """Plain-text standalone question: ``<previous question> <follow-up>``."""
    follow_ups = list(_FOLLOW_UP.finditer(prompt))
    if follow_ups:
        marker = follow_ups[-1]
        history = prompt[: marker.start()]
        rest = prompt[marker.end() :]
        standalone = _STANDALONE.search(rest)
        follow_up = collapse(rest[: standalone.start()] if standalone else rest)
    else:
        standalone = _STANDALONE.search(prompt)
        history = prompt[: standalone.start()] if standalone else prompt
        follow_up = ""
    previous = _previous_question(history, earlier_messages)
    return f"{previous} {follow_up}".strip()


def _answer_json(answer: str, citations: list[int], sufficient: bool, reason: str | None = None) -> str:
    reply: dict = {"answer": answer, "citations": citations, "sufficient": sufficient}
    if reason is not None:
        reply["reason"] = reason
    return json.dumps(reply, ensure_ascii=False)


FLOOD_MARKERS = 100_000


def chat_reply(messages: list[dict], mode: str | None) -> tuple[str, bool]:
    """Return (assistant content, whether the reply is cut by length)."""
    last_user = _last_user_index(messages)
    prompt = message_text(messages[last_user].get("content")) if last_user is not None else ""
    earlier = messages[:last_user] if last_user is not None else list(messages)

    if _STANDALONE.search(prompt):
        return rewrite_reply(prompt, earlier), False

    sources = find_sources(prompt)
    if not sources:
        system_text = "\n".join(
            message_text(m.get("content")) for m in messages if m.get("role") == "system"
        )
        sources = find_sources(system_text)
    cited = 1 if 1 in sources else (min(sources) if sources else None)
    sentence = first_sentence(sources[cited]) if cited is not None else ""

    if mode == "insufficient":
        return _answer_json("", [], False, "The sources do not say."), False
    if mode == "cite9":
        first = sentence or NO_SOURCE_SENTENCE
        ninth = first_sentence(sources[9]) if 9 in sources else "Another source agrees."
        return _answer_json(f"{first} [1] {ninth} [9]", [1, 9], True), False
    if mode == "citeonly9":
        text = first_sentence(sources[9]) if 9 in sources else (sentence or NO_SOURCE_SENTENCE)
        return _answer_json(f"{text} [9]", [9], True), False
    if mode == "prose":
        if cited is None:
            return "I could not find this in the sources.", False
        return f"According to the sources, {sentence} [{cited}]", False
    if mode == "flood":
        # A server that ignores the token limit: an answer of a hundred thousand citation markers, never cut.
        return _answer_json((sentence or NO_SOURCE_SENTENCE) + " [1]" * FLOOD_MARKERS, [1], True), False
    if mode == "nul":
        # A NUL escaped inside the answer's JSON, which only decoding the answer makes a NUL.
        text = sentence or NO_SOURCE_SENTENCE
        return _answer_json(f"{text}\u0000 hidden after the NUL [{cited or 1}]", [cited or 1], True), False
    if mode == "length":
        words = (sentence or "The answer was cut off in the middle of a sentence").split()
        cut = " ".join(words[: max(1, len(words) // 2)]).rstrip(".!?")
        citations = [cited] if cited is not None else []
        return _answer_json(cut, citations, True), True
    if cited is None:
        return _answer_json("", [], False, "no sources"), False
    return _answer_json(f"{sentence} [{cited}]", [cited], True), False


def cut_to_words(text: str, limit: int) -> tuple[str, bool]:
    """Cut ``text`` after its ``limit``-th word, as a token limit would."""
    if limit <= 0:
        return text, False
    for index, match in enumerate(WORD.finditer(text), start=1):
        if index == limit:
            if WORD.search(text, match.end()) is None:
                return text, False
            return text[: match.end()], True
    return text, False


# --------------------------------------------------------------------------
# HTTP server


class ProviderServer(ThreadingHTTPServer):
    """The test server: threaded, daemonic handlers, stoppable while handlers sleep."""

    daemon_threads = True
    # ThreadingMixIn would otherwise join every handler thread on close,
    # including ones parked on idle keep-alive connections.
    block_on_close = False
    allow_reuse_address = True

    def __init__(self, address, require_key: str | None = None, verbose: bool = False):
        super().__init__(address, ProviderHandler)
        self.require_key = require_key
        self.verbose = verbose
        self.state = ServerState()
        self.activity = Activity()
        self.stopping = threading.Event()
        self._connections: set[socket.socket] = set()
        self._connections_lock = threading.Lock()
        self._serve_thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return self.server_address[1]

    def track(self, connection: socket.socket) -> None:
        with self._connections_lock:
            self._connections.add(connection)

    def untrack(self, connection: socket.socket) -> None:
        with self._connections_lock:
            self._connections.discard(connection)

    def start_background(self) -> None:
        self._serve_thread = threading.Thread(
            target=self.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True
        )
        self._serve_thread.start()

    def stop(self) -> None:
        """Stop accepting, wake sleeping handlers and close open connections."""
        self.stopping.set()
        if self._serve_thread is not None:
            self.shutdown()
            self._serve_thread.join()
            self._serve_thread = None
        with self._connections_lock:
            connections = list(self._connections)
        for connection in connections:
            try:
                connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self.server_close()


class BodyError(Exception):
    """The request body could not be read; the connection is out of sync."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


class ProviderHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "rag-testkit-provider/1.0"
    timeout = CONNECTION_IDLE_SECONDS
    # Headers and body go out as separate writes; without TCP_NODELAY each
    # keep-alive response waits for the client's delayed ACK (~40 ms).
    disable_nagle_algorithm = True
    server: ProviderServer

    # -- plumbing ---------------------------------------------------------

    def setup(self) -> None:
        super().setup()
        self.server.track(self.connection)

    def finish(self) -> None:
        try:
            super().finish()
        except OSError:
            pass
        finally:
            self.server.untrack(self.connection)

    def version_string(self) -> str:
        return self.server_version

    def log_message(self, format, *args) -> None:  # noqa: A002 (stdlib signature)
        if self.server.verbose:
            super().log_message(format, *args)

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_HEAD(self) -> None:
        self._dispatch("HEAD")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    def do_PATCH(self) -> None:
        self._dispatch("PATCH")

    def do_OPTIONS(self) -> None:
        self._dispatch("OPTIONS")

    ROUTES = {
        "/": {"GET": "_root", "HEAD": "_root"},
        "/api/embed": {"POST": "_api_embed"},
        "/api/embeddings": {"POST": "_api_embeddings"},
        "/api/chat": {"POST": "_api_chat"},
        "/api/tags": {"GET": "_api_tags"},
        "/api/version": {"GET": "_api_version"},
        "/api/show": {"POST": "_api_show"},
        "/v1/embeddings": {"POST": "_v1_embeddings"},
        "/v1/chat/completions": {"POST": "_v1_chat"},
        "/v1/models": {"GET": "_v1_models"},
        "/v1/rerank": {"POST": "_v1_rerank"},
        "/_control/stats": {"GET": "_control_stats"},
        "/_control/reset": {"POST": "_control_reset"},
        "/_control/health": {"GET": "_control_health"},
    }

    def _dispatch(self, method: str) -> None:
        self.server.activity.begin()
        self._method = method
        path = urlsplit(self.path).path or "/"
        if len(path) > 1:
            path = path.rstrip("/") or "/"
        self._route = path
        self._recorded = False
        self._style = OPENAI if path.startswith("/v1/") else OLLAMA
        self._entry = {
            "route": path,
            "method": method,
            "model": None,
            "inputs": 0,
            "first_input": None,
            "headers": sorted({name.lower() for name in self.headers.keys()}),
            "authorization": self.headers.get("Authorization") is not None,
            "params": {},
            "status": 0,
        }
        try:
            self._handle(method, path)
        except ServerStopping:
            self.close_connection = True
        except (BrokenPipeError, ConnectionResetError, socket.timeout):
            self.close_connection = True
        except Exception as error:  # the test server must never die on a request
            self._entry["status"] = 500
            try:
                self._send_json(500, error_payload(self._style, 500, f"test server bug: {error!r}"))
            except OSError:
                self.close_connection = True
        finally:
            self._record_once()
            self.server.activity.end()

    def _record_once(self) -> None:
        """Counts the request in the stats, once. A response is counted before it is sent, so a client
        that reads /_control/stats (or resets them) right after getting its answer sees its own request."""
        if self._recorded or self._route.startswith("/_control/"):
            return
        self._recorded = True
        self.server.state.record(self._entry)

    def _handle(self, method: str, path: str) -> None:
        methods = self.ROUTES.get(path)
        if methods is None:
            self._discard_body()
            self._send_json(404, error_payload(self._style, 404, f"no route for {path}"))
            return
        handler_name = methods.get(method)
        if handler_name is None:
            self._discard_body()
            allowed = ", ".join(sorted(methods))
            self._send_json(
                405,
                error_payload(self._style, 405, f"method {method} not allowed on {path}"),
                headers=(("Allow", allowed),),
            )
            return
        try:
            # Read any body, even on GET, so a keep-alive connection stays in sync.
            raw_body = self._read_body()
        except BodyError as error:
            self.close_connection = True
            self._send_json(error.status, error_payload(self._style, error.status, error.message))
            return
        try:
            if self._style == OPENAI:
                self._check_key()
            getattr(self, handler_name)(raw_body)
        except RequestError as error:
            self._send_json(
                error.status, error_payload(self._style, error.status, error.message), error.headers
            )

    def _read_body(self) -> bytes:
        length_header = self.headers.get("Content-Length")
        if length_header is not None:
            try:
                length = int(length_header)
            except ValueError:
                raise BodyError(400, f"invalid Content-Length {length_header!r}") from None
            if length < 0:
                raise BodyError(400, f"invalid Content-Length {length_header!r}")
            if length > MAX_BODY_BYTES:
                raise BodyError(413, f"request body of {length} bytes exceeds {MAX_BODY_BYTES}")
            body = self.rfile.read(length)
            if len(body) != length:
                raise BodyError(400, "request body shorter than Content-Length")
            return body
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            return self._read_chunked()
        return b""

    def _read_chunked(self) -> bytes:
        chunks = []
        total = 0
        while True:
            line = self.rfile.readline(65537)
            if not line:
                raise BodyError(400, "chunked body ended early")
            size_text = line.split(b";", 1)[0].strip()
            try:
                size = int(size_text, 16)
            except ValueError:
                raise BodyError(400, f"invalid chunk size {size_text[:20]!r}") from None
            if size == 0:
                while self.rfile.readline(65537) not in (b"\r\n", b"\n", b""):
                    pass
                return b"".join(chunks)
            total += size
            if size < 0 or total > MAX_BODY_BYTES:
                raise BodyError(413, f"chunked request body exceeds {MAX_BODY_BYTES} bytes")
            data = self.rfile.read(size)
            if len(data) != size:
                raise BodyError(400, "chunked body ended early")
            chunks.append(data)
            self.rfile.readline(3)

    def _discard_body(self) -> None:
        try:
            self._read_body()
        except BodyError:
            self.close_connection = True

    def _send(self, status: int, body: bytes, content_type: str, headers=()) -> None:
        self._entry["status"] = status
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in headers:
            self.send_header(name, value)
        if self.close_connection:
            self.send_header("Connection", "close")
        self._record_once()
        self.end_headers()
        if self._method != "HEAD":
            self.wfile.write(body)
        self.wfile.flush()

    def _send_json(self, status: int, payload, headers=()) -> None:
        body = json.dumps(payload, ensure_ascii=False, allow_nan=False).encode("utf-8") + b"\n"
        self._send(status, body, "application/json; charset=utf-8", headers)

    def _send_raw_json(self, status: int, body: bytes) -> None:
        self._send(status, body, "application/json; charset=utf-8")

    # -- request helpers --------------------------------------------------

    def _check_key(self) -> None:
        key = self.server.require_key
        if key is None:
            return
        if self.headers.get("Authorization", "") != f"Bearer {key}":
            raise RequestError(401, "Incorrect API key provided (test server requires a key)")

    @staticmethod
    def _parse_object(raw_body: bytes) -> dict:
        try:
            text = raw_body.decode("utf-8")
        except UnicodeDecodeError as error:
            raise RequestError(400, f"request body is not UTF-8: {error}") from None
        if not text.strip():
            raise RequestError(400, "request body is empty; expected a JSON object")
        try:
            body = json.loads(text)
        except (json.JSONDecodeError, RecursionError) as error:
            raise RequestError(400, f"invalid JSON in request body: {error}") from None
        if not isinstance(body, dict):
            raise RequestError(400, f"request body must be a JSON object, got {type(body).__name__}")
        return body

    def _model_spec(self, body: dict, *keys: str) -> ModelSpec:
        for key in keys:
            value = body.get(key)
            if value is not None:
                if not isinstance(value, str) or not value:
                    raise RequestError(400, f"'{key}' must be a non-empty string")
                self._entry["model"] = value
                return parse_model(value)
        raise RequestError(400, "model is required")

    def _remember(self, body: dict, inputs: list[str], *param_keys: str) -> None:
        self._entry["inputs"] = len(inputs)
        if inputs:
            self._entry["first_input"] = inputs[0][:FIRST_INPUT_PREVIEW]
        self._entry["params"] = {key: body[key] for key in param_keys if key in body}

    def _apply_faults(self, spec: ModelSpec) -> int:
        """Count the request, apply delays and status faults; return its number."""
        if spec.is_missing:
            raise fault_error(spec, 404)
        number = self.server.state.next_request_number(spec.raw)
        delay = spec.delay_ms / 1000.0 + (HANG_SECONDS if spec.hang else 0.0)
        if delay > 0 and self.server.stopping.wait(delay):
            raise ServerStopping()
        for status, count in spec.status_faults:
            if count is None or number <= count:
                raise fault_error(spec, status)
        return number

    @staticmethod
    def _optional_dimension(body: dict, spec: ModelSpec) -> int:
        value = body.get("dimensions")
        if value is None:
            return spec.dimension
        if isinstance(value, bool) or not isinstance(value, int):
            raise RequestError(400, "'dimensions' must be an integer")
        return check_dimension(value, "'dimensions'")

    @staticmethod
    def _vectors(texts: list[str], dimension: int, spec: ModelSpec, number: int) -> list[list[float]]:
        if spec.dimflip_after is not None and number > spec.dimflip_after:
            dimension += 1
        vectors = [embed_text(text, dimension) for text in texts]
        if "nan" in spec.body_faults:
            vectors = [[0.0] * len(vector) for vector in vectors]
        if "countmismatch" in spec.body_faults:
            vectors = vectors[:-1]
        return vectors

    # -- Ollama routes ----------------------------------------------------

    def _root(self, _raw: bytes) -> None:
        self._send(200, b"Ollama is running", "text/plain; charset=utf-8")

    def _api_version(self, _raw: bytes) -> None:
        self._send_json(200, {"version": "0.0.0-test"})

    def _api_tags(self, _raw: bytes) -> None:
        models = []
        for index, (name, dimension, _kind) in enumerate(CATALOG):
            models.append(
                {
                    "name": name,
                    "model": name,
                    "modified_at": FIXED_CREATED_AT,
                    "size": 123 + index,
                    "digest": hashlib.sha256(name.encode()).hexdigest(),
                    "details": {
                        "format": "gguf",
                        "family": "test",
                        "families": ["test"],
                        "parameter_size": "0M",
                        "quantization_level": "F32",
                        "embedding_length": dimension,
                    },
                }
            )
        self._send_json(200, {"models": models})

    def _api_show(self, raw: bytes) -> None:
        body = self._parse_object(raw)
        spec = self._model_spec(body, "model", "name")
        if spec.is_missing:
            raise fault_error(spec, 404)
        is_chat = spec.base.startswith("chat")
        self._send_json(
            200,
            {
                "modelfile": "",
                "parameters": "",
                "template": "",
                "details": {"format": "gguf", "family": "test", "parameter_size": "0M"},
                "model_info": {
                    "general.architecture": "testhash",
                    "testhash.embedding_length": spec.dimension,
                    "testhash.context_length": CONTEXT_CHARS,
                },
                "capabilities": ["completion"] if is_chat else ["embedding"],
                "modified_at": FIXED_CREATED_AT,
            },
        )

    def _api_embed(self, raw: bytes) -> None:
        body = self._parse_object(raw)
        spec = self._model_spec(body, "model")
        raw_input = body.get("input")
        if raw_input is None:
            texts: list[str] = []
        elif isinstance(raw_input, str):
            texts = [raw_input] if raw_input else []
        elif isinstance(raw_input, list) and all(isinstance(item, str) for item in raw_input):
            texts = list(raw_input)
        else:
            raise RequestError(400, "invalid input type")
        self._remember(body, texts, "truncate", "keep_alive", "options", "dimensions")
        truncate = body.get("truncate", True)
        if not isinstance(truncate, bool):
            raise RequestError(400, "'truncate' must be a boolean")
        if any(len(text) > CONTEXT_CHARS for text in texts):
            if not truncate:
                raise RequestError(400, "the input length exceeds the context length")
            texts = [text[:CONTEXT_CHARS] for text in texts]
        dimension = self._optional_dimension(body, spec)
        number = self._apply_faults(spec)
        if "badjson" in spec.body_faults:
            self._send_raw_json(200, b'{"embeddings": [[0.1, 0.2')
            return
        if "wrongshape" in spec.body_faults:
            self._send_json(200, {"model": spec.raw, "embeddings": "nope"})
            return
        if not spec.body_faults and spec.dimflip_after is None:
            # What the json.dumps below would send, from vectors encoded once per text.
            encoded = [ENCODED.get(text, dimension) for text in texts]
            tokens = sum(count for _, count in encoded)
            body = (
                '{"model": ' + json.dumps(spec.raw, ensure_ascii=False)
                + ', "embeddings": [' + ", ".join(vector for vector, _ in encoded) + "]"
                + f', "total_duration": {1_000_000 + 1_000 * tokens}, "load_duration": 500000'
                + f', "prompt_eval_count": {tokens}}}\n'
            )
            self._send_raw_json(200, body.encode("utf-8"))
            return
        tokens = sum(word_count(text) for text in texts)
        self._send_json(
            200,
            {
                "model": spec.raw,
                "embeddings": self._vectors(texts, dimension, spec, number),
                "total_duration": 1_000_000 + 1_000 * tokens,
                "load_duration": 500_000,
                "prompt_eval_count": tokens,
            },
        )

    def _api_embeddings(self, raw: bytes) -> None:
        body = self._parse_object(raw)
        spec = self._model_spec(body, "model")
        prompt = body.get("prompt", "")
        if not isinstance(prompt, str):
            raise RequestError(400, "'prompt' must be a string")
        self._remember(body, [prompt], "keep_alive", "options")
        number = self._apply_faults(spec)
        if "badjson" in spec.body_faults:
            self._send_raw_json(200, b'{"embedding": [0.1, 0.2')
            return
        if "wrongshape" in spec.body_faults:
            self._send_json(200, {"embedding": "nope"})
            return
        # The legacy route answers an empty prompt with an empty embedding.
        texts = [prompt[:CONTEXT_CHARS]] if prompt else []
        vectors = self._vectors(texts, spec.dimension, spec, number)
        self._send_json(200, {"embedding": vectors[0] if vectors else []})

    def _chat_request(self, body: dict) -> tuple[ModelSpec, list[dict]]:
        spec = self._model_spec(body, "model")
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise RequestError(400, "'messages' must be a non-empty array")
        for index, message in enumerate(messages):
            if not isinstance(message, dict) or not isinstance(message.get("role"), str):
                raise RequestError(400, f"messages[{index}] must be an object with a string 'role'")
            content = message.get("content")
            if content is not None and not isinstance(content, (str, list)):
                raise RequestError(400, f"messages[{index}].content must be a string or an array")
        last_user = _last_user_index(messages)
        preview_source = messages[last_user] if last_user is not None else messages[-1]
        preview = message_text(preview_source.get("content"))
        self._entry["inputs"] = len(messages)
        self._entry["first_input"] = preview[:FIRST_INPUT_PREVIEW]
        return spec, messages

    @staticmethod
    def _token_limit(value) -> int:
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
        return 0

    def _chat_content(self, spec: ModelSpec, messages: list[dict], limit: int) -> tuple[str, bool, int, int]:
        content, cut_by_mode = chat_reply(messages, spec.chat_mode)
        content, cut_by_limit = cut_to_words(content, 0 if spec.chat_mode == "flood" else limit)
        prompt_tokens = sum(word_count(message_text(m.get("content"))) for m in messages)
        return content, cut_by_mode or cut_by_limit, prompt_tokens, word_count(content)

    def _api_chat(self, raw: bytes) -> None:
        body = self._parse_object(raw)
        spec, messages = self._chat_request(body)
        self._entry["params"] = {
            key: body[key] for key in ("stream", "format", "options", "keep_alive", "think") if key in body
        }
        options = body.get("options")
        limit = self._token_limit(options.get("num_predict")) if isinstance(options, dict) else 0
        self._apply_faults(spec)
        if "badjson" in spec.body_faults:
            self._send_raw_json(
                200, b'{"model": "' + spec.base.encode() + b'", "message": {"role": "assistant", "content": "{\\"ans'
            )
            return
        if "wrongshape" in spec.body_faults:
            self._send_json(200, {"model": spec.raw, "message": "nope", "done": True})
            return
        content, cut, prompt_tokens, reply_tokens = self._chat_content(spec, messages, limit)
        self._send_json(
            200,
            {
                "model": spec.raw,
                "created_at": FIXED_CREATED_AT,
                "message": {"role": "assistant", "content": content},
                "done": True,
                "done_reason": "length" if cut else "stop",
                "total_duration": 2_000_000 + 1_000 * (prompt_tokens + reply_tokens),
                "load_duration": 500_000,
                "prompt_eval_count": prompt_tokens,
                "eval_count": reply_tokens,
            },
        )

    # -- OpenAI routes ----------------------------------------------------

    def _v1_rerank(self, raw: bytes) -> None:
        """The rerank API of llama.cpp's server, vLLM, Jina and Cohere: one relevance score per document, best
        first, each with its index. The score is deterministic: 10 * cosine of the two texts' hash embeddings,
        minus 5 (so a document that repeats the query scores 5, an unrelated one about -5)."""
        body = self._parse_object(raw)
        spec = self._model_spec(body, "model")
        query = body.get("query")
        documents = body.get("documents")
        if not isinstance(query, str) or not query:
            raise RequestError(400, "'query' must be a non-empty string")
        if not isinstance(documents, list) or not documents or not all(isinstance(d, str) for d in documents):
            raise RequestError(400, "'documents' must be a non-empty array of strings")
        top_n = body.get("top_n", len(documents))
        if isinstance(top_n, bool) or not isinstance(top_n, int) or top_n < 1:
            raise RequestError(400, "'top_n' must be a positive integer")
        self._remember(body, documents, "top_n", "return_documents")
        number = self._apply_faults(spec)
        if "badjson" in spec.body_faults:
            self._send_raw_json(200, b'{"results": [{"index": 0, "relevance_score": 0.5')
            return
        if "wrongshape" in spec.body_faults:
            self._send_json(200, {"model": spec.raw, "results": "nope"})
            return
        asked = embed_text(query, spec.dimension)
        scores = [10.0 * sum(a * b for a, b in zip(asked, embed_text(d, spec.dimension))) - 5.0 for d in documents]
        if "reversed" in spec.body_faults:
            # A reranker that disagrees with the embeddings: it puts the farthest document first.
            scores = [-score for score in scores]
        if "extreme" in spec.body_faults:
            # Finite 32-bit scores whose differences are not: the best at the top of the range, the rest at the
            # bottom.
            best = max(range(len(documents)), key=lambda i: (scores[i], -i))
            scores = [3.4e38 if i == best else -3.4e38 for i in range(len(documents))]
        ranked = sorted(range(len(documents)), key=lambda i: (-scores[i], i))[:top_n]
        if "countmismatch" in spec.body_faults:
            ranked = ranked[:-1]
        del number
        tokens = word_count(query) * len(documents) + sum(word_count(d) for d in documents)
        self._send_json(
            200,
            {
                "model": spec.raw,
                "results": [{"index": i, "relevance_score": scores[i]} for i in ranked],
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            },
        )

    def _v1_models(self, _raw: bytes) -> None:
        data = [
            {"id": name, "object": "model", "created": FIXED_CREATED_UNIX, "owned_by": "testkit"}
            for name, _dimension, _kind in CATALOG
        ]
        self._send_json(200, {"object": "list", "data": data})

    def _v1_embeddings(self, raw: bytes) -> None:
        body = self._parse_object(raw)
        spec = self._model_spec(body, "model")
        raw_input = body.get("input")
        if isinstance(raw_input, str):
            texts = [raw_input]
        elif isinstance(raw_input, list) and raw_input and all(isinstance(i, str) for i in raw_input):
            texts = list(raw_input)
        else:
            raise RequestError(
                400, "'input' must be a non-empty string or a non-empty array of strings"
            )
        self._remember(body, texts, "dimensions", "encoding_format", "user")
        if any(not text for text in texts):
            raise RequestError(400, "'input' must not contain empty strings")
        if any(len(text) > CONTEXT_CHARS for text in texts):
            raise RequestError(
                400,
                f"This model's maximum context length is {CONTEXT_CHARS} tokens, "
                "however you requested more. Please reduce your input.",
            )
        encoding = body.get("encoding_format", "float")
        if encoding not in ("float", "base64"):
            raise RequestError(400, "'encoding_format' must be 'float' or 'base64'")
        dimension = self._optional_dimension(body, spec)
        number = self._apply_faults(spec)
        if "badjson" in spec.body_faults:
            self._send_raw_json(
                200, b'{"object": "list", "data": [{"object": "embedding", "index": 0, "embedding": [0.1, 0.2'
            )
            return
        if "wrongshape" in spec.body_faults:
            self._send_json(200, {"object": "list", "data": "nope", "model": spec.raw})
            return
        data = []
        for index, vector in enumerate(self._vectors(texts, dimension, spec, number)):
            if encoding == "base64":
                packed = struct.pack(f"<{len(vector)}f", *vector)
                embedding = base64.b64encode(packed).decode("ascii")
            else:
                embedding = vector
            data.append({"object": "embedding", "index": index, "embedding": embedding})
        tokens = sum(word_count(text) for text in texts)
        self._send_json(
            200,
            {
                "object": "list",
                "data": data,
                "model": spec.raw,
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            },
        )

    def _v1_chat(self, raw: bytes) -> None:
        body = self._parse_object(raw)
        spec, messages = self._chat_request(body)
        self._entry["params"] = {
            key: body[key]
            for key in ("stream", "response_format", "max_tokens", "max_completion_tokens", "temperature")
            if key in body
        }
        limit = self._token_limit(body.get("max_completion_tokens")) or self._token_limit(
            body.get("max_tokens")
        )
        self._apply_faults(spec)
        if "badjson" in spec.body_faults:
            self._send_raw_json(200, b'{"id": "chatcmpl-test", "object": "chat.completion", "choices": [{"ind')
            return
        if "wrongshape" in spec.body_faults:
            self._send_json(200, {"id": "chatcmpl-test", "object": "chat.completion", "choices": "nope"})
            return
        content, cut, prompt_tokens, reply_tokens = self._chat_content(spec, messages, limit)
        request_digest = hashlib.sha256(raw).hexdigest()[:24]
        self._send_json(
            200,
            {
                "id": f"chatcmpl-test-{request_digest}",
                "object": "chat.completion",
                "created": FIXED_CREATED_UNIX,
                "model": spec.raw,
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": content},
                        "finish_reason": "length" if cut else "stop",
                    }
                ],
                "usage": {
                    "prompt_tokens": prompt_tokens,
                    "completion_tokens": reply_tokens,
                    "total_tokens": prompt_tokens + reply_tokens,
                },
            },
        )

    # -- control API ------------------------------------------------------

    def _control_stats(self, _raw: bytes) -> None:
        self._send_json(200, self.server.state.snapshot())

    def _control_reset(self, _raw: bytes) -> None:
        self.server.state.reset()
        self._send_json(200, {"reset": True})

    def _control_health(self, _raw: bytes) -> None:
        self._send(200, b"ok", "text/plain; charset=utf-8")


# --------------------------------------------------------------------------
# Command line


LOOPBACK_HOSTS = {"127.0.0.1": "127.0.0.1", "localhost": "127.0.0.1"}


def _write_port_file(path: str, port: int) -> None:
    # Write-then-rename so a driver polling the file never reads a partial port.
    temporary = f"{path}.tmp.{os.getpid()}"
    with open(temporary, "w", encoding="ascii") as handle:
        handle.write(f"{port}\n")
    os.replace(temporary, path)


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--port", type=int, default=0, help="TCP port; 0 picks a free one")
    parser.add_argument("--port-file", help="write the bound port to this file when ready")
    parser.add_argument("--host", default="127.0.0.1", help="only 127.0.0.1 (or localhost)")
    parser.add_argument(
        "--idle-exit",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="exit after this many seconds without requests (0 = never)",
    )
    parser.add_argument("--require-key", metavar="KEY", help="require 'Authorization: Bearer KEY' on /v1 routes")
    parser.add_argument("--verbose", action="store_true", help="log every request to stderr")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    host = LOOPBACK_HOSTS.get(args.host)
    if host is None:
        print(f"provider_server: refusing to listen on {args.host!r}: loopback only", file=sys.stderr)
        return 2
    if not 0 <= args.port <= 65535:
        print(f"provider_server: invalid port {args.port}", file=sys.stderr)
        return 2
    try:
        server = ProviderServer((host, args.port), require_key=args.require_key, verbose=args.verbose)
    except OSError as error:
        print(f"provider_server: cannot listen on {host}:{args.port}: {error}", file=sys.stderr)
        return 1

    stop = threading.Event()

    def request_stop(_signum, _frame) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)

    server.start_background()
    if args.port_file:
        _write_port_file(args.port_file, server.port)
    print(f"listening {host}:{server.port}", flush=True)

    poll = 0.2 if args.idle_exit <= 0 else min(0.2, args.idle_exit / 4)
    while not stop.wait(poll):
        if args.idle_exit > 0 and server.activity.idle_seconds() >= args.idle_exit:
            print(f"provider_server: idle for {args.idle_exit:g}s, exiting", file=sys.stderr, flush=True)
            break
    server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
