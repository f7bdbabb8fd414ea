"""AdamC: AdamW whose weight decay on normalized layers follows the learning rate's schedule."""
from __future__ import annotations

from gradwise.core.hyper import boolean, choice
from gradwise.core.optimizer import Optimizer
from gradwise.core.transform import chain
from gradwise.recipes.adam import decayed_chain
from gradwise.transforms import scale_by_adam_moments, scale_by_bias_correction, scale_by_learning_rate
from gradwise.transforms.weight_decay import add_corrected_decayed_weights


class AdamC(Optimizer):
    """AdamC (Defazio et al., 2025, arXiv:2506.02285); equals ``pytorch_optimizer.AdamC`` step by step.

    u = sqrt(1-b2^t) / (1-b1^t) m / (sqrt(v) + eps), m and v Adam's moments;
    p <- p - lr_t (u + wd lr_t / max_lr p) in the groups that set ``normalized=True`` (the layers
    followed by a normalization: their weights' scale does not matter), p <- p - lr_t (u + wd p) in the
    others (``gradwise.transforms.weight_decay.add_corrected_decayed_weights``); ``max_lr`` is ``lr``
    (the schedule's peak; a group may set its own). pytorch-optimizer's arguments and defaults:
    ``weight_decouple=False`` adds wd p to g (L2, uncorrected, as there); its ``fixed_decay`` and
    ``ams_bound`` are not offered (False only). It adds 1e-15 to v under the square root; this does not.
    """

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), weight_decay=0.0, weight_decouple=True,
                 fixed_decay=False, ams_bound=False, eps=1e-8, *, maximize=False, skip_nonfinite=False,
                 compile="auto", state=None, param_rounding="nearest"):
        for name, value in (("fixed_decay", fixed_decay), ("ams_bound", ams_bound)):
            choice((False,), note="True is not offered")(name, value)
        core = chain(scale_by_adam_moments(), scale_by_bias_correction())
        if boolean("weight_decouple", weight_decouple):
            transform = chain(core, add_corrected_decayed_weights(), scale_by_learning_rate())
        else:
            transform = decayed_chain(core, False, "weight_decouple")
        defaults = dict(max_lr=lr) if weight_decouple else {}
        super().__init__(params, transform, lr=lr, betas=betas, weight_decay=weight_decay, eps=eps, **defaults,
                         maximize=maximize, skip_nonfinite=skip_nonfinite, compile=compile, state=state,
                         param_rounding=param_rounding)
