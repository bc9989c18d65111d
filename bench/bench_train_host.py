#!/usr/bin/env python3
"""bench_train_host.py -- the host (CPU) time of a training step of the patched model,
as a proxy: the 0.54 B config's structure (8 decoder layers) with tiny tensors (hidden 64,
16 tokens) on the CPU, one thread, so that the step time is mostly Python, dispatch and
autograd overhead rather than arithmetic. Compares HF sdpa, the patched model with the
ops' eager autograd path (the default outside torch.compile: _torch_ops.eager) and the
patched model with every autograd call through the torch.ops.ops_transformer custom ops.

  python3 bench/bench_train_host.py [--layers 8] [--steps 60]
"""
import argparse
import time


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--steps", type=int, default=60)
    args = p.parse_args(argv)
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    import ops_transformer as ot
    from ops_transformer import ops as ot_ops
    torch.set_num_threads(1)

    def build(patched):
        torch.manual_seed(0)
        cfg = LlamaConfig(hidden_size=64, intermediate_size=128,
                          num_hidden_layers=args.layers, num_attention_heads=4,
                          num_key_value_heads=4, vocab_size=256, use_cache=False,
                          attn_implementation="sdpa")
        m = LlamaForCausalLM(cfg)
        return ot.patch_llama(m) if patched else m

    x = torch.randint(0, 256, (1, 16))

    def step_ms(model):
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)

        def step():
            model(input_ids=x, labels=x).loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        for _ in range(5):
            step()
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            for _ in range(args.steps):
                step()
            best = min(best, (time.perf_counter() - t0) / args.steps)
        return best * 1e3

    hf, patched = build(False), build(True)
    eager_ops = ot_ops._ops
    results = {}
    for _ in range(2):                      # interleaved rounds, best of each
        results.setdefault("HF sdpa", []).append(step_ms(hf))
        results.setdefault("patched (eager autograd path)", []).append(step_ms(patched))
        ot_ops._ops = lambda: torch.ops.ops_transformer
        try:
            results.setdefault("patched (custom ops)", []).append(step_ms(patched))
        finally:
            ot_ops._ops = eager_ops
    for k, v in results.items():
        print(f"{k:32s} {min(v):7.2f} ms a step")


if __name__ == "__main__":
    main()
