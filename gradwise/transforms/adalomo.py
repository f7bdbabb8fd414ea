"""AdaLomo's adaptive step (Lv et al. 2023, "AdaLomo: Low-memory Optimization with Adaptive Learning
Rate", arXiv:2310.10195): a second moment factored into row and column statistics, and a step size
relative to the parameter's root-mean-square. (Adafactor's factored second moment, Shazeer & Stern
2018, is the same idea; this transform follows AdaLomo's package, ``lomo-optim`` 0.1.1.)"""
from __future__ import annotations

from typing import Any

from torch import Tensor

from gradwise.core.hyper import Hyper, negative, positive, sequence_of
from gradwise.core.transform import Context
from gradwise.transforms.factored import scale_by_factored_rms

#: (eps1, eps2): eps1 is added to g^2, eps2 is the smallest parameter RMS the step is scaled by.
EPS = Hyper((1e-30, 1e-3), sequence_of((positive, positive), ("eps1", "eps2")))


class scale_by_adalomo(scale_by_factored_rms):  # noqa: N801
    """AdaLomo's factored second moment (no momentum): Adafactor's, with eps1 added to the squares
    and no floor, at step t (1-based):

        beta_t = 1 - t^c  (c = ``decay_rate`` < 0, so beta_1 = 0);  s = g^2 + eps1;
        tensors of 2 or more dimensions, factored over the last two:
            r <- beta_t r + (1 - beta_t) mean_{-1}(s);   k <- beta_t k + (1 - beta_t) mean_{-2}(s);
            u <- g / sqrt((r / mean(r)) outer k)
        other tensors:  v <- beta_t v + (1 - beta_t) s;  u <- g / sqrt(v)

    Memory: rows + columns per matrix instead of a full second moment.
    """

    name = "adalomo"
    state = ("exp_avg_sq_row", "exp_avg_sq_col", "exp_avg_sq")
    nonnegative = state
    hyper = {"eps": EPS, "decay_rate": Hyper(-0.8, negative)}

    def scalars(self, hyper, step: int) -> dict[str, float]:
        return {"one_minus_beta2": float(step) ** float(hyper["decay_rate"])}

    def square(self, u: Tensor, ctx: Context) -> Tensor:
        return u * u + ctx["eps"][0]

    def floor(self, p: Tensor, ctx: Context) -> Any:
        return 0.0
