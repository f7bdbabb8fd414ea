"""Hyperparameter declarations: name, default, the allowed range, and the error a bad value gets.

A transform declares the param-group entries it reads as ``Hyper`` objects. The optimizer merges them
into its defaults, validates every group against them (at construction, in ``add_param_group`` and
before every step, so a scheduler that produces a NaN learning rate fails loudly and changes nothing),
and hands their values to the transforms as 0-d tensors, so a changing value never recompiles.

The checks are one vocabulary, used for hyperparameters and for any other argument: ``number_in``,
``int_in``, ``choice``, ``either``, ``optional``, ``sequence_of`` and ``boolean``, with the common ones
named (``positive``, ``non_negative``, ``unit_interval``, ``positive_int``, ``betas_pair``, ...). Each is
called as ``check(name, value)`` and refuses a value with one kind of message,
``invalid NAME=VALUE: expected WHAT``.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any, Callable

import torch


def _as_float(value: Any) -> float | None:
    if type(value) is float:  # (what a scheduler sets every step: no ABC check)
        return value
    if isinstance(value, bool):
        return None
    if isinstance(value, torch.Tensor):
        return float(value.item()) if value.numel() == 1 else None
    if isinstance(value, numbers.Real):  # int, float, and NumPy's scalars (np.float32 is no float)
        return float(value)
    return None


def _as_int(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):  # int and NumPy's integers
        return None
    return int(value)


def _shown(option: Any) -> str:
    """An option as a message shows it: as Python writes it, and math.inf for inf."""
    if isinstance(option, float) and math.isinf(option):
        return "math.inf" if option > 0 else "-math.inf"
    return repr(option)


def _bound(x: float) -> str:
    """A finite bound as a message shows it: 0 for 0.0, 1e-08 as it is."""
    return repr(int(x)) if float(x).is_integer() else repr(x)


class Check:
    """A check of one value: ``check(name, value)`` raises ``error`` with the message
    ``invalid NAME=VALUE: expected <expected>`` unless ``accepts(value)``, and returns ``value``, so a
    caller can check a value and use it in one expression. The checks are frozen dataclasses: equal
    when their fields are (``chain`` and ``route`` compare declarations), and picklable with an
    optimizer."""

    error: type[Exception] = ValueError

    def accepts(self, value: Any) -> bool:
        raise NotImplementedError

    @property
    def expected(self) -> str:
        raise NotImplementedError

    def __call__(self, name: str, value: Any) -> Any:
        if not self.accepts(value):
            raise self.error(f"invalid {name}={value!r}: expected {self.expected}")
        return value


def _noted(text: str, note: str) -> str:
    return f"{text} ({note})" if note else text


@dataclass(frozen=True)
class number_in(Check):  # noqa: N801 - checks are named like the functions they replace
    """A real number (a Python or NumPy number, or a one-element tensor; not a bool) from ``low`` to
    ``high``, each end included unless ``open_low`` or ``open_high``; an infinite end (the default)
    asks for a finite number. ``note`` says what the number is, in the message."""

    low: float = -math.inf
    high: float = math.inf
    open_low: bool = False
    open_high: bool = False
    note: str = ""

    def accepts(self, value: Any) -> bool:
        x = _as_float(value)
        return (x is not None and math.isfinite(x) and (self.low < x if self.open_low else self.low <= x)
                and (x < self.high if self.open_high else x <= self.high))

    @property
    def expected(self) -> str:
        low, high = math.isfinite(self.low), math.isfinite(self.high)
        if low and high:
            text = (f"a number in {'(' if self.open_low else '['}{_bound(self.low)}, {_bound(self.high)}"
                    f"{')' if self.open_high else ']'}")
        elif low:
            text = f"a finite number {'>' if self.open_low else '>='} {_bound(self.low)}"
        elif high:
            text = f"a finite number {'<' if self.open_high else '<='} {_bound(self.high)}"
        else:
            text = "a finite number"
        return _noted(text, self.note)


@dataclass(frozen=True)
class int_in(Check):  # noqa: N801
    """An integer (a Python or NumPy integer; not a bool) from ``low`` to ``high`` (None: no bound)."""

    low: int
    high: int | None = None
    note: str = ""

    def accepts(self, value: Any) -> bool:
        x = _as_int(value)
        return x is not None and self.low <= x and (self.high is None or x <= self.high)

    @property
    def expected(self) -> str:
        text = f"an integer >= {self.low}" if self.high is None else f"an integer in [{self.low}, {self.high}]"
        return _noted(text, self.note)


@dataclass(frozen=True)
class choice(Check):  # noqa: N801
    """One of ``options`` (compared with ``==``; a bool matches only a bool)."""

    options: tuple[Any, ...]
    note: str = ""

    def accepts(self, value: Any) -> bool:
        try:
            return any(value is o or (isinstance(value, bool) == isinstance(o, bool) and bool(value == o))
                       for o in self.options)
        except (TypeError, ValueError, RuntimeError):  # a value == cannot compare (an array, a tensor)
            return False

    @property
    def expected(self) -> str:
        shown = [_shown(o) for o in self.options]
        return _noted(shown[0] if len(shown) == 1 else f"one of [{', '.join(shown)}]", self.note)


@dataclass(frozen=True, init=False)
class either(Check):  # noqa: N801
    """A value that one of ``alternatives`` accepts."""

    alternatives: tuple[Check, ...]

    def __init__(self, *alternatives: Check) -> None:
        object.__setattr__(self, "alternatives", alternatives)

    def accepts(self, value: Any) -> bool:
        return any(a.accepts(value) for a in self.alternatives)

    @property
    def expected(self) -> str:
        texts = [a.expected for a in self.alternatives]
        return texts[0] if len(texts) == 1 else f"{', '.join(texts[:-1])} or {texts[-1]}"


def optional(check: Check, meaning: str = "") -> either:
    """None (which means ``meaning``) or a value ``check`` accepts."""
    return either(choice((None,), meaning), check)


@dataclass(frozen=True)
class sequence_of(Check):  # noqa: N801
    """A tuple or list of ``len(parts)`` entries, ``names`` naming them, entry i checked by ``parts[i]``;
    a bad entry gets ``invalid NAME[i]=ENTRY in NAME=VALUE: expected ...``."""

    parts: tuple[Check, ...]
    names: tuple[str, ...]

    def accepts(self, value: Any) -> bool:
        return (isinstance(value, (tuple, list)) and len(value) == len(self.parts)
                and all(p.accepts(v) for p, v in zip(self.parts, value)))

    @property
    def expected(self) -> str:
        size = {2: "a pair", 3: "a triple"}.get(len(self.parts), f"{len(self.parts)} entries")
        texts = [p.expected for p in self.parts]
        if len(set(texts)) == 1:
            each = texts[0].replace("a number in ", "in ", 1) if texts[0].startswith("a number in ") else texts[0]
            return f"{size} ({', '.join(self.names)}), each {each}"
        return f"{size} ({', '.join(self.names)}): " + ", ".join(f"{n} {t}" for n, t in zip(self.names, texts))

    def __call__(self, name: str, value: Any) -> Any:
        if not isinstance(value, (tuple, list)) or len(value) != len(self.parts):
            raise ValueError(f"invalid {name}={value!r}: expected {self.expected}")
        for i, (part, entry) in enumerate(zip(self.parts, value)):
            if not part.accepts(entry):
                raise part.error(f"invalid {name}[{i}]={entry!r} in {name}={tuple(value)!r}: expected {part.expected}")
        return value


@dataclass(frozen=True)
class Boolean(Check):
    """True or False (a TypeError otherwise, as for a flag of the wrong type)."""

    error = TypeError

    def accepts(self, value: Any) -> bool:
        return isinstance(value, bool)

    @property
    def expected(self) -> str:
        return "True or False"


boolean = Boolean()
positive = number_in(0, open_low=True)
non_negative = number_in(0)
negative = number_in(high=0, open_high=True)
non_positive = number_in(high=0)
unit_interval = number_in(0, 1, open_high=True)
closed_unit_interval = number_in(0, 1)
open_unit_interval = number_in(0, 1, open_low=True, open_high=True)
positive_int = int_in(1)
non_negative_int = int_in(0)
betas_pair = sequence_of((unit_interval, unit_interval), ("beta1", "beta2"))


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
