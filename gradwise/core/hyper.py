"""Hyperparameter declarations: name, default, the allowed range, and the error a bad value gets.

A transform declares the param-group entries it reads as ``Hyper`` objects. The optimizer merges them
into its defaults, validates every group against them (at construction, in ``add_param_group`` and
before every step, so a scheduler that produces a NaN learning rate fails loudly and changes nothing),
and hands their values to the transforms as 0-d tensors, so a changing value never recompiles.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any, Callable

import torch


def _as_float(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, torch.Tensor):
        return float(value.item()) if value.numel() == 1 else None
    if isinstance(value, numbers.Real):  # int, float, and NumPy's scalars (np.float32 is no float)
        return float(value)
    return None


def non_negative(name: str, value: Any) -> None:
    x = _as_float(value)
    if x is None or not math.isfinite(x) or x < 0:
        raise ValueError(f"invalid {name}={value!r}: expected a finite number >= 0")


def positive(name: str, value: Any) -> None:
    x = _as_float(value)
    if x is None or not math.isfinite(x) or x <= 0:
        raise ValueError(f"invalid {name}={value!r}: expected a finite number > 0")


def unit_interval(name: str, value: Any) -> None:
    x = _as_float(value)
    if x is None or not 0.0 <= x < 1.0:
        raise ValueError(f"invalid {name}={value!r}: expected a number in [0, 1)")


def closed_unit_interval(name: str, value: Any) -> None:
    x = _as_float(value)
    if x is None or not 0.0 <= x <= 1.0:
        raise ValueError(f"invalid {name}={value!r}: expected a number in [0, 1]")


def betas_pair(name: str, value: Any) -> None:
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        raise ValueError(f"invalid {name}={value!r}: expected a pair (beta1, beta2), each in [0, 1)")
    for i, beta in enumerate(value):
        x = _as_float(beta)
        if x is None or not 0.0 <= x < 1.0:
            raise ValueError(f"invalid {name}[{i}]={beta!r} in {name}={tuple(value)!r}: expected a number in [0, 1)")


def boolean(name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"invalid {name}={value!r}: expected True or False")


@dataclass(frozen=True)
class choice:  # noqa: N801 - used like the other checks, a function of (name, value)
    """A check that a value is one of ``options`` (a class, not a closure, so optimizers pickle)."""

    options: tuple[Any, ...]

    def __call__(self, name: str, value: Any) -> None:
        if value not in self.options:
            raise ValueError(f"invalid {name}={value!r}: expected one of {list(self.options)}")


@dataclass(frozen=True)
class Hyper:
    """One hyperparameter a transform reads from its param group.

    ``static`` values (booleans) are passed to the step as Python values: changing one recompiles.
    All others are numbers (or tuples of numbers) passed as 0-d tensors. ``zero_is_identity`` says
    that the value 0 switches the transform off, so the step skips it (and its state) when it is 0.
    """

    default: Any
    check: Callable[[str, Any], None]
    static: bool = False
    zero_is_identity: bool = False

    def validate(self, name: str, value: Any) -> None:
        self.check(name, value)


def likely_misspelling(key: Any, names) -> str | None:
    """The one of ``names`` that ``key`` is one edit away from (a letter inserted, dropped, changed, or
    two neighbours swapped: ``weight_decy`` for ``weight_decay``), or None; ``key`` itself and keys of
    fewer than three letters (too short to tell a typo from a key of the user's own) give None."""
    if not isinstance(key, str) or len(key) < 3 or key in names:
        return None
    return next((name for name in sorted(names) if _one_edit_apart(key, name)), None)


def _one_edit_apart(a: str, b: str) -> bool:
    if abs(len(a) - len(b)) > 1:
        return False
    if len(a) == len(b):
        diffs = [i for i, (x, y) in enumerate(zip(a, b)) if x != y]
        return len(diffs) == 1 or (len(diffs) == 2 and diffs[1] == diffs[0] + 1
                                   and a[diffs[0]] == b[diffs[1]] and a[diffs[1]] == b[diffs[0]])
    short, long = sorted((a, b), key=len)
    i = next((j for j, (x, y) in enumerate(zip(short, long)) if x != y), len(short))
    return short[i:] == long[i + 1:]
