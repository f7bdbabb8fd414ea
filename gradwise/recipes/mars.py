"""MARS-AdamW: AdamW on the variance-reduced gradient for matrices, plain AdamW for the rest."""
from __future__ import annotations

from torch import Tensor

from gradwise.core.optimizer import Optimizer
from gradwise.core.transform import chain
from gradwise.transforms import (
    add_decayed_weights,
    scale_by_adam_moments,
    scale_by_bias_correction,
    scale_by_learning_rate,
)
from gradwise.transforms.mars import mars_correction
from gradwise.transforms.route import at_least_2d, route


def every_tensor(name: str | None, param: Tensor) -> str:
    """``optimize_1d=True``: every tensor is corrected."""
    return "matrix"


class MARS(Optimizer):
    """MARS-AdamW (Yuan et al., 2024, arXiv:2411.10438); equals ``pytorch_optimizer.MARS`` (``mars_type="adamw"``).

    Tensors of 2+ dimensions (all with ``optimize_1d``): c = mars_correction(g), m, v Adam's moments of c,
    p <- p - lr (sqrt(1-b2^t) / (1-b1^t) m / (sqrt(v) + eps) + wd p). The others: the same AdamW on g with
    ``lr_1d``, ``betas_1d``, ``weight_decay_1d``. pytorch-optimizer's arguments and defaults; its
    ``mars_type="lion"``/``"shampoo"``, ``ams_bound``, ``cautious``, ``weight_decouple=False`` and
    ``fixed_decay`` are not offered (``cautious`` is ``gradwise.transforms.cautious``, for any chain).
    """

    def __init__(self, params, lr=3e-3, betas=(0.95, 0.99), gamma=0.025, optimize_1d=False, lr_1d=3e-3,
                 betas_1d=(0.9, 0.95), weight_decay=0.0, weight_decay_1d=1e-1, eps=1e-8, *, maximize=False,
                 skip_nonfinite=False, compile="auto", state=None, param_rounding="nearest"):
        def adamw():
            return chain(scale_by_adam_moments(), scale_by_bias_correction(), add_decayed_weights(),
                         scale_by_learning_rate())

        transform = route(
            every_tensor if optimize_1d else at_least_2d,
            matrix=(chain(mars_correction(), adamw()),
                    dict(lr=lr, betas=betas, gamma=gamma, weight_decay=weight_decay, eps=eps)),
            other=(adamw(), dict(lr=lr_1d, betas=betas_1d, weight_decay=weight_decay_1d, eps=eps)),
        )
        super().__init__(params, transform, maximize=maximize, skip_nonfinite=skip_nonfinite, compile=compile,
                         state=state, param_rounding=param_rounding)
