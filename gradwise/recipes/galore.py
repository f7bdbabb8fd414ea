"""GaLore: AdamW whose moments live in a low-rank projection of each matrix's gradient."""
from __future__ import annotations

from gradwise.core.optimizer import Optimizer
from gradwise.core.transform import chain
from gradwise.transforms.adam import scale_by_adam_moments, scale_by_bias_correction
from gradwise.transforms.learning_rate import scale_by_learning_rate
from gradwise.transforms.low_rank import project_low_rank
from gradwise.transforms.weight_decay import decay_stepped_weights


class GaLoreAdamW(Optimizer):
    """GaLore (Zhao et al., 2024, arXiv:2403.03507) as galore-torch's ``GaLoreAdamW``, with its names
    and defaults: for each matrix of a group whose ``rank`` is set (in the group, or here for every
    group), with R = project(g) (``project_low_rank``: an SVD basis refreshed every ``update_proj_gap``
    steps, ``proj_type`` std, reverse_std, left, right or full):

    m <- b1 m + (1-b1) R;  v <- b2 v + (1-b2) R^2;
    p <- p - lr sqrt(1-b2^t)/(1-b1^t) scale project_back(m / (sqrt(v) + eps));
    then p <- p (1 - lr wd) (transformers' AdamW; ``correct_bias=False`` drops the bias corrections).
    Other parameters (vectors, and every parameter of a group with ``rank=None``, the default) get
    that AdamW unprojected. Typical use, as in galore-torch::

        GaLoreAdamW([{"params": others}, {"params": matrices, "rank": 128, "update_proj_gap": 200,
                      "scale": 0.25, "proj_type": "std"}], lr=1e-3)

    State per projected m x n matrix (std, m >= n): two m x r moments and the r x n basis.
    Differences from galore-torch: the SVD of a float64 gradient is taken in float64 (galore-torch
    takes it in float32); a rank above min(m, n) raises instead of shrinking silently; reverse_std
    with rank = min(m, n) < max(m, n) projects back correctly (galore-torch's shape test mixes sides there).
    It keeps no encoded state (``state=None`` only; ``state_refusal`` says why).
    """

    state_refusal = ("a projected matrix's moments have the projection's shape, not the parameter's, and a codec"
                     " stores only buffers shaped like their parameter: the state it exists to shrink would stay"
                     " float32")

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.0, correct_bias=True,
                 rank=None, update_proj_gap=200, scale=1.0, proj_type="std", *,
                 maximize=False, skip_nonfinite=False, compile="auto", state=None,
                 param_rounding="nearest"):
        transform = chain(project_low_rank(scale_by_adam_moments()), scale_by_bias_correction(),
                          scale_by_learning_rate(), decay_stepped_weights())
        super().__init__(params, transform, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                         correct_bias=correct_bias, rank=rank, update_proj_gap=update_proj_gap, scale=scale,
                         proj_type=proj_type, maximize=maximize, skip_nonfinite=skip_nonfinite, compile=compile,
                         state=state, param_rounding=param_rounding)
