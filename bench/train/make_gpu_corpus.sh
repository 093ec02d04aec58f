#!/usr/bin/env bash
# Builds .carry/gpu-corpus.tar.xz, the corpus the GPU scripts carry (a device call takes 64 MiB):
# the first TOKENS (default 12 M) tokens of twell.corpus's train split, its val-heldout and val-wiki
# splits whole, and the SmolLM2 tokenizer files, as twell corpora under data/gpu-corpus/ there.
#   bash bench/train/make_gpu_corpus.sh [TOKENS [OUTPUT]]
# TOKENS "all": the whole train split (≈ 32.3 M tokens, ≈ 30 MB of xz); OUTPUT defaults to
# .carry/gpu-corpus.tar.xz (bench/train/gpu_run.sh reads GPU_CORPUS, that by default).
# Needs (and makes, when missing) assets/smollm2-135m-instruct (scripts/fetch-smollm2) and
# data/corpus (python -m twell.corpus: apt-get download + tokenizing, a few minutes on 2 cores).
# Deterministic: the same pinned sources give the same shards (their sha256 in each manifest).
set -euo pipefail
cd "$(dirname "$0")/../.."
TOKENS=${1:-12000000}
DEST=${2:-.carry/gpu-corpus.tar.xz}
TOK=assets/smollm2-135m-instruct
[ -f "$TOK/.complete" ] || bash scripts/fetch-smollm2
# twell.corpus and twell.data need neither the extension nor torch: import them without the
# package's __init__ (which loads both), so this runs before any build.
shim=$(mktemp -d)
trap 'rm -rf "$shim"' EXIT
mkdir -p "$shim/twell"
: > "$shim/twell/__init__.py"
cp python/twell/data.py python/twell/corpus.py "$shim/twell/"
if [ ! -f data/corpus/val-wiki/manifest.json ]; then
  PYTHONPATH=$shim python3 -m twell.corpus --tokenizer "$TOK/tokenizer.json" --out data/corpus
fi
stage=$(mktemp -d)
PYTHONPATH=$shim python3 - "$TOKENS" "$stage" <<'PY'
import json, os, shutil, sys
import numpy as np
from twell.data import Loader, write_corpus

stage = sys.argv[2]
src = Loader("data/corpus/train", 1, 1)
m = src.manifest
tokens = src.tokens.size if sys.argv[1] == "all" else int(sys.argv[1])
if src.tokens.size < tokens:
    sys.exit(f"make_gpu_corpus: the train split has {src.tokens.size} tokens, fewer than {tokens}")
# One document: the corpus's own end-of-text ids stay where they are inside it.
write_corpus(os.path.join(stage, "train"), [np.asarray(src.tokens[:tokens - 1])], eos_id=m["eos_id"],
             vocab_size=m["vocab_size"], tokenizer=m["tokenizer"])
for split in ("val-heldout", "val-wiki"):
    shutil.copytree(os.path.join("data/corpus", split), os.path.join(stage, split))
print(f"make_gpu_corpus: train {tokens} tokens, val-heldout and val-wiki whole", file=sys.stderr)
PY
for f in tokenizer.json tokenizer_config.json special_tokens_map.json generation_config.json; do
  [ -f "$TOK/$f" ] && cp "$TOK/$f" "$stage/train/"
done
mkdir -p .carry
tar cf - -C "$stage" train val-heldout val-wiki | xz -T2 -6 > "$DEST.tmp"
mv "$DEST.tmp" "$DEST"
rm -rf "$stage"
ls -l "$DEST"
