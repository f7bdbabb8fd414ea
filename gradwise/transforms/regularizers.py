"""Ranger21's two parameter regularizers, and the second-moment statistic stable weight decay reads.

- ``add_stable_weight_decay`` (Xie et al., 2023, "On the Overlooked Pitfalls of Weight Decay and How
  to Mitigate Them", arXiv:2011.11152): u <- u + wd / n p, with n the square root of the mean of
  Adam's bias-corrected second moment over every element of the step. n is a reduction
  (``core/phases.py``): the link that keeps the second moment reports its parts
  (``second_moment_parts``: the sum of v_t / (1 - b2^t), from a running sum of v it keeps, and the
  element count), and the engine adds them up over all parameters before the links run.
- ``add_norm_loss`` (Georgiou et al., 2021, "Norm Loss", arXiv:2104.06800; as in Ranger21):
  u <- u + 2 f (1 - 1 / (||p||_unit + eps)) p, pulling each unit (row) of p toward norm 1, with
  f = ``normloss_factor`` and the unit norms of ``gradient_shaping.unit_norm``.
- ``shrink_like_ranger21``: both, as Ranger21's code applies them, before its core takes the step.

With the MADGRAD core, Ranger21's n still reads Adam's second moment, which ``trace_second_moment``
keeps.
"""
from __future__ import annotations

import torch
from torch import Tensor

from gradwise.core.hyper import Hyper, betas_pair, non_negative, positive
from gradwise.core.transform import Context, Transform, state_dtype
from gradwise.transforms.gradient_shaping import unit_norm

#: the statistics a second-moment link reports when asked (``second_moment_parts``)
SECOND_MOMENT = {"second_moment_sum": "sum", "second_moment_count": "sum"}
#: the 0-d float64 state such a link keeps: sum(v_t) = b2 sum(v_{t-1}) + (1 - b2) sum(x_t^2), so that the
#: statistic costs no pass over v
RUNNING_SUM = "variance_sum"


def running_sum() -> Tensor:
    """A fresh ``RUNNING_SUM`` (v starts at 0)."""
    return torch.zeros((), dtype=torch.float64)


def sum_of_squares(x: Tensor) -> Tensor:
    """sum(x^2), as float64, with no temporary shaped like x (reduced in x's dtype: a float64 reduction
    of float32 would first copy x to float64)."""
    return torch.linalg.vector_norm(x).double().square()


def advance_running_sums(squares: list[Tensor], sums: list[Tensor], ctx: Context) -> None:
    """sum(v) <- b2 sum(v) + (1 - b2) sum(x^2), given sum(x^2) for each tensor x that v averages the
    square of this step (``squares``); ``ctx`` holds the link's ``one_minus_beta2`` scalar and ``betas``."""
    b2, rate = ctx["betas"][1].double(), ctx["one_minus_beta2"].double()
    for square, total in zip(squares, sums):
        total.copy_(total * b2 + square.double() * rate)


def second_moment_parts(sums: list[Tensor], updates: list[Tensor], ctx: Context) -> dict[str, Tensor]:
    """This bucket's parts of ``SECOND_MOMENT``: the sum of v_t / (1 - b2^t) from the running sums after
    this step's ``advance_running_sums``, and the element count; ``ctx`` holds the ``bias2`` scalar."""
    total = torch.stack([s.reshape(()) for s in sums]).sum() / ctx["bias2"].double()
    return {"second_moment_sum": total,
            "second_moment_count": torch.full((), float(sum(u.numel() for u in updates)), dtype=torch.float64)}


class trace_second_moment(Transform):  # noqa: N801
    """v <- b2 v + (1 - b2) u^2 (b2 = ``betas[1]``), passing u through: Adam's second moment, kept for
    stable weight decay's n by a chain whose core does not keep it (Ranger21 with MADGRAD); it
    reports ``SECOND_MOMENT``."""

    name = "second_moment"
    state = ("variance_ma", RUNNING_SUM)
    nonnegative = ("variance_ma",)
    hyper = {"betas": Hyper((0.9, 0.999), betas_pair)}
    reductions = SECOND_MOMENT
    prepares = True

    def init(self, param: Tensor, group) -> dict[str, Tensor]:
        v = torch.zeros_like(param, dtype=state_dtype(param), memory_format=torch.preserve_format)
        return {"variance_ma": v, RUNNING_SUM: running_sum().to(param.device)}

    def scalars(self, hyper, step: int) -> dict[str, float]:
        b2 = float(hyper["betas"][1])
        return {"one_minus_beta2": 1 - b2, "bias2": 1 - b2**step}  # in double, as the reference

    def prepare(self, updates: list[Tensor], state, ctx: Context) -> None:
        advance_running_sums([sum_of_squares(u) for u in updates], state[RUNNING_SUM], ctx)

    def reduce(self, updates: list[Tensor], state, ctx: Context) -> dict[str, Tensor]:
        return second_moment_parts(state[RUNNING_SUM], updates, ctx)

    def update(self, updates: list[Tensor], state, ctx: Context) -> list[Tensor]:
        b2 = ctx["betas"][1]
        for u, v in zip(updates, state["variance_ma"]):
            v.mul_(b2).add_(u * u * ctx["one_minus_beta2"])
        return updates


