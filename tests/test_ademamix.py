"""AdEMAMix against pytorch-optimizer 4.1.0 and bitsandbytes in the configurations the registry's one
leaves out, its alpha and beta3 schedules against the paper's definition, and its own bad input."""
from __future__ import annotations

import math

import pytest
import torch

import gradwise
from gradwise.transforms.ademamix import ademamix_alpha, ademamix_beta3
from tests.models import bag_of_tensors
from tests.registry import _pytorch_optimizer
from tests.test_parity import _clone, assert_trajectories_close, run_bag

STEPS = 25


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("kwargs", [dict(lr=0.01, weight_decay=0.1, weight_decouple=False),
                                    dict(lr=0.01, alpha=8.0, t_alpha_beta3=None, eps=1e-6)], ids=["l2", "no-warmup"])
def test_matches_pytorch_optimizer(kwargs, dtype):
    params = bag_of_tensors(dtype)
    ours = run_bag(lambda p: gradwise.AdEMAMix(p, compile=False, **kwargs), _clone(params), dtype, STEPS)
    theirs = run_bag(lambda p: _pytorch_optimizer("AdEMAMix", weight_decouple=True)(p, **kwargs), _clone(params),
                     dtype, STEPS, reference=True)
    assert_trajectories_close(ours, theirs, dtype)


@pytest.mark.parametrize("warmup", [None, 10])
def test_matches_bitsandbytes(warmup):
    """bitsandbytes' 32-bit AdEMAMix (CPU), whose ``t_alpha`` and ``t_beta3`` are our one ``t_alpha_beta3``."""
    bnb = pytest.importorskip("bitsandbytes")
    gen = torch.Generator().manual_seed(0)
    params = [torch.randn(64, 32, generator=gen).requires_grad_(), torch.randn(300, generator=gen).requires_grad_()]
    kwargs = dict(lr=0.01, betas=(0.8, 0.99, 0.999), alpha=3.0, weight_decay=0.1, eps=1e-8)
    ours = run_bag(lambda p: gradwise.AdEMAMix(p, compile=False, t_alpha_beta3=warmup, **kwargs), _clone(params),
                   torch.float32, STEPS)
    theirs = run_bag(lambda p: bnb.optim.AdEMAMix(p, optim_bits=32, t_alpha=warmup, t_beta3=warmup, **kwargs),
                     _clone(params), torch.float32, STEPS)
    assert_trajectories_close(ours, theirs, torch.float32)


def test_beta3_schedule_grows_the_half_life_linearly_from_beta1s_to_beta3s():
    """The paper's schedule: the half-life -ln 2 / ln b3_t moves linearly in t from b1's to b3's, then stays."""
    b1, b3, warmup = 0.9, 0.9999, 100

    def half_life(beta):
        return -math.log(2) / math.log(beta)

    for t in (1, 25, 50, 99, 100):
        expected = half_life(b1) + (half_life(b3) - half_life(b1)) * t / warmup
        assert half_life(ademamix_beta3(b1, b3, t, warmup)) == pytest.approx(expected, rel=1e-9)
    assert ademamix_beta3(b1, b3, 250, warmup) == b3
    assert ademamix_beta3(b1, b3, 3, None) == b3
    assert [ademamix_alpha(5.0, t, 100) for t in (1, 50, 100, 300)] == [0.05, 2.5, 5.0, 5.0]


def test_first_step_is_adams_plus_alpha_times_the_slow_ema():
    """At t = 1: m1_hat = g, v_hat = g^2 and m2 = (1 - b3) g, so u = (1 + alpha (1 - b3)) g / (|g| + eps)."""
    p = torch.zeros(5, dtype=torch.float64, requires_grad=True)
    optimizer = gradwise.AdEMAMix([p], lr=1.0, betas=(0.9, 0.999, 0.99), alpha=4.0, eps=1e-8, compile=False)
    p.grad = torch.tensor([1.0, -2.0, 0.5, 3.0, -0.25], dtype=torch.float64)
    optimizer.step()
    expected = -(1 + 4.0 * (1 - 0.99)) * p.grad / (p.grad.abs() + 1e-8)
    torch.testing.assert_close(p.detach(), expected, rtol=1e-14, atol=0)


@pytest.mark.parametrize("kwargs, message", [
    (dict(betas=(0.9, 0.999)), r"invalid betas=\(0\.9, 0\.999\): expected a triple \(beta1, beta2, beta3\)"),
    (dict(betas=(0.9, 0.999, 1.0)), r"invalid betas\[2\]=1\.0 in betas=\(0\.9, 0\.999, 1\.0\): expected a number in"),
    (dict(alpha=-1.0), r"invalid alpha=-1\.0: expected a finite number >= 0"),
    (dict(t_alpha_beta3=0), r"invalid t_alpha_beta3=0: expected None \(no warmup\) or a finite number > 0"),
])
def test_bad_arguments_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        gradwise.AdEMAMix([torch.zeros(3, requires_grad=True)], **kwargs)


def test_a_schedule_from_beta1_zero_refuses_the_first_step_and_changes_nothing():
    p = torch.ones(3, requires_grad=True)
    optimizer = gradwise.AdEMAMix([p], betas=(0.0, 0.999, 0.9999), t_alpha_beta3=100, compile=False)
    p.grad = torch.ones(3)
    with pytest.raises(ValueError, match=r"invalid betas\[0\]=0\.0 with t_alpha_beta3=100\.0: .*beta1 in \(0, 1\)"):
        optimizer.step()
    assert torch.equal(p.detach(), torch.ones(3)) and not optimizer.state
