"""Checks on the parameters handed to an optimizer, and the local views the chain computes on."""
from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

try:
    from torch.distributed.tensor import DTensor
except ImportError:  # torch built without distributed support
    DTensor = ()  # type: ignore[assignment,misc]


def check_new_group(group: dict[str, Any], index: int) -> None:
    """Normalize ``group["params"]`` to a list and reject what no optimizer step can handle."""
    if not isinstance(group, dict):
        raise TypeError(f"param group {index} must be a dict, got {type(group).__name__}")
    params = group.get("params")
    if params is None:
        raise ValueError(f"param_groups[{index}] has no 'params' entry")
    if isinstance(params, Tensor):
        params = [params]
    elif isinstance(params, set):
        raise TypeError(f"param_groups[{index}]['params'] is a set, whose order changes between runs; pass a list")
    else:
        params = list(params)
    group["params"] = params
    seen: dict[int, str] = {}
    for label, p in _labelled(params, index):
        if not isinstance(p, Tensor):
            raise TypeError(f"{label} is a {type(p).__name__}; expected a torch.Tensor")
        if not p.is_leaf:
            raise ValueError(
                f"{label} is not a leaf tensor (it was computed from other tensors); optimize leaf tensors"
                " such as nn.Parameter, or call .detach().requires_grad_() first"
            )
        if id(p) in seen:
            raise ValueError(f"{label} is the same tensor as {seen[id(p)]}; list each parameter once")
        seen[id(p)] = label
        if not (p.is_floating_point() or p.is_complex()):
            raise TypeError(f"{label} has dtype {p.dtype}; gradwise optimizes floating-point or complex tensors")


def check_disjoint(group: dict[str, Any], index: int, groups: list[dict[str, Any]]) -> None:
    """Reject a parameter that an earlier group already holds, naming both places."""
    owner = {id(p): i for i, g in enumerate(groups) for p in g["params"]}
    for label, p in _labelled(group["params"], index):
        if id(p) in owner:
            raise ValueError(f"{label} is already in param_groups[{owner[id(p)]}]; a parameter belongs to one group")


def _labelled(params: list[Any], index: int):
    """``(label, tensor)`` for each entry of a group's params, plain or ``(name, tensor)``."""
    for j, item in enumerate(params):
        name, p = item if isinstance(item, tuple) and len(item) == 2 else (None, item)
        yield f"param_groups[{index}]['params'][{j}]" + (f" ({name!r})" if name else ""), p


def param_label(group: dict[str, Any], p: Tensor, index: int) -> str:
    """A readable name for ``p``: its name when the group has ``param_names``, else its position."""
    for j, q in enumerate(group["params"]):
        if q is p:
            names = group.get("param_names")
            return f"parameter {names[j]!r}" if names else f"param_groups[{index}]['params'][{j}]"
    return "a parameter"


def local(t: Tensor) -> Tensor:
    """What elementwise math runs on: the local shard of a DTensor, the real view of a complex tensor."""
    if isinstance(t, DTensor):
        t = t.to_local()
    return torch.view_as_real(t) if t.is_complex() else t
