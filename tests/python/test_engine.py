"""The engine (src/engine, tools/ot-run) against HF transformers on the same weights.

A tiny random LlamaForCausalLM (also Qwen2 and Mistral) is saved with save_pretrained
(safetensors) into a temporary directory; ot-run loads it, prefills the prompts (several
prompts of different lengths: the packed varlen path), decodes 32 greedy steps and dumps
the float32 logits of every step (--dump-logits). HF runs the same prompts one by one with
its KV cache. Logits agree within the storage dtype's tolerance and greedy tokens are
identical. Broken model directories fail with a message naming the file and the tensor.

ot-run is found at $OT_RUN, else build/tools/ot-run (scripts/test.sh builds build/ with
the tools before it runs the Python tests).
"""

import json
import os
import pathlib
import random
import subprocess
import sys

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")
from safetensors.torch import load_file, save_file  # noqa: E402  (installed with transformers)

ROOT = pathlib.Path(__file__).resolve().parents[2]
OT_RUN = os.environ.get("OT_RUN") or str(ROOT / "build" / "tools" / "ot-run")
if not os.access(OT_RUN, os.X_OK):
    pytest.skip(f"ot-run not built ({OT_RUN} missing: build build/ with -DOT_BUILD_TOOLS=ON, as "
                "scripts/test.sh does, or set OT_RUN)", allow_module_level=True)

NEW_TOKENS = 33  # the prefill's token, then 32 decode steps
PROMPTS = [[1, 17, 42, 99, 3, 250, 7], [5, 6, 200, 31, 8, 9, 10, 11, 12, 13, 100], [77]]
ENV = dict(os.environ, OMP_WAIT_POLICY="PASSIVE")


def run_ot(model_dir, *args, prompts=PROMPTS, dump=None, check=True, dtype="f32"):
    cmd = [OT_RUN, "--model", str(model_dir), "--threads", "1", "--dtype", dtype, "--ignore-eos",
           "--max-new-tokens", str(NEW_TOKENS)]
    for p in prompts:
        cmd += ["--prompt-ids", ",".join(map(str, p))]
    if dump:
        cmd += ["--dump-logits", str(dump)]
    cmd += list(args)
    r = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=120)
    assert r.returncode >= 0, f"ot-run crashed (signal {-r.returncode}): {r.stderr}"
    if check:
        assert r.returncode == 0, r.stderr
    return r


def parse_tokens(stdout):
    out = {}
    for line in stdout.splitlines():
        if line.startswith("seq ") and " generated:" in line:
            i = int(line.split()[1])
            out[i] = [int(x) for x in line.split(":", 1)[1].split()]
    return [out[i] for i in sorted(out)]


def init_weights(model, seed=0):
    """Weights of O(1) logits (HF's default init gives near-ties that make greedy fragile)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=g))
            elif "embed" in name:
                p.copy_(torch.randn(p.shape, generator=g))
            elif name.endswith("bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5)


def make_model(kind="llama", kv_heads=2, tie=False, bias=False, rope=None, sliding_window=None,
               **shape):
    common = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=kv_heads, vocab_size=256,
                  max_position_embeddings=256, rms_norm_eps=1e-6, tie_word_embeddings=tie)
    common.update(shape)
    if kind == "llama":
        cfg = transformers.LlamaConfig(attention_bias=bias, **common)
        if rope:
            cfg.rope_parameters = rope
        model = transformers.LlamaForCausalLM(cfg)
    elif kind == "qwen2":
        cfg = transformers.Qwen2Config(**common)
        model = transformers.Qwen2ForCausalLM(cfg)
    elif kind == "mistral":
        cfg = transformers.MistralConfig(sliding_window=sliding_window, **common)
        model = transformers.MistralForCausalLM(cfg)
    else:
        raise ValueError(kind)
    init_weights(model)
    return model.eval()


@torch.no_grad()
def hf_greedy(model, prompt, steps=NEW_TOKENS):
    """Greedy tokens and the float32 logits of each step (prefill's last position first)."""
    out = model(torch.tensor([prompt]), use_cache=True)
    past, logits, tokens = out.past_key_values, [], []
    for i in range(steps):
        lg = out.logits[0, -1].float()
        logits.append(lg)
        tok = int(torch.argmax(lg))
        tokens.append(tok)
        if i + 1 < steps:
            out = model(torch.tensor([[tok]]), past_key_values=past, use_cache=True)
            past = out.past_key_values
    return tokens, torch.stack(logits)


def reference(model_dir, dtype):
    """The saved model read back by HF (rotary inv_freq recomputed in float32, as a fresh
    load has it; .half() / .to() on a live model would round that buffer too)."""
    cls = getattr(transformers, json.loads((model_dir / "config.json").read_text())["architectures"][0])
    return cls.from_pretrained(model_dir, dtype=dtype).eval()


def compare(model_dir, model, tmp_path, dtype="f32", atol=1e-4, rtol=1e-4, prompts=PROMPTS,
            ref_dtype=None):
    """ot-run on model_dir against HF on the same files (in ref_dtype: the engine's dtype
    unless given)."""
    ref_model = reference(model_dir, ref_dtype or {"f32": torch.float32, "bf16": torch.bfloat16}[dtype])
    dump = tmp_path / "logits.bin"
    r = run_ot(model_dir, dump=dump, dtype=dtype, prompts=prompts)
    tokens = parse_tokens(r.stdout)
    V = model.config.vocab_size
    got = np.fromfile(dump, dtype=np.float32).reshape(NEW_TOKENS, len(prompts), V)
    for s, p in enumerate(prompts):
        ref_tokens, ref_logits = hf_greedy(ref_model, p)
        if dtype == "f32":
            assert tokens[s] == ref_tokens, f"prompt {s}: greedy tokens differ"
            torch.testing.assert_close(torch.from_numpy(got[:, s].copy()), ref_logits,
                                       atol=atol, rtol=rtol)
            continue
        # bf16: tokens may part at a near-tie; logits compared while the tokens agree,
        # and a parting must be a near-tie of the reference.
        n = 0
        while n < NEW_TOKENS and tokens[s][n] == ref_tokens[n]:
            n += 1
        torch.testing.assert_close(torch.from_numpy(got[: min(n + 1, NEW_TOKENS), s].copy()),
                                   ref_logits[: n + 1], atol=atol, rtol=rtol)
        if n < NEW_TOKENS:
            top = torch.topk(ref_logits[n], 2).values
            assert float(top[0] - top[1]) < 2 * atol, (
                f"prompt {s}: greedy tokens part at step {n} without a near-tie")
        assert n >= 8, f"prompt {s}: tokens agree for only {n} steps"
    return r


@pytest.mark.parametrize("kv_heads", [2, 4], ids=["gqa", "mha"])
def test_llama_f32_matches_hf(tmp_path, kv_heads):
    model = make_model(kv_heads=kv_heads)
    model.save_pretrained(tmp_path / "m", safe_serialization=True)
    r = compare(tmp_path / "m", model, tmp_path)
    assert "time to first token" in r.stdout and "tokens/s" in r.stdout
    assert "memory: weights" in r.stdout


def test_llama_bf16_matches_hf(tmp_path):
    model = make_model().to(torch.bfloat16)
    model.save_pretrained(tmp_path / "m", safe_serialization=True)
    compare(tmp_path / "m", model, tmp_path, dtype="bf16", atol=0.1, rtol=0.05)


def test_fp16_file_into_f32_engine(tmp_path):
    """float16 tensors converted to float32 at load: HF in float32 on the rounded weights."""
    model = make_model().half()
    model.save_pretrained(tmp_path / "m", safe_serialization=True)
    compare(tmp_path / "m", model, tmp_path)


def test_bf16_file_into_f32_engine_sharded(tmp_path):
    model = make_model(kv_heads=1).to(torch.bfloat16)
    model.save_pretrained(tmp_path / "m", safe_serialization=True, max_shard_size="40KB")
    assert (tmp_path / "m" / "model.safetensors.index.json").exists()
    assert len(list((tmp_path / "m").glob("*.safetensors"))) > 1
    compare(tmp_path / "m", model, tmp_path)


def test_tied_embeddings_and_attention_bias(tmp_path):
    model = make_model(tie=True, bias=True)
    model.save_pretrained(tmp_path / "m", safe_serialization=True)
    assert "lm_head.weight" not in load_file(tmp_path / "m" / "model.safetensors")
    compare(tmp_path / "m", model, tmp_path)


def test_llama3_rope_scaling(tmp_path):
    rope = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 32}
    model = make_model(rope=rope)
    model.save_pretrained(tmp_path / "m", safe_serialization=True)
    cfg = json.loads((tmp_path / "m" / "config.json").read_text())
    assert "llama3" in json.dumps(cfg)
    compare(tmp_path / "m", model, tmp_path)


