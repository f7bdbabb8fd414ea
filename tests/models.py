"""Small parameter sets shared by the tests: a bag of tensors of varied shapes and a small MLP."""
from __future__ import annotations

from contextlib import contextmanager

import torch
from torch import nn


def bag_of_tensors(dtype: torch.dtype, seed: int = 0) -> list[torch.Tensor]:
    """0-d, 1-d, 2-d, 4-d, a transposed (non-contiguous) matrix and an empty tensor, as leaf params."""
    gen = torch.Generator().manual_seed(seed)
    shapes = [(), (7,), (5, 3), (2, 3, 4, 5), (0, 3)]
    tensors = [torch.randn(s, generator=gen, dtype=dtype) for s in shapes]
    tensors.append(torch.randn(6, 4, generator=gen, dtype=dtype).t())
    return [t.requires_grad_() for t in tensors]


def mlp(dtype: torch.dtype, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 1)).to(dtype)


def regression_batch(dtype: torch.dtype, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(32, 8, generator=gen, dtype=dtype)
    return x, torch.sin(x.sum(dim=1, keepdim=True))


def train_regression(model: nn.Module, optimizer, start: int, stop: int, dtype: torch.dtype = torch.float64) -> None:
    """Steps ``start`` to ``stop`` (exclusive) on ``regression_batch``: zero_grad, MSE backward, step."""
    for step in range(start, stop):
        x, y = regression_batch(dtype, step)
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()


@contextmanager
def default_dtype(dtype: torch.dtype):
    """torch keeps its scalar state (NAdam's mu_product) in the default dtype: float64 runs get float64."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


def sin_loss(params, step: int) -> torch.Tensor:
    """A float64 loss whose gradient depends on the parameters and the step: sum c sin(p) + 0.1 p^2, with
    c drawn from a generator seeded by ``step``."""
    gen = torch.Generator().manual_seed(step)
    total = torch.zeros((), dtype=torch.float64)
    for p in params:
        c = torch.randn(p.shape, generator=gen, dtype=p.dtype)
        total = total + (c * torch.sin(p)).sum() + 0.1 * (p * p).sum()
    return total


def step_beside_reference(optimizer, ours, theirs, steps: int, reference_step) -> None:
    """``steps`` steps of ``optimizer`` on ``ours`` and of ``reference_step(i, p, g)`` (in place, without grad) on
    each tensor of ``theirs``, both on ``sin_loss``'s gradients; after each step they agree within 1e-10."""
    for step in range(steps):
        optimizer.zero_grad()
        sin_loss(ours, step).backward()
        optimizer.step()
        leaves = [p.requires_grad_() for p in theirs]
        grads = torch.autograd.grad(sin_loss(leaves, step), leaves)
        theirs = [p.detach() for p in leaves]
        with torch.no_grad():
            for i, (p, g) in enumerate(zip(theirs, grads)):
                reference_step(i, p, g)
        for i, (a, b) in enumerate(zip(ours, theirs)):
            torch.testing.assert_close(a.detach(), b, rtol=1e-10, atol=1e-10, msg=lambda m, i=i: f"{step}, {i}: {m}")
