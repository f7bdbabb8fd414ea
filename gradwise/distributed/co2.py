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

``CO2OuterMomentum`` is the outer step of the authors' released code instead (weigao266/fairscale-CO2,
``fairscale/experimental/nn/data_parallel/gossip/co2.py``, ``_perform_local_optimization``; the paper's own
formulas were not found), an outer optimizer for ``DiLoCo(..., outer=CO2OuterMomentum)``: heavy-ball
momentum on the pseudo-gradient divided by a constant gap penalty, the momentum clamped element-wise::

    m <- mu m + delta / lambda;   m <- clamp(m, -c, c)  (with a clip);   theta <- theta - lr m

The released code calls ``torch.clamp(m, -c, c)`` without keeping its result, so its clipping changes
nothing; here it is applied, as its ``co2_clip_threshold`` describes. Its defaults: ``outer_lr`` 1,
``outer_momentum`` 0.5, ``co2_gap_penalty`` 1, clipping off (threshold 1).
"""
from __future__ import annotations

import math

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


class CO2OuterMomentum(torch.optim.Optimizer):
    """CO2's outer step as released by its authors (see the module's docstring): ``m <- mu m + g / lambda``,
    clamped to ``[-clip, clip]`` element-wise when ``clip`` is given, then ``theta <- theta - lr m``.

    Args:
        params: the parameters (DiLoCo's synced copy) or param groups.
        lr: the outer learning rate (> 0; the code's ``outer_lr``, default 1).
        momentum: ``mu`` in [0, 1) (the code's ``outer_momentum``, default 0.5).
        gap_penalty: ``lambda`` > 0 (the code's ``co2_gap_penalty``, default 1).
        clip: None, or the element-wise bound ``c`` > 0 of the momentum (the code's ``co2_clip_threshold``).
    """

    def __init__(self, params, lr: float = 1.0, momentum: float = 0.5, gap_penalty: float = 1.0,
                 clip: float | None = None) -> None:
        for name, value, low, high in (("lr", lr, 0, math.inf), ("gap_penalty", gap_penalty, 0, math.inf)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not low < value < high:
                raise ValueError(f"invalid {name}={value!r}: expected a finite number > 0")
        if isinstance(momentum, bool) or not isinstance(momentum, (int, float)) or not 0 <= momentum < 1:
            raise ValueError(f"invalid momentum={momentum!r}: expected a number in [0, 1)")
        if clip is not None and (isinstance(clip, bool) or not isinstance(clip, (int, float))
                                 or not 0 < clip < math.inf):
            raise ValueError(f"invalid clip={clip!r}: expected None or a finite bound > 0")
        super().__init__(params, {"lr": lr, "momentum": momentum, "gap_penalty": gap_penalty, "clip": clip})

    @torch.no_grad()
    def step(self, closure=None):
        loss = None if closure is None else closure()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(p)
                m = state["momentum_buffer"]
                m.mul_(group["momentum"]).add_(p.grad, alpha=1 / group["gap_penalty"])
                if group["clip"] is not None:
                    m.clamp_(-group["clip"], group["clip"])
                p.add_(m, alpha=-group["lr"])
        return loss
