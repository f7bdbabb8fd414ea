"""The forms some ops take when traced by torch.compile (chosen for a compiled CPU step's vector units) give the
values of the eager ops, up to a few roundings: ``lists.lerp_small_`` and ``softplus`` (PNM's and MADGRAD's).
Traced with dynamo's ``eager`` backend: the traced branch runs, without an inductor build."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from gradwise.core import lists
from gradwise.transforms.softplus import softplus


def _traced(fn):
    return torch.compile(fn, backend="eager", fullgraph=True)


@pytest.mark.parametrize("weight", [0.0, 0.19, 0.5, 0.9, 1.0])
def test_lerp_small_traced_is_lerp(weight):
    gen = torch.Generator().manual_seed(0)
    x, y = (torch.randn(1000, generator=gen, dtype=torch.float64) for _ in range(2))
    w = torch.tensor(weight, dtype=torch.float64)
    expected = x.lerp(y, w)
    eager, traced = x.clone(), x.clone()
    lists.lerp_small_([eager], [y], w)
    _traced(lists.lerp_small_)([traced], [y], w)
    assert torch.equal(eager, expected)
    torch.testing.assert_close(traced, expected, rtol=0, atol=1e-14)
    if weight == 0.0:  # a weight of 0 leaves x as it is, exactly
        assert torch.equal(traced, x)


def _softplus_inputs(dtype, negative: bool = False) -> torch.Tensor:
    """0, tiny and large values, both sides of torch's threshold (beta x = 20: x = 0.4 at beta 50); or negatives."""
    if negative:
        return -torch.logspace(-6, 2.3, 301, dtype=torch.float64).to(dtype)
    double = dict(dtype=torch.float64)
    return torch.cat([torch.linspace(0.0, 1.0, 4001, **double), torch.logspace(-12, 3, 301, **double),
                      torch.tensor([0.39, 0.4, 0.41, 3.0], **double)]).to(dtype)


def test_softplus_traced_is_torchs_in_float64():
    x = torch.cat([_softplus_inputs(torch.float64), _softplus_inputs(torch.float64, negative=True)])
    expected = F.softplus(x, beta=50.0)
    assert torch.equal(softplus(x, 50.0), expected)
    torch.testing.assert_close(_traced(softplus)(x, 50.0), expected, rtol=1e-15, atol=0)


@pytest.mark.parametrize("beta", [1.0, 50.0])
def test_softplus_traced_series_is_within_float32_rounding(beta):
    """Float32 traces the logarithm-free series: for x >= 0 (the denominators' domain) within 4 float32 roundings
    (2^-24 each) of the exact softplus of the float32 input, as torch's own float32 kernel is; for x < 0, where the
    result is about exp(beta x), within 2 |beta x| + 4 (beta x and exp2's argument each carry a rounding) down to
    beta x = -40, and
    within exp(-40) / beta below; compiled by inductor as a step is, equal to the traced form up to two roundings
    (the C++ compiler contracts a multiply-add)."""
    rounding = 2.0**-24
    for negative in (False, True):
        x = _softplus_inputs(torch.float32, negative)
        exact = F.softplus(x.double(), beta=beta)
        traced = _traced(softplus)(x, beta)
        assert traced.dtype == torch.float32
        assert torch.equal(softplus(x, beta), F.softplus(x, beta=beta))  # eagerly: torch's
        scaled = beta * x.double()
        near = scaled >= -40
        error = (traced.double() - exact).abs()
        allowed = (4 + 2 * scaled.abs() * negative) * rounding * exact
        assert bool((error <= allowed)[near].all()), (x[near][(error - allowed)[near].argmax()], error.max())
        assert bool((error[~near] <= math.exp(-40) / beta).all())
        assert near.any() and (negative == bool((~near).any()))
        if not negative:
            torch.testing.assert_close(F.softplus(x, beta=beta).double(), exact, rtol=4 * rounding, atol=0)
        compiled = torch.compile(softplus, fullgraph=True)(x, beta)
        torch.testing.assert_close(compiled, traced, rtol=2 * rounding, atol=0)
