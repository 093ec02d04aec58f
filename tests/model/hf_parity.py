#!/usr/bin/env python3
"""twell's runtimes against Hugging Face transformers (the GPU machine has torch + transformers).

    python3 tests/model/hf_parity.py MODEL_LOGITS_TOOL [MODEL_DIR ...]

For each checkpoint (default: the SmolLM2 assets and two tiny ReLU models made here, one with
sparse activations), a few token sequences run through transformers' LlamaForCausalLM in float32
and through twell's CPU runtime (fp32) and CUDA runtime (bf16), every position's logits compared
(max |a - b| / max |b|), and greedy continuations compared. Prints a table; exit 1 if a bound fails.

Bounds: CPU dense FFN path 1e-3 (fp32 against fp32: transformers computes RoPE and RMSNorm in fp32
too; float64 vs transformers fp32 on SmolLM2 differ by 8.6e-5); CPU automatic 1e-2 (a ReLU layer's
first call runs the TwELL path, which holds gate values as bf16: 2^-9 relative each); CUDA 6e-2 (bf16 weights,
activations and KV cache against fp32, over up to 30 layers: each bf16 rounding is 2^-9 relative
and they compound; a wrong position, head or index gives O(1)).
Exit 77 when torch/transformers/CUDA are missing.
"""
import os
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM
except ImportError as e:
    print(f"skipped: {e}")
    sys.exit(77)
if not torch.cuda.is_available():
    print("skipped: no CUDA device")
    sys.exit(77)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools", "convert"))
import safetensors_np as stnp  # noqa: E402
import tiny_llama  # noqa: E402

TOOL = sys.argv[1]
TOL = {"cpu-dense": 1e-3, "cpu-auto": 1e-2, "cuda-auto": 6e-2}


def twell_logits(model_dir, seqs, device, mode, greedy_n):
    with tempfile.TemporaryDirectory() as td:
        out = os.path.join(td, "o.safetensors")
        ids = ";".join(",".join(map(str, s)) for s in seqs)
        r = subprocess.run([TOOL, model_dir, ids, out, mode, "0", "-", str(greedy_n), device], capture_output=True, text=True)
        if r.returncode:
            raise SystemExit(f"model_logits ({device}) failed: {r.stderr}")
        return stnp.load_file(out)


def hf_run(model_dir, seqs, greedy_n):
    m = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32).cuda().eval()
    logits, gen, scores = [], [], []
    with torch.no_grad():
        for s in seqs:
            ids = torch.tensor([s], device="cuda")
            logits.append(m(ids).logits[0].double().cpu().numpy())
            out = m.generate(ids, max_new_tokens=greedy_n, do_sample=False, min_new_tokens=greedy_n,
                             pad_token_id=0, eos_token_id=None, output_scores=True, return_dict_in_generate=True)
            gen.append(out.sequences[0, len(s):].tolist())
            scores.append(torch.stack(out.scores)[:, 0].double().cpu().numpy())  # [greedy_n, vocab]
    return logits, gen, scores


def greedy_note(got, ref, score):
    """'=' when the greedy tokens agree; else where they first differ and by how much transformers'
    own logits there prefer its token to twell's, as a share of their largest magnitude (a small
    share is a near-tie, which the logits' bound allows to fall either way)."""
    if list(got) == list(ref):
        return "="
    k = next(i for i in range(len(ref)) if got[i] != ref[i])
    gap = (score[k][ref[k]] - score[k][got[k]]) / np.max(np.abs(score[k]))
    return f"differs at {k} (gap {gap:.1e})"


def main():
    dirs = sys.argv[2:]
    td = tempfile.mkdtemp()
    if not dirs:
        smol = os.path.join(ROOT, "assets", "smollm2-135m-instruct")
        if os.path.exists(os.path.join(smol, ".complete")):
            dirs.append(smol)
        for name, kw in [("tiny-relu", dict(act="relu", layers=3, dtype="bf16")),
                         ("tiny-relu-sparse", dict(act="relu", layers=3, intermediate=1100, dtype="bf16",
                                                   sparse_bias=True, density=0.02))]:
            d = os.path.join(td, name)
            tiny_llama.make_model(d, seed=7, quiet=True, **kw)
            dirs.append(d)
    rng = np.random.default_rng(1)
    fails = 0
    print(f"{'model':28s} {'runtime':8s} {'max rel err':>12s} {'bound':>8s}  greedy (16 tokens, per sequence)")
    for d in dirs:
        import json
        vocab = json.load(open(os.path.join(d, "config.json")))["vocab_size"]
        seqs = [list(map(int, rng.integers(3, vocab, size=n))) for n in (5, 37)]
        ref, ref_gen, ref_scores = hf_run(d, seqs, 16)
        for dev in TOL:
            got = twell_logits(d, seqs, dev.split("-")[0], dev.split("-")[1], 16)
            err = max(float(np.max(np.abs(got[f"logits_{i}"] - ref[i])) / np.max(np.abs(ref[i]))) for i in range(len(seqs)))
            same = [greedy_note(got[f"greedy_{i}"], ref_gen[i], ref_scores[i]) for i in range(len(seqs))]
            ok = err <= TOL[dev]
            fails += not ok
            print(f"{os.path.basename(d):28s} {dev:8s} {err:12.2e} {TOL[dev]:8.0e}  {', '.join(same)}  {'ok' if ok else 'FAIL'}")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
