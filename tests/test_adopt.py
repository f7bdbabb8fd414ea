"""ADOPT against pytorch-optimizer 4.1.0 in the configurations the registry's one leaves out, the first
step, and its own bad input (the registry's generic tests cover resume, compile, state formats, FSDP2)."""
from __future__ import annotations

import pytest
import torch

import gradwise
from tests.models import bag_of_tensors
from tests.registry import _pytorch_optimizer
from tests.test_parity import _clone, assert_trajectories_close, run_bag

STEPS = 25


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("kwargs", [dict(lr=0.01, weight_decay=0.1, weight_decouple=True, betas=(0.8, 0.99)),
                                    dict(lr=0.01, clip_lambda=None, eps=1e-3),
                                    dict(lr=0.003, clip_lambda=lambda step: 0.5 + 0.1 * step)],
                         ids=["decoupled", "no-clip", "own-clip"])
def test_matches_pytorch_optimizer(kwargs, dtype):
    params = bag_of_tensors(dtype)
    ours = run_bag(lambda p: gradwise.ADOPT(p, compile=False, **kwargs), _clone(params), dtype, STEPS)
    theirs = run_bag(lambda p: _pytorch_optimizer("ADOPT")(p, **kwargs), _clone(params), dtype, STEPS, reference=True)
    assert_trajectories_close(ours, theirs, dtype)


def test_first_step_keeps_the_squared_gradient_and_moves_nothing():
    p = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    start = p.detach().clone()
    optimizer = gradwise.ADOPT([p], lr=0.1, compile=False)
    p.grad = torch.randn(4, 3, dtype=torch.float64)
    optimizer.step()
    assert torch.equal(p.detach(), start)
    assert torch.equal(optimizer.state[p]["adopt.exp_avg_sq"], p.grad * p.grad)
    assert not optimizer.state[p]["adopt.exp_avg"].any()


def test_clip_bounds_the_normalized_gradient():
    """Step 2 with v = g1^2 tiny and a large g2: each element of m is (1 - b1) clip(g2 / |g1|)."""
    p = torch.zeros(3, dtype=torch.float64, requires_grad=True)
    optimizer = gradwise.ADOPT([p], lr=1.0, betas=(0.5, 0.9), compile=False)
    for grad in ([1e-3, -1e-3, 1.0], [1.0, 1.0, 0.5]):
        p.grad = torch.tensor(grad, dtype=torch.float64)
        optimizer.step()
    clip = 2 ** 0.25
    torch.testing.assert_close(optimizer.state[p]["adopt.exp_avg"],
                               torch.tensor([0.5 * clip, 0.5 * clip, 0.25], dtype=torch.float64), rtol=1e-15, atol=0)


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(clip_lambda=0.25), TypeError, r"invalid clip_lambda=0\.25: expected None or a function of the step"),
    (dict(weight_decouple="yes"), TypeError, r"invalid weight_decouple='yes': expected True or False"),
    (dict(betas=(0.9, 1.0)), ValueError,
     r"invalid betas\[1\]=1\.0 in betas=\(0\.9, 1\.0\): expected a number in \[0, 1\)"),
    (dict(eps=0.0), ValueError, r"invalid eps=0\.0: expected a finite number > 0"),
])
def test_bad_arguments_are_named(kwargs, error, message):
    with pytest.raises(error, match=message):
        gradwise.ADOPT([torch.zeros(3, requires_grad=True)], **kwargs)


def test_a_clip_lambda_giving_a_bad_bound_refuses_the_step_and_changes_nothing():
    p = torch.ones(3, requires_grad=True)
    optimizer = gradwise.ADOPT([p], clip_lambda=lambda step: 1.0 if step < 3 else -1.0, compile=False)
    for _ in range(2):
        p.grad = torch.ones(3)
        optimizer.step()
    before = {k: v.clone() for k, v in optimizer.state[p].items()}
    start = p.detach().clone()
    with pytest.raises(ValueError, match=r"invalid clip_lambda\(3\)=-1\.0: expected a number > 0"):
        optimizer.step()
    assert torch.equal(p.detach(), start)
    assert all(torch.equal(v, before[k]) for k, v in optimizer.state[p].items())
