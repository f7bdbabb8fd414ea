"""Two bfloat16 buffers of a parameter in one array of 32-bit words, for the compiled CPU step.

A parameter's two ``bf16`` buffers (Adam's moments) are stored interleaved: one bfloat16 array of
the parameter's shape times 2, the first buffer the high half of each 32-bit word, the second the
low half (``words[..., 1]`` and ``words[..., 0]``, little-endian). Each buffer's part is a view
into it, shaped like the parameter: everything that reads or writes one buffer (eager steps,
``state_dict``, conversions, estimates) works on it as before, and a checkpoint holds the very
values; only the memory is shared.

The compiled step on runs of the flat buffer (``gradwise.state.runs``) then reads both buffers as
one float32-sized word per element (``words``: the storage seen as float32) and takes them apart in
integer arithmetic, ``hi = w & 0xFFFF0000`` and ``lo = w << 16``, both exact float32 values, and
writes the word back the same way. Inductor's CPU backend loads and stores float32 vectors
whole, while on a CPU without AVX-512 it moves each 8-lane bfloat16 vector through a stack buffer,
a store-to-load stall per vector (README: the AdamW-bf16 row). The stored bits are those of
``gradwise.state.bf16``'s stochastic rounding with each buffer's own seed: the same result, bit
for bit, whichever way a buffer is read or written (NaN aside: any NaN stays a NaN in its element).
"""
from __future__ import annotations

from typing import Mapping

import torch
from torch import Tensor

from gradwise.core.state_keys import MARK, layout
from gradwise.state.bf16 import BF16, run_index, stochastic_bf16_bits

TAG = BF16.name
#: a bfloat16 value's bits as the high half of an int32 word
HIGH = -(1 << 16)


def pair_buffers(state: dict[str, Tensor]) -> None:
    """Store a parameter's ``bf16`` buffers two by two (in the state's order) in shared words where
    they are not yet: each pair of plain (not DTensor) parts of one shape and device, of at least
    two elements, is copied into a new interleaved array and its views replace them in ``state``."""
    loose = []
    for buffer, tag in layout(tuple(state))[1]:
        if tag != TAG:
            continue
        value = state[f"{buffer}{MARK}{TAG}.value"]
        if type(value) is Tensor and value.numel() >= 2 and partner_of(value) is None:
            loose.append((buffer, value))
    while len(loose) >= 2:
        (first, a), (second, b) = loose[0], loose[1]
        if a.shape != b.shape or a.device != b.device:
            loose.pop(0)
            continue
        words = torch.empty((*a.shape, 2), dtype=torch.bfloat16, device=a.device)
        words[..., 1].copy_(a)
        words[..., 0].copy_(b)
        state[f"{first}{MARK}{TAG}.value"] = words[..., 1]
        state[f"{second}{MARK}{TAG}.value"] = words[..., 0]
        del loose[:2]


def partner_of(value: Tensor) -> bool | None:
    """For a view made by ``pair_buffers``: True for the high half (the first buffer), False for the
    low; else None."""
    if value.dtype != torch.bfloat16 or value.numel() < 2:
        return None
    expected = 2
    for size, stride in zip(reversed(value.shape), reversed(value.stride())):
        if size > 1 and stride != expected:
            return None
        expected *= size
    return value.storage_offset() % 2 == 1


def pairs_in(specs, parts: Mapping[str, Mapping[str, Tensor]]) -> tuple[tuple[int, int], ...]:
    """``(i, j)`` for each pair of ``specs`` (``(buffer, codec, signed)``) whose ``bf16`` values are the
    high and low halves of the same words: indices into ``specs``."""
    halves: dict[tuple[int, int], dict[bool, int]] = {}
    for i, (buffer, codec, _) in enumerate(specs):
        if codec.tag != TAG:
            continue
        value = parts[buffer]["value"]
        high = partner_of(value)
        if high is not None:
            key = (value.untyped_storage().data_ptr(), value.storage_offset() - high)
            halves.setdefault(key, {})[high] = i
    return tuple((found[True], found[False]) for found in halves.values() if len(found) == 2)


def words_run(high: Tensor, start: int, shape: tuple[int, int]) -> Tensor:
    """The words of a pair (``high``: its first buffer's view) holding elements ``start`` on of the flat
    buffer, as a contiguous float32 tensor of ``shape`` over their memory."""
    offset = (high.storage_offset() - 1) // 2 + start
    stride = (shape[1], 1)
    return torch.empty(0, dtype=torch.float32, device=high.device).set_(high.untyped_storage(), offset, shape, stride)


def decode_words(words: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """The two buffers' values (high, low) of float32-typed ``words``."""
    w = words.view(torch.int32)
    return (w & HIGH).view(torch.float32).to(dtype), (w << 16).view(torch.float32).to(dtype)


def encode_words(words: Tensor, high: Tensor | None, low: Tensor | None, seeds: tuple[Tensor, Tensor],
                 start: Tensor) -> None:
    """Write the words of a run's new values ``high`` and ``low`` (float; None: that half unchanged;
    ``start``: the run's first element), each rounded stochastically with its buffer's seed as
    ``gradwise.state.bf16`` rounds it."""
    old = words.view(torch.int32)
    index = run_index(words, start)
    top = old & HIGH if high is None else stochastic_bf16_bits(high.float(), seeds[0], index)
    bottom = old & 0xFFFF if low is None else (stochastic_bf16_bits(low.float(), seeds[1], index) >> 16) & 0xFFFF
    words.copy_((top | bottom).view(torch.float32))
