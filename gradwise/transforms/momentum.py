"""Heavy-ball and Nesterov momentum with dampening, as torch.optim.SGD (Sutskever et al., 2013)."""
from __future__ import annotations

import torch
from torch import Tensor

from gradwise.core import lists
from gradwise.core.hyper import Hyper, boolean, closed_unit_interval, non_negative
from gradwise.core.transform import Context, Transform, state_dtype
from gradwise.transforms.learning_rate import scale_by_learning_rate


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

    def fuse(self, other: Transform) -> Transform | None:
        """Followed by the step size (SGD's chain): one link, ``_fused_sgd``."""
        return _fused_sgd(self, other) if type(other) is scale_by_learning_rate else None


class _fused_sgd(Transform):  # noqa: N801
    """``trace`` then ``scale_by_learning_rate`` as one link (``Transform.fuse``): their ``update`` one after the
    other, the same ops. As the last link, eagerly under ``compile="auto"`` or ``fused=True``
    (``Context.torch_kernels``), the same step in torch's fused SGD kernel (``torch._fused_sgd_``, torch.optim.SGD's
    ``fused=True``), one pass over each parameter: b as ``trace`` keeps it, then p <- p - lr b (nesterov:
    p <- p - lr (u + mu b))."""

    name = "momentum"
    torch_kernel = True

    def __init__(self, momentum: trace, lr: scale_by_learning_rate):
        self.momentum, self.lr = momentum, lr
        self.state = momentum.state

    def update(self, updates: list[Tensor], state, ctx: Context) -> list[Tensor]:
        return self.lr.update(self.momentum.update(updates, state, ctx), {}, ctx)

    def apply(self, updates: list[Tensor], state, ctx: Context) -> None:
        if not (ctx.torch_kernels and lists.fused_kernel_takes(ctx.params, updates, state)):
            super().apply(updates, state, ctx)
            return
        active = ctx.active("momentum")  # (momentum 0: no buffer, p <- p - lr u)
        torch._fused_sgd_(ctx.params, updates, state["momentum_buffer"] if active else [], weight_decay=0.0,
                          momentum=ctx["momentum"].item() if active else 0.0, lr=ctx["lr"].item(),
                          dampening=ctx["dampening"].item(), nesterov=ctx["nesterov"],
                          maximize=False, is_first_step=bool(ctx["first_step"]))

    def __repr__(self) -> str:
        return f"fused({self.momentum!r}, {self.lr!r})"


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
