"""bench/model/yardstick_table.py: the decode yardstick's tables from a torch.json and a twell.json of
one call. Per batch, PyTorch's best is the fastest finished decode row of that batch (failed rows and
other batches' rows never count), and twell's dense and sparse rows are divided by it; a batch one
side did not measure shows a dash, not a ratio."""
import json

from bench_script import load_bench


def torch_json():
    return {"transformers": "5.0", "results": {
        "decode b1 eager": {"tokens_per_s": 100.0},
        "decode b1 compile+graphs": {"tokens_per_s": 400.0},
        "decode b1 fast compile+graphs": {"tokens_per_s": 500.0},
        "decode b1 fast compile+graphs math attention": {"error": "RuntimeError: boom"},
        "decode b8 fast compile+graphs": {"tokens_per_s": 3000.0},
        "decode b8 fast compile+graphs math attention": {"tokens_per_s": 3200.0},
        "decode b64 fast compile+graphs": {"tokens_per_s": 12000.0},
        "prefill eager": {"tokens_per_s": 90000.0},
        "prefill fast compile": {"tokens_per_s": 150000.0},
    }}


def twell_json():
    return {"prefill_attention": "cuDNN SDPA", "rows": [
        {"phase": "prefill", "batch": 8, "dense_tokens_per_s": 148000.0, "sparse_tokens_per_s": 172000.0},
        {"phase": "decode", "batch": 1, "dense_tokens_per_s": 533.0, "sparse_tokens_per_s": 776.0},
        {"phase": "decode", "batch": 8, "dense_tokens_per_s": 3371.0, "sparse_tokens_per_s": 3584.0},
        {"phase": "decode", "batch": 32, "dense_tokens_per_s": 9000.0, "sparse_tokens_per_s": 9100.0},
    ]}


def test_best_per_batch_and_ratios():
    yt = load_bench("model/yardstick_table")
    pt = yt.pytorch_decode(torch_json())
    assert sorted(pt) == [1, 8, 64]
    assert ("decode b1 fast compile+graphs math attention", 0) not in [(n, 0) for n, _ in pt[1]]  # the failed row
    assert len(pt[1]) == 3
    summary, detail = yt.decode_tables(torch_json(), twell_json())
    rows = {int(line.split("|")[1]): line for line in summary[2:]}
    assert sorted(rows) == [1, 8, 32, 64]
    # Batch 1: the lean body's 500 is the best; 533 / 500 and 776 / 500.
    assert "500.0 (decode b1 fast compile+graphs, lean body)" in rows[1]
    assert "| 1.07× |" in rows[1] and "| 1.55× |" in rows[1] and "| 1.46× |" in rows[1]
    # Batch 8: the math-attention row (3200) beats sdpa's 3000.
    assert "3200.0 (decode b8 fast compile+graphs math attention" in rows[8]
    assert f"| {3371 / 3200:.2f}× |" in rows[8] and f"| {3584 / 3200:.2f}× |" in rows[8]
    # Batch 32: twell only; batch 64: PyTorch only. Dashes, no invented ratio.
    assert "— (not measured)" in rows[32] and rows[32].count("—") == 3
    assert "| — | — | — | — | — |" in rows[64]
    # The detail table: every finished row of a batch, best first, against that batch's best.
    b1 = [line for line in detail[2:] if line.startswith("| 1 |")]
    assert [line.split("|")[3].strip() for line in b1] == ["500.0", "400.0", "100.0", "533.0", "776.0"]
    assert "| 0.20× |" in b1[2]


def test_bandwidth_on_the_byte_floor():
    yt = load_bench("model/yardstick_table")
    w = twell_json()
    w["copy_bandwidth"] = 4.0e12
    w["decode_byte_floor"] = [{"batch": 1, "dense_bytes_per_step": 4.0e9, "sparse_bytes_per_step": 2.0e9},
                              {"batch": 8, "dense_bytes_per_step": 5.0e9, "sparse_bytes_per_step": 3.0e9}]
    lines = yt.bandwidth_table(torch_json(), w)
    rows = {int(line.split("|")[1]): [c.strip() for c in line.split("|")[2:-1]] for line in lines[2:]}
    assert sorted(rows) == [1, 8]  # the batches with a floor; 32 and 64 have none
    # Batch 1: PyTorch's best 500 steps/s × 4 GB = 2.00 TB/s (50 % of 4); twell dense 533 × 4 GB,
    # sparse 776 × 2 GB on its own floor.
    assert rows[1] == ["4.00", "2.00", "2.00 (50 %)", "2.13 (53 %)", "1.55 (39 %)", "4.00"]
    # Batch 8: 3200 / 8 steps/s × 5 GB = 2.00 TB/s; twell 3371 / 8 × 5 GB, 3584 / 8 × 3 GB.
    assert rows[8][2:5] == ["2.00 (50 %)", f"{3371 / 8 * 5e9 / 1e12:.2f} ({100 * 3371 / 8 * 5e9 / 4e12:.0f} %)",
                            f"{3584 / 8 * 3e9 / 1e12:.2f} ({100 * 3584 / 8 * 3e9 / 4e12:.0f} %)"]
    assert yt.bandwidth_table(torch_json(), twell_json()) == []  # no floor in an older twell.json


