"""Checkpoints that cross between torch.optim and gradwise.

A recipe that computes what a torch.optim optimizer computes declares it where its chain is, as
``torch_format = TorchFormat("torch.optim.AdamW", group={"amsgrad": False, ...})`` (under ``route``,
a dict of them by route). A buffer's torch.optim name is its name inside its link: the chain's
``"adam.exp_avg"`` is torch's ``"exp_avg"``, ``"momentum.momentum_buffer"`` torch's
``"momentum_buffer"``. ``from_torch`` turns a torch.optim state dict into this optimizer's own
(``load_state_dict`` calls it when the dict's state keys are torch's); ``to_torch`` is what
``state_dict(format="torch")`` returns, which the torch.optim optimizer loads. Anything that does not
map exactly (another algorithm's keys, a torch-only option this chain does not compute, a buffer
with no torch counterpart) raises, naming what was found and what was expected: never a restart.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

import torch

from gradwise.core.params import param_label
from gradwise.core.state_check import (
    BOOKKEEPING_KEYS,
    OPTIMIZER_KEY,
    TORCH_EXECUTION_KEYS,
    expected_state,
    saved_ids,
)
from gradwise.core.state_keys import MARK


@dataclass(frozen=True)
class TorchFormat:
    """The torch.optim optimizer a chain equals: its name, the values of torch-only group options
    under which it equals it (``amsgrad=False``), and whether torch counts steps in its state
    (``torch.optim.SGD`` and ``Muon`` do not: their state converts with ``step`` 1, so the momentum
    continues, and the count only seeds stochastic rounding)."""

    optimizer: str
    group: Mapping[str, Any] = field(default_factory=dict)
    counts_steps: bool = True


def torch_name(key: str) -> str:
    """A chain buffer's torch.optim name: its name inside its link (``"adam.exp_avg"`` -> ``"exp_avg"``)."""
    return key.rsplit(".", 1)[-1]


def is_torch_format(state_dict: Mapping[str, Any]) -> bool:
    """Whether ``state_dict`` came from torch.optim: no gradwise entry (at the top or in a group), and state
    keys that are not namespaced (with no state at all: groups that hold torch's execution options)."""
    states, groups = state_dict.get("state"), state_dict.get("param_groups")
    if OPTIMIZER_KEY in state_dict or not isinstance(states, Mapping) or not isinstance(groups, list) \
            or any(isinstance(g, Mapping) and OPTIMIZER_KEY in g for g in groups):
        return False
    keys = [k for st in states.values() if isinstance(st, Mapping) for k in st if k != "step"]
    if keys:
        return not any(isinstance(k, str) and ("." in k or MARK in k) for k in keys)
    return any(isinstance(g, Mapping) and any(k in g for k in TORCH_EXECUTION_KEYS) for g in groups)


def format_for(optimizer, group: Mapping[str, Any]) -> TorchFormat:
    declared = getattr(optimizer, "torch_format", None)
    fmt = declared.get(group.get("route")) if isinstance(declared, Mapping) else declared
    if fmt is None:
        raise ValueError(f"{type(optimizer).__name__} has no torch.optim counterpart to convert checkpoints with"
                         f"{' for route ' + repr(group.get('route')) if isinstance(declared, Mapping) else ''};"
                         " torch.optim checkpoints load into gradwise.SGD, Adam, AdamW, NAdamW, Adafactor and Muon")
    return fmt