def test_qwen2_qkv_bias(tmp_path):
    model = make_model(kind="qwen2")
    model.save_pretrained(tmp_path / "m", safe_serialization=True)
    compare(tmp_path / "m", model, tmp_path)


def test_mistral_sliding_window(tmp_path):
    model = make_model(kind="mistral", sliding_window=6)
    model.save_pretrained(tmp_path / "m", safe_serialization=True)
    compare(tmp_path / "m", model, tmp_path)


def test_sampling_is_seeded(tmp_path):
    model = make_model()
    model.save_pretrained(tmp_path / "m", safe_serialization=True)
    args = ["--temperature", "0.8", "--top-k", "50", "--top-p", "0.9"]
    a = parse_tokens(run_ot(tmp_path / "m", *args, "--seed", "7").stdout)
    b = parse_tokens(run_ot(tmp_path / "m", *args, "--seed", "7").stdout)
    c = parse_tokens(run_ot(tmp_path / "m", *args, "--seed", "8").stdout)
    assert a == b and a != c
    assert all(0 <= t < 256 for seq in a for t in seq)


def test_stop_tokens(tmp_path):
    model = make_model()
    model.save_pretrained(tmp_path / "m", safe_serialization=True)
    full = parse_tokens(run_ot(tmp_path / "m").stdout)[0]
    stop = full[5]
    cut = parse_tokens(run_ot(tmp_path / "m", "--stop-ids", str(stop)).stdout)[0]
    assert cut == full[: full.index(stop) + 1]


def test_random_weights_tiny():
    r = subprocess.run([OT_RUN, "--config", "tiny", "--random-weights", "--seed", "1",
                        "--prompt-ids", "1,2,3", "--max-new-tokens", "8", "--threads", "1",
                        "--batch", "2"], capture_output=True, text=True, env=ENV, timeout=120)
    assert r.returncode == 0, r.stderr
    toks = parse_tokens(r.stdout)
    assert len(toks) == 2 and toks[0] == toks[1] and len(toks[0]) == 8


# ---- CUDA: the batch-1 decode's fused kernels against the unfused ops --------------------

_CUDA_PROBE = []


def _need_cuda_ot_run():
    """Skip unless ot-run was built with the CUDA backend and finds a GPU (probed once)."""
    if not _CUDA_PROBE:
        r = subprocess.run([OT_RUN, "--config", "tiny", "--random-weights", "--device", "cuda",
                            "--dtype", "bf16", "--prompt-ids", "1,2,3", "--max-new-tokens", "2"],
                           capture_output=True, text=True, env=ENV, timeout=120)
        _CUDA_PROBE.append(r)
    r = _CUDA_PROBE[0]
    if r.returncode != 0 and any(m in r.stderr for m in (
            "no CUDA backend", "without the CUDA backend", "built without CUDA",
            "no CUDA-capable device", "CUDA driver version")):
        pytest.skip(f"no CUDA ot-run: {r.stderr.strip()[:200]}")
    assert r.returncode == 0, f"ot-run --device cuda failed: {r.stderr}"


UNFUSED = {"OTE_FUSED_NORM": "0", "OTE_FUSED_SWIGLU": "0", "OTE_FUSED_ROPE": "0",
           "OTE_FUSED_GLU": "0", "OTE_FUSED_OPROJ": "0"}
# head_dim 64 / 128; hidden 256 (part of one pass of a block's 1024 elements), 1152 (two,
# the second partial; 18 q heads on 3 kv heads) and 512; vocab 1001 (odd: lm_head's last
# row pair has one row); ffn 1480 (not a multiple of 16 features a block)
FUSED_CASES = {
    "llama-gqa": dict(hidden_size=256, num_attention_heads=4, kv_heads=2, intermediate_size=512,
                      vocab_size=1001),
    "llama-gqa6-bias-tied-llama3": dict(
        hidden_size=1152, num_attention_heads=18, kv_heads=3, intermediate_size=1480,
        vocab_size=1001, bias=True, tie=True,
        rope={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
              "low_freq_factor": 1.0, "high_freq_factor": 4.0,
              "original_max_position_embeddings": 32}),
    "qwen2-mha-d128": dict(kind="qwen2", hidden_size=512, num_attention_heads=4, kv_heads=4,
                           intermediate_size=1024, vocab_size=1001),
}


# the fused kernels' grids (engine.c fused_body): the default, and 3 blocks
# (OTE_FUSED_BLOCKS=3: each warp takes many tasks, the grid-stride loop's later tasks); and
# o_proj's staged kernel (the default where the shape fits; OTE_FUSED_OPROJ=2: it must run,
# else ot-run fails) with 40 CTAs (OTE_FUSED_BLOCKS=40: 7 / 29 / 13 rows a CTA at hidden 256
# / 1152 / 512, past the 8 it holds in registers, so most in shared memory; its default grid
# of one CTA per SM holds 2 / 9 / 4); and the opt-in rowblock kernels, all three at once
# (must run, else ot-run fails): down_proj with the residual add folded in
# (OTE_FUSED_DOWN=2): ffn 512 / 1480 / 1024 give CTAs of 32 / 64 / 32 threads (1480: 185
# vectors a row over 64 threads x 4, the last ones masked; two warps summed through shared
# memory); qkv and gate_up (OTE_FUSED_QKV=2 / OTE_FUSED_GATEUP=2, rowblock_norm_kernel):
# hidden 256 / 1152 / 512 give CTAs of 32 / 96 / 32 threads (1152: 144 vectors a row over
# 96 threads x 2, the last 48 masked); qkv 64 / 576 / 256 NeoX pairs, gate_up 512 / 1480 /
# 1024 (passes of 16 pairs); behind the rowblock down_proj qkv's input is the residual
# alone (no delta: test_cuda_fused_norm_rowblock takes qkv alone too).
OPROJ = {"OTE_FUSED_OPROJ": "2"}
DOWN = {"OTE_FUSED_DOWN": "2"}
QKV = {"OTE_FUSED_QKV": "2"}
RB_ALL = {**QKV, "OTE_FUSED_GATEUP": "2", **DOWN}
FUSED_FORMS = {"default": {}, "3_blocks": {"OTE_FUSED_BLOCKS": "3"},
               "oproj_staged_40_blocks": {**OPROJ, "OTE_FUSED_BLOCKS": "40"},
               "all_rowblock": RB_ALL}


