#!/usr/bin/env python3
"""The decode yardstick's tables, from one GPU call's torch.json (bench/model/torch_yardstick.py) and
twell.json (`twell bench model`), on the same checkpoint and GPU (bench/model/gpu_decode_yardstick.sh):

- per decode batch: PyTorch's best dense decode (the fastest of its rows at that batch: transformers
  compiled with CUDA graphs at batch 1, the lean body bench/model/fast_llama.py compiled alike at
  every batch), twell's dense and sparse FFN runtimes, and their ratios to it (issue 59's outcome:
  twell dense ≥ 1.0× and sparse ≥ 1.1× PyTorch at every batch);
- every decode row of every batch against that batch's best, and the prefill rows where both ran;
- per batch, the bandwidth each side reached on the bytes a step must read (twell's byte floor:
  PyTorch's and twell's dense step on the dense floor, twell's sparse step on the sparse one) beside
  the copy bandwidth twell measured in its process, so each number shows how far it is from the limit;
- per batch, issue 59's outcomes, each a number and whether it meets its target (OUTCOMES).

    python3 bench/model/yardstick_table.py OUT_DIR [PREFILL_BATCH PREFILL_LEN]

writes OUT_DIR/decode-yardstick.md and prints it; twell-own-attention.json (twell's prefill with its
own attention kernel) joins the prefill table where present.
"""
import json
import os
import re
import sys

DECODE = re.compile(r"^decode b(\d+) ")

# Issue 59's decode targets (H200): twell against the same call's PyTorch at every batch; sparse
# against its own dense against the byte ceiling (dense bytes / sparse bytes a step) from 2 rows on;
# at one row, the share of the copy bandwidth each path reaches on its own bytes.
OUTCOMES = {"dense_vs_pytorch": 1.0, "sparse_vs_pytorch": 1.1, "sparse_vs_dense": 1.0, "of_ceiling": 0.9,
            "b1_sparse_of_copy": 0.60, "b1_dense_of_copy": 0.65, "b1_sparse_vs_pytorch": 2.0}


def pytorch_decode(torch_json):
    """{batch: [(row name, tokens/s), ...]} of the decode rows that finished (errors left out)."""
    rows = {}
    for name, ph in (torch_json or {}).get("results", {}).items():
        m = DECODE.match(name)
        if m and isinstance(ph, dict) and "tokens_per_s" in ph:
            rows.setdefault(int(m.group(1)), []).append((name, float(ph["tokens_per_s"])))
    return rows


def twell_decode(twell_json):
    """{batch: (dense tokens/s, sparse tokens/s)} of twell bench model's decode rows."""
    out = {}
    for r in (twell_json or {}).get("rows", []):
        if r.get("phase") == "decode" and "dense_tokens_per_s" in r and "sparse_tokens_per_s" in r:
            out[int(r["batch"])] = (float(r["dense_tokens_per_s"]), float(r["sparse_tokens_per_s"]))
    return out


def sparse_never_ran(twell_json):
    """{batch: whether the sparse runtime's timed decode runs overlap the dense ones'} for the batches
    where that runtime ran no FFN row sparse (every layer dispatched dense: the same kernels on both
    sides, so their ratio is the runs' spread, not a sparse layer's loss)."""
    out = {}
    for r in (twell_json or {}).get("rows", []):
        path = r.get("sparse_runtime_path") or {}
        if r.get("phase") != "decode" or path.get("ffn_rows", 0) <= 0 or path.get("sparse_rows", 1) != 0:
            continue
        d, s = r.get("dense_s") or [], r.get("sparse_s") or []
        out[int(r["batch"])] = bool(d and s and min(s) <= max(d) and min(d) <= max(s))
    return out


def ratio(a, b):
    return f"{a / b:.2f}×" if a is not None and b else "—"


def num(v, digits=1):
    return "—" if v is None else f"{v:.{digits}f}"


def who(name, torch_json):
    return "lean body" if " fast " in name else f"transformers {(torch_json or {}).get('transformers', '')}".strip()