def test_prefill_table_and_main_write_the_file(tmp_path):
    yt = load_bench("model/yardstick_table")
    (tmp_path / "torch.json").write_text(json.dumps(torch_json()))
    (tmp_path / "twell.json").write_text(json.dumps(twell_json()))
    own = {"rows": [{"phase": "prefill", "batch": 8, "dense_tokens_per_s": 60000.0, "sparse_tokens_per_s": 70000.0}]}
    (tmp_path / "twell-own-attention.json").write_text(json.dumps(own))
    assert yt.main(["yardstick_table.py", str(tmp_path), "8", "512"]) == 0
    text = (tmp_path / "decode-yardstick.md").read_text()
    assert "| prefill, 8 × 512 | tokens/s | against PyTorch's best |" in text
    assert f"| twell, sparse FFN (cuDNN SDPA) | 172000 | {172000 / 150000:.2f}× |" in text
    assert "| twell, dense FFN (twell's own attention kernel) | 60000 | 0.40× |" in text


def test_missing_files_give_empty_tables_not_a_crash(tmp_path):
    yt = load_bench("model/yardstick_table")
    assert yt.main(["yardstick_table.py", str(tmp_path)]) == 0
    text = (tmp_path / "decode-yardstick.md").read_text()
    assert text.splitlines()[0].startswith("| decode batch |")
    assert len([line for line in text.splitlines() if line.startswith("|")]) == 4  # two headers, two separators, no rows
    assert yt.main(["yardstick_table.py"]) == 2


def test_outcomes_against_issue_59s_targets():
    """Each cell is the value and yes / no against its target: PyTorch ratios at every batch, sparse /
    dense ≥ 1.0, ≥ 0.9 × the byte ceiling from 2 rows on, and at one row the copy-bandwidth shares and
    2× PyTorch. A missing side or floor gives a dash."""
    yt = load_bench("model/yardstick_table")
    w = twell_json()
    w["copy_bandwidth"] = 4.0e12
    w["decode_byte_floor"] = [{"batch": 1, "dense_bytes_per_step": 4.0e9, "sparse_bytes_per_step": 2.0e9},
                              {"batch": 8, "dense_bytes_per_step": 5.0e9, "sparse_bytes_per_step": 3.0e9,
                               "ceiling_ratio": 5.0 / 3.0}]
    lines = yt.outcomes_table(torch_json(), w)
    rows = {int(line.split("|")[1]): [c.strip() for c in line.split("|")[2:-1]] for line in lines[2:]}
    assert sorted(rows) == [1, 8, 32]  # twell's batches; 64 is PyTorch's alone
    # Batch 1: 533 / 500 = 1.07 ≥ 1.0, 776 / 500 = 1.55 ≥ 1.1; sparse / dense 1.456; shares 776 × 2 GB / 4 TB/s
    # = 39 % (< 60) and 533 × 4 GB / 4 TB/s = 53 % (< 65); 1.55× < 2×.
    assert rows[1] == ["1.07× yes", "1.55× yes", f"{776 / 533:.3f} yes", "—", "39 % / 53 % no; 1.55× no"]
    # Batch 8: against the math-attention row's 3200; 3584 / 3371 = 1.063 against 0.9 × 5/3 = 1.50 needed.
    assert rows[8][:2] == [f"{3371 / 3200:.2f}× yes", f"{3584 / 3200:.2f}× yes"]  # 1.05 ≥ 1.0, 1.12 ≥ 1.1
    assert rows[8][3] == f"{3584 / 3371:.2f} of 1.50 needed no" and rows[8][4] == "—"
    # Batch 32: no PyTorch row and no floor: dashes; sparse / dense still judged.
    assert rows[32] == ["—", "—", f"{9100 / 9000:.3f} yes", "—", "—"]
    # The ceiling from the floor's bytes when the JSON has no ceiling_ratio (an older twell.json).
    del w["decode_byte_floor"][1]["ceiling_ratio"]
    again = {int(line.split("|")[1]): line for line in yt.outcomes_table(torch_json(), w)[2:]}
    assert "of 1.50 needed no" in again[8]
    assert yt.outcomes_table(torch_json(), {}) == []  # no twell rows: no table


def test_outcomes_say_when_no_layer_ran_sparse():
    """Where the sparse runtime dispatched every layer dense (sparse_rows 0), its sparse / dense cell
    says so and whether the two sides' timed runs overlap (then the ratio is the runs' spread); a
    batch with sparse rows, or an older twell.json without the path, keeps the plain cell."""
    yt = load_bench("model/yardstick_table")
    w = {"rows": [
        {"phase": "decode", "batch": 8, "dense_tokens_per_s": 3371.0, "sparse_tokens_per_s": 3584.0,
         "sparse_runtime_path": {"ffn_rows": 1000, "sparse_rows": 1000}, "dense_s": [1.0], "sparse_s": [0.9]},
        {"phase": "decode", "batch": 32, "dense_tokens_per_s": 9000.0, "sparse_tokens_per_s": 8800.0,
         "sparse_runtime_path": {"ffn_rows": 1000, "sparse_rows": 0}, "dense_s": [0.640, 0.650], "sparse_s": [0.700, 0.710]},
        {"phase": "decode", "batch": 64, "dense_tokens_per_s": 12756.0, "sparse_tokens_per_s": 12734.0,
         "sparse_runtime_path": {"ffn_rows": 1000, "sparse_rows": 0}, "dense_s": [0.6417, 0.6428], "sparse_s": [0.6417, 0.6440]},
    ]}
    assert yt.sparse_never_ran(w) == {32: False, 64: True}
    rows = {int(line.split("|")[1]): [c.strip() for c in line.split("|")[2:-1]] for line in yt.outcomes_table(torch_json(), w)[2:]}
    assert rows[8][2] == f"{3584 / 3371:.3f} yes"
    assert rows[32][2] == f"{8800 / 9000:.3f} no (no layer sparse; outside the runs' spread)"
    assert rows[64][2] == f"{12734 / 12756:.3f} no (no layer sparse; within the runs' spread)"
    assert yt.sparse_never_ran(twell_json()) == {}  # rows without the path: nothing claimed
