#!/usr/bin/env python3
"""bench_engine.py -- the engine (src/engine, libot_engine.so through
python/ops_transformer/engine.py) on CUDA: correctness against HF transformers on the same
weights, then time to first token and decode speed against HF and the rooflines.

  python3 bench/bench_engine.py --check                  # small config, engine vs HF (GPU)
  python3 bench/bench_engine.py --bench --json bench/results/engine.json \
      [--shapes llama3-8b,llama-13b] [--hf-compile] [--commit SHA --command "..."]

libot_engine.so: $OT_ENGINE_LIB, else the build folders of this tree (engine.py's rule).

--check: a small Llama (GQA, head_dim 128) with weights of O(1) logits, bf16, saved with
save_pretrained into a temporary folder and loaded by both: three prompts of different
lengths prefilled together (packed varlen), 32 greedy decode steps (paged KV, CUDA graph);
logits of every step within bf16 tolerance of HF's, greedy tokens identical (a parting
allowed only at a near-tie of HF's logits, as tests/python/test_engine.py does on the
CPU), and the engine with graphs off gives the same tokens and logits as with them.

--bench (shared/BENCH.md): per shape, bf16 random weights made by the engine on the GPU
and copied into a HF LlamaForCausalLM built from the same config on the GPU (sdpa), so
both run the same weights and nothing is written to disk.
  TTFT: a 2048-token prompt at batch 1 (prefill + the first token's argmax), median of 5
  back to back; also (CUDA, unless --no-ttft-diag) median of 4 each after 250 ms of idle GPU,
  for the engine and HF alike (back to back, long prefills run into the power cap).
  decode: batch 1 and 16 at context 2048: per-step wall time (each step ends with the
  next tokens on the host), median of 20 steps after 3 warm-up steps (the engine captures
  its CUDA graph in the 2nd); batch 1 again with the linears chosen otherwise
  (--decode-variants, DECODE_VARIANTS); each call's split (Engine.last_timing: host
  preparation, enqueue, wait, GPU time between events) as medians; a per-op profile.
  TTFT with OT_GEMM_AUTOTUNE=8 (cuBLASLt's algorithms timed per GEMM, linear.cu) against the
  default, alternating call by call. Last, after HF (--no-timeline: not): the GPU timeline
  (torch.profiler / CUPTI) of one decode step at batch 1 (a graph replay) and of one prefill,
  per position in the layer: each kernel's time, the gap before it, the linears' rates.
  Peers: HF eager (sdpa, DynamicCache); with --hf-compile also HF with a static cache and
  torch.compile (mode reduce-overhead) for decode.
  Ceilings measured in the same run: bf16 GEMM rate (torch.mm 8192^3) for prefill
  (FLOPs = 2 * non-embedding parameters * tokens + causal attention 2 * L * Hq * S^2 * D
  + the lm_head of the last token), read bandwidth (a sum over 4 GiB) for decode (bytes =
  every weight once + the K/V of the batch's context once per step).
Rows are written after each measurement (a run cut short keeps what it measured).
"""
import argparse
import datetime
import gc
import json
import os
import pathlib
import statistics
import sys
import tempfile
import time

import torch

from benchutil import engine_module, env_set  # bench/ is on sys.path (python3 bench/NAME.py)

ROOT = pathlib.Path(__file__).resolve().parents[1]
DEV = "cuda"  # --device cpu: a dry run of the script on a small shape (no GPU)


def sync():
    if DEV == "cuda":
        torch.cuda.synchronize()


def timed_ms(fn, reps, inner=1):
    """median over reps of (fn run inner times) / inner: CUDA events on the GPU."""
    ts = []
    for _ in range(reps):
        if DEV == "cuda":
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            for _ in range(inner):
                fn()
            e.record()
            e.synchronize()
            ts.append(s.elapsed_time(e) / inner)
        else:
            t = time.perf_counter()
            for _ in range(inner):
                fn()
            ts.append((time.perf_counter() - t) * 1e3 / inner)
    return statistics.median(ts)


E = engine_module()

SHAPES = {
    # name: (engine named config, layers, hidden, heads, kv_heads, ffn, vocab, theta)
    "llama-13b": dict(layers=40, hidden=5120, heads=40, kv_heads=40, ffn=13824, vocab=32000,
                      theta=10000.0, max_pos=4096),
    "llama3-8b": dict(layers=32, hidden=4096, heads=32, kv_heads=8, ffn=14336, vocab=128256,
                      theta=500000.0, max_pos=8192),
    # the dry run's shape (--device cpu)
    "test-gqa": dict(layers=2, hidden=64, heads=4, kv_heads=2, ffn=128, vocab=256,
                     theta=10000.0, max_pos=2048),
}


def hf_config(s, **kw):
    import transformers
    cfg = transformers.LlamaConfig(
        hidden_size=s["hidden"], intermediate_size=s["ffn"], num_hidden_layers=s["layers"],
        num_attention_heads=s["heads"], num_key_value_heads=s["kv_heads"],
        vocab_size=s["vocab"], max_position_embeddings=s["max_pos"], rms_norm_eps=1e-5,
        tie_word_embeddings=False, **kw)
    try:
        cfg.rope_parameters = {"rope_type": "default", "rope_theta": s["theta"]}
    except Exception:
        cfg.rope_theta = s["theta"]
    return cfg


def hf_model_on_gpu(cfg):
    """A LlamaForCausalLM built directly on the GPU in bf16 (sdpa attention)."""
    import transformers
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device(DEV):
            try:
                m = transformers.LlamaForCausalLM._from_config(cfg, attn_implementation="sdpa",
                                                               dtype=torch.bfloat16)
            except TypeError:
                m = transformers.LlamaForCausalLM._from_config(cfg, attn_implementation="sdpa",
                                                               torch_dtype=torch.bfloat16)
    finally:
        torch.set_default_dtype(old)
    return m.eval()


def copy_weights(eng, model):
    sync()
    n = 0
    for name, p in model.named_parameters():
        eng.export(name, p.data_ptr(), p.numel() * p.element_size())
        n += 1
    return n


# ---- correctness ----------------------------------------------------------------------


