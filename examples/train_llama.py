#!/usr/bin/env python
"""Train a HF transformers LlamaForCausalLM built from a config, patched with
ops_transformer (``--patched``, the default) or as HF runs it (``--no-patched``).

    python examples/train_llama.py --steps 5                       # tiny model, CPU, seconds
    python examples/train_llama.py --data notes.txt --steps 200    # bytes of a text file
    python examples/train_llama.py --config 0.54b --batch 4 --seq 2048 --bf16 --device cuda
    python examples/train_llama.py --no-patched --attn sdpa --compile ...   # the HF baselines

Data: random tokens (default), or a local text file: tokenized with a local HF
tokenizer when ``--tokenizer`` names one (a folder or a cached name; nothing is
downloaded), bytes (tokens 0..255) otherwise. Training: AdamW (``ops_transformer.optim.AdamW`` where
this build has it for the device, else torch's; ``--optim``), optional bf16
parameters (``--bf16``) or CPU/CUDA autocast (``--autocast``), gradient accumulation,
activation checkpointing, torch.compile. Logs loss, tokens/s and peak memory per step
(a progress bar when tqdm is installed) and a summary; ``--json`` writes it to a file.

Configs: ``tiny`` (hidden 64, 2 layers, 4 / 2 heads, vocab 256), ``0.54b`` (the
../shared/BASELINE.md training config: hidden 2048, 8 layers, 16 heads, FFN 5632,
vocab 32000) and ``1.5b`` (hidden 2048, 16 layers, 32 / 8 heads, FFN 8192, vocab
128256, untied embeddings).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import sys
import time

import torch

CONFIGS = {
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, vocab_size=256),
    "0.54b": dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=8,
                  num_attention_heads=16, num_key_value_heads=16, vocab_size=32000),
    "1.5b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                 num_attention_heads=32, num_key_value_heads=8, vocab_size=128256),
}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", choices=sorted(CONFIGS), default="tiny")
    p.add_argument("--layers", type=int, help="override num_hidden_layers")
    p.add_argument("--vocab", type=int, help="override vocab_size")
    p.add_argument("--patched", action=argparse.BooleanOptionalAction, default=True,
                   help="ops_transformer.patch_llama (default) or plain HF")
    p.add_argument("--attn", default="sdpa", choices=["sdpa", "eager"],
                   help="HF attention implementation of the unpatched model")
    p.add_argument("--data", help="a local text file (default: random tokens)")
    p.add_argument("--tokenizer", help="a local HF tokenizer (folder or cached name) for --data")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--grad-accum", type=int, default=1)
    p.add_argument("--steps", type=int, default=20, help="optimizer steps")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--optim", choices=["auto", "ot", "torch"], default="auto",
                   help="ops_transformer.optim.AdamW (ot), torch's AdamW (fused on CUDA), or "
                        "auto: ot where this build has it for the device, else torch")
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--warmup", type=int, default=0, help="linear LR warmup steps")
    p.add_argument("--bf16", action="store_true", help="bfloat16 parameters and activations")
    p.add_argument("--autocast", action="store_true", help="float32 parameters, bf16 autocast")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument("--checkpointing", action="store_true", help="activation checkpointing")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--skip", type=int, default=None,
                   help="steps left out of the tokens/s average (default 1; 3 with --compile)")
    p.add_argument("--log-every", type=int, default=1)
    p.add_argument("--json", help="write the summary (and the loss curve) to this file")
    p.add_argument("--no-progress", action="store_true", help="plain log lines, no tqdm bar")
    return p.parse_args(argv)


# ---------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------

def load_tokens(args, vocab_size):
    """A 1-D int64 token stream, or None for random tokens."""
    if not args.data:
        return None
    if args.tokenizer:
        from transformers import AutoTokenizer
        tok = AutoTokenizer.from_pretrained(args.tokenizer, local_files_only=True)
        with open(args.data, encoding="utf-8", errors="replace") as f:
            ids = tok(f.read(), return_attention_mask=False)["input_ids"]
        tokens = torch.tensor(ids, dtype=torch.long)
        kind = f"tokenizer {args.tokenizer}"
    else:
        with open(args.data, "rb") as f:
            tokens = torch.frombuffer(bytearray(f.read()), dtype=torch.uint8).long()
        kind = "bytes"
    if tokens.numel() <= args.seq:
        sys.exit(f"train_llama: {args.data}: {tokens.numel()} tokens, need more than --seq "
                 f"{args.seq}")
    if int(tokens.max()) >= vocab_size:
        sys.exit(f"train_llama: token id {int(tokens.max())} >= vocab {vocab_size} "
                 "(use --vocab or another --config)")
    print(f"data: {args.data}, {tokens.numel()} tokens ({kind})")
    return tokens


def batches(tokens, args, vocab_size, device, gen):
    while True:
        if tokens is None:
            x = torch.randint(0, vocab_size, (args.batch, args.seq), generator=gen)
        else:
            start = torch.randint(0, tokens.numel() - args.seq, (args.batch,), generator=gen)
            x = torch.stack([tokens[s:s + args.seq] for s in start.tolist()])
        yield x.to(device, non_blocking=True)


# ---------------------------------------------------------------------------------
# Memory
# ---------------------------------------------------------------------------------

def peak_memory_gb(device):
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 1e9
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6   # KiB -> GB (Linux)


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ---------------------------------------------------------------------------------
# Optimizer
# ---------------------------------------------------------------------------------

def _ot_adamw_works(device, dtype):
    """Whether ops_transformer.optim.AdamW exists and steps a tensor on this device /
    dtype like torch's AdamW (a build may lack its CUDA kernel)."""
    try:
        from ops_transformer.optim import AdamW
        g = torch.Generator().manual_seed(0)
        p0 = torch.randn(1000, generator=g).to(device=device, dtype=dtype)
        grad = torch.randn(1000, generator=g).to(device=device, dtype=dtype)
        a, b = p0.clone().requires_grad_(), p0.clone().requires_grad_()
        a.grad, b.grad = grad.clone(), grad.clone()
        opt_a = AdamW([a], lr=1e-2, weight_decay=0.1, betas=(0.9, 0.95))
        opt_b = torch.optim.AdamW([b], lr=1e-2, weight_decay=0.1, betas=(0.9, 0.95))
        for _ in range(2):
            opt_a.step()
            opt_b.step()
        tol = 1e-5 if dtype == torch.float32 else 2e-2
        return bool(torch.allclose(a.detach().float(), b.detach().float(), rtol=tol, atol=tol))
    except Exception as e:  # noqa: BLE001  (not in this build, or not on this device)
        print(f"ops_transformer.optim.AdamW not usable here ({type(e).__name__}: "
              f"{str(e)[:120]}): torch's AdamW")
        return False


