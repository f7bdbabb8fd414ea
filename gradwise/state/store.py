"""Encoded buffers in ``optimizer.state``: written, taken out decoded, and told apart by format.

The keys are ``gradwise.core.state_keys``'s: ``"adam.exp_avg@int8-b2048.codes"`` and
``"adam.exp_avg@int8-b2048.absmax"`` hold the int8 codec's parts of the buffer ``"adam.exp_avg"``.
"""
from __future__ import annotations

from typing import Mapping

import torch
from torch import Tensor

from gradwise.core.params import local
from gradwise.core.state_keys import MARK, layout, parts_of
from gradwise.state.codec import Codec, codec_from
from gradwise.state.shards import LocalShard


def store(state: dict[str, Tensor], buffer: str, value: Tensor, codec: Codec | None, signed: bool,
          seed_value: int, shard: LocalShard | None = None) -> None:
    """Put ``value`` into ``state`` as ``buffer``, encoded by ``codec`` (``None``: as it is). With
    ``shard`` (a DTensor parameter's, ``value`` a DTensor like it), the parts are DTensors whose rows
    are the parameter's (``gradwise.state.shards``); encoding them is a collective."""
    if codec is None:
        state[buffer] = value
        return
    x = local(value)
    if shard is None and _zero_bits(x):  # fresh state: its parts are known without encoding
        parts = codec.zeros(x.shape, signed, x.device)
    else:
        parts = codec.empty(x.shape, signed, x.device, shard)
        codec.encode(x, parts, signed, torch.tensor(seed_value, dtype=torch.int64, device=x.device), shard)
    whole = () if shard is None else codec.replicated_parts(shard.shape, signed)
    for part, tensor in parts.items():
        state[f"{buffer}{MARK}{codec.tag}.{part}"] = tensor if shard is None else shard.dtensor(tensor, part in whole)


def _zero_bits(x: Tensor) -> bool:
    """Whether every element of ``x`` is +0 (its bits all zero; -0 is not: bfloat16 keeps its sign)."""
    return x.dim() > 0 and x.is_contiguous() and not x.view(torch.uint8).any()


def take(state: dict[str, Tensor], buffer: str, shape: torch.Size, signed: bool, dtype: torch.dtype,
         shard: LocalShard | None = None) -> Tensor:
    """Remove ``buffer`` from ``state``, decoded if it was encoded (``shape``: the parameter's; with
    ``shard``, a DTensor like the parameter)."""
    if buffer in state:
        return state.pop(buffer)
    tag = next(t for b, t in layout(tuple(state))[1] if b == buffer)
    parts = parts_of(state, buffer, tag)
    for part in parts:
        del state[f"{buffer}{MARK}{tag}.{part}"]
    if shard is None:
        return codec_from(tag).decode(parts, shape, signed, dtype)
    decoded = codec_from(tag).decode({k: local(v) for k, v in parts.items()}, shard.local_shape, signed, dtype, shard)
    return shard.dtensor(decoded)


def stored_as(state: Mapping[str, Tensor], buffer: str) -> str:
    """'fp32' (or the dtype) for a plain buffer, else the codec's tag."""
    if buffer in state:
        return str(state[buffer].dtype).replace("torch.float", "fp")
    return next(t for b, t in layout(tuple(state))[1] if b == buffer)


def local_parts(state: Mapping[str, Tensor], buffer: str, tag: str) -> dict[str, Tensor]:
    """The parts of ``buffer``, each its local tensor (a DTensor parameter's parts are DTensors)."""
    return {part: local(value) for part, value in parts_of(state, buffer, tag).items()}