def init_weights(model, seed=0):
    """O(1) logits (HF's default init gives near-ties that make greedy fragile)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                v = 1 + 0.1 * torch.randn(p.shape, generator=g)
            elif "embed" in name:
                v = torch.randn(p.shape, generator=g)
            else:
                v = torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5
            p.copy_(v.to(p.dtype))


@torch.no_grad()
def hf_greedy(model, prompt, steps):
    dev = next(model.parameters()).device
    out = model(torch.tensor([prompt], device=dev), use_cache=True)
    past, logits, tokens = out.past_key_values, [], []
    for i in range(steps):
        lg = out.logits[0, -1].float()
        logits.append(lg)
        tok = int(torch.argmax(lg))
        tokens.append(tok)
        if i + 1 < steps:
            out = model(torch.tensor([[tok]], device=dev), past_key_values=past, use_cache=True)
            past = out.past_key_values
    return tokens, torch.stack(logits).cpu()


def check(args):
    import transformers
    steps = 33  # the prefill's token and 32 decode steps
    s = dict(layers=2, hidden=512, heads=4, kv_heads=2, ffn=1024, vocab=512, theta=10000.0,
             max_pos=512)
    cfg = hf_config(s)
    model = transformers.LlamaForCausalLM(cfg)
    init_weights(model)
    model = model.to(torch.bfloat16)
    prompts = [[1, 17, 42, 99, 3, 250, 7], [5, 6, 200, 31, 8, 9, 10, 11, 12, 13, 100] * 12, [77]]
    failures = []
    with tempfile.TemporaryDirectory() as d:
        model.save_pretrained(d, safe_serialization=True)
        ref = transformers.LlamaForCausalLM.from_pretrained(d, dtype=torch.bfloat16)
        ref = ref.to(args.device).eval()
        results = {}
        for graphs in ("1", "0"):
            os.environ["OTE_CUDA_GRAPHS"] = graphs
            with E.Engine.from_pretrained(d, dtype="bf16", device=args.device,
                                          max_seqs=len(prompts), max_len=256) as eng:
                results[graphs] = eng.generate(prompts, steps, stop=[], return_logits=True)
                results[graphs + "greedy"] = eng.generate(prompts, steps, stop=[])
                if graphs == "1":
                    note = eng.cuda_graph_note
                    # one prompt alone: its prefill takes the dense attention layout
                    results["single"] = eng.generate([prompts[1]], steps, stop=[],
                                                     return_logits=True)
                    # batch 1 greedy: the argmax fused into lm_head (fused_kernels.cu)
                    results["single_greedy"] = eng.generate([prompts[1]], steps, stop=[])
        os.environ.pop("OTE_CUDA_GRAPHS", None)
    r = results["1"]
    print(f"engine: decode CUDA graph {'on' if r.cuda_graph else 'off'} {note}")
    if not r.cuda_graph and args.device == "cuda":
        failures.append(f"decode did not replay a CUDA graph ({note})")
    # per-step logits [n_live, V]: every prompt is live for all steps (no stop ids)
    got = torch.stack([torch.from_numpy(x) for x in r.logits])  # [steps, n, V]
    atol, rtol = 0.1, 0.05
    worst = 0.0
    single = torch.stack([torch.from_numpy(x) for x in results["single"].logits])
    cases = [(i, p, r.tokens[i], got[:, i], "") for i, p in enumerate(prompts)]
    cases.append((1, prompts[1], results["single"].tokens[0], single[:, 0], " alone"))
    for i, p, toks, got_i, label in cases:
        ref_tokens, ref_logits = hf_greedy(ref, p, steps)
        n = 0
        while n < steps and toks[n] == ref_tokens[n]:
            n += 1
        cmp = got_i[: min(n + 1, steps)]
        err = (cmp - ref_logits[: n + 1]).abs()
        worst = max(worst, float(err.max()))
        try:
            torch.testing.assert_close(cmp, ref_logits[: n + 1], atol=atol, rtol=rtol)
        except AssertionError as ex:
            failures.append(f"prompt {i}{label} (len {len(p)}): logits: {str(ex).splitlines()[0:3]}")
        if n < steps:
            top = torch.topk(ref_logits[n], 2).values
            gap = float(top[0] - top[1])
            print(f"prompt {i}{label}: tokens part at step {n} (HF top-2 gap {gap:.3f})")
            if gap >= 2 * atol:
                failures.append(f"prompt {i}{label}: greedy tokens part at step {n} without a near-tie")
        print(f"prompt {i}{label} (len {len(p)}): {n}/{steps} greedy tokens equal HF, "
              f"max |logit diff| {float(err.max()):.4f}")
    if results["1greedy"].tokens != r.tokens:
        failures.append("device argmax tokens differ from the host's argmax of the logits")
    if results["single_greedy"].tokens != results["single"].tokens:
        failures.append("batch 1: device argmax tokens differ from the host's argmax of the logits")
    g0 = results["0"]
    if g0.tokens != r.tokens:
        failures.append("graph off: tokens differ from graph on")
    d = max(float(abs(a - b).max()) for a, b in zip(g0.logits, r.logits))
    print(f"graph on vs off: max |logit diff| {d}")
    if d != 0.0:
        failures.append(f"graph on vs off: logits differ by {d}")
    # random weights made on the GPU equal the CPU's bit for bit (same splitmix64 streams)
    if args.device == "cuda":
        a = E.Engine.random("test-gqa", seed=7, dtype="bf16", device="cuda")
        b = E.Engine.random("test-gqa", seed=7, dtype="bf16", device="cpu", threads=1)
        for name, shape in [("model.embed_tokens.weight", (256, 64)),
                            ("model.layers.1.self_attn.k_proj.weight", (32, 64)),
                            ("model.layers.0.mlp.down_proj.weight", (64, 128)),
                            ("model.norm.weight", (64,))]:
            ta = torch.empty(shape, dtype=torch.bfloat16, device="cuda")
            tb = torch.empty(shape, dtype=torch.bfloat16)
            a.export(name, ta.data_ptr(), ta.numel() * 2)
            b.export(name, tb.data_ptr(), tb.numel() * 2)
            if not torch.equal(ta.cpu(), tb):
                failures.append(f"random weights: {name} differs between the GPU and the CPU")
        a.close()
        b.close()
        print("random weights on the GPU == CPU: "
              f"{'yes' if not any('random weights' in f for f in failures) else 'NO'}")
    print(f"check: max |logit diff| vs HF {worst:.4f}; "
          f"{'PASS' if not failures else 'FAIL'}")
    for f in failures:
        print("  FAIL", f)
    return {"max_abs_logit_diff_vs_hf": round(worst, 4), "failures": failures,
            "graph": r.cuda_graph}


# ---- benchmark ------------------------------------------------------------------------


def gemm_tflops():
    n = 8192 if DEV == "cuda" else 512
    a = torch.randn(n, n, device=DEV, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=DEV, dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    sync()
    return 2 * n ** 3 / (timed_ms(lambda: a @ b, 10, 3) * 1e-3) / 1e12


def read_tbps():
    n = 2 * 1024 ** 3 if DEV == "cuda" else 1 << 24
    x = torch.empty(n, device=DEV, dtype=torch.bfloat16).uniform_()
    for _ in range(2):
        x.sum()
    sync()
    bw = x.numel() * 2 / (timed_ms(lambda: x.sum(), 10) * 1e-3) / 1e12
    del x
    return bw


def wall(fn):
    sync()
    t = time.perf_counter()
    fn()
    sync()
    return (time.perf_counter() - t) * 1e3


def params(s):
    H, L, F, V = s["hidden"], s["layers"], s["ffn"], s["vocab"]
    D = H // s["heads"]
    qkv = (s["heads"] + 2 * s["kv_heads"]) * D
    layer = qkv * H + H * s["heads"] * D + 3 * F * H + 2 * H
    return layer * L + H, 2 * V * H  # non-embedding (with the final norm), embed + lm_head


def prefill_flops(s, S):
    nonemb, _ = params(s)
    D = s["hidden"] // s["heads"]
    attn = 2 * s["layers"] * s["heads"] * S * S * D  # 4 * L * H * S^2 * D / 2 (causal)
    return 2 * nonemb * S + attn + 2 * s["vocab"] * s["hidden"]


def decode_bytes(s, B, ctx):
    nonemb, emb = params(s)
    D = s["hidden"] // s["heads"]
    kv = B * ctx * s["layers"] * 2 * s["kv_heads"] * D * 2
    return (nonemb + emb // 2) * 2 + kv  # lm_head read; the embedding's B rows are negligible


def median_split(splits):
    """the median of each part of Engine.last_timing over calls, rounded"""
    keys = ("host_prep", "enqueue", "wait", "gpu", "total")
    return {k: round(statistics.median(t[k] for t in splits), 3) for k in keys}


# decode at batch 1 again with its linears chosen otherwise (read when the graph is
# captured): name -> environment. The default: ot_linear_forward's automatic choice (the
# small-M kernel for o_proj and lm_head, as programmatic dependent launches on sm_90).
DECODE_VARIANTS = {
    "small_m_no_pdl": {"OT_LINEAR_PDL": "0"},   # the same kernels, launched without PDL
    "all_small_m": {"OT_LINEAR_GEMV": "1"},     # every M = 1 linear on the small-M kernel
    "all_cublaslt": {"OT_LINEAR_GEMV": "0"},    # every linear on cuBLASLt
    # the small-M kernel's grid before rows per warp (one row per warp, several waves)
    "gemv_one_row_per_warp": {"OT_LINEAR_GEMV_BALANCE": "0"},
    "all_small_m_one_row_per_warp": {"OT_LINEAR_GEMV": "1", "OT_LINEAR_GEMV_BALANCE": "0"},
    # cuBLASLt's 8 best heuristic algorithms timed on the first call of each GEMM, the
    # fastest kept (linear.cu, OT_GEMM_AUTOTUNE; "v": each pick printed to stderr)
    "gemm_autotune": {"OT_GEMM_AUTOTUNE": "8v"},
    # the engine's fused one-row linears (src/engine/fused_kernels.cu) off, or one of them:
    # RMSNorm (+ residual add) into qkv / gate_up / lm_head (+ the greedy argmax), RoPE + KV
    # append into qkv, SwiGLU into gate_up's epilogue (or into down_proj)
    "unfused": {"OTE_FUSED_NORM": "0", "OTE_FUSED_OPROJ": "0"},
    "fused_no_glu": {"OTE_FUSED_GLU": "0"},  # SwiGLU as ot_glu_forward
    "fused_swiglu_down": {"OTE_FUSED_SWIGLU": "1"},  # SwiGLU inside down_proj's kernel
    "fused_no_rope": {"OTE_FUSED_ROPE": "0"},  # RoPE + KV append by ot_kv_append
    "fused_one_row": {"OTE_FUSED_PAIR": "0"},  # one row of W per warp task, not two
    "fused_waves_4": {"OTE_FUSED_WAVES": "4"},  # blocks capped at 4 waves (default 2)
    "fused_waves_2": {"OTE_FUSED_WAVES": "2"},  # the default's value (2), named
    "fused_waves_all": {"OTE_FUSED_WAVES": "0"},  # no cap: a task per warp
    "fused_waves_1": {"OTE_FUSED_WAVES": "1"},  # one wave of blocks
    # o_proj on the engine's staged kernel (fused_kernels.cu: its weight loaded into
    # registers and shared memory before its PDL wait, during the attention; the default
    # since 2026-11-30 evening), or on the library's small-M kernel (the default before)
    "fused_oproj": {"OTE_FUSED_OPROJ": "1"},
    "oproj_library": {"OTE_FUSED_OPROJ": "0"},
    # that one launched without PDL (its CTAs then never share the SMs with the merge's)
    "oproj_library_no_pdl": {"OTE_FUSED_OPROJ": "0", "OT_LINEAR_PDL": "0"},
    # the paged decode's merge kernel (paged_attention.cu): the old one (several dependent
    # round trips, the default before 65b7cc8), with the staged o_proj and with the
    # library's (= the step as it was before this evening); the one-round merge with 16 O
    # rows a lane ahead (OT_PAGED_MERGE=2, 7ef2064)
    "paged_merge_0": {"OT_PAGED_MERGE": "0"},
    "paged_merge_0_oproj_library": {"OT_PAGED_MERGE": "0", "OTE_FUSED_OPROJ": "0"},
    "paged_merge_2": {"OT_PAGED_MERGE": "2"},
    # down_proj on the engine's rowblock kernel (fused_kernels.cu, opt-in, prepared
    # 2026-11-30: K split over a CTA, no split-K reduce kernel, the residual add folded in;
    # OTE_FUSED_DOWN=2: it must run), with 2 rows of Wd in flight a thread instead of 4, and
    # with the merge of OT_PAGED_MERGE=2
    "fused_down": {"OTE_FUSED_DOWN": "2"},
    "fused_down_depth_2": {"OTE_FUSED_DOWN": "2", "OTE_FUSED_DOWN_DEPTH": "2"},
    "fused_down_merge_2": {"OTE_FUSED_DOWN": "2", "OT_PAGED_MERGE": "2"},
    "fused_down_depth_2_merge_2": {"OTE_FUSED_DOWN": "2", "OTE_FUSED_DOWN_DEPTH": "2",
                                   "OT_PAGED_MERGE": "2"},
    # qkv (and gate_up) on the rowblock scheme too (fused_kernels.cu rowblock_norm_kernel,
    # opt-in: K split over a CTA, 2 vectors a thread a row, a ring of 8 rows -- 4 with
    # OTE_FUSED_RB_DEPTH=4 --; =2: it must run)
    "fused_qkv": {"OTE_FUSED_QKV": "2"},
    "fused_qkv_depth_4": {"OTE_FUSED_QKV": "2", "OTE_FUSED_RB_DEPTH": "4"},
    "fused_qkv_merge_2": {"OTE_FUSED_QKV": "2", "OT_PAGED_MERGE": "2"},
    "fused_qkv_gateup": {"OTE_FUSED_QKV": "2", "OTE_FUSED_GATEUP": "2"},
    "fused_qkv_down": {"OTE_FUSED_QKV": "2", "OTE_FUSED_DOWN": "2", "OTE_FUSED_DOWN_DEPTH": "2"},
    # gate_up alone on it (the run of 79383d9: qkv + gate_up equal to the default, where qkv
    # alone lost 0.08 ms), with 4 rows in flight, and behind the merge of OT_PAGED_MERGE=2
    "fused_gateup": {"OTE_FUSED_GATEUP": "2"},
    "fused_gateup_depth_4": {"OTE_FUSED_GATEUP": "2", "OTE_FUSED_RB_DEPTH": "4"},
    "fused_gateup_merge_2": {"OTE_FUSED_GATEUP": "2", "OT_PAGED_MERGE": "2"},
    # the paged decode's split count forced (paged_attention.cu plans from the table's size,
    # max_len: 2080 keys -> 33 splits of 64 keys at batch 1, 264 CTAs + a 33-way merge;
    # the engine's attention was 14.6 + 11.8 us a layer in the run of 6c654c8 against ~12.6
    # for a standalone 1 x 2k call): fewer, longer splits
    "paged_splits_32": {"OT_PAGED_SPLITS": "32"},  # one merge round (the plan takes 33)
    "paged_splits_24": {"OT_PAGED_SPLITS": "24"},
    # with the merge in one round, o_proj's weight from L2 (prefetched by the qkv kernel)
    "paged_splits_32_l2pf_o": {"OT_PAGED_SPLITS": "32", "OTE_L2_PF_OPROJ": "1"},
    "paged_splits_32_l2pf_o_early": {"OT_PAGED_SPLITS": "32", "OTE_L2_PF_OPROJ": "2"},
    "paged_merge_2_l2pf_o": {"OT_PAGED_MERGE": "2", "OTE_L2_PF_OPROJ": "1"},
    "paged_splits_16": {"OT_PAGED_SPLITS": "16"},
    "paged_splits_8": {"OT_PAGED_SPLITS": "8"},
    # the decode attention's early start (ot_attention_params.paged_kv_ready) off
    "kv_ready_off": {"OTE_PAGED_KV_READY": "0"},
    # the staged o_proj prefetches to L2, during the attention (when the DRAM is mostly
    # idle), MB of the same layer's gate_up weight (its first features' gate and up rows)
    # and of the next layer's qkv (fused_kernels.cu l2_prefetch_share, OTE_L2_PF_*);
    # "last": with the evict-last policy; "o": the fused qkv kernel prefetches the same
    # layer's whole o_proj weight at its end (OTE_L2_PF_OPROJ), for the staged o_proj
    "l2pf_gu_16": {"OTE_L2_PF_GATEUP": "16"},
    "l2pf_gu_24": {"OTE_L2_PF_GATEUP": "24"},
    "l2pf_gu_32": {"OTE_L2_PF_GATEUP": "32"},
    "l2pf_gu_16_last": {"OTE_L2_PF_GATEUP": "16", "OTE_L2_PF_LAST": "1"},
    "l2pf_gu_24_last": {"OTE_L2_PF_GATEUP": "24", "OTE_L2_PF_LAST": "1"},
    "l2pf_gu_32_last": {"OTE_L2_PF_GATEUP": "32", "OTE_L2_PF_LAST": "1"},
    "l2pf_gu_40_last": {"OTE_L2_PF_GATEUP": "40", "OTE_L2_PF_LAST": "1"},
    "l2pf_gu_16_qkv_16_last": {"OTE_L2_PF_GATEUP": "16", "OTE_L2_PF_QKV": "16",
                               "OTE_L2_PF_LAST": "1"},
    "l2pf_gu_24_qkv_8_last": {"OTE_L2_PF_GATEUP": "24", "OTE_L2_PF_QKV": "8",
                              "OTE_L2_PF_LAST": "1"},
    "l2pf_qkv_16_last": {"OTE_L2_PF_QKV": "16", "OTE_L2_PF_LAST": "1"},
    "l2pf_o": {"OTE_L2_PF_OPROJ": "1"},
    "l2pf_o_last": {"OTE_L2_PF_OPROJ": "1", "OTE_L2_PF_LAST": "1"},
    "l2pf_o_early": {"OTE_L2_PF_OPROJ": "2"},
    "l2pf_o_early_last": {"OTE_L2_PF_OPROJ": "2", "OTE_L2_PF_LAST": "1"},
    "l2pf_o_gu_16": {"OTE_L2_PF_OPROJ": "1", "OTE_L2_PF_GATEUP": "16"},
    "l2pf_o_gu_24": {"OTE_L2_PF_OPROJ": "1", "OTE_L2_PF_GATEUP": "24"},
    # the batch-1 decode's attention, merge and o_proj as one kernel (fused_kernels.cu
    # attn_oproj_kernel; =2: it must run), and its key ranges a kv head capped
    "attn_oproj": {"OTE_FUSED_ATTN_OPROJ": "2"},
    "attn_oproj_splits_8": {"OTE_FUSED_ATTN_OPROJ": "2", "OTE_ATTN_OPROJ_SPLITS": "8"},
    "attn_oproj_splits_4": {"OTE_FUSED_ATTN_OPROJ": "2", "OTE_ATTN_OPROJ_SPLITS": "4"},
    # with the rowblock down_proj (ld.global.cs) in place of cuBLASLt's: every weight stream
    # of the step evict-first in the L2 (does the kernels' code then stay in it?)
    "attn_oproj_fused_down": {"OTE_FUSED_ATTN_OPROJ": "2", "OTE_FUSED_DOWN": "2"},
    "repeat": {},  # the default again, last: the run's drift
}
AUTOTUNE_ENV = DECODE_VARIANTS["gemm_autotune"]
# --prefill-variants: the one-prompt prefill (TTFT) under these settings, alternated with the
# default (ttft_ab), and its timeline (timelines) -- the prefill's own opt-ins
PREFILL_VARIANTS = {
    # final norm + lm_head + argmax on the decode's fused kernel (no copies, no separate
    # norm / argmax kernels: ~45 us of the tail in the timeline of fa0fbb6, docs/ENGINE.md)
    "fused_head": {"OTE_PREFILL_FUSED_HEAD": "1"},
    # the Hopper forward's causal tiles on the static round-robin with L2 sections counted
    # in query heads (the order before the dynamic schedule, attention_fwd_sm90.cu)
    "static_attn": {"OT_ATTN_SM90_DYN": "0", "OT_ATTN_SM90_SECT": "mha"},
    # RoPE and the KV append in one kernel (ot_rope_kv_append; the default since 2026-12-07,
    # so this variant runs the default's kernels) / as ot_rope_forward and then ot_kv_append
    "rope_kv_fused": {"OTE_PREFILL_ROPE_KV": "1"},
    "rope_kv_split": {"OTE_PREFILL_ROPE_KV": "0"},
    # the same op on the append's vector kernel (a thread group per head row, cos / sin made
    # for each row) instead of its warp kernel (a warp per token, cos / sin once a token)
    "rope_kv_fused_vec": {"OTE_PREFILL_ROPE_KV": "1", "OT_KV_APPEND_WARP": "0"},
}
PREFILL_AB = []  # --prefill-variants

MARKS = []
TTFT_DIAG = True  # --no-ttft-diag: skip ttft_diagnostics
TIMELINE = True  # --no-timeline: skip timelines
TIMELINE_VARIANTS = []  # --timeline-variants: decode timelines under these variants too


def mark(label):
    """a wall-clock mark (unix seconds) to line up with the device script's nvidia-smi log"""
    MARKS.append([label, round(time.time(), 3)])
    print(f"[mark {MARKS[-1][1]:.3f}] {label}", flush=True)


