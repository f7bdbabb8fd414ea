"""The fp8 codec's own reading of e4m3 bytes (``gradwise.state.float8.e4m3_values``, what its
compiled CPU step uses where ATen converts float8 one element at a time): bit for bit torch's
``view(torch.float8_e4m3fn).to(torch.float32)``, eagerly and compiled, on every byte."""
from __future__ import annotations

import pytest
import torch

from gradwise.state import float8
from gradwise.state.float8 import Float8Map, e4m3_values

EVERY_BYTE = torch.arange(256, dtype=torch.int32).to(torch.uint8)


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
    convert = torch.compile(e4m3_values, dynamic=False) if compiled else e4m3_values
    expected = EVERY_BYTE.view(torch.float8_e4m3fn).to(torch.float32)
    if flush_denormal and not torch.set_flush_denormal(True):
        pytest.skip("this CPU cannot flush subnormals")
    try:
        got = convert(EVERY_BYTE)
    finally:
        torch.set_flush_denormal(False)
    assert same_floats(got, expected)


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
