"""Heavy-ball and Nesterov momentum with dampening, as torch.optim.SGD (Sutskever et al., 2013)."""
from __future__ import annotations

import torch
from torch import Tensor

from gradwise.core.hyper import Hyper, boolean, closed_unit_interval, non_negative
from gradwise.core.transform import Context, Transform, state_dtype


class trace(Transform):  # noqa: N801 - optax's name for SGD momentum
    """b <- u at the first step, else b <- mu b + (1 - dampening) u;
    u <- u + mu b  (nesterov)  or  u <- b.   With mu = ``momentum`` = 0 the update passes through
    and no buffer is kept.
    """

    name = "momentum"
    state = ("momentum_buffer",)
    hyper = {
        "momentum": Hyper(0.0, non_negative, zero_is_identity=True),
        "dampening": Hyper(0.0, closed_unit_interval),
        "nesterov": Hyper(False, boolean, static=True),
    }

    def init(self, param: Tensor, group) -> dict[str, Tensor]:
        if float(group["momentum"]) == 0.0:
            return {}
        return {"momentum_buffer": torch.zeros_like(param, dtype=state_dtype(param))}

    def scalars(self, hyper, step: int) -> dict[str, float]:
        # 1 - dampening in double, as torch computes it
        return {"first_step": float(step == 1), "one_minus_dampening": 1 - float(hyper["dampening"])}

    def update(self, updates: list[Tensor], state, ctx: Context) -> list[Tensor]:
        if not ctx.active("momentum"):
            return updates
        mu, undamped, first = ctx["momentum"], ctx["one_minus_dampening"], ctx["first_step"]
        out = []
        for u, b in zip(updates, state["momentum_buffer"]):
            b.copy_(torch.where(first > 0, u, b * mu + u * undamped))
            out.append(u + b * mu if ctx["nesterov"] else b)
        return out


class trace_ema(Transform):  # noqa: N801
    """Momentum as an exponential moving average, as torch.optim.Muon keeps it:
    b <- mu b + (1 - mu) u;   u <- (1 - mu) u + mu b  (nesterov)  or  u <- b.
    """

    name = "ema"
    state = ("momentum_buffer",)
    hyper = {"momentum": Hyper(0.95, closed_unit_interval), "nesterov": Hyper(True, boolean, static=True)}

    def scalars(self, hyper, step: int) -> dict[str, float]:
        return {"one_minus_momentum": 1 - float(hyper["momentum"])}  # in double precision, as torch computes it

    def update(self, updates: list[Tensor], state, ctx: Context) -> list[Tensor]:
        mu = ctx["momentum"]
        out = []
        for u, b in zip(updates, state["momentum_buffer"]):
            b.lerp_(u, ctx["one_minus_momentum"])
            out.append(u.lerp(b, mu) if ctx["nesterov"] else b.clone())
        return out