def decode_steps(eng, nxt, steps, warm):
    """median wall ms per step after warm steps, and the median split of the steps"""
    ts, splits = [], []
    for i in range(warm + steps):
        t = time.perf_counter()
        nxt = eng.decode(nxt, greedy=True)
        ts.append((time.perf_counter() - t) * 1e3)
        splits.append(eng.last_timing())
    return statistics.median(ts[warm:]), median_split(splits[warm:])


def ttft_after_idle(call, n=4, idle_s=0.25):
    """TTFT of a lone request: the median wall time of n calls, each after idle_s of idle
    GPU. Back to back, long prefills run into the GPU's power cap (SM clock 1980 -> ~1630
    MHz on the H200, run of 1a5683a); engine and HF are measured both ways."""
    ts = []
    for _ in range(n):
        sync()
        time.sleep(idle_s)
        ts.append(wall(call))
    return round(statistics.median(ts), 3)


def ttft_diagnostics(eng, prompt):
    """Where a TTFT call's GPU time goes beyond the ops' own (the profile's sum): the
    forward's GPU time (last_timing) with the GPU held by a spin kernel until the host has
    enqueued it all (OTE_PREFILL_SPIN_NS), after 250 ms of idle GPU (clock / power state),
    and the per-op profile with no spin (OTE_PROFILE_SPIN_NS=0: each op as the host
    enqueues it, back to back like the TTFT calls) next to the usual one."""
    d = {}

    def gpu_ms(n, before=None):
        g = []
        for _ in range(n):
            if before:
                before()
            eng.prefill([prompt], greedy=True)
            g.append(eng.last_timing()["gpu"])
        return round(statistics.median(g[1:]), 3), [round(x, 2) for x in g]

    with env_set({"OTE_PREFILL_SPIN_NS": "8000000"}):
        d["gpu_ms_prequeued"], d["gpu_ms_prequeued_all"] = gpu_ms(6)
    d["gpu_ms_after_idle_250ms"], d["gpu_ms_after_idle_all"] = gpu_ms(
        4, lambda: time.sleep(0.25))
    d["gpu_ms_back_to_back"], d["gpu_ms_back_to_back_all"] = gpu_ms(6)
    mark("ttft diag: gpu times done")
    for spin in ("0", "8000000"):
        with env_set({"OTE_PROFILE_SPIN_NS": spin}):
            eng.set_profile(True)
            for _ in range(5):
                eng.prefill([prompt], greedy=True)
            d[f"profile_spin_ns_{spin}"] = eng.profile_report()
            eng.set_profile(False)
    mark("ttft diag: profiles done")
    print(f"TTFT diagnostics: {json.dumps(d)}", flush=True)
    return d


