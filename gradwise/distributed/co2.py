"""CO2's corrections to a one-step-stale outer update: the staleness-gap penalty and the clipping.

Sun et al. 2024, "CO2: Efficient Distributed Training with Full Communication-Computation Overlap"
(ICLR 2024). As DiLoCo with ``overlap=sync_every``, each phase's averaged pseudo-gradient ``delta_bar``
arrives one phase late: it was measured from the outer copy ``theta_prev`` the phase started from, and
is applied at ``theta``, which the last outer step has moved since. CO2 penalizes it by that *staleness
gap* and clips the outer update. The paper's summary at hand (shared/docs/LITERATURE.md) names both
without their formulas; gradwise writes them as follows, the penalty after Barkai et al.'s Gap-Aware
(2020: element-wise, the gap in units of a typical step, here the tensor's mean), the clipping as a norm
clipping::

    gap = theta - theta_prev                         (the last outer step, per parameter; 0 at first)
    delta_tilde = delta_bar / (1 + lambda * |gap| / mean(|gap|))     (per tensor; unchanged if gap is 0)
    delta_tilde <- delta_tilde * min(1, c / ||delta_tilde||)          (over a fragment's parameters)

then the outer optimizer's step on ``delta_tilde``. CO2 clips its outer momentum; gradwise's outer
optimizer is any torch optimizer, whose momentum it does not own, so what is clipped is what enters it
(under Nesterov SGD with momentum ``mu`` the momentum then stays within ``c / (1 - mu)``).
"""
from __future__ import annotations

import torch
from torch import Tensor


def penalize_(delta: Tensor, gap: Tensor, penalty: float) -> Tensor:
    """``delta`` divided in place by ``1 + penalty * |gap| / mean(|gap|)`` (unchanged where the gap is 0
    everywhere)."""
    size = gap.abs().mean()
    if size > 0:
        delta.div_(gap.abs().div(size).mul_(penalty).add_(1))
    return delta


def clip_(deltas: list[Tensor], max_norm: float) -> list[Tensor]:
    """``deltas`` scaled in place so that their joint L2 norm is at most ``max_norm``."""
    norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(d) for d in deltas]))
    if norm > max_norm:
        for d in deltas:
            d.mul_(max_norm / norm)
    return deltas
