"""The ``fp8`` codec: each element a float8 number in units of its block's scale.

An element ``x`` of a block whose largest finite magnitude is ``s`` is stored as the float8 value
nearest to ``F x / s`` (``F``: the format's largest finite value, 448 for e4m3), one byte, and read
back as ``s q / F``; the scale ``s`` is a float32 per block, as int8's (Dettmers et al., ICLR 2022).
A float8 code has a floating exponent, so its relative precision is the same at every magnitude of
the block (3 mantissa bits for e4m3: a relative error of at most 1/16) where the dynamic map's
falls in its low decades, and it converts in a few instructions, where finding a value's place in
the dynamic map takes a few dozen (``bench/codec.py``). Prior art: torchao's ``AdamWFp8`` (e4m3 with
block scales for both moments), COAT (Xi et al., ICLR 2025, arXiv:2410.19313), whose dynamic range
expansion raises values to a power before quantizing to fill the format's range.

Second moments (non-negative) store ``sqrt(v / s)`` in e4m3 instead, read back squared: COAT's
expansion with the exponent 1/2, which spends the sign bit's worth of range where Adam uses it
(the update divides by ``sqrt(v)``, whose relative error is then e4m3's, 1/16 at most, against
e5m2's 1/8 on ``v`` itself). Rounding is to nearest in the stored (square-root) domain.

A NaN or inf is stored as the NaN code (``0x7F``) in its own element; the scales are the finite
magnitudes' maxima, as the integer codecs' (``gradwise.state.quantize``), which this codec reuses
whole: its maps stand in for a ``CodeMap``.
"""
from __future__ import annotations

import torch
from torch import Tensor

from gradwise.state.integer import Quantized

#: e4m3fn's NaN code (sign bit clear, every exponent and mantissa bit set).
NAN_CODE = 0x7F


class Float8Map:
    """Normalized values in [-1, 1] (or [0, 1]) as e4m3 bytes and back; ``root``: store the square
    root (second moments). Exposes what ``gradwise.state.quantize`` asks of a code map: ``nearest``,
    ``value``, ``nan_code`` and ``zero`` (the code of 0, so that a positive second moment is never
    stored as zero but as the smallest subnormal, code 1)."""

    dtype = torch.float8_e4m3fn
    nan_code, zero = NAN_CODE, 0

    def __init__(self, root: bool):
        self.root = root
        self.largest = torch.finfo(self.dtype).max

    def nearest(self, normalized: Tensor) -> Tensor:
        """The e4m3 bytes (uint8) of ``normalized`` (finite, within [-1, 1]), rounded to nearest."""
        y = normalized.sqrt() if self.root else normalized
        return (y * self.largest).to(self.dtype).view(torch.uint8)

    def value(self, codes: Tensor) -> Tensor:
        """The float32 value of each byte in units of its scale (NaN for the NaN code)."""
        y = codes.view(self.dtype).to(torch.float32) / self.largest
        return y * y if self.root else y


class Fp8(Quantized):
    """1 byte per element plus a float32 scale per 2048-element block (both moments): 1.002 bytes
    per element. ``normalization="rank1"`` scales by row and column maxima instead; rounding is to
    nearest only."""

    name = "fp8"
    signed_layout = ("block", "e4m3", "nearest")
    unsigned_layout = ("block", "e4m3-sqrt", "nearest")

    def __init__(self, block_size: int | None = None, normalization: str = "default", rounding: str = "default"):
        super().__init__(block_size, normalization, rounding)
        if self.rounding == "stochastic":
            raise ValueError("invalid rounding='stochastic': fp8 rounds to nearest ('default' or 'nearest')")

    def code_map(self, kind: str, signed: bool) -> Float8Map:
        return Float8Map(root=kind == "e4m3-sqrt")
