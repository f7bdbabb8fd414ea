"""Adam preconditioning: running moments of the update and their bias-corrected ratio (NAdam: ``nadam.py``)."""
from __future__ import annotations

import math

import torch
from torch import Tensor

from gradwise.core import lists
from gradwise.core.hyper import Hyper, betas_pair, boolean, positive
from gradwise.core.transform import Context, Transform, state_dtype
from gradwise.transforms.fused_tail import FusedTail
from gradwise.transforms.learning_rate import scale_by_learning_rate
from gradwise.transforms.weight_decay import add_decayed_weights


class scale_by_adam(Transform):  # noqa: N801 - transforms are named like functions (optax grammar)
    """Adam (Kingma & Ba, 2015, arXiv:1412.6980); with ``amsgrad``, AMSGrad (Reddi et al., 2018,
    "On the Convergence of Adam and Beyond"), as torch.optim.Adam keeps it.

    m <- b1 m + (1-b1) u;  v <- b2 v + (1-b2) u^2;
    u <- (m / (1-b1^t)) / (sqrt(v) / sqrt(1-b2^t) + eps)
    amsgrad:  v_max <- max(v_max, v), and v_max takes v's place in u.

    The moments and the denominator sqrt(v) / sqrt(1-b2^t) + eps are computed with torch.optim.Adam's
    ops in its order (lerp_, mul_, addcmul_, sqrt, div_, add_), so exp_avg and exp_avg_sq hold
    torch's bits for the same updates, eagerly. Compiled, two ops are chosen for a CPU's vector units
    instead, within a rounding of torch's: m + (1-b1)(u - m) (``lists.lerp_small_``) and sqrt(v) times
    1/sqrt(1-b2^t) (a vector division per element costs a sixth of the step); 1 - b1, 1 - b2 and
    sqrt(1-b2^t) are computed in double precision,
    as torch does (in float32, 1 - 0.999 is 1.3e-5 off). ``amsgrad`` is a param-group entry, as in
    torch; ``max_exp_avg_sq`` is kept for the groups that set it (their ``for_group`` is this transform,
    the others' a copy without that buffer).
    """

    name = "adam"
    state = ("exp_avg", "exp_avg_sq", "max_exp_avg_sq")
    nonnegative = ("exp_avg_sq", "max_exp_avg_sq")
    hyper = {"betas": Hyper((0.9, 0.999), betas_pair), "eps": Hyper(1e-8, positive),
             "amsgrad": Hyper(False, boolean, static=True)}

    def init(self, param: Tensor, group) -> dict[str, Tensor]:
        keys = self.state if group.get("amsgrad", False) else ("exp_avg", "exp_avg_sq")
        return {k: torch.zeros_like(param, dtype=state_dtype(param), memory_format=torch.preserve_format)
                for k in keys}

    def for_group(self, group) -> Transform:
        if group.get("amsgrad", False):
            return self
        if "_without_max" not in self.__dict__:
            self._without_max = _adam_without_max()
        return self._without_max

    def scalars(self, hyper, step: int) -> dict[str, float]:
        b1, b2 = map(float, hyper["betas"])
        out = {"one_minus_beta1": 1 - b1, "one_minus_beta2": 1 - b2,
               "inv_bias1": 1 / (1 - b1**step), "bias2_sqrt": math.sqrt(1 - b2**step),
               "inv_bias2_sqrt": 1 / math.sqrt(1 - b2**step)}
        if "lr" in hyper:  # for Adam's tail (``_fused_adam``), in double as torch.optim computes them
            lr = float(hyper["lr"])
            out.update(step_size=-lr / (1 - b1**step), decay=1 - lr * float(hyper.get("weight_decay", 0.0)),
                       step=float(step))
        return out

    def update(self, updates: list[Tensor], state, ctx: Context) -> list[Tensor]:
        m, denominators = self.moments(updates, state, ctx)
        out = lists.div(m, denominators)
        lists.mul_(out, ctx["inv_bias1"])
        return out

    def moments(self, updates: list[Tensor], state, ctx: Context) -> tuple[list[Tensor], list[Tensor]]:
        """m and v stepped, and the denominators sqrt(v) / sqrt(1-b2^t) + eps: torch.optim.Adam's ops in its
        order, one list op at a time (``core/lists.py``: foreach kernels eagerly)."""
        m, v = state["exp_avg"], state["exp_avg_sq"]
        lists.lerp_small_(m, updates, ctx["one_minus_beta1"])
        lists.mul_(v, ctx["betas"][1])
        lists.addcmul_(v, updates, updates, ctx["one_minus_beta2"])
        if "max_exp_avg_sq" in state:
            lists.maximum_(state["max_exp_avg_sq"], v)
            v = state["max_exp_avg_sq"]
        if torch.compiler.is_compiling():  # the reciprocal of sqrt(1-b2^t), in double, spares a division per element
            return m, [x.sqrt() * ctx["inv_bias2_sqrt"] + ctx["eps"] for x in v]
        denominators = lists.sqrt(v)
        lists.div_(denominators, ctx["bias2_sqrt"])
        lists.add_(denominators, ctx["eps"])
        return m, denominators

    def fuse(self, other: Transform) -> Transform | None:
        """Followed by decoupled weight decay or the step size (Adam's and AdamW's chains): one link
        (``_fused_adam``)."""
        return _fused_adam.following(self, other)