def fused_model(**shape):
    """make_model(**shape), with a tied embedding scaled by 1 / sqrt(hidden): the tied
    lm_head is the embedding, whose std-1 init gives logits of several hundred (max |logit|
    735 in float32 HF at hidden 1152, where the bf16 engine on the CPU is 2.2 off HF32), so
    no fixed tolerance would be the dtype's; scaled, the logits are O(1), as init_weights
    means them to be."""
    model = make_model(**shape)
    if shape.get("tie"):
        with torch.no_grad():
            model.get_input_embeddings().weight.mul_(model.config.hidden_size ** -0.5)
    return model


def _fused_runner(tmp_path, case, dtype):
    """a tiny model of FUSED_CASES[case] saved in dtype, and run(env_over, *extra, dump):
    ot-run decoding one sequence on CUDA with only env_over's OTE_FUSED_* set ->
    (tokens, float32 logits [NEW_TOKENS, V] when dump)"""
    model = fused_model(**FUSED_CASES[case])
    model = model.to(torch.bfloat16) if dtype == "bf16" else model.half()
    model.save_pretrained(tmp_path / "m", safe_serialization=True)
    return _cuda_runner(("--model", str(tmp_path / "m")), model.config.vocab_size, dtype)


def _cuda_runner(source, V, dtype):
    """run(env_over, *extra, dump, check) of _fused_runner for the model of ot-run's
    arguments source (--model DIR, or --config NAME --random-weights) of vocabulary V;
    check=False: the failed run's CompletedProcess instead of an assertion"""
    prompt = [PROMPTS[1]]
    args = ("--device", "cuda")

    def run(env_over, *extra, dump=None, check=True):
        env = {k: v for k, v in ENV.items() if not k.startswith("OTE_FUSED_")}
        env.update(env_over)
        cmd = [OT_RUN, *source, "--dtype", dtype, "--ignore-eos",
               "--max-new-tokens", str(NEW_TOKENS), "--prompt-ids", ",".join(map(str, prompt[0])),
               *args, *extra]
        if dump:
            cmd += ["--dump-logits", str(dump)]
        r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
        assert r.returncode >= 0, f"{env_over} {extra}: ot-run crashed: {r.stderr}"
        if not check and r.returncode != 0:
            return r
        assert r.returncode == 0, f"{env_over} {extra}: {r.stderr}"
        toks = parse_tokens(r.stdout)
        assert len(toks) == 1 and len(toks[0]) == NEW_TOKENS
        logits = None
        if dump:
            logits = np.fromfile(dump, dtype=np.float32).reshape(NEW_TOKENS, V)
            assert np.isfinite(logits).all()
        return toks[0], logits

    return run


@pytest.mark.parametrize("form", list(FUSED_FORMS))
@pytest.mark.parametrize("dtype", ["bf16", "f16"])
@pytest.mark.parametrize("case", list(FUSED_CASES))
def test_cuda_fused_decode_matches_unfused(tmp_path, case, dtype, form):
    """One sequence on CUDA (batch-1 decode: the fused qkv + RoPE + KV append, gate_up +
    SwiGLU and lm_head + argmax kernels of fused_kernels.cu, in each FUSED_FORMS form)
    against the same engine with OTE_FUSED_*=0 (the library's ops): logits close while the
    greedy tokens agree, a parting only at a near-tie; the device argmax's tokens (graph
    replays, and eager steps) equal the host argmax of the fused logits."""
    _need_cuda_ot_run()
    run = _fused_runner(tmp_path, case, dtype)
    fe = FUSED_FORMS[form]
    fused_tok, fused = run(fe, dump=tmp_path / "f.bin")
    unf_tok, unf = run(UNFUSED, dump=tmp_path / "u.bin")
    # the fused kernels round differently (float32 input row, their own sums): logits equal
    # bit for bit mean that fuse_mode took the unfused path and nothing here was tested
    assert not np.array_equal(fused, unf), "fused logits == unfused bit for bit: fusion off?"
    # the device argmax (fused into lm_head): graph replays and eager steps
    assert run(fe)[0] == fused_tok, "fused lm_head argmax != host argmax of the fused logits"
    assert run(fe, "--no-cuda-graph")[0] == fused_tok, "eager fused decode != graph replays"
    _assert_near_unfused(fused_tok, fused, unf_tok, unf, dtype)


def _assert_near_unfused(fused_tok, fused, unf_tok, unf, dtype):
    """fused logits within the dtype's tolerance of the unfused ones while the greedy
    tokens agree (and at the first step where they part), parting only at a near-tie"""
    atol, rtol = (0.1, 0.05) if dtype == "bf16" else (0.03, 0.02)
    n = 0
    while n < NEW_TOKENS and fused_tok[n] == unf_tok[n]:
        n += 1
    m = min(n + 1, NEW_TOKENS)
    torch.testing.assert_close(torch.from_numpy(fused[:m].copy()),
                               torch.from_numpy(unf[:m].copy()), atol=atol, rtol=rtol)
    if n < NEW_TOKENS:
        top = np.sort(unf[n])[-2:]
        assert float(top[1] - top[0]) < 2 * atol, f"tokens part at step {n} without a near-tie"


def _assert_bit_equal(run, tmp_path, base_tok, base, envs):
    """run (_fused_runner) under each of envs gives base_tok and the logits base bit for bit"""
    for i, env in enumerate(envs):
        tok, lg = run(env, dump=tmp_path / f"p{i}.bin")
        assert tok == base_tok, f"{env}: tokens differ"
        assert np.array_equal(lg, base), \
            f"{env}: logits differ (max {np.abs(lg - base).max()})"


