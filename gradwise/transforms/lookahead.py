"""Lookahead (Zhang, Lucas, Hinton & Ba, 2019, "Lookahead Optimizer: k steps forward, 1 step back").

The chain before it moves fast weights; every ``lookahead_k`` steps the slow weights move a fraction
``lookahead_alpha`` toward them and the fast weights restart from there:

    slow <- slow + alpha (fast - slow);  fast <- slow        (on steps t with t % k == 0)

As a last link it turns the change u into the one that lands p on the new slow weights on those
steps (u <- slow_new - p) and passes u through on the others.
"""
from __future__ import annotations

import numbers

import torch
from torch import Tensor

from gradwise.core.hyper import Hyper, closed_unit_interval
from gradwise.core.transform import Context, Transform, state_dtype


def positive_int(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"invalid {name}={value!r}: expected an integer >= 1")


class lookahead(Transform):  # noqa: N801
    """The Lookahead step (module docstring); the last link, after the learning rate."""

    name = "lookahead"
    state = ("slow",)
    hyper = {"lookahead_k": Hyper(5, positive_int), "lookahead_alpha": Hyper(0.5, closed_unit_interval)}

    def init(self, param: Tensor, group) -> dict[str, Tensor]:
        return {"slow": param.detach().to(state_dtype(param), copy=True)}

    def scalars(self, hyper, step: int) -> dict[str, float]:
        return {"sync": float(step % hyper["lookahead_k"] == 0)}

    def update(self, updates: list[Tensor], state, ctx: Context) -> list[Tensor]:
        alpha, sync = ctx["lookahead_alpha"], ctx["sync"]
        out = []
        for u, p, slow in zip(updates, ctx.params, state["slow"]):
            merged = slow + (p + u - slow) * alpha
            slow.copy_(torch.where(sync > 0, merged, slow))
            out.append(torch.where(sync > 0, merged - p, u))
        return out
