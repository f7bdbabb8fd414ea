"""``scale_by_adam`` on its own, in a chain built by hand: its defaults are torch.optim.Adam's."""
from __future__ import annotations

import torch

import gradwise
from gradwise.transforms import scale_by_adam, scale_by_learning_rate


def test_a_hand_built_adam_chain_takes_torchs_default_eps():
    """Gradients of 1e-9 are far below eps = 1e-8, so the step is almost all eps: a different default
    (1e-6, 1e-7, or 1e-9) moves the parameters by a visibly different amount."""
    start = torch.linspace(-1, 1, 6, dtype=torch.float64)
    ours, theirs = start.clone().requires_grad_(), start.clone().requires_grad_()
    chain = gradwise.Optimizer([ours], gradwise.chain(scale_by_adam(), scale_by_learning_rate()), lr=0.1,
                               compile=False)
    reference = torch.optim.Adam([theirs], lr=0.1)
    for step in range(3):
        grad = torch.full_like(start, 1e-9) * (step + 1)
        ours.grad, theirs.grad = grad.clone(), grad.clone()
        chain.step()
        reference.step()
    torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=0)
    assert not torch.equal(ours, start)