# The batch-1 decode's attention + o_proj kernel (OTE_FUSED_ATTN_OPROJ, fused_kernels.cu
# attn_oproj_kernel; =2: it must run, else ot-run fails): head_dim 64 at group sizes 2 and
# 8 (MQA), head_dim 128 at 1 and 4; a Mistral sliding window shorter than the context. Its
# forms: the default grid (one CTA per SM: 16-key ranges at these lengths, most warps
# idle); one key range a kv head (OTE_ATTN_OPROJ_SPLITS=1: 300-332 keys, three rounds of
# the 8 warps' 16-key steps); 128 CTAs, 3 ranges a kv head, with one row of W a CTA in
# shared memory and the rest (up to 7) in registers.
AO_CASES = {
    "llama-gqa": dict(FUSED_CASES["llama-gqa"]),
    "llama-mqa8-d64": dict(hidden_size=512, num_attention_heads=8, kv_heads=1,
                           intermediate_size=1024, vocab_size=1001),
    "qwen2-mha-d128": dict(FUSED_CASES["qwen2-mha-d128"]),
    "llama-gqa4-d128-bias": dict(hidden_size=1024, num_attention_heads=8, kv_heads=2,
                                 intermediate_size=1536, vocab_size=1001, bias=True),
    "mistral-window": dict(kind="mistral", sliding_window=96, hidden_size=256,
                           num_attention_heads=4, kv_heads=2, intermediate_size=512,
                           vocab_size=1001),
}
AO = {"OTE_FUSED_ATTN_OPROJ": "2"}
AO_FORMS = {"default": AO, "one_range": {**AO, "OTE_ATTN_OPROJ_SPLITS": "1"},
            "128_ctas_rows_in_registers": {**AO, "OTE_ATTN_OPROJ_BLOCKS": "128",
                                           "OTE_ATTN_OPROJ_SPLITS": "3",
                                           "OTE_ATTN_OPROJ_SMEM_ROWS": "1"}}


@pytest.mark.parametrize("kv_block", [16, 7])
@pytest.mark.parametrize("form", list(AO_FORMS))
@pytest.mark.parametrize("dtype", ["bf16", "f16"])
@pytest.mark.parametrize("case", list(AO_CASES))
def test_cuda_attn_oproj_matches_unfused(tmp_path, case, dtype, form, kv_block):
    """The attention + o_proj kernel in the batch-1 decode against the same engine with
    OTE_FUSED_*=0 (the library's paged attention and linear) over a 300-token prompt and
    33 steps (contexts 300-332: ranges of several 16-key steps, a partial last page,
    pages of 16 and of 7 tokens): logits within the dtype's tolerance while the greedy
    tokens agree; eager steps give the graph replays' tokens and logits bit for bit (the
    kernel's sums have a fixed order); and the kernel's logits differ from the staged
    o_proj's default form (so it ran)."""
    _need_cuda_ot_run()
    shape = dict(AO_CASES[case], max_position_embeddings=512)
    model = fused_model(**shape)
    model = model.to(torch.bfloat16) if dtype == "bf16" else model.half()
    model.save_pretrained(tmp_path / "m", safe_serialization=True)
    V = model.config.vocab_size
    prompt = [int(t) for t in np.random.default_rng(11).integers(1, V, 300)]

    def run(env_over, *extra, dump):
        env = {k: v for k, v in ENV.items() if not k.startswith(("OTE_FUSED_", "OTE_ATTN_"))}
        env.update(env_over)
        cmd = [OT_RUN, "--model", str(tmp_path / "m"), "--dtype", dtype, "--ignore-eos",
               "--max-new-tokens", str(NEW_TOKENS), "--prompt-ids", ",".join(map(str, prompt)),
               "--device", "cuda", "--kv-block", str(kv_block), "--dump-logits", str(dump),
               *extra]
        r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
        assert r.returncode == 0, f"{env_over} {extra}: {r.stderr}"
        toks = parse_tokens(r.stdout)
        assert len(toks) == 1 and len(toks[0]) == NEW_TOKENS
        lg = np.fromfile(dump, dtype=np.float32).reshape(NEW_TOKENS, V)
        assert np.isfinite(lg).all()
        return toks[0], lg

    fe = AO_FORMS[form]
    ao_tok, ao = run(fe, dump=tmp_path / "a.bin")
    eager_tok, eager = run(fe, "--no-cuda-graph", dump=tmp_path / "e.bin")
    assert eager_tok == ao_tok and np.array_equal(eager, ao), "eager steps != graph replays"
    _, staged = run({}, dump=tmp_path / "s.bin")
    assert not np.array_equal(ao[1:], staged[1:]), "attention + o_proj logits == the default's"
    unf_tok, unf = run(UNFUSED, dump=tmp_path / "u.bin")
    _assert_near_unfused(ao_tok, ao, unf_tok, unf, dtype)


def test_cuda_attn_oproj_declines(tmp_path):
    """Where the kernel does not fit (18 query heads on 3 kv heads: a group of 6), the
    default (OTE_FUSED_ATTN_OPROJ=1) runs the paged attention and the staged o_proj instead
    (the logits equal that form's bit for bit), and =2 fails with a message naming it."""
    _need_cuda_ot_run()
    run = _fused_runner(tmp_path, "llama-gqa6-bias-tied-llama3", "bf16")
    base_tok, base = run({}, dump=tmp_path / "b.bin")
    tok, lg = run({"OTE_FUSED_ATTN_OPROJ": "1"}, dump=tmp_path / "o.bin")
    assert tok == base_tok and np.array_equal(lg, base)
    r = run(AO, check=False)
    assert r.returncode != 0 and "OTE_FUSED_ATTN_OPROJ=2" in r.stderr, r.stderr


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
@pytest.mark.parametrize("case", list(FUSED_CASES))
def test_cuda_fused_forms_bit_equal(tmp_path, case, dtype):
    """The fused kernels with 3 or 1 blocks (each warp many tasks: the grid-stride split
    changes no sum) give the default's logits and tokens bit for bit; so does o_proj's
    staged kernel (OTE_FUSED_OPROJ=2: it ran) with 40 CTAs (a row's sum is one CTA's in a
    fixed order, whichever CTA and whether its row came through registers or shared
    memory); and so does the staged kernel's L2 prefetch of gate_up and the next qkv, and
    the fused qkv kernel's of o_proj (OTE_L2_PF_*: a hint that changes no value), asked for far more than the weights hold
    (clamped to them: a prefetch past a weight's end would read another allocation's lines
    or fault) and for 1 MB split over 40 CTAs, with either L2 policy."""
    _need_cuda_ot_run()
    run = _fused_runner(tmp_path, case, dtype)
    base_tok, base = run(OPROJ, dump=tmp_path / "b.bin")
    pf_all = {"OTE_L2_PF_GATEUP": "4096", "OTE_L2_PF_QKV": "4096", "OTE_L2_PF_LAST": "1",
              "OTE_L2_PF_OPROJ": "2"}
    pf_1mb = {"OTE_L2_PF_GATEUP": "1", "OTE_L2_PF_QKV": "1", "OTE_L2_PF_OPROJ": "1"}
    _assert_bit_equal(run, tmp_path, base_tok, base, (
        {"OTE_FUSED_BLOCKS": "3"}, {"OTE_FUSED_BLOCKS": "1"}, {**OPROJ, "OTE_FUSED_BLOCKS": "40"},
        {**OPROJ, **pf_all}, {**OPROJ, "OTE_FUSED_BLOCKS": "40", **pf_1mb}))


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
@pytest.mark.parametrize("case", list(FUSED_CASES))
def test_cuda_fused_down_rowblock_bit_equal(tmp_path, case, dtype):
    """down_proj on the rowblock kernel (OTE_FUSED_DOWN=2: it ran) gives the same logits and
    tokens bit for bit with 3 CTAs (85-86 rows a CTA at hidden 256: three passes of up to 32
    rows, the later ones after the PDL wait), with 40, and with 2 rows in flight a thread
    instead of 4 (a row's sum is one CTA's, its threads' vectors fixed by K, in a fixed
    order). (Not compared with the library's down_proj bit for bit: at these K the two
    float32 sums round to the same 16-bit outputs more often than not.)"""
    _need_cuda_ot_run()
    run = _fused_runner(tmp_path, case, dtype)
    base_tok, base = run(DOWN, dump=tmp_path / "b.bin")
    _assert_bit_equal(run, tmp_path, base_tok, base, (
        {**DOWN, "OTE_FUSED_BLOCKS": "3"}, {**DOWN, "OTE_FUSED_BLOCKS": "40"},
        {**DOWN, "OTE_FUSED_DOWN_DEPTH": "2"},
        {**DOWN, "OTE_FUSED_BLOCKS": "3", "OTE_FUSED_DOWN_DEPTH": "2"}))
    # eager steps (no graph) equal the graph replays
    assert run(DOWN, "--no-cuda-graph")[0] == base_tok


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
@pytest.mark.parametrize("case", list(FUSED_CASES))
def test_cuda_fused_norm_rowblock(tmp_path, case, dtype):
    """qkv on the rowblock kernel (OTE_FUSED_QKV=2: it ran), alone (its input h = delta +
    res, stored by CTA 0) and with gate_up and down_proj on theirs (FUSED_FORMS'
    all_rowblock), is near the unfused engine's logits (qkv alone: the other forms are
    test_cuda_fused_decode_matches_unfused's), and gives the same logits and tokens bit for
    bit with 3 CTAs (many passes of 16 pairs each), with 40, and with 4 rows in flight a
    thread instead of 8 (a row's sum is one CTA's, its threads' vectors fixed by K, in a
    fixed order); eager steps equal the graph replays"""
    _need_cuda_ot_run()
    run = _fused_runner(tmp_path, case, dtype)
    unf_tok, unf = run(UNFUSED, dump=tmp_path / "u.bin")
    for base_env in (QKV, RB_ALL):
        base_tok, base = run(base_env, dump=tmp_path / "b.bin")
        if base_env is QKV:
            assert not np.array_equal(base, unf), "rowblock qkv logits == unfused bit for bit"
            _assert_near_unfused(base_tok, base, unf_tok, unf, dtype)
        _assert_bit_equal(run, tmp_path, base_tok, base, (
            {**base_env, "OTE_FUSED_BLOCKS": "3"}, {**base_env, "OTE_FUSED_BLOCKS": "40"},
            {**base_env, "OTE_FUSED_RB_DEPTH": "4"},
            {**base_env, "OTE_FUSED_BLOCKS": "3", "OTE_FUSED_RB_DEPTH": "4"}))
        assert run(base_env, "--no-cuda-graph")[0] == base_tok


