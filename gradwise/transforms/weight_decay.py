"""Weight decay as an added term (optax's ``add_decayed_weights``)."""
from __future__ import annotations

import torch
from torch import Tensor

from gradwise.core import lists
from gradwise.core.hyper import Hyper, boolean, non_negative, positive
from gradwise.core.transform import Context, Transform
from gradwise.transforms.learning_rate import scale_by_learning_rate


class add_decayed_weights(Transform):  # noqa: N801
    """u <- u + wd * p.

    Placed before a preconditioner it is L2 regularization (Adam, SGD); placed after it, just before
    ``scale_by_learning_rate``, it is decoupled weight decay (AdamW; Loshchilov & Hutter, 2019,
    arXiv:1711.05101): p <- p - lr (u + wd p).

    ``after_lr=True``: u <- u - lr wd p, placed after a step size that is not ``lr`` (Adafactor's
    relative step), whose link declares ``lr``.
    """

    name = "weight_decay"
    hyper = {"weight_decay": Hyper(0.0, non_negative, zero_is_identity=True)}

    def __init__(self, after_lr: bool = False):
        self.after_lr = after_lr

    def scalars(self, hyper, step: int) -> dict[str, float]:
        if self.after_lr or "lr" not in hyper:
            return {}
        return {"decay": 1 - float(hyper["lr"]) * float(hyper["weight_decay"])}  # in double, as torch.optim

    def update(self, updates: list[Tensor], state, ctx: Context) -> list[Tensor]:
        if not ctx.active("weight_decay"):
            return updates
        wd = -ctx["lr"] * ctx["weight_decay"] if self.after_lr else ctx["weight_decay"]
        return lists.add(lists.mul(ctx.params, wd), updates)  # p wd + u: the bits of u + p wd

    def fuse(self, other: Transform) -> Transform | None:
        """Followed by the step size (decoupled weight decay at a chain's end): one link (``_decayed_step``)."""
        if not self.after_lr and type(other) is scale_by_learning_rate:
            return _decayed_step(self, other)
        return None

    def __repr__(self) -> str:
        return "add_decayed_weights(after_lr=True)" if self.after_lr else "add_decayed_weights()"


class _decayed_step(Transform):  # noqa: N801
    """``add_decayed_weights()`` then ``scale_by_learning_rate`` as one link (``Transform.fuse``): ``update`` is
    theirs one after the other; as a chain's last link it writes the parameters in the op order of torch.optim's
    decoupled decay and lion-pytorch's step (``apply``), two list ops where the two links and the addition take
    four:  p <- p (1 - lr wd);  p <- p - lr u."""

    name = "weight_decay"

    def __init__(self, decay: add_decayed_weights, lr: scale_by_learning_rate):
        self.decay, self.lr = decay, lr

    def update(self, updates: list[Tensor], state, ctx: Context) -> list[Tensor]:
        return self.lr.update(self.decay.update(updates, state, ctx), state, ctx)

    def apply(self, updates: list[Tensor], state, ctx: Context) -> None:
        if ctx.active("weight_decay"):
            lists.mul_(ctx.params, ctx["decay"])
        lists.sub_(ctx.params, updates, ctx["lr"])

    def __repr__(self) -> str:
        return f"fused({self.decay!r}, {self.lr!r})"


class decay_stepped_weights(Transform):  # noqa: N801
    """u <- u - lr wd (p + u), placed after ``scale_by_learning_rate``: decoupled weight decay applied
    to the parameter after its step, p <- (p + u)(1 - lr wd), as Hugging Face transformers' AdamW
    (and galore-torch and apollo-torch after it) do. It differs from ``add_decayed_weights`` before
    ``scale_by_learning_rate`` by lr wd u, a second-order term.
    """

    name = "stepped_weight_decay"
    hyper = {"weight_decay": Hyper(0.0, non_negative, zero_is_identity=True), "lr": Hyper(1e-3, non_negative)}

    def update(self, updates: list[Tensor], state, ctx: Context) -> list[Tensor]:
        if not ctx.active("weight_decay"):
            return updates
        decay = ctx["lr"] * ctx["weight_decay"]
        return [u - (p + u) * decay for u, p in zip(updates, ctx.params)]


class cautious_weight_decay(Transform):  # noqa: N801
    """Cautious Weight Decay (Chen et al., 2025, arXiv:2510.12402): decoupled decay only where the
    update and the parameter agree in sign, so decay never pulls against the step the core takes:

    u <- u + wd 1(u p >= 0) p

    In place of ``add_decayed_weights`` after any core, before ``scale_by_learning_rate``
    (p <- p - lr (u + wd 1(u p >= 0) p)). Elementwise.
    """

    name = "weight_decay"
    hyper = {"weight_decay": Hyper(0.0, non_negative, zero_is_identity=True)}

    def update(self, updates: list[Tensor], state, ctx: Context) -> list[Tensor]:
        if not ctx.active("weight_decay"):
            return updates
        wd = ctx["weight_decay"]
        return [u + torch.where(u * p >= 0, p * wd, 0.0) for u, p in zip(updates, ctx.params)]


class add_corrected_decayed_weights(Transform):  # noqa: N801
    """AdamC's corrected weight decay (Defazio, Mishchenko, Mehta, Mohan & Knight, 2025, "Why Gradients Rapidly
    Increase Near the End of Training", arXiv:2506.02285): on the layers whose output is normalized (a group
    with ``normalized=True``), decay in proportion to the learning rate's schedule, so that the steady-state
    norm of those weights, and of their gradients, stays put as the learning rate decays:

    u <- u + wd (lr_t / max_lr) p  (``normalized``);  u <- u + wd p  (the other groups)

    In place of ``add_decayed_weights`` after the core, before ``scale_by_learning_rate``:
    p <- p - lr_t (u + wd lr_t / max_lr p), i.e. p (1 - wd lr_t^2 / max_lr) - lr_t u. ``max_lr`` is the
    schedule's peak (``gradwise.AdamC``: its ``lr`` argument). Elementwise.
    """

    name = "weight_decay"
    hyper = {"weight_decay": Hyper(0.0, non_negative, zero_is_identity=True), "lr": Hyper(1e-3, non_negative),
             "max_lr": Hyper(1e-3, positive), "normalized": Hyper(False, boolean, static=True)}

    def scalars(self, hyper, step: int) -> dict[str, float]:
        return {"corrected": float(hyper["weight_decay"]) * float(hyper["lr"]) / float(hyper["max_lr"])}  # in double

    def update(self, updates: list[Tensor], state, ctx: Context) -> list[Tensor]:
        if not ctx.active("weight_decay"):
            return updates
        wd = ctx["corrected"] if ctx["normalized"] else ctx["weight_decay"]
        return lists.add(lists.mul(ctx.params, wd), updates)
