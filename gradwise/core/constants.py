"""A step's packed constants, written in place into buffers kept between steps (CPU buckets).

Every bucket's hyperparameters and per-step scalars travel packed in one 1-D tensor (``executor.flatten``),
which the eager path takes apart into 0-d views (``executor.unpack``). Made anew each step, that is a
``torch.tensor`` from a Python list and an ``unbind``: tens of microseconds a bucket, more than the
arithmetic of a small model's step. On the CPU, ``ConstantBuffers`` keeps one buffer per bucket slot
(the group and the bucket's place in it), a tensor over a Python ``array``'s memory: a step writes the new
numbers into it (one C-level copy, each double rounded to the buffer's dtype as ``torch.tensor`` rounds
it) and its 0-d views, made once, read them. A slot whose layout or dtype changed gets a new buffer.
Values are read only during the step that wrote them (CPU ops are synchronous), so no step sees another's.
"""
from __future__ import annotations

import array
import weakref
from typing import Any, Mapping

import torch
from torch import Tensor

from gradwise.core.executor import Layout, flatten, forget_unpacked, keep_unpacked

#: the ``array`` type code of each dtype a CPU buffer may have
_CODES = {torch.float32: "f", torch.float64: "d"}


class ConstantBuffers:
    """Buffers of packed constants, one per bucket slot, kept between steps."""

    def __init__(self) -> None:
        self._slots: dict[Any, _Buffer] = {}
        weakref.finalize(self, _forget, self._slots)  # the unpacked views of its buffers go with it

    def pack(self, slot: Any, hyper: Mapping[str, Any], scalars: Mapping[str, float], dtype: torch.dtype,
             device: torch.device) -> tuple[Tensor, Layout]:
        """``(values, layout)``: the constants in one 1-D tensor of ``dtype`` on ``device``, the slot's buffer
        where that is the CPU, else a new tensor."""
        layout, flat = flatten(hyper, scalars)
        if device.type != "cpu" or dtype not in _CODES:
            return torch.tensor(flat, dtype=dtype, device=device), layout
        buffer = self._slots.get(slot)
        if buffer is None or buffer.layout != layout or buffer.dtype != dtype:
            if buffer is not None:
                forget_unpacked(buffer.values)
            buffer = self._slots[slot] = _Buffer(layout, dtype, len(flat))
        buffer.write(flat)
        return buffer.values, layout


class _Buffer:
    def __init__(self, layout: Layout, dtype: torch.dtype, size: int):
        self.layout, self.dtype = layout, dtype
        self._code = _CODES[dtype]
        self._array = array.array(self._code, bytes(size * array.array(self._code).itemsize))
        self._view = memoryview(self._array)
        self.values = torch.frombuffer(self._array, dtype=dtype) if size else torch.empty(0, dtype=dtype)
        keep_unpacked(self.values, layout)

    def write(self, flat: list[float]) -> None:
        self._view[:] = array.array(self._code, flat)


def _forget(slots: dict[Any, _Buffer]) -> None:
    for buffer in slots.values():
        forget_unpacked(buffer.values)