def gpu_kernels(fn):
    """fn() under torch.profiler (CUPTI: every kernel, memcpy and memset of the process,
    the engine's own stream and its graph replays included): [(start_us, end_us, name)]
    sorted by start, or the reason none came."""
    from torch.profiler import ProfilerActivity, profile
    with tempfile.TemporaryDirectory() as td:
        path = os.path.join(td, "trace.json")
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            sync()
        prof.export_chrome_trace(path)
        with open(path) as f:
            trace = json.load(f)
    evs = trace.get("traceEvents", trace) if isinstance(trace, dict) else trace
    ks = sorted((float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0)), e.get("name", "?"))
                for e in evs if isinstance(e, dict) and e.get("ph") == "X"
                and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"))
    return ks


def short_name(n):
    """a kernel's name without template arguments and parameter lists (readable tables)"""
    out, depth = [], 0
    for ch in n:
        if ch in "<(":
            depth += 1
        elif ch in ">)":
            depth = max(0, depth - 1)
        elif depth == 0:
            out.append(ch)
    t = "".join(out).replace("void ", "").strip()
    return (t or n)[:60]


def layer_table(ks, layers):
    """Kernels of one forward as a repeating layer: the head (before the first layer), per
    position of the layer's period the median duration and the median gap from the end of
    the kernel before (negative: it started before that one ended, a PDL overlap), and the
    tail. None when no period of `layers` repeats is found."""
    names = [short_name(k[2]) for k in ks]
    n = len(ks)
    for p in range(2, 40):
        for h in range(0, 8):
            if h + layers * p > n:
                break
            if all(names[h + l * p + j] == names[h + j] for l in range(layers) for j in range(p)):
                def stats(i0):
                    d = [ks[i0 + l * p][1] - ks[i0 + l * p][0] for l in range(layers)]
                    g = [ks[i0 + l * p][0] - ks[i0 + l * p - 1][1] for l in range(layers)
                         if i0 + l * p > 0]
                    return (round(statistics.median(d), 2),
                            round(statistics.median(g), 2) if g else None)
                def rel(j):
                    """median start / end of position j from the end of the layer's first
                    kernel (decode: the fused qkv), so a span across PDL overlaps reads off
                    (e.g. qkv end -> o_proj start: the attention's share of the layer)"""
                    st = [ks[h + l * p + j][0] - ks[h + l * p][1] for l in range(layers)]
                    en = [ks[h + l * p + j][1] - ks[h + l * p][1] for l in range(layers)]
                    return (round(statistics.median(st), 2), round(statistics.median(en), 2))
                per = []
                for j in range(p):
                    d, g = stats(h + j)
                    s0, e0 = rel(j)
                    per.append({"kernel": names[h + j], "us": d, "gap_before_us": g,
                                "start_from_first_end_us": s0, "end_from_first_end_us": e0})
                one = lambda i: {"kernel": names[i], "us": round(ks[i][1] - ks[i][0], 2),
                                 "gap_before_us": round(ks[i][0] - ks[i - 1][1], 2) if i else None}
                return {"period": p, "head": [one(i) for i in range(h)], "layer": per,
                        "tail": [one(i) for i in range(h + layers * p, n)]}
    return None


