"""Skip a whole step when any gradient holds NaN or inf (optax's ``skip_not_finite``)."""
from __future__ import annotations

import torch
from torch import Tensor

from gradwise.core.transform import Context, Transform


class skip_nonfinite(Transform):  # noqa: N801
    """A guard: if any gradient of the step is NaN or +-inf, no parameter and no state changes and the
    optimizer's ``skipped_steps`` grows by one. Otherwise the update passes through unchanged.

    The check is one read of every gradient (the inf-norm of each, which overflows for no finite
    value) and one host synchronization per step.
    """

    name = "skip_nonfinite"

    def update(self, updates: list[Tensor], state, ctx: Context) -> list[Tensor]:
        return updates

    def skip_step(self, grads: list[Tensor]) -> Tensor | None:
        norms = torch._foreach_norm([g.reshape(-1) for g in grads if g.numel()], float("inf"))
        return torch.stack(norms).isfinite().logical_not().any() if norms else None
