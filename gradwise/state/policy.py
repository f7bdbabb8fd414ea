"""The precision policy: which codec stores each parameter's state buffers.

``AdamW(params, state="int8")`` is ``StatePolicy("int8")``: every parameter of at least ``min_numel``
elements keeps its param-shaped buffers in int8, smaller ones (biases, norms: a negligible share of
the memory, a large share of the sensitivity) stay float32. Rules, tried in order before that, map a
regular expression searched in the parameter's name to a codec::

    StatePolicy("int4", rules={r"wte|wpe|embed": "fp32", r"lm_head": "int8"})

Names come from ``model.named_parameters()``. The decision is taken on the logical tensor (a DTensor's
global shape), so every rank of a sharded model decides alike.
"""
from __future__ import annotations

import re
from typing import Any, Iterable, Mapping

import torch

from gradwise.core.hyper import non_negative_int
from gradwise.state.codec import Codec, codec_from

#: parameters with fewer elements keep float32 state unless a rule says otherwise.
MIN_NUMEL = 4096


class StatePolicy:
    """Pick a codec (``None``: float32) per parameter from its name, shape and size.

    Args:
        default: codec for parameters no rule matches: ``"fp32"``, ``"bf16"``, ``"int8"``, ``"int4"``, ``"fp8"``,
            a tag such as ``"int8-b256"`` or a codec object.
        rules: ``{pattern: codec}`` or ``[(pattern, codec), ...]``; the first pattern found
            (``re.search``) in a parameter's name decides, whatever the size.
        min_numel: parameters with fewer elements that no rule matches stay float32.
    """

    def __init__(self, default: Any = "int8", *, rules: Mapping[str, Any] | Iterable[tuple[str, Any]] = (),
                 min_numel: int = MIN_NUMEL):
        self.default = codec_from(default, "default")
        self.min_numel = non_negative_int("min_numel", min_numel)
        items = rules.items() if isinstance(rules, Mapping) else rules
        self.rules: list[tuple[re.Pattern, Codec | None]] = []
        for entry in items:
            if not (isinstance(entry, tuple) and len(entry) == 2 and isinstance(entry[0], str)):
                raise TypeError(f"invalid rules entry {entry!r}: expected (name pattern, codec)")
            pattern, spec = entry
            try:
                compiled = re.compile(pattern)
            except re.error as error:
                raise ValueError(f"invalid rules pattern {pattern!r}: {error}") from None
            self.rules.append((compiled, codec_from(spec, f"rules[{pattern!r}]")))

    def codec_for(self, name: str | None, shape: torch.Size) -> Codec | None:
        for pattern, codec in self.rules:
            if name is not None and pattern.search(name):
                return codec
        return None if shape.numel() < self.min_numel else self.default

    def check_matches(self, names: list[str | None]) -> None:
        """Every rule must match some parameter: a rule that matches nothing is a typo, not a choice."""
        known = [n for n in names if n is not None]
        for pattern, _ in self.rules:
            if not any(pattern.search(n) for n in known):
                hint = (f"parameter names: {known[:8]}{' ...' if len(known) > 8 else ''}" if known else
                        "no parameter has a name: pass model.named_parameters() to the optimizer")
                raise ValueError(f"state policy rule {pattern.pattern!r} matches no parameter; {hint}")

    def __repr__(self) -> str:
        rules = ", ".join(f"{p.pattern!r}: {c or 'fp32'}" for p, c in self.rules)
        return f"StatePolicy({self.default or 'fp32'}, rules={{{rules}}}, min_numel={self.min_numel})"


def policy_from(state: Any) -> StatePolicy | None:
    """The optimizer's ``state=`` argument as a policy; ``None`` when every buffer stays as it is."""
    if state is None:
        return None
    if isinstance(state, StatePolicy):
        return state
    if isinstance(state, (str, Codec)):
        return StatePolicy(codec_from(state))
    raise TypeError(f"invalid state={state!r}: expected a codec name ('fp32', 'bf16', 'int8', 'int4', 'fp8'),"
                    " a codec, or a gradwise.state.StatePolicy")
