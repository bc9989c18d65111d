"""bench/bench_training.py's balanced A/B cases (run_ab) on the CPU with a tiny model:
every variant timed in each round, the order reversed every other round, medians of
rounds x steps timings, the clocks of each window aggregated, and the rows through the
parent's progress line, the JSON record, the table and the docs' markdown -- the GPU-only
fields (clocks, peak memory) faked where the CPU has none. A device run lost its rows to
a missing clocks key in the progress line (run of 46066f4)."""

import argparse
import json
import os
import sys

import pytest
import torch

pytest.importorskip("transformers")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import bench_training as bt  # noqa: E402


class FakeClocks:
    n = 0

    def __init__(self, device, every=0.02):
        self.result = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        FakeClocks.n += 1
        self.result = dict(sm_MHz_mean=1700 + FakeClocks.n, sm_MHz_min=1600, sm_MHz_max=1980,
                           power_W_mean=650, samples=10, throttle=["sw power cap"])
        return False


def args(**kw):
    a = dict(seed=0, compile_mode="layers", compile_options=None, quick=False, ab_rounds=3,
             ab_steps=2, profile=set(), trace_dir=None)
    a.update(kw)
    return argparse.Namespace(**a)


def _spy_steps(mp, on_step):
    """Tag each built model with its variant and call on_step(model) before each step."""
    step, build = bt._step, bt._build

    def spy(fwd, model, opt, x):
        on_step(model)
        return step(fwd, model, opt, x)

    def tagged_build(case, *a, **k):
        model, fwd, cfg, info = build(case, *a, **k)
        model._variant = case["variant"]
        return model, fwd, cfg, info
    mp.setattr(bt, "_step", spy)
    mp.setattr(bt, "_build", tagged_build)


def test_run_ab_balanced_order_medians_and_record(monkeypatch, tmp_path):
    monkeypatch.setattr(bt, "_Clocks", FakeClocks)
    order = []
    _spy_steps(monkeypatch, lambda model: order.append(model._variant))
    case = dict(kind="ab", cfg="tiny", batch=2, seq=32, variants=["hf_sdpa", "patched"])
    rows, profs = bt.run_ab(case, args(), torch.device("cpu"), torch.bfloat16)
    assert profs == [] and [r["variant"] for r in rows] == ["hf_sdpa", "patched"]
    # warm-ups (3 steps each), then per round each variant's window: a lead-in + 2 steps,
    # in the order A B | B A | A B
    windows = order[6:]
    assert order[:6] == ["hf_sdpa"] * 3 + ["patched"] * 3
    assert [windows[i] for i in range(0, len(windows), 3)] == [
        "hf_sdpa", "patched", "patched", "hf_sdpa", "hf_sdpa", "patched"]
    for r in rows:
        assert r["status"] == "ok", r
        assert r["steps"] == 6 and len(r["step_ms_all"]) == 6 and len(r["window_ms_per_step"]) == 3
        assert r["step_ms_min"] <= r["step_ms"] <= r["step_ms_max"]
        assert r["tokens_per_s"] == pytest.approx(2 * 32 / r["step_ms"] * 1e3)
        assert len(r["clocks"]["per_window"]) == 3 and r["clocks"]["power_W_mean"] == 650
        assert "median" in r["method"]
        r["peak_GB"] = 1.0                 # (CUDA only: the record's memory rows need it)
        assert r["label"] in bt.result_line(r) and "1700" not in bt.result_line(r)
    assert rows[0]["loss"] == pytest.approx(rows[1]["loss"], rel=0.05)   # same data
    rec = bt.build_record(rows, None, None, argparse.Namespace(
        device_name="CPU", commit="x", command="test"))
    assert any(r["metric"] == "tokens/s" and r["ratio_hf_sdpa"] for r in rec["rows"])
    assert "patched" in bt.table(rec)
    path = tmp_path / "training.json"
    path.write_text(json.dumps(rec))
    bt.markdown(str(path))