# Shapes each rowblock kernel declines (fused_kernels.cu rowblock_norm_grid / rowblock_grid):
# qkv below head_dim 32 (test-gqa: 16); qkv and gate_up above K 4096 (hidden 4160: 2 heads
# of 64); down_proj above K 16384 (ffn 16400). (source, the variables whose kernel declines)
ROWBLOCK_DECLINES = {
    "test-gqa-d16": (None, ("OTE_FUSED_QKV",)),
    "hidden-4160": (dict(hidden_size=4160, num_attention_heads=2, kv_heads=1, head_dim=64,
                         intermediate_size=64, num_hidden_layers=1),
                    ("OTE_FUSED_QKV", "OTE_FUSED_GATEUP")),
    "ffn-16400": (dict(intermediate_size=16400, num_hidden_layers=1), ("OTE_FUSED_DOWN",)),
}


@pytest.mark.parametrize("case", list(ROWBLOCK_DECLINES))
def test_cuda_rowblock_declined_shapes(tmp_path, case):
    """Where a rowblock kernel declines the shape, =1 falls back -- the fused kernel for
    qkv / gate_up, the library's linear for down_proj: the default engine's logits and
    tokens bit for bit, on a path that is fused (not the unfused engine's logits) -- and =2
    fails with an error naming the variable (no crash, no logits)."""
    _need_cuda_ot_run()
    shape, variables = ROWBLOCK_DECLINES[case]
    if shape is None:
        run = _cuda_runner(("--config", "test-gqa", "--random-weights", "--seed", "3"), 256,
                           "bf16")
    else:
        model = make_model(**shape).to(torch.bfloat16)
        model.save_pretrained(tmp_path / "m", safe_serialization=True)
        run = _cuda_runner(("--model", str(tmp_path / "m")), model.config.vocab_size, "bf16")
    base_tok, base = run({}, dump=tmp_path / "b.bin")
    unf_tok, unf = run(UNFUSED, dump=tmp_path / "u.bin")
    assert not np.array_equal(base, unf), "default logits == unfused bit for bit: fusion off?"
    _assert_near_unfused(base_tok, base, unf_tok, unf, "bf16")
    for var in variables:
        _assert_bit_equal(run, tmp_path, base_tok, base, ({var: "1"},))
        r = run({var: "2"}, check=False)
        assert isinstance(r, subprocess.CompletedProcess) and r.returncode == 1, \
            f"{var}=2 on a shape its kernel declines did not fail"
        assert f"{var}=2 and its shape does not fit the rowblock kernel" in r.stderr, r.stderr


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
@pytest.mark.parametrize("case", list(FUSED_CASES))
def test_cuda_prefill_fused_head(tmp_path, case, dtype, monkeypatch):
    """OTE_PREFILL_FUSED_HEAD=1: a one-prompt prefill's final norm + lm_head (+ the greedy
    argmax) on the decode's fused kernel -- logits near the default prefill's but not equal
    bit for bit (it ran: its normalized row is not rounded to the dtype), its device argmax
    the host argmax of its logits; a prefill of two prompts keeps the default path (its
    logits bit for bit)."""
    _need_cuda_ot_run()
    eng_mod = _engine_module()
    model = fused_model(**FUSED_CASES[case])
    model = model.to(torch.bfloat16) if dtype == "bf16" else model.half()
    model.save_pretrained(tmp_path / "m", safe_serialization=True)
    for k in [k for k in os.environ if k.startswith(("OTE_FUSED_", "OTE_PREFILL_"))]:
        monkeypatch.delenv(k)
    with eng_mod.Engine.from_pretrained(tmp_path / "m", dtype=dtype, device="cuda",
                                        max_seqs=2) as eng:
        base = eng.prefill([PROMPTS[1]])[0]
        base2 = eng.prefill([PROMPTS[1], PROMPTS[0]])
        monkeypatch.setenv("OTE_PREFILL_FUSED_HEAD", "1")  # read at each forward
        got = eng.prefill([PROMPTS[1]])[0]
        ids = eng.prefill([PROMPTS[1]], greedy=True)
        two = eng.prefill([PROMPTS[1], PROMPTS[0]])
    assert np.isfinite(got).all()
    assert not np.array_equal(got, base), "fused-head logits == default bit for bit: not run?"
    atol, rtol = (0.1, 0.05) if dtype == "bf16" else (0.03, 0.02)
    torch.testing.assert_close(torch.from_numpy(got), torch.from_numpy(base), atol=atol,
                               rtol=rtol)
    assert int(ids[0]) == int(np.argmax(got)), "fused argmax != host argmax of its logits"
    assert np.array_equal(np.asarray(two), np.asarray(base2)), "two prompts: not the default"


