"""Lion's sign update (Chen et al., 2023, "Symbolic Discovery of Optimization Algorithms", arXiv:2302.06675)."""
from __future__ import annotations

from torch import Tensor

from gradwise.core import lists
from gradwise.core.hyper import Hyper, betas_pair
from gradwise.core.transform import Context, Transform


class scale_by_lion(Transform):  # noqa: N801
    """u <- sign(b1 m + (1-b1) u);  then  m <- b2 m + (1-b2) u  (with the incoming u)."""

    name = "lion"
    state = ("exp_avg",)
    hyper = {"betas": Hyper((0.9, 0.99), betas_pair)}

    def scalars(self, hyper, step: int) -> dict[str, float]:
        b1, b2 = map(float, hyper["betas"])
        return {"one_minus_beta1": 1 - b1, "one_minus_beta2": 1 - b2}  # in double, as lion-pytorch does

    def update(self, updates: list[Tensor], state, ctx: Context) -> list[Tensor]:
        """Per tensor, sign(m b1 + u (1 - b1)) then m <- m b2 + u (1 - b2), as list ops (``core/lists.py``) in
        lion-pytorch's op order (its additions with ``alpha``)."""
        b1, b2 = ctx["betas"]
        m = state["exp_avg"]
        out = lists.mul(m, b1)
        lists.add_(out, updates, alpha=ctx["one_minus_beta1"])
        lists.sign_(out)
        lists.mul_(m, b2)
        lists.add_(m, updates, alpha=ctx["one_minus_beta2"])
        return out
