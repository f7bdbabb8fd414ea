"""Lion eagerly gives lion-pytorch's bits: its step in that package's op order (``scale_by_lion``'s additions with
``alpha``; the decay and the step size as one last link, ``_decayed_step``: p (1 - lr wd), then p - lr sign(.))."""
from __future__ import annotations

import pytest
import torch

import gradwise
from gradwise.core.eager import EAGER_CHUNK
from tests.registry import _lion


@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_eager_lion_equals_lion_pytorch_bit_for_bit(weight_decay):
    gen = torch.Generator().manual_seed(0)
    values = [torch.randn(s, generator=gen) for s in [(EAGER_CHUNK + 4_464,), (17, 5), (3,), (64, 33)]]  # one in pieces
    ours_params = [v.clone().requires_grad_() for v in values]
    theirs_params = [v.clone().requires_grad_() for v in values]
    hyper = dict(lr=3e-4, betas=(0.9, 0.99), weight_decay=weight_decay)
    ours, theirs = gradwise.Lion(ours_params, compile=False, **hyper), _lion(theirs_params, **hyper)
    for _ in range(30):
        for a, b in zip(ours_params, theirs_params):
            a.grad = torch.randn(a.shape, generator=gen)
            b.grad = a.grad.clone()
        ours.step()
        theirs.step()
        for a, b in zip(ours_params, theirs_params):
            assert torch.equal(a, b)
            assert torch.equal(ours.state[a]["lion.exp_avg"], theirs.state[b]["exp_avg"])
