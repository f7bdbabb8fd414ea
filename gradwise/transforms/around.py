"""Modifiers that run one ``inner`` transform and change what goes into it or comes out of it
(``cautious``, ``spam``): the checks they share and what they forward to ``inner``."""
from __future__ import annotations

from gradwise.core.transform import Transform


class around(Transform):  # noqa: N801 - transforms are named like functions (optax grammar)
    """The base of a modifier around ``inner`` (any transform or chain: Adam's, Lion's, Muon's core).

    ``inner`` must not read statistics of the whole step or move the parameters: those links go before the
    modifier. Its state, hyperparameters, per-step scalars and hooks stay its own (``wrapped``); for a group
    whose chain resolves ``inner`` differently (``for_group``: amsgrad per group), the modifier wraps the
    resolved one, built once per resolved ``inner``.
    """

    def __init__(self, inner: Transform):
        name = type(self).__name__
        if not isinstance(inner, Transform):
            raise TypeError(f"{name}(): inner={inner!r} must be a Transform, e.g. scale_by_adam()")
        if inner.reductions or inner.prepares or inner.moves_point:
            raise ValueError(f"{name}(): inner={inner!r} reads statistics of the whole step or moves the"
                             f" parameters; put those links before {name}(...), around the core only")
        self.inner = inner
        self.weights_like, self.batched, self.reads_params = inner.weights_like, inner.batched, inner.reads_params

    def wrapped(self, group=None) -> list[tuple[str, Transform]]:
        return [("", self.inner)]

    def for_group(self, group) -> Transform:
        inner = self.inner.for_group(group)
        if inner is self.inner:
            return self
        cache = self.__dict__.setdefault("_resolved", {})
        if id(inner) not in cache:
            cache[id(inner)] = self.rewrapped(inner)
        return cache[id(inner)]

    def rewrapped(self, inner: Transform) -> "around":
        """This modifier, with its own settings, around another ``inner``."""
        return type(self)(inner)
