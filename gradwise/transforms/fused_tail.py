"""A link and the stateless links after it in its chain, decoupled weight decay and the step size, as one link
(``Transform.fuse``): the base of Adam's and NAdam's fused links, which write the parameters in torch.optim's op
order."""
from __future__ import annotations

from torch import Tensor

from gradwise.core.transform import Context, Transform
from gradwise.transforms.learning_rate import scale_by_learning_rate
from gradwise.transforms.weight_decay import add_decayed_weights


class FusedTail(Transform):
    """``core``, then ``add_decayed_weights()`` (decoupled) and ``scale_by_learning_rate`` (either may be absent),
    as one link under ``core``'s namespace, with its state. Its ``update`` is theirs one after the other, the same
    ops; a subclass's ``apply`` writes the parameters in its reference's op order once the link ends with the step
    size (``lr``)."""

    def __init__(self, core: Transform, decay: add_decayed_weights | None, lr: scale_by_learning_rate | None):
        self.core, self.decay, self.lr = core, decay, lr
        self.name, self.state, self.nonnegative = core.name, core.state, core.nonnegative

    @classmethod
    def following(cls, core: Transform, other: Transform) -> Transform | None:
        """``core`` and ``other`` right after it as one link of this class (``core.fuse(other)``): where ``other`` is
        decoupled weight decay or the step size; else None."""
        if type(other) is add_decayed_weights and not other.after_lr:
            return cls(core, other, None)
        if type(other) is scale_by_learning_rate:
            return cls(core, None, other)
        return None

    def fuse(self, other: Transform) -> Transform | None:
        if self.lr is None and type(other) is scale_by_learning_rate:
            return type(self)(self.core, self.decay, other)
        return None

    def update(self, updates: list[Tensor], state, ctx: Context) -> list[Tensor]:
        updates = self.core.update(updates, state, ctx)
        for t in (self.decay, self.lr):
            if t is not None:
                updates = t.update(updates, {}, ctx)  # stateless, and they read no scalars of their own
        return updates

    def __repr__(self) -> str:
        return "fused(" + ", ".join(repr(t) for t in (self.core, self.decay, self.lr) if t is not None) + ")"
