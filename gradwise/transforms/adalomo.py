"""AdaLomo's adaptive step (Lv et al. 2023, "AdaLomo: Low-memory Optimization with Adaptive Learning
Rate", arXiv:2310.10195): a second moment factored into row and column statistics, and a step size
relative to the parameter's root-mean-square. (Adafactor's factored second moment, Shazeer & Stern
2018, is the same idea; this transform follows AdaLomo's package, ``lomo-optim`` 0.1.1.)"""
from __future__ import annotations

import math

import torch
from torch import Tensor

from gradwise.core.hyper import Hyper, positive
from gradwise.core.transform import Context, Transform, state_dtype


def positive_pair(name: str, value) -> None:
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        raise ValueError(f"invalid {name}={value!r}: expected a pair (eps1, eps2) of finite numbers > 0")
    for i, x in enumerate(value):
        positive(f"{name}[{i}]", x)


def negative(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not -math.inf < value < 0:
        raise ValueError(f"invalid {name}={value!r}: expected a finite number < 0")


#: (eps1, eps2): eps1 is added to g^2, eps2 is the smallest parameter RMS the step is scaled by.
EPS = Hyper((1e-30, 1e-3), positive_pair)


class scale_by_adalomo(Transform):  # noqa: N801
    """AdaLomo's factored second moment (no momentum), at step t (1-based):

        beta_t = 1 - t^c  (c = ``decay_rate`` < 0, so beta_1 = 0);  s = g^2 + eps1;
        tensors of 2 or more dimensions, factored over the last two:
            r <- beta_t r + (1 - beta_t) mean_{-1}(s);   k <- beta_t k + (1 - beta_t) mean_{-2}(s);
            u <- g / sqrt((r / mean_{-1}(r)) outer k)
        other tensors:  v <- beta_t v + (1 - beta_t) s;  u <- g / sqrt(v)

    Memory: rows + columns per matrix instead of a full second moment.
    """

    name = "adalomo"
    state = ("exp_avg_sq_row", "exp_avg_sq_col", "exp_avg_sq")
    nonnegative = state
    elementwise = False
    hyper = {"eps": EPS, "decay_rate": Hyper(-0.8, negative)}

    def init(self, param: Tensor, group) -> dict[str, Tensor]:
        dtype, device = state_dtype(param), param.device
        unused = torch.zeros(0, dtype=dtype, device=device)
        if param.dim() >= 2:
            shape = param.shape
            return {"exp_avg_sq_row": torch.zeros(shape[:-1], dtype=dtype, device=device),
                    "exp_avg_sq_col": torch.zeros(shape[:-2] + shape[-1:], dtype=dtype, device=device),
                    "exp_avg_sq": unused}
        return {"exp_avg_sq_row": unused, "exp_avg_sq_col": unused.clone(),
                "exp_avg_sq": torch.zeros_like(param, dtype=dtype)}

    def scalars(self, hyper, step: int) -> dict[str, float]:
        return {"beta": 1.0 - step ** float(hyper["decay_rate"])}

    def update(self, updates: list[Tensor], state, ctx: Context) -> list[Tensor]:
        eps1, beta = ctx["eps"][0], ctx["beta"]
        out = []
        for u, row, col, v in zip(updates, state["exp_avg_sq_row"], state["exp_avg_sq_col"], state["exp_avg_sq"]):
            if u.numel() == 0:
                out.append(u)
                continue
            s = u * u + eps1
            if u.dim() >= 2:
                row.mul_(beta).add_(s.mean(dim=-1) * (1 - beta))
                col.mul_(beta).add_(s.mean(dim=-2) * (1 - beta))
                r = (row / row.mean(dim=-1, keepdim=True)).rsqrt().unsqueeze(-1)
                out.append(r * col.unsqueeze(-2).rsqrt() * u)
            else:
                v.mul_(beta).add_(s * (1 - beta))
                out.append(v.rsqrt() * u)
        return out


class scale_by_param_block_rms(Transform):  # noqa: N801
    """u <- max(eps2, rms(p)) u per tensor, rms(p) = ||p||_2 / sqrt(numel): a step relative to the
    parameter's scale (Adafactor's relative step; AdaLomo's lr * max(eps2, RMS(theta)))."""

    name = "param_rms"
    elementwise = False
    hyper = {"eps": EPS}

    def update(self, updates: list[Tensor], state, ctx: Context) -> list[Tensor]:
        eps2 = ctx["eps"][1]
        out = []
        for u, p in zip(updates, ctx.params):
            if u.numel() == 0:
                out.append(u)
                continue
            rms = torch.linalg.vector_norm(p.to(u.dtype)) / p.numel() ** 0.5
            out.append(u * torch.maximum(rms, eps2))
        return out
