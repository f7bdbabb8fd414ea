"""MADGRAD (Defazio & Jelassi, 2021, "Adaptivity without Compromise: A Momentumized, Adaptive, Dual
Averaged Gradient Method for Stochastic Optimization", arXiv:2101.11075), Algorithm 1:

    lambda_t = lr sqrt(t)                              (t = 1, 2, ...)
    s <- s + lambda_t g;   nu <- nu + lambda_t g^2     (dual averages of the gradient and its square)
    z = x0 - s / (nu^(1/3) + eps)                      (x0: the starting point)
    x <- (1 - c) x + c z,   c = 1 - momentum

The link turns the gradient into that change of x, u = c (z - x); the learning rate lives inside
(lambda_t), so it is the last link of a chain, in place of ``scale_by_learning_rate``. With
``momentum = 0`` (c = 1) it computes, as the ``madgrad`` package does, the starting point afresh from
x at every step (x0 = x + s / d before the step, so u = s_old / d_old - s / d), which keeps any change
made to x outside the link (weight decay) in the iterate; the stored x0 is then unused.

``schedule`` (a ``gradwise.schedules.Schedule``) multiplies lr: lambda_t = lr schedule(t - 1) sqrt(t).
``anchor_at_first_step`` sets x0 to the point the first step is taken from (a link before this one
may move it: Ranger21 decays the parameters first, ``shrink_like_ranger21``) instead of the parameters
at creation. ``denominator="softplus"`` replaces nu^(1/3) + eps by softplus(nu^(1/3)) (beta ``beta_softplus``)
when the group's ``softplus`` is on and by nu^(1/3) when it is off, as Ranger21's MADGRAD core does
(a step where nu is 0 is then 0, as the ``madgrad`` package makes it for eps = 0). Coupled weight
decay (the package's default) is ``add_decayed_weights`` before this link.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

from gradwise.core.hyper import Hyper, boolean, choice, positive, unit_interval
from gradwise.core.transform import Context, Transform, state_dtype
from gradwise.transforms.learning_rate import scale_by_learning_rate
from gradwise.transforms.softplus import softplus


class scale_by_madgrad(Transform):  # noqa: N801
    """The MADGRAD step (module docstring): the change of the parameters, lr included."""

    name = "madgrad"
    state = ("grad_sum_sq", "s", "x0")
    weights_like = ("x0",)
    nonnegative = ("grad_sum_sq",)

    def __init__(self, schedule=None, denominator: str = "eps", anchor_at_first_step: bool = False):
        choice(("eps", "softplus"))("denominator", denominator)
        self.schedule, self.denominator, self.anchor_at_first_step = schedule, denominator, anchor_at_first_step
        # lr as every link declares it (default 1e-3; the madgrad package's is 1e-2), so chains compose
        self.hyper = {"lr": scale_by_learning_rate.hyper["lr"], "momentum": momentum_hyper()}
        if denominator == "eps":
            self.hyper["eps"] = Hyper(1e-6, positive)
        else:
            self.hyper.update(softplus=Hyper(True, boolean, static=True),
                              beta_softplus=Hyper(50.0, positive, static=True))

    def init(self, param: Tensor, group) -> dict[str, Tensor]:
        dtype = state_dtype(param)
        zeros = dict(dtype=dtype, memory_format=torch.preserve_format)
        return {"grad_sum_sq": torch.zeros_like(param, **zeros), "s": torch.zeros_like(param, **zeros),
                "x0": param.detach().to(dtype, copy=True)}

    def scalars(self, hyper, step: int) -> dict[str, float]:
        # 1 - momentum in double, as the madgrad package computes it
        return {"lamb": lambda_t(hyper, step, self.schedule), "one_minus_momentum": 1 - float(hyper["momentum"]),
                "first": float(step == 1)}

    def _step(self, s: Tensor, nu: Tensor, ctx: Context) -> Tensor:
        """s / d(nu), with d(nu) = nu^(1/3) + eps, or the softplus form (module docstring)."""
        root = nu.pow(1 / 3)
        if self.denominator == "eps":
            return s / (root + ctx["eps"])
        if ctx["softplus"]:
            return s / softplus(root, ctx["beta_softplus"])
        return s / root.clamp_min(torch.finfo(root.dtype).tiny)  # s = 0 wherever nu = 0

    def update(self, updates: list[Tensor], state, ctx: Context) -> list[Tensor]:
        lamb, momentum = ctx["lamb"], ctx.active("momentum")
        out = []
        for g, x, nu, s, x0 in zip(updates, ctx.params, state["grad_sum_sq"], state["s"], state["x0"]):
            if self.anchor_at_first_step:  # x0 is the point of the first step (Ranger21 decays p before it)
                x0.copy_(torch.where(ctx["first"] > 0, x.to(x0.dtype), x0))
            before = None if momentum else self._step(s, nu, ctx)
            nu.add_(g * g * lamb)
            s.add_(g * lamb)
            after = self._step(s, nu, ctx)
            if momentum:
                out.append((x0 - after - x.to(g.dtype)) * ctx["one_minus_momentum"])
            else:
                out.append(before - after)
        return out

    def __repr__(self) -> str:
        return (f"scale_by_madgrad(schedule={self.schedule!r}, denominator={self.denominator!r},"
                f" anchor_at_first_step={self.anchor_at_first_step})")


def momentum_hyper() -> Hyper:
    """MADGRAD's momentum (0: the iterate is z itself)."""
    return Hyper(0.9, unit_interval, zero_is_identity=True)


def lambda_t(hyper, step: int, schedule=None) -> float:
    """lr schedule(t - 1) sqrt(t): MADGRAD's weight of the t-th gradient."""
    factor = schedule(step - 1) if schedule is not None else 1.0
    return float(hyper["lr"]) * factor * math.sqrt(step)
