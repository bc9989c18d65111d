#!/usr/bin/env python3
"""bench_training.py -- a HF transformers LlamaForCausalLM training step (forward,
backward, AdamW) in bf16, as HF runs it and patched with ops_transformer: tokens/s and
peak memory, plus loss curves of the two from the same initialization and data.

  python3 bench/bench_training.py [--json bench/results/training.json] [--budget-s 300]
  python3 bench/bench_training.py --quick --device cpu     # smoke test (tiny model)

Variants per case: HF eager attention, HF sdpa, HF sdpa + torch.compile, patched
(ops_transformer.patch_llama, config.fused_attention="auto": the library's attention or
torch's SDPA, whichever "auto" picks for the shape), patched + torch.compile, and the
patched model with the attention "auto" did not pick: torch's SDPA
(fused_attention=False) or the library's (True) -- the attention kernel's share. Also:
the attention alone at the models' shapes (fwd + bwd: the library vs torch's SDPA as
HF calls it, with each of torch's backends), and a profile of a patched step (GPU busy
fraction, kernel time by kind, host time per custom-op call). Cases (shared/BASELINE.md):
0.54b (hidden 2048, 8 layers, vocab 32000) at batch 4 x 2048; 1.5b (hidden 2048, 16
layers, 32 / 8 heads, vocab 128256) at 4 x 2048; long context: 0.54b at 1 x 16384.

Robustness: every group of cases runs in its own subprocess with a timeout (a crash
or hang loses that group only; torch.compile state does not leak between variants);
each case is in try/except (an out-of-memory is recorded as "oom"); the whole run
keeps to --budget-s (cases that would not fit are recorded as "skipped (budget)");
the JSON file is rewritten after every group, so an interrupted run keeps its rows.

Method: parameters, gradients and AdamW states (torch fused AdamW for every variant)
in bf16, use_cache=False, random tokens, labels = inputs. The plan's first groups are
balanced A/B cases (run_ab, the measurement of record): a case's variants -- HF's and
ours, eager and compiled -- built and warmed up (3 steps, 5 with torch.compile) in one
process, then --ab-rounds rounds (default 4) in which every variant runs one untimed
lead-in step and --ab-steps steps (default 5) with a CUDA event between consecutive
steps, the order reversed every other round; a variant's step time is the median of its
rounds x steps timings (shared/BENCH.md), tokens/s = tokens per step / that median; peak
memory = its parameters and optimizer states + the most its windows allocated above
what was held before them. Groups 11 / 12 (FUSE_LAYER_ADDS) interleave the variants
step by step instead (run_ab: each round a lead-in pass and passes of one step per
variant, alternating order; per-round ratios with a bootstrap interval; clocks per
variant from the NVML samples taken during its steps) and spy on the fused adds: a
variant whose steps did not take its path is not reported (status path_not_taken).
Groups 13 / 14 (prepared 2026-12-01) interleave the levers of the
compiled step the same way -- the library's AdamW (its default kernel, "fast" since
2026-12-01's evening; OT_ADAMW_IMPL=v4 / exact), the fused loss in one 8192-token chunk (OT_LCE_CHUNK_ROWS) and both -- after
the optimizer step alone (run_adamw) and, at 1.5 B, the fused loss alone per chunk; the
bench sets or clears those switches before each step of a variant (VARIANT_ENV).
The later groups measure one variant per case as before
(run_case): warm-up steps, then --steps timed steps between device synchronizations,
tokens/s = tokens of the timed steps / their wall time, peak memory =
torch.cuda.max_memory_allocated over them. Model FLOPs per token: 6 N (N = non-embedding parameters + the LM
head) + 6 L S d (causal attention, forward + backward), reported as model TFLOP/s and
as a fraction of a bf16 GEMM (8192^3) measured in the same run.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import subprocess
import sys
import time
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

sys.path.insert(0, os.path.join(ROOT, "examples"))
from train_llama import CONFIGS  # noqa: E402  (tiny, 0.54b, 1.5b: one definition)

VARIANTS = {
    "hf_eager": "HF eager",
    "hf_sdpa": "HF sdpa",
    "hf_sdpa_compile": "HF sdpa + torch.compile",
    "patched": "patched",
    "patched_compile": "patched + torch.compile",
    "patched_torch_attn": "patched, torch SDPA attention",
    "patched_lib_attn": "patched, library attention",
    "patched_other": "patched, the attention 'auto' did not pick",
    "patched_ot_adamw": "patched + library AdamW",
    "patched_compile_ot_adamw": "patched + torch.compile + library AdamW",
    # patch_llama(compiled_ops=...): which library elementwise ops run under torch.compile
    "patched_compile_ops_all": "patched + torch.compile, library rms_norm + rope + swiglu",
    "patched_compile_no_rms_norm": "patched + torch.compile, torch's RMSNorm (+ add)",
    "patched_compile_no_rope": "patched + torch.compile, torch's RoPE",
    "patched_compile_no_swiglu": "patched + torch.compile, torch's SwiGLU",
    "patched_compile_ops_none": "patched + torch.compile, torch's RMSNorm, RoPE, SwiGLU",
    # patch.FUSE_LAYER_ADDS (off by default): the layer's two residual adds fused
    # (the down projection's GEMM epilogue; the input norm's backward)
    "patched_fused_adds": "patched, residual adds fused",
    "patched_compile_fused_adds": "patched + torch.compile, residual adds fused",
    # the levers of issue 8's 1.5 B compiled step (prepared 2026-12-01, groups 13 / 14):
    # the library's AdamW with its opt-in kernels (OT_ADAMW_IMPL) and the fused loss in
    # one chunk of 8192 tokens (OT_LCE_CHUNK_ROWS), each alone and together
    "patched_compile_ot_adamw_v4": "patched + torch.compile + library AdamW (v4 kernel)",
    "patched_compile_ot_adamw_exact": "patched + torch.compile + library AdamW (exact kernel)",
    "patched_compile_lce8192": "patched + torch.compile, fused loss in 8192-token chunks",
    "patched_compile_levers": "patched + torch.compile + library AdamW (fast kernel), "
                              "fused loss in 8192-token chunks",
    # the compiled step with the library's attention forced (fused_attention=True) where
    # 'auto' picks torch's SDPA (cuDNN at both configs' shapes): after the backward's
    # 16-byte dK / dV stores (2026-12-01) the library's fwd + bwd may beat it
    "patched_compile_ot_adamw_lib_attn": "patched + torch.compile + library AdamW, "
                                         "library attention",
    # the MLP backward before 2026-12-01's glu_backward_recompute (glu, then glu_backward;
    # compiled, the forward's product kept): the A/B of its memory / time trade
    "patched_compile_ot_adamw_glu2": "patched + torch.compile + library AdamW, MLP backward "
                                     "by glu + glu_backward",
}
# the environment switches a variant runs under (set by _use_attention before each of its
# steps; the other variants run with them unset): the library reads them per call
VARIANT_ENV = {
    "patched_compile_ot_adamw_v4": {"OT_ADAMW_IMPL": "v4"},
    "patched_compile_ot_adamw_exact": {"OT_ADAMW_IMPL": "exact"},
    "patched_compile_lce8192": {"OT_LCE_CHUNK_ROWS": "8192"},
    "patched_compile_levers": {"OT_ADAMW_IMPL": "fast", "OT_LCE_CHUNK_ROWS": "8192"},
}
_VARIANT_ENV_KEYS = sorted({k for e in VARIANT_ENV.values() for k in e})
# the patch's module globals a variant runs under (set by _use_attention before each of its
# steps; the other variants get the patch's own values). A switch that
# changes what torch.compile traces must be one of these, not an environment variable read
# inside a traced backward: dynamo guards on the globals the patched forward reads, so each
# setting gets its own compiled graph (an environment read at trace time let the first
# variant's graph serve both -- glu2's first A/B, 2026-12-01, compiled 0 graphs of its own)
VARIANT_PATCH_GLOBALS = {
    "patched_compile_ot_adamw_glu2": {"SWIGLU_RECOMPUTE": False},
}
_PATCH_GLOBAL_DEFAULTS = {}  # the patch's own values of those globals, taken at first use


def _library_adamw(variant):
    """Whether a variant steps with ops_transformer.optim.AdamW (else torch's fused AdamW)."""
    return "_ot_adamw" in variant or variant.endswith("_levers")
# patch_llama's compiled_ops per variant ("auto", the default, unless named here)
COMPILED_OPS = {"patched_compile_ops_all": "all", "patched_compile_ops_none": "none",
                "patched_compile_no_rms_norm": ("rope", "swiglu"),
                "patched_compile_no_rope": ("rms_norm", "swiglu"),
                "patched_compile_no_swiglu": ("rms_norm", "rope")}


def _compiled(variant):
    """Whether a variant runs torch.compile (hf_sdpa_compile, patched_compile,
    patched_compile_ot_adamw)."""
    return "_compile" in variant
# config.fused_attention per patched variant: "auto" (the default) unless named here
FUSED_ATTENTION = {"patched_torch_attn": False, "patched_lib_attn": True,
                   "patched_compile_ot_adamw_lib_attn": True}


def _use_attention(variant):
    """ops_transformer.config.fused_attention, patch.FUSE_LAYER_ADDS, the patch globals of
    VARIANT_PATCH_GLOBALS (defaults where the variant names none) and the environment
    switches of VARIANT_ENV (set where the variant names them, unset otherwise) for a
    patched variant. All are process-wide and read per call: run_ab sets them again before
    each variant's window or step (its variants share the process; _build left the last
    built one's)."""
    import ops_transformer as ot
    from ops_transformer import patch as ot_patch
    ot.config.fused_attention = FUSED_ATTENTION.get(variant, "auto")
    ot_patch.FUSE_LAYER_ADDS = variant.endswith("_fused_adds")
    for k in sorted({k for g in VARIANT_PATCH_GLOBALS.values() for k in g}):
        default = _PATCH_GLOBAL_DEFAULTS.setdefault(k, getattr(ot_patch, k))
        setattr(ot_patch, k, VARIANT_PATCH_GLOBALS.get(variant, {}).get(k, default))
    env = VARIANT_ENV.get(variant, {})
    for k in _VARIANT_ENV_KEYS:
        if k in env:
            os.environ[k] = env[k]
        else:
            os.environ.pop(k, None)


# the models' attention calls (label, batch, seq, heads, kv heads, head dim), causal
ATTN_SHAPES = [("0.54b 4x2048", 4, 2048, 16, 16, 128), ("1.5b 4x2048", 4, 2048, 32, 8, 64),
               ("GQA D128 4x2048", 4, 2048, 32, 8, 128), ("0.54b 1x16384", 1, 16384, 16, 16, 128)]


def case_name(cfg, batch, seq, tag=None):
    """A case's name in the rows ("0.54b bf16 4x2048"); an A/B group with a tag (group 3:
    "compiled_ops") gets its own case ("0.54b bf16 4x2048 [compiled_ops]"), so that its
    rows -- HF sdpa + torch.compile among them -- stay apart from another group's rows of
    the same shape in one record."""
    return f"{cfg} bf16 {batch}x{seq}" + (f" [{tag}]" if tag else "")


def plan(quick):
    """Groups of cases, most important first; each group is one subprocess."""
    if quick:
        c = dict(cfg="tiny", batch=2, seq=64)
        return [
            [dict(c, kind="ab", variants=["hf_sdpa", "patched", "hf_sdpa_compile",
                                          "patched_compile", "patched_compile_ops_none"])],
            [dict(kind="attention"), dict(kind="lce"), dict(c, variant="hf_sdpa"),
             dict(c, variant="patched"),
             dict(c, variant="patched_other"), dict(c, variant="patched_ot_adamw"),
             dict(c, variant="hf_eager"),
             dict(c, kind="profile", variant="patched")],
            [dict(kind="curve", cfg="tiny", batch=2, seq=64)],
            [dict(c, variant="hf_sdpa_compile"), dict(c, variant="patched_compile"),
             dict(c, variant="patched_compile_ot_adamw")],
        ]
    a = dict(cfg="0.54b", batch=4, seq=2048)
    b = dict(cfg="1.5b", batch=4, seq=2048)
    lc = dict(cfg="0.54b", batch=1, seq=16384)
    # long context where HF sdpa runs out of memory on the H200 (141 GB): the 1.5 B
    # config (vocab 128256) at 1 x 65536 -- HF's layer activations ~2 MB a token (36.1 GB
    # at 4 x 2048 less 12 GB of weights / gradients / AdamW states and ~10 GB of loss)
    # ~130 GB, then its loss' bf16 logits, float32 copy and log-softmax (65536 x 128256:
    # 17 + 34 + 34 GB): ~215 GB; patched ~0.75 MB a token (18.0 GB at 4 x 2048): ~60 GB.
    # At 1 x 32768 HF's estimate (~120 GB) is too close to the card to be sure of an OOM.
    # One warm-up and two timed steps (~3 s a step at ~450 TFLOP/s); HF first, so that
    # the peak at its OOM is its own
    lx = dict(cfg="1.5b", batch=1, seq=65536, warmup=1, steps=2)
    # the eager cases of the targets in the first group (one process start-up);
    # "patched_other" is the patched model with the attention "auto" did not pick;
    # profiles: the patched 0.54 B step; in a later group HF sdpa's (per-kind GPU time
    # side by side) and the long-context and 1.5 B patched steps
    # groups 0-3, the measurement of record: each case's variants in one process, in a
    # balanced order (run_ab): the targets' peers (HF sdpa, HF sdpa + torch.compile) and
    # ours; group 3 the compiled step per choice of patch_llama(compiled_ops=...). The
    # groups after them: the earlier one-variant-at-a-time cases (run_case), the
    # attention and loss alone, profiles, the loss curve.
    ab = ["hf_sdpa", "patched", "hf_sdpa_compile", "patched_compile"]
    return [
        [dict(kind="ceiling"), dict(a, kind="ab", variants=ab)],
        [dict(b, kind="ab", variants=ab)],
        [dict(lc, kind="ab", variants=["hf_sdpa", "patched"]),
         dict(lx, variant="hf_sdpa"), dict(lx, variant="patched")],
        [dict(a, kind="ab", tag="compiled_ops", variants=[
            "hf_sdpa_compile", "patched_compile_ops_all", "patched_compile_no_rms_norm",
            "patched_compile_no_rope", "patched_compile_no_swiglu",
            "patched_compile_ops_none"])],
        [dict(kind="ceiling"), dict(kind="attention"),
         dict(a, variant="hf_sdpa"), dict(a, variant="patched"), dict(kind="lce"),
         dict(a, variant="patched_ot_adamw"), dict(a, variant="patched_other"),
         dict(b, variant="hf_sdpa"), dict(b, variant="patched"),
         dict(b, variant="patched_ot_adamw"), dict(lc, variant="hf_sdpa"),
         dict(lc, variant="patched"), dict(a, kind="profile", variant="patched")],
        # the compiled pair of a config in one group: one compile mode for both
        # (+ the library's AdamW: inductor's cache serves its compile)
        [dict(a, variant="hf_sdpa_compile"), dict(a, variant="patched_compile"),
         dict(a, variant="patched_compile_ot_adamw")],
        [dict(b, variant="hf_sdpa_compile"), dict(b, variant="patched_compile"),
         dict(b, variant="patched_compile_ot_adamw")],
        [dict(a, kind="profile", variant="hf_sdpa"), dict(lc, kind="profile", variant="patched"),
         dict(b, kind="profile", variant="patched")],
        [dict(b, variant="patched_other"), dict(lc, variant="patched_other")],
        [dict(kind="curve", cfg="0.54b", batch=4, seq=2048)],
        [dict(a, variant="hf_eager"), dict(lc, variant="hf_eager")],
        # 11, 12: patch.FUSE_LAYER_ADDS (off by default; run of 1c2f893) against the default,
        # eager and compiled, with HF sdpa + compile as the compiled ratio's peer (0.54 B,
        # 1.5 B); interleaved step by step, 12 rounds of 4 passes (48 timed steps a
        # variant: the per-round ratios' interval, run_ab), the fused paths spied on
        [dict(a, kind="ab", tag="fused_adds", interleave=True, rounds=12, steps=4, variants=[
            "hf_sdpa_compile", "patched_compile", "patched_compile_fused_adds", "patched",
            "patched_fused_adds"])],
        [dict(b, kind="ab", tag="fused_adds", interleave=True, rounds=12, steps=4, variants=[
            "hf_sdpa_compile", "patched_compile", "patched_compile_fused_adds", "patched",
            "patched_fused_adds"])],
        # 13, 14: the levers of the compiled step (prepared 2026-12-01, not yet run): the
        # optimizer step alone (torch's fused AdamW, the library's with each kernel) at the
        # config's parameters, the fused loss alone per chunk (8192 rows: one chunk), then
        # the compiled pair with the library's AdamW (default = fast / v4 / exact kernel), the
        # fused loss in one chunk of 8192 tokens, and both (fast + 8192), interleaved step
        # by step, 12 rounds of 4 passes (as 11 / 12); 1.5 B first. Since 2026-12-01 also
        # the library's attention forced (patched_compile_ot_adamw_lib_attn) and, in 14,
        # the attention alone at the models' shapes (library vs each torch backend); HF
        # sdpa eager too (the memory target's base: <= 0.6x its peak)
        [dict(b, kind="adamw"), dict(kind="lce", vocab=[128256]),
         dict(b, kind="ab", tag="levers", interleave=True, rounds=12, steps=4, variants=[
             "hf_sdpa", "hf_sdpa_compile", "patched_compile", "patched_compile_ot_adamw",
             "patched_compile_ot_adamw_v4", "patched_compile_ot_adamw_exact",
             "patched_compile_lce8192", "patched_compile_levers",
             "patched_compile_ot_adamw_lib_attn", "patched_compile_ot_adamw_glu2"])],
        [dict(a, kind="adamw"), dict(kind="attention"),
         dict(a, kind="ab", tag="levers", interleave=True, rounds=12, steps=4, variants=[
             "hf_sdpa", "hf_sdpa_compile", "patched_compile", "patched_compile_ot_adamw",
             "patched_compile_ot_adamw_v4", "patched_compile_ot_adamw_exact",
             "patched_compile_lce8192", "patched_compile_levers",
             "patched_compile_ot_adamw_lib_attn", "patched_compile_ot_adamw_glu2"])],
    ]


# ---------------------------------------------------------------------------------
# Worker (one subprocess per group)
# ---------------------------------------------------------------------------------

def _flops_per_token(cfg, seq):
    h, L, f, V = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["intermediate_size"], \
        cfg["vocab_size"]
    kvh = cfg["num_key_value_heads"] * h // cfg["num_attention_heads"]
    per_layer = 2 * h * h + 2 * h * kvh + 3 * h * f        # q, o, k, v, gate, up, down
    n = L * per_layer + V * h                                # + lm_head
    return 6 * n + 6 * L * seq * h                           # causal attention: half of 12


def _build(case, device, dtype, seed, compile_mode="model", compile_options=None):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = dict(CONFIGS[case["cfg"]])
    variant = case.get("variant", "patched")
    attn = "eager" if variant == "hf_eager" else "sdpa"
    config = LlamaConfig(**cfg, max_position_embeddings=max(case["seq"], 128),
                         tie_word_embeddings=False, attn_implementation=attn,
                         use_cache=False)
    torch.manual_seed(seed)
    prev = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(prev)
    model.train()
    info = {}
    if variant.startswith("patched"):
        import ops_transformer as ot
        from ops_transformer import patch as ot_patch
        # patched_torch_attn / patched_lib_attn: the attention torch's SDPA / the
        # library's (config.fused_attention False / True); the other variants "auto"
        _use_attention(variant)
        ot.patch_llama(model, compiled_ops=COMPILED_OPS.get(variant, "auto"))
        if _compiled(variant):
            info["compiled_ops"] = sorted(ot_patch._compiled_ops(
                COMPILED_OPS.get(variant, "auto")))
        info["lm_loss_impl"] = "library" if ot_patch._library_lce_usable(device) \
            else "chunked"
    fwd = model
    if _compiled(variant):
        torch._dynamo.utils.counters.clear()
        if compile_mode == "layers":
            # regional compilation: each decoder layer (one compiled graph serves all
            # of them), the LM head and loss stay eager -- compiles in a fraction of the
            # time of the whole model
            for layer in model.model.layers:
                layer.compile(**(compile_options or {}))
        else:
            fwd = torch.compile(model, **(compile_options or {}))
        info["compile_mode"] = compile_mode
        if compile_options:
            info["compile_options"] = compile_options
    return model, fwd, cfg, info


def _optimizer(model, device, variant=""):
    """torch's fused AdamW (every variant: the comparison is of the model), or for
    patched_ot_adamw, patched_compile_ot_adamw(_v4 / _fast) and patched_compile_levers
    ops_transformer.optim.AdamW (the library's AdamW step, same hyperparameters and bf16
    moments; its kernel by OT_ADAMW_IMPL, VARIANT_ENV)."""
    import torch
    kw = dict(lr=1e-4, weight_decay=0.1, betas=(0.9, 0.95))
    if _library_adamw(variant):
        from ops_transformer.optim import AdamW
        return AdamW(model.parameters(), **kw)
    return torch.optim.AdamW(model.parameters(), fused=device.type == "cuda", **kw)


def _sync(device):
    import torch
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _release(device):
    """After a case: collect its dropped model / optimizer and return the cached blocks
    (the next case's peak memory starts from what is really held)."""
    import torch
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _step(fwd, model, opt, x):
    loss = fwd(input_ids=x, labels=x).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.detach()


def _auto_decisions(seq=None):
    """fused_attention='auto''s decisions so far (those of seq's length bucket when
    given): {"D x Hq / Hkv, lengths": "library" | "torch SDPA", with the backend torch's
    SDPA would run}."""
    from ops_transformer import patch as ot_patch
    b = None if seq is None else ot_patch._len_bucket(seq)
    def lengths(b):           # the length bucket (bit length b): 2^(b-1) .. 2^b - 1
        return f"S {1 << (b - 1)}-{(1 << b) - 1}"
    return {f"D{k[3]} {k[4]}/{k[5]}{' causal' if k[6] else ''} {lengths(k[7])}":
            f"{'library' if v[0] else 'torch SDPA'} (torch: {v[1]})"
            for k, v in ot_patch._AUTO.items() if b is None or k[7] == b}


def _other_variant(case, device, dtype):
    """patched_other: the attention "auto" did not pick for this case's shape (its
    decision made by the probe of a patched model of the same config)."""
    import torch
    from ops_transformer import patch as ot_patch
    cfg = CONFIGS[case["cfg"]]
    D = cfg["hidden_size"] // cfg["num_attention_heads"]
    dev = torch.device(device.type, torch.cuda.current_device()) if device.type == "cuda" \
        else device
    key = (dev.type, dev.index, dtype, D, cfg["num_attention_heads"],
           cfg["num_key_value_heads"], True, ot_patch._len_bucket(case["seq"]))
    if key not in ot_patch._AUTO and device.type == "cuda":
        ot_patch._probe_auto(dev, dtype, D, cfg["num_attention_heads"],
                             cfg["num_key_value_heads"], lengths=(case["seq"],))
    got = ot_patch._AUTO.get(key)
    return "patched_torch_attn" if got is not None and got[0] else "patched_lib_attn"


class _Clocks:
    """The GPU's SM clock, power and throttle reasons sampled (NVML, every `every` s, in a
    thread) while the block runs: whether two variants' windows ran at the same clocks
    (an H200 at its power limit lowers them, more for a step that keeps it busier).
    The power is nvmlDeviceGetPowerUsage's: on Ampere (but GA100) and later an average
    over the last second, so over a shorter window it is mostly what ran before. The
    device's NVML index is taken to be its CUDA index (true on one visible GPU).
    `result` is None where NVML is unavailable (no pynvml, or not CUDA)."""

    # NVML's clocks-event reasons (nvmlClocksEventReason*) worth naming
    _REASONS = {0x1: "idle", 0x4: "sw power cap", 0x8: "hw slowdown",
                0x20: "sw thermal", 0x40: "hw thermal", 0x80: "hw power brake"}

    def __init__(self, device, every=0.02):
        self.device, self.every, self.result = device, every, None
        self._samples, self._reasons, self._stop, self._thread = [], 0, None, None
        self.timed_samples = []               # (time.perf_counter(), SM MHz)

    def __enter__(self):
        import threading
        if self.device.type != "cuda":
            return self
        try:
            import pynvml
            pynvml.nvmlInit()
            idx = self.device.index if self.device.index is not None else 0
            self._h = pynvml.nvmlDeviceGetHandleByIndex(idx)
            self._nvml = pynvml
            self._sample()
        except Exception:  # noqa: BLE001  (no NVML: no clocks recorded)
            return self
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _sample(self):
        n = self._nvml
        self._samples.append((n.nvmlDeviceGetClockInfo(self._h, n.NVML_CLOCK_SM),
                              n.nvmlDeviceGetPowerUsage(self._h) / 1e3))
        # (the host time of each sample: run_ab's interleaved rounds attribute a sample to
        # the step the GPU ran then, from the steps' CUDA events)
        self.timed_samples.append((time.perf_counter(), self._samples[-1][0]))
        try:
            self._reasons |= n.nvmlDeviceGetCurrentClocksThrottleReasons(self._h)
        except Exception:  # noqa: BLE001
            pass

    def _run(self):
        while not self._stop.wait(self.every):
            try:
                self._sample()
            except Exception:  # noqa: BLE001
                return

    def __exit__(self, *exc):
        if self._thread is None:
            return False
        self._stop.set()
        self._thread.join()
        clk = [c for c, _ in self._samples]
        pw = [w for _, w in self._samples]
        self.result = dict(sm_MHz_mean=round(sum(clk) / len(clk)), sm_MHz_min=min(clk),
                           sm_MHz_max=max(clk), power_W_mean=round(sum(pw) / len(pw)),
                           samples=len(clk),
                           throttle=[v for k, v in self._REASONS.items() if self._reasons & k])
        return False


class _FusedSeen:
    """What the patched decoder layers decided about patch.FUSE_LAYER_ADDS in the steps
    since the last :func:`_seen_take`: attributes set by the spies of
    :func:`_install_fused_spies` (norm_fused / norm_unfused = the reason, mlp_fused /
    mlp_unfused, down_residual / down_plain). The spies only write them, never read them,
    so that under torch.compile dynamo replays the writes after every compiled call (a
    side effect of the traced code: what the trace decided, each step) and guards on none
    of them; a list's append would guard the list's length and recompile every step
    (torch 2.11 and 2.15 on the CPU)."""


_SEEN = _FusedSeen()
_SPIES = {}              # the patch module's originals while the spies are installed


def _install_fused_spies():
    """Wrap the patch's FUSE_LAYER_ADDS decisions (the functions the tests spy on, looked
    up as module globals at call time, traced by dynamo): _keep_input_why (the input
    norm keeps the layer input: None, else the failing condition), _fuse_mlp_ok (the MLP
    called with the residual) and _SwiGLUDown (the down projection's GEMM given the
    residual: the add in its epilogue). Idempotent; :func:`_remove_fused_spies` undoes
    it. Installed before any model of the A/B is built and kept until its end (replacing
    a global that compiled code has read would recompile it)."""
    from ops_transformer import patch as ot_patch
    if _SPIES:
        return
    why, mlp_ok, down = ot_patch._keep_input_why, ot_patch._fuse_mlp_ok, ot_patch._SwiGLUDown
    seen = _SEEN

    def keep_input_why(norm, x):
        r = why(norm, x)
        if r is None:
            seen.norm_fused = True
        else:
            seen.norm_unfused = r
        return r

    def fuse_mlp_ok(mlp):
        ok = mlp_ok(mlp)
        if ok:
            seen.mlp_fused = True
        else:
            seen.mlp_unfused = True
        return ok

    class SwiGLUDown:
        @staticmethod
        def apply(gate, up, weight, bias, residual=None, *rest):
            # (rest: whatever _SwiGLUDown takes after the residual -- since 47d015b the
            # recompute switch -- handed on as it came)
            if residual is None:
                seen.down_plain = True
            else:
                seen.down_residual = True
            return down.apply(gate, up, weight, bias, residual, *rest)
    _SPIES.update(_keep_input_why=why, _fuse_mlp_ok=mlp_ok, _SwiGLUDown=down)
    ot_patch._keep_input_why = keep_input_why
    ot_patch._fuse_mlp_ok = fuse_mlp_ok
    ot_patch._SwiGLUDown = SwiGLUDown
    vars(_SEEN).clear()


def _remove_fused_spies():
    from ops_transformer import patch as ot_patch
    for k, v in _SPIES.items():
        setattr(ot_patch, k, v)
    _SPIES.clear()


def _seen_take():
    """The spies' record since the last call (and clear it): a dict, {} where no patched
    decoder layer ran."""
    got = dict(vars(_SEEN))
    vars(_SEEN).clear()
    return got


def _fused_verdict(variant, records):
    """Whether a variant's steps took the path its name says: for a *_fused_adds variant
    every record (the warm-up's, each timed step's or window's) has both halves fused in
    every layer -- the input norm keeping the layer input, the MLP called with the
    residual and its down projection given it -- and no unfused layer; for another
    patched variant, no fused half anywhere (an A/B of two identical paths is an A/A).
    Returns None when it did, else why not (the first failing record's)."""
    want = variant.endswith("_fused_adds")
    for i, r in enumerate(records):
        where = "warm-up" if i == 0 else f"timed record {i}"
        if want:
            miss = [h for h, ok, bad in (("input norm", "norm_fused", "norm_unfused"),
                                         ("MLP residual", "mlp_fused", "mlp_unfused"),
                                         ("down GEMM residual", "down_residual", "down_plain"))
                    if not r.get(ok) or r.get(bad)]
            if miss:
                return (f"{where}: not fused: {', '.join(miss)}"
                        + (f" (input norm: {r['norm_unfused']!r})" if r.get("norm_unfused")
                           else "") + f"; seen {sorted(r)}")
        elif any(r.get(k) for k in ("norm_fused", "mlp_fused", "down_residual")):
            return f"{where}: a fused add ran in a variant without them; seen {sorted(r)}"
    return None


def _bootstrap_ci(values, n=2000, seed=0):
    """95% percentile bootstrap interval of the mean of values (resampled with
    replacement, a fixed seed: the same record gives the same interval)."""
    import random
    import statistics
    if len(values) < 2:
        return None
    rng = random.Random(seed)
    means = sorted(statistics.fmean(rng.choices(values, k=len(values))) for _ in range(n))
    return [means[int(0.025 * n)], means[int(0.975 * n) - 1]]


def _twins(v):
    """The variants a lever variant is also compared with in _round_ratios: a
    *_fused_adds variant's without the fused adds; the library-AdamW and VARIANT_ENV
    variants' default compiled step (patched_compile), and the opt-in AdamW kernels' and
    the VARIANT_PATCH_GLOBALS variants' the library-AdamW step (patched_compile_ot_adamw)."""
    if v.endswith("_fused_adds"):
        return [v[:-len("_fused_adds")]]
    out = []
    if v == "patched_compile_ot_adamw" or v in VARIANT_ENV:
        out.append("patched_compile")
    if v in VARIANT_PATCH_GLOBALS:
        out.append("patched_compile_ot_adamw")
    if VARIANT_ENV.get(v, {}).get("OT_ADAMW_IMPL"):
        out.append("patched_compile_ot_adamw")
    return out


def _round_ratios(rows):
    """Per-round tokens/s ratios of each measured row against its references -- the
    case's HF peer (HF sdpa + torch.compile for a compiled variant, else HF sdpa, else
    the first HF row) and its twins (_twins: for a *_fused_adds variant its variant
    without the fused adds; for a lever the default compiled step): each round's ratio is the reference's median step time in that round over the
    row's; with their median, mean, min, max and a 95% bootstrap interval of the mean
    (the call's within-call spread of the ratio). Written into each row as
    round_ratios {reference variant: {...}}."""
    import statistics
    by = {r["variant"]: r for r in rows if r.get("round_ms")}
    hf = [v for v in by if v.startswith("hf")]
    for v, r in by.items():
        refs = []
        if not v.startswith("hf") and hf:
            pref = "hf_sdpa_compile" if _compiled(v) else "hf_sdpa"
            refs.append(pref if pref in by else hf[0])
        refs += [t for t in _twins(v) if t in by]
        out = {}
        for ref in refs:
            a, b = by[ref]["round_ms"], r["round_ms"]
            per = [x / y for x, y in zip(a, b) if x and y]
            if not per:
                continue
            out[ref] = dict(per_round=[round(x, 4) for x in per],
                            median=statistics.median(per), mean=statistics.fmean(per),
                            min=min(per), max=max(per),
                            ci95=_bootstrap_ci(per))
        if out:
            r["round_ratios"] = out


def _dynamo_stats():
    import torch
    c = torch._dynamo.utils.counters
    return dict(graph_breaks=sum(c["graph_break"].values()),
                unique_graphs=c["stats"].get("unique_graphs", 0),
                recompiles=sum(v for k, v in c["recompiles"].items()) if "recompiles" in c
                else None)


def _setup(case, variant, res, args, device, dtype):
    """Build one variant's model (its build info and label suffixes into res), its optimizer
    and two batches of random tokens; returns (model, fwd, opt, cfg, data)."""
    import torch
    model, fwd, cfg, info = _build(case, device, dtype, args.seed, args.compile_mode,
                                   json.loads(args.compile_options or "{}"))
    res.update(info)
    if info.get("compile_mode") == "layers":
        res["label"] += " (per layer)"
    if info.get("compile_options"):
        res["label"] += " " + ", ".join(f"{k}={v}" for k, v in info["compile_options"].items())
    res["params"] = sum(p.numel() for p in model.parameters())
    opt = _optimizer(model, device, variant)
    gen = torch.Generator().manual_seed(args.seed + 1)
    data = [torch.randint(0, cfg["vocab_size"], (case["batch"], case["seq"]),
                          generator=gen).to(device) for _ in range(2)]
    return model, fwd, opt, cfg, data


def run_case(case, args, device, dtype):
    import torch
    variant = case["variant"]
    if variant == "patched_other":
        variant = _other_variant(case, device, dtype)
    res = dict(case=case_name(case["cfg"], case["batch"], case["seq"]), variant=variant,
               label=VARIANTS[variant], cfg=case["cfg"], batch=case["batch"], seq=case["seq"])
    model = opt = fwd = None
    phase = "build"
    if device.type == "cuda":
        # (the peak at an out-of-memory below is this case's, not an earlier one's)
        torch.cuda.reset_peak_memory_stats(device)
    try:
        t0 = time.perf_counter()
        model, fwd, opt, cfg, data = _setup(case, variant, res, args, device, dtype)
        compiled = _compiled(variant)
        # (a case may set its own warm-up / timed steps: the 1 x 65536 case, ~3 s a step)
        warm = case.get("warmup", 5 if compiled else 3) if not args.quick else 2
        steps = case.get("steps", args.steps) if not args.quick else 2
        for i in range(warm):
            phase = f"warm-up step {i + 1}"
            loss = _step(fwd, model, opt, data[i % 2])
        _sync(device)
        res["warmup_s"] = time.perf_counter() - t0
        phase = "timed steps"
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        _sync(device)
        with _Clocks(device) as clocks:
            t1 = time.perf_counter()
            issued = []
            for i in range(steps):
                loss = _step(fwd, model, opt, data[i % 2])
                issued.append(time.perf_counter())
            _sync(device)
            dt = time.perf_counter() - t1
        if clocks.result:
            res["clocks"] = clocks.result
        # the host's time to issue each timed step (the step's calls return before the
        # GPU runs them; a step that synchronizes -- HF's packed-sequence check -- waits
        # in it): with the window's time, whether the host or the GPU sets the pace
        res["host_issue_ms"] = [round((b - a) * 1e3, 3) for a, b in zip([t1] + issued, issued)]
        tokens = case["batch"] * case["seq"] * steps
        res.update(status="ok", steps=steps, step_ms=dt / steps * 1e3,
                   tokens_per_s=tokens / dt, loss=float(loss))
        res["model_TFLOPs"] = res["tokens_per_s"] * _flops_per_token(cfg, case["seq"]) / 1e12
        if device.type == "cuda" and args.steady:
            # steady state: the timed window above starts from an idle GPU (after a
            # synchronization), so its first step waits for the host wherever the host
            # launches a step's first layers slower than the GPU runs them; here one
            # unsynchronized step first, then CUDA events around the same number of
            # steps -- the GPU's time per step with the host ahead, as in a training
            # loop that does not synchronize every step (a variant that synchronizes in
            # its own step, as HF's packed-sequence check does, still pays for it)
            _step(fwd, model, opt, data[0])
            e0 = torch.cuda.Event(enable_timing=True)
            e1 = torch.cuda.Event(enable_timing=True)
            e0.record()
            for i in range(steps):
                loss = _step(fwd, model, opt, data[i % 2])
            e1.record()
            e1.synchronize()
            ms = e0.elapsed_time(e1) / steps
            res.update(steady_step_ms=ms, steady_tokens_per_s=case["batch"] * case["seq"] / ms * 1e3)
        if compiled:
            res["dynamo"] = _dynamo_stats()
        if variant.startswith("patched"):
            from ops_transformer import patch as ot_patch
            res["fused_attention"] = FUSED_ATTENTION.get(variant, "auto")
            res["auto_attention"] = _auto_decisions(case["seq"])
            res["library_ops"] = {f"{k[0]}{' ' + str(k[3]) if k[3] else ''}": v
                                  for k, v in ot_patch._USABLE.items()
                                  if k[1] == device.type and k[2] == dtype}
        if device.type == "cuda":
            res["peak_GB"] = torch.cuda.max_memory_allocated(device) / 1e9
        if _profile_key(case) in args.profile:
            # --profile: this model, after its timed steps (no second build / compile)
            res["_profile"] = dict(_profile(case, args, device, fwd, model, opt, data[0]),
                                   after_case=True)
    except Exception as e:  # noqa: BLE001  (recorded; the next case runs)
        msg = f"{type(e).__name__}: {e}".split("\n")[0][:600]
        if _is_oom(e):
            # where it ran out and what torch held then: the peak since the case began
            # (its model, optimizer, the step's tensors) and the card's capacity
            res.update(status="oom", error=msg, oom_phase=phase)
            if device.type == "cuda":
                res.update(peak_GB_at_oom=torch.cuda.max_memory_allocated(device) / 1e9,
                           device_total_GB=torch.cuda.get_device_properties(device)
                           .total_memory / 1e9)
        else:
            res.update(status="error", error=msg)
            traceback.print_exc(limit=6)
    finally:
        del model, opt, fwd
        _release(device)
        try:
            torch._dynamo.reset()
        except Exception:  # noqa: BLE001
            pass
    return res


def _is_oom(e):
    """An out-of-memory: torch's OutOfMemoryError, or an allocation failure that a
    library (cuBLAS' workspace, a cudaMalloc in an extension) reports as another error."""
    import torch
    msg = str(e).lower()
    return isinstance(e, torch.OutOfMemoryError) or "out of memory" in msg \
        or "alloc_failed" in msg


def _static_bytes(model, opt):
    """The bytes a model holds between steps: parameters and optimizer states."""
    import torch
    n = sum(p.numel() * p.element_size() for p in model.parameters())
    for st in opt.state.values():
        n += sum(t.numel() * t.element_size() for t in st.values() if torch.is_tensor(t)
                 and t.device.type != "cpu")
    return n


def run_ab(case, args, device, dtype):
    """The variants of one case in one process, timed in a balanced order (the method of
    shared/BENCH.md: CUDA events, warm-up first, medians): every variant's model is
    built, compiled where it is, and warmed up (3 steps, 5 with torch.compile) first;
    then `rounds` rounds. Windowed (the default): each round runs every variant's window
    -- forward order in even rounds, reverse in odd ones (ABC CBA ...), so that no
    variant always follows the same one or always runs at the same point of the GPU's
    warming -- of one unsynchronized lead-in step and `steps` steps with a CUDA event
    between consecutive steps (the GPU's time per step with the host ahead, as in a
    training loop). Interleaved (the case's "interleave" or --ab-interleave): each round
    is one untimed lead-in pass (every variant one step) and `steps` passes of one timed
    step per variant, the order reversed every other pass (ABC CBA ABC ...), between two
    synchronizations: the variants' steps sit next to each other in time, so a drift of
    the SM clock (an H200 at its power cap: 1-3% between the windows of a call) reaches
    them alike. A variant's step time is the median over its rounds x steps timings;
    each round's median too (round_ms), and from them the per-round ratios against the
    case's references with a bootstrap interval (_round_ratios); the mean and each
    window's sync-to-sync wall time (windowed) are recorded as well. Clocks per variant:
    windowed, each window's NVML samples; interleaved, each sample given to the step the
    GPU ran when it was taken (the steps' CUDA events against the host clock from the
    round's synchronized start). Peak memory per variant: its own parameters and
    optimizer states plus the most its steps allocated above what was held before them
    (the other variants' models sit in the same process). With a *_fused_adds variant
    in the case, the patch's fused-add decisions are spied on (_install_fused_spies) and
    recorded per variant after the warm-up and for each window / timed step
    (fused_paths); a variant whose steps did not take its path (fused, or for the others
    unfused: _fused_verdict) gets status "path_not_taken" and no tokens/s (its timings
    kept, not_reported). One row per variant, in the shape of run_case's."""
    import statistics
    import torch
    rounds = case.get("rounds", args.ab_rounds)
    steps = case.get("steps", args.ab_steps) if not args.quick else 2
    interleave = bool(case.get("interleave", getattr(args, "ab_interleave", False)))
    if args.quick:
        rounds = min(rounds, 2)
    built, rows = [], []
    dyn = torch._dynamo.config
    for knob in ("recompile_limit", "cache_size_limit"):     # one graph per variant
        if hasattr(dyn, knob):
            setattr(dyn, knob, max(getattr(dyn, knob), 8 * len(case["variants"])))
    torch._dynamo.utils.counters.clear()
    variants = [(_other_variant(case, device, dtype) if v == "patched_other" else v)
                for v in case["variants"]]
    case = dict(case, variants=variants)
    spies = any(v.endswith("_fused_adds") for v in variants)
    if spies:
        _install_fused_spies()
    method = (f"balanced A/B, interleaved: {rounds} rounds x {steps} passes of one step "
              "per variant, median" if interleave
              else f"balanced A/B, {rounds} rounds x {steps} steps, median")
    for variant in variants:
        c = dict(case, variant=variant)
        res = dict(case=case_name(c["cfg"], c["batch"], c["seq"], c.get("tag")),
                   variant=variant, label=VARIANTS[variant], cfg=c["cfg"], batch=c["batch"],
                   seq=c["seq"], method=method)
        try:
            t0 = time.perf_counter()
            model, fwd, opt, cfg, data = _setup(c, variant, res, args, device, dtype)
            if variant.startswith("patched"):
                _use_attention(variant)
            _seen_take()
            for i in range((5 if _compiled(variant) else 3) if not args.quick else 2):
                loss = _step(fwd, model, opt, data[i % 2])
            _sync(device)
            res["warmup_s"] = time.perf_counter() - t0
            if _compiled(variant):       # (_build cleared the counters: this variant's)
                res["dynamo"] = _dynamo_stats()
            if spies and variant.startswith("patched"):
                res["fused_paths"] = [_seen_take()]      # the warm-up's, then the timed ones
            # [res, model, fwd, opt, data, cfg, step times, walls, clocks, peak, per-round
            #  step times, per-round SM clock samples, last loss]
            built.append([res, model, fwd, opt, data, cfg, [], [], [], 0, [], [], None])
        except Exception as e:  # noqa: BLE001  (recorded; the other variants run)
            msg = f"{type(e).__name__}: {e}".split("\n")[0][:400]
            res.update(status="oom" if _is_oom(e) else "error", error=msg)
            traceback.print_exc(limit=6)
            rows.append(res)
            model = opt = fwd = None
            _release(device)
    cuda = device.type == "cuda"

    def segment(plan_steps):
        """Run [(built entry, timed)] between two synchronizations; per step its time
        (CUDA events / host clock), peak and spy record go to its variant."""
        _sync(device)
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(len(plan_steps) + 1)] \
            if cuda else []
        tk, n_timed = [], {}
        failing[0] = None
        with _Clocks(device) as clk:
            t1 = time.perf_counter()
            for j, (b, timed) in enumerate(plan_steps):
                res, model, fwd, opt, data = b[:5]
                failing[0] = res
                if res["variant"].startswith("patched"):
                    _use_attention(res["variant"])
                if cuda:
                    base = torch.cuda.memory_allocated(device)
                    torch.cuda.reset_peak_memory_stats(device)
                    ev[j].record()
                tk.append(time.perf_counter())
                # (the lead-in on the second batch, the timed steps alternating from the first)
                i = n_timed.get(id(b), 0)
                n_timed[id(b)] = i + timed
                loss = _step(fwd, model, opt, data[i % 2] if timed else data[1])
                if cuda:     # (the allocator's counts are the host's: no synchronization)
                    b[9] = max(b[9], torch.cuda.max_memory_allocated(device) - base)
                b[12] = loss
                if spies and "fused_paths" in res and timed:
                    res["fused_paths"].append(_seen_take())
                elif spies:
                    _seen_take()
            if cuda:
                ev[-1].record()
            _sync(device)
            tk.append(time.perf_counter())
        if cuda:
            ms = [ev[j].elapsed_time(ev[j + 1]) for j in range(len(plan_steps))]
            start = [ev[0].elapsed_time(ev[j]) for j in range(len(plan_steps) + 1)]
        else:
            ms = [(tk[j + 1] - tk[j]) * 1e3 for j in range(len(plan_steps))]
            start = [(t - tk[0]) * 1e3 for t in tk]
        for j, (b, timed) in enumerate(plan_steps):
            if timed:
                b[6].append(ms[j])
                b[10][-1].append(ms[j])
        samples = getattr(clk, "timed_samples", None) or []
        for t, mhz in samples:       # the step the GPU ran at the sample's host time
            at = (t - tk[0]) * 1e3
            for j, (b, timed) in enumerate(plan_steps):
                if timed and start[j] <= at < start[j + 1]:
                    b[11][-1].append(mhz)
                    break
        return clk, (tk[-1] - t1) * 1e3

    failing = [None]           # the row of the step running (an error is its variant's)

    def failed(e):
        if failing[0] is not None:
            failing[0].setdefault("error", f"{type(e).__name__}: {e}".split("\n")[0][:400])
        traceback.print_exc(limit=4)

    for r in range(rounds):
        order = built if r % 2 == 0 else built[::-1]
        for b in built:
            b[10].append([])
            b[11].append([])
        if interleave:
            plan_steps = [(b, False) for b in order]
            for k in range(steps):
                plan_steps += [(b, True) for b in (order if k % 2 == 0 else order[::-1])]
            try:
                segment(plan_steps)
            except Exception as e:  # noqa: BLE001  (the round is lost: its times are not kept)
                failed(e)
            continue
        for b in order:
            try:
                clk, wall = segment([(b, False)] + [(b, True)] * steps)
            except Exception as e:  # noqa: BLE001  (this variant's window only)
                failed(e)
                continue
            b[7].append(wall / (steps + 1))
            if clk.result:
                b[8].append(clk.result)
    for b in built:
        res, model, fwd, opt, data, cfg, times, walls, clocks, peak, rounds_ms, rounds_mhz = \
            b[:12]
        if b[12] is not None:
            res["loss"] = float(b[12])
        if times:
            ms = statistics.median(times)
            tok = res["batch"] * res["seq"]
            res.update(status="ok", steps=len(times), step_ms=ms, tokens_per_s=tok / ms * 1e3,
                       step_ms_mean=statistics.fmean(times),
                       step_ms_min=min(times), step_ms_max=max(times),
                       round_ms=[round(statistics.median(x), 4) if x else None
                                 for x in rounds_ms],
                       step_ms_all=[round(t, 3) for t in times])
            if walls:
                res["window_ms_per_step"] = [round(w, 3) for w in walls]
            res["model_TFLOPs"] = res["tokens_per_s"] * _flops_per_token(cfg, res["seq"]) / 1e12
            if cuda:
                res["peak_GB"] = (_static_bytes(model, opt) + peak) / 1e9
            if clocks:
                res["clocks"] = dict(
                    sm_MHz_mean=round(statistics.fmean(c["sm_MHz_mean"] for c in clocks)),
                    sm_MHz_min=min(c["sm_MHz_min"] for c in clocks),
                    sm_MHz_max=max(c["sm_MHz_max"] for c in clocks),
                    power_W_mean=round(statistics.fmean(c["power_W_mean"] for c in clocks)),
                    per_window=[c["sm_MHz_mean"] for c in clocks],
                    throttle=sorted({t for c in clocks for t in c["throttle"]}))
            elif any(rounds_mhz):
                got = [m for x in rounds_mhz for m in x]
                res["clocks"] = dict(
                    sm_MHz_mean=round(statistics.fmean(got)), sm_MHz_min=min(got),
                    sm_MHz_max=max(got), samples=len(got),
                    per_round=[round(statistics.fmean(x)) if x else None for x in rounds_mhz],
                    note="NVML samples taken while the GPU ran this variant's timed steps")
        elif "status" not in res:
            res["status"] = "error"
        if res["variant"].startswith("patched"):
            res["fused_attention"] = FUSED_ATTENTION.get(res["variant"], "auto")
            res["auto_attention"] = _auto_decisions(res["seq"])
        rows.append(res)
    _round_ratios([r for r in rows if r.get("status") == "ok"])
    for res in rows:
        if spies and "fused_paths" in res:
            recs = res["fused_paths"]
            why = _fused_verdict(res["variant"], recs)
            # (kept short: the warm-up's record and the distinct timed ones)
            res["fused_paths"] = dict(warm_up=recs[0], timed_records=len(recs) - 1,
                                      timed_distinct=[dict(t) for t in
                                                      {tuple(sorted(x.items()))
                                                       for x in recs[1:]}])
            if why is not None and res.get("status") == "ok":
                # refused: an A/B whose fused variant ran the unfused path measures nothing
                res["not_reported"] = {k: res.pop(k) for k in ("tokens_per_s", "model_TFLOPs",
                                                               "round_ratios") if k in res}
                res.update(status="path_not_taken", error=f"{res['variant']}: {why}"[:600])
            res["fused_path_taken"] = why is None
    if any(_compiled(v) for v in case["variants"]):
        # the rounds: graph breaks / recompiles after the warm-ups (counters since the
        # last compiled variant's build)
        stats = _dynamo_stats()
        for res in rows:
            if _compiled(res["variant"]):
                res["dynamo_after_rounds"] = stats
    prof_rows = []
    for res, model, fwd, opt, data, cfg, *_ in built:
        c = dict(case, variant=res["variant"])
        if _profile_key(c) in args.profile:
            if res["variant"].startswith("patched"):
                _use_attention(res["variant"])
            prof_rows.append(dict(_profile(c, args, device, fwd, model, opt, data[0]),
                                  after_case=True))
    del built, model, fwd, opt
    if spies:
        _remove_fused_spies()
    _release(device)
    try:
        torch._dynamo.reset()
    except Exception:  # noqa: BLE001
        pass
    order = {v: i for i, v in enumerate(case["variants"])}
    rows.sort(key=lambda r: order.get(r["variant"], 0))
    return rows, prof_rows


