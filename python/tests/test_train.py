"""twell.train and twell.data on a tiny model and a synthetic corpus (CPU): the loss falls; the L1
term and the telemetry equal a hand computation; save → resume gives the uninterrupted run's next
steps exactly; re-initialisation touches exactly the dead gate rows; a half-written checkpoint never
replaces a good one; bad configs and data get clear errors."""
import json
import os
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from twell import data, train  # noqa: E402


def corpus(tmp_path, name="c", docs=200, vocab=64, seed=0):
    """A learnable corpus: documents of a noisy periodic pattern (token t+1 follows t mod 17 mostly)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(docs):
        start, n = rng.integers(1, vocab), rng.integers(20, 60)
        seq = [(start + i) % 17 + 1 if rng.random() > 0.1 else int(rng.integers(1, vocab)) for i in range(n)]
        out.append(seq)
    d = str(tmp_path / name)
    data.write_corpus(d, out, eos_id=0, vocab_size=vocab, shard_tokens=3000)
    return d


def config(tmp_path, **kw):
    c = {"model": {"preset": "tiny"}, "train_data": corpus(tmp_path), "seq_len": 32, "micro_batch": 4,
         "steps": 30, "lr": 3e-3, "warmup": 3}
    c.update(kw)
    return train.load_config(c)


def records(out):
    with open(os.path.join(out, "telemetry.jsonl")) as f:
        return [json.loads(line) for line in f]


def test_loader_is_deterministic_and_splits_over_ranks(tmp_path):
    d = corpus(tmp_path)
    one = data.Loader(d, 16, 8, seed=3)
    two = [data.Loader(d, 16, 4, rank=r, world=2, seed=3) for r in range(2)]
    assert len(one.manifest["shards"]) > 1
    for step in range(5):
        a = one.batch(step)
        assert np.array_equal(a, np.concatenate([two[0].batch(step), two[1].batch(step)]))
        assert np.array_equal(a, data.Loader(d, 16, 8, seed=3).batch(step))
    with pytest.raises(FileExistsError):
        data.write_corpus(d, [[1, 2]], eos_id=0, vocab_size=64)
    shard = os.path.join(d, "shard-00000.npy")
    with open(shard, "r+b") as f:
        f.seek(200)
        f.write(b"\x07")
    with pytest.raises(ValueError, match="sha256"):
        data.Loader(d, 16, 8)


@pytest.mark.parametrize("ffn", ["twell", "dense"])
def test_loss_falls_and_l1_is_the_hand_computed_value(tmp_path, ffn):
    cfg = config(tmp_path, ffn=ffn, l1_coeff=1e-3)
    out = str(tmp_path / f"run-{ffn}")
    train.train(cfg, out, progress=False)
    r = records(out)
    assert len(r) == 30
    assert np.mean([x["loss"] for x in r[-5:]]) < 0.8 * np.mean([x["loss"] for x in r[:5]])
    # L1 and non-zeros of the final weights on step 30's batch, by hand (dense formula, float64).
    import transformers

    model = transformers.LlamaForCausalLM.from_pretrained(os.path.join(out, "checkpoint-30")).double()
    hs = []
    for layer in model.model.layers:
        layer.mlp.down_proj.register_forward_pre_hook(lambda m, a: hs.append(a[0].reshape(-1, a[0].shape[-1])))
    ids = torch.from_numpy(data.Loader(cfg["train_data"], 32, 4, seed=0).batch(30))
    rec = train.train(cfg | {"steps": 31}, out, resume=True, progress=False)
    model(input_ids=ids[:, :-1])
    l1 = sum(h.abs().sum().item() / h.shape[0] for h in hs)
    assert rec["l1"] == pytest.approx(l1, rel=1e-4)
    for got, h in zip(rec["nnz_per_token"], hs):
        assert got == pytest.approx((h != 0).sum().item() / h.shape[0], rel=1e-6)


def test_resume_continues_bit_for_bit(tmp_path):
    cfg = config(tmp_path, steps=8, save_every=4, l1_coeff=1e-3, reinit_window=256)
    full, cut = str(tmp_path / "full"), str(tmp_path / "cut")
    train.train(cfg, full, progress=False)
    train.train(cfg, cut, progress=False, stop_after=4)
    assert open(os.path.join(cut, "latest")).read().strip() == "checkpoint-4"
    with pytest.raises(FileExistsError, match="--resume"):
        train.train(cfg, cut, progress=False)
    train.train(cfg, cut, resume=True, progress=False)
    a, b = records(full), records(cut)
    assert [x["step"] for x in b] == list(range(1, 9))
    for x, y in zip(a, b):
        assert x["loss"] == y["loss"] and x["l1"] == y["l1"] and x["reinit"] == y["reinit"]


def test_reinit_touches_exactly_the_dead_rows(tmp_path):
    cfg = config(tmp_path, steps=1)
    model = train.build_model(cfg, 64)
    w = model.model.layers[0].mlp.gate_proj.weight
    opt = torch.optim.AdamW(model.parameters())
    w.grad = torch.ones_like(w)
    opt.step()
    before, m_before = w.detach().clone(), opt.state[w]["exp_avg"].clone()
    rows = torch.tensor([3, 17, 100])
    assert train.reinit_gate_rows(w, rows, 0.02, opt) == 3
    changed = (w.detach() != before).any(1).nonzero().flatten()
    assert torch.equal(changed, rows)
    assert (opt.state[w]["exp_avg"][rows] == 0).all()
    keep = torch.ones(w.shape[0], dtype=torch.bool)
    keep[rows] = False
    assert torch.equal(opt.state[w]["exp_avg"][keep], m_before[keep])


def test_reinit_in_training_counts_and_resets(tmp_path):
    cfg = config(tmp_path, steps=6, reinit_window=128, l1_coeff=0.5)  # one step = 128 tokens
    out = str(tmp_path / "re")
    train.train(cfg, out, progress=False)
    r = records(out)
    # A neuron silent for a whole step is re-initialised at once (window = one step's tokens), so
    # none stays silent long enough (dead_window = 4096 tokens) to count as dead.
    assert sum(sum(x["reinit"]) for x in r) > 0
    assert all(d == 0 for x in r for d in x["dead"])
    plain = str(tmp_path / "plain")
    train.train(cfg | {"reinit_window": 0, "dead_window": 256}, plain, progress=False)
    assert sum(records(plain)[-1]["dead"]) > 0  # without re-init the same run has dead neurons


def test_half_written_checkpoint_never_replaces_a_good_one(tmp_path, monkeypatch):
    cfg = config(tmp_path, steps=4, save_every=2)
    out = str(tmp_path / "crash")
    train.train(cfg, out, progress=False, stop_after=2)
    good = os.path.join(out, "checkpoint-2")
    assert os.path.exists(os.path.join(good, "trainer_state.pt"))

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", boom)
    with pytest.raises(OSError, match="disk full"):
        train.train(cfg, out, resume=True, progress=False)
    assert open(os.path.join(out, "latest")).read().strip() == "checkpoint-2"
    assert os.path.exists(os.path.join(good, "trainer_state.pt")) and not os.path.exists(os.path.join(out, "checkpoint-4"))


def test_l1_ramps_up_over_l1_warmup_steps(tmp_path):
    cfg = config(tmp_path, steps=6, l1_coeff=2e-3, l1_warmup=4)
    assert [train.l1_at(cfg, s) for s in range(6)] == pytest.approx([5e-4, 1e-3, 1.5e-3, 2e-3, 2e-3, 2e-3])
    flat_cfg = train.load_config({**cfg, "l1_warmup": 0})
    assert train.l1_at(flat_cfg, 0) == 2e-3  # no ramp by default
    out = str(tmp_path / "ramp")
    train.train(cfg, out, progress=False)
    assert [x["l1_coeff"] for x in records(out)] == pytest.approx([5e-4, 1e-3, 1.5e-3, 2e-3, 2e-3, 2e-3])
    # The coefficient is in the loss: the same run without the ramp moves the weights otherwise.
    flat = str(tmp_path / "flat")
    train.train(flat_cfg, flat, progress=False)
    assert records(out)[1]["loss"] != records(flat)[1]["loss"]
    with pytest.raises(train.ConfigError, match="l1_warmup"):
        train.load_config({**cfg, "l1_warmup": -1})


def test_bad_configs_and_data(tmp_path):
    with pytest.raises(train.ConfigError, match="unknown config keys"):
        train.load_config({"train_data": "x", "lr_typo": 1})
    with pytest.raises(train.ConfigError, match="train_data"):
        train.load_config({})
    with pytest.raises(train.ConfigError, match="ffn"):
        train.load_config({"train_data": "x", "ffn": "sparse"})
    with pytest.raises(train.ConfigError, match="preset"):
        train.load_config({"train_data": "x", "model": {"preset": "7b"}})
    with pytest.raises(train.ConfigError, match="seq_len"):
        train.load_config({"train_data": "x", "seq_len": 0})
    with pytest.raises(FileNotFoundError, match="manifest"):
        train.train(train.load_config({"train_data": str(tmp_path)}), str(tmp_path / "o"), progress=False)
    cfg_path = tmp_path / "c.json"
    cfg_path.write_text("{not json")
    assert train.main([str(cfg_path), "--out", str(tmp_path / "o2")]) == 2


def test_plot_of_twell_stats(tmp_path):
    """`python -m twell.plot --stats` draws `twell stats --model --json` output (a hand-made one here:
    2 layers, 5 tokens in two sequences); a JSON of another kind is a clear error."""
    pytest.importorskip("matplotlib")
    from twell import plot

    stats = {"model": "m", "text": "t", "activation": "relu", "layers": 2, "neurons": 10,
             "tokens": [1, 2, 3, 4, 5], "position": [0, 1, 2, 0, 1], "sequence": [0, 0, 0, 1, 1],
             "per_layer": [{"layer": 0, "dead": 1, "hot_50pct": 2}, {"layer": 1, "dead": 0, "hot_50pct": 3}],
             "active": [[1, 2, 3, 4, 5], [5, 4, 3, 2, 1]]}
    path = tmp_path / "s.json"
    path.write_text(json.dumps(stats))
    assert plot.main(["--stats", str(path), "--out", str(tmp_path / "out")]) == 0
    with open(tmp_path / "out" / "stats.png", "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    path.write_text(json.dumps({"rows": []}))
    assert plot.main(["--stats", str(path)]) == 2


def test_plots_from_telemetry(tmp_path):
    pytest.importorskip("matplotlib")
    from twell import plot

    cfg = config(tmp_path, steps=4, l1_coeff=1e-2, reinit_window=128)
    runs = [str(tmp_path / "p1"), str(tmp_path / "p2")]
    for r, every in zip(runs, (0, 2)):  # the second run profiles positions
        train.train(cfg | {"position_profile_every": every}, r, progress=False)
    written = plot.plot(runs[:1], str(tmp_path / "fig1"))
    assert [os.path.basename(p) for p in written] == ["loss.png", "sparsity.png", "dead.png"]
    written = plot.plot(runs, str(tmp_path / "fig"))
    assert [os.path.basename(p) for p in written] == ["loss.png", "sparsity.png", "dead.png", "position.png"]
    for p in written:
        with open(p, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert plot.main([str(tmp_path / "nothing")]) == 2
    # Kept results are xz'd: telemetry.jsonl.xz reads the same.
    import lzma
    xz_run = tmp_path / "xz"
    xz_run.mkdir()
    with open(os.path.join(runs[1], "telemetry.jsonl"), "rb") as f, lzma.open(xz_run / "telemetry.jsonl.xz", "wb") as g:
        g.write(f.read())
    assert plot.read(str(xz_run)) == plot.read(runs[1])
    # eval_checkpoints.py's JSON: one figure, and a clear error for one without losses.
    ev = tmp_path / "eval.json"
    ev.write_text(json.dumps({"data": "val", "batches": 2, "runs": {"a": {"250": 4.0, "500": 3.0}, "b": {"250": 4.2, "500": 3.1}}}))
    png = plot.plot_eval(str(ev), str(tmp_path / "fig"))
    with open(png, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    ev.write_text(json.dumps({"runs": {}}))
    with pytest.raises(ValueError, match="no run"):
        plot.plot_eval(str(ev), str(tmp_path / "fig"))


def _rank_worker(rank, world, port, cfg, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    torch.set_num_threads(1)
    train.train(cfg, out, progress=False)  # destroys its process group; the run is on disk
    # Leave without the interpreter's teardown, where a gloo FSDP2 worker once aborted in CI
    # ("terminate called without an active exception", after its work): not what this checks.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _diverging_worker(rank, world, port, cfg, out, results):
    # Rank 1 changes a weight just before the save's check: every rank must refuse to save.
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    torch.set_num_threads(1)
    check = train.check_replicas

    def perturbed(model, step):
        if rank == 1:
            with torch.no_grad():
                next(model.parameters()).view(-1)[0] += 1e-3
        check(model, step)

    train.check_replicas = perturbed
    try:
        train.train(cfg, out, progress=False)
        results.put((rank, "saved"))
    except RuntimeError as e:
        results.put((rank, str(e)))
    results.close()
    results.join_thread()  # the queue's feeder thread has written it (os._exit would drop it)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def test_diverged_ddp_replicas_are_refused_not_saved(tmp_path):
    import socket

    import torch.distributed as dist
    import torch.multiprocessing as mp

    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("no gloo backend")
    cfg = config(tmp_path, steps=2, micro_batch=2)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    out = str(tmp_path / "div")
    procs = [ctx.Process(target=_diverging_worker, args=(r, 2, port, cfg, out, results)) for r in range(2)]
    for p in procs:
        p.start()
    got = dict(results.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(timeout=60)
    assert set(got) == {0, 1}
    assert all("ranks [1] differ from rank 0" in msg for msg in got.values()), got
    assert not os.path.exists(os.path.join(out, "latest"))  # nothing saved


@pytest.mark.parametrize("parallel,accum", [("ddp", 1), ("fsdp", 1), ("ddp", 2), ("fsdp", 2)])
def test_two_ranks_train_like_one_rank_with_twice_the_micro_batch(tmp_path, parallel, accum):
    # DDP averages the ranks' gradients of per-rank token means, FSDP2 reduce-scatters the same
    # average: the mean over the doubled batch, up to float32 summation order (1e-5 relative over
    # 5 AdamW steps). FSDP's checkpoint holds the gathered weights and optimiser state. With
    # gradient accumulation the ranks synchronise after the last micro-batch only (no_sync /
    # set_requires_gradient_sync): the same sums.
    import socket

    import torch.distributed as dist
    import torch.multiprocessing as mp

    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("no gloo backend")
    if parallel == "fsdp":
        pytest.importorskip("torch.distributed.fsdp", reason="FSDP2 (fully_shard)")
        from torch.distributed import fsdp
        if not hasattr(fsdp, "fully_shard"):
            pytest.skip("this PyTorch has no torch.distributed.fsdp.fully_shard")
    # Re-initialisation under both engines: the rows come from the counts reduced over the ranks,
    # the values from a generator seeded by (seed, step, layer); FSDP writes them into the shards.
    base = config(tmp_path, steps=5, l1_coeff=1e-2, reinit_window=128, save_every=5, parallel=parallel, grad_accum=accum)
    one, two = str(tmp_path / "one"), str(tmp_path / "two")
    train.train(base | {"micro_batch": 4}, one, progress=False)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_rank_worker, args=(r, 2, port, base | {"micro_batch": 2}, two)) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=300)
        assert p.exitcode == 0
    a, b = records(one), records(two)
    assert len(b) == 5  # rank 0 alone writes telemetry
    if accum == 1:  # the comparison covers re-initialisations (with twice the tokens a step, none fire)
        assert sum(sum(x["reinit"]) for x in a) > 0
    for x, y in zip(a, b):
        assert y["loss"] == pytest.approx(x["loss"], rel=1e-5)
        assert y["l1"] == pytest.approx(x["l1"], rel=1e-5)
        assert y["reinit"] == x["reinit"] and y["nnz_per_token"] == pytest.approx(x["nnz_per_token"], rel=1e-5)
        assert y["grad_norm"] == pytest.approx(x["grad_norm"], rel=1e-4)
    # The checkpoint the two ranks wrote resumes on one rank.
    rec = train.train(base | {"micro_batch": 4, "steps": 6}, two, resume=True, progress=False)
    assert rec["step"] == 6
    with pytest.raises(train.ConfigError, match="sequences a step"):
        train.train(base | {"micro_batch": 3, "steps": 7}, two, resume=True, progress=False)


def test_relufy_from_a_silu_checkpoint(tmp_path):
    import transformers

    torch.manual_seed(0)
    lc = transformers.LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=176, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                  hidden_act="silu")
    src = str(tmp_path / "silu")
    transformers.LlamaForCausalLM(lc).save_pretrained(src)
    with open(os.path.join(src, "tokenizer.json"), "w") as f:
        f.write("{}")
    cfg = config(tmp_path, init_from=src, steps=2, l1_coeff=1e-2)
    with pytest.raises(train.ConfigError, match="relufy"):
        train.train(cfg, str(tmp_path / "no"), progress=False)
    for ffn in ("dense", "twell"):
        out = str(tmp_path / f"relu-{ffn}")
        train.train(cfg | {"relufy": True, "ffn": ffn}, out, progress=False)
        ckpt = os.path.join(out, "checkpoint-2")
        m = transformers.LlamaForCausalLM.from_pretrained(ckpt)
        assert m.config.hidden_act == "relu" and os.path.exists(os.path.join(ckpt, "tokenizer.json"))
        assert all(d < 1.0 for d in records(out)[-1]["density"])  # ReLU: exact zeros


def test_native_runtime_reads_what_the_trainer_saves(tmp_path):
    """The round trip: a SiLU checkpoint with θ = 1e5 (SmolLM2's) and llama3 RoPE scaling, ReLU-fied and
    trained 2 steps by twell.train, saved by its save_pretrained (transformers 5 writes RoPE inside
    rope_parameters), then run by the native CPU runtime: transformers' float64 logits within 1e-4
    of the logit scale on the dense path (fp32 sums over K = 64; measured ~1e-6) and 1e-2 on the
    automatic one (the TwELL path holds gate values as bf16, 2^-9 each). θ read as 1e4 moves them by
    O(0.1) (the bug this guards against)."""
    import transformers

    twell = pytest.importorskip("twell")
    if not hasattr(twell._twell, "NativeModel"):
        pytest.skip("twell built without the model runtime")
    import twell.model as tm

    torch.manual_seed(0)
    lc = transformers.LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=176, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                                  hidden_act="silu", initializer_range=0.1,
                                  rope_parameters={"rope_type": "llama3", "rope_theta": 1e5, "factor": 8.0,
                                                   "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                   "original_max_position_embeddings": 32})
    src = str(tmp_path / "silu")
    transformers.LlamaForCausalLM(lc).save_pretrained(src)
    with open(os.path.join(src, "tokenizer.json"), "w") as f:
        f.write("{}")
    out = str(tmp_path / "relu")
    train.train(config(tmp_path, init_from=src, steps=2, relufy=True, ffn="twell"), out, progress=False)
    ckpt = os.path.join(out, "checkpoint-2")
    with open(os.path.join(ckpt, "config.json")) as f:
        saved = json.load(f)
    assert saved["hidden_act"] == "relu" and "rope_parameters" in saved
    os.remove(os.path.join(ckpt, "tokenizer.json"))  # the placeholder; ids need no tokenizer
    ref = transformers.LlamaForCausalLM.from_pretrained(ckpt, dtype=torch.float64).eval()
    ids = [int(t) for t in torch.randint(1, 64, (200,), generator=torch.Generator().manual_seed(2))]
    with torch.no_grad():
        want = ref(torch.tensor([ids])).logits[0].numpy()
    m = tm.Model(ckpt, device="cpu", ffn="dense")
    assert m.config["rope_theta"] == 1e5 and m.config["rope_type"] == "llama3", m.config
    for ffn, bound in (("dense", 1e-4), ("auto", 1e-2)):
        got = tm.Model(ckpt, device="cpu", ffn=ffn).logits(ids)
        err = np.abs(got - want).max() / np.abs(want).max()
        print(f"{ffn}: {err:.2e}")
        assert err < bound, (ffn, err)


@pytest.mark.parametrize("ffn", ["twell", "dense"])
def test_position_profile_averages_to_the_per_token_count(tmp_path, ffn):
    # The profile (non-zeros per token by position, mean over layers and the batch) averaged over
    # the positions is the step's mean non-zeros per token over the layers. Dense path: both come
    # from the same h. twell: the profile from the MLP input's gate GEMM, l0 from twell's kernel,
    # both float32 on the same inputs: only a pre-activation within rounding of 0 could differ.
    cfg = config(tmp_path, ffn=ffn, steps=4, position_profile_every=2)
    out = str(tmp_path / f"pos-{ffn}")
    train.train(cfg, out, progress=False)
    r = records(out)
    assert ["nnz_by_position" in x for x in r] == [False, True, False, True]
    for x in (r[1], r[3]):
        prof = x["nnz_by_position"]
        assert len(prof) == 32
        assert np.mean(prof) == pytest.approx(np.mean(x["nnz_per_token"]), rel=1e-3 if ffn == "twell" else 1e-4)
    with pytest.raises(train.ConfigError, match="position_profile_every"):
        train.load_config(cfg | {"position_profile_every": -1})


@pytest.mark.parametrize("ffn", ["twell", "dense"])
def test_compiled_forward_trains_like_eager(tmp_path, ffn):
    """"compile": true runs the same steps through torch.compile: losses and L1 within float32
    rounding of the eager run's (Inductor fuses and reorders; the CPU op's data-dependent state size
    breaks the graph at each twell layer there, which changes nothing but speed)."""
    cfg = config(tmp_path, ffn=ffn, steps=4, l1_coeff=1e-3)
    eager, compiled = str(tmp_path / "eager"), str(tmp_path / "compiled")
    train.train(cfg, eager, progress=False)
    train.train(cfg | {"compile": True}, compiled, progress=False)
    for a, b in zip(records(eager), records(compiled)):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-4)
        assert b["l1"] == pytest.approx(a["l1"], rel=1e-3)
    with pytest.raises(train.ConfigError, match="compile"):
        train.load_config(cfg | {"compile": "yes"})
