#!/usr/bin/env python3
"""Trims a byte-level BPE tokenizer.json to its first VOCAB ids, for serving synthetic checkpoints.

    python3 bench/serve/trim_tokenizer.py SRC/tokenizer.json VOCAB OUT_DIR

`twell gen model` writes weights and config.json only; `twell serve` needs a tokenizer whose ids all
fit the model's vocabulary (it refuses a larger one). A BPE vocabulary built by merging assigns ids in
merge order, so its first VOCAB ids are closed under the merges that produce them: keeping the ids below
VOCAB and the merges whose parts and result all stay gives a tokenizer that encodes any text into ids
below VOCAB (bytes are the first ids, so nothing becomes unknown). The script checks that property
instead of assuming it and refuses a tokenizer that breaks it. Writes OUT_DIR/tokenizer.json and,
beside a source tokenizer_config.json, a copy of it with added tokens at ids ≥ VOCAB removed.
"""
import json
import os
import sys


def merge_parts(m):
    return tuple(m) if isinstance(m, list) else tuple(m.split(" ", 1))


def trim(tok, vocab):
    model = tok.get("model") or {}
    if model.get("type") != "BPE":
        raise SystemExit(f"trim_tokenizer: only BPE tokenizers are trimmed, this one is {model.get('type')!r}")
    ids = model["vocab"]
    if vocab > len(ids):
        raise SystemExit(f"trim_tokenizer: the tokenizer has {len(ids)} ids, fewer than {vocab}")
    kept = {t: i for t, i in ids.items() if i < vocab}
    merges = []
    for m in model.get("merges", []):
        a, b = merge_parts(m)
        if a in kept and b in kept and (a + b) in kept:
            merges.append(m)
        elif (a + b) in kept:
            raise SystemExit(f"trim_tokenizer: merge {a!r} + {b!r} makes a kept id from a dropped part")
    made = {"".join(merge_parts(m)) for m in merges}
    added = {a["content"] for a in tok.get("added_tokens", [])}
    unreachable = [t for t, i in kept.items() if len(t) > 1 and t not in made and t not in added]
    if len(unreachable) > 16:  # a few multi-character base tokens are normal; many mean ids are not in merge order
        raise SystemExit(f"trim_tokenizer: {len(unreachable)} kept ids are made by no kept merge: not merge-ordered")
    model["vocab"] = kept
    model["merges"] = merges
    tok["added_tokens"] = [a for a in tok.get("added_tokens", []) if a["id"] < vocab]
    return tok


def main():
    if len(sys.argv) != 4 or sys.argv[1] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if len(sys.argv) == 2 else 2
    src, vocab, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    tok = trim(json.load(open(src, encoding="utf-8")), vocab)
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tok, f, ensure_ascii=False)
    cfg = os.path.join(os.path.dirname(src), "tokenizer_config.json")
    if os.path.exists(cfg):
        c = json.load(open(cfg, encoding="utf-8"))
        dec = c.get("added_tokens_decoder")
        if isinstance(dec, dict):
            c["added_tokens_decoder"] = {k: v for k, v in dec.items() if int(k) < vocab}
        with open(os.path.join(out, "tokenizer_config.json"), "w", encoding="utf-8") as f:
            json.dump(c, f, ensure_ascii=False, indent=1)
    print(f"trim_tokenizer: {len(tok['model']['vocab'])} ids, {len(tok['model']['merges'])} merges -> {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