def mean_second_moment(ctx: Context) -> Tensor:
    """The mean of the bias-corrected second moment over every element of the step."""
    return ctx["second_moment_sum"] / ctx["second_moment_count"].clamp_min(1)


class add_stable_weight_decay(Transform):  # noqa: N801
    """u <- u + (weight_decay / n) p, n = sqrt(mean bias-corrected second moment) over the step; a link
    before it in the chain reports the second moment (``trace_second_moment``, or
    ``scale_by_pnm_adam(second_moment_statistics=True)``)."""

    name = "stable_weight_decay"
    hyper = {"weight_decay": Hyper(0.0, non_negative, zero_is_identity=True)}
    reads = tuple(SECOND_MOMENT)
    refuses_nonfinite = True

    def update(self, updates: list[Tensor], state, ctx: Context) -> list[Tensor]:
        if not ctx.active("weight_decay"):
            return updates
        rate = ctx["weight_decay"] / mean_second_moment(ctx).sqrt()
        return [u + p * rate for u, p in zip(updates, ctx.params)]


class add_norm_loss(Transform):  # noqa: N801
    """u <- u + 2 normloss_factor (1 - 1 / (unit_norm(p) + eps)) p."""

    name = "norm_loss"
    elementwise = False
    hyper = {"normloss_factor": Hyper(1e-4, non_negative), "eps": Hyper(1e-8, positive)}

    def update(self, updates: list[Tensor], state, ctx: Context) -> list[Tensor]:
        factor, eps = ctx["normloss_factor"], ctx["eps"]
        out = []
        for u, p in zip(updates, ctx.params):
            p = p.to(u.dtype)
            out.append(u + p * (2 * factor * (1 - 1 / (unit_norm(p) + eps))))
        return out


class shrink_like_ranger21(Transform):  # noqa: N801
    """Both regularizers as Ranger21's code applies them: before its core takes the step, the
    parameters shrink by stable weight decay, then by norm loss at the decayed point:

        p <- p (1 - a)(1 - b),  a = d_t wd / n,  b = lr_t 2 f (1 - 1 / ((1 - a) ||p||_unit + eps))

    with lr_t = lr * schedule(t) and n from the step's second moment (a link before this one reports
    it). With ``core="adam"``, d_t = lr_t and n = sqrt((1 + S) / N) (the 1 is pytorch-optimizer's);
    with ``core="madgrad"``, d_t = lr_t sqrt(t) (MADGRAD's lambda_t) and n = (S / N)^(1/3) (the authors'
    package), S the sum of the bias-corrected second moment over the step's N elements. The link
    ``moves_point``: the engine writes the shrunk parameters before the links of its phase take their
    step from them (MADGRAD reads them), as Ranger21's code shrinks p before its step.
    """

    name = "ranger21_shrink"
    moves_point = True
    reads = tuple(SECOND_MOMENT)
    refuses_nonfinite = True
    hyper = {"lr": Hyper(1e-3, non_negative), **add_stable_weight_decay.hyper, **add_norm_loss.hyper}

    def __init__(self, schedule, norm_loss: bool = True, core: str = "adam"):
        if core not in ("adam", "madgrad"):
            raise ValueError(f"invalid core={core!r}: expected 'adam' or 'madgrad'")
        self.schedule, self.norm_loss, self.core = schedule, norm_loss, core
        self.elementwise = not norm_loss

    def scalars(self, hyper, step: int) -> dict[str, float]:
        lr_t = float(hyper["lr"]) * self.schedule(step - 1)
        return {"lr_t": lr_t, "decay_t": lr_t * step**0.5 if self.core == "madgrad" else lr_t}

    def point_factors(self, params: list[Tensor], state, ctx: Context) -> list[Tensor]:
        """(1 - a)(1 - b) for each parameter: what it is multiplied by (per unit with norm loss); 1 - a, and
        b's rate, are the step's, computed once."""
        if self.core == "madgrad":
            n = mean_second_moment(ctx).pow(1 / 3)
        else:
            n = ((ctx["second_moment_sum"] + 1) / ctx["second_moment_count"].clamp_min(1)).sqrt()
        keep = 1 - ctx["decay_t"] * ctx["weight_decay"] / n
        if not self.norm_loss:
            return [keep] * len(params)
        rate = ctx["lr_t"] * 2 * ctx["normloss_factor"]
        return [keep * (1 - rate * (1 - 1 / (unit_norm(p) * keep + ctx["eps"]))) for p in params]

    def update(self, updates: list[Tensor], state, ctx: Context) -> list[Tensor]:
        return updates  # the engine has moved the parameters (``point``) before this link's phase

    def __repr__(self) -> str:
        return f"shrink_like_ranger21({self.schedule!r}, norm_loss={self.norm_loss}, core={self.core!r})"
