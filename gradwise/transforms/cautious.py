"""Cautious optimizers (Liang, Chen, Liu & Liu, 2024, "Cautious Optimizers: Improving Training with One
Line of Code", arXiv:2411.16085): drop the part of an update that points against its gradient."""
from __future__ import annotations

from torch import Tensor

from gradwise.core.transform import Context, Transform
from gradwise.transforms.around import around


class cautious(around):  # noqa: N801 - transforms are named like functions (optax grammar)
    """``inner`` (any transform or chain: Adam's, Lion's, Muon's momentum and Newton-Schulz), then its
    output masked where its sign disagrees with its input u (the gradient, as the links before leave it):

    o <- inner(u);  phi <- 1(o * u > 0);  o <- o * phi * numel / (sum(phi) + 1)

    The rescale (per tensor, with the authors' + 1) keeps the update's mean size. Place it around the
    core, before weight decay and the learning rate:
    ``chain(cautious(scale_by_adam()), add_decayed_weights(), scale_by_learning_rate())`` is C-AdamW.
    ``inner``'s state, hyperparameters, per-step scalars and hooks are its own (forwarded: ``wrapped``).
    The mask reads a whole tensor's count, so it is not elementwise: it runs on whole tensors (eagerly,
    or compiled one graph per shape), a sharded parameter's on its owner.
    """

    name = "cautious"
    elementwise = False

    def __init__(self, inner: Transform):
        super().__init__(inner)
        self.hyper, self.state, self.nonnegative = inner.hyper, inner.state, inner.nonnegative

    def init(self, param: Tensor, group) -> dict[str, Tensor]:
        return self.inner.init(param, group)

    def scalars(self, hyper, step: int) -> dict[str, float]:
        return self.inner.scalars(hyper, step)

    def update(self, updates: list[Tensor], state, ctx: Context) -> list[Tensor]:
        out = []
        for u, o in zip(updates, self.inner.update(updates, state, ctx)):
            agrees = (o * u > 0).to(o.dtype)
            out.append(o * (agrees * (agrees.numel() / (agrees.sum() + 1))))
        return out

    def __repr__(self) -> str:
        return f"cautious({self.inner!r})"
