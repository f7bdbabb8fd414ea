"""ADOPT (Taniguchi et al., 2024, "ADOPT: Modified Adam Can Converge with Any beta2 with the Optimal
Rate", arXiv:2411.02853): the second moment enters the step before it sees the current gradient."""
from __future__ import annotations

import math
from typing import Callable

import torch
from torch import Tensor

from gradwise.core.hyper import Hyper, betas_pair, positive
from gradwise.core.transform import Context, Transform


def adopt_clip(step: int) -> float:
    """The paper's clipping bound at step t (counted from 1, as the optimizer counts): t^(1/4)."""
    return math.pow(step, 0.25)


class scale_by_adopt(Transform):  # noqa: N801
    """ADOPT's update, with the clipping of the paper's Algorithm 2 (the authors' default):

    step 1:   v <- u^2;  u <- 0  (nothing moves)
    step t:   n <- clamp(u / max(sqrt(v), eps), -c_t, c_t);  m <- b1 m + (1-b1) n;  u <- m;
              then v <- b2 v + (1-b2) u^2  (with the incoming u)

    c_t = ``clip_lambda(t)`` (default t^(1/4); None: no clipping) is a per-step scalar, computed in
    Python from the step count. m is normalized before it is averaged, so no bias correction is needed.
    1 - b1 and 1 - b2 are computed in double, as the references do.
    """

    name = "adopt"
    state = ("exp_avg", "exp_avg_sq")
    nonnegative = ("exp_avg_sq",)
    hyper = {"betas": Hyper((0.9, 0.9999), betas_pair), "eps": Hyper(1e-6, positive)}

    def __init__(self, clip_lambda: Callable[[int], float] | None = adopt_clip):
        if clip_lambda is not None and not callable(clip_lambda):
            raise TypeError(f"invalid clip_lambda={clip_lambda!r}: expected None or a function of the step (1, 2, ...)"
                            " returning the clipping bound")
        self.clip_lambda = clip_lambda

    def scalars(self, hyper, step: int) -> dict[str, float]:
        b1, b2 = map(float, hyper["betas"])
        clip = math.inf if self.clip_lambda is None or step == 1 else float(self.clip_lambda(step))
        if not clip > 0:
            raise ValueError(f"invalid clip_lambda({step})={clip!r}: expected a number > 0 (or inf)")
        return {"one_minus_beta1": 1 - b1, "one_minus_beta2": 1 - b2, "first_step": float(step == 1), "clip": clip}

    def update(self, updates: list[Tensor], state, ctx: Context) -> list[Tensor]:
        b2, first, clip = ctx["betas"][1], ctx["first_step"] > 0, ctx["clip"]
        out = []
        for u, m, v in zip(updates, state["exp_avg"], state["exp_avg_sq"]):
            normed = (u / v.sqrt().clamp(min=ctx["eps"])).clamp(-clip, clip)
            m.copy_(torch.where(first, m, m.lerp(normed, ctx["one_minus_beta1"])))
            out.append(torch.where(first, torch.zeros_like(m), m))
            v.copy_(torch.where(first, u * u, v * b2 + u * u * ctx["one_minus_beta2"]))
        return out

    def __repr__(self) -> str:
        clip = "" if self.clip_lambda is adopt_clip else f"clip_lambda={self.clip_lambda!r}"
        return f"scale_by_adopt({clip})"
