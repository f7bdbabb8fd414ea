"""A group's hyperparameters checked before a step, and again only where they changed.

A learning-rate schedule sets ``lr`` before every step; the other hyperparameters stay as they were. So
``check_hyperparameters`` remembers what it accepted (``Checked``): each value's mark (its type and value,
lists copied so that a change in place is seen) and the group's ``shape_signature`` (what decides the
shapes of its state). At the next step it checks only the values whose mark differs, and recomputes the
signature only when one of those decides shapes (a static hyperparameter, or a ``zero_is_identity`` one,
whose zero drops a buffer). A value with no mark (a tensor, which may change in place) is checked every
time. A refused value is not remembered: it is checked, and refused, at every step until it is fixed.
"""
from __future__ import annotations

from typing import Any, Mapping, NamedTuple


class Checked(NamedTuple):
    """What a group held when ``check_hyperparameters`` accepted it."""

    group: Mapping[str, Any]
    #: each hyperparameter's value as the group held it, in ``hyper_specs`` order
    values: tuple
    #: each value's mark (``_mark``), None for a value checked every time
    marks: tuple
    #: ``shape_signature`` of the group then
    signature: tuple


def shape_signature(optimizer, group: Mapping[str, Any]) -> tuple:
    """What decides the shapes of a group's state: its static hyperparameters and which
    ``zero_is_identity`` ones are zero (``trace`` keeps no buffer without momentum), not the numbers
    a scheduler changes every step."""
    return tuple((k, repr(group[k]) if spec.static else float(group[k]) != 0.0)
                 for k, spec in optimizer.hyper_specs.items() if k in group and (spec.static or spec.zero_is_identity))


def check_hyperparameters(optimizer, group: Mapping[str, Any], last: Checked | None = None) -> Checked:
    """Every hyperparameter the optimizer reads, as ``group`` holds it now (a scheduler may have set it),
    checked where it differs from ``last`` (what this function returned at the group's last accepted
    check; all of them without one, or when ``last`` is another group's). Returns ``last`` itself when
    nothing changed, else what the next check takes as its ``last``."""
    specs = optimizer.hyper_specs
    kept = last is not None and last.group is group
    values, marks, changed = [], [], []
    for i, (key, spec) in enumerate(specs.items()):
        value = group[key]
        if kept and value is last.values[i] and last.marks[i] is not None and type(value) is not list:
            mark = last.marks[i]  # the same immutable object: unchanged (a list may have changed in place)
        else:
            mark = _mark(value)
            if mark is None or not kept or mark != last.marks[i]:
                changed.append((key, spec, value))
        values.append(value)
        marks.append(mark)
    if not changed:
        return last
    for key, spec, value in changed:
        spec.validate(key, value)
    shaping = not kept or any(spec.static or spec.zero_is_identity for _, spec, _ in changed)
    return Checked(group, tuple(values), tuple(marks), shape_signature(optimizer, group) if shaping else last.signature)


_PLAIN = (bool, int, float, str, type(None))


def _mark(value: Any) -> tuple | None:
    """``(type, value)`` of a plain value (a tuple or list of them: their marks as a tuple, so that ``1`` is not
    ``True`` and a list changed in place differs from its copy), or None for any other value."""
    kind = type(value)
    if kind in _PLAIN:
        return kind, value
    if kind in (tuple, list) and all(type(v) in _PLAIN for v in value):
        return kind, tuple((type(v), v) for v in value)
    return None
