"""bfloat16 storage with stochastic rounding on write.

Round-to-nearest into bfloat16 loses an update smaller than half a unit in the last place of the
stored value every single step: a second moment with b2 = 0.999 then stops moving. Stochastic
rounding rounds up with probability equal to the dropped fraction, so the stored value is unbiased
(Gupta et al., "Deep Learning with Limited Numerical Precision", ICML 2015; Zamirai et al., 2020).
The random bits come from a counter-based hash of (element index, seed), and the optimizer's seed is
a function of the step, the parameter's position and the buffer's name: a run is reproducible and a
resumed run is bit-identical without saving any generator state, eager or compiled alike.
"""
from __future__ import annotations

import torch
from torch import Tensor

from gradwise.core.hashing import hash32
from gradwise.state.codec import Codec, alias


def round_to_bf16_stochastically(x: Tensor, seed: Tensor, start: int = 0) -> Tensor:
    """``x`` (float32) rounded to bfloat16, up or down with probabilities that make it unbiased.
    NaN and inf pass through unchanged. ``start``: the logical index of ``x``'s first element (a
    shard's offset; an int or a 0-d integer tensor), which the random bits depend on. (Adding at
    most 0xFFFF to the bits of a finite float32 never overflows int32: a carry only moves the value
    up to the next bfloat16.)"""
    bits = x.contiguous().view(torch.int32)
    index = (torch.arange(x.numel(), device=x.device, dtype=torch.int32) + start).view(x.shape)
    noise = hash32(index, seed) & 0xFFFF
    rounded = ((bits + noise) & ~0xFFFF).view(torch.float32)
    # |y| < inf is isfinite(y) (NaN compares false) in one comparison, where compiled isfinite makes two
    finite = (x.abs() < float("inf")) & (rounded.abs() < float("inf"))
    return torch.where(finite, rounded, x).to(torch.bfloat16)


class BF16(Codec):
    """2 bytes per element; float32 values rounded stochastically to bfloat16."""

    name = "bf16"

    def empty(self, shape, signed, device, shard=None):
        return {"value": torch.zeros(shape, dtype=torch.bfloat16, device=device)}

    def encode(self, x, parts, signed, seed, shard=None):
        start = 0 if shard is None else shard.offset
        parts["value"].copy_(round_to_bf16_stochastically(x.float(), seed, start))

    def decode(self, parts, shape, signed, dtype, shard=None):
        return parts["value"].to(dtype)

    def run_width(self, shape, signed):
        return 1

    def run_parts(self, parts, start, stop, rows):
        return {"value": alias(parts["value"], start, (rows, (stop - start) // rows))}

    def decode_run(self, parts, signed, dtype):
        return parts["value"].to(dtype)

    def encode_run(self, x, parts, signed, seed, start):
        parts["value"].copy_(round_to_bf16_stochastically(x.float(), seed, start))  # elementwise: in place
        return {}