class _adam_without_max(scale_by_adam):  # noqa: N801
    """``scale_by_adam`` for param groups without ``amsgrad``: no ``max_exp_avg_sq``."""

    state = ("exp_avg", "exp_avg_sq")

    def for_group(self, group) -> Transform:
        return self

    def __repr__(self) -> str:
        return "scale_by_adam()"


class _fused_adam(FusedTail):  # noqa: N801
    """``scale_by_adam`` and the links after it of Adam's chain or AdamW's (``add_decayed_weights()``,
    then ``scale_by_learning_rate``) as one link (``FusedTail``). Once it ends with the step size, as the chain's
    last link it writes the parameters in torch.optim.Adam's op order, with its bits, in 8 list ops to the 12 of
    AdamW's chain (``apply``):

    p <- p (1 - lr wd) (AdamW);  m, v and d = sqrt(v) / sqrt(1-b2^t) + eps as in Adam;
    p <- p - lr/(1-b1^t) m / d  (``addcdiv_``)
    """

    def __init__(self, adam: scale_by_adam, decay: add_decayed_weights | None, lr: scale_by_learning_rate | None):
        super().__init__(adam, decay, lr)
        self.torch_kernel = lr is not None  # (``apply`` writes the parameters)

    def apply(self, updates: list[Tensor], state, ctx: Context) -> None:
        if self.lr is None:
            super().apply(updates, state, ctx)
            return
        if ctx.torch_kernels and lists.fused_kernel_takes(ctx.params, updates, state):
            self._torch_kernel(updates, state, ctx)
            return
        if self.decay is not None and ctx.active("weight_decay"):
            lists.mul_(ctx.params, ctx["decay"])
        m, denominators = self.core.moments(updates, state, ctx)
        lists.addcdiv_(ctx.params, m, denominators, ctx["step_size"])

    def _torch_kernel(self, updates: list[Tensor], state, ctx: Context) -> None:
        """The same step in torch's fused Adam kernel (``torch._fused_adamw_``, torch.optim.AdamW's
        ``fused=True``): one pass over each parameter instead of 8 list ops, whose Python and passes are most
        of a small model's step. Its rounding is the kernel's (within a float32 rounding of the list ops), its
        step count ``ctx["step"]``, its numbers the step's packed constants (float64 for a bucket whose step ends
        in a kernel: the doubles torch passes). ``updates`` are the gradients as the chain sees them (negated
        under ``maximize``), so the kernel's own ``maximize`` stays off."""
        b1, b2 = ctx["betas"]
        decay = ctx["weight_decay"].item() if self.decay is not None and ctx.active("weight_decay") else 0.0
        amsgrad = "max_exp_avg_sq" in state
        torch._fused_adamw_(ctx.params, updates, state["exp_avg"], state["exp_avg_sq"],
                            state["max_exp_avg_sq"] if amsgrad else [], [ctx["step"]] * len(updates),
                            lr=ctx["lr"].item(), beta1=b1.item(), beta2=b2.item(), weight_decay=decay,
                            eps=ctx["eps"].item(), amsgrad=amsgrad, maximize=False)


class scale_by_adam_moments(Transform):  # noqa: N801
    """Adam's ratio without bias correction, eps added to sqrt(v) (the Adam of Hugging Face
    transformers' AdamW, which galore-torch and apollo-torch build on):

    m <- b1 m + (1-b1) u;  v <- b2 v + (1-b2) u^2;  u <- m / (sqrt(v) + eps)

    Follow it with ``scale_by_bias_correction`` for that AdamW. Kept apart so that a transform between
    the two (APOLLO's norm-growth limiter) sees the uncorrected ratio, as the reference does.
    """

    name = "adam"
    state = ("exp_avg", "exp_avg_sq")
    nonnegative = ("exp_avg_sq",)
    hyper = {"betas": Hyper((0.9, 0.999), betas_pair), "eps": Hyper(1e-6, positive)}

    def scalars(self, hyper, step: int) -> dict[str, float]:
        # 1 - b in double, as the reference does: in float32, 1 - 0.999 is off by 1.3e-5 relative
        b1, b2 = hyper["betas"]
        return {"one_minus_beta1": 1 - b1, "one_minus_beta2": 1 - b2}

    def update(self, updates: list[Tensor], state, ctx: Context) -> list[Tensor]:
        b1, b2 = ctx["betas"]
        out = []
        for u, m, v in zip(updates, state["exp_avg"], state["exp_avg_sq"]):
            m.mul_(b1).add_(u * ctx["one_minus_beta1"])
            v.mul_(b2).add_(u * u * ctx["one_minus_beta2"])
            out.append(m / (v.sqrt() + ctx["eps"]))
        return out


class scale_by_bias_correction(Transform):  # noqa: N801
    """u <- sqrt(1 - b2^t) / (1 - b1^t) u at step t, or u unchanged when ``correct_bias`` is False
    (Adam's bias corrections applied to the step size, as transformers' AdamW does)."""

    name = "bias_correction"
    hyper = {"betas": Hyper((0.9, 0.999), betas_pair), "correct_bias": Hyper(True, boolean, static=True)}

    def scalars(self, hyper, step: int) -> dict[str, float]:
        b1, b2 = hyper["betas"]
        return {"factor": math.sqrt(1 - b2**step) / (1 - b1**step)}

    def update(self, updates: list[Tensor], state, ctx: Context) -> list[Tensor]:
        if not ctx["correct_bias"]:
            return updates
        return [u * ctx["factor"] for u in updates]
