#!/usr/bin/env python3
"""Independent reference for rag-embed-local: BERT sentence embeddings in plain numpy.

It reads the same model directory (model.safetensors, tokenizer.json, config.json) but shares no code
with the Rust crate: the safetensors file is parsed by hand, the BERT tokenizer (normalisation,
punctuation split, WordPiece) is re-implemented from tokenizer.json's vocabulary, and the transformer
is written out layer by layer. Mean pooling over the attention mask and L2 normalisation follow
sentence-transformers.

sentence-transformers itself is not installable here; this numpy forward pass over the same weights
is the stand-in for it, both as the correctness oracle and as the Python benchmark baseline.

Usage:
  forward.py --fixture OUT.json          write token ids and float64 embeddings of FIXTURE_SENTENCES
  forward.py --bench CHUNKS.json         time float32 embedding of the chunks written by examples/bench.rs
  forward.py SENTENCE...                 print the embeddings' pairwise cosine similarities
Options: --model-dir DIR (default $RAG_MODEL_DIR or the fetch-model location), --threads N (BLAS
threads, default 1; must be given before numpy loads, which this script arranges).
"""

import argparse
import json
import math
import os
import struct
import subprocess
import sys
import time
import unicodedata

FIXTURE_SENTENCES = [
    "The weather is lovely today.",
    "It's so sunny outside!",
    "He drove to the stadium.",
    "Café au lait, naïve façade — ÉCOLE Zürich 東京 42.5% (v2.0)!",
    "PostgreSQL's VACUUM reclaims storage occupied by dead tuples; autovacuum runs it in the background.",
    # Longer than the 128 tokens the packaged tokenizer.json truncates to: proves truncation is off.
    " ".join(
        [
            "Write-ahead logging is a standard method for ensuring data integrity.",
            "Changes to data files must be written only after those changes have been logged,",
            "that is, after log records describing the changes have been flushed to permanent storage.",
            "If we follow this procedure, we do not need to flush data pages to disk on every commit,",
            "because we know that in the event of a crash we will be able to recover the database",
            "using the log: any changes that have not been applied to the data pages can be redone",
            "from the log records. This is roll-forward recovery, also known as REDO.",
            "Because WAL restores database file contents after a crash, journaled file systems are",
            "not necessary for reliable storage of the data files or WAL files. In fact, journaling",
            "overhead can reduce performance, especially if journaling causes file system data to be",
            "flushed to disk. Using WAL results in a significantly reduced number of disk writes,",
            "because only the log file needs to be flushed to disk to guarantee that a transaction",
            "is committed, rather than every data file changed by the transaction.",
        ]
    ),
]


