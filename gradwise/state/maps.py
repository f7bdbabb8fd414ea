"""Code maps: the sorted float values a small integer code stands for, in units of a block's scale.

Every map here ends with one NaN entry, so a non-finite value reaching a quantizer is stored in its
own element as NaN (as a float32 buffer would carry it) instead of inflating its block's scale and
wiping out every other value of the block.
"""
from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple

import torch
from torch import Tensor

from gradwise.state.bucket_lookup import BucketLookup


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


class _Decade(NamedTuple):
    """Levels ``(a + b k) / den`` for k = 1 .. n, the ``offset + k``-th magnitude levels of a map."""
    a: float
    b: float
    den: float
    n: float
    offset: float
    start: float  # the level for k = 0 (the previous run's last level, or zero), as float32


#: the fewest elements the eager ``CodeMap`` looks up by top bits, and ``values_at`` takes by ``index_select``: below
#: it one ``bucketize`` call is faster than the lookup's seven operations (one thread, 2-core AVX2 CPU: 24.7 against
#: 40.1 us at 2048 elements, 141.6 against 47.7 at 4096)
LOOKUP_MIN = 4096


class CodeMap:
    """A code map read as closed forms, so that rounding to it and decoding it are arithmetic that
    ``torch.compile`` vectorizes (table lookups are gathers the CPU backend runs one element at a time).

    Both maps are runs of evenly spaced levels: the dynamic map's decade ``e`` holds
    ``(n + 9k) / (n 10^(e+1))`` for k = 1 .. n = 2^(magnitude bits - 1 - e), the linear map
    ``k / (2^bits - 1)``. Numerator and denominator are exact in float32, so one division gives each
    level correctly rounded: the very float32 values of ``dynamic_map`` and ``linear_map``. Level k = 0
    of a run is the previous run's last level (the dynamic map's decades share their ends), so a
    value's run is found by comparing it with the runs' starts, its level k by one multiply-and-floor,
    and rounding to nearest by one comparison with the midpoint of levels k and k + 1 computed
    exactly (two divisions; stochastic rounding also corrects k by one where the estimate fell on the
    wrong side of a level). Fields equal in every run stay numbers. The codes are those of rounding
    against the table of midpoints (ties toward the lower code, as ``torch.bucketize``).

    Eagerly, the table is faster (one ``bucketize``, by a lookup on the values' top bits where the levels
    allow it: ``gradwise.state.bucket_lookup``, or one gather per tensor, where the closed forms take a
    dozen whole-tensor operations), so the methods use it unless ``torch.compile`` is tracing them; tests
    check that both give the same codes and values.
    """

    def __init__(self, kind: str, bits: int, signed: bool):
        self.kind, self.bits, self.signed = kind, bits, signed
        values = dynamic_map(bits, signed) if kind == "dynamic" else linear_map(bits)
        finite = values[:-1]
        self.values, self.nan_code = finite.tolist(), 2**bits - 1
        self._tables = {values.device: (values, finite, (finite[1:] + finite[:-1]) / 2)}
        self._lookups: dict[tuple[torch.device, bool], BucketLookup | None] = {}
        if kind == "dynamic":
            magnitude_bits = bits - 1 if signed else bits
            runs = [(float(n), 9.0, float(n * 10 ** (e + 1)), n)
                    for e in reversed(range(bits - 1)) for n in [2 ** (magnitude_bits - 1 - e)]]
            #: the code of magnitude level 0 (the value zero)
            self.zero = 2 ** (bits - 1) - 1 if signed else 0
        else:
            levels = 2**bits - 1
            runs = [(0.0, 1.0, float(levels), levels)]
            self.zero = -1  # the linear map has no zero: level 0 stands below its first code
        self.decades, offset = [], 0
        for a, b, den, n in runs:
            start = (torch.tensor(a) / torch.tensor(den)).item() if offset else 0.0
            self.decades.append(_Decade(a, b, den, float(n), float(offset), start))
            offset += n

    def table(self, device: torch.device) -> tuple[Tensor, Tensor, Tensor]:
        """(every value, NaN last; the finite values; the midpoints between them) on ``device``."""
        if device not in self._tables:
            self._tables[device] = tuple(t.to(device) for t in self._tables[torch.device("cpu")])
        return self._tables[device]

    def _bucketize(self, x: Tensor, right: bool) -> Tensor:
        """``torch.bucketize`` of ``x`` against the midpoints (``right`` False) or the finite values (True), by
        ``BucketLookup`` for float32 ``x`` of ``LOOKUP_MIN`` elements or more where the map's levels allow it: the
        same counts, a fraction of the time."""
        boundaries = self.table(x.device)[1 if right else 2]
        lookup = None
        if x.dtype == torch.float32 and x.numel() >= LOOKUP_MIN:
            key = (x.device, right)
            if key not in self._lookups:
                self._lookups[key] = BucketLookup.build(boundaries, right)
            lookup = self._lookups[key]
        return torch.bucketize(x, boundaries, right=right) if lookup is None else lookup(x)

    def value(self, codes: Tensor, computed: bool | None = None) -> Tensor:
        """The float32 value of each code (NaN for the NaN code). ``computed``: use the closed forms
        (default: while compiling)."""
        if not _computed(computed):
            return values_at(self.table(codes.device)[0], codes)
        level = codes.to(torch.float32) - self.zero
        magnitude = level.abs() if self.signed else level
        a, b, den, offset, _ = self._pick([magnitude > d.offset for d in self.decades[1:]],
                                          "a", "b", "den", "offset", "n")
        v = (a + b * (magnitude - offset)) / den
        v = torch.where(magnitude == 0, 0.0, v)
        if self.signed:
            v = torch.where(level < 0, -v, v)
        return torch.where(codes == self.nan_code, float("nan"), v)

    def nearest(self, x: Tensor, computed: bool | None = None) -> Tensor:
        """Codes of the nearest values to ``x`` (float32, finite, within the map's range): int64 from
        the table, int32 from the closed forms, which keep levels as exact float32 integers (no int64
        vector arithmetic, which the CPU backend runs at half width or element by element)."""
        if not _computed(computed):
            return self._bucketize(x, right=False)
        y = x.abs() if self.signed else x
        # y lies between levels k and k + 1 of its run or within an ulp of one of them, where either
        # side of the midpoint gives the same nearest level: one exact comparison decides
        level, low, high = self._bracket(y)
        middle = (high + low) / 2
        if not self.signed:
            return (self.zero + level + (y > middle)).clamp(min=0).to(torch.int32)
        negative = x < 0
        level = level + torch.where(negative, y >= middle, y > middle)
        return torch.where(negative, self.zero - level, self.zero + level).to(torch.int32)

    def stochastic(self, x: Tensor, uniform: Tensor, computed: bool | None = None) -> Tensor:
        """The code just below or just above each ``x``, the upper one where ``uniform`` (in [0, 1))
        is below the value's fraction of the way between them."""
        if not _computed(computed):
            finite = self.table(x.device)[1]
            below = (self._bucketize(x, right=True) - 1).clamp(0, finite.numel() - 2)
            low, high = values_at(finite, below), values_at(finite, below + 1)
            return below + (uniform < ((x - low) / (high - low)).clamp(0, 1))
        y = x.abs() if self.signed else x
        level, low, high = self._bracket(y, exact=True)
        on_level = y == low
        below, last = self.zero + level, len(self.values) - 2
        low = torch.where(below < 0, self.values[0], torch.where(below > last, self.values[last], low))
        high = torch.where(below < 0, self.values[1], torch.where(below > last, self.values[last + 1], high))
        below = below.clamp(0, last)
        if self.signed:  # below a negative value: the next level of larger magnitude, unless on a level
            negative = x < 0
            low, high = torch.where(negative, -high, low), torch.where(negative, -low, high)
            below = torch.where(negative, self.zero - level - 1, below)
        fraction = ((x - low) / (high - low)).clamp(0, 1)
        codes = below + (uniform < fraction)
        return (torch.where(negative & on_level, self.zero - level, codes) if self.signed else codes).to(torch.int32)

    def _bracket(self, y: Tensor, exact: bool = False) -> tuple[Tensor, Tensor, Tensor]:
        """(level, low, high) for ``y`` >= 0: the index of a magnitude level (0: the value zero), that
        level's value and the next one's. ``exact``: the largest level <= y; otherwise it may be the
        level just above y or just below the largest when y is within a rounding error of a level.

        A run's level k = 0 is the previous run's last level (for the dynamic map, whose runs share
        their ends) or zero, so the run is chosen by comparing y with the runs' starts only, and k
        estimated with one multiplication (each run's levels are evenly spaced)."""
        a, b, den, n, offset = self._pick([y > d.start for d in self.decades[1:]], "a", "b", "den", "n", "offset")
        k = ((y * den - a) * (1 / b)).floor().clamp(min=0)
        k = torch.minimum(k, n - 1) if isinstance(n, Tensor) else k.clamp(max=n - 1)
        if exact:
            k = torch.where((a + b * k) / den > y, k - 1, k).clamp(min=0)
            k = torch.where((a + b * (k + 1)) / den <= y, k + 1, k)
            k = torch.minimum(k, n - 1) if isinstance(n, Tensor) else k.clamp(max=n - 1)
        low, high = (a + b * k) / den, (a + b * (k + 1)) / den
        if self.decades[0].a != 0:  # the first run's level 0 is zero, not a / den
            low = torch.where((k == 0) & (y <= self.decades[1].start), 0.0, low)
        return offset + k, low, high

    def _pick(self, takes: list[Tensor], *fields: str) -> list:
        """Each field of the run selected per element: the last run whose ``take`` holds (the first
        run where none does); a field equal in every run is that number, ``a`` equal to ``n`` in
        every run is ``n``."""
        picked = {}
        for field in sorted(fields, key=lambda f: f != "n"):
            values = [getattr(d, field) for d in self.decades]
            if len(set(values)) == 1:
                picked[field] = values[0]
            elif field == "a" and values == [d.n for d in self.decades] and "n" in picked:
                picked[field] = picked["n"]
            else:
                out = values[0]
                for take, value in zip(takes, values[1:]):
                    out = torch.where(take, value, out)
                picked[field] = out
        return [picked[f] for f in fields]


def values_at(table: Tensor, index: Tensor) -> Tensor:
    """``table[index]`` (a 1-d table, integer indices of any shape); from ``LOOKUP_MIN`` indices up by
    ``index_select``, which runs 3-8x faster than advanced indexing from 64K indices up on one thread of a 2-core
    AVX2 CPU (a million uint8 codes: 0.85 against 7.0 ms) and slower below about 2000 (its three operations)."""
    if index.numel() < LOOKUP_MIN:
        return table[index.long()]
    return table.index_select(0, index.reshape(-1).to(torch.int32)).view(index.shape)


def _computed(computed: bool | None) -> bool:
    return torch.compiler.is_compiling() if computed is None else computed


@lru_cache(maxsize=None)
def code_map(kind: str, bits: int, signed: bool) -> CodeMap:
    """The ``CodeMap`` of a map kind ("dynamic" or "linear"), built once."""
    return CodeMap(kind, bits, signed)