def test_run_ab_compiled_ops_variants_build_their_sets():
    """The per-op variants pass their compiled_ops to patch_llama (recorded per row)."""
    model, fwd, cfg, info = bt._build(dict(cfg="tiny", batch=1, seq=16,
                                           variant="patched_compile_no_rope"),
                                      torch.device("cpu"), torch.float32, 0, "layers")
    assert info["compiled_ops"] == ["rms_norm", "swiglu"]
    assert not model.model.layers[0].self_attn._ot_compiled_lib
    assert model.model.layers[0].mlp._ot_compiled_lib
    for v in bt.COMPILED_OPS:
        assert v in bt.VARIANTS and bt._compiled(v)


def test_parent_counts_an_ab_case_as_one_planned_item():
    plan = bt.plan(quick=False)
    ab = [c for g in plan[:4] for c in g if c.get("kind") == "ab"]
    assert len(ab) == 4 and all(bt._case_variants(c) == c["variants"] for c in ab)
    assert bt._estimate_s(plan[3], False, "layers") < 120


def test_run_ab_runs_each_patched_variant_with_its_attention_option():
    """config.fused_attention is process-wide and read per call: each window of an A/B
    runs under its own variant's setting ("auto" for patched, False for
    patched_torch_attn), not the one the variant built last left (the long-context A/B
    pairs patched with patched_other)."""
    import ops_transformer as ot
    seen = []
    case = dict(kind="ab", cfg="tiny", batch=1, seq=16,
                variants=["patched", "patched_torch_attn"])
    prev = ot.config.fused_attention
    try:
        with pytest.MonkeyPatch.context() as mp:
            _spy_steps(mp, lambda model: seen.append((model._variant,
                                                      ot.config.fused_attention)))
            rows, _ = bt.run_ab(case, args(ab_rounds=2, ab_steps=1), torch.device("cpu"),
                                torch.float32)
    finally:
        ot.config.fused_attention = prev
    assert [r["status"] for r in rows] == ["ok", "ok"], rows
    assert {v for v, _ in seen} == {"patched", "patched_torch_attn"}
    for variant, fused in seen:
        assert fused == bt.FUSED_ATTENTION.get(variant, "auto"), (variant, fused)


def test_run_case_records_an_out_of_memory_with_its_phase():
    """The long-context case where HF runs out of memory: the row says oom, the error, and
    in which step it ran out (the GPU-only peak / capacity fields on CUDA); a case's own
    warm-up / timed step counts are used (the 1 x 65536 case: 1 + 2)."""
    steps = []
    with pytest.MonkeyPatch.context() as mp:
        _spy_steps(mp, lambda model: steps.append(model._variant))
        r = bt.run_case(dict(cfg="tiny", batch=1, seq=16, variant="patched", warmup=1,
                             steps=2), args(steps=6), torch.device("cpu"), torch.float32)
    assert r["status"] == "ok" and r["steps"] == 2 and len(steps) == 3, (r, steps)

    def oom(model):
        if len(steps) == 1:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 31.31 GiB")
        steps.append(1)
    steps.clear()
    with pytest.MonkeyPatch.context() as mp:
        _spy_steps(mp, lambda model: (steps.append(0), oom(model)))
        r = bt.run_case(dict(cfg="tiny", batch=1, seq=16, variant="hf_sdpa", warmup=3,
                             steps=2), args(steps=6), torch.device("cpu"), torch.float32)
    assert r["status"] == "oom" and r["oom_phase"] == "warm-up step 1", r
    assert "Tried to allocate 31.31 GiB" in r["error"]
    r.update(peak_GB_at_oom=139.1, device_total_GB=150.0)        # (CUDA only)
    ok = dict(case=r["case"], variant="patched", label="patched", status="ok",
              tokens_per_s=1e3, peak_GB=60.0, model_TFLOPs=400.0, loss=1.0)
    rec = bt.build_record([r, ok], None, None, argparse.Namespace(
        device_name="CPU", commit="x", command="test"))
    row = next(x for x in rec["rows"] if x["metric"] == "tokens/s")
    assert row["peers_out_of_memory"] == {"HF sdpa": 139.1} and row["ratio_best_peer"] is None
    assert bt._is_oom(RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling "
                                   "cublasCreate"))
    assert not bt._is_oom(RuntimeError("shape mismatch"))


