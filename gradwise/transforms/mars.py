"""MARS (Yuan, Liu, Wu, Zhou & Gu, 2024, "MARS: Unleashing the Power of Variance Reduction for Training
Large Models", arXiv:2411.10438): a variance-reduced gradient, corrected by the gradient's last change."""
from __future__ import annotations

import torch
from torch import Tensor

from gradwise.core.hyper import Hyper, non_negative
from gradwise.core.transform import Context, Transform, state_dtype


class mars_correction(Transform):  # noqa: N801 - transforms are named like functions (optax grammar)
    """The paper's approximate (MARS-approx) correction, put before a core that reads ``betas``:

    c <- u + gamma b1 / (1 - b1) (u - u_prev);  c <- c / max(||c||, 1);  u_prev <- u;  u <- c

    with b1 the group's ``betas[0]`` (the core's momentum, as in the paper; its ``momentum`` for a core
    without betas: Muon's ``trace_ema``, SGD's ``trace``) and u_prev zero before the
    first step (as the authors' code and pytorch-optimizer start). gamma b1 / (1 - b1) is a per-step
    scalar computed in double. ``prepare`` finds max(||c||, 1) on the whole tensor (a 0-d buffer), so the
    update itself is elementwise: compiled flat, in eager pieces.
    """

    name = "mars"
    state = ("last_grad", "norm")
    hyper = {"gamma": Hyper(0.025, non_negative)}
    prepares = True
    reads_params = False

    def init(self, param: Tensor, group) -> dict[str, Tensor]:
        dtype = state_dtype(param)
        return {"last_grad": torch.zeros_like(param, dtype=dtype, memory_format=torch.preserve_format),
                "norm": torch.ones((), dtype=dtype, device=param.device)}

    def scalars(self, hyper, step: int) -> dict[str, float]:
        if "betas" not in hyper and "momentum" not in hyper:
            raise ValueError("mars_correction() reads beta1 from the group's 'betas' (or its 'momentum'): put it"
                             " before a core that declares them, e.g. chain(mars_correction(), scale_by_adam_moments(),"
                             " ...)")
        b1 = float(hyper["betas"][0] if "betas" in hyper else hyper["momentum"])
        if b1 == 1:
            raise ValueError("mars_correction() divides by 1 - beta1: got beta1=1.0 (momentum=1.0); expected < 1")
        return {"scale": float(hyper["gamma"]) * b1 / (1 - b1)}

    def prepare(self, updates: list[Tensor], state, ctx: Context) -> None:
        for u, last, norm in zip(updates, state["last_grad"], state["norm"]):
            norm.copy_(torch.linalg.vector_norm((u - last) * ctx["scale"] + u).clamp(min=1.0))

    def update(self, updates: list[Tensor], state, ctx: Context) -> list[Tensor]:
        out = []
        for u, last, norm in zip(updates, state["last_grad"], state["norm"]):
            out.append(((u - last) * ctx["scale"] + u) / norm)
            last.copy_(u)
        return out
