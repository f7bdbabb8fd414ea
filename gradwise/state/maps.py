"""Code maps: the sorted float values a small integer code stands for, in units of a block's scale.

Every map here ends with one NaN entry, so a non-finite value reaching a quantizer is stored in its
own element as NaN (as a float32 buffer would carry it) instead of inflating its block's scale and
wiping out every other value of the block.
"""
from __future__ import annotations

import torch
from torch import Tensor


def dynamic_map(bits: int, signed: bool) -> Tensor:
    """The dynamic (tree) quantization map of Dettmers et al., "8-bit Optimizers via Block-wise
    Quantization" (ICLR 2022, arXiv:2110.02861), built from the paper's description.

    A code's bits after the sign read: ``e`` zero bits (the decimal exponent, value scale 10^-e), one
    indicator bit, then ``bits - 2 - e`` (signed) or ``bits - 1 - e`` (unsigned) linear fraction bits
    spanning (0.1, 1]. Large exponents leave few fraction bits: tiny values get range, values near
    the block's absmax get precision. With zero, 2^bits - 1 finite values (the largest is exactly 1,
    so a block's absmax element survives exactly), then NaN.
    """
    if bits < 3:
        raise ValueError(f"invalid bits={bits!r}: a dynamic map needs at least 3 bits")
    magnitude_bits = bits - 1 if signed else bits
    positives = []
    for e in range(bits - 1):
        count = 2 ** (magnitude_bits - 1 - e)
        fractions = 0.1 + 0.9 * torch.arange(1, count + 1, dtype=torch.float64) / count
        positives.append(fractions * 10.0**-e)
    values = torch.cat(positives)
    values = torch.cat([-values, torch.zeros(1, dtype=torch.float64), values]) if signed else \
        torch.cat([torch.zeros(1, dtype=torch.float64), values])
    values = values.sort().values.to(torch.float32)
    assert values.numel() == 2**bits - 1, values.numel()
    return torch.cat([values, torch.full((1,), float("nan"))])


def linear_map(bits: int) -> Tensor:
    """A zero-point-free linear map for non-negative values (Li et al., "Memory Efficient Optimizers
    with 4-bit States", NeurIPS 2023, arXiv:2309.01507): k / (2^bits - 1) for k = 1 .. 2^bits - 1,
    then NaN. Zero is not representable on purpose: a second moment rounded to zero turns
    m / (sqrt(v) + eps) into a huge step, which is the failure Li et al. trace to the zero point.
    (Their map has 2^bits levels; one code is given up here for the NaN code.)"""
    levels = 2**bits - 1
    values = torch.arange(1, levels + 1, dtype=torch.float64) / levels
    return torch.cat([values.to(torch.float32), torch.full((1,), float("nan"))])


def midpoints(code_map: Tensor) -> Tensor:
    """Boundaries between consecutive finite values: ``bucketize`` against them rounds to nearest."""
    finite = code_map[:-1]
    return (finite[1:] + finite[:-1]) / 2
