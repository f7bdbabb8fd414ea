"""Shampoo with grafting, as Distributed Shampoo runs it."""
from __future__ import annotations

import torch

from gradwise.core.hyper import boolean
from gradwise.core.optimizer import Optimizer
from gradwise.core.transform import chain
from gradwise.transforms import add_decayed_weights, scale_by_learning_rate
from gradwise.transforms.shampoo import scale_by_shampoo


class Shampoo(Optimizer):
    """Shampoo (Gupta et al., 2018; Anil et al., 2020) with the step size grafted per block from Adam,
    AdaGrad, RMSprop or SGD, as Distributed Shampoo (Shi et al., 2023, arXiv:2309.06497), with the
    defaults of its README's example: Adam grafting (beta2 0.999, epsilon 1e-8), betas (0.9, 0.999),
    epsilon 1e-12, decoupled weight decay 1e-5, blocks of at most 8192, inverse roots every 100
    steps from step ``start_preconditioning_step`` (None: ``precondition_frequency``) on.

    p <- p - lr (shampoo(g) + wd p)   (``use_decoupled_weight_decay=False``: g <- g + wd p first).
    See ``scale_by_shampoo`` for the update. Parameters of fewer than two dimensions take the grafting
    method's step; ``start_preconditioning_step=math.inf`` gives the grafting method alone (Adam
    grafting is then AdamW, AdaGrad grafting with betas[0]=0 torch.optim.Adagrad, and so on).
    ``eigh_failures`` counts the factors whose eigendecomposition failed and kept their old root;
    ``skipped_factor_updates`` the factor updates skipped because they would have made a factor NaN
    or inf (a gradient entry of 1e30 squares past float32), each with a warning.
    """

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), epsilon=1e-12, weight_decay=1e-5,
                 max_preconditioner_dim=8192, precondition_frequency=100, start_preconditioning_step=None,
                 use_decoupled_weight_decay=True, grafting="adam", grafting_beta2=0.999, grafting_epsilon=1e-8,
                 use_bias_correction=True, preconditioner_dtype=torch.float32, batch_blocks=True, *,
                 maximize=False, skip_nonfinite=False, compile="auto", state=None,
                 param_rounding="nearest"):
        boolean("use_decoupled_weight_decay", use_decoupled_weight_decay)
        self._shampoo = scale_by_shampoo()
        links = ([self._shampoo, add_decayed_weights()] if use_decoupled_weight_decay
                 else [add_decayed_weights(), self._shampoo])
        super().__init__(
            params, chain(*links, scale_by_learning_rate()), lr=lr, betas=betas, epsilon=epsilon,
            weight_decay=weight_decay, max_preconditioner_dim=max_preconditioner_dim,
            precondition_frequency=precondition_frequency, start_preconditioning_step=start_preconditioning_step,
            grafting=grafting, grafting_beta2=grafting_beta2, grafting_epsilon=grafting_epsilon,
            use_bias_correction=use_bias_correction, preconditioner_dtype=preconditioner_dtype,
            batch_blocks=batch_blocks, maximize=maximize, skip_nonfinite=skip_nonfinite, compile=compile,
            state=state, param_rounding=param_rounding)

    @property
    def eigh_failures(self) -> int:
        return self._shampoo.eigh_failures

    @property
    def skipped_factor_updates(self) -> int:
        """Factor updates skipped because they would have made a factor NaN or inf."""
        return self._shampoo.skipped_factor_updates
