"""The multi-GPU benchmark scripts' arithmetic (bench/train/ranks_equal.py, scaling.py) on synthetic
results: the equivalence bound passes what is within the one-rank runs' noise and fails what is
not; the scaling table reads the median step, counts accumulated micro-batches and every GPU."""

import pytest

from bench_script import load_bench


def load(name):
    return load_bench("train/" + name)


def tel(losses, reinit=0):
    return [{"step": i + 1, "loss": v, "l1": 10 * v, "reinit": [reinit]} for i, v in enumerate(losses)]


def test_bound_is_three_times_the_one_rank_spread_so_far():
    re = load("ranks_equal")
    ref = tel([10.0, 9.0, 8.0])
    noise = tel([10.0, 9.001, 8.002])  # spread 0, 1e-3, 2e-3
    inside = re.compare(tel([10.0, 9.0025, 8.005]), ref, [noise], "loss")
    assert inside["ok"] and inside["worst_diff_over_bound"] < 1
    # At step 2 the envelope is 1e-3: 4.5e-3 is beyond 3 × 1e-3 + 1e-4 × 9 = 3.9e-3.
    outside = re.compare(tel([10.0, 9.0045, 8.0]), ref, [noise], "loss")
    assert not outside["ok"] and outside["worst_diff_over_bound"] > 1
    # A step the reference lacks, or a run with no steps, is not a pass.
    assert not re.compare(tel([10.0, 9.0, 8.0, 7.0]), ref, [noise], "loss")["ok"]
    assert not re.compare([], ref, [noise], "loss")["ok"]


def test_families_pool_their_noise_only_when_no_reinit_fired():
    re = load("ranks_equal")

    def res(reinit):
        runs = {"ddp-ref-1x4": {"rc": 0, "telemetry": tel([5.0, 4.0])},
                "ddp-noise-1x2x2acc": {"rc": 0, "telemetry": tel([5.0, 4.0001], reinit)},
                "fsdp-ref-1x4": {"rc": 0, "telemetry": tel([5.0, 4.01])},
                "fsdp-noise-1x2x2acc": {"rc": 0, "telemetry": tel([5.0, 4.01])},
                "ddp-2x2": {"rc": 0, "telemetry": tel([5.0, 4.02])},
                "fsdp-2x2": {"rc": 0, "telemetry": tel([5.0, 4.01])}}
        return {"runs": runs, "engines": ["ddp", "fsdp"], "batch": 4, "steps": 2}

    pooled = res(0)
    re.analyse(pooled)
    assert pooled["pooled"] and pooled["checks"]["ddp-2x2"]["ok"]  # fsdp-ref's 0.01 spread counts
    apart = res(1)
    re.analyse(apart)
    assert not apart["pooled"] and not apart["checks"]["ddp-2x2"]["ok"]  # only ddp's 1e-4 spread
    assert apart["checks"]["fsdp-2x2"]["ok"]


def test_scaling_reads_the_median_step_and_counts_every_gpu():
    sc = load("scaling")
    res = {"config": "t", "gpu": "G", "gpus_on_machine": 4, "commit": "c", "date": "d", "micro_batch": 2,
           "grad_accum": 2, "seq": 100, "steps": 3, "warmup": 1, "lr": 0.0}
    one = {"gpus": 1, "parallel": "single", "mode": "twell-compiled", "step_ms": 300.0,
           "step_ms_each": [100.0, 100.0, 500.0], "peak_gib": 1.0}
    assert sc.step_ms(one) == 100.0  # the slow step does not move the median
    assert sc.tokens_per_s(one, res) == pytest.approx(1 * 2 * 2 * 100 / 0.1)
    old = {"gpus": 4, "parallel": "ddp", "mode": "twell-compiled", "step_ms": 400.0,
           "step_ms_one_at_a_time": [125.0, 130.0, 120.0], "peak_gib": 1.0}
    assert sc.step_ms(old) == 125.0  # results from before the per-step events
    dense4 = {"gpus": 4, "parallel": "ddp", "mode": "dense-compiled", "step_ms": 150.0, "step_ms_each": [150.0], "peak_gib": 2.0}
    res["runs"] = [one, old, dense4, {"gpus": 4, "parallel": "fsdp", "mode": "twell", "error": "boom"}]
    md = sc.table(res)
    assert "| 4 | ddp | twell-compiled | 125.0 | 400.0 |" in md
    assert "80.0 %" in md  # 4 GPUs at 125 ms against one at 100 ms
    assert "1.20×" in md  # against dense at 150 ms, same G and engine
    assert "failed: boom" in md


def test_reinit_families_stand_alone_and_must_fire():
    re = load("ranks_equal")
    runs = {"ddp-ref-1x4": {"rc": 0, "telemetry": tel([5.0, 4.0])},
            "ddp-repeat-1x4": {"rc": 0, "telemetry": tel([5.0, 4.0001])},
            "fsdp-ref-1x4": {"rc": 0, "telemetry": tel([5.0, 4.01])},
            "fsdp-repeat-1x4": {"rc": 0, "telemetry": tel([5.0, 4.01])},
            "ddp-2x2": {"rc": 0, "telemetry": tel([5.0, 4.02])},
            "ddp+reinit-ref-1x4": {"rc": 0, "telemetry": tel([7.0, 6.0], 3)},
            "ddp+reinit-repeat-1x4": {"rc": 0, "telemetry": tel([7.0, 6.0001], 3)},
            "ddp+reinit-2x2": {"rc": 0, "telemetry": tel([7.0, 6.0002], 3)},
            "fsdp+reinit-ref-1x4": {"rc": 0, "telemetry": tel([7.0, 6.0])},
            "fsdp+reinit-repeat-1x4": {"rc": 0, "telemetry": tel([7.0, 6.0])},
            "fsdp+reinit-2x2": {"rc": 0, "telemetry": tel([7.0, 6.0])}}
    res = {"runs": runs, "engines": ["ddp", "fsdp", "ddp+reinit", "fsdp+reinit"], "batch": 4, "steps": 2, "seq": 8,
           "gmax": 2, "gpu": "G", "gpus_on_machine": 2, "commit": "c", "date": "d", "path": "sparse"}
    re.analyse(res)
    assert res["pooled"] and res["checks"]["ddp-2x2"]["ok"]  # the plain families pool: fsdp's 0.01 spread
    c = res["checks"]["ddp+reinit-2x2"]
    assert c["ok"] and all("+reinit-" in n for n in c["noise_runs"])  # never pooled with another L1 coefficient
    assert "fsdp+reinit-ref-1x4" in c["noise_runs"]  # but with the other engine's runs of the same arithmetic
    assert not res["checks"]["fsdp+reinit-2x2"]["ok"]  # nothing re-initialised: the check tested nothing
    assert "no re-initialisation fired" in re.table(res)
