"""Encoded buffers in ``optimizer.state``: written, taken out decoded, and told apart by format.

The keys are ``gradwise.core.state_keys``'s: ``"adam.exp_avg@int8-b2048.codes"`` and
``"adam.exp_avg@int8-b2048.absmax"`` hold the int8 codec's parts of the buffer ``"adam.exp_avg"``.
"""
from __future__ import annotations

from typing import Mapping

import torch
from torch import Tensor

from gradwise.core.state_keys import MARK, layout, parts_of
from gradwise.state.codec import Codec, codec_from


def store(state: dict[str, Tensor], buffer: str, value: Tensor, codec: Codec | None, signed: bool,
          seed_value: int) -> None:
    """Put ``value`` into ``state`` as ``buffer``, encoded by ``codec`` (``None``: as it is)."""
    if codec is None:
        state[buffer] = value
        return
    parts = codec.empty(value.shape, signed, value.device)
    codec.encode(value, parts, signed, torch.tensor(seed_value, dtype=torch.int64, device=value.device))
    for part, tensor in parts.items():
        state[f"{buffer}{MARK}{codec.tag}.{part}"] = tensor


def take(state: dict[str, Tensor], buffer: str, shape: torch.Size, signed: bool, dtype: torch.dtype) -> Tensor:
    """Remove ``buffer`` from ``state``, decoded if it was encoded."""
    if buffer in state:
        return state.pop(buffer)
    tag = next(t for b, t in layout(tuple(state))[1] if b == buffer)
    parts = parts_of(state, buffer, tag)
    for part in parts:
        del state[f"{buffer}{MARK}{tag}.{part}"]
    return codec_from(tag).decode(parts, shape, signed, dtype)


def stored_as(state: Mapping[str, Tensor], buffer: str) -> str:
    """'fp32' (or the dtype) for a plain buffer, else the codec's tag."""
    if buffer in state:
        return str(state[buffer].dtype).replace("torch.float", "fp")
    return next(t for b, t in layout(tuple(state))[1] if b == buffer)
