"""How buffers are named in ``optimizer.state``: plain keys, and the parts of an encoded buffer.

A buffer ``"adam.exp_avg"`` kept by the int8 codec is stored as ``"adam.exp_avg@int8-b2048.codes"``
and ``"adam.exp_avg@int8-b2048.absmax"``: plain tensors under self-describing keys, so ``state_dict()``
carries them exactly and a checkpoint says by itself how to read it back. The engine reads the keys
(which buffers a parameter has, which are encoded) without knowing any codec; ``gradwise.state``
writes and decodes the parts.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Mapping

from torch import Tensor

MARK = "@"


@lru_cache(maxsize=4096)
def layout(keys: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[tuple[str, str], ...]]:
    """(plain keys, ((buffer, tag), ...) of the encoded buffers) of a state dict's keys."""
    plain, encoded = [], {}
    for key in keys:
        if MARK in key:
            buffer, rest = key.split(MARK, 1)
            encoded.setdefault((buffer, rest.split(".", 1)[0]), None)
        else:
            plain.append(key)
    return tuple(plain), tuple(encoded)


def parts_of(state: Mapping[str, Tensor], buffer: str, tag: str) -> dict[str, Tensor]:
    """The parts of ``buffer`` encoded as ``tag``, by part name (``{"codes": ..., "absmax": ...}``)."""
    prefix = f"{buffer}{MARK}{tag}."
    return {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}


def has_buffer(state: Mapping[str, Tensor], buffer: str) -> bool:
    """Whether ``state`` holds ``buffer``, plain or encoded."""
    return buffer in state or any(b == buffer for b, _ in layout(tuple(state))[1])
