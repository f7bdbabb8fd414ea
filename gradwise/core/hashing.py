"""Reproducible random bits for stochastic rounding, with no generator state to save.

``hash32(index, seed)`` is a counter-based hash: element ``index`` of a tensor gets the same bits in
eager pieces, compiled flat views and a resumed run. ``seed(step, position, buffer)`` makes the seed a
function of the step, the parameter's position and the buffer's name, so every buffer of every step
draws its own bits. Stochastic rounding of parameters (``gradwise.core.rounding``) and of encoded
state (``gradwise.state``: int8 and int4 codes) draw from both; bf16 values take ``seed`` with one
multiplicative hash of their own (``gradwise.state.bf16``: one multiplication an element).
"""
from __future__ import annotations

import zlib

import torch
from torch import Tensor

_MASK32 = 0xFFFFFFFF


def hash32(index: Tensor, seed: Tensor) -> Tensor:
    """A 32-bit integer hash of ``index ^ seed``: two rounds of xor-shift-multiply, computed in int32
    (wrapping multiplication, shifts masked to logical ones), so the compiled CPU loop runs it in
    full-width integer vectors. Returns the hash's bit pattern as int32; ``& 0xFFFF`` of it, or
    ``unsigned(h)``, read it as the unsigned 32-bit value."""
    h = index.to(torch.int32) ^ seed.to(torch.int32)
    h = (((h >> 16) & 0xFFFF) ^ h) * 0x45D9F3B
    h = (((h >> 16) & 0xFFFF) ^ h) * 0x45D9F3B
    return ((h >> 16) & 0xFFFF) ^ h


def element_index(x: Tensor, start: int | Tensor = 0) -> Tensor:
    """The logical index of each element of ``x`` (int32, shaped like it), which its random bits hash: ``start``
    (the index of ``x``'s first element, a shard's offset; an int or a 0-d integer tensor) plus its flat index;
    or, for ``rows x width`` runs of several parameters stacked (``gradwise.state.joined``), ``start`` a
    ``(rows, 1)`` tensor of each row's first index, plus the element's column."""
    if isinstance(start, Tensor) and start.dim() == 2:
        return start.to(torch.int32) + torch.arange(x.shape[-1], device=x.device, dtype=torch.int32)
    return (torch.arange(x.numel(), device=x.device, dtype=torch.int32) + start).view(x.shape)


def unsigned(h: Tensor) -> Tensor:
    """An int32 bit pattern as the unsigned value it stands for (int64)."""
    return h.to(torch.int64) & _MASK32


def seed(step: int, position: int, buffer: str) -> int:
    """The stochastic-rounding seed of one buffer at one step: reproducible, distinct per buffer."""
    return zlib.crc32(f"{step}:{position}:{buffer}".encode()) & 0x7FFFFFFF
