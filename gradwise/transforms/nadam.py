"""NAdam (Dozat, 2016, "Incorporating Nesterov Momentum into Adam"), as torch.optim.NAdam, and its chain's last
links as one (``_fused_nadam``)."""
from __future__ import annotations

import torch
from torch import Tensor

from gradwise.core import lists
from gradwise.core.hyper import Hyper, betas_pair, non_negative, positive
from gradwise.core.transform import Context, Transform, state_dtype
from gradwise.transforms.fused_tail import FusedTail


class scale_by_nadam(Transform):  # noqa: N801
    """NAdam, as torch.optim.NAdam.

    mu_t = b1 (1 - 0.5 * 0.96^(t psi)),  P_t = prod_{s<=t} mu_s,  m and v as in Adam;
    u <- [(1-mu_t)/(1-P_t) u + mu_{t+1}/(1-P_t mu_{t+1}) m] / (sqrt(v / (1-b2^t)) + eps)
    with psi = ``momentum_decay``.
    """

    name = "nadam"
    state = ("exp_avg", "exp_avg_sq", "mu_product")
    nonnegative = ("exp_avg_sq",)
    hyper = {
        "betas": Hyper((0.9, 0.999), betas_pair),
        "eps": Hyper(1e-8, positive),
        "momentum_decay": Hyper(4e-3, non_negative),
    }

    def init(self, param: Tensor, group) -> dict[str, Tensor]:
        buffers = {k: torch.zeros_like(param, dtype=state_dtype(param)) for k in ("exp_avg", "exp_avg_sq")}
        buffers["mu_product"] = torch.ones((), dtype=state_dtype(param), device=param.device)
        return buffers

    def scalars(self, hyper, step: int) -> dict[str, float]:
        b1, b2 = map(float, hyper["betas"])
        psi = float(hyper["momentum_decay"])
        mu, mu_next = b1 * (1 - 0.5 * 0.96 ** (step * psi)), b1 * (1 - 0.5 * 0.96 ** ((step + 1) * psi))
        out = {
            "mu": mu,
            "mu_next": mu_next,
            "bias_correction2": 1 - b2**step,
            "inv_bias_correction2": 1 / (1 - b2**step),
            "one_minus_beta1": 1 - b1,  # in double, as torch computes them
            "one_minus_beta2": 1 - b2,
        }
        if "lr" in hyper:  # for NAdam's tail (``_fused_nadam``), in double as torch.optim computes them
            lr = float(hyper["lr"])
            out.update(lr_one_minus_mu=-lr * (1 - mu), lr_mu_next=-lr * mu_next,
                       decay=1 - lr * float(hyper.get("weight_decay", 0.0)))
        return out

    def advance(self, state, hyper, scalars) -> None:
        state["mu_product"].mul_(scalars["mu"])

    def advance_many(self, states, hyper, scalars) -> None:
        """``advance`` on a bucket's states in one foreach call: each running product times mu, as its own ``mul_``."""
        if states:
            torch._foreach_mul_([state["mu_product"] for state in states], scalars["mu"])

    def update(self, updates: list[Tensor], state, ctx: Context) -> list[Tensor]:
        """torch.optim.NAdam's ops per tensor, as list ops (``core/lists.py``); each parameter's two coefficients
        computed stacked, one op each, with the bits of its own 0-d ops (compiled: once per call, ``Context.once``)."""
        mu, mu_next = ctx["mu"], ctx["mu_next"]
        m, denominators = self.moments(updates, state, ctx)
        mu_product = torch.stack(state["mu_product"])
        out = lists.mul(updates, list(ctx.once((1 - mu) / (1 - mu_product)).unbind()))
        lists.add_(out, lists.mul(m, list(ctx.once(mu_next / (1 - mu_product * mu_next)).unbind())))
        lists.div_(out, denominators)
        return out

    def moments(self, updates: list[Tensor], state, ctx: Context) -> tuple[list[Tensor], list[Tensor]]:
        """m and v stepped, and the denominators sqrt(v / (1-b2^t)) + eps: torch.optim.NAdam's ops in its order,
        one list op at a time. Compiled, within a rounding: m + (1-b1)(u - m) and v times 1/(1-b2^t) (a vector
        division per element costs a compiled CPU step a sixth of its time), as ``scale_by_adam``."""
        m, v = state["exp_avg"], state["exp_avg_sq"]
        lists.lerp_small_(m, updates, ctx["one_minus_beta1"])
        lists.mul_(v, ctx["betas"][1])
        lists.addcmul_(v, updates, updates, ctx["one_minus_beta2"])
        if torch.compiler.is_compiling():
            return m, [(x * ctx["inv_bias_correction2"]).sqrt() + ctx["eps"] for x in v]
        denominators = lists.div(v, ctx["bias_correction2"])
        lists.sqrt_(denominators)
        lists.add_(denominators, ctx["eps"])
        return m, denominators

    def fuse(self, other: Transform) -> Transform | None:
        """Followed by decoupled weight decay or the step size (NAdamW's and NAdam's chains): one link
        (``_fused_nadam``)."""
        return _fused_nadam.following(self, other)


class _fused_nadam(FusedTail):  # noqa: N801
    """``scale_by_nadam`` and the links after it of NAdamW's chain (``add_decayed_weights()``, then
    ``scale_by_learning_rate``) or NAdam's (the step size) as one link (``FusedTail``). Once it ends with the step
    size, as the chain's last link it writes the parameters in torch.optim.NAdam's op order (``apply``), in 9 list
    ops to the chain's 16:

    p <- p (1 - lr wd) (NAdamW);  m, v and d = sqrt(v / (1-b2^t)) + eps as in NAdam;
    p <- p + c1 u / d + c2 m / d,  c1 = -lr (1-mu_t) / (1-P_t),  c2 = -lr mu_{t+1} / (1-P_t mu_{t+1})

    (two ``addcdiv_`` eagerly; compiled, (c1 u + c2 m) / d, one division per element).
    """

    def apply(self, updates: list[Tensor], state, ctx: Context) -> None:
        if self.lr is None:
            super().apply(updates, state, ctx)
            return
        if self.decay is not None and ctx.active("weight_decay"):
            lists.mul_(ctx.params, ctx["decay"])
        m, denominators = self.core.moments(updates, state, ctx)
        mu_product = torch.stack(state["mu_product"]).double()  # each parameter's coefficients, in double
        c1 = ctx["lr_one_minus_mu"].double() / (1 - mu_product)
        c2 = ctx["lr_mu_next"].double() / (1 - mu_product * ctx["mu_next"].double())
        if torch.compiler.is_compiling():
            dtype = updates[0].dtype
            for p, u, a, d, x, y in zip(ctx.params, updates, m, denominators, ctx.once(c1.to(dtype)).unbind(),
                                        ctx.once(c2.to(dtype)).unbind()):
                p.add_((u * x + a * y) / d)
            return
        lists.addcdiv_each_(ctx.params, updates, denominators, c1)
        lists.addcdiv_each_(ctx.params, m, denominators, c2)
