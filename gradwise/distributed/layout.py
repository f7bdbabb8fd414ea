"""One state-dict layout from the first step on, for ``torch.distributed.checkpoint`` (DCP).

``dcp.load`` loads into the state_dict of a fresh object (a ``Stateful``'s own, or one the caller
builds) and skips every key that one lacks. A torch optimizer creates its state at its first step, so
a fresh wrapper's ``state_dict()`` would lack every buffer a trained one saved. ``optimizer_layout``
gives the optimizer's ``state_dict()`` with its state filled in when it is still empty: by the step
DCP's own ``get_optimizer_state_dict`` runs on a fresh optimizer (zero gradients, lr 0), taken here on a
scratch copy (every parameter given a zero gradient, ``requires_grad`` or not: DiLoCo's synced copy has
none), so the optimizer itself is left untouched. ``started`` says which it was; a state loaded with
``started=False`` is not applied (the run had not stepped yet).
"""
from __future__ import annotations

import copy
from typing import Any

import torch


def optimizer_layout(optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """``{"state_dict": ..., "started": bool}``: ``optimizer.state_dict()``, its buffers present even
    before the first step (then those of a zero-gradient, lr-0 step on a copy)."""
    if optimizer.state:
        return {"state_dict": optimizer.state_dict(), "started": True}
    scratch = copy.deepcopy(optimizer)
    for group in scratch.param_groups:
        group["lr"] = group["lr"] * 0 if isinstance(group["lr"], torch.Tensor) else 0.0
        for p in group["params"]:  # every one: an outer optimizer's (DiLoCo's synced copy) need no grad
            p.grad = torch.zeros_like(p)
    scratch.step()
    saved = scratch.state_dict()
    saved["param_groups"] = optimizer.state_dict()["param_groups"]
    return {"state_dict": saved, "started": False}


def load_optimizer_layout(optimizer: torch.optim.Optimizer, layout: dict[str, Any]) -> None:
    """The inverse of ``optimizer_layout``: the saved state loaded if the run had stepped."""
    if layout["started"]:
        optimizer.load_state_dict(layout["state_dict"])