def decode_tables(torch_json, twell_json):
    """The summary table (one row a batch) and the detail table (every row against its batch's best)."""
    pt, tw = pytorch_decode(torch_json), twell_decode(twell_json)
    batches = sorted(set(pt) | set(tw))
    lines = ["| decode batch | PyTorch's best dense, tokens/s | twell dense | dense / PyTorch | twell sparse | "
             "sparse / PyTorch | sparse / dense |", "|---:|---|---:|---:|---:|---:|---:|"]
    detail = ["| decode batch | row | tokens/s | against PyTorch's best at that batch |", "|---:|---|---:|---:|"]
    for b in batches:
        best_name, best = max(pt.get(b, []), key=lambda r: r[1], default=(None, None))
        dense, sparse = tw.get(b, (None, None))
        best_text = f"{best:.1f} ({best_name}, {who(best_name, torch_json)})" if best_name else "— (not measured)"
        lines.append(f"| {b} | {best_text} | {num(dense)} | {ratio(dense, best)} | {num(sparse)} | {ratio(sparse, best)} | "
                     f"{ratio(sparse, dense)} |")
        for name, v in sorted(pt.get(b, []), key=lambda r: -r[1]):
            detail.append(f"| {b} | PyTorch ({who(name, torch_json)}) {name} | {v:.1f} | {ratio(v, best)} |")
        if dense is not None:
            detail.append(f"| {b} | twell, dense FFN (CUDA graphs) | {dense:.1f} | {ratio(dense, best)} |")
            detail.append(f"| {b} | twell, sparse FFN (CUDA graphs) | {sparse:.1f} | {ratio(sparse, best)} |")
    return lines, detail


def bandwidth_table(torch_json, twell_json):
    """TB/s on the byte floor of twell.json's decode_byte_floor (bytes a step × steps a second), one row
    a batch that has a floor; [] without one (an older twell.json)."""
    floors = {int(f["batch"]): f for f in (twell_json or {}).get("decode_byte_floor", []) if "batch" in f}
    if not floors:
        return []
    pt, tw = pytorch_decode(torch_json), twell_decode(twell_json)
    copy = (twell_json or {}).get("copy_bandwidth")

    def tbs(tokens_per_s, batch, nbytes):
        return None if tokens_per_s is None or not nbytes else tokens_per_s / batch * nbytes / 1e12

    def cell(v):
        return "—" if v is None else (f"{v:.2f} ({100 * v * 1e12 / copy:.0f} %)" if copy else f"{v:.2f}")

    lines = ["| decode batch | dense GB a step | sparse GB a step | PyTorch TB/s on the dense bytes (of copy) | "
             "twell dense, same | twell sparse, on the sparse bytes | copy TB/s (twell's process) |",
             "|---:|---:|---:|---:|---:|---:|---:|"]
    for b in sorted(floors):
        f = floors[b]
        dense_bytes, sparse_bytes = f.get("dense_bytes_per_step"), f.get("sparse_bytes_per_step")
        best = max((v for _, v in pt.get(b, [])), default=None)
        dense, sparse = tw.get(b, (None, None))
        lines.append(f"| {b} | {num(dense_bytes and dense_bytes / 1e9, 2)} | {num(sparse_bytes and sparse_bytes / 1e9, 2)} | "
                     f"{cell(tbs(best, b, dense_bytes))} | {cell(tbs(dense, b, dense_bytes))} | "
                     f"{cell(tbs(sparse, b, sparse_bytes))} | {num(copy and copy / 1e12, 2)} |")
    return lines