def linear_positions(layer, s, tokens):
    """Bytes and FLOPs of the layer's linears, in their order in the period (qkv, o_proj,
    gate_up, down: the kernels named like a GEMM / the small-M kernel, not a split-K sum;
    a split-K GEMM's time is its main kernel's)."""
    H, F = s["hidden"], s["ffn"]
    D = H // s["heads"]
    shapes = [("qkv", (s["heads"] + 2 * s["kv_heads"]) * D, H), ("o_proj", H, s["heads"] * D),
              ("gate_up", 2 * F, H), ("down", H, F)]
    gemmish = ("gemm", "gemv", "xmma", "cutlass", "matmul", "nvjet")
    idx = [j for j, r in enumerate(layer)
           if any(t in r["kernel"].lower() for t in gemmish)
           and "reduce" not in r["kernel"].lower()]
    out = {}
    if len(idx) == 4:
        for j, (nm, N, K) in zip(idx, shapes):
            out[j] = (nm, 2 * N * K, 2 * tokens * N * K)
    return out


def timelines(eng, s, prompt, rbw, gemm):
    """The GPU timeline (CUPTI, torch.profiler) of 3 decode steps at batch 1 (CUDA graph
    replays, context of the prompt) and of one prefill of the prompt: per layer position,
    each kernel's time and the gap before it; the linears against the read ceiling
    (decode) or the GEMM rate (prefill). What a step spends between kernels (launch,
    drain, ramp) is the step's span less the kernels' busy time."""
    L = s["layers"]
    out = {}
    box = [None]

    def start():  # a fresh sequence: prefill, eager step, capture, replays
        eng.free(0)
        nxt = eng.prefill([prompt], greedy=True)
        for _ in range(4):
            nxt = eng.decode(nxt, greedy=True)
        box[0] = nxt

    def dec():
        for _ in range(3):
            box[0] = eng.decode(box[0], greedy=True)

    def one(name, fn, tokens):
        try:
            out[name] = timeline_of(gpu_kernels(fn), name, s, L, tokens, rbw, gemm)
        except Exception as ex:  # the profiler may be unavailable: report, go on
            out[name] = {"error": f"{type(ex).__name__}: {ex}"[:300]}
        print(f"timeline {name}: {json.dumps(out[name])}", flush=True)

    start()
    one("decode_b1", dec, 1)
    one("prefill", lambda: eng.prefill([prompt], greedy=True), len(prompt))
    for v in PREFILL_AB:  # --prefill-variants: the prefill under a variant's env
        with env_set(PREFILL_VARIANTS[v]):
            eng.prefill([prompt], greedy=True)  # (a first call: its lazy setup untimed)
            one(f"prefill_{v}", lambda: eng.prefill([prompt], greedy=True), len(prompt))
        same = same_kernels(out["prefill"], out[f"prefill_{v}"])
        out[f"prefill_{v}"]["same_kernels_as_default"] = same
        if same:  # (2026-12-07: a switch read at engine creation made such an "A/B")
            print(f"WARNING: prefill variant {v} ({PREFILL_VARIANTS[v]}) ran the default's "
                  "kernels: its A/B compares the default with itself", flush=True)
    for v in TIMELINE_VARIANTS:  # --timeline-variants: the decode step under a variant's env
        with env_set(DECODE_VARIANTS[v]):
            start()  # (the graph is captured under the variant's env)
            one(f"decode_b1_{v}", dec, 1)
    eng.free(0)
    return out


def kernel_names(t):
    """The kernel names of a timelines() table, in order (None: the table has an error)."""
    if "error" in t:
        return None
    rows = t.get("head", []) + t.get("layer", []) + t.get("tail", [])
    if "kernels" in t:
        return [k[2] for k in t["kernels"]]
    return [r["kernel"] for r in rows]


def same_kernels(a, b):
    """Whether two timelines() tables ran the same kernels (None when either failed)."""
    na, nb = kernel_names(a), kernel_names(b)
    return None if na is None or nb is None else na == nb


