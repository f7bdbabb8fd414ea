"""Lookahead (Zhang, Lucas, Hinton & Ba, 2019, "Lookahead Optimizer: k steps forward, 1 step back").

The chain before it moves fast weights; every ``lookahead_k`` steps the slow weights move a fraction
``lookahead_alpha`` toward them and the fast weights restart from there:

    slow <- slow + alpha (fast - slow);  fast <- slow        (on steps t with t % k == 0)

As a last link it turns the change u into the one that lands p on the new slow weights on those
steps (u <- slow_new - p) and passes u through on the others.

``lookahead(evaluate_slow=True)`` evaluates the model at the slow weights, as Ranger21's
``lookahead_load_at_validation`` means to: ``Optimizer.eval()`` swaps each parameter with its slow
weights (the buffer then holds the fast ones) and ``Optimizer.train()`` swaps them back, through
``Transform.set_mode``; so both are idempotent, no memory is added, and the mode is saved in
``state_dict``. (For 16-bit parameters the slow weights are rounded to the parameter's dtype at each
``eval()``.)
"""
from __future__ import annotations

import torch
from torch import Tensor

from gradwise.core import lists
from gradwise.core.hyper import Hyper, boolean, closed_unit_interval, positive_int
from gradwise.core.transform import Context, Transform, state_dtype


class lookahead(Transform):  # noqa: N801
    """The Lookahead step (module docstring); the last link, after the learning rate."""

    name = "lookahead"
    state = ("slow",)
    weights_like = ("slow",)
    hyper = {"lookahead_k": Hyper(5, positive_int), "lookahead_alpha": Hyper(0.5, closed_unit_interval)}

    def __init__(self, evaluate_slow: bool = False):
        boolean("evaluate_slow", evaluate_slow)
        self.evaluate_slow = evaluate_slow
        if not evaluate_slow:  # the model holds the fast weights in eval mode too: no set_mode
            self.hooks = type(self).hooks - {"set_mode"}

    def init(self, param: Tensor, group) -> dict[str, Tensor]:
        return {"slow": param.detach().to(state_dtype(param), copy=True)}

    def scalars(self, hyper, step: int) -> dict[str, float]:
        return {"sync": float(step % hyper["lookahead_k"] == 0)}

    def update(self, updates: list[Tensor], state, ctx: Context) -> list[Tensor]:
        """As list ops (``core/lists.py``), but the select per tensor."""
        sync = ctx["sync"]
        weight = ctx["lookahead_alpha"] * sync  # 0 off the merge steps: slow stays as it is, exactly
        lists.lerp_small_(state["slow"], lists.add(ctx.params, updates), weight)
        back = lists.sub(state["slow"], ctx.params)
        return [torch.where(sync > 0, b, u) for b, u in zip(back, updates)]

    def set_mode(self, mode: str, param: Tensor, state, group) -> None:
        """``evaluate_slow=True``: swap the parameter and its slow weights (module docstring)."""
        slow = state["slow"]
        fast = param.to(slow.dtype, copy=True)
        param.copy_(slow)
        slow.copy_(fast)

    def __repr__(self) -> str:
        return "lookahead(evaluate_slow=True)" if self.evaluate_slow else "lookahead()"