def run_curve(case, args, device, dtype):
    """HF sdpa and patched, same initialization and data, --curve-steps steps each."""
    import torch
    steps = args.curve_steps if not args.quick else 8
    out = dict(kind="curve", case=case_name(case["cfg"], case["batch"], case["seq"]),
               steps=steps, lr=3e-4)
    for variant in ("hf_sdpa", "patched"):
        c = dict(case, variant=variant)
        model = opt = None
        try:
            model, fwd, cfg, _ = _build(c, device, dtype, args.seed)
            opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1,
                                    betas=(0.9, 0.95), fused=device.type == "cuda")
            gen = torch.Generator().manual_seed(args.seed + 2)
            losses = []
            for _ in range(steps):
                x = torch.randint(0, cfg["vocab_size"] // 8, (case["batch"], case["seq"]),
                                  generator=gen).to(device)
                # a learnable stream: every other token repeats the one before
                x[:, 1::2] = x[:, 0::2]
                losses.append(_step(fwd, model, opt, x))
            out[variant] = [float(v) for v in torch.stack(losses).cpu()]
        except Exception as e:  # noqa: BLE001
            out[variant + "_error"] = f"{type(e).__name__}: {e}".split("\n")[0][:300]
        finally:
            del model, opt
            _release(device)
    if "hf_sdpa" in out and "patched" in out:
        out["max_abs_diff"] = max(abs(a - b) for a, b in zip(out["hf_sdpa"], out["patched"]))
    return out