def test_tagged_ab_case_keeps_its_rows_apart(tmp_path, capsys):
    """Group 3 (compiled ops) is its own case "[compiled_ops]": its HF sdpa + compile row
    does not replace group 0's in the record, and its ratios are taken against it."""
    plan = bt.plan(quick=False)
    assert plan[3][0].get("tag") == "compiled_ops"
    name = bt.case_name("0.54b", 4, 2048, "compiled_ops")
    runs = [dict(case="0.54b bf16 4x2048", variant=v, label=bt.VARIANTS[v], status="ok",
                 tokens_per_s=t, peak_GB=g, model_TFLOPs=1.0, loss=1.0)
            for v, t, g in (("hf_sdpa", 100.0, 10.0), ("hf_sdpa_compile", 140.0, 9.0),
                            ("patched_compile", 150.0, 7.0))]
    runs += [dict(case=name, variant=v, label=bt.VARIANTS[v], status="ok", tokens_per_s=t,
                  peak_GB=g, model_TFLOPs=1.0, loss=1.0)
             for v, t, g in (("hf_sdpa_compile", 120.0, 9.0),
                             ("patched_compile_ops_none", 132.0, 8.0))]
    rec = bt.build_record(runs, None, None, argparse.Namespace(
        device_name="CPU", commit="x", command="test"))
    tok = {(x["case"], x["op"]): x for x in rec["rows"] if x["metric"] == "tokens/s"}
    got = tok[(name, "train_step (" + bt.VARIANTS["patched_compile_ops_none"] + ")")]
    assert got["peers"] == {"HF sdpa + torch.compile": 120.0}
    assert got["ratio_best_peer"] == pytest.approx(1.1)
    assert tok[("0.54b bf16 4x2048", "train_step (patched + torch.compile)")]["peers"][
        "HF sdpa + torch.compile"] == 140.0
    assert "1.10" in bt.table(rec).split(name)[-1]
    path = tmp_path / "training.json"
    path.write_text(json.dumps(rec))
    bt.markdown(str(path))
    md = capsys.readouterr().out
    assert f"| {name} | {bt.VARIANTS['patched_compile_ops_none']} | 0.1 k | 1.10x |" in md
    assert f"In {name} the x columns are against HF sdpa + torch.compile" in md


def test_run_ab_sets_fuse_layer_adds_per_window():
    """patch.FUSE_LAYER_ADDS is process-wide and read per call: each window of an A/B runs
    with its own variant's value (the *_fused_adds variants on, the others off), and the
    fused variants' rows are the record's too."""
    from ops_transformer import patch as ot_patch
    seen = []
    case = dict(kind="ab", cfg="tiny", batch=1, seq=16, tag="fused_adds",
                variants=["patched", "patched_fused_adds"])
    try:
        with pytest.MonkeyPatch.context() as mp:
            _spy_steps(mp, lambda model: seen.append((model._variant,
                                                      ot_patch.FUSE_LAYER_ADDS)))
            rows, _ = bt.run_ab(case, args(ab_rounds=2, ab_steps=1), torch.device("cpu"),
                                torch.float32)
    finally:
        ot_patch.FUSE_LAYER_ADDS = False
    assert [r["status"] for r in rows] == ["ok", "ok"], rows
    assert rows[0]["case"] == "tiny bf16 1x16 [fused_adds]"
    assert {v for v, _ in seen} == {"patched", "patched_fused_adds"}
    for variant, on in seen:
        assert on == (variant == "patched_fused_adds"), (variant, on)
    assert rows[0]["loss"] == pytest.approx(rows[1]["loss"], rel=1e-3)
    rec = bt.build_record(rows, None, None, argparse.Namespace(
        device_name="CPU", commit="x", command="test"))
    assert any(r["op"] == "train_step (patched, residual adds fused)" for r in rec["rows"])
    plan = bt.plan(quick=False)
    assert [c.get("tag") for c in plan[11] + plan[12]] == ["fused_adds"] * 2


class FakeTimedClocks(FakeClocks):
    """A sampler whose samples (host time, MHz) cover its block evenly: interleaved rounds
    give each to the step running at its time."""

    def __enter__(self):
        import time
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        import time
        t1 = time.perf_counter()
        self.timed_samples = [(self._t0 + (t1 - self._t0) * i / 400, 1500 + i % 7)
                              for i in range(400)]
        return False


