"""lab/ab/ab_model_summary.py on synthetic `twell bench model` results: medians per side and per
FFN path, NEW / OLD, rows present on one side only left out, and no table from nothing."""
import json
import os

from bench_script import load_lab


def load():
    return load_lab("ab/ab_model_summary")


def write(folder, name, rows):
    with open(os.path.join(folder, name), "w") as f:
        json.dump({"rows": [{"phase": p, "batch": b, "dense_tokens_per_s": d, "sparse_tokens_per_s": s}
                            for p, b, d, s in rows]}, f)


def test_medians_and_ratios(tmp_path):
    s = load()
    d = str(tmp_path)
    # ABBA: old 400/500 and 380/480 and 390/470; new 420/530 twice and 1000/1000 once (an outlier the median drops).
    write(d, "r0.1-old-aaa.json", [("decode", 1, 400, 500), ("prefill", 1, 30000, 31000)])
    write(d, "r0.2-new-bbb.json", [("decode", 1, 420, 530), ("prefill", 1, 30000, 31000)])
    write(d, "r0.3-new-bbb.json", [("decode", 1, 1000, 1000), ("prefill", 1, 30000, 31000)])
    write(d, "r0.4-old-aaa.json", [("decode", 1, 380, 480), ("prefill", 1, 30000, 31000)])
    write(d, "r1.5-old-aaa.json", [("decode", 1, 390, 470), ("decode", 8, 1, 1)])
    write(d, "r1.6-new-bbb.json", [("decode", 1, 420, 530)])
    rows, names = s.load(d)
    assert names == {"old": "aaa", "new": "bbb"}
    md, out = s.table(rows, names)
    dec = next(r for r in out if r["phase"] == "decode" and r["batch"] == 1)
    assert dec["old"] == {"dense": 390, "sparse": 480}
    assert dec["new"] == {"dense": 420, "sparse": 530}
    assert abs(dec["sparse_new_over_old"] - 530 / 480) < 1e-12
    assert not any(r["batch"] == 8 for r in out)  # old side only
    assert "| decode | 1 | 3, 3 | 390 | 420 | 1.077× |" in md


def test_nothing_to_compare_is_an_error(tmp_path, capsys):
    s = load()
    write(str(tmp_path), "r0.1-old-aaa.json", [("decode", 1, 400, 500)])
    import sys
    argv = sys.argv
    try:
        sys.argv = ["ab_model_summary.py", str(tmp_path)]
        assert s.main() == 1
    finally:
        sys.argv = argv
    assert "no row with runs on both sides" in capsys.readouterr().err