def default_model_dir():
    if os.environ.get("RAG_MODEL_DIR"):
        return os.environ["RAG_MODEL_DIR"]
    try:
        share = subprocess.run(
            ["pg_config", "--sharedir"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        share = "/usr/share/postgresql/15"
    return os.path.join(share, "rag", "models", "all-MiniLM-L6-v2")


def read_safetensors(path, np):
    with open(path, "rb") as handle:
        data = handle.read()
    (header_len,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + header_len])
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__" or info["dtype"] != "F32":
            continue
        begin, end = info["data_offsets"]
        raw = data[8 + header_len + begin : 8 + header_len + end]
        tensors[name] = np.frombuffer(raw, dtype="<f4").reshape(info["shape"])
    return tensors


class BertTokenizer:
    """Lower-casing BERT tokenizer: BertNormalizer, BertPreTokenizer, WordPiece, [CLS] ... [SEP]."""

    def __init__(self, tokenizer_json):
        model = tokenizer_json["model"]
        self.vocab = model["vocab"]
        self.unk = self.vocab[model["unk_token"]]
        self.prefix = model["continuing_subword_prefix"]
        self.max_chars = model["max_input_chars_per_word"]
        self.cls = self.vocab["[CLS]"]
        self.sep = self.vocab["[SEP]"]

    @staticmethod
    def _is_cjk(code):
        return (
            0x4E00 <= code <= 0x9FFF
            or 0x3400 <= code <= 0x4DBF
            or 0x20000 <= code <= 0x2A6DF
            or 0x2A700 <= code <= 0x2B73F
            or 0x2B740 <= code <= 0x2B81F
            or 0x2B820 <= code <= 0x2CEAF
            or 0xF900 <= code <= 0xFAFF
            or 0x2F800 <= code <= 0x2FA1F
        )

    @staticmethod
    def _is_punctuation(char):
        code = ord(char)
        if 33 <= code <= 47 or 58 <= code <= 64 or 91 <= code <= 96 or 123 <= code <= 126:
            return True
        return unicodedata.category(char).startswith("P")

    def _normalize(self, text):
        out = []
        for char in text:
            code = ord(char)
            category = unicodedata.category(char)
            if code == 0 or code == 0xFFFD:
                continue
            if char in "\t\n\r" or category == "Zs":
                out.append(" ")
            elif category in ("Cc", "Cf"):
                continue
            elif self._is_cjk(code):
                out.append(" " + char + " ")
            else:
                out.append(char)
        text = unicodedata.normalize("NFD", "".join(out))
        text = "".join(c for c in text if unicodedata.category(c) != "Mn")
        return text.lower()

    def _words(self, text):
        words, current = [], []
        for char in text:
            if char.isspace():
                if current:
                    words.append("".join(current))
                    current = []
            elif self._is_punctuation(char):
                if current:
                    words.append("".join(current))
                    current = []
                words.append(char)
            else:
                current.append(char)
        if current:
            words.append("".join(current))
        return words

    def _wordpiece(self, word):
        if len(word) > self.max_chars:
            return [self.unk]
        pieces, start = [], 0
        while start < len(word):
            end = len(word)
            found = None
            while start < end:
                piece = word[start:end] if start == 0 else self.prefix + word[start:end]
                if piece in self.vocab:
                    found = self.vocab[piece]
                    break
                end -= 1
            if found is None:
                return [self.unk]
            pieces.append(found)
            start = end
        return pieces

    def encode(self, text):
        ids = [self.cls]
        for word in self._words(self._normalize(text)):
            ids.extend(self._wordpiece(word))
        ids.append(self.sep)
        return ids


def erf(x, np):
    # Abramowitz & Stegun 7.1.26: absolute error below 1.5e-7, far under the 1e-4 tolerance checked.
    sign = np.sign(x)
    x = np.abs(x)
    t = 1.0 / (1.0 + 0.3275911 * x)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    return sign * (1.0 - poly * np.exp(-x * x))


class NumpyBert:
    def __init__(self, model_dir, dtype, np):
        self.np = np
        with open(os.path.join(model_dir, "config.json")) as handle:
            self.config = json.load(handle)
        with open(os.path.join(model_dir, "tokenizer.json")) as handle:
            self.tokenizer = BertTokenizer(json.load(handle))
        raw = read_safetensors(os.path.join(model_dir, "model.safetensors"), np)
        prefix = "bert." if "bert.embeddings.word_embeddings.weight" in raw else ""
        self.w = {name[len(prefix) :]: value.astype(dtype) for name, value in raw.items() if name.startswith(prefix)}
        self.dtype = dtype
        self.eps = self.config["layer_norm_eps"]
        self.heads = self.config["num_attention_heads"]

    def _layer_norm(self, x, name):
        np = self.np
        mean = x.mean(-1, keepdims=True)
        var = ((x - mean) ** 2).mean(-1, keepdims=True)
        return (x - mean) / np.sqrt(var + self.eps) * self.w[name + ".weight"] + self.w[name + ".bias"]

    def _linear(self, x, name):
        return x @ self.w[name + ".weight"].T + self.w[name + ".bias"]

    def forward(self, batch_ids):
        """Embeds token-id lists padded to the longest, with padding masked out; returns unit vectors."""
        np = self.np
        batch, longest = len(batch_ids), max(len(ids) for ids in batch_ids)
        ids = np.zeros((batch, longest), dtype=np.int64)
        mask = np.zeros((batch, longest), dtype=self.dtype)
        for row, row_ids in enumerate(batch_ids):
            ids[row, : len(row_ids)] = row_ids
            mask[row, : len(row_ids)] = 1
        w = self.w
        x = (
            w["embeddings.word_embeddings.weight"][ids]
            + w["embeddings.position_embeddings.weight"][:longest]
            + w["embeddings.token_type_embeddings.weight"][0]
        )
        x = self._layer_norm(x, "embeddings.LayerNorm")
        hidden = x.shape[-1]
        head_dim = hidden // self.heads
        bias = ((1.0 - mask) * np.finfo(self.dtype).min)[:, None, None, :]
        for layer in range(self.config["num_hidden_layers"]):
            p = f"encoder.layer.{layer}."

            def split(t):
                return t.reshape(batch, longest, self.heads, head_dim).transpose(0, 2, 1, 3)

            q = split(self._linear(x, p + "attention.self.query"))
            k = split(self._linear(x, p + "attention.self.key"))
            v = split(self._linear(x, p + "attention.self.value"))
            scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(head_dim) + bias
            scores = np.exp(scores - scores.max(-1, keepdims=True))
            probs = scores / scores.sum(-1, keepdims=True)
            context = (probs @ v).transpose(0, 2, 1, 3).reshape(batch, longest, hidden)
            x = self._layer_norm(self._linear(context, p + "attention.output.dense") + x, p + "attention.output.LayerNorm")
            inner = self._linear(x, p + "intermediate.dense")
            inner = 0.5 * inner * (1.0 + erf(inner / math.sqrt(2.0), np))
            x = self._layer_norm(self._linear(inner, p + "output.dense") + x, p + "output.LayerNorm")
        summed = (x * mask[:, :, None]).sum(1)
        mean = summed / mask.sum(1, keepdims=True)
        norms = np.maximum(np.linalg.norm(mean, axis=1, keepdims=True), 1e-12)
        return mean / norms

    def embed(self, texts, batch_size=32):
        """Like sentence-transformers' encode: length-sorted batches of 32, results in input order."""
        encoded = [self.tokenizer.encode(text) for text in texts]
        order = sorted(range(len(texts)), key=lambda index: len(encoded[index]))
        out = [None] * len(texts)
        for start in range(0, len(order), batch_size):
            group = order[start : start + batch_size]
            vectors = self.forward([encoded[index] for index in group])
            for index, vector in zip(group, vectors):
                out[index] = vector
        return out, encoded


def write_fixture(model, path):
    vectors, encoded = model.embed(FIXTURE_SENTENCES)
    fixture = {
        "generator": "reference/forward.py --fixture (numpy, float64)",
        "sentences": FIXTURE_SENTENCES,
        "token_ids": encoded,
        "embeddings": [[round(float(value), 9) for value in vector] for vector in vectors],
    }
    with open(path, "w") as handle:
        json.dump(fixture, handle, ensure_ascii=False, indent=1)
        handle.write("\n")
    print(f"wrote {len(vectors)} embeddings to {path}")


def bench(model, chunks_path, threads):
    np = model.np
    with open(chunks_path) as handle:
        spec = json.load(handle)
    chunks, query = spec["chunks"], spec["query"]
    model.embed(chunks[:4])  # warm-up: first-touch page faults and BLAS start-up
    started = time.perf_counter()
    model.embed(chunks)
    elapsed = time.perf_counter() - started
    latencies = []
    for _ in range(50):
        started = time.perf_counter()
        model.embed([query])
        latencies.append(time.perf_counter() - started)
    latencies.sort()
    median_ms = (latencies[24] + latencies[25]) / 2 * 1000
    print(
        f"numpy reference ({threads} BLAS thread{'s' if threads > 1 else ''}, float32, numpy {np.__version__}): "
        f"{len(chunks)} chunks in {elapsed:.2f} s = {len(chunks) / elapsed:.1f} chunks/s; "
        f"query latency median of 50 = {median_ms:.2f} ms"
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", default=default_model_dir())
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--fixture", metavar="OUT_JSON")
    parser.add_argument("--bench", metavar="CHUNKS_JSON")
    parser.add_argument("sentences", nargs="*")
    args = parser.parse_args()

    # BLAS reads these once when numpy is first imported.
    for variable in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[variable] = str(args.threads)
    import numpy as np

    if not os.path.exists(os.path.join(args.model_dir, "model.safetensors")):
        sys.exit(f"no model in {args.model_dir}: run scripts/fetch-model")
    if args.fixture:
        write_fixture(NumpyBert(args.model_dir, np.float64, np), args.fixture)
    elif args.bench:
        bench(NumpyBert(args.model_dir, np.float32, np), args.bench, args.threads)
    else:
        sentences = args.sentences or FIXTURE_SENTENCES[:3]
        vectors, _ = NumpyBert(args.model_dir, np.float64, np).embed(sentences)
        for i in range(len(sentences)):
            for j in range(i + 1, len(sentences)):
                print(f"sim({i},{j}) = {float(vectors[i] @ vectors[j]):.4f}")


if __name__ == "__main__":
    main()
