"""AdEMAMix: Adam with a slow EMA of the gradient beside the fast one."""
from __future__ import annotations

from gradwise.core.optimizer import Optimizer
from gradwise.recipes.adam import decayed_chain
from gradwise.transforms.ademamix import scale_by_ademamix


class AdEMAMix(Optimizer):
    """AdEMAMix (Pagliardini et al., 2024, arXiv:2409.03137); equals ``pytorch_optimizer.AdEMAMix`` step by step.

    p <- p - lr ((m1_hat + alpha_t m2) / (sqrt(v_hat) + eps) + wd p), m2 the slow EMA (b3_t), alpha_t and b3_t
    warmed up over ``t_alpha_beta3`` steps. pytorch-optimizer's arguments and defaults, except
    ``weight_decouple=True``: the paper decays decoupled, as AdamW (False: wd p added to g, L2, the
    package's default); its ``fixed_decay`` is not offered.
    """

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999, 0.9999), weight_decay=0.0, weight_decouple=True,
                 alpha=5.0, t_alpha_beta3=None, eps=1e-8, *, maximize=False, skip_nonfinite=False,
                 compile="auto", state=None, param_rounding="nearest"):
        transform = decayed_chain(scale_by_ademamix(), weight_decouple, "weight_decouple")
        super().__init__(params, transform, lr=lr, betas=betas, weight_decay=weight_decay, alpha=alpha,
                         t_alpha_beta3=t_alpha_beta3, eps=eps, maximize=maximize, skip_nonfinite=skip_nonfinite,
                         compile=compile, state=state, param_rounding=param_rounding)