def test_run_ab_interleaved_passes_round_ratios_and_clocks(monkeypatch, tmp_path, capsys):
    """Interleaved rounds (groups 11 / 12): a lead-in pass, then passes of one timed step
    per variant in alternating order, the round's start order reversed every other round;
    per-round medians, the ratio per round against the HF peer with a bootstrap interval,
    and the clock samples given to the variants' timed steps."""
    monkeypatch.setattr(bt, "_Clocks", FakeTimedClocks)
    order = []
    _spy_steps(monkeypatch, lambda model: order.append(model._variant))
    case = dict(kind="ab", cfg="tiny", batch=2, seq=32, interleave=True,
                variants=["hf_sdpa", "patched"])
    rows, _ = bt.run_ab(case, args(ab_rounds=3, ab_steps=2), torch.device("cpu"),
                        torch.float32)
    A, B = "hf_sdpa", "patched"
    assert order[:6] == [A] * 3 + [B] * 3
    assert order[6:] == [A, B, A, B, B, A] + [B, A, B, A, A, B] + [A, B, A, B, B, A], order
    for r in rows:
        assert r["status"] == "ok", r
        assert "interleaved" in r["method"] and "window_ms_per_step" not in r
        assert r["steps"] == 6 and len(r["round_ms"]) == 3
        assert r["clocks"]["samples"] > 0 and len(r["clocks"]["per_round"]) == 3
        assert 1500 <= r["clocks"]["sm_MHz_min"] <= r["clocks"]["sm_MHz_max"] <= 1506
    q = rows[1]["round_ratios"]["hf_sdpa"]
    assert len(q["per_round"]) == 3 and q["min"] <= q["median"] <= q["max"]
    # per_round and round_ms are both rounded to 4 decimals: a ratio near 0.03 (a fast
    # patched step on the CPU) is off by up to ~1.4e-3 relative from the rounding alone
    assert q["per_round"][0] == pytest.approx(rows[0]["round_ms"][0] / rows[1]["round_ms"][0],
                                              rel=1e-3, abs=1e-4)
    lo, hi = q["ci95"]
    eps = 1e-9                               # (a mean of equal values: rounding)
    assert q["min"] - eps <= lo <= q["mean"] + eps and q["mean"] - eps <= hi <= q["max"] + eps
    assert "round_ratios" not in rows[0]
    rows[1]["peak_GB"] = rows[0]["peak_GB"] = 1.0
    assert "vs hf_sdpa over 3 rounds" in bt.result_line(rows[1])
    rec = bt.build_record(rows, None, None, argparse.Namespace(
        device_name="CPU", commit="x", command="test"))
    path = tmp_path / "training.json"
    path.write_text(json.dumps(rec))
    bt.markdown(str(path))
    md = capsys.readouterr().out
    assert "Per-round tokens/s ratios" in md and "patched / HF sdpa" in md, md


def test_bootstrap_interval_is_deterministic_and_brackets_the_mean():
    v = [1.08, 1.10, 1.09, 1.12, 1.07, 1.11]
    lo, hi = bt._bootstrap_ci(v)
    assert lo < sum(v) / len(v) < hi and (lo, hi) == tuple(bt._bootstrap_ci(v))
    assert bt._bootstrap_ci([1.1]) is None


def _fused_ab(variants, compile_mode="layers", **kw):
    from ops_transformer import patch as ot_patch
    case = dict(kind="ab", cfg="tiny", batch=1, seq=16, tag="fused_adds", interleave=True,
                variants=variants)
    try:
        rows, _ = bt.run_ab(case, args(ab_rounds=2, ab_steps=1, compile_mode=compile_mode,
                                       **kw), torch.device("cpu"), torch.float32)
    finally:
        ot_patch.FUSE_LAYER_ADDS = False
    # the spies are gone after the A/B
    assert ot_patch._SwiGLUDown.__name__ == "_SwiGLUDown" and not bt._SPIES
    return {r["variant"]: r for r in rows}


def _needs_library_norm():
    from ops_transformer import patch as ot_patch
    if not (ot_patch._usable("rms_norm", torch.device("cpu"), torch.float32)
            and ot_patch._usable("swiglu", torch.device("cpu"), torch.float32)):
        pytest.skip("the library's rms_norm / swiglu are not usable on this CPU build")


