"""Clipping the update element by element (``clip_by_block_rms``, per tensor, is in ``factored``)."""
from __future__ import annotations

import torch
from torch import Tensor

from gradwise.core.hyper import Hyper, non_negative
from gradwise.core.transform import Context, Transform


class clip_by_value(Transform):  # noqa: N801
    """u <- clamp(u, -c, c) with c = ``clip_grad_value``; 0 clips nothing (LOMO's gradient value
    clipping, Lv et al. 2023, arXiv:2306.09782, where ``None`` means no clipping)."""

    name = "clip_value"
    hyper = {"clip_grad_value": Hyper(0.0, non_negative, zero_is_identity=True)}

    def update(self, updates: list[Tensor], state, ctx: Context) -> list[Tensor]:
        if not ctx.active("clip_grad_value"):
            return updates
        c = ctx["clip_grad_value"]
        return [torch.minimum(torch.maximum(u, -c), c) for u in updates]
