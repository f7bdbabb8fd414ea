"""Clipping the update: element by element, and by the norm of the whole step (``clip_by_block_rms``, per
tensor, is in ``factored``)."""
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


class clip_by_global_norm(Transform):  # noqa: N801
    """u <- u min(1, c / ||u||), with ||u|| the L2 norm of every update of the step taken together and
    c = ``max_norm`` (optax's ``clip_by_global_norm``; Pascanu et al., 2013, "On the difficulty of
    training recurrent neural networks", arXiv:1211.5063). First in a chain it clips the gradients, as
    ``torch.nn.utils.clip_grad_norm_`` does before ``step()`` (which adds 1e-6 to the norm; optax and
    this link do not). Its statistic ``sum_of_squares`` is a reduction over every parameter of the step,
    so the chain runs in phases (``core/phases.py``) and the link works inside ``route()`` too."""

    name = "clip_global_norm"
    hyper = {"max_norm": Hyper(1.0, positive)}
    reductions = {"sum_of_squares": "sum"}

    def reduce(self, updates: list[Tensor], state, ctx: Context) -> dict[str, Tensor]:
        filled = [u.reshape(-1) for u in updates if u.numel()]
        if not filled:
            return {}
        norms = torch._foreach_norm(filled, 2.0)
        return {"sum_of_squares": torch.stack(norms).double().square().sum()}

    def update(self, updates: list[Tensor], state, ctx: Context) -> list[Tensor]:
        norm = ctx["sum_of_squares"].sqrt()
        scale = torch.where(norm < ctx["max_norm"], torch.ones_like(norm), ctx["max_norm"] / norm)
        return [u * scale for u in updates]
