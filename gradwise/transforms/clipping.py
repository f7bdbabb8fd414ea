"""Clipping the update: each element to a range, or each tensor to a root-mean-square."""
from __future__ import annotations

import torch
from torch import Tensor

from gradwise.core.hyper import Hyper, non_negative, positive
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


class clip_by_block_rms(Transform):  # noqa: N801
    """u <- u / max(1, rms(u) / d) per tensor, rms(u) = ||u||_2 / sqrt(numel), d = ``clip_threshold``
    (Adafactor's update clipping, Shazeer & Stern 2018, arXiv:1804.04235; AdaLomo's grouped update
    normalization, Lv et al. 2023, arXiv:2310.10195)."""

    name = "clip_block_rms"
    elementwise = False
    hyper = {"clip_threshold": Hyper(1.0, positive)}

    def update(self, updates: list[Tensor], state, ctx: Context) -> list[Tensor]:
        d = ctx["clip_threshold"]
        out = []
        for u in updates:
            if u.numel() == 0:
                out.append(u)
                continue
            rms = torch.linalg.vector_norm(u) / u.numel() ** 0.5
            out.append(u / (rms / d).clamp(min=1.0))
        return out
