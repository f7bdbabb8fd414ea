"""``torch.bucketize`` of float32 values against a fixed table, by a lookup on the values' top 16 bits.

``torch.bucketize`` searches the table for every element: about eight dependent, branchy comparisons for the 255
midpoints of an 8-bit code map, 27-45 ns an element on one thread of a 2-core AVX2 CPU, most of an eager int8
step. A float32's top 16 bits (its sign, exponent and first 7 mantissa bits) name a bucket of 65536
consecutive floats. Where no bucket holds more than one of the table's boundaries, the count of boundaries below
any float of a bucket is the count below the bucket's smallest float, plus one once the value is past the
bucket's boundary: two gathers from 65536-entry tables and one comparison (``index_select``: about 2.5 ns an
element), and the very counts ``torch.bucketize`` gives, ties included (``right``: as its argument).
A table with two boundaries in one bucket (levels closer than a bfloat16 step) has no lookup: its caller
bucketizes.
"""
from __future__ import annotations

import torch
from torch import Tensor

#: float32's exponent bits, within the top 16 bits
_EXPONENT = 0x7F80


class BucketLookup:
    """``torch.bucketize(x, boundaries, right=right)`` for float32 ``x`` (infinities included, NaN not), by the top
    16 bits of ``x``."""

    def __init__(self, counts: Tensor, thresholds: Tensor, right: bool):
        self.counts, self.thresholds, self.right = counts, thresholds, right

    @classmethod
    def build(cls, boundaries: Tensor, right: bool) -> BucketLookup | None:
        """The lookup of a sorted float32 ``boundaries`` (on its device), or None where some bucket holds more than
        one boundary."""
        top = torch.arange(1 << 16, dtype=torch.int64, device=boundaries.device)
        first = (top << 16).to(torch.int32).view(torch.float32)  # the bucket's float with low bits 0 ...
        last = ((top << 16) | 0xFFFF).to(torch.int32).view(torch.float32)  # ... and with low bits 0xFFFF
        negative = top >= 0x8000  # a negative float's value falls as its low bits rise
        smallest, largest = torch.where(negative, last, first), torch.where(negative, first, last)
        finite = (top & _EXPONENT) != _EXPONENT  # else an infinity (low bits 0) and NaNs: the infinity's count
        counts = torch.bucketize(torch.where(finite, smallest, first), boundaries, right=right)
        steps = torch.bucketize(largest, boundaries, right=right) - counts
        if bool((steps[finite] > 1).any()):
            return None
        inside = boundaries[counts.clamp(max=boundaries.numel() - 1)]
        thresholds = torch.where(finite & (steps == 1), inside, float("nan"))  # NaN: no value is past it
        return cls(counts, thresholds, right)

    def __call__(self, x: Tensor) -> Tensor:
        """The count of boundaries below each element of ``x`` (float32, not NaN; ``right``: at or below), int64,
        shaped like ``x``."""
        top = ((x.view(torch.int32) >> 16) & 0xFFFF).reshape(-1)
        flat = x.reshape(-1)
        thresholds = self.thresholds.index_select(0, top)
        past = flat >= thresholds if self.right else flat > thresholds
        return self.counts.index_select(0, top).add_(past).view(x.shape)
