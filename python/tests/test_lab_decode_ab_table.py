"""lab/ab/decode_ab_table.py on hand-made `twell bench model` results: rounds from two device
calls (two ROWS files, relative paths) in one table, medians and spreads per build and batch, the
ratio to the first build, a missing run reported and skipped, and no table from nothing."""
import json
import os

import pytest

from bench_script import load_lab


def write_run(folder, name, rows):
    with open(os.path.join(folder, name), "w") as f:
        json.dump({"rows": [{"phase": "decode", "batch": b, "dense_tokens_per_s": d, "sparse_tokens_per_s": s,
                             "sparse_runtime_path": {"ffn_rows": 38, "sparse_rows": 19}}
                            for b, d, s in rows] + [{"phase": "prefill", "batch": 1, "dense_tokens_per_s": 1,
                                                     "sparse_tokens_per_s": 1}]}, f)


def test_two_calls_make_one_table(tmp_path, capsys):
    t = load_lab("ab/decode_ab_table")
    one, two = tmp_path / "ab1", tmp_path / "ab2"
    one.mkdir()
    two.mkdir()
    write_run(one, "ab-base-1.json", [(1, 660, 840), (8, 3550, 3880)])
    write_run(one, "ab-new-1.json", [(1, 664, 860), (8, 3560, 3950)])
    write_run(two, "ab-base-2.json", [(1, 657, 846), (8, 3530, 3910)])
    write_run(two, "ab-new-2.json", [(1, 670, 870), (8, 3580, 3960)])
    (one / "rows.txt").write_text("base|1|ab-base-1.json\nnew|1|ab-new-1.json\n")
    (two / "rows.txt").write_text("base|2|ab-base-2.json\nnew|2|ab-new-2.json\nnew|3|ab-missing-3.json\n\n")
    out = tmp_path / "decode-ab.md"
    t.main([str(out), str(one / "rows.txt"), str(two / "rows.txt")])
    md = out.read_text()
    assert "ab-missing-3.json" in capsys.readouterr().out            # reported, then skipped
    assert "| base | 2 | 1 | 657 | 846 | 1.288× | 50.0 % |" in md        # round 2 from the second call
    assert "| base | 1 | 658 | 843 | 840–846 | 1.280× | 1.000× |" in md  # medians over both calls
    assert "| new | 1 | 667 | 865 | 860–870 | 1.297× | 1.026× |" in md
    assert "| new | 8 | 3570 | 3955 | 3950–3960 | 1.108× | 1.015× |" in md
    runs = [l for l in md.splitlines() if l.startswith("| base | 1 |") or l.startswith("| new | 1 |")]
    assert runs[0].startswith("| base | 1 | 1 |") and runs[1].startswith("| base | 1 | 8 |")  # round 1 first


def test_no_runs_is_an_error(tmp_path):
    t = load_lab("ab/decode_ab_table")
    (tmp_path / "rows.txt").write_text("base|1|nothing.json\n")
    with pytest.raises(SystemExit):
        t.main([str(tmp_path / "out.md"), str(tmp_path / "rows.txt")])
    with pytest.raises(SystemExit):
        t.main([str(tmp_path / "out.md")])