def timeline_of(ks, name, s, L, tokens, rbw, gemm):
    """timelines' table of one profiled call's kernels ks"""
    if name.startswith("decode_b1"):  # one whole step, the 2nd of 3: its first kernel to the 3rd's
        first = short_name(ks[0][2]) if ks else ""
        starts = [i for i, k in enumerate(ks) if short_name(k[2]) == first]
        if len(starts) >= 3:
            ks = ks[starts[-2]:starts[-1]]
    busy, end = 0.0, None
    for a, b, _ in ks:  # the union of the kernels' intervals
        if end is None or a >= end:
            busy += b - a
            end = b
        elif b > end:
            busy += b - end
            end = b
    span = ks[-1][1] - ks[0][0] if ks else 0.0
    t = layer_table(ks, L) or {"kernels": [[round(a, 1), round(b - a, 2), short_name(n)]
                                           for a, b, n in ks[:400]]}
    t.update({"kernels_n": len(ks), "span_ms": round(span / 1e3, 3),
              "busy_ms": round(busy / 1e3, 3), "idle_ms": round((span - busy) / 1e3, 3)})
    if "layer" in t:
        for j, (nm, wbytes, flops) in linear_positions(t["layer"], s, tokens).items():
            r = t["layer"][j]
            r["linear"] = nm
            if tokens == 1:
                r["read_TBps"] = round(wbytes / (r["us"] * 1e-6) / 1e12, 2)
                r["of_read_ceiling"] = round(wbytes / (r["us"] * 1e-6) / 1e12 / rbw, 3)
            else:
                r["TFLOPs"] = round(flops / (r["us"] * 1e-6) / 1e12, 1)
                r["of_gemm_rate"] = round(flops / (r["us"] * 1e-6) / 1e12 / gemm, 3)
        t["layer_us"] = round(sum(r["us"] for r in t["layer"]), 2)
        t["layer_gaps_us"] = round(sum(r["gap_before_us"] or 0 for r in t["layer"]), 2)
    return t


def ttft_ab(eng, prompt, env, name, n=6):
    """TTFT under env against the default, alternated in ABBA order (default, env, env,
    default, ...) so that the GPU's clock drift (power cap) falls on both alike, to first
    order even within a pair; env's first call untimed (OT_GEMM_AUTOTUNE tunes the prefill's
    GEMMs there). Besides the medians, the median of the n paired differences (env minus
    default, each pair adjacent in time): the figure to read for a lever smaller than the
    drift between rounds (2026-12-07, H100: 1 ms between the medians of two arms of the same
    code)."""
    with env_set(env):
        eng.prefill([prompt], greedy=True)
    a, b, ga, gb = [], [], [], []

    def run_default():
        a.append(wall(lambda: eng.prefill([prompt], greedy=True)))
        ga.append(eng.last_timing()["gpu"])

    def run_env():
        with env_set(env):
            b.append(wall(lambda: eng.prefill([prompt], greedy=True)))
            gb.append(eng.last_timing()["gpu"])

    for i in range(n):
        for f in ((run_default, run_env) if i % 2 == 0 else (run_env, run_default)):
            f()
    r = {"ttft_ms_default": round(statistics.median(a), 3),
         f"ttft_ms_{name}": round(statistics.median(b), 3),
         "gpu_ms_default": round(statistics.median(ga), 3),
         f"gpu_ms_{name}": round(statistics.median(gb), 3),
         f"ttft_ms_{name}_minus_default_paired": round(
             statistics.median(y - x for x, y in zip(a, b)), 3),
         f"gpu_ms_{name}_minus_default_paired": round(
             statistics.median(y - x for x, y in zip(ga, gb)), 3)}
    print(f"TTFT default / {name} ({env}), alternating: {r}", flush=True)
    return r


def ttft_autotune(eng, prompt, n=5):
    """TTFT with OT_GEMM_AUTOTUNE (its GEMMs tuned by the first call) against the default"""
    return ttft_ab(eng, prompt, AUTOTUNE_ENV, "autotune", n)


def engine_times(eng, s, prompt_len, batches, steps, warm, variants=()):
    g = torch.Generator().manual_seed(1)
    out = {}
    prompt = torch.randint(0, s["vocab"], (prompt_len,), generator=g).tolist()
    ttft, splits = [], []
    for _ in range(6):
        ttft.append(wall(lambda: eng.prefill([prompt], greedy=True)))
        splits.append(eng.last_timing())
    out["ttft_ms"] = statistics.median(ttft[1:])
    out["ttft_split_ms"] = median_split(splits[1:])
    print(f"TTFT {out['ttft_ms']:.2f} ms; split {out['ttft_split_ms']}", flush=True)
    mark("ttft done")
    if DEV == "cuda":
        out["ttft_autotune"] = ttft_autotune(eng, prompt)
        mark("ttft autotune done")
        for v in PREFILL_AB:  # --prefill-variants
            out[f"ttft_ab_{v}"] = ttft_ab(eng, prompt, PREFILL_VARIANTS[v], v)
            mark(f"ttft {v} done")
    if DEV == "cuda" and TTFT_DIAG:
        out["ttft_ms_after_idle"] = ttft_after_idle(lambda: eng.prefill([prompt], greedy=True))
        out["ttft_diag"] = ttft_diagnostics(eng, prompt)
    for B in batches:
        prompts = [torch.randint(0, s["vocab"], (prompt_len,), generator=g).tolist()
                   for _ in range(B)]
        nxt = eng.prefill(prompts, greedy=True)
        out[f"decode_ms_b{B}"], out[f"decode_split_b{B}"] = decode_steps(eng, nxt, steps, warm)
        out[f"graph_b{B}"] = eng.cuda_graph
        print(f"decode b{B}: {out[f'decode_ms_b{B}']:.3f} ms/step; split "
              f"{out[f'decode_split_b{B}']}", flush=True)
        mark(f"decode b{B} done")
        for i in range(B):
            eng.free(i)

    if DEV == "cuda" and 1 in batches:
        # the batch-1 greedy id (argmax fused into lm_head, fused_kernels.cu) against the
        # host's argmax of the same step's logits (the same kernels otherwise: two
        # prefills of the prompt, then one decode step each, with and without greedy)
        import numpy as np
        t0 = eng.prefill([prompt], greedy=True)
        lg = eng.decode(t0, greedy=False)
        eng.free(0)
        t1 = eng.prefill([prompt], greedy=True)
        ids = eng.decode(t1, greedy=True)
        eng.free(0)
        want = int(np.argmax(lg[0]))
        out["argmax_check_b1"] = {"device": int(ids[0]), "host": want, "equal": int(ids[0]) == want}
        print(f"batch-1 device argmax {ids[0]} vs host argmax of the logits {want}: "
              f"{'equal' if int(ids[0]) == want else 'DIFFER'}", flush=True)
        # the same decode with the linears chosen otherwise: what each choice buys, in
        # this run
        for name in variants:
            env = DECODE_VARIANTS[name]
            with env_set(env):
                nxt = eng.prefill([prompt], greedy=True)
                ms, split = decode_steps(eng, nxt, steps, warm)
                out[f"decode_ms_b1_{name}"] = ms
                out[f"decode_split_b1_{name}"] = split
                print(f"decode b1 {name} ({env}): {ms:.3f} ms/step; split {split}", flush=True)
                eng.free(0)
        # where the time goes: every op timed with events (eager, enqueued behind a spin)
        eng.set_profile(True)
        nxt = eng.prefill([prompt], greedy=True)
        for i in range(6):
            nxt = eng.decode(nxt, greedy=True)
        out["profile"] = eng.profile_report()
        eng.set_profile(False)
        eng.free(0)
        print(out["profile"], flush=True)
        mark("variants + profile done")
    return out