def test_fused_adds_paths_recorded_and_a_path_not_taken_is_refused(monkeypatch, tmp_path,
                                                                    capsys):
    """The fused variant's steps are spied on (after the warm-up and each timed step):
    both halves of FUSE_LAYER_ADDS in every layer, and none in the unfused variant; when
    the fused path is not taken (here _fuse_mlp_ok refuses, as torch 2.11's dynamo made it
    do in the run of 1c2f893) the row is refused: status path_not_taken, no tokens/s and
    no ratio in the record, the reason in the docs' text."""
    _needs_library_norm()
    rows = _fused_ab(["patched", "patched_fused_adds"])
    on, off = rows["patched_fused_adds"], rows["patched"]
    assert on["status"] == "ok" and on["fused_path_taken"], on
    assert on["fused_paths"]["warm_up"] == dict(norm_fused=True, mlp_fused=True,
                                                down_residual=True), on["fused_paths"]
    assert on["fused_paths"]["timed_records"] == 2
    assert on["fused_paths"]["timed_distinct"] == [on["fused_paths"]["warm_up"]]
    assert off["status"] == "ok" and off["fused_path_taken"]
    assert off["fused_paths"]["warm_up"] == dict(down_plain=True), off["fused_paths"]
    assert on["round_ratios"]["patched"]["per_round"]

    from ops_transformer import patch as ot_patch
    monkeypatch.setattr(ot_patch, "_fuse_mlp_ok", lambda m: False)
    rows = _fused_ab(["hf_sdpa", "patched", "patched_fused_adds"])
    on = rows["patched_fused_adds"]
    assert on["status"] == "path_not_taken" and not on["fused_path_taken"], on
    assert "MLP residual" in on["error"] and "down GEMM residual" in on["error"], on["error"]
    assert "tokens_per_s" not in on and on["not_reported"]["tokens_per_s"] > 0
    assert rows["patched"]["status"] == "ok"
    for r in rows.values():
        r["peak_GB"] = 1.0
    rec = bt.build_record(list(rows.values()), None, None, argparse.Namespace(
        device_name="CPU", commit="x", command="test"))
    got = next(x for x in rec["rows"] if x["metric"] == "tokens/s"
               and x["op"] == "train_step (patched, residual adds fused)")
    assert got["ours"] is None and got["ratio_best_peer"] is None
    assert "not fused: MLP residual" in bt.table(rec)
    path = tmp_path / "training.json"
    path.write_text(json.dumps(rec))
    bt.markdown(str(path))
    assert "Not reported (the variant's steps did not take" in capsys.readouterr().out


def test_fused_adds_paths_traced_under_compile():
    """Under torch.compile (per layer, as the device calls run it) the spies' records are
    replayed after every compiled call without recompiling: both halves traced in the
    fused variant, none in the other, one graph each (the check that the run of 1c2f893
    lacked: its compiled fused rows were an A/A)."""
    _needs_library_norm()
    torch._dynamo.reset()
    rows = _fused_ab(["patched_compile", "patched_compile_fused_adds"])
    on, off = rows["patched_compile_fused_adds"], rows["patched_compile"]
    assert on["status"] == "ok" and on["fused_path_taken"], on
    assert on["fused_paths"]["timed_distinct"] == [dict(norm_fused=True, mlp_fused=True,
                                                        down_residual=True)], on
    assert off["status"] == "ok" and off["fused_paths"]["timed_distinct"] == [
        dict(down_plain=True)], off
    # no recompiles in the rounds: the warm-up's graphs serve every timed step
    assert on["dynamo_after_rounds"]["recompiles"] in (None, 0), on["dynamo_after_rounds"]
    assert on["dynamo"]["graph_breaks"] == 0, on["dynamo"]


def test_only_out_of_range_names_the_plan(tmp_path, capsys):
    for bad in ("99", "11,15", "x"):
        with pytest.raises(SystemExit) as e:
            bt.main(["--only", bad, "--device", "cpu", "--json", str(tmp_path / "t.json")])
        assert e.value.code == 2
        err = capsys.readouterr().err
        assert f"--only '{bad}'" in err and "has groups 0-14" in err, err
        assert bad != "11,15" or "no group 15" in err, err


