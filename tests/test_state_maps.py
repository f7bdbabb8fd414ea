"""The code maps' closed forms (what compiled steps run) against the tables they stand for (what the
eager path runs): every code decodes to the table's value, and rounding to the nearest value or
stochastically picks the same code as ``torch.bucketize`` against the table, bit for bit, on random
values and on the hardest ones (map values, midpoints, and their float32 neighbours)."""
from __future__ import annotations

import pytest
import torch

from gradwise.core.hashing import hash32, unsigned
from gradwise.state.maps import code_map, dynamic_map, linear_map

MAPS = [("dynamic", 8, True), ("dynamic", 8, False), ("dynamic", 4, True), ("dynamic", 4, False),
        ("linear", 4, False), ("linear", 8, False)]


def table(kind: str, bits: int, signed: bool) -> torch.Tensor:
    return dynamic_map(bits, signed) if kind == "dynamic" else linear_map(bits)


def hard_inputs(kind: str, bits: int, signed: bool) -> torch.Tensor:
    """Uniform values, values spread over eight decades, every map value and midpoint, the float32
    numbers either side of each, zero and the ends of the range."""
    gen = torch.Generator().manual_seed(bits + 2 * signed)
    low = -1.0 if signed else 0.0
    finite = table(kind, bits, signed)[:-1]
    middles = (finite[1:] + finite[:-1]) / 2
    uniform = torch.rand(20_000, generator=gen) * (1 - low) + low
    decades = (uniform.abs() if not signed else uniform) * 10.0 ** -torch.randint(0, 8, (20_000,), generator=gen)
    edges = torch.cat([finite, middles])
    up, down = edges.nextafter(torch.tensor(2.0)), edges.nextafter(torch.tensor(-2.0))
    return torch.cat([uniform, decades, edges, up, down, torch.tensor([0.0, low, 1.0])]).clamp(low, 1)


@pytest.mark.parametrize("kind,bits,signed", MAPS)
def test_every_code_decodes_to_the_tables_value(kind, bits, signed):
    values = table(kind, bits, signed)
    codes = torch.arange(2**bits)
    for computed in (True, False):
        decoded = code_map(kind, bits, signed).value(codes, computed=computed)
        assert torch.equal(decoded[:-1], values[:-1]) and decoded[-1].isnan()


@pytest.mark.parametrize("kind,bits,signed", MAPS)
def test_computed_rounding_picks_the_tables_codes(kind, bits, signed):
    values = table(kind, bits, signed)
    finite = values[:-1]
    x = hard_inputs(kind, bits, signed)
    nearest = torch.bucketize(x, (finite[1:] + finite[:-1]) / 2)  # how many midpoints lie below x
    assert torch.equal(code_map(kind, bits, signed).nearest(x, computed=True).long(), nearest)

    uniform = unsigned(hash32(torch.arange(x.numel()), torch.tensor(99))).float() / 2**32
    below = (torch.bucketize(x, finite, right=True) - 1).clamp(0, finite.numel() - 2)
    fraction = ((x - finite[below]) / (finite[below + 1] - finite[below])).clamp(0, 1)
    stochastic = below + (uniform < fraction)
    assert torch.equal(code_map(kind, bits, signed).stochastic(x, uniform, computed=True).long(), stochastic)
    assert torch.equal(code_map(kind, bits, signed).stochastic(x, uniform, computed=False), stochastic)


@pytest.mark.slow
def test_compiled_closed_forms_match_the_table():
    """Compiled, the closed forms are vectorized C++: the codes and values must still be the table's."""
    signed_map, linear = code_map("dynamic", 8, True), code_map("linear", 4, False)

    def codes_and_values(x, x_unsigned, uniform):
        return (signed_map.nearest(x), signed_map.stochastic(x, uniform), signed_map.value(signed_map.nearest(x)),
                linear.nearest(x_unsigned), linear.stochastic(x_unsigned, uniform),
                linear.value(linear.nearest(x_unsigned)))

    x = torch.cat([hard_inputs("dynamic", 8, True), hard_inputs("linear", 4, False)])
    uniform = unsigned(hash32(torch.arange(x.numel()), torch.tensor(5))).float() / 2**32
    got = torch.compile(codes_and_values, fullgraph=True)(x, x.abs(), uniform)
    want = codes_and_values(x, x.abs(), uniform)  # eager: the tables
    for a, b in zip(got, want):
        assert torch.equal(a.to(b.dtype), b)


@pytest.mark.parametrize("kind,bits,signed", MAPS)
def test_exact_midpoints_round_alike_eagerly_and_compiled(kind, bits, signed):
    """A value exactly on the float32 midpoint of two codes takes the lower code on both paths (the
    table's ``bucketize`` and the closed forms a compiled step runs), so eager and compiled steps
    store the same codes."""
    finite = table(kind, bits, signed)[:-1]
    middles = (finite[1:] + finite[:-1]) / 2
    lower = torch.arange(middles.numel())
    cmap = code_map(kind, bits, signed)
    assert torch.equal(cmap.nearest(middles, computed=False).long(), lower)
    assert torch.equal(cmap.nearest(middles, computed=True).long(), lower)
