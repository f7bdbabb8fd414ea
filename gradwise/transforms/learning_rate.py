"""The step size: the last link of every recipe, and a schedule inside a chain."""
from __future__ import annotations

from torch import Tensor

from gradwise.core import lists
from gradwise.core.hyper import Hyper, non_negative
from gradwise.core.transform import Context, Transform


class scale_by_learning_rate(Transform):  # noqa: N801
    """u <- -lr * u  (the executor then applies p <- p + u)."""

    name = "lr"
    hyper = {"lr": Hyper(1e-3, non_negative)}

    def update(self, updates: list[Tensor], state, ctx: Context) -> list[Tensor]:
        return lists.mul(updates, -ctx["lr"])


class scale_by_schedule(Transform):  # noqa: N801
    """u <- schedule(t) u at step t (0 for the first step), for a ``gradwise.schedules.Schedule``.

    The factor is a per-step scalar computed from the step count in the optimizer state, so a
    recipe's built-in schedule resumes exactly from a checkpoint.
    """

    name = "schedule"

    def __init__(self, schedule):
        from gradwise.schedules import Schedule

        if not isinstance(schedule, Schedule):
            raise TypeError(f"invalid schedule={schedule!r}: expected a gradwise.schedules.Schedule")
        self.schedule = schedule

    def scalars(self, hyper, step: int) -> dict[str, float]:
        return {"factor": self.schedule(step - 1)}

    def update(self, updates: list[Tensor], state, ctx: Context) -> list[Tensor]:
        factor = ctx["factor"]
        return [u * factor for u in updates]

    def __repr__(self) -> str:
        return f"scale_by_schedule({self.schedule!r})"