def _time_ms(fn, device, iters):
    import torch
    for _ in range(2):
        fn()
    _sync(device)
    if device.type != "cuda":
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        return (time.perf_counter() - t0) / iters * 1e3
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / iters


def run_attention(args, device, dtype):
    """The attention alone at the models' shapes, forward + backward (causal, bf16):
    the library's kernels (through the autograd op, as the patched model calls them)
    against torch's SDPA as HF / the patch call it ([B, S, H, D] projections viewed as
    [B, H, S, D], enable_gqa for GQA), with torch's own choice of backend and with each
    backend forced; the backend torch picks; the decision of fused_attention='auto';
    and the library's outputs / gradients against torch's (max abs difference)."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    import ops_transformer as ot
    from ops_transformer import patch as ot_patch
    out = dict(kind="attention", torch=torch.__version__,
               cudnn=torch.backends.cudnn.version() if device.type == "cuda" else None,
               rows=[])
    shapes = ATTN_SHAPES if not args.quick else [("tiny", 2, 64, 4, 2, 16)]
    iters = 5 if not args.quick else 2
    prev = ot.config.fused_attention
    ot.config.fused_attention = "auto"
    for label, B, S, Hq, Hkv, D in shapes:
        row = dict(shape=label, B=B, S=S, Hq=Hq, Hkv=Hkv, D=D, ms={}, TFLOPs={})
        g = torch.Generator(device).manual_seed(0)
        q, k, v = (torch.randn(B, S, H, D, device=device, dtype=dtype, generator=g)
                   .requires_grad_() for H in (Hq, Hkv, Hkv))
        do = torch.randn(B, S, Hq, D, device=device, dtype=dtype, generator=g)
        scale = D ** -0.5
        flops = 3.5 * 4 * B * Hq * S * S * D / 2           # causal fwd + bwd

        def lib():
            o = ot.attention(q, k, v, causal=True, softmax_scale=scale)
            return (o,) + torch.autograd.grad(o, (q, k, v), do)

        def sdpa():
            o = F.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True,
                scale=scale, enable_gqa=Hq != Hkv).transpose(1, 2)
            return (o,) + torch.autograd.grad(o, (q, k, v), do)
        row["torch_picks"] = ot_patch._torch_sdpa_backend(q, k, v, True, scale)
        with torch.enable_grad():
            row["auto"] = ("library" if ot_patch._auto_library(q, k, v, True, scale, None,
                                                                None) else "torch SDPA")
        impls = [("library", lib, None), ("torch SDPA (its pick)", sdpa, None),
                 ("torch flash", sdpa, SDPBackend.FLASH_ATTENTION),
                 ("torch cuDNN", sdpa, SDPBackend.CUDNN_ATTENTION),
                 ("torch efficient", sdpa, SDPBackend.EFFICIENT_ATTENTION)]
        if device.type != "cuda":
            impls = impls[:2]
        for name, fn, backend in impls:
            try:
                if backend is None:
                    ms = _time_ms(fn, device, iters)
                else:
                    with sdpa_kernel(backend):
                        ms = _time_ms(fn, device, iters)
                row["ms"][name] = ms
                row["TFLOPs"][name] = flops / ms / 1e9
            except Exception as e:  # noqa: BLE001  (a backend that refuses the shape)
                row["ms"][name] = None
                row.setdefault("errors", {})[name] = f"{type(e).__name__}: {e}"[:160]
        try:
            a, b = lib(), sdpa()
            row["max_abs_diff"] = {n: float((x.float() - y.float()).abs().max())
                                   for n, x, y in zip(("out", "dq", "dk", "dv"), a, b)}
            row["max_abs_ref"] = {n: float(y.float().abs().max())
                                  for n, y in zip(("out", "dq", "dk", "dv"), b)}
        except Exception as e:  # noqa: BLE001
            row["diff_error"] = f"{type(e).__name__}: {e}"[:200]
        out["rows"].append(row)
        print(f"   attention {label}: torch picks {row['torch_picks']}, auto: {row['auto']}; "
              + ", ".join(f"{n} {row['TFLOPs'][n]:.0f}" for n in row["ms"]
                          if row["ms"][n]) + " TFLOP/s", flush=True)
        del q, k, v, do
    ot.config.fused_attention = prev
    return out


def run_lce(args, device, dtype, case=None):
    """The fused linear + cross-entropy alone (forward + backward: the library's
    linear_cross_entropy computes both gradients in its forward call) at the models' LM
    heads, T = 8192 tokens, H = 2048, V 32000 and 128256 (or the case's "vocab" list),
    per chunk size: 0 (the library's default, 256 MiB of logits), 1024 / 2048 / 4096 /
    8192 rows (8192: one chunk, OT_LCE_CHUNK_ROWS=8192's), and the patch's choice
    (patch._lce_chunk_tokens): ms and the peak memory above the inputs."""
    import torch
    import ops_transformer as ot
    from ops_transformer import patch as ot_patch
    T, H = (8192, 2048) if not args.quick else (256, 64)
    out = dict(kind="lce", T=T, H=H, rows=[])
    vocab = (case or {}).get("vocab") or (32000, 128256)
    for V in (vocab if not args.quick else (1000,)):
        g = torch.Generator().manual_seed(7)
        h = (torch.randn(T, H, generator=g) * 0.5).to(device, dtype).requires_grad_()
        w = (torch.randn(V, H, generator=g) * 0.02).to(device, dtype).requires_grad_()
        lab = torch.randint(0, V, (T,), generator=g).to(device)
        pick = ot_patch._lce_chunk_tokens(T, V, h.element_size())
        ref_loss = None
        for chunk in sorted({0, 1024, 2048, 4096, 8192, pick}):
            def call():
                h.grad = w.grad = None
                ot.linear_cross_entropy(h, w, lab, chunk_tokens=chunk).backward()
            row = dict(V=V, chunk_tokens=chunk, patch_pick=chunk == pick)
            try:
                call()
                _sync(device)
                if ref_loss is None:
                    ref_loss = float(ot.linear_cross_entropy(h.detach(), w.detach(), lab))
                if device.type == "cuda":
                    base = torch.cuda.memory_allocated(device)
                    torch.cuda.reset_peak_memory_stats(device)
                row["ms"] = _time_ms(call, device, 5)
                if device.type == "cuda":
                    row["extra_peak_GB"] = (torch.cuda.max_memory_allocated(device) - base) / 1e9
                row["loss_diff"] = abs(float(ot.linear_cross_entropy(
                    h.detach(), w.detach(), lab, chunk_tokens=chunk)) - ref_loss)
            except Exception as e:  # noqa: BLE001
                row["error"] = f"{type(e).__name__}: {e}"[:200]
            out["rows"].append(row)
        print("   lce V %d: " % V + ", ".join(
            f"chunk {r['chunk_tokens']}{'*' if r['patch_pick'] else ''} "
            f"{r.get('ms', float('nan')):.2f} ms {r.get('extra_peak_GB', 0):.2f} GB"
            for r in out["rows"] if r["V"] == V), flush=True)
        del h, w
    return out


def run_adamw(case, args, device, dtype):
    """The optimizer step alone at a config's parameters (LlamaForCausalLM's shapes, untied
    head; bf16 parameters, gradients and moments, _optimizer's hyperparameters): torch's
    fused AdamW against ops_transformer.optim.AdamW with OT_ADAMW_IMPL unset (the default,
    "fast" since 2026-12-01's evening), "v4" and "exact" (W = 8, IEEE arithmetic, the default
    before), every optimizer updating the same parameters with its own moments. After two
    untimed steps each, `rounds` rounds of one pass each (the order reversed every other
    round) behind a torch.cuda._sleep that lets the host queue the whole pass: CUDA events
    around each step, so the times are the GPU's (the host's time to issue a step is
    recorded apart, host_ms). Per optimizer the median ms, and TB/s of the 14 bytes an
    element a step moves (parameter, gradient and two moments read, three written)."""
    import statistics
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    from ops_transformer.optim import AdamW as OtAdamW
    cfg = dict(CONFIGS[case["cfg"]])
    config = LlamaConfig(**cfg, tie_word_embeddings=False, use_cache=False)
    with torch.device("meta"):
        shapes = [tuple(p.shape) for p in LlamaForCausalLM(config).parameters()]
    if args.quick:
        shapes = shapes[:4]
    g = torch.Generator(device=device).manual_seed(11)
    params = [torch.nn.Parameter((torch.randn(sh, device=device, generator=g) * 0.02)
                                 .to(dtype)) for sh in shapes]
    for p in params:
        p.grad = (torch.randn(p.shape, device=device, generator=g) * 1e-3).to(dtype)
    n = sum(p.numel() for p in params)
    kw = dict(lr=1e-4, weight_decay=0.1, betas=(0.9, 0.95))
    opts = [("torch fused", None, torch.optim.AdamW(params, fused=device.type == "cuda", **kw)),
            ("library", "", OtAdamW(params, **kw)), ("library v4", "v4", OtAdamW(params, **kw)),
            ("library exact", "exact", OtAdamW(params, **kw))]
    prev = os.environ.get("OT_ADAMW_IMPL")

    def step(impl, opt):
        if impl is not None:
            if impl:
                os.environ["OT_ADAMW_IMPL"] = impl
            else:
                os.environ.pop("OT_ADAMW_IMPL", None)
        opt.step()
    out = dict(kind="adamw", case=case["cfg"], params=n,
               tensors=len(params), bytes_per_step=14 * n, rows=[])
    times = {name: [] for name, _, _ in opts}
    host = {name: [] for name, _, _ in opts}
    rounds = 10 if not args.quick else 2
    cuda = device.type == "cuda"
    try:
        for _ in range(2):
            for name, impl, opt in opts:
                step(impl, opt)
        _sync(device)
        for r in range(rounds):
            order = opts if r % 2 == 0 else opts[::-1]
            if cuda:
                torch.cuda._sleep(int(2e8))         # ~0.1 s: the pass is queued behind it
                ev = [torch.cuda.Event(enable_timing=True) for _ in range(len(order) + 1)]
                ev[0].record()
            for j, (name, impl, opt) in enumerate(order):
                t0 = time.perf_counter()
                step(impl, opt)
                host[name].append((time.perf_counter() - t0) * 1e3)
                if cuda:
                    ev[j + 1].record()
            _sync(device)
            if cuda:
                for j, (name, _, _) in enumerate(order):
                    times[name].append(ev[j].elapsed_time(ev[j + 1]))
    except Exception as e:  # noqa: BLE001  (recorded)
        out["error"] = f"{type(e).__name__}: {e}"[:300]
        traceback.print_exc(limit=4)
    finally:
        if prev is None:
            os.environ.pop("OT_ADAMW_IMPL", None)
        else:
            os.environ["OT_ADAMW_IMPL"] = prev
    for name, _, _ in opts:
        row = dict(optimizer=name, host_ms=statistics.median(host[name]) if host[name] else None)
        if times[name]:
            ms = statistics.median(times[name])
            row.update(ms=ms, ms_all=[round(t, 4) for t in times[name]],
                       TB_per_s=14 * n / ms / 1e9)
        out["rows"].append(row)
    print(f"   adamw {out['case']} ({n / 1e9:.2f} B params, {len(params)} tensors): " + ", ".join(
        f"{r['optimizer']} {r.get('ms', float('nan')):.2f} ms "
        f"({r.get('TB_per_s', float('nan')):.2f} TB/s, host {r['host_ms'] or 0:.2f} ms)"
        for r in out["rows"]), flush=True)
    del opts, params
    _release(device)
    return out


def _kernel_kind(name):
    n = name.lower()
    if "ot::" in name:                  # the library's kernels (namespace ot)
        return "library attention" if "attn" in n else "library (norms, rope, glu, loss)"
    if any(t in n for t in ("cudnn", "flash", "fmha", "sdpa", "attention")):
        return "attention (torch)"
    if any(t in n for t in ("gemm", "cutlass", "nvjet", "sm90_xmma", "cublas", "wgmma")):
        return "GEMM"
    if "adam" in n or "multi_tensor" in n:
        return "optimizer"
    return "other (elementwise, copies, reductions)"


# CUDA runtime / driver calls that wait for the device or allocate (a GPU gap's usual
# causes), and the launch calls (their count: kernels a step)
_WAITING_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize",
                  "cudaMalloc", "cudaFree", "cudaMallocAsync", "cudaFreeAsync", "cudaMemcpy",
                  "cudaMemcpyAsync", "cudaHostAlloc", "cudaStreamWaitEvent", "cudaEventRecord",
                  "aten::item", "aten::_local_scalar_dense", "aten::nonzero")
_LAUNCH_CALLS = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx")


def _host_calls(events, steps):
    """Per step: the calls of _WAITING_CALLS (count, host us) and the kernel launches."""
    calls, launches = {}, 0
    for e in events:
        if e.key in _WAITING_CALLS:
            calls[e.key] = dict(per_step=e.count / steps,
                                host_us_per_step=e.cpu_time_total / steps)
        elif e.key in _LAUNCH_CALLS:
            launches += e.count
    return dict(host_calls=calls, launches_per_step=launches / steps)


def _is_kernel(e, cpu_keys):
    """Whether a profiler event (or key average) is GPU work: a CUDA-side event that is
    not the GPU range of a CPU annotation (those carry a CPU event's name, or a '#').
    Inductor's triton kernels are launched under a CPU op of their own name: kernels
    all the same (before, they were left out: a compiled HF step's busy fraction and
    gaps were off by its triton kernels' time)."""
    name = getattr(e, "key", None) or e.name
    return (str(getattr(e, "device_type", "")).endswith("CUDA")
            and not getattr(e, "is_user_annotation", False) and "#" not in name
            and (name not in cpu_keys or name.startswith("triton_")))


def _gpu_gaps(prof, cpu_keys, steps):
    """Where the GPU idles between kernels (the profiled steps): total idle, the number of
    gaps over 20 us, and the 8 longest with the kernels on each side -- what a step's
    time outside kernels is made of."""
    try:
        ks = sorted(((e.time_range.start, e.time_range.end, e.name) for e in prof.events()
                     if _is_kernel(e, cpu_keys)), key=lambda t: t[0])
        gaps, end, prev = [], None, None
        for s, e, n in ks:
            if end is not None and s > end:
                gaps.append((s - end, prev, n))
            if end is None or e > end:
                end, prev = e, n
        gaps.sort(key=lambda g: -g[0])
        return dict(gpu_gap_ms_per_step=sum(g[0] for g in gaps) / 1e3 / steps,
                    gpu_gaps_over_20us_per_step=sum(g[0] > 20 for g in gaps) / steps,
                    longest_gaps=[dict(us=round(g, 1), after=a[:70], before=b[:70])
                                  for g, a, b in gaps[:8]])
    except Exception as e:  # noqa: BLE001  (an older profiler API: no gap analysis)
        return dict(gap_error=f"{type(e).__name__}: {e}"[:200])


def _sync_warnings(fwd, model, opt, x, device):
    """One step under torch.cuda.set_sync_debug_mode("warn"): the synchronizing torch
    calls (item, nonzero, copies to the host, ...) by source line, {file:line: count}."""
    import warnings
    import torch
    if device.type != "cuda":
        return None
    got = {}
    with warnings.catch_warnings(record=True) as ws:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            _step(fwd, model, opt, x)
            _sync(device)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    for w in ws:
        if "synchroniz" in str(w.message).lower():
            k = f"{os.path.relpath(w.filename, ROOT) if w.filename.startswith(ROOT) else w.filename}:{w.lineno}"
            got[k] = got.get(k, 0) + 1
    return got


def run_profile(case, args, device, dtype):
    """A training step of the case's variant under torch.profiler (:func:`_profile`) on
    a model built for it."""
    model = opt = fwd = None
    try:
        model, fwd, cfg, _ = _build(case, device, dtype, args.seed, args.compile_mode,
                                    json.loads(args.compile_options or "{}"))
        opt = _optimizer(model, device)
        x = torch_randint(cfg["vocab_size"], case, device)
        for _ in range(5 if _compiled(case["variant"]) else 3):
            _step(fwd, model, opt, x)
        _sync(device)
        return _profile(case, args, device, fwd, model, opt, x)
    except Exception as e:  # noqa: BLE001
        traceback.print_exc(limit=4)
        return dict(kind="profile", case=case_name(case["cfg"], case["batch"], case["seq"]),
                    variant=case["variant"], error=f"{type(e).__name__}: {e}"[:300])
    finally:
        del model, opt, fwd
        _release(device)


def torch_randint(vocab, case, device, seed=5):
    import torch
    return torch.randint(0, vocab, (case["batch"], case["seq"]),
                         generator=torch.Generator().manual_seed(seed)).to(device)


def _profile_key(case):
    """--profile's name of a case: VARIANT@CFG:BxS (no spaces: it travels through a
    shell variable), e.g. patched_compile@0.54b:4x2048."""
    return f"{case['variant']}@{case['cfg']}:{case['batch']}x{case['seq']}"


# the matrix-product ops whose device time _gemm_by_shape attributes to their input shapes
# (inductor's extern_kernels.mm / addmm / bmm are these aten ops too; the library's own
# GEMMs are its linear custom ops -- not linear_cross_entropy, whose time is also the loss)
GEMM_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::_addmm_activation",
            "aten::addbmm", "ops_transformer::linear", "ops_transformer::linear_backward")


def _gemm_by_shape(prof, steps, cuda, top=40):
    """The profiled steps' matrix products grouped by (op, input shapes): calls and time per
    step (the device time of the kernels each launched on CUDA, host time on the CPU),
    largest first, and their sum -- what tells two models' GEMM time apart shape by shape
    (the 1.5 B trace of 2026-11-30 had the patched step's GEMMs 1.9 ms above HF's with the
    kernels alone unable to say which products). Needs record_shapes=True."""
    rows, total = [], 0.0
    for e in prof.key_averages(group_by_input_shape=True):
        if e.key not in GEMM_OPS:
            continue
        if cuda:
            t = getattr(e, "device_time_total", None)
            if t is None:
                t = getattr(e, "cuda_time_total", 0)
        else:
            t = e.cpu_time_total
        if not t:
            continue
        shapes = [list(x) for x in (e.input_shapes or []) if isinstance(x, (list, tuple)) and x]
        rows.append(dict(op=e.key, shapes=shapes, calls=e.count / steps,
                         ms_per_step=t / 1e3 / steps))
        total += t / 1e3 / steps
    rows.sort(key=lambda r: -r["ms_per_step"])
    return dict(ms_per_step=total, time="device" if cuda else "host", rows=rows[:top],
                rows_left_out=max(0, len(rows) - top))


def _profile(case, args, device, fwd, model, opt, x):
    """Two training steps of a built, warmed-up model under torch.profiler: GPU busy
    fraction (kernel time / wall time), kernel time by kind, the longest kernels, the
    host time per call of the library's autograd ops (the custom ops
    "ops_transformer::<op>" where they run, the eager path's autograd.Functions
    "<op>_eager" / "<op>_eagerBackward" outside torch.compile), the GPU's idle gaps
    between kernels (_gpu_gaps), the host calls that wait or allocate and the kernel
    launches (_host_calls), and one more step under torch's sync debug mode
    (_sync_warnings), the matrix products by input shape (_gemm_by_shape). With
    --trace-dir, the chrome trace of the two steps is written there (gzip)."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    out = dict(kind="profile", case=case_name(case["cfg"], case["batch"], case["seq"]),
               variant=case["variant"])
    try:
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda"
                                         else [])
        steps = 2
        with profile(activities=acts, record_shapes=True) as prof:
            t0 = time.perf_counter()
            for i in range(steps):
                # (the step's range in the trace: bench/trace_summary.py splits there)
                with torch.profiler.record_function(f"ot_step{i}"):
                    _step(fwd, model, opt, x)
            _sync(device)
            wall = time.perf_counter() - t0
        kinds, kernels, ops = {}, [], {}
        events = prof.key_averages()
        # GPU-side ranges of CPU annotations (e.g. "Optimizer.step#AdamW.step") carry the
        # device type too: only names no CPU event has are kernels / copies
        cpu_keys = {e.key for e in events if str(getattr(e, "device_type", "")).endswith("CPU")}
        for e in events:
            dev_t = getattr(e, "self_device_time_total", None)
            if dev_t is None:
                dev_t = getattr(e, "self_cuda_time_total", 0)
            is_kernel = _is_kernel(e, cpu_keys)
            if is_kernel and dev_t:
                kinds[_kernel_kind(e.key)] = kinds.get(_kernel_kind(e.key), 0) + dev_t
                kernels.append((dev_t, e.key[:90], e.count))
            if e.key.startswith("ops_transformer::") or (
                    e.key.endswith(("_eager", "_eagerBackward"))
                    and not e.key.startswith("autograd::")):
                ops[e.key] = dict(calls=e.count // steps,
                                  host_us_per_call=e.cpu_time_total / max(e.count, 1))
        busy = sum(kinds.values())
        out.update(wall_ms_per_step=wall / steps * 1e3,
                   gpu_busy_fraction=busy / 1e6 / wall if busy else None,
                   kernel_ms_per_step={k: v / 1e3 / steps for k, v in
                                       sorted(kinds.items(), key=lambda kv: -kv[1])},
                   top_kernels=[dict(ms_per_step=t / 1e3 / steps, name=n, calls=c // steps)
                                for t, n, c in sorted(kernels, reverse=True)[:16]],
                   custom_ops=ops)
        out.update(_host_calls(events, steps), **_gpu_gaps(prof, cpu_keys, steps))
        out["gemm_by_shape"] = _gemm_by_shape(prof, steps, device.type == "cuda")
        if args.trace_dir:
            import gzip
            import shutil
            os.makedirs(args.trace_dir, exist_ok=True)
            raw = os.path.join(args.trace_dir, "trace.json")
            prof.export_chrome_trace(raw)
            name = "trace_" + "".join(c if c.isalnum() or c in "._-" else "_"
                                      for c in _profile_key(case)) + ".json.gz"
            with open(raw, "rb") as f, gzip.open(os.path.join(args.trace_dir, name), "wb",
                                                 compresslevel=6) as g:
                shutil.copyfileobj(f, g)
            os.remove(raw)
            out["trace"] = name
        out["sync_warnings"] = _sync_warnings(fwd, model, opt, x, device)
        print(f"   profile {out['variant']} {out['case']}: {out['wall_ms_per_step']:.1f} "
              f"ms/step, GPU busy {(out['gpu_busy_fraction'] or 0):.2f}, gaps "
              f"{out.get('gpu_gap_ms_per_step', 0):.2f} ms; " + ", ".join(
                  f"{k} {v:.1f}" for k, v in out["kernel_ms_per_step"].items()) + " ms",
              flush=True)
    except Exception as e:  # noqa: BLE001
        out["error"] = f"{type(e).__name__}: {e}"[:300]
        traceback.print_exc(limit=4)
    return out


def run_ceiling(device):
    import torch
    if device.type != "cuda":
        return dict(kind="ceiling")
    n = 8192
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(10):
        start.record()
        a @ b
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    times.sort()
    return dict(kind="ceiling", gemm_bf16_TFLOPs=2 * n ** 3 / times[len(times) // 2] / 1e12)


def worker(args):
    import torch
    device = torch.device(args.device)
    dtype = torch.bfloat16
    for case in json.loads(args.worker):
        kind = case.get("kind", "step")
        if kind == "ceiling":
            res = run_ceiling(device)
        elif kind == "attention":
            res = run_attention(args, device, dtype)
        elif kind == "profile":
            res = run_profile(case, args, device, dtype)
        elif kind == "lce":
            res = run_lce(args, device, dtype, case)
        elif kind == "adamw":
            res = run_adamw(case, args, device, dtype)
        elif kind == "curve":
            res = run_curve(case, args, device, dtype)
        elif kind == "ab":
            rows, profs = run_ab(case, args, device, dtype)
            for r in profs + rows[:-1]:      # (extra rows: the last one closes the case)
                print("RESULT " + json.dumps(dict(r, _extra=True)), flush=True)
            res = rows[-1]
        else:
            res = run_case(case, args, device, dtype)
            prof = res.pop("_profile", None)
            if prof is not None:
                print("RESULT " + json.dumps(prof), flush=True)
        print("RESULT " + json.dumps(res), flush=True)


# ---------------------------------------------------------------------------------
# Parent: runs the groups, writes the JSON after each, prints the table last
# ---------------------------------------------------------------------------------

def _case_variants(c):
    """The step variants a planned case measures: its own, or an A/B's list."""
    if c.get("kind") == "ab":
        return list(c["variants"])
    return [c["variant"]] if c.get("kind", "step") == "step" else []


def _keep_ab_variants(groups, keep):
    """--ab-variants: each A/B case of the (index, group) pairs with only the variants in
    keep (the plan's order); an A/B case left with fewer than two is dropped, and a group
    left empty."""
    out = []
    for i, g in groups:
        cases = []
        for c in g:
            if c.get("kind") == "ab":
                vs = [v for v in c["variants"] if v in keep]
                if len(vs) < 2:
                    continue
                c = dict(c, variants=vs)
            cases.append(c)
        if cases:
            out.append((i, cases))
    return out


def _estimate_s(group, quick, compile_mode="model", ab_rounds=4, ab_steps=5):
    """Rough seconds a group needs on the H200 (start-up, model build, compile); an A/B's
    rounds at --ab-rounds / --ab-steps (0.4 s a variant and round at 0.54 B with 1 + 5
    steps, 3x that at 1.5 B or 16k; the H200 run of 6c0e246: group 0 31 s, group 3 59 s
    with their start-up, against 50 s / 67 s estimated). An interleaved A/B's round is
    a lead-in pass and `steps` passes: the same steps a variant as a window."""
    if quick:
        return 20
    s = 15
    for c in group:
        if c.get("kind") == "curve":
            s += 30
        elif c.get("kind") == "ceiling":
            s += 3
        elif c.get("kind") == "attention":
            s += 10
        elif c.get("kind") == "profile":
            s += 8 if c.get("cfg") == "1.5b" else 6
        elif c.get("kind") == "lce":
            s += 4
        elif c.get("kind") == "adamw":
            s += 8 if c.get("cfg") == "1.5b" else 5
        elif c.get("kind") == "ab":
            big = c["cfg"] == "1.5b" or c["seq"] >= 16384
            for v in c["variants"]:
                if _compiled(v):
                    s += (90 if big else 60) if compile_mode == "model" else (8 if big else 5)
                else:
                    s += 3 if big else 2
            s += 12 if any(v.startswith("hf") and _compiled(v) for v in c["variants"]) else 0
            steps = c.get("steps", ab_steps) + 1                   # (+ the lead-in)
            s += (len(c["variants"]) * c.get("rounds", ab_rounds) * 0.4 * steps / 6
                  * (3 if big else 1))
        else:
            big = c["cfg"] == "1.5b"
            if c["seq"] >= 32768:
                # warm-up and timed steps at ~450 TFLOP/s (1.5 B at 1 x 65536: ~3 s a
                # step) and the build; HF's out-of-memory ends sooner
                tok = c["batch"] * c["seq"]
                s += 5 + ((c.get("warmup", 3) + c.get("steps", 6))
                          * _flops_per_token(CONFIGS[c["cfg"]], c["seq"]) * tok / 4.5e14)
            elif _compiled(c["variant"]):
                # per layer: 98a29de's H200 run took 31 s / 33 s for a group of three
                # compiled variants (0.54 B with two profiles / 1.5 B), start-up included
                s += (90 if big else 60) if compile_mode == "model" else (12 if big else 10)
            else:
                s += 6 if big else 4
    return s


def result_line(r):
    """The progress line of one measured row (the parent prints it as the group ends)."""
    clk = r.get("clocks") or {}
    line = (f"   {r['case']:22s} {r['label']:37s} {r.get('status')} "
            f"{r.get('tokens_per_s', 0):,.0f} tok/s "
            + (f"(steady {r['steady_tokens_per_s']:,.0f}) "
               if r.get("steady_tokens_per_s") else "")
            + (f"(median of {r['steps']}: {r['step_ms']:.2f} ms, mean "
               f"{r['step_ms_mean']:.2f}, min {r['step_ms_min']:.2f}) "
               if r.get("step_ms_mean") is not None else "")
            + f"{r.get('peak_GB', 0):.2f} GB ")
    if clk:
        line += (f"(SM {clk.get('sm_MHz_mean')} MHz, {clk.get('power_W_mean')} W"
                 + (", " + "/".join(clk["throttle"]) if clk.get("throttle") else "") + ") ")
    for ref, q in (r.get("round_ratios") or {}).items():
        ci = q.get("ci95")
        line += (f"(x{q['median']:.3f} vs {ref} over {len(q['per_round'])} rounds, "
                 f"{q['min']:.3f}-{q['max']:.3f}"
                 + (f", 95% {ci[0]:.3f}-{ci[1]:.3f}" if ci else "") + ") ")
    if "fused_path_taken" in r:
        line += f"(fused path {'as named' if r['fused_path_taken'] else 'NOT as named'}) "
    return (line + f"loss {r.get('loss', float('nan')):.4f} {r.get('auto_attention', '')} "
            f"{r.get('dynamo', '')} {str(r.get('error', ''))[:200]}")


def build_record(runs, curve, ceiling, args, extra=None):
    rows = []
    by = {}
    for r in runs:
        by.setdefault(r["case"], {})[r["variant"]] = r
    gemm = (ceiling or {}).get("gemm_bf16_TFLOPs")
    for case, vs in by.items():
        peers_tok = {VARIANTS[v]: vs[v]["tokens_per_s"] for v in ("hf_eager", "hf_sdpa",
                                                                   "hf_sdpa_compile")
                     if v in vs and vs[v].get("status") == "ok"}
        peers_mem = {VARIANTS[v]: vs[v]["peak_GB"] for v in ("hf_eager", "hf_sdpa",
                                                             "hf_sdpa_compile")
                     if v in vs and vs[v].get("status") == "ok" and "peak_GB" in vs[v]}
        for ours in ("patched", "patched_compile", "patched_torch_attn", "patched_lib_attn",
                     "patched_ot_adamw", "patched_compile_ot_adamw", *COMPILED_OPS,
                     "patched_fused_adds", "patched_compile_fused_adds", *VARIANT_ENV,
                     *VARIANT_PATCH_GLOBALS):
            r = vs.get(ours)
            if r is None:
                continue
            row = dict(op=f"train_step ({VARIANTS[ours]})", case=case, metric="tokens/s",
                       ours=r.get("tokens_per_s") if r.get("status") == "ok" else None,
                       status=r.get("status"), peers=peers_tok, ratio_best_peer=None)
            oom = {VARIANTS[v]: vs[v].get("peak_GB_at_oom") for v in ("hf_eager", "hf_sdpa",
                                                                       "hf_sdpa_compile")
                   if v in vs and vs[v].get("status") == "oom"}
            if oom:             # peers that ran out of memory (their peak GB at the OOM)
                row["peers_out_of_memory"] = oom
            if row["ours"] and peers_tok:
                row["ratio_best_peer"] = row["ours"] / max(peers_tok.values())
                row["ratio_hf_sdpa"] = row["ours"] / peers_tok["HF sdpa"] \
                    if "HF sdpa" in peers_tok else None
            if row["ours"] and gemm:
                row["fraction_of_ceiling"] = r["model_TFLOPs"] / gemm
            rows.append(row)
            if "peak_GB" in r or peers_mem:
                mrow = dict(op=f"train_step ({VARIANTS[ours]})", case=case, metric="GB peak",
                            ours=r.get("peak_GB"), status=r.get("status"), peers=peers_mem,
                            ratio_best_peer=None)     # BENCH.md: every row has the key
                if mrow["ours"] and peers_mem:
                    mrow["ratio_best_peer"] = min(peers_mem.values()) / mrow["ours"]
                    mrow["ratio_hf_sdpa"] = mrow["ours"] / peers_mem["HF sdpa"] \
                        if "HF sdpa" in peers_mem else None
                rows.append(mrow)
    ceilings = {}
    if gemm:
        ceilings["gemm_bf16_TFLOPs"] = gemm
    rec = dict(bench="training", device=args.device_name, date=str(datetime.date.today()),
               commit=args.commit, command=args.command, ceilings=ceilings, rows=rows,
               runs=runs, loss_curve=curve)
    rec.update(extra or {})
    return rec


def _base_row(rs):
    """The row a case's ratios are taken against: HF sdpa's, or where the case has none
    (group 3, the compiled ops: HF sdpa + torch.compile is its peer) HF sdpa + compile's."""
    for v in ("hf_sdpa", "hf_sdpa_compile"):
        r = next((r for r in rs if r["variant"] == v and r.get("status") == "ok"), None)
        if r is not None or any(x["variant"] == v for x in rs):
            return r
    return None


def table(record):
    lines = ["case                   variant                               status   tok/s      "
             "x HF sdpa  peak GB  x HF sdpa  TFLOP/s"]
    by = {}
    for r in record["runs"]:
        by.setdefault(r["case"], []).append(r)
    for case, rs in by.items():
        base = _base_row(rs)
        for r in rs:
            ok = r.get("status") == "ok"
            tok = r.get("tokens_per_s") if ok else None
            mem = r.get("peak_GB") if ok else None
            xt = tok / base["tokens_per_s"] if tok and base else None
            xm = mem / base["peak_GB"] if mem and base and base.get("peak_GB") else None

            def f(v, fmt):
                return format(v, fmt) if v is not None else "-"
            lines.append(f"{case:22s} {r['label']:37s} {str(r.get('status'))[:8]:8s} "
                         f"{f(tok, ',.0f'):>10s} {f(xt, '.2f'):>9s} {f(mem, '.2f'):>8s} "
                         f"{f(xm, '.2f'):>9s} {f(r.get('model_TFLOPs') if ok else None, '.0f'):>8s}")
            if not ok and r.get("error"):
                lines.append(f"{'':22s}   {r['error'][:150]}")
    c = record.get("loss_curve")
    if c:
        if "max_abs_diff" in c:
            lines.append(f"loss curve ({c['case']}, {c['steps']} steps): HF {c['hf_sdpa'][0]:.3f}"
                         f" -> {c['hf_sdpa'][-1]:.3f}, patched {c['patched'][0]:.3f} -> "
                         f"{c['patched'][-1]:.3f}, max |diff| {c['max_abs_diff']:.4f}")
        else:
            lines.append(f"loss curve: {json.dumps(c)[:300]}")
    return "\n".join(lines)


def markdown(path):
    """The docs/PERFORMANCE.md table of a training.json."""
    with open(path) as f:
        rec = json.load(f)
    out = [f"{rec.get('device')}, {rec.get('date')}, commit {str(rec.get('commit'))[:10]}, "
           f"`{rec.get('command')}`; bf16 parameters / gradients / AdamW states (torch fused "
           "AdamW), use_cache=False, random tokens; "
           + ("balanced A/B cases (all rows of a case in one process after their warm-up, "
              + "; ".join(sorted({str(r["method"]).replace("balanced A/B, ", "")
                                  .replace(", median", "")
                                  for r in rec.get("runs", [])
                                  if "A/B" in str(r.get("method", ""))}))
              + ", in alternating order): tokens/s from "
              "the median of a variant's step times (CUDA events), peak = its parameters and "
              "AdamW states + the most its windows allocated above that; other rows: "
              if any("A/B" in str(r.get("method", "")) for r in rec.get("runs", [])) else "")
           + "tokens/s over the timed steps after warm-up; peak = "
           "torch.cuda.max_memory_allocated over the timed steps.", ""]
    gemm = (rec.get("ceilings") or {}).get("gemm_bf16_TFLOPs")
    out += ["| case | variant | tokens/s | x HF sdpa | peak GB | x HF sdpa | model TFLOP/s"
            + (f" (of {gemm:.0f} GEMM)" if gemm else "") + " |",
            "|---|---|---|---|---|---|---|"]
    by = {}
    for r in rec.get("runs", []):
        by.setdefault(r["case"], []).append(r)
    for case, rs in by.items():
        base = _base_row(rs)
        for r in rs:
            if r.get("status") != "ok":
                oom = (f" (peak {r['peak_GB_at_oom']:.1f} of {r['device_total_GB']:.1f} GB "
                       f"at its {r.get('oom_phase')})" if r.get("peak_GB_at_oom") else "")
                out.append(f"| {case} | {r['label']} | {r.get('status')}{oom} | | | | |")
                continue
            xt = r["tokens_per_s"] / base["tokens_per_s"] if base else None
            mem = r.get("peak_GB")
            xm = mem / base["peak_GB"] if base and mem and base.get("peak_GB") else None
            out.append(f"| {case} | {r['label']} | {r['tokens_per_s'] / 1e3:,.1f} k | "
                       f"{'' if xt is None else f'{xt:.2f}x'} | "
                       f"{'' if mem is None else f'{mem:.1f}'} | "
                       f"{'' if xm is None else f'{xm:.2f}x'} | {r['model_TFLOPs']:.0f} |")
    against = [c for c, rs in by.items() if (_base_row(rs) or {}).get("variant")
               == "hf_sdpa_compile"]
    if against:
        out += ["", f"In {', '.join(against)} the x columns are against HF sdpa + "
                "torch.compile (the case has no HF sdpa row)."]
    losses = {}
    for r in rec.get("runs", []):
        if r.get("status") == "ok" and "loss" in r:
            losses.setdefault(r["case"], []).append(f"{r['label']} {r['loss']:.4f}")
    if losses:
        out += ["", "Loss after the timed steps (same initialization and data in every "
                "variant of a case): " + "; ".join(f"{c}: {', '.join(v)}"
                                                   for c, v in losses.items()) + "."]
    steady = {}
    for r in rec.get("runs", []):
        if r.get("status") == "ok" and r.get("steady_tokens_per_s"):
            steady.setdefault(r["case"], []).append(
                f"{r['label']} {r['steady_tokens_per_s'] / 1e3:,.1f} k")
    if steady:
        out += ["", "Steady state (--steady: one unsynchronized step, then CUDA events around "
                "the same number of steps: the GPU's time per step with the host ahead), "
                "tokens/s: " + "; ".join(f"{c}: {', '.join(v)}" for c, v in steady.items())
                + "."]
    clocks = {}
    for r in rec.get("runs", []):
        c = r.get("clocks") if r.get("status") == "ok" else None
        if c:
            clocks.setdefault(r["case"], []).append(
                f"{r['label']} {c['sm_MHz_mean']} MHz"
                + (f" ({', '.join(c['throttle'])})" if c.get("throttle") else ""))
    if clocks:
        out += ["", "SM clock over the timed windows (NVML, mean of 20 ms samples; throttle "
                "reasons seen in any sample): " + "; ".join(
                    f"{c}: {', '.join(v)}" for c, v in clocks.items()) + "."]
    ratios = []
    for r in rec.get("runs", []):
        for ref, q in ((r.get("round_ratios") or {}).items()
                       if r.get("status") == "ok" else ()):
            ci = q.get("ci95")
            ratios.append(f"{r['case']}, {r['label']} / {VARIANTS.get(ref, ref)}: "
                          f"{q['median']:.3f}x (median of {len(q['per_round'])} rounds; "
                          f"rounds {q['min']:.3f}-{q['max']:.3f}"
                          + (f", 95% bootstrap interval of the mean {ci[0]:.3f}-{ci[1]:.3f}"
                             if ci else "") + ")")
    if ratios:
        out += ["", "Per-round tokens/s ratios (each round's median step time of the "
                "reference over the variant's; "
                + ("interleaved rounds: a lead-in pass, then passes of one step per variant "
                   "in alternating order; " if any("interleaved" in str(r.get("method", ""))
                                                   for r in rec.get("runs", [])) else "")
                + "the spread within the call): " + "; ".join(ratios) + "."]
    refused = [r for r in rec.get("runs", []) if r.get("status") == "path_not_taken"]
    if refused:
        out += ["", "Not reported (the variant's steps did not take the path its name says, "
                "spied on under torch.compile after the warm-up and in every timed step): "
                + "; ".join(f"{r['case']}, {r['label']}: {str(r.get('error'))[:300]}"
                            for r in refused) + "."]
    att = rec.get("attention") or {}
    if att.get("rows"):
        names = [n for n in ("library", "torch SDPA (its pick)", "torch flash", "torch cuDNN",
                             "torch efficient") if any(n in r["ms"] for r in att["rows"])]
        out += ["", f"Attention alone, causal forward + backward at the models' shapes, bf16 "
                f"(torch {att.get('torch')}, cuDNN {att.get('cudnn')}; TFLOP/s, ms in "
                "parentheses; torch's SDPA called as HF calls it"
                + (f"; from the run of {att['from_run']}" if att.get("from_run") else "")
                + "):", "",
                "| shape (B, S, Hq / Hkv, D) | torch picks | 'auto' runs | "
                + " | ".join(names) + " | library vs torch: max abs diff out / dq / dk / dv |",
                "|---" * (len(names) + 4) + "|"]
        for r in att["rows"]:
            cells = []
            for n in names:
                ms = r["ms"].get(n)
                cells.append(f"{r['TFLOPs'][n]:.0f} ({ms:.2f})" if ms else
                             ("refused" if n in r.get("errors", {}) else ""))
            d = r.get("max_abs_diff")
            diff = " / ".join(f"{d[k]:.3g}" for k in ("out", "dq", "dk", "dv")) if d \
                else r.get("diff_error", "")
            out.append(f"| {r['shape']} ({r['B']}, {r['S']}, {r['Hq']} / {r['Hkv']}, {r['D']}) "
                       f"| {r.get('torch_picks')} | {r.get('auto')} | " + " | ".join(cells)
                       + f" | {diff} |")
    lce = rec.get("lce") or {}
    if lce.get("rows"):
        out += ["", f"Fused linear + cross-entropy alone (ops_transformer.linear_cross_entropy, "
                f"forward + backward, {lce['T']} tokens x H {lce['H']}, bf16), by tokens per "
                "chunk (0: the library's default, 256 MiB of logits; * the patch's choice): "
                + "; ".join(f"V {r['V']} chunk {r['chunk_tokens']}{'*' if r['patch_pick'] else ''}"
                            f" {r['ms']:.2f} ms, +{r.get('extra_peak_GB', 0):.2f} GB"
                            for r in lce["rows"] if "ms" in r) + "."]
    for aw in rec.get("adamw") or []:
        if any("ms" in r for r in aw.get("rows", [])):
            out += ["", f"AdamW step alone ({aw['case']} parameters: {aw['params'] / 1e9:.2f} B "
                    f"in {aw['tensors']} tensors, bf16 parameters / gradients / moments, 14 "
                    "bytes an element; median of the rounds, GPU time): "
                    + "; ".join(f"{r['optimizer']} {r['ms']:.2f} ms ({r['TB_per_s']:.2f} TB/s)"
                                for r in aw["rows"] if "ms" in r) + "."]
    profs = rec.get("profiles") or ([rec["profile"]] if rec.get("profile") else [])
    for prof in profs:
        if not prof.get("wall_ms_per_step"):
            continue
        ops = prof.get("custom_ops") or {}
        label = VARIANTS.get(prof.get("variant"), prof.get("variant") or "patched")
        out += ["", f"Profile of a {label} step ({prof['case']}, torch.profiler, 2 steps): "
                f"{prof['wall_ms_per_step']:.1f} ms a step, GPU busy "
                f"{(prof.get('gpu_busy_fraction') or 0) * 100:.0f}% of it; kernel time a step: "
                + ", ".join(f"{k} {v:.1f} ms" for k, v in
                            (prof.get("kernel_ms_per_step") or {}).items())
                + "." + ((" Host time per call of the library's autograd ops: "
                         + ", ".join(f"{k.split('::')[-1]} {v['host_us_per_call']:.0f} us "
                                     f"(x{v['calls']})" for k, v in ops.items()) + ".")
                        if ops else "")
                + (f" Longest kernels: " + "; ".join(
                    f"{k['name'][:60]} {k['ms_per_step']:.2f} ms (x{k['calls']})"
                    for k in (prof.get("top_kernels") or [])[:6]) + "."
                   if prof.get("top_kernels") else "")
                + (f" GPU idle between kernels {prof['gpu_gap_ms_per_step']:.1f} ms a step "
                   f"({prof.get('gpu_gaps_over_20us_per_step', 0):.0f} gaps over 20 us; longest: "
                   + "; ".join(f"{g['us']:.0f} us before {g['before'][:40]}"
                               for g in (prof.get("longest_gaps") or [])[:4]) + ")."
                   if prof.get("gpu_gap_ms_per_step") else "")
                + (f" Kernel launches a step: {prof['launches_per_step']:.0f}."
                   if prof.get("launches_per_step") else "")
                + (" Host calls that wait or allocate, a step: " + ", ".join(
                    f"{k} x{v['per_step']:.0f} ({v['host_us_per_step']:.0f} us)"
                    for k, v in prof["host_calls"].items()) + "." if prof.get("host_calls")
                   else "")
                + (" Synchronizing torch calls in a step (sync debug mode): " + (", ".join(
                    f"{k} x{v}" for k, v in prof["sync_warnings"].items()) or "none") + "."
                   if prof.get("sync_warnings") is not None else "")
                + (f" Note: {prof['note']}." if prof.get("note") else "")]
    c = rec.get("loss_curve") or {}
    if "max_abs_diff" in c:
        out += ["", f"Loss curves ({c['case']}, {c['steps']} steps, AdamW lr {c.get('lr')}, "
                f"same initialization and data"
                + (f"; from the run of {c['from_run']}" if c.get("from_run") else "")
                + f"): HF {c['hf_sdpa'][0]:.3f} -> "
                f"{c['hf_sdpa'][-1]:.3f}, patched {c['patched'][0]:.3f} -> "
                f"{c['patched'][-1]:.3f}; largest difference at any step "
                f"{c['max_abs_diff']:.4f}."]
    ops = next((r.get("library_ops") for r in rec.get("runs", []) if r.get("library_ops")),
               None)
    if ops:
        bad = [k for k, v in ops.items() if not v]
        out += ["", "Library ops used by the patched model (probed on the device): "
                + ", ".join(k for k, v in ops.items() if v)
                + (f"; torch's code for: {', '.join(bad)}" if bad else "") + "."]
    print("\n".join(out))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="tiny model, 2+2 steps (smoke test)")
    p.add_argument("--device", default=None, help="cuda (default when present) or cpu")
    p.add_argument("--budget-s", type=float, default=300.0, help="total wall-time budget")
    p.add_argument("--steps", type=int, default=6, help="timed steps per case")
    p.add_argument("--curve-steps", type=int, default=50)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=os.path.join(ROOT, "bench", "results", "training.json"))
    p.add_argument("--plot", default=None, help="loss-curve PNG (bench/plot_training.py)")
    p.add_argument("--commit", default="unknown")
    p.add_argument("--command", default=None)
    p.add_argument("--only", default=None,
                   help="comma-separated group indices to run, in that order")
    p.add_argument("--variants", default=None,
                   help="comma-separated variants (and kinds: ceiling, attention, profile, "
                        "curve) to run, of the plan's groups")
    p.add_argument("--cases", default=None,
                   help="comma-separated case names to run (e.g. '0.54b bf16 4x2048')")
    p.add_argument("--ab-variants", default=None, metavar="V1,V2,...",
                   help="the A/B cases (kind ab) run only these of their variants, in the "
                        "plan's order (e.g. hf_sdpa_compile,patched_compile: the compiled "
                        "ratio alone); a case left with fewer than two is dropped")
    p.add_argument("--curve-from", default=None, metavar="JSON",
                   help="when this run makes no loss curve, keep the one of this earlier "
                        "training.json (marked as such)")
    p.add_argument("--compile-options", default=None, metavar="JSON",
                   help='torch.compile keyword arguments for both compiled variants (HF and '
                   'patched alike), e.g. \'{"mode": "max-autotune-no-cudagraphs"}\'')
    p.add_argument("--compile-mode", choices=["auto", "model", "layers"], default="auto",
                   help="torch.compile the whole model, or each decoder layer (regional: "
                        "a much shorter compile; LM head and loss eager), or auto: the "
                        "whole model where the budget left allows, else layers")
    p.add_argument("--profile", default="", metavar="VARIANT@CFG:BxS,...",
                   help="profile these measured cases after their timed steps, e.g. "
                        "patched_compile@0.54b:4x2048 (the same model: no second build)")
    p.add_argument("--steady", action="store_true",
                   help="also time each case's steps in steady state (one unsynchronized "
                        "step first, CUDA events around the timed ones): steady_tokens_per_s")
    p.add_argument("--ab-rounds", type=int, default=4,
                   help="balanced A/B cases (kind ab): rounds (each variant once a round, "
                        "the order reversed every other round)")
    p.add_argument("--ab-steps", type=int, default=5,
                   help="balanced A/B cases: timed steps per variant and round (after one "
                        "untimed lead-in step); the median of rounds x steps is reported")
    p.add_argument("--ab-interleave", action="store_true",
                   help="balanced A/B cases: interleave the variants step by step (each "
                        "round a lead-in pass and --ab-steps passes of one step per "
                        "variant, the order reversed every other pass) instead of "
                        "per-variant windows; the plan's groups 11 / 12 always do")
    p.add_argument("--trace-dir", default=None,
                   help="write each profile's chrome trace there "
                        "(trace_<VARIANT>_<CFG>_<BxS>.json.gz)")
    p.add_argument("--markdown", default=None, metavar="JSON",
                   help="print the docs/PERFORMANCE.md table of a training.json and exit")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.markdown:
        return markdown(args.markdown)
    if args.device is None:
        import torch
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    args.profile = {k for k in args.profile.split(",") if k}
    if args.worker is not None:
        return worker(args)

    import torch
    args.device_name = torch.cuda.get_device_name(0) if args.device.startswith("cuda") \
        else "CPU"
    args.command = args.command or "python3 bench/bench_training.py " + " ".join(
        argv if argv is not None else sys.argv[1:])
    t_start = time.time()
    groups = list(enumerate(plan(args.quick)))        # (the plan's index: the logs' name)
    if args.only:
        # in the order given ("3,0": the compiled ops' table first)
        try:
            keep = list(dict.fromkeys(int(i) for i in args.only.split(",") if i.strip()))
        except ValueError:
            keep = None
        bad = None if keep is None else [i for i in keep if not 0 <= i < len(groups)]
        if keep is None or bad or not keep:
            p.error(f"--only {args.only!r}: "
                    + (f"no group {', '.join(map(str, bad))}; " if bad else "")
                    + f"the plan{' (--quick)' if args.quick else ''} has groups 0-"
                    f"{len(groups) - 1} (comma-separated indices)")
        groups = [groups[i] for i in keep]
    if args.variants or args.cases:
        vs = set(args.variants.split(",")) if args.variants else None
        cs = set(args.cases.split(",")) if args.cases else None

        def wanted(c):
            if c.get("kind") == "ab":
                return ((vs is None or "ab" in vs)
                        and (cs is None or case_name(c["cfg"], c["batch"], c["seq"],
                                                     c.get("tag")) in cs))
            if c.get("kind", "step") != "step":
                return vs is not None and c["kind"] in vs
            return ((vs is None or c["variant"] in vs)
                    and (cs is None or case_name(c["cfg"], c["batch"], c["seq"]) in cs))
        groups = [(i, g) for i, g in ((i, [c for c in g if wanted(c)]) for i, g in groups)
                  if g]
    if args.ab_variants:
        keep = [v for v in args.ab_variants.split(",") if v]
        bad = [v for v in keep if v not in VARIANTS]
        if bad or len(keep) < 2:
            p.error(f"--ab-variants {args.ab_variants!r}: "
                    + (f"no variant {', '.join(bad)}" if bad else "two variants at least"))
        groups = _keep_ab_variants(groups, keep)
    unknown = args.profile - {_profile_key(dict(c, variant=v)) for _, g in groups for c in g
                              for v in _case_variants(c)}
    if unknown:         # (a misspelt key would cost the run its profile silently)
        print(f"--profile skipped: {', '.join(sorted(unknown))}: no such case in this run "
              "(VARIANT@CFG:BxS of a planned step case, e.g. patched@0.54b:4x2048)",
              flush=True)
    runs, curve, ceiling, extra = [], None, None, {}

    def save():
        record = build_record(runs, curve, ceiling, args, extra)
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        tmp = args.json + ".tmp"
        with open(tmp, "w") as f:
            json.dump(record, f, indent=1)
        os.replace(tmp, args.json)
        return record

    for gi, group in groups:
        left = args.budget_s - (time.time() - t_start)
        mode = args.compile_mode
        if mode == "auto":
            mode = "model" if left >= _estimate_s(group, args.quick, "model", args.ab_rounds,
                                                  args.ab_steps) else "layers"
        need = _estimate_s(group, args.quick, mode, args.ab_rounds, args.ab_steps)
        if left < min(need, 0.6 * need + 10):
            print(f"[{time.time() - t_start:5.0f}s] group {gi}: skipped (budget: {left:.0f} s "
                  f"left, ~{need} s needed)", flush=True)
            for c in group:
                for v in _case_variants(c):
                    runs.append(dict(case=case_name(c["cfg"], c["batch"], c["seq"], c.get("tag")),
                                     variant=v, label=VARIANTS[v], status="skipped (budget)"))
            save()
            continue
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", json.dumps(group),
               "--device", args.device, "--compile-mode", mode]
        cmd += ["--compile-options", args.compile_options] if args.compile_options else []
        cmd += ["--profile", ",".join(sorted(args.profile))] if args.profile else []
        cmd += ["--trace-dir", args.trace_dir] if args.trace_dir else []
        cmd += ["--steady"] if args.steady else []
        cmd += ["--ab-rounds", str(args.ab_rounds), "--ab-steps", str(args.ab_steps)]
        cmd += ["--ab-interleave"] if args.ab_interleave else []
        cmd += ["--steps", str(args.steps), "--curve-steps", str(args.curve_steps),
                "--seed", str(args.seed)] + (["--quick"] if args.quick else [])
        print(f"[{time.time() - t_start:5.0f}s] group {gi}: "
              f"{[c.get('variant', c.get('kind')) for c in group]} "
              f"({group[-1].get('cfg', '')}), ~{need:.0f} s estimated, timeout {left:.0f} s",
              flush=True)
        got = []
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=max(left, 10))
            out, err, rc = proc.stdout, proc.stderr, proc.returncode
        except subprocess.TimeoutExpired as e:
            out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
            err, rc = "timeout", "timeout"
        for line in out.splitlines():
            if line.startswith("RESULT "):
                got.append(json.loads(line[7:]))
            elif line.strip():
                print("   " + line[:300])
        # (--profile's results and an A/B's rows but its last: extra; the marker is
        # dropped from every row, an A/B's profiles included)
        done = sum(not (r.pop("_extra", False) or r.get("after_case")) for r in got)
        for r in got:
            if r.get("kind") == "curve":
                curve = r
            elif r.get("kind") == "ceiling":
                ceiling = r
            elif r.get("kind") == "profile":
                # every profile in "profiles"; "profile" stays the patched 0.54 B one
                # (or the first)
                extra.setdefault("profiles", []).append(r)
                if "profile" not in extra or (r.get("variant") == "patched"
                                              and r.get("case", "").startswith("0.54b")
                                              and r.get("case", "").endswith("4x2048")):
                    extra["profile"] = r
            elif r.get("kind") in ("attention", "lce"):
                extra[r["kind"]] = r
            elif r.get("kind") == "adamw":
                extra.setdefault("adamw", []).append(r)
            else:
                runs.append(r)
                print(result_line(r), flush=True)
        if done < len(group):
            why = "timeout" if rc == "timeout" else f"worker exit {rc}"
            tail = (err or "").strip().splitlines()[-6:]
            print(f"   group {gi} incomplete ({why}): " + " | ".join(tail)[:800], flush=True)
            for c in group[done:]:
                for v in _case_variants(c):
                    runs.append(dict(case=case_name(c["cfg"], c["batch"], c["seq"], c.get("tag")),
                                     variant=v, label=VARIANTS[v],
                                     status="timeout" if rc == "timeout" else "crashed",
                                     error=" | ".join(tail)[-300:]))
        elif rc not in (0, "timeout") and err:
            print("   stderr: " + " | ".join(err.strip().splitlines()[-3:])[:400])
        save()
    if curve is None and args.curve_from and os.path.exists(args.curve_from):
        with open(args.curve_from) as f:
            old = json.load(f)
        if old.get("loss_curve"):
            # an earlier carried curve keeps the run it came from
            curve = dict(old["loss_curve"])
            curve.setdefault("from_run", f"commit {old.get('commit')}, {old.get('date')} "
                             "(not run again)")
    record = save()
    if args.plot and curve and "patched" in curve:
        try:
            subprocess.run([sys.executable, os.path.join(ROOT, "bench", "plot_training.py"),
                            args.json, args.plot], check=False, timeout=60)
        except Exception as e:  # noqa: BLE001
            print(f"plot failed: {e}")
    print(f"[{time.time() - t_start:5.0f}s] done; {args.json}")
    print(table(record))
    return record


if __name__ == "__main__":
    main()