@pytest.mark.parametrize("form", list(FUSED_FORMS))
@pytest.mark.parametrize("dtype", ["bf16", "f16"])
@pytest.mark.parametrize("case", list(FUSED_CASES))
def test_cuda_fused_decode_logits_teacher_forced(tmp_path, case, dtype, form, monkeypatch):
    """The same models through the Python engine: the unfused engine (OTE_FUSED_*=0) decodes
    24 greedy steps of one sequence, then a fused engine is fed the same tokens, so every
    step's logits are compared (no parting of the tokens)."""
    _need_cuda_ot_run()
    eng_mod = _engine_module()
    model = fused_model(**FUSED_CASES[case])
    model = model.to(torch.bfloat16) if dtype == "bf16" else model.half()
    model.save_pretrained(tmp_path / "m", safe_serialization=True)
    steps = 24

    def run(env_over, tokens=None):
        for k in [k for k in os.environ if k.startswith("OTE_FUSED_")]:
            monkeypatch.delenv(k)
        for k, v in env_over.items():  # read by the engine at each forward (graph capture)
            monkeypatch.setenv(k, v)
        with eng_mod.Engine.from_pretrained(tmp_path / "m", dtype=dtype, device="cuda",
                                            max_seqs=1) as eng:
            lg = [eng.prefill([PROMPTS[1]])[0]]
            toks = []
            for i in range(steps):
                toks.append(int(lg[-1].argmax()) if tokens is None else tokens[i])
                lg.append(eng.decode([toks[-1]])[0])
        return toks, np.stack(lg)

    toks, unf = run(UNFUSED)
    _, fused = run(FUSED_FORMS[form], toks)
    assert np.isfinite(fused).all()
    atol, rtol = (0.1, 0.05) if dtype == "bf16" else (0.03, 0.02)
    torch.testing.assert_close(torch.from_numpy(fused), torch.from_numpy(unf), atol=atol,
                               rtol=rtol)


# A rowblock kernel that must run (=2) behind a switch that turns off the fused form it is
# part of (engine.c fused_settings_check): the rowblock qkv is the fused qkv + RoPE + KV
# append's, the rowblock gate_up and down_proj go with gate_up's SwiGLU epilogue
FUSED_CONFLICTS = [
    ("OTE_FUSED_QKV", "OTE_FUSED_ROPE=0"), ("OTE_FUSED_QKV", "OTE_FUSED_NORM=0"),
    ("OTE_FUSED_GATEUP", "OTE_FUSED_GLU=0"), ("OTE_FUSED_GATEUP", "OTE_FUSED_SWIGLU=1"),
    ("OTE_FUSED_GATEUP", "OTE_FUSED_NORM=0"), ("OTE_FUSED_DOWN", "OTE_FUSED_GLU=0"),
    ("OTE_FUSED_DOWN", "OTE_FUSED_SWIGLU=1"), ("OTE_FUSED_DOWN", "OTE_FUSED_NORM=0"),
]


@pytest.mark.parametrize("must,off", FUSED_CONFLICTS,
                         ids=[f"{m[10:].lower()}-{o[10:].lower()}" for m, o in FUSED_CONFLICTS])
