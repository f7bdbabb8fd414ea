"""The param groups a recipe makes of some parameters, ready for a wrapper that partitions groups itself.

``route`` (Muon) splits a user's group into one group per route, and AdamMini one per kind of block.
``torch.distributed.optim.ZeroRedundancyOptimizer`` keeps a group list of its own, hands each rank a
copy of every group holding that rank's parameters, and asserts that the rank's optimizer keeps as
many groups: a split on one rank breaks it. Given the groups already split, each tagged
(``"route"``, ``"blocks"``) so that no optimizer splits it again and each holding its route's
hyperparameters, every rank keeps exactly the groups ZeRO gave it::

    groups = gradwise.Muon.split_groups(model.named_parameters(), lr=0.02, adamw_lr=3e-4)
    optimizer = ZeroRedundancyOptimizer(groups, optimizer_class=gradwise.Muon, lr=0.02, adamw_lr=3e-4)

The recipe is built on meta stand-ins of the parameters, so nothing is allocated, no hook is
installed (LOMO's ``fused_backward``) and the parameters are left as they were.
"""
from __future__ import annotations

from typing import Any, Iterable

import torch
from torch import Tensor


def split_groups(cls: type, params: Iterable[Any], *args: Any, **kwargs: Any) -> list[dict[str, Any]]:
    """The groups ``cls(params, *args, **kwargs)`` keeps, each with its parameters (plain tensors: the
    names have done their work, and ZeroRedundancyOptimizer takes tensors only) and every
    hyperparameter it reads."""
    stand_ins: dict[int, Tensor] = {}

    def meta(item: Any) -> Any:
        name, p = item if isinstance(item, tuple) and len(item) == 2 else (None, item)
        if not isinstance(p, Tensor):
            return item  # the optimizer refuses it, with its own message
        stand_in = torch.empty_like(p, device="meta").requires_grad_(p.requires_grad)
        stand_ins[id(stand_in)] = p
        return stand_in if name is None else (name, stand_in)

    params = list(params)
    if any(isinstance(g, dict) for g in params):
        params = [{**g, "params": [meta(i) for i in _listed(g["params"])]} if isinstance(g, dict) and "params" in g
                  else g for g in params]
    else:
        params = [meta(item) for item in params]
    built = cls(params, *args, **kwargs)
    return [{**{k: v for k, v in g.items() if k != "param_names"}, "params": [stand_ins[id(p)] for p in g["params"]]}
            for g in built.param_groups]


def _listed(params: Any) -> list[Any]:
    return [params] if isinstance(params, Tensor) else list(params)
