"""Positive-negative momentum with Adam's denominator, as Ranger21 runs it.

Positive-negative momentum (Xie et al., 2021, "Positive-Negative Momentum", arXiv:2103.17182) keeps two
momenta fed on alternate steps and combines them with beta0 = ``pnm_momentum_factor``:

    m_t <- b1^2 m_t + (1 - b1^2) g   (m_t: the buffer of this step's parity; m_o: the other one)
    v <- b2 v + (1 - b2) g^2;  v_max <- max(v_max, v)
    d = ((1 + beta0) m_t - beta0 m_o) / sqrt((1 + beta0)^2 + beta0^2)
    u <- d / (1 - b1^t) / s(sqrt(v_max) / sqrt(1 - b2^t) + eps)

with s the softplus smoothing s(x) = log(1 + exp(beta_softplus x)) / beta_softplus (Tong et al., 2019,
"Calibrating the adaptive learning rate") when ``softplus`` is on, else the identity.

With ``belief=True`` v tracks AdaBelief's belief in the gradient (Zhuang et al., 2020, "AdaBelief
Optimizer", arXiv:2010.07468) instead of its square: v <- b2 v + (1 - b2) (g - m_t)^2, with m_t the
momentum fed this step, after its update (AdaBelief's m_t; PNM's two momenta each average every
other gradient).

Ranger21's code (both the authors' package and pytorch-optimizer's) feeds v the centralized and
normalized gradient and the momenta that gradient centralized and normalized once more; with
``recentralize`` / ``renormalize`` this transform repeats those steps for the momenta, to match it;
``renormalize`` alone (the input already centralized, as Ranger21's is) is a factor per tensor that
``prepare`` finds on the whole input, so the update stays elementwise. With ``centered`` (the input
already centralized, as Ranger21's with ``using_gc``) the mean that factor's standard deviation
subtracts is 0 up to rounding for every tensor centralization reshapes, so ``prepare`` reads such an
input once (its sum of squares), not twice.
With ``second_moment_statistics`` it reports the sum of v_t / (1 - b2^t) over the step's parameters
(``regularizers.SECOND_MOMENT``, from a 0-d running sum of v), which Ranger21's stable weight decay reads.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

from gradwise.core import lists
from gradwise.core.hyper import Hyper, betas_pair, boolean, non_negative, positive
from gradwise.core.transform import Context, Transform, state_dtype
from gradwise.transforms.gradient_shaping import NORMALIZE_EPS, centralized, normalized
from gradwise.transforms.regularizers import (
    RUNNING_SUM,
    SECOND_MOMENT,
    advance_running_sums,
    running_sum,
    second_moment_parts,
    sum_of_squares,
)
from gradwise.transforms.softplus import softplus


class scale_by_pnm_adam(Transform):  # noqa: N801
    """Positive-negative momentum over a softplus-smoothed AMSGrad denominator (module docstring)."""

    name = "pnm"
    state = ("grad_ma", "neg_grad_ma", "variance_ma", "max_variance_ma")
    hyper = {
        "betas": Hyper((0.9, 0.999), betas_pair),
        "eps": Hyper(1e-8, positive),
        "pnm_momentum_factor": Hyper(1.0, non_negative),
        "softplus": Hyper(True, boolean, static=True),
        "beta_softplus": Hyper(50.0, positive, static=True),
    }

    def __init__(self, recentralize: bool = False, renormalize: bool = False, gc_conv_only: bool = False,
                 belief: bool = False, second_moment_statistics: bool = False, centered: bool = False):
        boolean("centered", centered)
        self.recentralize, self.renormalize, self.gc_conv_only = recentralize, renormalize, gc_conv_only
        self.centered = centered
        self.belief, self.second_moment_statistics = belief, second_moment_statistics
        self.elementwise = not recentralize
        # renormalizing alone is a per-tensor factor of the input, found on the whole input (prepare)
        self.scaled = renormalize and not recentralize
        self.prepares = self.scaled or second_moment_statistics
        self.state = (*self.state, *(("momentum_scale",) if self.scaled else ()),
                      *((RUNNING_SUM,) if second_moment_statistics else ()))
        self.reductions = SECOND_MOMENT if second_moment_statistics else {}

    def init(self, param: Tensor, group) -> dict[str, Tensor]:
        dtype = state_dtype(param)
        buffers = {k: torch.zeros_like(param, dtype=dtype, memory_format=torch.preserve_format)
                   for k in self.state if k not in ("momentum_scale", RUNNING_SUM)}
        if self.scaled:
            buffers["momentum_scale"] = torch.ones((), dtype=dtype, device=param.device)
        if self.second_moment_statistics:
            buffers[RUNNING_SUM] = running_sum().to(param.device)
        return buffers

    def prepare(self, updates: list[Tensor], state, ctx: Context) -> None:
        """momentum_scale <- 1 / (std(u) + 1e-8) (1 for 2 elements or fewer): ``normalized(u)`` as a
        factor; and the running sum of v the reported statistic reads."""
        squares = None
        if self.scaled:
            squares = []
            for u, scale in zip(updates, state["momentum_scale"]):
                # two fast reductions give both the factor and, when asked, sum(u^2): (n - 1) var =
                # sum(u^2) - n mean^2 (var_mean's one pass is several times slower on CPU); one for a
                # centralized input, whose mean is 0 up to rounding (``centered``)
                n, square = u.numel(), sum_of_squares(u)
                squares.append(square)
                if n > 2:
                    if self.centered and u.dim() > (3 if self.gc_conv_only else 1):
                        std = (square / (n - 1)).sqrt()
                    else:
                        mean = u.sum().double() / n
                        std = ((square - n * mean * mean).clamp_min(0) / (n - 1)).sqrt()
                    scale.copy_(1 / (std + NORMALIZE_EPS))
                else:
                    scale.fill_(1.0)
        if self.second_moment_statistics:
            if self.belief or squares is None:
                inputs = [x for _, x in self.variance_inputs(updates, state, ctx)] if self.belief else updates
                squares = [sum_of_squares(x) for x in inputs]
            advance_running_sums(squares, state[RUNNING_SUM], ctx)

    def momentum_input(self, u: Tensor, scale: Tensor | None = None) -> Tensor:
        """The gradient the momenta average: u, centralized and normalized once more if asked (with
        ``prepares``, normalized by the factor ``prepare`` found, ``scale``)."""
        if self.scaled:
            return u * scale
        g = centralized(u, self.gc_conv_only) if self.recentralize else u
        return normalized(g) if self.renormalize else g

    def variance_input(self, u: Tensor, g: Tensor, fed: Tensor | None, rate) -> Tensor:
        """What v averages the square of: u, or (belief) u - m_t with m_t = fed + rate (g - fed), the
        momentum this step feeds (``fed``, before its update; g = ``momentum_input(u)``)."""
        return u - fed.lerp(g, rate) if self.belief else u

    def scalars(self, hyper, step: int) -> dict[str, float]:
        # the buffer fed this step (grad_ma on odd steps, neg_grad_ma on even ones) moves by 1 - b1^2,
        # the other by 0, and they combine as (1 + beta0) this - beta0 other: per-step constants, no select
        b1, b2 = map(float, hyper["betas"])
        beta0 = float(hyper["pnm_momentum_factor"])
        odd = step % 2 == 1
        rate = 1 - b1 * b1
        scale = 1 / math.sqrt((1 + beta0) ** 2 + beta0**2) / (1 - b1**step)
        return {
            "fed_rate": rate,
            "odd": 1.0 if odd else 0.0,
            "pos_rate": rate if odd else 0.0,
            "neg_rate": 0.0 if odd else rate,
            # the combination's coefficients, 1 / noise norm and 1 / (1 - b1^t) folded in
            "pos_coef": (1 + beta0 if odd else -beta0) * scale,
            "neg_coef": (-beta0 if odd else 1 + beta0) * scale,
            # sqrt(v_max) times this, not over sqrt(1 - b2^t): a vector division per element is slow
            "inv_bias2_sqrt": 1 / math.sqrt(1 - b2**step),
            "bias2": 1 - b2**step,  # read by Ranger21's norm loss (transforms/regularizers.py)
            "one_minus_beta2": 1 - b2,  # in double, as the reference
        }

    def variance_inputs(self, updates: list[Tensor], state, ctx: Context) -> list[tuple[Tensor, Tensor]]:
        """(g, x) per update: the momenta's input and what v averages the square of this step."""
        fed = [torch.where(ctx["odd"] > 0, pos, neg) for pos, neg in zip(state["grad_ma"], state["neg_grad_ma"])] \
            if self.belief else [None] * len(updates)
        scales = state["momentum_scale"] if self.scaled else [None] * len(updates)
        out = []
        for u, f, scale in zip(updates, fed, scales):
            g = self.momentum_input(u, scale)
            out.append((g, self.variance_input(u, g, f, ctx["fed_rate"])))
        return out

    def reduce(self, updates: list[Tensor], state, ctx: Context) -> dict[str, Tensor]:
        return second_moment_parts(state[RUNNING_SUM], updates, ctx)

    def update(self, updates: list[Tensor], state, ctx: Context) -> list[Tensor]:
        """The module docstring's step per tensor, as list ops (``core/lists.py``: one foreach call per list
        eagerly); softplus per tensor."""
        if self.scaled and not self.belief:  # Ranger21's: g = u * momentum_scale, x = u
            gs, xs = lists.mul(updates, state["momentum_scale"]), updates
        else:
            gs, xs = map(list, zip(*self.variance_inputs(updates, state, ctx)))
        pos, neg, v, v_max = (state[k] for k in ("grad_ma", "neg_grad_ma", "variance_ma", "max_variance_ma"))
        lists.mul_(v, ctx["betas"][1])
        lists.addcmul_(v, xs, lists.mul(xs, ctx["one_minus_beta2"]))
        lists.maximum_(v_max, v)
        denominators = lists.sqrt(v_max)
        lists.mul_(denominators, ctx["inv_bias2_sqrt"])
        lists.add_(denominators, ctx["eps"])
        if ctx["softplus"]:
            denominators = [softplus(d, ctx["beta_softplus"]) for d in denominators]
        lists.lerp_small_(pos, gs, ctx["pos_rate"])
        lists.lerp_small_(neg, gs, ctx["neg_rate"])
        out = lists.mul(pos, ctx["pos_coef"])
        lists.add_(out, lists.mul(neg, ctx["neg_coef"]))
        lists.div_(out, denominators)
        return out

    def __repr__(self) -> str:
        return (f"scale_by_pnm_adam(recentralize={self.recentralize}, renormalize={self.renormalize},"
                f" belief={self.belief}, second_moment_statistics={self.second_moment_statistics},"
                f" centered={self.centered})")