@pytest.mark.parametrize("interleave", [False, True])
def test_run_ab_a_failing_step_is_its_variants_error(monkeypatch, interleave):
    """A step that raises in the rounds (once, in patched's second timed step): the error
    is recorded on that variant's row only; windowed, only its window is lost, interleaved
    the whole round (its times are not kept) -- the other rounds still count."""
    monkeypatch.setattr(bt, "_Clocks", FakeClocks)
    n = {"patched": 0}

    def on_step(model):
        if model._variant == "patched":
            n["patched"] += 1
            if n["patched"] == 3 + 1 + 2:      # warm-up, the lead-in, 2nd timed step
                raise RuntimeError("injected failure")
    _spy_steps(monkeypatch, on_step)
    case = dict(kind="ab", cfg="tiny", batch=1, seq=16, interleave=interleave,
                variants=["hf_sdpa", "patched"])
    rows, _ = bt.run_ab(case, args(ab_rounds=3, ab_steps=2), torch.device("cpu"),
                        torch.float32)
    hf, ours = rows
    assert "error" not in hf and "injected failure" in ours["error"], rows
    assert hf["status"] == ours["status"] == "ok"
    assert ours["steps"] == 4
    assert hf["steps"] == (4 if interleave else 6)
    assert ours["round_ms"][0] is None and (hf["round_ms"][0] is None) == interleave
    assert len(ours["round_ratios"]["hf_sdpa"]["per_round"]) == 2


def test_ab_variants_keeps_only_those_of_each_ab_case():
    plan = list(enumerate(bt.plan(quick=False)))
    keep = ["hf_sdpa_compile", "patched_compile"]
    got = dict(bt._keep_ab_variants([plan[0], plan[1], plan[2], plan[11]], keep))
    # group 0: the ceiling stays, the 0.54 B A/B keeps the compiled pair (plan order)
    assert [c.get("kind") for c in got[0]] == ["ceiling", "ab"]
    assert got[0][1]["variants"] == keep and got[0][1]["cfg"] == "0.54b"
    assert got[1] == [dict(plan[1][1][0], variants=keep)]
    # group 2's A/B (HF sdpa vs patched at 16k) keeps none of them: dropped; its
    # 1 x 65536 step cases stay
    assert [c.get("kind", "step") for c in got[2]] == ["step", "step"]
    assert got[11][0]["variants"] == keep and got[11][0]["interleave"]
    # the plan itself untouched; a group left empty is dropped
    assert len(plan[1][1][0]["variants"]) == 4
    assert bt._keep_ab_variants([plan[1]], ["hf_sdpa", "hf_eager"]) == []
    # the smaller A/B is estimated shorter
    assert bt._estimate_s(got[1], False, "layers", 12, 4) < bt._estimate_s(
        plan[1][1], False, "layers", 12, 4)


def test_ab_variants_names_a_bad_argument(tmp_path, capsys):
    for bad, why in (("hf_sdpa_compile,patched_compil", "no variant patched_compil"),
                     ("patched_compile", "two variants at least")):
        with pytest.raises(SystemExit) as e:
            bt.main(["--only", "1", "--ab-variants", bad, "--device", "cpu",
                     "--json", str(tmp_path / "t.json")])
        assert e.value.code == 2
        err = capsys.readouterr().err
        assert f"--ab-variants '{bad}'" in err and why in err, err
    assert not (tmp_path / "t.json").exists()


