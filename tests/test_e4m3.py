"""The fp8 codec's own reading and writing of e4m3 bytes (``gradwise.state.float8.e4m3_values`` and
``e4m3_codes``, what its compiled CPU step uses where ATen converts float8 one element at a time): bit for
bit torch's ``view(torch.float8_e4m3fn).to(torch.float32)``, eagerly and compiled, on every byte, and
torch's ``to(torch.float8_e4m3fn)`` on float32 values of every kind (all 2^32 of them agreed once, in a
script: 49 s, too long for the suite)."""
from __future__ import annotations

import pytest
import torch

from gradwise.state import float8
from gradwise.state.float8 import Float8Map, e4m3_codes, e4m3_values

EVERY_BYTE = torch.arange(256, dtype=torch.int32).to(torch.uint8)


def converted(convert, x: torch.Tensor, compiled: bool, flush_denormal: bool) -> torch.Tensor:
    """``convert(x)``, compiled or eager, on a CPU set to flush float32 subnormals or not (skipped where it
    cannot)."""
    convert = torch.compile(convert, dynamic=False) if compiled else convert
    if flush_denormal and not torch.set_flush_denormal(True):
        pytest.skip("this CPU cannot flush subnormals")
    try:
        return convert(x)
    finally:
        torch.set_flush_denormal(False)


def float32_of_every_kind() -> torch.Tensor:
    """Both signs of: every 4099th float32 bit pattern (every exponent, NaN payloads and subnormals among
    them); every e4m3 value, the midpoints between neighbours (ties, to even either way) and the float32
    values next to each midpoint and value; the saturation boundary (448, 464, 480) and its neighbours;
    zeros and infinities."""
    stride = torch.arange(0, 1 << 31, 4099, dtype=torch.int64).to(torch.int32).view(torch.float32)
    values = EVERY_BYTE[:127].view(torch.float8_e4m3fn).to(torch.float32)  # +0 up to 448 (0x7F is NaN)
    anchors = torch.cat([values, (values[1:] + values[:-1]) / 2, torch.tensor([464.0, 480.0, 1e30, float("inf")])])
    near = torch.cat([anchors.nextafter(torch.tensor(0.0)), anchors, anchors.nextafter(torch.tensor(float("inf")))])
    positive = torch.cat([stride, near])
    return torch.cat([positive, -positive])


def same_floats(got: torch.Tensor, expected: torch.Tensor) -> bool:
    """Equal bit patterns (-0.0 too) where ``expected`` is a number, NaN where it is NaN."""
    finite = ~expected.isnan()
    return (got.dtype == torch.float32 and torch.equal(got.isnan(), expected.isnan())
            and torch.equal(got[finite].view(torch.int32), expected[finite].view(torch.int32)))


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("flush_denormal", [False, True], ids=["subnormals", "flushed"])
def test_e4m3_values_are_torchs_conversion_for_every_byte(compiled, flush_denormal):
    """Also on a CPU set to flush float32 subnormals to zero: e4m3's subnormals are float32
    normals, and the arithmetic makes no float32 subnormal on the way."""
    expected = EVERY_BYTE.view(torch.float8_e4m3fn).to(torch.float32)
    assert same_floats(converted(e4m3_values, EVERY_BYTE, compiled, flush_denormal), expected)


@pytest.mark.parametrize("root", [False, True], ids=["e4m3", "e4m3-sqrt"])
def test_the_maps_compiled_reading_is_its_eager_reading(root, monkeypatch):
    """The map reads bytes with the arithmetic when compiled for a CPU that converts float8 by
    element, and with torch's conversion otherwise: the same floats either way."""
    code_map = Float8Map(root=root)
    eager = code_map.value(EVERY_BYTE)
    for by_element in (True, False):
        monkeypatch.setattr(float8, "_CPU_CONVERTS_FLOAT8_BY_ELEMENT", by_element)
        torch._dynamo.reset()
        assert same_floats(torch.compile(code_map.value, dynamic=False)(EVERY_BYTE), eager)


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("flush_denormal", [False, True], ids=["subnormals", "flushed"])
def test_e4m3_codes_are_torchs_conversion_for_float32_of_every_kind(compiled, flush_denormal):
    """Rounding to nearest even, saturation past 464, NaN to the NaN code with its sign, -0.0 to 0x80; on a
    CPU flushing float32 subnormals too (a subnormal input reads as a zero of its sign: the byte torch gives)."""
    x = float32_of_every_kind()
    expected = x.to(torch.float8_e4m3fn).view(torch.uint8)
    got = converted(e4m3_codes, x, compiled, flush_denormal)
    assert got.dtype == torch.uint8
    wrong = got != expected
    assert not wrong.any(), (x[wrong][:8].tolist(), got[wrong][:8].tolist(), expected[wrong][:8].tolist())


@pytest.mark.parametrize("root", [False, True], ids=["e4m3", "e4m3-sqrt"])
def test_the_maps_compiled_writing_is_its_eager_writing(root, monkeypatch):
    """The map writes bytes with the arithmetic when compiled for a CPU that converts float8 by element: the bytes
    of torch's conversion, eager, for values of both signs across decades of their block's scale, zeros of both
    signs, NaN and inf."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(4, 2048, generator=generator) * 10.0 ** torch.randint(-12, 3, (4, 2048), generator=generator)
    x[0, :6] = torch.tensor([0.0, -0.0, float("nan"), float("inf"), -float("inf"), 1e-30])
    x = x.abs() if root else x
    finite = torch.where(x.abs() < float("inf"), x.abs(), 0.0)
    scale = finite.amax(dim=1, keepdim=True)
    code_map = Float8Map(root=root)
    eager = code_map.codes(x, scale)
    monkeypatch.setattr(float8, "_CPU_CONVERTS_FLOAT8_BY_ELEMENT", True)
    torch._dynamo.reset()
    assert torch.equal(torch.compile(code_map.codes, dynamic=False)(x, scale), eager)
