"""ops_transformer.optim: optimizers whose step is one library call per parameter group.

    >>> import torch, ops_transformer.optim
    >>> model = torch.nn.Linear(8, 8)
    >>> opt = ops_transformer.optim.AdamW(model.parameters(), lr=1e-3)
    >>> model(torch.randn(2, 8)).sum().backward(); opt.step()

:class:`AdamW` is ``torch.optim.AdamW`` (amsgrad, maximize, capturable, differentiable
off) with the update done by ``ot_adamw_step``: all tensors of a group that share a
device, dtypes and step count are updated by one call (a few kernel launches on CUDA,
a table of chunks of every tensor). ``master_weights=True`` keeps a float32 copy of each
low-precision parameter (bf16 / fp16) with float32 moments; the parameter is the master
rounded after every step (mixed-precision training without a separate wrapper).
"""

from __future__ import annotations

import torch

from . import _C

__all__ = ["AdamW"]


class AdamW(torch.optim.Optimizer):
    """AdamW with decoupled weight decay, as ``torch.optim.AdamW``.

    Parameters
    ----------
    params : iterable of tensors or of dicts (parameter groups)
    lr : float
    betas : (float, float)
    eps : float
    weight_decay : float
    master_weights : bool
        Keep float32 master weights and float32 moments for bf16 / fp16 parameters
        (``state['master']``). Without it the moments have the parameter's dtype, like
        torch's.
    """

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2,
                 *, master_weights=False):
        if not 0.0 <= lr:
            raise ValueError(f"Invalid learning rate: {lr}")
        if not 0.0 <= eps:
            raise ValueError(f"Invalid epsilon value: {eps}")
        if not (0.0 <= betas[0] < 1.0 and 0.0 <= betas[1] < 1.0):
            raise ValueError(f"Invalid beta parameters: {betas}")
        if not 0.0 <= weight_decay:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                        master_weights=master_weights)
        super().__init__(params, defaults)

    def _init_state(self, p, master):
        state = self.state[p]
        if len(state) == 0:
            state["step"] = 0
            low = p.dtype in (torch.float16, torch.bfloat16)
            sdt = torch.float32 if (master and low) else p.dtype
            state["exp_avg"] = torch.zeros_like(p, dtype=sdt, memory_format=torch.contiguous_format)
            state["exp_avg_sq"] = torch.zeros_like(p, dtype=sdt,
                                                   memory_format=torch.contiguous_format)
            if master and low:
                state["master"] = p.detach().to(torch.float32).contiguous()
        if torch.is_tensor(state["step"]):  # a state dict saved by torch.optim.AdamW
            state["step"] = int(state["step"].item())
        return state

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr = group["lr"]
            lr = float(lr.item()) if torch.is_tensor(lr) else float(lr)
            beta1, beta2 = group["betas"]
            buckets = {}
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError("ops_transformer.optim.AdamW does not support sparse "
                                       "gradients")
                if not p.is_contiguous():
                    raise RuntimeError("ops_transformer.optim.AdamW needs contiguous "
                                       "parameters")
                state = self._init_state(p, group["master_weights"])
                g = p.grad if p.grad.is_contiguous() else p.grad.contiguous()
                has_master = "master" in state
                # the step this update is (bias correction); the state counts it only
                # once the update ran, so a call that fails leaves the count as it was
                key = (p.device, p.dtype, g.dtype, state["exp_avg"].dtype, has_master,
                       state["step"] + 1)
                b = buckets.setdefault(key, ([], [], [], [], [], []))
                b[0].append(p)
                b[1].append(g)
                b[2].append(state["exp_avg"])
                b[3].append(state["exp_avg_sq"])
                if has_master:
                    b[4].append(state["master"])
                b[5].append(state)
            for key, (ps, gs, ms, vs, ws, states) in buckets.items():
                _C.adamw_step(None, lr, float(beta1), float(beta2), float(group["eps"]),
                              float(group["weight_decay"]), key[-1], ps, gs, ms, vs,
                              ws if key[4] else None)
                for state in states:
                    state["step"] = key[-1]
        return loss