def test_run_ab_levers_set_their_switches_and_optimizer(monkeypatch):
    """The lever variants of groups 13 / 14 (VARIANT_ENV): each step runs under its own
    variant's switches (OT_ADAMW_IMPL, OT_LCE_CHUNK_ROWS; unset for the others) and the
    library-AdamW ones step with ops_transformer.optim.AdamW; their per-round ratios are
    also taken against the default compiled step and, for an opt-in AdamW kernel, the
    library's default kernel. (torch.compile is left out here: _compiled patched to
    False, the switches and the optimizer are what is checked.)"""
    from ops_transformer.optim import AdamW as OtAdamW
    monkeypatch.setattr(bt, "_compiled", lambda v: False)
    seen = []
    opt_of = {}
    real_opt = bt._optimizer

    def spy_opt(model, device, variant=""):
        o = real_opt(model, device, variant)
        opt_of[variant] = type(o)
        return o
    monkeypatch.setattr(bt, "_optimizer", spy_opt)
    _spy_steps(monkeypatch, lambda model: seen.append(
        (model._variant, os.environ.get("OT_ADAMW_IMPL"), os.environ.get("OT_LCE_CHUNK_ROWS"))))
    monkeypatch.setenv("OT_ADAMW_IMPL", "v8")          # a stale value: the bench sets / clears
    variants = ["patched_compile", "patched_compile_ot_adamw", "patched_compile_ot_adamw_exact",
                "patched_compile_lce8192", "patched_compile_levers"]
    case = dict(kind="ab", cfg="tiny", batch=1, seq=16, tag="levers", interleave=True,
                variants=variants)
    rows, _ = bt.run_ab(case, args(ab_rounds=2, ab_steps=1), torch.device("cpu"),
                        torch.float32)
    assert [r["status"] for r in rows] == ["ok"] * 5, rows
    want = {v: (bt.VARIANT_ENV.get(v, {}).get("OT_ADAMW_IMPL"),
                bt.VARIANT_ENV.get(v, {}).get("OT_LCE_CHUNK_ROWS")) for v in variants}
    assert {v for v, *_ in seen} == set(variants)
    for v, impl, rows_env in seen:
        assert (impl, rows_env) == want[v], (v, impl, rows_env)
    for v in variants:
        lib = v in ("patched_compile_ot_adamw", "patched_compile_ot_adamw_exact",
                    "patched_compile_levers")
        assert (opt_of[v] is OtAdamW) == lib, (v, opt_of[v])
    by = {r["variant"]: r for r in rows}
    assert "round_ratios" not in by["patched_compile"]
    assert set(by["patched_compile_ot_adamw"]["round_ratios"]) == {"patched_compile"}
    assert set(by["patched_compile_ot_adamw_exact"]["round_ratios"]) == {
        "patched_compile", "patched_compile_ot_adamw"}
    assert set(by["patched_compile_lce8192"]["round_ratios"]) == {"patched_compile"}
    assert set(by["patched_compile_levers"]["round_ratios"]) == {
        "patched_compile", "patched_compile_ot_adamw"}
    rec = bt.build_record(rows, None, None, argparse.Namespace(
        device_name="CPU", commit="x", command="test"))
    ops = {r["op"] for r in rec["rows"]}
    for v in variants:
        assert f"train_step ({bt.VARIANTS[v]})" in ops, v


def test_levers_groups_and_ab_variants():
    """Groups 13 (1.5 B) and 14 (0.54 B): the optimizer alone, (13) the fused loss alone,
    (14) the attention alone, then the interleaved levers A/B (with the library's attention
    forced under compile); --ab-variants keeps the other kinds of the group."""
    plan = bt.plan(quick=False)
    assert [c.get("kind") for c in plan[13]] == ["adamw", "lce", "ab"]
    assert [c.get("kind") for c in plan[14]] == ["adamw", "attention", "ab"]
    assert bt.FUSED_ATTENTION["patched_compile_ot_adamw_lib_attn"] is True
    v = "patched_compile_ot_adamw_lib_attn"
    assert bt._compiled(v) and bt._library_adamw(v)
    for g, cfg in ((plan[13], "1.5b"), (plan[14], "0.54b")):
        ab = g[-1]
        assert ab["cfg"] == cfg and ab["tag"] == "levers" and ab["interleave"]
        assert (ab["rounds"], ab["steps"]) == (12, 4)
        assert set(bt.VARIANT_ENV) <= set(ab["variants"])
        assert all(v in bt.VARIANTS for v in ab["variants"])
    kept = bt._keep_ab_variants(
        [(13, plan[13])], ["hf_sdpa_compile", "patched_compile", "patched_compile_levers"])
    assert [c.get("kind") for c in kept[0][1]] == ["adamw", "lce", "ab"]
    assert kept[0][1][-1]["variants"] == ["hf_sdpa_compile", "patched_compile",
                                          "patched_compile_levers"]
    est = bt._estimate_s(plan[13], False, "layers", 12, 4)
    assert 60 < est < 240, est   # with HF sdpa eager (the memory base) since 2026-12-01


