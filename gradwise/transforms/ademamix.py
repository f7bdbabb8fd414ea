"""AdEMAMix (Pagliardini, Ablin & Grangier, 2024, "The AdEMAMix Optimizer: Better, Faster, Older",
arXiv:2409.03137): Adam with a second, slow EMA of the gradient added to the fast one."""
from __future__ import annotations

import math

from torch import Tensor

from gradwise.core.hyper import Hyper, non_negative, optional, positive, sequence_of, unit_interval
from gradwise.core.transform import Context, Transform

betas_triple = sequence_of((unit_interval,) * 3, ("beta1", "beta2", "beta3"))


def ademamix_alpha(alpha: float, step: int, warmup: float | None) -> float:
    """alpha_t = min(t alpha / T, alpha) (the paper's linear warmup of alpha; T = None: alpha)."""
    return alpha if warmup is None else min(step * alpha / warmup, alpha)


def ademamix_beta3(beta1: float, beta3: float, step: int, warmup: float | None) -> float:
    """beta3_t = min(exp(ln b1 ln b3 / ((1 - t/T) ln b3 + (t/T) ln b1)), b3): the paper's schedule, which
    grows the slow EMA's half-life linearly from b1's to b3's over T steps (T = None: b3)."""
    if warmup is None:
        return beta3
    if beta1 == 0.0:
        raise ValueError(f"invalid betas[0]={beta1!r} with t_alpha_beta3={warmup!r}: the beta3 schedule starts from"
                         " beta1's half-life, so expected beta1 in (0, 1) (or t_alpha_beta3=None)")
    s, log1, log3 = step / warmup, math.log(beta1), math.log(beta3)
    return min(math.exp(log1 * log3 / ((1 - s) * log3 + s * log1)), beta3)


class scale_by_ademamix(Transform):  # noqa: N801
    """AdEMAMix's update (the paper's Algorithm 1, before weight decay and the learning rate):

    m1 <- b1 m1 + (1-b1) u;  m2 <- b3_t m2 + (1-b3_t) u;  v <- b2 v + (1-b2) u^2;
    u <- (m1 / (1-b1^t) + alpha_t m2) / (sqrt(v / (1-b2^t)) + eps)

    with alpha_t and b3_t warmed up over ``t_alpha_beta3`` steps (``ademamix_alpha``, ``ademamix_beta3``;
    None: constant), per-step scalars computed in double from the step count. The slow EMA m2 has no
    bias correction, as in the paper.
    """

    name = "ademamix"
    state = ("exp_avg", "exp_avg_sq", "exp_avg_slow")
    nonnegative = ("exp_avg_sq",)
    hyper = {
        "betas": Hyper((0.9, 0.999, 0.9999), betas_triple),
        "eps": Hyper(1e-8, positive),
        "alpha": Hyper(5.0, non_negative),
        "t_alpha_beta3": Hyper(None, optional(positive, "no warmup"), static=True),
    }

    def scalars(self, hyper, step: int) -> dict[str, float]:
        b1, b2, b3 = map(float, hyper["betas"])
        warmup = hyper["t_alpha_beta3"]
        warmup = None if warmup is None else float(warmup)
        return {"one_minus_beta1": 1 - b1, "one_minus_beta2": 1 - b2,
                "one_minus_beta3": 1 - ademamix_beta3(b1, b3, step, warmup),
                "alpha_t": ademamix_alpha(float(hyper["alpha"]), step, warmup),
                "inv_bias1": 1 / (1 - b1**step), "inv_bias2_sqrt": 1 / math.sqrt(1 - b2**step)}

    def update(self, updates: list[Tensor], state, ctx: Context) -> list[Tensor]:
        b2 = ctx["betas"][1]
        out = []
        for u, m1, v, m2 in zip(updates, state["exp_avg"], state["exp_avg_sq"], state["exp_avg_slow"]):
            m1.lerp_(u, ctx["one_minus_beta1"])
            v.mul_(b2).add_(u * u * ctx["one_minus_beta2"])
            m2.lerp_(u, ctx["one_minus_beta3"])
            out.append((m1 * ctx["inv_bias1"] + m2 * ctx["alpha_t"]) / (v.sqrt() * ctx["inv_bias2_sqrt"] + ctx["eps"]))
        return out