@torch.no_grad()
def hf_times(model, s, prompt_len, batches, steps, warm, compile_decode):
    import transformers
    g = torch.Generator().manual_seed(2)
    out = {}
    prompt = torch.randint(0, s["vocab"], (1, prompt_len), generator=g).to(DEV)

    def prefill_once():
        o = model(prompt, use_cache=True, logits_to_keep=1)
        o.logits[:, -1].argmax(-1).cpu()

    ttft = [wall(prefill_once) for _ in range(6)][1:]
    out["ttft_ms"] = statistics.median(ttft)
    if DEV == "cuda" and TTFT_DIAG:
        out["ttft_ms_after_idle"] = ttft_after_idle(prefill_once)
    for B in batches:
        ids = torch.randint(0, s["vocab"], (B, prompt_len), generator=g).to(DEV)
        o = model(ids, use_cache=True, logits_to_keep=1)
        cache = o.past_key_values
        tok = o.logits[:, -1].argmax(-1, keepdim=True)
        del o
        ts = []
        for i in range(warm + steps):
            t = time.perf_counter()
            o = model(tok, past_key_values=cache, use_cache=True)
            tok = o.logits[:, -1].argmax(-1, keepdim=True)
            tok.cpu()
            ts.append((time.perf_counter() - t) * 1e3)
        out[f"decode_ms_b{B}"] = statistics.median(ts[warm:])
        del cache, o, tok
        gc.collect()
        if DEV == "cuda":
            torch.cuda.empty_cache()
    if compile_decode:
        import signal

        def _timeout(signum, frame):
            raise TimeoutError(f"over the {compile_decode[1]} s time box")

        for B in compile_decode[0]:
            old = signal.signal(signal.SIGALRM, _timeout)
            signal.alarm(compile_decode[1])
            t0 = time.perf_counter()
            try:
                out[f"compiled_decode_ms_b{B}"] = hf_compiled_decode(model, s, prompt_len, B, steps)
                print(f"HF static cache + torch.compile, batch {B}: "
                      f"{out[f'compiled_decode_ms_b{B}']:.2f} ms/step "
                      f"(compile + run {time.perf_counter() - t0:.0f} s)", flush=True)
            except Exception as ex:  # report, keep the run going
                out[f"compiled_decode_failed_b{B}"] = f"{type(ex).__name__}: {ex}"[:300]
                print(f"HF static cache + torch.compile, batch {B}: skipped: "
                      f"{type(ex).__name__}: {str(ex)[:300]}", flush=True)
            finally:
                signal.alarm(0)
                signal.signal(signal.SIGALRM, old)
            gc.collect()
            torch.cuda.empty_cache()
    return out


@torch.no_grad()
def hf_compiled_decode(model, s, prompt_len, B, steps):
    import transformers
    cache = transformers.StaticCache(config=model.config, max_cache_len=prompt_len + steps + 8)
    ids = torch.randint(0, s["vocab"], (B, prompt_len)).to(DEV)
    o = model(ids, past_key_values=cache, use_cache=True, logits_to_keep=1,
              cache_position=torch.arange(prompt_len, device=DEV))
    tok = o.logits[:, -1].argmax(-1, keepdim=True)
    step = torch.compile(model.forward, mode="reduce-overhead", fullgraph=True)
    ts = []
    for i in range(steps + 3):
        pos = torch.tensor([prompt_len + i], device=DEV)
        t = time.perf_counter()
        o = step(tok, past_key_values=cache, use_cache=True, cache_position=pos)
        tok = o.logits[:, -1].argmax(-1, keepdim=True)
        tok.cpu()
        ts.append((time.perf_counter() - t) * 1e3)
    return statistics.median(ts[3:])


def save_rows(doc, s, name, P, args, ours, hf, mem, gemm, rbw):
    """the rows of one shape from the engine's (ours) and HF's times"""
    # rows: TTFT as prompt tokens/s, decode as tokens/s
    flops = prefill_flops(s, P)
    roof_ms = flops / (gemm * 1e12) * 1e3
    ttft_rate = P / (ours["ttft_ms"] * 1e-3)
    peers = {}
    if "ttft_ms" in hf:
        peers["HF transformers (sdpa)"] = round(P / (hf["ttft_ms"] * 1e-3), 1)
    row = {"op": "engine_prefill", "case": f"{name} bf16, {P}-token prompt, batch 1 (TTFT)",
           "metric": "tokens/s", "ours": round(ttft_rate, 1), "peers": peers,
           "ratio_best_peer": round(ttft_rate / max(peers.values()), 3) if peers else None,
           "fraction_of_ceiling": round(roof_ms / ours["ttft_ms"], 3),
           "ttft_ms": round(ours["ttft_ms"], 2),
           "peer_ttft_ms": {k: round(P / v * 1e3, 2) for k, v in peers.items()},
           "roofline_ms": round(roof_ms, 2), "memory_bytes": mem,
           "ttft_split_ms": ours.get("ttft_split_ms"), "ttft_diag": ours.get("ttft_diag"),
           "ttft_ms_after_idle": ours.get("ttft_ms_after_idle"),
           "peer_ttft_ms_after_idle": ({"HF transformers (sdpa)": hf["ttft_ms_after_idle"]}
                                       if "ttft_ms_after_idle" in hf else None),
           "profile_ms_per_forward": ours.get("profile"),
           "ttft_autotune": ours.get("ttft_autotune"),
           "timeline": (ours.get("timeline") or {}).get("prefill")}
    for v in PREFILL_AB:  # --prefill-variants
        row[f"ttft_ab_{v}"] = ours.get(f"ttft_ab_{v}")
        row[f"timeline_{v}"] = (ours.get("timeline") or {}).get(f"prefill_{v}")
    doc["rows"].append(row)
    for B in args.batches:
        ms = ours[f"decode_ms_b{B}"]
        rate = B / (ms * 1e-3)
        ceil = B / (decode_bytes(s, B, P) / (rbw * 1e12))
        peers = {}
        if f"decode_ms_b{B}" in hf:
            peers["HF transformers (sdpa, eager)"] = round(B / (hf[f"decode_ms_b{B}"] * 1e-3), 1)
        if f"compiled_decode_ms_b{B}" in hf:
            peers["HF static cache + torch.compile"] = round(
                B / (hf[f"compiled_decode_ms_b{B}"] * 1e-3), 1)
        doc["rows"].append({
            "op": "engine_decode", "case": f"{name} bf16, batch {B}, context {P}",
            "metric": "tokens/s", "ours": round(rate, 1), "peers": peers,
            "ratio_best_peer": round(rate / max(peers.values()), 3) if peers else None,
            "fraction_of_ceiling": round(rate / ceil, 3), "step_ms": round(ms, 3),
            "roofline_tokens_per_s": round(ceil, 1), "cuda_graph": ours[f"graph_b{B}"]})
        doc["rows"][-1]["step_split_ms"] = ours.get(f"decode_split_b{B}")
        if B == 1 and ours.get("timeline"):
            doc["rows"][-1]["timeline"] = ours["timeline"].get("decode_b1")
            for k, v in ours["timeline"].items():  # --timeline-variants
                if k.startswith("decode_b1_"):
                    doc["rows"][-1][f"timeline_{k[len('decode_b1_'):]}"] = v
        for vname in DECODE_VARIANTS:
            if f"decode_ms_b{B}_{vname}" in ours:
                doc["rows"][-1][f"step_ms_{vname}"] = round(ours[f"decode_ms_b{B}_{vname}"], 3)
                doc["rows"][-1][f"step_split_ms_{vname}"] = ours[f"decode_split_b{B}_{vname}"]
        if f"compiled_decode_failed_b{B}" in hf:
            doc["rows"][-1]["hf_compile_skipped"] = hf[f"compiled_decode_failed_b{B}"]


