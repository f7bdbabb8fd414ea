"""scale_by_madgrad: the paper's Algorithm 1 (float64 reference, 100 steps), the ``madgrad`` package
step by step, compiled equals eager."""
from __future__ import annotations

import pytest
import torch

import gradwise
from gradwise import add_decayed_weights, chain
from gradwise.schedules import cosine, warmup
from gradwise.transforms.madgrad import scale_by_madgrad
from tests.models import bag_of_tensors
from tests.references.madgrad import MadgradReference
from tests.test_parity import _clone, _random_grads, assert_trajectories_close, run_bag, run_mlp

STEPS = 100


@pytest.mark.parametrize("momentum", [0.9, 0.0])
def test_matches_the_papers_algorithm(momentum):
    params = bag_of_tensors(torch.float64)
    ours = _clone(params)
    optimizer = gradwise.Optimizer(ours, scale_by_madgrad(), compile=False, lr=0.02, momentum=momentum, eps=1e-6)
    reference = MadgradReference(params, lr=0.02, momentum=momentum, eps=1e-6)
    for step in range(STEPS):
        grads = _random_grads(params, step)
        for p, g in zip(ours, grads):
            p.grad = g
        optimizer.step()
        expected = reference.step(grads)
        for i, (a, b) in enumerate(zip(ours, expected)):
            torch.testing.assert_close(a.detach(), b, rtol=1e-10, atol=1e-10, msg=lambda m: f"step {step}, {i}: {m}")


def _package(params, **kwargs):
    from madgrad import MADGRAD

    return MADGRAD(params, **kwargs)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("momentum, weight_decay", [(0.9, 0.0), (0.0, 0.0), (0.8, 1e-3)])
def test_matches_the_madgrad_package(momentum, weight_decay, dtype):
    pytest.importorskip("madgrad")
    lr, eps = 1e-2, 1e-6
    links, decay = ([add_decayed_weights()], dict(weight_decay=weight_decay)) if weight_decay else ([], {})
    # the package steps with lr + eps "for stability"; the paper (and gradwise) with lr
    ours = run_mlp(lambda p: gradwise.Optimizer(p, chain(*links, scale_by_madgrad()), compile=False, lr=lr + eps,
                                                momentum=momentum, eps=eps, **decay),
                   dtype, STEPS)
    theirs = run_mlp(lambda p: _package(p, lr=lr, momentum=momentum, eps=eps, weight_decay=weight_decay), dtype,
                     STEPS, reference=True)
    assert_trajectories_close(ours, theirs, dtype)


def test_schedule_scales_lambda():
    """With a schedule, lambda_t = lr f(t - 1) sqrt(t): the same as setting lr to lr f(t - 1) each step."""
    schedule = warmup(10, start=0.1) + cosine(40)
    params = bag_of_tensors(torch.float64)
    ours = run_bag(lambda p: gradwise.Optimizer(p, scale_by_madgrad(schedule), compile=False, lr=0.05), _clone(params),
                   torch.float64)
    stepped = _clone(params)
    optimizer = gradwise.Optimizer(stepped, scale_by_madgrad(), compile=False, lr=0.05)
    for step in range(len(ours)):
        optimizer.param_groups[0]["lr"] = 0.05 * schedule(step)
        for p, g in zip(stepped, _random_grads(params, step)):
            p.grad = g.t().contiguous().t() if not p.is_contiguous() else g
        optimizer.step()
        for a, b in zip(stepped, ours[step]):
            torch.testing.assert_close(a.detach(), b, rtol=1e-12, atol=1e-12)


@pytest.mark.slow
def test_compiled_equals_eager():
    params = [torch.randn(300, 7, dtype=torch.float64, requires_grad=True), torch.randn(33, dtype=torch.float64,
                                                                                       requires_grad=True)]
    runs = [run_bag(lambda p: gradwise.Optimizer(p, scale_by_madgrad(), compile=c, lr=0.02), _clone(params),
                    torch.float64, steps=10) for c in (False, True)]
    assert_trajectories_close(*runs, torch.float64, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("kwargs, message", [
    (dict(momentum=1.0), "momentum=1.0"), (dict(eps=0.0), "eps=0.0"), (dict(lr=-1.0), "lr=-1.0"),
])
def test_bad_input(kwargs, message):
    with pytest.raises(ValueError, match=message):
        gradwise.Optimizer([torch.nn.Parameter(torch.zeros(2))], scale_by_madgrad(), **kwargs)
    with pytest.raises(ValueError, match="denominator='cube'"):
        scale_by_madgrad(denominator="cube")
