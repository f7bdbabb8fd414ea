"""CAME, as the authors' came-pytorch computes it."""
from __future__ import annotations

from gradwise.core.optimizer import Optimizer
from gradwise.core.transform import chain
from gradwise.transforms.came import scale_by_came_rms, scale_by_confidence
from gradwise.transforms.factored import clip_by_block_rms
from gradwise.transforms.learning_rate import scale_by_learning_rate
from gradwise.transforms.weight_decay import add_decayed_weights


class CAME(Optimizer):
    """CAME (Luo et al., ACL 2023, arXiv:2307.02047) with came-pytorch's arguments and defaults; ``lr``
    has no default there and none here.

    U = g / sqrt(V)  (``scale_by_came_rms``: Adafactor's factored second moment, b2, eps1 added);
    U <- U / max(1, rms(U) / clip_threshold);  m <- b1 m + (1-b1) U;
    p <- p - lr (m / sqrt(S) + wd p), S the factored mean of (U - m)^2 + eps2 under b3
    (``scale_by_confidence``; tensors of fewer than two dimensions: m alone).
    """

    def __init__(self, params, lr=None, eps=(1e-30, 1e-16), clip_threshold=1.0, betas=(0.9, 0.999, 0.9999),
                 weight_decay=0.0, *, maximize=False, skip_nonfinite=False, compile="auto", state=None,
                 param_rounding="nearest"):
        transform = chain(scale_by_came_rms(), clip_by_block_rms("clip_threshold"), scale_by_confidence(),
                          add_decayed_weights(), scale_by_learning_rate())
        super().__init__(params, transform, lr=lr, eps=eps, clip_threshold=clip_threshold, betas=betas,
                         weight_decay=weight_decay, maximize=maximize, skip_nonfinite=skip_nonfinite,
                         compile=compile, state=state,
                         param_rounding=param_rounding)
