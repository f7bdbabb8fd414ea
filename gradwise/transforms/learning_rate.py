"""The step size: the last link of every recipe."""
from __future__ import annotations

from torch import Tensor

from gradwise.core.hyper import Hyper, non_negative
from gradwise.core.transform import Context, Transform


class scale_by_learning_rate(Transform):  # noqa: N801
    """u <- -lr * u  (the executor then applies p <- p + u)."""

    name = "lr"
    hyper = {"lr": Hyper(1e-3, non_negative)}

    def update(self, updates: list[Tensor], state, ctx: Context) -> list[Tensor]:
        lr = ctx["lr"]
        return [u * -lr for u in updates]
