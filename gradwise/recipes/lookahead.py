"""Lookahead around any gradwise optimizer."""
from __future__ import annotations

import inspect

from gradwise.core.fused_backward import fused_backward as install_fused_backward
from gradwise.core.fused_backward import installed_on
from gradwise.core.optimizer import Optimizer
from gradwise.core.transform import chain
from gradwise.transforms.lookahead import lookahead


def Lookahead(optimizer: Optimizer, k: int = 5, alpha: float = 0.5) -> Optimizer:  # noqa: N802 - reads as a class
    """``optimizer``'s chain followed by ``lookahead()`` (Zhang et al., 2019), as a new optimizer over
    the same parameter groups: every ``k`` steps the slow weights move ``alpha`` of the way to the fast
    ones and the fast ones restart there. Wrap a fresh optimizer (one that has not stepped)::

        optimizer = gradwise.Lookahead(gradwise.AdamW(model.parameters(), lr=1e-3), k=5, alpha=0.5)

    An optimizer that steps inside backward (LOMO, AdaLomo, ``gradwise.fused_backward``) hands its
    hooks over: the new optimizer steps inside backward, Lookahead included, and its handle is
    ``.fused_backward`` (the old handle's ``remove()`` then does nothing). Refused: an optimizer whose
    chain already ends in Lookahead (Ranger21 has it built in: ``lookahead_mergetime``,
    ``lookahead_blending_alpha``), and a subclass that overrides ``step()``, which the new optimizer
    would not run.
    """
    if not isinstance(optimizer, Optimizer):
        raise TypeError(f"invalid optimizer={optimizer!r}: expected a gradwise Optimizer (e.g. gradwise.AdamW)")
    name = type(optimizer).__name__
    if "lookahead_k" in optimizer.defaults:
        raise ValueError(f"Lookahead({name}): its chain already has Lookahead ({optimizer.transform!r});"
                         " set its own k and alpha instead (Ranger21: lookahead_mergetime=k,"
                         " lookahead_blending_alpha=alpha)")
    if inspect.unwrap(type(optimizer).step) is not inspect.unwrap(Optimizer.step):  # torch wraps step()
        builtin = (" Ranger21 has Lookahead built in: Ranger21(..., lookahead_active=True, lookahead_mergetime=k,"
                   " lookahead_blending_alpha=alpha)") if "ranger21" in name.lower() else ""
        raise ValueError(f"Lookahead({name}): {name} overrides step() (it computes something from every"
                         " parameter before its chain runs), and the optimizer Lookahead builds runs the chain"
                         f" alone, which would drop that part of {name}'s step.{builtin}")
    if optimizer.state:
        raise ValueError("Lookahead(optimizer): the optimizer has already stepped; wrap it before its first step")
    groups = [{k_: v for k_, v in g.items()} for g in optimizer.param_groups]
    transform = chain(optimizer.transform, lookahead())
    wrapped = Optimizer(groups, transform, compile=optimizer.compile, state=optimizer.storage.policy,
                        lookahead_k=k, lookahead_alpha=alpha, **optimizer.defaults)
    wrapped.torch_kernels = optimizer.torch_kernels
    handles = installed_on(optimizer)
    if handles:  # the inner optimizer's hooks would step it, and Lookahead would never run
        for handle in handles:
            handle.remove()
        wrapped.fused_backward = install_fused_backward(wrapped)
    return wrapped
