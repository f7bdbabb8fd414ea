"""CO2's outer step as its authors released it (weigao266/fairscale-CO2, ``gossip/co2.py``,
``_perform_local_optimization``), in float64 on a list of tensors: per element

    gmb <- outer_momentum * gmb - p / gap_penalty + old / gap_penalty     (p - old = -grad: the pseudo-gradient)
    gmb <- clamp(gmb, -threshold, threshold)        (the intent of its ``_co2_clip``, whose result it drops)
    old <- old - outer_lr * gmb

written here on the pseudo-gradient ``g = old - p`` the caller hands in.
"""
from __future__ import annotations

import torch


def co2_outer(theta, grads_per_step, outer_lr: float, outer_momentum: float, gap_penalty: float,
              threshold: float | None) -> list[torch.Tensor]:
    """``theta`` (a list of tensors) after one outer step per entry of ``grads_per_step``."""
    old = [t.detach().clone().double() for t in theta]
    gmb = [torch.zeros_like(t) for t in old]
    for grads in grads_per_step:
        for o, b, g in zip(old, gmb, grads):
            p = o - g.double()  # the averaged parameters the pseudo-gradient g was measured to
            b.mul_(outer_momentum).sub_(p, alpha=1 / gap_penalty).add_(o, alpha=1 / gap_penalty)
            if threshold is not None:
                b.copy_(torch.clamp(b, min=-threshold, max=threshold))
            o.add_(b, alpha=-outer_lr)
    return old
