"""Ranger21's prologue: the part of its step that reads whole tensors, run once per step before the
elementwise rest, so that the rest runs in cache-sized pieces or as one compiled graph of any length.

Per parameter (whole tensors, eagerly), from the gradient g and the parameter p:

    s = AGC's factor per unit (1, or c max(||p||_unit, eps) / ||g||_unit where that clips)
    g_c = s g - mean_unit(s g)                  (gradient centralization; 2+ dims)
    g' = g_c / (sigma + 1e-8), sigma = std(g_c)   (gradient normalization; 3+ elements)

g' is written into a scratch tensor that stands in for the gradient during the elementwise step.
Ranger21 centralizes and normalizes g' once more for its momenta: the unit means of g' are already
0 and its standard deviation is sigma' = sigma / (sigma + 1e-8), so that is g' / (sigma' + 1e-8), a
0-d factor per parameter (``pnm.momentum_scale``). Stable weight decay needs the mean of the
bias-corrected second moment over every element after this step: sum(g'^2) follows from sigma and
the mean of g_c (no further pass), and sum(v) is kept as a running 0-d state,
sum(v_t) = b2 sum(v_{t-1}) + (1 - b2) sum(g'^2). With n known, ``shrink`` multiplies p in place by
(1 - a)(1 - b) per unit (stable weight decay and norm loss), as Ranger21's code does before its step.
"""
from __future__ import annotations

import torch
from torch import Tensor

from gradwise.core.transform import Transform
from gradwise.transforms.gradient_shaping import (
    AGC_GRAD_EPS,
    NORMALIZE_EPS,
    centralize_gradient,
    clip_by_agc,
    unit_norm,
)
from gradwise.transforms.learning_rate import scale_by_learning_rate
from gradwise.transforms.regularizers import add_norm_loss, add_stable_weight_decay

#: the running sum of the second moment, a 0-d float64 entry of each parameter's state
VARIANCE_SUM = "ranger21.variance_sum"


def shape_gradient(g: Tensor, unit_norm_p: Tensor | None, out: Tensor, group, gc: bool,
                   gn: bool) -> tuple[Tensor, Tensor]:
    """Write g' into ``out`` (AGC when ``unit_norm_p`` is given); return (sum of g'^2, a 0-d float64
    tensor, and the momenta's factor, 0-d), both on the device, so that nothing waits for it."""
    g = g.to(out.dtype)
    n, agc = g.numel(), unit_norm_p is not None
    centralize = gc and g.dim() > (3 if group["gc_conv_only"] else 1)
    # AGC's units are centralization's too, except for 3-d tensors (fibres [i, :, k] against slices [i])
    same_units = g.dim() != 3
    g_norm = unit_norm(g) if agc or (centralize and gn and same_units) else None
    scale = 1.0
    if agc:
        max_norm = unit_norm_p.clamp_min(group["agc_eps"]) * group["agc_clipping_value"]
        clamped = g_norm.clamp_min(AGC_GRAD_EPS)
        scale = torch.where(clamped > max_norm, max_norm / clamped, 1.0)
    if centralize and gn and n > 2 and same_units:
        # one pass writes g': each unit's centred sum of squares is s^2 (||g||^2 - n_unit mean^2), so the
        # standard deviation of g_c (whose mean is 0) comes from the unit norms and means already taken
        mean = g.mean(dim=tuple(range(1, g.dim())), keepdim=True)
        centred = ((g_norm**2 - (n // mean.numel()) * mean**2).clamp_min(0) * scale**2).sum()
        std = (centred / (n - 1)).sqrt()
        inv = 1 / (std + NORMALIZE_EPS)
        factor = scale * inv
        torch.addcmul(-(mean * factor), g, factor, out=out)
        return centred.double() * inv.double() ** 2, 1 / (std * inv + NORMALIZE_EPS)
    torch.mul(g, scale, out=out)
    if centralize:
        out.sub_(out.mean(dim=tuple(range(1, g.dim())), keepdim=True))
    if not (gn and n > 2):
        return (out * out).sum(dtype=torch.float64), torch.ones((), dtype=out.dtype, device=out.device)
    std, mean = torch.std_mean(out)
    inv = 1 / (std + NORMALIZE_EPS)
    out.mul_(inv)
    squares = ((n - 1) * std.double() ** 2 + n * mean.double() ** 2) * inv.double() ** 2
    return squares, 1 / (std * inv + NORMALIZE_EPS)


def shrink(p: Tensor, unit_norm_p: Tensor | None, decay_rate: float, lr_t: float, group) -> None:
    """p <- p (1 - a)(1 - b): a = ``decay_rate`` (stable weight decay), b = lr_t 2 f (1 - 1 / ((1 - a)
    ||p||_unit + eps)) (norm loss, when ``unit_norm_p`` is given), in place."""
    keep = 1 - decay_rate
    if unit_norm_p is None:
        if keep != 1:
            p.mul_(keep)
        return
    p.mul_((1 - lr_t * 2 * group["normloss_factor"] * (1 - 1 / (unit_norm_p * keep + group["eps"]))) * keep)


class ranger21_prologue(Transform):  # noqa: N801
    """The prologue's place in the chain: it declares the hyperparameters ``shape_gradient`` and ``shrink``
    read (so the optimizer validates them in every group) and passes the already shaped gradient on."""

    name = "prologue"

    def __init__(self, agc: bool, gc: bool):
        self.hyper = {"lr": scale_by_learning_rate.hyper["lr"], **add_stable_weight_decay.hyper,
                      **add_norm_loss.hyper, **(clip_by_agc.hyper if agc else {}),
                      **(centralize_gradient.hyper if gc else {})}

    def update(self, updates: list[Tensor], state, ctx) -> list[Tensor]:
        return updates
