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
expansion with the exponent 1/2. A block's second moments span the squares of its gradients'
decades, twice e4m3's range; their square roots fit it, and the update divides by ``sqrt(v)``,
whose relative error is then e4m3's, 1/16 at most. (e5m2 on ``v`` itself spans about as many
decades with about the same error on ``sqrt(v)``; README: the measured comparison.) Rounding is
to nearest in the stored (square-root) domain.

A NaN or inf is stored as the NaN code (``0x7F``) in its own element; the scales are the finite
magnitudes' maxima, as the integer codecs' (``gradwise.state.quantize``), which this codec reuses
whole: its maps stand in for a ``CodeMap``.

Compiled for a CPU without AVX-512, a byte is read back to float32 and written from float32 in integer and
float arithmetic (``e4m3_values``, ``e4m3_codes``), bit for bit torch's conversions (tested on every byte, and
on float32 values of every exponent, ties, saturation, NaN and signed zeros), because ATen's vectorized float8
conversion has a vector form only with AVX-512 and otherwise converts one element at a time, and inductor
reinterprets a float8 vector as bytes through a stack buffer. On this project's AVX2 machine reading by
arithmetic took the compiled AdamW-fp8 step of the 25m set from 31-33x torch's fused AdamW to 18-20x; writing
by arithmetic, with full-width loads of the codes (``gradwise.state.byte_loads``), from 22x to 10.5x (README,
"Reading and writing 8-bit codes on AVX2"). Writing needs no float32-to-int32
reinterpretation (the CPU backend's AVX2 code reads one back through a stack buffer too): the exponent is
found by comparisons, its powers of two are built as integers and read as float32 (the direction that loads
at full width), the rounding is float addition. Eagerly, torch's conversions are one
pass where the arithmetic is many, and are kept; so are CUDA's.
"""
from __future__ import annotations

import torch
from torch import Tensor

from gradwise.state.integer import Quantized

#: e4m3's exponent bias (7) in place of float32's (127), in float32's exponent field.
_REBIAS = (7 - 127) << 23
#: ATen's vectorized float8 conversion has a vector form with AVX-512 only (``vec512_convert.h``).
_CPU_CONVERTS_FLOAT8_BY_ELEMENT = not torch.backends.cpu.get_cpu_capability().startswith("AVX512")


def e4m3_values(codes: Tensor) -> Tensor:
    """The float32 value of each e4m3fn byte (uint8) of ``codes``, as
    ``codes.view(torch.float8_e4m3fn).to(torch.float32)`` gives it: the exponent and mantissa
    moved into float32's fields and re-biased; a subnormal (exponent 0) read as ``1.m x 2^-6``
    less ``2^-6``, so no float32 subnormal is made (a CPU flushing them would read zero)."""
    byte = codes.to(torch.int32)
    shifted = (byte & 0x7F) << 20
    normal = (shifted - _REBIAS).view(torch.float32)
    subnormal = (shifted + (121 << 23)).view(torch.float32) - 2.0**-6
    value = torch.where(shifted < (1 << 23), subnormal, normal)
    value = torch.where(shifted == (0x7F << 20), float("nan"), value)
    return torch.where(byte >= 0x80, -value, value)


def e4m3_codes(y: Tensor) -> Tensor:
    """The e4m3fn byte (uint8) of each float32 of ``y``, as ``y.to(torch.float8_e4m3fn).view(torch.uint8)`` gives
    it: rounded to nearest, ties to even; magnitudes past 464 (inf too) saturate to 448 (``0x7E``), NaN is the
    NaN code (``0x7F``); the sign bit is ``y``'s, zeros' and NaNs' included. In float32 arithmetic: counting the
    powers of two ``2^-5 ... 2^9`` that ``|y|`` reaches gives ``n = e + 6``, ``e = floor(log2 |y|)`` clamped to
    ``[-6, 9]``, and with it the powers ``2^(e+20)`` and ``2^(3-e)`` (built in float32's exponent field);
    adding and subtracting ``2^(e+20)`` rounds ``|y|`` to a multiple of ``2^(e-3)``, e4m3's step in that binade
    (the subnormals' ``2^-9`` where ``e = -6``); the byte's magnitude is then ``8 n + r 2^(3-e)``, which holds for
    a subnormal and for a value rounded up into the next binade alike. Each comparison reads ``|y|`` alone: a
    binary search, each step reading the last, stepped as fast but made inductor's code generation expand the
    whole expression behind ``|y|`` over a hundred times (scratch: one fp8 AdamW graph's cold first step 37.7 s, against
    15.6 s so). Exact only without unsafe floating-point optimizations (inductor's default)."""
    magnitude = y.abs()
    n = sum((magnitude >= 2.0**k).to(torch.int32) for k in range(-5, 10))
    shift = ((n + (20 + 127 - 6)) << 23).view(torch.float32)  # 2^(e+20), e = n - 6, float32's exponent bias 127
    step_inverse = (((3 + 127 + 6) - n) << 23).view(torch.float32)  # 2^(3-e)
    rounded = (magnitude + shift) - shift
    byte = torch.where(magnitude <= 464.0, (8 * n).to(torch.float32) + rounded * step_inverse, 126.0)
    byte = torch.where(magnitude == magnitude, byte, 127.0)
    one = torch.ones_like(y)
    return (byte + (one - one.copysign(y)) * 64).to(torch.uint8)


def _by_element(t: Tensor) -> bool:
    """Whether a float8 conversion of ``t`` would be compiled one element at a time (the module's docstring)."""
    return torch.compiler.is_compiling() and t.device.type == "cpu" and _CPU_CONVERTS_FLOAT8_BY_ELEMENT


class Float8Map:
    """Values as e4m3 bytes in units of their scale, and back; ``root``: store the square root
    (second moments). Stands in for a ``CodeMap`` in ``gradwise.state.quantize``, which asks it for
    ``codes`` (in place of its own rounding) and ``value``."""

    dtype = torch.float8_e4m3fn

    def __init__(self, root: bool):
        self.root = root

    def _limits(self) -> tuple[float, float]:
        """e4m3's largest value and its smallest subnormal (2^-9), found in the call: compiled, a float
        attribute or global is a graph input, which every iteration of the loop reloads and divides by
        (in float64), where these are constants of the graph."""
        finfo = torch.finfo(self.dtype)
        return finfo.max, finfo.smallest_normal * 2.0**-3

    def codes(self, x: Tensor, scale: Tensor) -> Tensor:
        """The e4m3 bytes (uint8) of ``F x / scale`` rounded to nearest (``F``: e4m3's largest value;
        with ``root``, of ``F sqrt(x / scale)``, a positive value never stored as zero but as the
        smallest subnormal, so that a second moment is not zero where its first moment is not); NaN
        and inf as the NaN code. ``scale`` bounds ``|x|``; a product that rounds past ``F`` saturates
        to ``F`` in the conversion. Every selection is made on float32 values, before the one
        conversion (selecting among bytes with float masks runs several times slower on the CPU
        backend), and each element costs one multiplication by its block's factor, no division."""
        largest, smallest = self._limits()
        factor = (largest**2 if self.root else largest) / torch.where(scale > 0, scale, 1.0)
        y = x * factor
        if self.root:
            y = y.clamp(min=0).sqrt()
            y = torch.where(y > 0, y.clamp(min=smallest), y)
        y = torch.where(x.abs() < float("inf"), y, float("nan"))  # last: a NaN made on the way may be negative
        return e4m3_codes(y) if _by_element(y) else y.to(self.dtype).view(torch.uint8)

    def value(self, codes: Tensor) -> Tensor:
        """The float32 value of each byte in units of its scale (NaN for the NaN code)."""
        decoded = e4m3_values(codes) if _by_element(codes) else codes.view(self.dtype).float()
        y = decoded * (1 / self._limits()[0])
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
