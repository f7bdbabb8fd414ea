"""The forms some ops take when traced by torch.compile (chosen for a compiled CPU step's vector units) give the
values of the eager ops, up to a rounding: ``lists.lerp_small_`` and PNM's ``softplus``. Traced with dynamo's
``eager`` backend: the traced branch runs, without an inductor build."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from gradwise.core import lists
from gradwise.transforms.pnm import softplus


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


def test_softplus_traced_is_torchs():
    x = torch.cat([torch.linspace(1e-8, 1.0, 997, dtype=torch.float64), torch.tensor([0.39, 0.4, 0.41, 3.0],
                                                                                      dtype=torch.float64)])
    expected = F.softplus(x, beta=50.0)  # beta x crosses torch's threshold of 20 at x = 0.4
    assert torch.equal(softplus(x, 50.0), expected)
    torch.testing.assert_close(_traced(softplus)(x, 50.0), expected, rtol=1e-15, atol=0)
