"""PSGD Kron: SGD with a Kronecker-factored preconditioner fitted on a Lie group."""
from __future__ import annotations

import torch

from gradwise.core.hyper import boolean
from gradwise.core.optimizer import Optimizer
from gradwise.core.transform import chain
from gradwise.transforms import add_decayed_weights, scale_by_learning_rate
from gradwise.transforms.psgd_kron import scale_by_psgd_kron
from gradwise.transforms.route import at_least_2d, route


class PSGDKron(Optimizer):
    """PSGD Kron (Li, 2018, arXiv:1512.04202, arXiv:1809.10232) with pytorch-optimizer 4.1.0's ``Kron``
    arguments and defaults: p <- p - lr (kron(g) + wd p) (tensors of 2+ dimensions only decay; with
    ``weight_decouple=False``, g <- g + wd p first). See ``scale_by_psgd_kron`` for the update.

    Differences from pytorch-optimizer's: a tensor of 3+ dimensions is seen as the matrix (d0, d1 * ...), two
    factors (``memory_save_mode`` reads those sides); the random vectors and balancing draws come from seeds
    of the step (not the global generators), so runs and resumes repeat; the update probability of each
    group is its own; the triangular solves run in ``precondition_dtype`` (not always float32); ``mu_dtype``
    is ``state="bf16"`` here. ``precondition_lr`` and ``precondition_init_scale`` are arguments.
    """

    def __init__(self, params, lr=1e-3, momentum=0.9, weight_decay=0.0, weight_decouple=True,
                 pre_conditioner_update_probability=None, max_size_triangular=8192, min_ndim_triangular=2,
                 memory_save_mode=None, momentum_into_precondition_update=True, precondition_dtype=torch.float32,
                 balance_prob=0.01, *, precondition_lr=0.1, precondition_init_scale=1.0, maximize=False,
                 skip_nonfinite=False, compile="auto", state=None, param_rounding="nearest"):
        boolean("weight_decouple", weight_decouple)
        kron = scale_by_psgd_kron()
        matrices = [kron, add_decayed_weights()] if weight_decouple else [add_decayed_weights(), kron]
        transform = route(at_least_2d, matrix=chain(*matrices, scale_by_learning_rate()),
                          other=chain(kron, scale_by_learning_rate()))
        super().__init__(
            params, transform, lr=lr, momentum=momentum, weight_decay=weight_decay,
            pre_conditioner_update_probability=pre_conditioner_update_probability,
            max_size_triangular=max_size_triangular, min_ndim_triangular=min_ndim_triangular,
            memory_save_mode=memory_save_mode, momentum_into_precondition_update=momentum_into_precondition_update,
            precondition_dtype=precondition_dtype, balance_prob=balance_prob, precondition_lr=precondition_lr,
            precondition_init_scale=precondition_init_scale, maximize=maximize, skip_nonfinite=skip_nonfinite,
            compile=compile, state=state, param_rounding=param_rounding)
