"""SPAM: AdamW with momentum resets, a warmup after each, and spike-aware gradient clipping."""
from __future__ import annotations

from gradwise.core.optimizer import Optimizer
from gradwise.core.transform import chain
from gradwise.transforms import (
    decay_stepped_weights,
    scale_by_adam_moments,
    scale_by_bias_correction,
    scale_by_learning_rate,
)
from gradwise.transforms.spam import spam


class SPAM(Optimizer):
    """SPAM (Huang et al., 2025, arXiv:2501.06842); equals ``pytorch_optimizer.SPAM`` (``density=1.0``) step by step.

    At step t, T = ``update_proj_gap``: m, v <- 0 when t mod T = 0; g <- sign(g) sqrt(theta v) where
    g^2 > theta v (``threshold``), once t mod T >= ``grad_accu_steps``; m, v Adam's moments of g;
    p <- (p - s_t lr sqrt(1-b2^t) / (1-b1^t) m / (sqrt(v) + eps)) (1 - lr wd), with s_t the cosine warmup
    over ``warmup_epoch`` steps after each reset (``gradwise.transforms.spam``; the bias corrections count
    from step 1, not from the reset, as the reference's). pytorch-optimizer's arguments and defaults.
    ``density`` < 1: a mask per matrix, redrawn at each reset (``spam``), outside which nothing steps; unlike
    pytorch-optimizer's (drawn from torch's global generator), it is a hash of the parameter's index and the
    period, so a run resumes exactly, and the weight decay applies to every entry (its: the masked ones only).
    """

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), density=1.0, weight_decay=0.0, warmup_epoch=50,
                 threshold=5000, grad_accu_steps=20, update_proj_gap=500, eps=1e-6, *, maximize=False,
                 skip_nonfinite=False, compile="auto", state=None, param_rounding="nearest"):
        transform = chain(spam(chain(scale_by_adam_moments(), scale_by_bias_correction()), density),
                          scale_by_learning_rate(), decay_stepped_weights())
        super().__init__(params, transform, lr=lr, betas=betas, weight_decay=weight_decay, warmup_epoch=warmup_epoch,
                         threshold=threshold, grad_accu_steps=grad_accu_steps, update_proj_gap=update_proj_gap,
                         eps=eps, maximize=maximize, skip_nonfinite=skip_nonfinite, compile=compile, state=state,
                         param_rounding=param_rounding)