def bench(args, doc, save):
    gemm = gemm_tflops()
    rbw = read_tbps()
    doc["ceilings"] = {"gemm_bf16_TFLOPs": round(gemm, 1), "read_TBps": round(rbw, 3)}
    print(f"ceilings: bf16 GEMM {gemm:.0f} TFLOP/s, read {rbw:.2f} TB/s", flush=True)
    save()
    P = args.prompt_len
    for name in args.shapes.split(","):
        s = SHAPES[name]
        t0 = time.perf_counter()
        eng = E.Engine.random(name, seed=1, dtype="bf16", device=DEV, max_seqs=max(args.batches),
                              max_len=P + args.steps + 8)
        model = None
        if not args.no_hf:
            model = hf_model_on_gpu(hf_config(s))
            copy_weights(eng, model)
        print(f"{name}: engine + HF on the same weights in {time.perf_counter() - t0:.1f} s; "
              f"engine memory {eng.memory()}", flush=True)
        ours = engine_times(eng, s, P, args.batches, args.steps, 3,
                            [v for v in args.decode_variants.split(",") if v])
        mem = eng.memory()
        print(f"{name}: engine {ours}", flush=True)
        hf = {}

        def publish():
            """this shape's rows from what is measured so far (a run cut short keeps them)"""
            doc["rows"] = [r for r in doc["rows"] if not r["case"].startswith(f"{name} ")]
            save_rows(doc, s, name, P, args, ours, hf, mem, gemm, rbw)
            save()

        publish()
        mark(f"{name}: HF start")
        if not args.no_hf:
            try:
                hf = hf_times(model, s, P, args.batches, args.steps, 3,
                              (args.hf_compile_batches, args.hf_compile_timeout)
                              if args.hf_compile and name in args.hf_compile_shapes else None)
            except torch.cuda.OutOfMemoryError as ex:
                print(f"{name}: HF out of memory: {ex}")
            print(f"{name}: HF {hf}", flush=True)
            mark(f"{name}: HF done")
        del model
        if DEV == "cuda" and TIMELINE:  # last: no profiler (CUPTI) before any timing
            g = torch.Generator().manual_seed(3)
            prompt = torch.randint(0, s["vocab"], (P,), generator=g).tolist()
            ours["timeline"] = timelines(eng, s, prompt, rbw, gemm)
            mark(f"{name}: timelines done")
        eng.close()
        del eng
        gc.collect()
        if DEV == "cuda":
            torch.cuda.empty_cache()
        publish()


def table(doc):
    lines = ["| case | ours | best peer | ours / peer | fraction of roofline |",
             "|---|---|---|---|---|"]
    for r in doc.get("rows", []):
        if r["op"] == "engine_prefill":
            ours = f"TTFT {r['ttft_ms']:.1f} ms ({r['ours']:.0f} tok/s)"
            bp = (f"{min(r['peer_ttft_ms'].values()):.1f} ms ({max(r['peer_ttft_ms'], key=r['peer_ttft_ms'].get)})"
                  if r["peer_ttft_ms"] else "-")
        else:
            ours = f"{r['ours']:.1f} tok/s ({r['step_ms']:.2f} ms/step)"
            bp = (f"{max(r['peers'].values()):.1f} tok/s ({max(r['peers'], key=r['peers'].get)})"
                  if r["peers"] else "-")
        ratio = f"{r['ratio_best_peer']:.2f}x" if r["ratio_best_peer"] else "-"
        lines.append(f"| {r['case']} | {ours} | {bp} | {ratio} | {r['fraction_of_ceiling']*100:.0f}% |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--device", default="cuda", help="cuda, or cpu for a dry run of the script (--shapes test-gqa)")
    ap.add_argument("--bench", action="store_true")
    ap.add_argument("--shapes", default="llama3-8b,llama-13b")
    ap.add_argument("--batches", default="1,16")
    ap.add_argument("--prompt-len", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--hf-compile", action="store_true")
    ap.add_argument("--hf-compile-batches", default="1",
                    help="batches for HF static cache + torch.compile (default 1)")
    ap.add_argument("--hf-compile-shapes", default="llama3-8b")
    ap.add_argument("--hf-compile-timeout", type=int, default=120,
                    help="seconds per batch for compile + run; over it the peer is skipped")
    ap.add_argument("--no-hf", action="store_true")
    ap.add_argument("--no-ttft-diag", action="store_true",
                    help="skip the TTFT diagnostics (GPU time prequeued / after idle, "
                         "profiles with and without the spin)")
    ap.add_argument("--no-timeline", action="store_true",
                    help="skip the CUPTI timelines of a decode step and a prefill")
    ap.add_argument("--timeline-variants", default="",
                    help="comma-separated names of DECODE_VARIANTS: the batch-1 decode "
                         "step's timeline again under each")
    ap.add_argument("--prefill-variants", default="",
                    help="comma-separated names of PREFILL_VARIANTS: the one-prompt prefill's "
                         "TTFT alternated with the default's, and its timeline, under each")
    ap.add_argument("--decode-variants", default=",".join(DECODE_VARIANTS),
                    help="comma-separated names of DECODE_VARIANTS: batch-1 decode again with "
                         "the linears chosen otherwise ('' for none)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--table", default=None, help="write the markdown table here too")
    ap.add_argument("--commit", default=None)
    ap.add_argument("--command", default=None)
    args = ap.parse_args()
    args.batches = [int(b) for b in args.batches.split(",")]
    args.hf_compile_batches = [int(b) for b in args.hf_compile_batches.split(",")]
    args.hf_compile_shapes = args.hf_compile_shapes.split(",")
    unknown = [v for v in args.timeline_variants.split(",") if v and v not in DECODE_VARIANTS]
    if unknown:
        ap.error(f"--timeline-variants: unknown {unknown}; known: {','.join(DECODE_VARIANTS)}")
    unknown = [v for v in args.prefill_variants.split(",") if v and v not in PREFILL_VARIANTS]
    if unknown:
        ap.error(f"--prefill-variants: unknown {unknown}; known: {','.join(PREFILL_VARIANTS)}")
    unknown = [v for v in args.decode_variants.split(",") if v and v not in DECODE_VARIANTS]
    if unknown:  # before minutes of model building, not after
        ap.error(f"--decode-variants: unknown {unknown}; known: {','.join(DECODE_VARIANTS)}")
    global DEV, TTFT_DIAG, TIMELINE
    DEV = args.device
    TIMELINE_VARIANTS[:] = [v for v in args.timeline_variants.split(",") if v]
    PREFILL_AB[:] = [v for v in args.prefill_variants.split(",") if v]
    TTFT_DIAG = not args.no_ttft_diag
    TIMELINE = not args.no_timeline
    torch.manual_seed(0)
    doc = {"bench": "engine",
           "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
           "date": datetime.date.today().isoformat(), "commit": args.commit,
           "command": args.command or " ".join(sys.argv), "torch": torch.__version__,
           "timing": ("wall clock per call (each ends with the next tokens on the host), "
                      "TTFT median of 5 after 1 warm-up, decode median of "
                      f"{args.steps} steps after 3 warm-up steps"),
           "rows": [], "marks": MARKS}

    def save():
        if args.json:
            with open(args.json, "w") as f:
                json.dump(doc, f, indent=1)

    rc = 0
    if args.check:
        try:
            doc["check"] = check(args)
        except Exception as ex:  # recorded; the benchmark still runs
            import traceback
            traceback.print_exc()
            doc["check"] = {"failures": [f"{type(ex).__name__}: {ex}"]}
            print(f"check: FAIL ({type(ex).__name__}: {ex})")
        rc = 1 if doc["check"]["failures"] else 0
        save()
    if args.bench:
        bench(args, doc, save)
        t = table(doc)
        if args.table:
            pathlib.Path(args.table).write_text(t + "\n")
        print()
        print(t)
    return rc


if __name__ == "__main__":
    sys.exit(main())
