"""Ranger21's two parameter regularizers, added to the update before the learning rate.

- ``add_stable_weight_decay`` (Xie et al., 2023, "On the Overlooked Pitfalls of Weight Decay and How
  to Mitigate Them", arXiv:2011.11152): u <- u + wd / n p, with n = ``variance_normalizer``, the square
  root of the mean of Adam's bias-corrected second moment over all parameters. A transform sees one
  parameter at a time, so the recipe sets n in the group before each step (``Ranger21`` does); left at
  its default 1 this is decoupled weight decay.
- ``add_norm_loss`` (Georgiou et al., 2021, "Norm Loss", arXiv:2104.06800; as in Ranger21):
  u <- u + 2 f (1 - 1 / (||p||_unit + eps)) p, pulling each unit (row) of p toward norm 1, with
  f = ``normloss_factor`` and the unit norms of ``gradient_shaping.unit_norm``.

Ranger21's code shrinks p by the two factors one after the other and then takes the step; added to
the update they differ from it by a term of order lr^2 wd f per step. ``shrink_like_ranger21`` keeps
that term (its reading of Ranger21 matches the references to float64; the ``Ranger21`` recipe itself
shrinks p in its prologue). With the MADGRAD core, Ranger21's n still reads Adam's second moment,
which ``trace_second_moment`` keeps.
"""
from __future__ import annotations

from torch import Tensor

from gradwise.core.hyper import Hyper, betas_pair, non_negative, positive
from gradwise.core.transform import Context, Transform
from gradwise.transforms.gradient_shaping import unit_norm


class trace_second_moment(Transform):  # noqa: N801
    """v <- b2 v + (1 - b2) u^2 (b2 = ``betas[1]``), passing u through: Adam's second moment, kept for
    stable weight decay's n by a chain whose core does not keep it (Ranger21 with MADGRAD)."""

    name = "second_moment"
    state = ("variance_ma",)
    nonnegative = ("variance_ma",)
    hyper = {"betas": Hyper((0.9, 0.999), betas_pair)}

    def scalars(self, hyper, step: int) -> dict[str, float]:
        return {"one_minus_beta2": 1 - float(hyper["betas"][1])}  # in double, as the reference

    def update(self, updates: list[Tensor], state, ctx: Context) -> list[Tensor]:
        b2 = ctx["betas"][1]
        for u, v in zip(updates, state["variance_ma"]):
            v.mul_(b2).add_(u * u * ctx["one_minus_beta2"])
        return updates


class add_stable_weight_decay(Transform):  # noqa: N801
    """u <- u + (weight_decay / variance_normalizer) p."""

    name = "stable_weight_decay"
    hyper = {
        "weight_decay": Hyper(0.0, non_negative, zero_is_identity=True),
        "variance_normalizer": Hyper(1.0, positive),
    }

    def update(self, updates: list[Tensor], state, ctx: Context) -> list[Tensor]:
        if not ctx.active("weight_decay"):
            return updates
        rate = ctx["weight_decay"] / ctx["variance_normalizer"]
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
    """Both regularizers as Ranger21's code applies them: the parameters shrink by stable weight decay,
    then by norm loss at the decayed point, then take the step u (this link follows the learning rate):

        a = lr_t wd / n;  b = lr_t 2 f (1 - 1 / ((1 - a) ||p||_unit + eps));  u <- u + p ((1 - a)(1 - b) - 1)

    with lr_t = lr * schedule(t). Equal to ``add_stable_weight_decay`` and ``add_norm_loss`` before the
    learning rate up to the O(a b) cross term, which this link keeps, to match Ranger21 to float64.
    """

    name = "ranger21_shrink"
    elementwise = False
    hyper = {
        "lr": Hyper(1e-3, non_negative),
        **add_stable_weight_decay.hyper,
        **add_norm_loss.hyper,
    }

    def __init__(self, schedule, norm_loss: bool = True):
        self.schedule, self.norm_loss = schedule, norm_loss
        self.elementwise = not norm_loss

    def scalars(self, hyper, step: int) -> dict[str, float]:
        return {"lr_t": float(hyper["lr"]) * self.schedule(step - 1)}

    def factor(self, p: Tensor, ctx: Context) -> Tensor:
        """(1 - a)(1 - b): what p is multiplied by (per unit with norm loss)."""
        keep = 1 - ctx["lr_t"] * ctx["weight_decay"] / ctx["variance_normalizer"]
        if not self.norm_loss:
            return keep
        return keep * (1 - ctx["lr_t"] * 2 * ctx["normloss_factor"] * (1 - 1 / (unit_norm(p) * keep + ctx["eps"])))

    def update(self, updates: list[Tensor], state, ctx: Context) -> list[Tensor]:
        out = []
        for u, p in zip(updates, ctx.params):
            p = p.to(u.dtype)
            out.append(u + p * (self.factor(p, ctx) - 1))
        return out

    def __repr__(self) -> str:
        return f"shrink_like_ranger21({self.schedule!r}, norm_loss={self.norm_loss})"
