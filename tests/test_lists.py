"""List ops with a scale or per-tensor weights (``core/lists.py``): eagerly on the CPU each is torch's own op with the
scale as a number, bit for bit, whether the list takes the foreach call (two tensors or more) or the plain op (one);
a scale on another device, or traced, multiplies first, within a rounding of it."""
from __future__ import annotations

import pytest
import torch

from gradwise.core import lists


def _lists(count: int, seed: int = 0) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    sizes = [100_003, 7, 1000][:count]
    return [torch.randn(n, generator=gen) for n in sizes], [torch.randn(n, generator=gen) for n in sizes]


@pytest.mark.parametrize("count", [1, 3])
def test_sub_with_alpha_is_torch_sub_with_alpha(count):
    xs, ys = _lists(count)
    alpha = torch.tensor(-3.25e-3, dtype=torch.float32)
    expected = [x.clone().sub_(y, alpha=alpha.item()) for x, y in zip(xs, ys)]
    multiplied_first = [x - y * alpha for x, y in zip(xs, ys)]
    lists.sub_(xs, ys, alpha)
    assert all(torch.equal(x, e) for x, e in zip(xs, expected))
    for x, m in zip(xs, multiplied_first):  # the traced form, a rounding off
        torch.testing.assert_close(x, m, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("count", [1, 3])
def test_lerp_takes_one_weight_per_pair(count):
    xs, ys = _lists(count)
    weights = [torch.tensor(w) for w in (0.1, 0.75, 1.0)[:count]]
    expected = [x.clone().lerp_(y, w) for x, y, w in zip(xs, ys, weights)]
    lists.lerp_small_(xs, ys, weights)
    assert all(torch.equal(x, e) for x, e in zip(xs, expected))


@pytest.mark.parametrize("count", [1, 3])
def test_sqrt_in_place(count):
    xs, _ = _lists(count)
    xs = [x.abs() for x in xs]
    expected = [x.sqrt() for x in xs]
    lists.sqrt_(xs)
    assert all(torch.equal(x, e) for x, e in zip(xs, expected))


@pytest.mark.parametrize("count", [1, 3])
def test_addcdiv_each_takes_one_value_per_tensor_as_a_number(count):
    xs, ys = _lists(count)
    zs = [y.abs() + 0.5 for y in ys]
    values = torch.tensor([-1e-3, 2.5e-4, 7.0][:count], dtype=torch.float64)
    expected = [x.clone().addcdiv_(y, z, value=v) for x, y, z, v in zip(xs, ys, zs, values.tolist())]
    lists.addcdiv_each_(xs, ys, zs, values)
    assert all(torch.equal(x, e) for x, e in zip(xs, expected))