def test_fused_must_run_conflicts(must, off, monkeypatch):
    """=2 (must run) with a switch that takes its fused form away is an error naming both
    variables, on every device (a host check, before the decode call changes anything):
    the sequence keeps its length, and once the conflict is gone the same decode gives the
    tokens of an engine that never saw it; ot-run exits 1 with the message. (A contradiction
    a kernel alone would see -- e.g. on the CPU, which never runs one -- is not needed.)"""
    eng_mod = _engine_module()
    for k in [k for k in os.environ if k.startswith("OTE_FUSED_")]:
        monkeypatch.delenv(k)
    prompt, steps = [1, 2, 3], 4

    def greedy(eng):
        toks = [eng.prefill([prompt], greedy=True)[0]]
        for _ in range(steps):
            toks.append(eng.decode(toks[-1:], greedy=True)[0])
        return toks

    with eng_mod.Engine.random("test-gqa", seed=4, threads=1) as ref:
        want = greedy(ref)
    with eng_mod.Engine.random("test-gqa", seed=4, threads=1) as eng:
        toks = [eng.prefill([prompt], greedy=True)[0]]
        toks.append(eng.decode(toks[-1:], greedy=True)[0])
        monkeypatch.setenv(must, "2")
        monkeypatch.setenv(*off.split("="))
        with pytest.raises(eng_mod.EngineError) as ei:
            eng.decode(toks[-1:], greedy=True)
        msg = str(ei.value)
        assert f"{must}=2" in msg and off in msg and "unset one of them" in msg, msg
        assert eng.seq_len(0) == len(prompt) + 1, "the failed decode changed the sequence"
        monkeypatch.delenv(must)
        while len(toks) <= steps:
            toks.append(eng.decode(toks[-1:], greedy=True)[0])
    assert toks == want
    env = {k: v for k, v in ENV.items() if not k.startswith("OTE_FUSED_")}
    env.update({must: "2", off.split("=")[0]: off.split("=")[1]})
    r = subprocess.run([OT_RUN, "--config", "test-gqa", "--random-weights", "--seed", "4",
                        "--prompt-ids", "1,2,3", "--max-new-tokens", "3", "--threads", "1"],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 1 and f"{must}=2" in r.stderr and off in r.stderr, r.stderr
    # =1 (where it fits) with the same switch is no contradiction: it runs
    env[must] = "1"
    r = subprocess.run([OT_RUN, "--config", "test-gqa", "--random-weights", "--seed", "4",
                        "--prompt-ids", "1,2,3", "--max-new-tokens", "3", "--threads", "1"],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr


# ---- broken model directories: a clear message, never a crash -------------------------


@pytest.fixture
def good_dir(tmp_path):
    model = make_model()
    model.save_pretrained(tmp_path / "m", safe_serialization=True)
    return tmp_path / "m"


def expect_error(model_dir, *needles):
    r = run_ot(model_dir, check=False, prompts=[[1, 2, 3]])
    assert r.returncode == 1, f"expected a failure: {r.stdout} {r.stderr}"
    for n in needles:
        assert n in r.stderr, f"{n!r} not in: {r.stderr}"
    return r.stderr


def test_missing_tensor(good_dir):
    f = good_dir / "model.safetensors"
    t = load_file(f)
    del t["model.layers.1.mlp.up_proj.weight"]
    save_file(t, f)
    expect_error(good_dir, "missing tensor model.layers.1.mlp.up_proj.weight", "[128, 64]")


def test_wrong_shape(good_dir):
    f = good_dir / "model.safetensors"
    t = load_file(f)
    t["model.layers.0.self_attn.k_proj.weight"] = torch.zeros(16, 64)
    save_file(t, f)
    expect_error(good_dir, "model.safetensors", "model.layers.0.self_attn.k_proj.weight",
                 "shape [16, 64]", "[32, 64]")


def test_unsupported_dtype(good_dir):
    f = good_dir / "model.safetensors"
    t = load_file(f)
    t["model.norm.weight"] = torch.ones(64, dtype=torch.int32)
    save_file(t, f)
    expect_error(good_dir, "model.norm.weight", "dtype I32")


def test_truncated_file(good_dir):
    f = good_dir / "model.safetensors"
    data = f.read_bytes()
    f.write_bytes(data[: len(data) // 2])
    expect_error(good_dir, "model.safetensors", "truncated")


def test_garbled_header(good_dir):
    f = good_dir / "model.safetensors"
    data = bytearray(f.read_bytes())
    data[8:20] = b"}}}}garbage!"
    f.write_bytes(bytes(data))
    expect_error(good_dir, "model.safetensors", "not a valid JSON object")


def test_unknown_architecture(good_dir):
    cfg = json.loads((good_dir / "config.json").read_text())
    cfg["architectures"] = ["GPT2LMHeadModel"]
    cfg["model_type"] = "gpt2"
    (good_dir / "config.json").write_text(json.dumps(cfg))
    expect_error(good_dir, "config.json", "unknown architecture \"GPT2LMHeadModel\"")


def test_bad_config(good_dir):
    (good_dir / "config.json").write_text("{\"hidden_size\": 64,")
    expect_error(good_dir, "config.json", "not valid JSON")
    cfg = {"architectures": ["LlamaForCausalLM"], "hidden_size": 64}
    (good_dir / "config.json").write_text(json.dumps(cfg))
    expect_error(good_dir, "config.json", "missing required field \"num_hidden_layers\"")


def test_no_weights(good_dir):
    (good_dir / "model.safetensors").unlink()
    expect_error(good_dir, "no *.safetensors files")


def test_fuzz_truncations_and_flips(good_dir):
    """Truncations at many lengths and byte flips in the header: exit 1 with a message
    (or 0 when a flip is harmless), never a crash."""
    f = good_dir / "model.safetensors"
    data = f.read_bytes()
    hlen = int.from_bytes(data[:8], "little")
    rng = random.Random(0)
    cuts = [0, 1, 7, 8, 9, 8 + hlen // 2, 8 + hlen, 8 + hlen + 1, len(data) - 1]
    cuts += [rng.randrange(len(data)) for _ in range(8)]
    for cut in cuts:
        f.write_bytes(data[:cut])
        r = run_ot(good_dir, check=False, prompts=[[1, 2]])
        assert r.returncode == 1 and "model.safetensors" in r.stderr, (cut, r.stderr)
    for _ in range(25):
        b = bytearray(data)
        for _ in range(3):
            b[rng.randrange(8 + hlen)] = rng.randrange(256)
        f.write_bytes(bytes(b))
        r = run_ot(good_dir, check=False, prompts=[[1, 2]])
        assert r.returncode in (0, 1), r.stderr
        if r.returncode == 1:
            assert r.stderr.startswith("ot-run: ") and len(r.stderr) > 20, r.stderr


def test_paged_block_sizes_agree(tmp_path):
    """Pages of 1, 3 and 16 tokens (sequences spanning many pages, partial last pages): the
    same logits and tokens as the default."""
    model = make_model()
    model.save_pretrained(tmp_path / "m", safe_serialization=True)
    base = None
    for bs in ["16", "1", "3"]:
        dump = tmp_path / f"l{bs}.bin"
        toks = parse_tokens(run_ot(tmp_path / "m", "--kv-block", bs, dump=dump).stdout)
        got = np.fromfile(dump, dtype=np.float32)
        if base is None:
            base = (toks, got)
            continue
        assert toks == base[0], f"block size {bs}"
        np.testing.assert_allclose(got, base[1], rtol=1e-5, atol=1e-5)


# ---- the Python binding (python/ops_transformer/engine.py, ctypes over libot_engine.so) --


def _engine_module():
    """engine.py from the source tree (it needs nothing else of the package), with
    libot_engine.so beside the ot-run being tested unless OT_ENGINE_LIB says otherwise."""
    import importlib.util
    lib = pathlib.Path(OT_RUN).resolve().parents[1] / "src" / "engine" / "libot_engine.so"
    if not os.environ.get("OT_ENGINE_LIB"):
        if not lib.exists():
            pytest.skip(f"{lib} not built")
        os.environ["OT_ENGINE_LIB"] = str(lib)
    spec = importlib.util.spec_from_file_location(
        "ot_engine_py", ROOT / "python" / "ops_transformer" / "engine.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["ot_engine_py"] = mod  # (dataclasses look their module up there)
    spec.loader.exec_module(mod)
    return mod


def test_python_engine_matches_ot_run_and_hf(tmp_path):
    eng_mod = _engine_module()
    model = make_model()
    model.save_pretrained(tmp_path / "m", safe_serialization=True)
    dump = tmp_path / "logits.bin"
    ref_tokens = parse_tokens(run_ot(tmp_path / "m", dump=dump).stdout)
    with eng_mod.Engine.from_pretrained(tmp_path / "m", max_seqs=len(PROMPTS), threads=1) as eng:
        assert (eng.layers, eng.hidden, eng.vocab) == (2, 64, 256)
        out = eng.generate(PROMPTS, NEW_TOKENS, stop=[], return_logits=True)
        assert out.tokens == ref_tokens
        got = np.concatenate([s.reshape(-1) for s in out.logits])
        np.testing.assert_array_equal(got, np.fromfile(dump, dtype=np.float32))
        assert out.first_token_ms > 0 and out.decode_ms > 0 and out.tokens_per_s > 0
        assert out.decode_steps == NEW_TOKENS - 1
        assert out.decode_tokens == len(PROMPTS) * (NEW_TOKENS - 1)
        # greedy on the device path (argmax inside the engine) gives the same tokens
        assert eng.generate(PROMPTS, NEW_TOKENS, stop=[]).tokens == ref_tokens
        # prefill / decode steps by hand against HF
        ref = reference(tmp_path / "m", torch.float32)
        lg = eng.prefill([PROMPTS[1]], seqs=[2])
        hf_tok, hf_logits = hf_greedy(ref, PROMPTS[1], steps=4)
        np.testing.assert_allclose(lg[0], hf_logits[0].numpy(), rtol=1e-4, atol=1e-4)
        tok = int(lg[0].argmax())
        for i in range(1, 4):
            ids = eng.decode([tok], seqs=[2], greedy=True)
            assert tok == hf_tok[i - 1]
            tok = ids[0]
        assert eng.seq_len(2) == len(PROMPTS[1]) + 3
        mem = eng.memory()
        assert mem["weights"] > 0 and mem["kv_cache"] > 0 and mem["activations"] > 0


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_prefill_rope_kv_forms_bit_equal(tmp_path, device, monkeypatch):
    """The prefill's RoPE + KV append as one op (ot_rope_kv_append, the default since
    2026-12-07) and as ot_rope_forward then ot_kv_append (OTE_PREFILL_ROPE_KV=0): the same
    logits bit for bit at the prefill and in the decode steps that read the pages it wrote,
    for one prompt (the dense attention path) and for two (varlen); on the GPU (bf16, head
    dim 64) with a 300-token prompt, which takes the append's warp kernel."""
    eng_mod = _engine_module()
    if device == "cuda":
        _need_cuda_ot_run()
        model = fused_model(**FUSED_CASES["llama-gqa"], max_position_embeddings=512)
        model = model.to(torch.bfloat16)
        kw = dict(dtype="bf16", device="cuda")
    else:
        model = make_model(max_position_embeddings=512)
        kw = dict(threads=1)
    model.save_pretrained(tmp_path / "m", safe_serialization=True)
    vocab = model.config.vocab_size
    long = [int(t) for t in np.random.default_rng(7).integers(1, vocab, 300)]
    for k in [k for k in os.environ if k.startswith(("OTE_FUSED_", "OTE_PREFILL_"))]:
        monkeypatch.delenv(k)
    got = {}
    for mode in ("0", "1", None):
        if mode is None:
            monkeypatch.delenv("OTE_PREFILL_ROPE_KV")  # the default: the one op
        else:
            monkeypatch.setenv("OTE_PREFILL_ROPE_KV", mode)
        with eng_mod.Engine.from_pretrained(tmp_path / "m", max_seqs=3, max_len=320,
                                            **kw) as eng:
            one = eng.prefill([long], seqs=[0])
            two = eng.prefill([PROMPTS[0], PROMPTS[1]], seqs=[1, 2])
            outs = [one, two]
            toks = [int(one[0].argmax()), int(two[0].argmax()), int(two[1].argmax())]
            for _ in range(3):
                lg = eng.decode(toks, seqs=[0, 1, 2])
                outs.append(lg)
                toks = [int(r.argmax()) for r in lg]
        assert all(np.isfinite(o).all() for o in outs)
        got[mode] = outs
    for mode in ("1", None):
        for i, (a, b) in enumerate(zip(got["0"], got[mode])):
            assert np.array_equal(a, b), f"OTE_PREFILL_ROPE_KV={mode}: output {i} differs"


def test_python_engine_random_and_sampling():
    eng_mod = _engine_module()
    assert "llama-13b" in eng_mod.config_names() and "llama3-8b" in eng_mod.config_names()
    eng = eng_mod.Engine.random("test-gqa", seed=3, max_seqs=2, dtype="bf16", threads=1)
    a = eng.generate([[1, 2, 3], [4]], 12, temperature=0.9, top_k=20, seed=5)
    b = eng.generate([[1, 2, 3], [4]], 12, temperature=0.9, top_k=20, seed=5)
    c = eng.generate([[1, 2, 3], [4]], 12, temperature=0.9, top_k=20, seed=6)
    assert a.tokens == b.tokens and a.tokens != c.tokens
    assert [len(t) for t in a.tokens] == [12, 12]
    g = eng.generate([1, 2, 3], 6)  # one prompt as a flat list
    assert len(g.tokens) == 1 and len(g.tokens[0]) == 6 and g.text is None
    with pytest.raises(ValueError):
        eng_mod.Engine.random("test-gqa", seed=0)
    eng.close()


def test_python_engine_text_with_tokenizer(tmp_path):
    eng_mod = _engine_module()
    tokenizers = pytest.importorskip("tokenizers")
    model = make_model()
    model.save_pretrained(tmp_path / "m", safe_serialization=True)
    vocab = {f"w{i}": i for i in range(256)}
    vocab["[UNK]"] = 0
    tk = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    tk.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tk.decoder = tokenizers.decoders.WordPiece()
    transformers.PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="[UNK]").save_pretrained(
        tmp_path / "m")
    eng = eng_mod.Engine.from_pretrained(tmp_path / "m", threads=1)
    out = eng.generate("w1 w17 w42", 5, stop=[])
    ids = eng.generate([1, 17, 42], 5, stop=[]).tokens
    assert out.tokens == ids and out.text is not None and len(out.text) == 1
    assert out.text[0].split() == [f"w{t}" for t in ids[0]]


def test_python_engine_errors(good_dir):
    eng_mod = _engine_module()
    (good_dir / "model.safetensors").unlink()
    with pytest.raises(eng_mod.EngineError, match="no \\*.safetensors files"):
        eng_mod.Engine.from_pretrained(good_dir)
    eng = eng_mod.Engine.random("test-gqa", seed=1, threads=1)
    with pytest.raises(eng_mod.EngineError, match="token id 999 out of range"):
        eng.generate([1, 999], 4)
    with pytest.raises(eng_mod.EngineError, match="has no prompt"):
        eng.decode([1], seqs=[0], greedy=True)
    with pytest.raises(eng_mod.EngineError, match="text prompts need a tokenizer"):
        eng.generate("hello", 4)


def test_offload_options(good_dir):
    """Weight streaming's options reach the engine from Python and ot-run; on the CPU they
    fail with the engine's message (a budget alone, or offload off CUDA)."""
    eng_mod = _engine_module()
    with pytest.raises(eng_mod.EngineError, match="offload_budget is for weight streaming"):
        eng_mod.Engine.random("test-gqa", seed=1, threads=1, offload_budget=1 << 30)
    with pytest.raises(eng_mod.EngineError, match=r"weight streaming \(offload\) is for CUDA"):
        eng_mod.Engine.random("test-gqa", seed=1, threads=1, offload=True, offload_budget=1 << 30)
    with pytest.raises(ValueError):
        eng_mod.Engine.random("test-gqa", seed=1, offload=True, offload_budget=-1)
    r = run_ot(good_dir, "--offload-budget", "1", check=False)
    assert r.returncode == 1 and "offload_budget is for weight streaming" in r.stderr


def test_profile_is_a_noop_on_the_cpu():
    """set_profile / profile_report through ctypes: on the CPU the profile stays off (the
    report is empty) and the tokens are those of an engine that never asked for it."""
    eng_mod = _engine_module()
    ref = eng_mod.Engine.random("test-gqa", seed=2, threads=1, max_seqs=2)
    want = ref.generate([[1, 2, 3], [4]], 6).tokens
    ref.close()
    eng = eng_mod.Engine.random("test-gqa", seed=2, threads=1, max_seqs=2)
    eng.set_profile(True)
    assert eng.generate([[1, 2, 3], [4]], 6).tokens == want
    assert eng.profile_report() == ""
    eng.set_profile(False)
    assert eng.generate([[1, 2, 3], [4]], 6).tokens == want
    eng.close()


def test_last_timing_splits_each_call():
    """last_timing: the split of the last prefill / decode call -- non-negative parts that
    add up to at most the whole call, the phase of that call, and no GPU time on the CPU."""
    eng_mod = _engine_module()
    eng = eng_mod.Engine.random("test-gqa", seed=3, threads=1, max_seqs=2)
    nxt = eng.prefill([[1, 2, 3, 4], [5, 6]], greedy=True)
    t = eng.last_timing()
    assert t["phase"] == "prefill" and t["gpu"] == -1.0
    parts = t["host_prep"] + t["enqueue"] + t["wait"]
    assert min(t["host_prep"], t["enqueue"], t["wait"]) >= 0.0 and t["enqueue"] > 0.0
    assert abs(parts - t["total"]) < 1e-6 * max(1.0, t["total"])
    eng.decode(nxt, greedy=True)
    d = eng.last_timing()
    assert d["phase"] == "decode" and d["total"] > 0.0
    with pytest.raises(Exception):
        eng.decode([1, 2], seqs=[0, 7])  # a failed call leaves the last split as it was
    assert eng.last_timing() == d
    eng.close()
