"""Lion: sign momentum found by program search."""
from __future__ import annotations

from gradwise.core.optimizer import Optimizer
from gradwise.core.transform import chain
from gradwise.transforms import add_decayed_weights, scale_by_learning_rate, scale_by_lion


class Lion(Optimizer):
    """Lion (Chen et al., 2023, arXiv:2302.06675); equals lion-pytorch's ``Lion`` step by step.

    p <- p - lr (sign(b1 m + (1-b1) g) + wd p);  m <- b2 m + (1-b2) g.
    """

    def __init__(self, params, lr=1e-4, betas=(0.9, 0.99), weight_decay=0.0, *,
                 maximize=False, skip_nonfinite=False, compile="auto", state=None,
                 param_rounding="nearest"):
        transform = chain(scale_by_lion(), add_decayed_weights(), scale_by_learning_rate())
        super().__init__(params, transform, lr=lr, betas=betas, weight_decay=weight_decay,
                         maximize=maximize, skip_nonfinite=skip_nonfinite, compile=compile, state=state,
                         param_rounding=param_rounding)
