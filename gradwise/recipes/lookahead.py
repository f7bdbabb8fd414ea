"""Lookahead around any gradwise optimizer."""
from __future__ import annotations

from gradwise.core.optimizer import Optimizer
from gradwise.core.transform import chain
from gradwise.transforms.lookahead import lookahead


def Lookahead(optimizer: Optimizer, k: int = 5, alpha: float = 0.5) -> Optimizer:  # noqa: N802 - reads as a class
    """``optimizer``'s chain followed by ``lookahead()`` (Zhang et al., 2019), as a new optimizer over
    the same parameter groups: every ``k`` steps the slow weights move ``alpha`` of the way to the fast
    ones and the fast ones restart there. Wrap a fresh optimizer (one that has not stepped)::

        optimizer = gradwise.Lookahead(gradwise.AdamW(model.parameters(), lr=1e-3), k=5, alpha=0.5)
    """
    if not isinstance(optimizer, Optimizer):
        raise TypeError(f"invalid optimizer={optimizer!r}: expected a gradwise Optimizer (e.g. gradwise.AdamW)")
    if optimizer.state:
        raise ValueError("Lookahead(optimizer): the optimizer has already stepped; wrap it before its first step")
    groups = [{k_: v for k_, v in g.items()} for g in optimizer.param_groups]
    transform = chain(optimizer.transform, lookahead())
    return Optimizer(groups, transform, compile=optimizer.compile, state=optimizer._encoded.policy, lookahead_k=k,
                     lookahead_alpha=alpha,
                     **optimizer.defaults)
