"""Engine options: the constructor keywords of an optimizer that are not param-group hyperparameters.

``compile``, ``state``, ``skip_nonfinite``, Muon's ``adamw_*`` (values of its AdamW route, set once),
AdamMini's ``dim``, torch's ``foreach`` and ``fused``...: whatever a recipe's signature takes and its
chain does not read from a group (``Optimizer.hyper_specs``). They are read off the signature, never
listed by hand, and recorded with the values the optimizer was built with (``engine_options``).

A wrapper that copies every keyword it is given into the param groups it builds, as
``torch.distributed.optim.ZeroRedundancyOptimizer`` does (its local optimizer gets groups holding
``compile=...`` and is built with the same ``compile=...``), must work: such a key in a group is
accepted when its value is the one the optimizer was built with, and kept out of the optimizer's own
groups, so it never becomes a hyperparameter nor enters ``state_dict()``. Any other value is refused,
naming the group, the key and both values, since a group cannot change how the optimizer was built.
A checkpoint's groups may hold them too (a ZeRO checkpoint saves its wrapper's groups): loading drops
them, and the loading optimizer keeps its own.
"""
from __future__ import annotations

import inspect
from typing import Any, Mapping


def bound_arguments(cls: type, args: tuple, kwargs: dict) -> dict[str, Any] | None:
    """Every named argument of ``cls(*args, **kwargs)`` after the parameters (the first), defaults
    filled in, as ``cls.__init__`` receives them; None when they do not bind (``__init__`` will raise)."""
    signature = inspect.signature(cls.__init__)
    try:
        bound = signature.bind(None, *args, **kwargs)
    except TypeError:
        return None
    bound.apply_defaults()
    named = [p.name for p in signature.parameters.values()
             if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)][2:]  # after self and the parameters
    return {name: bound.arguments[name] for name in named}


def engine_options(arguments: Mapping[str, Any] | None, hyper: Mapping[str, Any]) -> dict[str, Any]:
    """The constructor's arguments that are not the hyperparameters in ``hyper``, with their values."""
    return {k: v for k, v in (arguments or {}).items() if k not in hyper}


def same(value: Any, built: Any) -> bool:
    """Whether a group's ``value`` is the one the optimizer was built with (a bool is only a bool). An
    object of a class with no equality of its own but a ``repr`` that states its settings (a
    ``StatePolicy``) is the same when it prints the same: a checkpoint gives back a copy, not the
    object the optimizer was built with."""
    if value is built:
        return True
    kind = type(value)
    if kind is type(built) and kind.__eq__ is object.__eq__:
        return kind.__repr__ is not object.__repr__ and repr(value) == repr(built)
    try:
        return isinstance(value, bool) == isinstance(built, bool) and bool(value == built)
    except (TypeError, ValueError, RuntimeError):  # == cannot compare (tensors, arrays)
        return False


def check_group_options(optimizer, group: Mapping[str, Any], index: int) -> None:
    """Refuse an engine option in ``group`` whose value is not the one ``optimizer`` was built with."""
    for key, built in getattr(optimizer, "engine_options", {}).items():
        if key in group and not same(group[key], built):
            raise ValueError(
                f"param_groups[{index}] has {key}={group[key]!r}, but {type(optimizer).__name__} was built with"
                f" {key}={built!r}: {key!r} is a constructor keyword, not a param-group hyperparameter, so a"
                f" group may only repeat it (as ZeroRedundancyOptimizer does); allowed in a group: {key}={built!r}"
                f" or no {key!r} key. Hyperparameters a group may set: {sorted(optimizer.hyper_specs)}")


def without_options(optimizer, group: Mapping[str, Any]) -> dict[str, Any]:
    """``group`` without the optimizer's engine options (a new dict)."""
    options = getattr(optimizer, "engine_options", {})
    return {k: v for k, v in group.items() if k not in options}
