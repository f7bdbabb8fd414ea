"""bfloat16 storage with stochastic rounding on write.

Round-to-nearest into bfloat16 loses an update smaller than half a unit in the last place of the
stored value every single step: a second moment with b2 = 0.999 then stops moving. Stochastic
rounding rounds up with probability equal to the dropped fraction, so the stored value is unbiased
(Gupta et al., "Deep Learning with Limited Numerical Precision", ICML 2015; Zamirai et al., 2020).
The random bits come from a hash of (element index, seed), and the optimizer's seed is
a function of the step, the parameter's position and the buffer's name: a run is reproducible and a
resumed run is bit-identical without saving any generator state, eager or compiled alike.
A parameter's two bf16 buffers (Adam's moments) share their memory as 32-bit words, which the
compiled CPU step reads and writes whole (``gradwise.state.bf16_pairs``).
"""
from __future__ import annotations

import torch
from torch import Tensor

from gradwise.core.hashing import element_index
from gradwise.state.codec import Codec, alias

#: float32's quiet-NaN bit, in bfloat16's half
_QUIET = 1 << 22
#: 2^32 / golden ratio, odd, as int32: the multiplier of Knuth's multiplicative hash
_GOLDEN = 0x9E3779B1 - (1 << 32)
#: elements per group of a run's index (one 8-lane float32 vector), and the run width the codec asks for
RUN = 8


def stochastic_bf16_bits(x: Tensor, seed: Tensor, index: Tensor) -> Tensor:
    """The bits of ``x`` (float32) rounded to bfloat16, up or down with probabilities that make it
    unbiased, as int32 (the bfloat16 bits in the high half, the low half zero): ``x``'s bits plus 16
    random bits, the low half then dropped. The random bits are the high half of Knuth's multiplicative
    hash of ``index ^ seed``: for each element, uniform over the step's seed, one multiplication (where
    ``hash32``'s two rounds made the compiled CPU loop compute-bound). ``index``: each
    element's logical index in its buffer (int32, shaped like ``x``: ``element_index`` or
    ``run_index``). A value past bfloat16's largest finite one may round up to inf, as rounding to
    nearest does past half a unit beyond it; inf stays inf, and a NaN stays a NaN (its quiet bit set,
    which no dropped half can clear). (Adding at most 0xFFFF to the bits of a finite float32 never
    overflows int32: a carry only moves the value up to the next bfloat16.)"""
    bits = x.contiguous().view(torch.int32)
    if torch.compiler.is_compiling():
        noise = ((index ^ seed.to(torch.int32)) * _GOLDEN >> 16) & 0xFFFF
        return torch.where(x == x, (bits + noise) & ~0xFFFF, bits | _QUIET)
    # eagerly, the same operations in place on one temporary: each new tensor past glibc's mmap threshold
    # (128 KiB) is fresh pages, faulted in by the operation that writes it (5x the time at 128K elements)
    rounded = index ^ seed.to(torch.int32)
    rounded.mul_(_GOLDEN).bitwise_right_shift_(16).bitwise_and_(0xFFFF).add_(bits).bitwise_and_(~0xFFFF)
    return torch.where(x == x, rounded, bits | _QUIET, out=rounded)


def run_index(x: Tensor, start: Tensor) -> Tensor:
    """``element_index`` of a run (``gradwise.state.runs``: ``rows x width``, its first element
    ``start``, a multiple of ``RUN``) as groups of ``RUN`` elements: a group's first index plus the
    lanes ``0 .. RUN - 1``. Compiled, a group's index is one number per vector and the lanes a
    constant, where the flat index is built lane by lane at every vector (inductor's ``arange``); a
    run of fewer than ``RUN`` elements a row, and stacked runs (``start`` one index a row), are indexed
    by ``element_index``."""
    rows, width = x.shape
    if width % RUN or start.dim() == 2:
        return element_index(x, start)
    groups = torch.arange(rows * width // RUN, device=x.device, dtype=torch.int32).view(rows, width // RUN, 1)
    lanes = torch.arange(RUN, device=x.device, dtype=torch.int32)
    return (groups * RUN + start + lanes).view(rows, width)


def round_to_bf16_stochastically(x: Tensor, seed: Tensor, index: Tensor) -> Tensor:
    """``x`` (float32) rounded to bfloat16 as ``stochastic_bf16_bits`` rounds it."""
    return stochastic_bf16_bits(x, seed, index).view(torch.float32).to(torch.bfloat16)


class BF16(Codec):
    """2 bytes per element; float32 values rounded stochastically to bfloat16."""

    name = "bf16"

    def empty(self, shape, signed, device, shard=None):
        return {"value": torch.zeros(shape, dtype=torch.bfloat16, device=device)}

    def zeros(self, shape, signed, device):
        return self.empty(shape, signed, device)  # zero rounds to zero, whatever the bits drawn

    def encode(self, x, parts, signed, seed, shard=None):
        start = 0 if shard is None else shard.offset
        parts["value"].copy_(round_to_bf16_stochastically(x.float(), seed, element_index(x, start)))

    def decode(self, parts, shape, signed, dtype, shard=None):
        return parts["value"].to(dtype)

    def run_width(self, shape, signed):
        return RUN

    def run_parts(self, parts, start, stop, rows):
        value = parts["value"]  # contiguous, or one half of a pair's words (``bf16_pairs``): every other bfloat16
        return {"value": alias(value, start, (rows, (stop - start) // rows), 1 if value.is_contiguous() else 2)}

    def decode_run(self, parts, signed, dtype):
        return parts["value"].to(dtype)

    def encode_run(self, x, parts, signed, seed, start):
        # elementwise: in place
        parts["value"].copy_(round_to_bf16_stochastically(x.float(), seed, run_index(x, start)))
        return {}
