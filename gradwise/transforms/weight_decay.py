"""Weight decay as an added term (optax's ``add_decayed_weights``)."""
from __future__ import annotations

from torch import Tensor

from gradwise.core.hyper import Hyper, non_negative
from gradwise.core.transform import Context, Transform


class add_decayed_weights(Transform):  # noqa: N801
    """u <- u + wd * p.

    Placed before a preconditioner it is L2 regularization (Adam, SGD); placed after it, just before
    ``scale_by_learning_rate``, it is decoupled weight decay (AdamW; Loshchilov & Hutter, 2019,
    arXiv:1711.05101): p <- p - lr (u + wd p).
    """

    name = "weight_decay"
    hyper = {"weight_decay": Hyper(0.0, non_negative, zero_is_identity=True)}

    def update(self, updates: list[Tensor], state, ctx: Context) -> list[Tensor]:
        if not ctx.active("weight_decay"):
            return updates
        wd = ctx["weight_decay"]
        return [u + p * wd for u, p in zip(updates, ctx.params)]
