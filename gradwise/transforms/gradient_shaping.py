"""Reshaping the gradient before the preconditioner: adaptive clipping, centralization, normalization.

None of them is elementwise: each reads a norm, mean or standard deviation of a whole tensor (or of
its rows), so a chain holding one runs on whole tensors (``elementwise = False``).

- ``clip_by_agc`` (Brock et al., 2021, "High-performance large-scale image recognition without
  normalization", arXiv:2102.06171): per unit (row), if ||g|| > c max(||p||, eps_p) then
  g <- g c max(||p||, eps_p) / max(||g||, 1e-6). Units: the whole tensor for 0-d and 1-d tensors,
  dim 1 for 2-d and 3-d ones, every dim but the first beyond (``unit_norm``).
- ``centralize_gradient`` (Yong et al., 2020, "Gradient Centralization", arXiv:2004.01461):
  g <- g - mean(g over every dim but the first), for tensors of 2 or more dims (with
  ``gc_conv_only``, of 4 or more).
- ``normalize_gradient`` (Ranger21, Wright & Demeure, 2021, arXiv:2106.13731):
  g <- g / (std(g) + 1e-8) (unbiased std over the whole tensor) for tensors of more than 2 elements.
"""
from __future__ import annotations

import torch
from torch import Tensor

from gradwise.core.hyper import Hyper, boolean, non_negative
from gradwise.core.transform import Context, Transform

#: the floor of a gradient's unit norm in adaptive clipping, and the normalizer's epsilon (both references')
AGC_GRAD_EPS = 1e-6
NORMALIZE_EPS = 1e-8


def unit_norm(x: Tensor) -> Tensor:
    """The L2 norm of each unit of ``x``: all of it (0-d, 1-d), its rows (2-d, 3-d: over dim 1), or
    over every dim but the first (4-d and more); reduced dims kept for tensors of 2 or more dims."""
    if x.dim() <= 1:
        return x.norm(p=2.0)
    dim = 1 if x.dim() in (2, 3) else tuple(range(1, x.dim()))
    return x.norm(p=2.0, dim=dim, keepdim=True)


def centralized(g: Tensor, conv_only: bool = False) -> Tensor:
    if g.dim() > (3 if conv_only else 1):
        return g - g.mean(dim=tuple(range(1, g.dim())), keepdim=True)
    return g


def normalized(g: Tensor) -> Tensor:
    return g / (g.std() + NORMALIZE_EPS) if g.numel() > 2 else g


class clip_by_agc(Transform):  # noqa: N801
    """Adaptive gradient clipping (module docstring): ``agc_clipping_value`` c, ``agc_eps`` eps_p."""

    name = "agc"
    elementwise = False
    hyper = {"agc_clipping_value": Hyper(1e-2, non_negative), "agc_eps": Hyper(1e-3, non_negative)}

    def update(self, updates: list[Tensor], state, ctx: Context) -> list[Tensor]:
        clip, eps = ctx["agc_clipping_value"], ctx["agc_eps"]
        out = []
        for u, p in zip(updates, ctx.params):
            max_norm = unit_norm(p.to(u.dtype)).clamp_min(eps) * clip
            g_norm = unit_norm(u).clamp_min(AGC_GRAD_EPS)
            # the factor per unit first (small), then one pass over u
            out.append(u * torch.where(g_norm > max_norm, max_norm / g_norm, torch.ones_like(g_norm)))
        return out


class centralize_gradient(Transform):  # noqa: N801
    """Gradient centralization (module docstring); ``gc_conv_only`` limits it to 4-d and larger tensors."""

    name = "gc"
    elementwise = False
    hyper = {"gc_conv_only": Hyper(False, boolean, static=True)}

    def update(self, updates: list[Tensor], state, ctx: Context) -> list[Tensor]:
        return [centralized(u, ctx["gc_conv_only"]) for u in updates]


class normalize_gradient(Transform):  # noqa: N801
    """Gradient normalization by the tensor's standard deviation (module docstring)."""

    name = "gn"
    elementwise = False

    def update(self, updates: list[Tensor], state, ctx: Context) -> list[Tensor]:
        return [normalized(u) for u in updates]
