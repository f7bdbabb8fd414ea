"""ADOPT: Adam whose step normalizes by the previous second moment, then averages."""
from __future__ import annotations

from gradwise.core.optimizer import Optimizer
from gradwise.recipes.adam import decayed_chain
from gradwise.transforms.adopt import adopt_clip, scale_by_adopt


class ADOPT(Optimizer):
    """ADOPT (Taniguchi et al., 2024, arXiv:2411.02853); equals ``pytorch_optimizer.ADOPT`` step by step.

    step 1: v <- g^2 (no move);  then m <- b1 m + (1-b1) clamp(g / max(sqrt(v), eps), +-c_t);
    p <- p - lr m;  v <- b2 v + (1-b2) g^2, with c_t = ``clip_lambda(t)`` (t^(1/4); None: no clip).
    pytorch-optimizer's arguments and defaults: ``weight_decouple=False`` adds wd p to g (L2), True
    decays decoupled (p <- p - lr (m + wd p)); its ``fixed_decay`` is not offered.
    """

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.9999), clip_lambda=adopt_clip, weight_decay=0.0,
                 weight_decouple=False, eps=1e-6, *, maximize=False, skip_nonfinite=False, compile="auto",
                 state=None, param_rounding="nearest"):
        transform = decayed_chain(scale_by_adopt(clip_lambda), weight_decouple, "weight_decouple")
        super().__init__(params, transform, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                         maximize=maximize, skip_nonfinite=skip_nonfinite, compile=compile, state=state,
                         param_rounding=param_rounding)
