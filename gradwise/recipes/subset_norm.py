"""SubsetNorm: AdaGrad-Subset-Norm step sizes with momentum, optionally Subspace-Momentum (Nguyen et al.
2024, arXiv:2411.07120; LITERATURE.md ¶80)."""
from __future__ import annotations

from gradwise.core.optimizer import Optimizer
from gradwise.core.transform import chain
from gradwise.transforms.learning_rate import scale_by_learning_rate
from gradwise.transforms.low_rank_rest import project_low_rank_with_rest
from gradwise.transforms.momentum import trace_ema
from gradwise.transforms.subset_norm import scale_by_subset_norm
from gradwise.transforms.weight_decay import add_decayed_weights


class SubsetNorm(Optimizer):
    """Subset-Norm with (Subspace-)Momentum. For a tensor of 2+ dimensions the subsets are the indices of
    its shorter side (rows or columns of its m x n view: min(m, n) accumulators); vectors keep one per entry:

        v_S <- v_S + ||g_S||^2                       (AdaGrad's sum, one per subset)
        d   <- m,  m <- beta m + (1-beta) g           (groups with rank=None: momentum on every entry)
        d   <- scale P^T m_R + (g - P^T P g),  m_R <- beta m_R + (1-beta) P g
                                                     (matrices of a group with ``rank``: Subspace-Momentum,
                                                      P from the gradient's SVD every update_proj_gap steps)
        p   <- p - lr (d / (sqrt(v_S) + eps) + weight_decay p)

    (P g written for the projection of ``project_low_rank``, right or left by ``proj_type``.) The step size
    multiplies the whole direction, momentum and the SGD rest alike. State per m x n matrix: min(m, n)
    accumulators plus a momentum of the projected shape and the r-row (or r-column) basis; without rank,
    a full momentum. ``momentum=0`` is AdaGrad-Subset-Norm. The state is not shaped like the parameter, so
    it is kept as computed (``state=None`` only).
    """

    state_refusal = ("its accumulators hold one number per row or column and its momentum has the projection's"
                     " shape, and a codec stores only buffers shaped like their parameter")

    def __init__(self, params, lr=1e-2, momentum=0.9, eps=1e-8, weight_decay=0.0, rank=None, update_proj_gap=200,
                 scale=1.0, proj_type="std", *, maximize=False, skip_nonfinite=False, compile="auto", state=None,
                 param_rounding="nearest"):
        direction = project_low_rank_with_rest(trace_ema(), rest="sgd")
        transform = chain(scale_by_subset_norm(direction), add_decayed_weights(), scale_by_learning_rate())
        super().__init__(params, transform, lr=lr, momentum=momentum, nesterov=False, eps=eps,
                         weight_decay=weight_decay, rank=rank, update_proj_gap=update_proj_gap, scale=scale,
                         proj_type=proj_type, maximize=maximize, skip_nonfinite=skip_nonfinite, compile=compile,
                         state=state, param_rounding=param_rounding)