def test_run_adamw_times_every_optimizer_and_restores_the_switch(monkeypatch):
    """The optimizer alone (kind "adamw"): torch's AdamW and the library's under each
    OT_ADAMW_IMPL, the switch as it was afterwards; on the CPU only the host times (no
    CUDA events)."""
    monkeypatch.setenv("OT_ADAMW_IMPL", "something")
    res = bt.run_adamw(dict(kind="adamw", cfg="tiny"), args(quick=True),
                       torch.device("cpu"), torch.bfloat16)
    assert "error" not in res, res
    assert [r["optimizer"] for r in res["rows"]] == ["torch fused", "library", "library v4",
                                                     "library exact"]
    assert all(r["host_ms"] is not None and "ms" not in r for r in res["rows"])
    assert res["params"] > 0 and res["bytes_per_step"] == 14 * res["params"]
    assert os.environ["OT_ADAMW_IMPL"] == "something"


def test_markdown_prints_the_adamw_rows(tmp_path, capsys):
    """The optimizer-alone record (a list under "adamw") reaches the docs' markdown."""
    rec = bt.build_record([], None, None, argparse.Namespace(
        device_name="CPU", commit="x", command="test"), dict(adamw=[dict(
            kind="adamw", case="1.5b", params=1.5e9, tensors=147, bytes_per_step=21e9,
            rows=[dict(optimizer="torch fused", ms=8.9, TB_per_s=2.36, host_ms=1.0),
                  dict(optimizer="library fast", ms=5.5, TB_per_s=3.8, host_ms=1.2)])]))
    path = tmp_path / "training.json"
    path.write_text(json.dumps(rec))
    bt.markdown(str(path))
    md = capsys.readouterr().out
    assert "AdamW step alone (1.5b parameters: 1.50 B in 147 tensors" in md, md
    assert "library fast 5.50 ms (3.80 TB/s)" in md, md


def test_gemm_by_shape_groups_products_by_input_shape():
    """_gemm_by_shape: the profiled steps' matrix products by (op, input shapes), calls per
    step, largest first, their sum; other ops left out."""
    from torch.profiler import ProfilerActivity, profile
    a, b = torch.randn(64, 32), torch.randn(32, 48)
    c, bias = torch.randn(16, 32), torch.randn(48)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        for _ in range(2):             # two "steps"
            for _ in range(3):
                torch.mm(a, b)
            torch.addmm(bias, c, b)
            torch.relu(a)
    got = bt._gemm_by_shape(prof, 2, cuda=False)
    by = {(r["op"], tuple(map(tuple, r["shapes"]))): r for r in got["rows"]}
    assert by[("aten::mm", ((64, 32), (32, 48)))]["calls"] == 3
    assert by[("aten::addmm", ((48,), (16, 32), (32, 48)))]["calls"] == 1
    assert all(r["op"] in bt.GEMM_OPS for r in got["rows"]), got["rows"]
    assert got["time"] == "host" and got["rows_left_out"] == 0
    ms = [r["ms_per_step"] for r in got["rows"]]
    assert ms == sorted(ms, reverse=True) and got["ms_per_step"] == pytest.approx(sum(ms))


def test_use_attention_sets_patch_globals_per_variant(monkeypatch):
    """_use_attention: a VARIANT_PATCH_GLOBALS variant gets its value of the patch's global
    (glu2: SWIGLU_RECOMPUTE False), every other variant the patch's own value back."""
    from ops_transformer import patch as ot_patch
    import ops_transformer as ot
    monkeypatch.setattr(ot.config, "fused_attention", ot.config.fused_attention)
    monkeypatch.setattr(ot_patch, "FUSE_LAYER_ADDS", ot_patch.FUSE_LAYER_ADDS)
    monkeypatch.setattr(ot_patch, "SWIGLU_RECOMPUTE", True)
    monkeypatch.setattr(bt, "_PATCH_GLOBAL_DEFAULTS", {})
    bt._use_attention("patched_compile_ot_adamw_glu2")
    assert ot_patch.SWIGLU_RECOMPUTE is False
    bt._use_attention("patched_compile_ot_adamw")
    assert ot_patch.SWIGLU_RECOMPUTE is True