def make_optimizer(model, args, device):
    dtype = next(model.parameters()).dtype
    use_ot = args.optim == "ot" or (args.optim == "auto" and _ot_adamw_works(device, dtype))
    kw = dict(lr=args.lr, weight_decay=args.weight_decay, betas=(0.9, 0.95))
    if use_ot:
        from ops_transformer.optim import AdamW
        return AdamW(model.parameters(), **kw), "ops_transformer.optim.AdamW"
    fused = device.type == "cuda"
    return torch.optim.AdamW(model.parameters(), fused=fused, **kw), \
        "torch.optim.AdamW" + (" (fused)" if fused else "")


# ---------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------

def main(argv=None):
    args = parse_args(argv)
    from transformers import LlamaConfig, LlamaForCausalLM
    import ops_transformer as ot

    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(args.device)
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)

    cfg = dict(CONFIGS[args.config])
    if args.layers:
        cfg["num_hidden_layers"] = args.layers
    if args.vocab:
        cfg["vocab_size"] = args.vocab
    config = LlamaConfig(**cfg, max_position_embeddings=max(args.seq, 128),
                         tie_word_embeddings=False, attn_implementation=args.attn,
                         use_cache=False)
    tokens = load_tokens(args, config.vocab_size)

    with torch.device(device):
        model = LlamaForCausalLM(config)
    if args.bf16:
        model = model.to(torch.bfloat16)
    model.train()
    if args.checkpointing:
        (getattr(model, "activation_checkpointing_enable", None)
         or model.gradient_checkpointing_enable)()
    if args.patched:
        ot.patch_llama(model)
    fwd = torch.compile(model) if args.compile else model
    opt, opt_name = make_optimizer(model, args, device)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / args.warmup) if args.warmup else 1.0)

    n_params = sum(p.numel() for p in model.parameters())
    mode = ("patched (ops_transformer)" if args.patched else f"HF {args.attn}") + \
        (" + torch.compile" if args.compile else "")
    dtype = "bf16" if args.bf16 else ("fp32 + bf16 autocast" if args.autocast else "fp32")
    print(f"model: {args.config} ({n_params / 1e6:.1f} M parameters), {mode}, {dtype}, "
          f"device {device}, batch {args.batch} x seq {args.seq} x accum {args.grad_accum}, "
          f"optimizer {opt_name}")

    data = batches(tokens, args, config.vocab_size, device, gen)
    tok_per_step = args.batch * args.seq * args.grad_accum
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.autocast)

    bar = None
    if not args.no_progress:
        try:
            from tqdm import tqdm
            bar = tqdm(total=args.steps, unit="step", dynamic_ncols=True)
        except ImportError:
            pass

    losses, step_times = [], []
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    t_start = time.perf_counter()
    for step in range(args.steps):
        sync(device)
        t0 = time.perf_counter()
        total = 0.0
        for _ in range(args.grad_accum):
            x = next(data)
            with autocast:
                loss = fwd(input_ids=x, labels=x).loss / args.grad_accum
            loss.backward()
            total += loss.detach()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        loss_val = float(total)          # synchronizes
        sync(device)
        dt = time.perf_counter() - t0
        if not math.isfinite(loss_val):
            sys.exit(f"train_llama: loss is {loss_val} at step {step}")
        losses.append(loss_val)
        step_times.append(dt)
        mem = peak_memory_gb(device)
        if bar is not None:
            bar.set_postfix(loss=f"{loss_val:.4f}", tok_s=f"{tok_per_step / dt:,.0f}",
                            mem=f"{mem:.2f}GB")
            bar.update(1)
        elif step % args.log_every == 0 or step == args.steps - 1:
            print(f"step {step:5d}  loss {loss_val:.4f}  {tok_per_step / dt:12,.0f} tok/s  "
                  f"peak mem {mem:.2f} GB  {dt * 1e3:8.1f} ms")
    if bar is not None:
        bar.close()
    wall = time.perf_counter() - t_start

    # tokens/s over the steps after the first few (compilation, allocator warm-up)
    skip = args.skip if args.skip is not None else (3 if args.compile else 1)
    timed = step_times[skip:] or step_times[-1:]
    tok_s = tok_per_step * len(timed) / sum(timed)
    summary = dict(config=args.config, params=n_params, patched=args.patched,
                   attn=None if args.patched else args.attn, compile=args.compile,
                   dtype=dtype, device=str(device), batch=args.batch, seq=args.seq,
                   optimizer=opt_name,
                   grad_accum=args.grad_accum, steps=args.steps, timed_steps=len(timed),
                   tokens_per_s=tok_s,
                   peak_memory_gb=peak_memory_gb(device),
                   peak_memory_kind="torch.cuda.max_memory_allocated" if device.type ==
                   "cuda" else "process max RSS", first_loss=losses[0], final_loss=losses[-1],
                   wall_s=wall, losses=losses)
    print(f"done: {args.steps} steps in {wall:.1f} s, loss {losses[0]:.4f} -> {losses[-1]:.4f}, "
          f"{tok_s:,.0f} tok/s (steps {min(skip, args.steps - 1) + 1}..), peak memory {summary['peak_memory_gb']:.2f} GB "
          f"({summary['peak_memory_kind']})")
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1)
    return summary


if __name__ == "__main__":
    main()
