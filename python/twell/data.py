"""Tokenized corpora for training: shards on disk, a deterministic loader for any number of ranks.

A corpus is a directory with `manifest.json` and shards: each shard a `.npy` file holding a 1-D
uint32 array of token ids (documents joined, each followed by the tokenizer's end-of-text id). The
manifest lists every shard with its token count and sha256, and the tokenizer it was made with:

    {"format": "twell-tokens-1", "tokenizer": "...", "eos_id": 0, "vocab_size": 49152,
     "shards": [{"file": "shard-00000.npy", "tokens": 1048576, "sha256": "..."}]}

`write_corpus` makes one from token-id lists (a corpus script tokenizes its text with a
`tokenizer.json`, whose ids twell's tokenizer reproduces exactly: tests/model/tokenizer_parity.py).
`Loader` cuts the corpus into windows of seq_len + 1 tokens and serves them in an order fixed by
(seed, epoch): the micro-batch of (step, micro, rank) is a pure function of those numbers, so a
resumed run sees exactly the batches the uninterrupted run would have, and W ranks together see
what one rank with a W-times larger micro-batch sees.
"""
from __future__ import annotations

import hashlib
import json
import os
from typing import Iterable, Optional

import numpy as np

FORMAT = "twell-tokens-1"


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def write_corpus(out_dir: str, documents: Iterable[Iterable[int]], *, eos_id: int, vocab_size: int,
                 tokenizer: str = "", shard_tokens: int = 1 << 24) -> dict:
    """Writes documents (token-id sequences) as shards + manifest.json into out_dir (created; must
    not hold a manifest already). Each file is written to a temporary name and renamed."""
    os.makedirs(out_dir, exist_ok=True)
    if os.path.exists(os.path.join(out_dir, "manifest.json")):
        raise FileExistsError(f"{out_dir} already holds a corpus (manifest.json): refusing to overwrite it")
    if vocab_size > 2 ** 32:
        raise ValueError(f"vocab_size {vocab_size} does not fit uint32 token ids")
    shards, buf = [], []

    def flush():
        if not buf:
            return
        arr = np.concatenate(buf).astype(np.uint32)
        name = f"shard-{len(shards):05d}.npy"
        tmp = os.path.join(out_dir, f".{name}.tmp")
        with open(tmp, "wb") as f:
            np.save(f, arr)
        os.replace(tmp, os.path.join(out_dir, name))
        shards.append({"file": name, "tokens": int(arr.size), "sha256": sha256_file(os.path.join(out_dir, name))})
        buf.clear()

    held = 0
    for doc in documents:
        ids = np.fromiter(doc, dtype=np.int64)
        if ids.size and (ids.min() < 0 or ids.max() >= vocab_size):
            raise ValueError(f"a document holds token ids outside [0, {vocab_size})")
        buf.append(np.append(ids, eos_id))
        held += ids.size + 1
        if held >= shard_tokens:
            flush()
            held = 0
    flush()
    if not shards:
        raise ValueError("write_corpus: no documents")
    manifest = {"format": FORMAT, "tokenizer": tokenizer, "eos_id": eos_id, "vocab_size": vocab_size,
                "shards": shards}
    tmp = os.path.join(out_dir, ".manifest.json.tmp")
    with open(tmp, "w") as f:
        json.dump(manifest, f, indent=1)
    os.replace(tmp, os.path.join(out_dir, "manifest.json"))
    return manifest


class Loader:
    """Windows of seq_len + 1 tokens from a corpus directory, in a seeded order per epoch.

    batch(step, micro) -> int64 array [micro_batch, seq_len + 1] for this rank: the global sample
    index of row j is ((step · accum + micro) · world + rank) · micro_batch + j."""

    def __init__(self, corpus_dir: str, seq_len: int, micro_batch: int, *, accum: int = 1, rank: int = 0,
                 world: int = 1, seed: int = 0, verify: bool = True, vocab_size: Optional[int] = None):
        path = os.path.join(corpus_dir, "manifest.json")
        if not os.path.exists(path):
            raise FileNotFoundError(f"{corpus_dir}: no manifest.json (not a twell corpus; see twell.data.write_corpus)")
        with open(path) as f:
            m = json.load(f)
        if m.get("format") != FORMAT:
            raise ValueError(f"{path}: format {m.get('format')!r}, expected {FORMAT!r}")
        if vocab_size is not None and m["vocab_size"] > vocab_size:
            raise ValueError(f"{corpus_dir}: token ids up to {m['vocab_size'] - 1} do not fit the model's vocabulary of {vocab_size}")
        arrays = []
        for s in m["shards"]:
            f = os.path.join(corpus_dir, s["file"])
            if verify and sha256_file(f) != s["sha256"]:
                raise ValueError(f"{f}: sha256 differs from the manifest (corrupt or changed shard)")
            a = np.load(f, mmap_mode="r")
            if a.dtype != np.uint32 or a.ndim != 1 or a.size != s["tokens"]:
                raise ValueError(f"{f}: expected {s['tokens']} uint32 tokens, found {a.dtype} {a.shape}")
            arrays.append(a)
        self.tokens = np.concatenate(arrays) if len(arrays) > 1 else arrays[0]
        self.manifest = m
        self.seq_len, self.micro_batch, self.accum = seq_len, micro_batch, accum
        self.rank, self.world, self.seed = rank, world, seed
        self.windows = (self.tokens.size - 1) // seq_len
        if self.windows < 1:
            raise ValueError(f"{corpus_dir}: {self.tokens.size} tokens make no window of {seq_len + 1}")
        self._perm_epoch, self._perm = -1, None

    def _order(self, epoch: int) -> np.ndarray:
        if epoch != self._perm_epoch:
            self._perm = np.random.default_rng([self.seed, epoch]).permutation(self.windows)
            self._perm_epoch = epoch
        return self._perm

    def batch(self, step: int, micro: int = 0) -> np.ndarray:
        first = ((step * self.accum + micro) * self.world + self.rank) * self.micro_batch
        rows = []
        for i in range(first, first + self.micro_batch):
            w = int(self._order(i // self.windows)[i % self.windows])
            rows.append(np.asarray(self.tokens[w * self.seq_len: w * self.seq_len + self.seq_len + 1], dtype=np.int64))
        return np.stack(rows)
