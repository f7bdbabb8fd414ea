"""APOLLO and APOLLO-Mini: SGD-sized state, AdamW-like steps, from Adam moments of a random projection."""
from __future__ import annotations

from gradwise.core.optimizer import Optimizer
from gradwise.core.transform import chain
from gradwise.recipes.galore import GaLoreAdamW
from gradwise.transforms.adam import scale_by_adam_moments, scale_by_bias_correction
from gradwise.transforms.apollo import scale_by_apollo
from gradwise.transforms.learning_rate import scale_by_learning_rate
from gradwise.transforms.weight_decay import decay_stepped_weights


def _chain():
    return chain(scale_by_apollo(scale_by_adam_moments()), scale_by_bias_correction(), scale_by_learning_rate(),
                 decay_stepped_weights())


class APOLLO(Optimizer):
    """APOLLO (Zhu et al., 2024, arXiv:2412.05270) as apollo-torch's ``APOLLOAdamW`` with random
    projections (``proj="svd"``: GaLore's SVD basis), with its names and defaults: for each matrix G
    of a group whose ``rank`` r is set (in the group, or here for every group), R = G P^T (or P^T G)
    with a random P redrawn every ``update_proj_gap`` steps, Adam moments of R give
    N = m / (sqrt(v) + eps), and

    p <- p - lr sqrt(1-b2^t)/(1-b1^t) sqrt(scale) limit(G * ||N_c|| / ||R_c||);  p <- p (1 - lr wd)

    with one factor per channel c (``scale_type="tensor"``: one per matrix) and Fira's norm-growth
    limiter (``disable_nl=True`` turns it off); see ``scale_by_apollo``. Other parameters (and every
    parameter of a group with ``rank=None``, the default) get transformers' AdamW. The paper's setting::

        APOLLO([{"params": others}, {"params": matrices, "rank": 256, "update_proj_gap": 200,
                 "scale": 1, "proj_type": "std", "scale_type": "channel"}], lr=1e-2)

    State per projected m x n matrix (m >= n): two m x r moments, a 0-d seed and a 0-d norm; the
    projection is redrawn from the seed, never stored (``proj="svd"`` stores its basis, as GaLore).
    It keeps no encoded state (``state=None`` only; ``state_refusal`` says why).
    """

    state_refusal = GaLoreAdamW.state_refusal  # the same low-rank moments

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.0, correct_bias=True,
                 rank=None, update_proj_gap=200, scale=1.0, proj_type="std", scale_type="channel", proj="random",
                 scale_front=False, disable_nl=False, *, maximize=False, skip_nonfinite=False, compile="auto",
                 state=None, param_rounding="nearest"):
        super().__init__(params, _chain(), lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                         correct_bias=correct_bias, rank=rank, update_proj_gap=update_proj_gap, scale=scale,
                         proj_type=proj_type, scale_type=scale_type, proj=proj, scale_front=scale_front,
                         disable_nl=disable_nl, maximize=maximize, skip_nonfinite=skip_nonfinite, compile=compile,
                         state=state, param_rounding=param_rounding)


class APOLLOMini(APOLLO):
    """APOLLO-Mini (Zhu et al., 2024): APOLLO with a rank-1 projection and one scale factor per matrix
    (``scale_type="tensor"``), its step scaled by sqrt(``scale``) = sqrt(128) as in the paper. Every
    matrix is projected by default (``rank=1``); give embeddings and heads a group with ``rank=None``
    to keep them on plain AdamW. State per matrix (std): two vectors as long as its longer side, a
    0-d seed and a 0-d norm.
    """

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.0, correct_bias=True,
                 rank=1, update_proj_gap=200, scale=128.0, proj_type="std", scale_type="tensor", proj="random",
                 scale_front=False, disable_nl=False, *, maximize=False, skip_nonfinite=False, compile="auto",
                 state=None, param_rounding="nearest"):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, correct_bias=correct_bias,
                         rank=rank, update_proj_gap=update_proj_gap, scale=scale, proj_type=proj_type,
                         scale_type=scale_type, proj=proj, scale_front=scale_front, disable_nl=disable_nl,
                         maximize=maximize, skip_nonfinite=skip_nonfinite, compile=compile, state=state,
                         param_rounding=param_rounding)
