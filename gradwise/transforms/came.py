"""CAME: confidence-guided adaptive memory-efficient optimization (Luo et al., ACL 2023,
arXiv:2307.02047). Adafactor's factored second moment, then a momentum whose step is scaled down
where it disagrees with the update it averages (its "instability"), that disagreement kept in
factored form too."""
from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from gradwise.core.hyper import Hyper, non_negative, sequence_of, unit_interval
from gradwise.core.transform import Context, Transform, state_dtype
from gradwise.transforms.factored import accumulate, factored_buffers, inverse_root, scale_by_factored_rms

CAME_BETAS = Hyper((0.9, 0.999, 0.9999), sequence_of((unit_interval,) * 3, ("beta1", "beta2", "beta3")))
CAME_EPS = Hyper((1e-30, 1e-16), sequence_of((non_negative,) * 2, ("eps1", "eps2")))


class scale_by_came_rms(scale_by_factored_rms):  # noqa: N801 - transforms are named like functions (optax grammar)
    """CAME's second moment: Adafactor's factored estimate with a constant decay and eps added.

    R <- b2 R + (1-b2) mean_cols(u^2 + eps1),  C likewise over rows,  V = R C / mean(R)
    (fewer than two dimensions: V <- b2 V + (1-b2) (u^2 + eps1));  u <- u / sqrt(V).
    """

    name = "came_rms"
    state = ("exp_avg_sq_row", "exp_avg_sq_col", "exp_avg_sq")
    nonnegative = ("exp_avg_sq",)
    hyper = {"betas": CAME_BETAS, "eps": CAME_EPS}

    def scalars(self, hyper, step: int) -> dict[str, float]:
        return {"one_minus_beta2": 1 - hyper["betas"][1]}  # in double: 1 - float32(0.9999) is 1.7e-4 off

    def square(self, u: Tensor, ctx: Context) -> Tensor:
        return u * u + ctx["eps"][0]

    def floor(self, p: Tensor, ctx: Context) -> Any:
        return 0.0


class scale_by_confidence(Transform):  # noqa: N801
    """CAME's confidence-guided momentum (Algorithm 1 of the paper).

    m <- b1 m + (1-b1) u;  for two or more dimensions, with the instability r = (u - m)^2 + eps2:
    R_r <- b3 R_r + (1-b3) mean_cols(r),  C_r likewise over rows,  S = R_r C_r / mean(R_r),
    u <- m / sqrt(S);  for fewer dimensions, u <- m.
    """

    name = "confidence"
    state = ("exp_avg", "exp_avg_res_row", "exp_avg_res_col")
    elementwise = False
    hyper = {"betas": CAME_BETAS, "eps": CAME_EPS}

    def init(self, param: Tensor, group) -> dict[str, Tensor]:
        return {"exp_avg": torch.zeros_like(param, dtype=state_dtype(param)),
                **factored_buffers(param, "exp_avg_res_row", "exp_avg_res_col")}

    def scalars(self, hyper, step: int) -> dict[str, float]:
        return {"one_minus_beta1": 1 - hyper["betas"][0], "one_minus_beta3": 1 - hyper["betas"][2]}

    def update(self, updates: list[Tensor], state, ctx: Context) -> list[Tensor]:
        one_minus_b1, one_minus_b3 = ctx["one_minus_beta1"], ctx["one_minus_beta3"]
        eps2 = ctx["eps"][1]
        out = []
        for u, m, row, col in zip(updates, state["exp_avg"], state["exp_avg_res_row"], state["exp_avg_res_col"]):
            m.lerp_(u, one_minus_b1)
            if u.dim() < 2:
                out.append(m.clone())
                continue
            instability = (u - m).square() + eps2
            accumulate(instability, row, col, row.new_zeros(0), one_minus_b3)
            out.append(m * inverse_root(row, col, row.new_zeros(0), u.shape, 0.0))
        return out
