"""Where the fused batch-1 decode (src/engine/fused_kernels.cu) and the unfused one part, per
tiny model of tests/python/test_engine.py's FUSED_CASES (device run; OT_RUN = a CUDA ot-run).

For each case and dtype: ot-run decodes one sequence on CUDA fused (the default), unfused
(OTE_FUSED_*=0) and with one fusion off at a time; HF transformers in float32 on the same
(rounded) weights, teacher-forced with the unfused run's tokens, is the reference. Printed
per run: the step where its tokens leave the unfused run's, and over the steps before,
max |run - unfused|, max |run - HF32|, the logits' scale (max |HF32|) and where the
largest difference sits. A model whose single features are taken away one at a time
(bias, tie, llama3 RoPE, hidden, ffn) shows which one the difference follows.

    OT_RUN=.../ot-run python3 scripts/engine_fused_diag.py [--cases NAME,...]
"""
import argparse
import os
import pathlib
import subprocess
import sys
import tempfile

import numpy as np
import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "python"))
import test_engine as te  # noqa: E402  (OT_RUN must be set: the module skips otherwise)

DEVICE = os.environ.get("OT_DIAG_DEVICE", "cuda")  # cpu: a dry run of the script
RUNS = {
    "fused": {},
    "unfused": te.UNFUSED,
    "no_rope": {"OTE_FUSED_ROPE": "0"},
    "no_glu": {"OTE_FUSED_GLU": "0"},
}


def variants(base):
    """the case itself, then with one of its special features taken away"""
    out = {"as is": dict(base)}
    if base.get("bias"):
        out["no bias"] = dict(base, bias=False)
    if base.get("tie"):
        out["no tie"] = dict(base, tie=False)
    if base.get("rope"):
        out["no llama3 rope"] = {k: v for k, v in base.items() if k != "rope"}
    if base.get("hidden_size", 0) % 256:
        out["hidden 1024, 16 heads"] = dict(base, hidden_size=1024, num_attention_heads=16,
                                            kv_heads=4 if base.get("kv_heads") else None)
    if base.get("intermediate_size", 0) % 256:
        out["ffn 1536"] = dict(base, intermediate_size=1536)
    return out


@torch.no_grad()
def hf32_logits(model_dir, prompt, toks):
    """float32 HF logits of the positions that predict toks[0..] (teacher-forced)"""
    model = te.reference(model_dir, torch.float32)
    ids = torch.tensor([prompt + toks[:-1]])
    lg = model(ids).logits[0].float()
    return lg[len(prompt) - 1:].numpy()


def one(tmp, name, shape, dtype):
    shape = {k: v for k, v in shape.items() if v is not None}
    model = te.fused_model(**shape)
    model = model.to(torch.bfloat16) if dtype == "bf16" else model.half()
    d = tmp / f"{name.replace(' ', '_')}_{dtype}"
    model.save_pretrained(d, safe_serialization=True)
    V = model.config.vocab_size
    prompt = te.PROMPTS[1]
    res = {}
    for rn, env_over in RUNS.items():
        env = {k: v for k, v in te.ENV.items() if not k.startswith("OTE_FUSED_")}
        env.update(env_over)
        dump = d / f"{rn}.bin"
        r = subprocess.run([te.OT_RUN, "--model", str(d), "--dtype", dtype, "--ignore-eos",
                            "--max-new-tokens", str(te.NEW_TOKENS), "--prompt-ids",
                            ",".join(map(str, prompt)), "--device", DEVICE, "--dump-logits",
                            str(dump)], capture_output=True, text=True, env=env, timeout=120)
        if r.returncode:
            print(f"  {name} {dtype} {rn}: ot-run FAILED rc {r.returncode}: {r.stderr[-300:]}")
            continue
        res[rn] = (te.parse_tokens(r.stdout)[0],
                   np.fromfile(dump, dtype=np.float32).reshape(te.NEW_TOKENS, V))
    if "unfused" not in res:
        return
    ut, ul = res["unfused"]
    ref = hf32_logits(d, prompt, ut)
    print(f"  {name} {dtype}: logits scale max|HF32| {np.abs(ref).max():.2f}, unfused vs HF32 "
          f"max {np.abs(ul - ref).max():.4f}")
    for rn, (t, lg) in res.items():
        n = 0
        while n < len(t) and t[n] == ut[n]:
            n += 1
        m = max(1, min(n + 1, len(t)))
        du = np.abs(lg[:m] - ul[:m])
        dh = np.abs(lg[:m] - ref[:m])
        s, v = np.unravel_index(np.argmax(du), du.shape)
        print(f"    {rn:8s} tokens agree {n:2d}/{len(t)}; over steps < {m}: max|-unfused| "
              f"{du.max():.4f} (step {s}, id {v}, unfused {ul[s, v]:.3f}), max|-HF32| "
              f"{dh.max():.4f}; step 0: |-unfused| {du[0].max():.4f}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default=",".join(te.FUSED_CASES))
    ap.add_argument("--dtypes", default="bf16,f16")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as td:
        tmp = pathlib.Path(td)
        for case in args.cases.split(","):
            print(f"case {case}")
            for vn, shape in variants(te.FUSED_CASES[case]).items():
                for dt in args.dtypes.split(","):
                    one(tmp, f"{case}: {vn}", shape, dt)


if __name__ == "__main__":
    main()