def outcomes_table(torch_json, twell_json):
    """Issue 59's outcomes a batch (OUTCOMES): each cell the measured value and "yes" or "no" against its
    target, or a dash where a side or the byte floor is missing. Where the sparse runtime ran no layer
    sparse, its sparse / dense cell says so (sparse_never_ran)."""
    pt, tw = pytorch_decode(torch_json), twell_decode(twell_json)
    all_dense = sparse_never_ran(twell_json)
    floors = {int(f["batch"]): f for f in (twell_json or {}).get("decode_byte_floor", []) if "batch" in f}
    copy = (twell_json or {}).get("copy_bandwidth")
    if not tw:
        return []
    o = OUTCOMES

    def verdict(v, target, text):
        return "—" if v is None else f"{text} {'yes' if v >= target else 'no'}"

    lines = [f"| decode batch | dense ≥ {o['dense_vs_pytorch']:.1f}× PyTorch | sparse ≥ {o['sparse_vs_pytorch']:.1f}× PyTorch | "
             f"sparse / dense ≥ {o['sparse_vs_dense']:.1f} | sparse / dense ≥ {o['of_ceiling']} × byte ceiling | "
             f"batch 1: sparse ≥ {100 * o['b1_sparse_of_copy']:.0f} %, dense ≥ {100 * o['b1_dense_of_copy']:.0f} % of copy; "
             f"sparse ≥ {o['b1_sparse_vs_pytorch']:.0f}× PyTorch |", "|---:|---|---|---|---|---|"]
    for b in sorted(tw):
        dense, sparse = tw[b]
        best = max((v for _, v in pt.get(b, [])), default=None)
        f = floors.get(b, {})
        ceiling = f.get("ceiling_ratio")
        if ceiling is None and f.get("dense_bytes_per_step") and f.get("sparse_bytes_per_step"):
            ceiling = f["dense_bytes_per_step"] / f["sparse_bytes_per_step"]
        sd = sparse / dense if dense else None
        cells = [verdict(best and dense / best, o["dense_vs_pytorch"], f"{dense / best:.2f}×" if best else ""),
                 verdict(best and sparse / best, o["sparse_vs_pytorch"], f"{sparse / best:.2f}×" if best else ""),
                 verdict(sd, o["sparse_vs_dense"], f"{sd:.3f}" if sd else "")]
        if b in all_dense and sd:  # no layer ran sparse: say so, and whether the runs' times overlap
            cells[2] += " (no layer sparse; " + ("within" if all_dense[b] else "outside") + " the runs' spread)"
        if b > 1 and ceiling and sd:
            need = o["of_ceiling"] * ceiling
            cells.append(f"{sd:.2f} of {need:.2f} needed {'yes' if sd >= need else 'no'}")
        else:
            cells.append("—")
        if b == 1 and copy and f.get("dense_bytes_per_step") and f.get("sparse_bytes_per_step"):
            s_share = sparse * f["sparse_bytes_per_step"] / copy
            d_share = dense * f["dense_bytes_per_step"] / copy
            ok = s_share >= o["b1_sparse_of_copy"] and d_share >= o["b1_dense_of_copy"]
            vs = f"; {sparse / best:.2f}× {'yes' if sparse / best >= o['b1_sparse_vs_pytorch'] else 'no'}" if best else "; —"
            cells.append(f"{100 * s_share:.0f} % / {100 * d_share:.0f} % {'yes' if ok else 'no'}{vs}")
        else:
            cells.append("—")
        lines.append(f"| {b} | " + " | ".join(cells) + " |")
    return lines


def prefill_table(torch_json, twell_runs, pb, pl):
    """Prefill rows: PyTorch's (eager, compiled, the lean body) and twell's dense and sparse FFN with
    each attention it ran (twell_runs: [(twell.json, attention label or None for its own record)])."""
    pre = []
    for name, ph in (torch_json or {}).get("results", {}).items():
        if name.startswith("prefill") and isinstance(ph, dict) and "tokens_per_s" in ph:
            label = " (lean Llama body, bench/model/fast_llama.py)" if " fast " in name else ""
            pre.append((f"PyTorch{label} {name}", float(ph["tokens_per_s"])))
    for w, label in twell_runs:
        att = label or w.get("prefill_attention", "?")
        for r in w.get("rows", []):
            if r.get("phase") == "prefill" and r.get("batch", 0) > 1:
                pre.append((f"twell, dense FFN ({att})", float(r["dense_tokens_per_s"])))
                pre.append((f"twell, sparse FFN ({att})", float(r["sparse_tokens_per_s"])))
    if not pre:
        return []
    best = max((v for n, v in pre if n.startswith("PyTorch")), default=None)
    lines = [f"| prefill, {pb} × {pl} | tokens/s | against PyTorch's best |", "|---|---:|---:|"]
    lines += [f"| {n} | {v:.0f} | {ratio(v, best)} |" for n, v in pre]
    return lines


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        print(f"{os.path.basename(path)}: {e}", file=sys.stderr)
        return None


def main(argv):
    if len(argv) not in (2, 4):
        print(__doc__, file=sys.stderr)
        return 2
    out = argv[1]
    pb, pl = (argv[2], argv[3]) if len(argv) == 4 else ("?", "?")
    t, w = load(os.path.join(out, "torch.json")), load(os.path.join(out, "twell.json"))
    summary, detail = decode_tables(t, w)
    runs = [(w, None)] if w else []
    own = load(os.path.join(out, "twell-own-attention.json")) if os.path.exists(os.path.join(out, "twell-own-attention.json")) else None
    if own:
        runs.append((own, "twell's own attention kernel"))
    pre = prefill_table(t, runs, pb, pl)
    bw = bandwidth_table(t, w)
    oc = outcomes_table(t, w)
    text = "\n".join(summary + [""] + detail + ([""] + bw if bw else []) + ([""] + oc if oc else []) +
                     ([""] + pre if pre else [])) + "\n"
    with open(os.path.join(out, "decode-yardstick.md"), "w") as f:
        f.write(text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