def from_torch(optimizer, state_dict: Mapping[str, Any]) -> dict[str, Any]:
    """The torch.optim ``state_dict`` as this optimizer's own, or a ``ValueError`` saying why not."""
    groups = []
    for index, (group, saved) in enumerate(zip(optimizer.param_groups, state_dict.get("param_groups", []))):
        if not isinstance(saved, Mapping) or not isinstance(saved.get("params"), list):
            return dict(state_dict)  # refused, by name, in state_check.checked_load
        fmt = format_for(optimizer, group)
        converted = {k: v for k, v in saved.items() if k in optimizer.hyper_specs or k in BOOKKEEPING_KEYS}
        foreign = [f"{k}={v!r}" for k, v in saved.items() if k not in converted and k not in fmt.group
                   and k not in TORCH_EXECUTION_KEYS]
        if foreign:
            raise ValueError(f"torch.optim state_dict['param_groups'][{index}] has {', '.join(foreign)}, which"
                             f" {fmt.optimizer} does not have; expected the keys of {fmt.optimizer}:"
                             f" {sorted(set(optimizer.hyper_specs) - {'route', 'param_rounding'})}")
        for key, value in saved.items():
            if key in fmt.group and key not in converted and value != fmt.group[key]:
                raise ValueError(f"torch.optim state_dict['param_groups'][{index}] has {key}={value!r}:"
                                 f" gradwise.{type(optimizer).__name__} computes {fmt.optimizer} with"
                                 f" {key}={fmt.group[key]!r} only")
        groups.append({**{k: v for k, v in group.items() if k != "params"}, **converted})
    states = {}
    owners = {}
    for index, (group, saved) in enumerate(zip(optimizer.param_groups, groups)):
        for saved_id, p in zip(saved.get("params", []), group["params"]):
            owners[saved_id] = (p, {**saved, "params": group["params"]}, index)
    for saved_id, saved_state in state_dict["state"].items():
        if saved_id not in owners or not isinstance(saved_state, Mapping):
            states[saved_id] = saved_state  # refused, by name, in state_check.checked_load
            continue
        p, group, index = owners[saved_id]
        states[saved_id] = _state_from_torch(optimizer, p, group, index, saved_state)
    return {**state_dict, "state": states, "param_groups": groups}


def _state_from_torch(optimizer, p, group, index, saved: Mapping[str, Any]) -> dict[str, Any]:
    fmt = format_for(optimizer, group)
    expected = expected_state(optimizer, p, group)
    names = {torch_name(k): k for k in expected}
    # a buffer torch keeps only for some shapes (Adafactor's row_var for matrices, variance for vectors)
    optional = {torch_name(k) for k, (shape, _) in expected.items() if shape.numel() == 0 and shape != p.shape}
    found = {k for k, v in saved.items() if k != "step" and v is not None}
    required = set(names) - optional
    if not saved or (not found and "step" not in saved):
        return {}
    if len(names) != len(expected) or not required <= found or not found <= set(names):
        label = param_label(group, p, index)
        raise ValueError(f"torch.optim state of {label} has keys {sorted(found | ({'step'} & set(saved)))};"
                         f" {fmt.optimizer} as gradwise.{type(optimizer).__name__} runs it keeps"
                         f" {sorted(required | ({'step'} if fmt.counts_steps else set()))}")
    out: dict[str, Any] = {names[k]: saved[k] for k in found}
    for key in optional - found:
        shape, dtype = expected[names[key]]
        out[names[key]] = torch.zeros(shape, dtype=dtype)
    if "step" in saved:
        out["step"] = saved["step"]
    elif not fmt.counts_steps:
        out["step"] = torch.tensor(1.0)  # torch does not count; the momentum it kept has seen a step
    return out


def to_torch(optimizer, state_dict: Mapping[str, Any]) -> dict[str, Any]:
    """This optimizer's ``state_dict`` in the format of the torch.optim optimizer its chain equals."""
    groups = []
    for group, saved in zip(optimizer.param_groups, state_dict["param_groups"]):
        fmt = format_for(optimizer, group)
        if group.get("param_rounding", "nearest") != "nearest":
            raise ValueError(f"{type(optimizer).__name__} with param_rounding={group['param_rounding']!r} has no"
                             f" torch.optim counterpart: {fmt.optimizer} rounds to nearest")
        gradwise_only = ("route", "param_rounding", OPTIMIZER_KEY)
        groups.append({**fmt.group, **{k: v for k, v in saved.items() if k not in gradwise_only}})
    params = [p for g in optimizer.param_groups for p in g["params"]]
    owners = dict(zip(saved_ids(state_dict), params))
    states = {}
    for saved_id, saved in state_dict["state"].items():
        p = owners[saved_id]
        group = next(g for g in optimizer.param_groups if any(q is p for q in g["params"]))
        fmt = format_for(optimizer, group)
        out = {}
        for key, value in optimizer.storage.decoded(saved, p).items():
            if value.numel() == 0 and value.shape != p.shape:
                continue  # kept only for other shapes (Adafactor's row_var of a vector)
            out[torch_name(key)] = value.clone()
        if fmt.counts_steps and "step" in saved:
            out["step"] = saved["step"].clone()
        states[saved_id] = out
    return {"state": states, "param_groups": groups}
