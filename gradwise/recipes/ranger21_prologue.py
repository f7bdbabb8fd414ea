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
from gradwise.transforms.gradient_shaping import (AGC_GRAD_EPS, NORMALIZE_EPS, centralize_gradient, clip_by_agc,
                                                  unit_norm)
from gradwise.transforms.learning_rate import scale_by_learning_rate
from gradwise.transforms.regularizers import add_norm_loss, add_stable_weight_decay

#: the running sum of the second moment, a 0-d float64 entry of each parameter's state
VARIANCE_SUM = "ranger21.variance_sum"


def shape_gradient(g: Tensor, unit_norm_p: Tensor | None, out: Tensor, group, gc: bool,
                   gn: bool) -> tuple[Tensor, Tensor]:
    """Write g' into ``out`` (AGC when ``unit_norm_p`` is given); return (sum of g'^2, a 0-d float64
    tensor, and the momenta's factor, 0-d), both on the device, so that nothing waits for it."""
    g = g.to(out.dtype)
    agc = unit_norm_p is not None
    if agc:
        max_norm = unit_norm_p.clamp_min(group["agc_eps"]) * group["agc_clipping_value"]
        g_norm = unit_norm(g).clamp_min(AGC_GRAD_EPS)
        scale = torch.where(g_norm > max_norm, max_norm / g_norm, 1.0)
    centralize = gc and g.dim() > (3 if group["gc_conv_only"] else 1)
    if centralize:
        dims = tuple(range(1, g.dim()))
        if agc:
            torch.addcmul(-(g.mean(dim=dims, keepdim=True) * scale), g, scale, out=out)
        else:
            torch.sub(g, g.mean(dim=dims, keepdim=True), out=out)
    elif agc:
        torch.mul(g, scale, out=out)
    else:
        out.copy_(g)
    n = out.numel()
    if not (gn and n > 2):
        return (out * out).sum(dtype=torch.float64), torch.ones((), dtype=out.dtype, device=out.device)
    if centralize:  # its mean is 0 up to rounding: the sum of squares loses nothing (and is 3x faster)
        mean = out.mean()
        std = ((torch.linalg.vector_norm(out) ** 2 - n * mean**2) / (n - 1)).clamp_min(0).sqrt()
    else:
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
