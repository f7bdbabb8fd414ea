"""Skip a whole step when any gradient holds NaN or inf (optax's ``skip_not_finite``)."""
from __future__ import annotations

import torch
from torch import Tensor

from gradwise.core.transform import Context, Transform


class skip_nonfinite(Transform):  # noqa: N801
    """A guard: if any gradient of the step is NaN or +-inf, no parameter and no state changes and the
    optimizer's ``skipped_steps`` grows by one. Otherwise the update passes through unchanged.

    Its statistic ``nonfinite`` (op ``"skip"``) is whether any element of its input is not finite:
    one read of every gradient (the inf-norm of each, which overflows for no finite value) and one
    host synchronization per step. It comes first in a chain (before any link that keeps state).
    """

    name = "skip_nonfinite"
    reductions = {"nonfinite": "skip"}

    def reduce(self, updates: list[Tensor], state, ctx: Context) -> dict[str, Tensor]:
        filled = [u.reshape(-1) for u in updates if u.numel()]
        if not filled:
            return {}
        norms = torch._foreach_norm(filled, float("inf"))
        return {"nonfinite": torch.stack(norms).isfinite().logical_not().any()}

    def update(self, updates: list[Tensor], state, ctx: Context) -> list[Tensor]:
        return updates
