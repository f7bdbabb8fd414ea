"""How encoded buffers live in ``optimizer.state``: plain tensors under self-describing keys.

A buffer ``"adam.exp_avg"`` kept by the int8 codec is stored as ``"adam.exp_avg@int8-b2048.codes"``
and ``"adam.exp_avg@int8-b2048.absmax"``: plain tensors, so ``state_dict()`` carries them exactly and
a checkpoint says by itself how to read it back, whatever optimizer loads it.
"""
from __future__ import annotations

import zlib
from functools import lru_cache
from typing import Mapping

import torch
from torch import Tensor

from gradwise.state.codec import Codec, codec_from

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
    prefix = f"{buffer}{MARK}{tag}."
    return {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}


def has_buffer(state: Mapping[str, Tensor], buffer: str) -> bool:
    return buffer in state or any(b == buffer for b, _ in layout(tuple(state))[1])


def seed(step: int, position: int, buffer: str) -> int:
    """The stochastic-rounding seed of one buffer at one step: reproducible, distinct per buffer."""
    return zlib.crc32(f"{step}:{position}:{buffer}".encode()) & 0x7FFFFFFF


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
