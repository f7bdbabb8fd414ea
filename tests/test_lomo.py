"""LOMO and AdaLomo against float64 references from their papers, updated inside backward."""
from __future__ import annotations

import pytest
import torch

import gradwise
from tests.models import bag_of_tensors, mlp, regression_batch
from tests.references.lomo import ReferenceAdaLomo, ReferenceLOMO

STEPS = 25
F64 = dict(rtol=1e-10, atol=1e-10)


def _loss(params, step):
    """A loss whose gradient depends on the parameters and the step: sum c sin(p) + 0.1 p^2."""
    gen = torch.Generator().manual_seed(step)
    total = 0.0
    for p in params:
        c = torch.randn(p.shape, generator=gen, dtype=p.dtype)
        total = total + (c * torch.sin(p)).sum() + 0.1 * (p * p).sum()
    return total


def _compare(make_ours, make_reference, steps=STEPS):
    ours = bag_of_tensors(torch.float64)
    theirs = [p.detach().clone() for p in ours]
    optimizer = make_ours(ours)
    reference = make_reference(theirs)
    for step in range(steps):
        _loss(ours, step).backward()  # the update happens here
        assert all(p.grad is None for p in ours)
        optimizer.step()  # no gradient left: changes nothing
        leaves = [p.requires_grad_() for p in theirs]
        grads = torch.autograd.grad(_loss(leaves, step), leaves)
        theirs = [p.detach() for p in leaves]
        reference.step(grads)
        for i, (a, b) in enumerate(zip(ours, theirs)):
            torch.testing.assert_close(a.detach(), b, **F64, msg=lambda m, i=i: f"step {step}, tensor {i}: {m}")
    return optimizer


@pytest.mark.parametrize("kwargs", [dict(lr=0.05), dict(lr=0.05, clip_grad_value=0.3, weight_decay=0.1)],
                         ids=["plain", "clip-decay"])
def test_lomo_matches_reference(kwargs):
    optimizer = _compare(lambda p: gradwise.LOMO(p, compile=False, **kwargs), lambda p: ReferenceLOMO(p, **kwargs))
    assert all(set(optimizer.state[p]) <= {"step"} for p in optimizer.state), "LOMO keeps no state"


ALL_OPTIONS = dict(lr=0.2, clip_threshold=0.5, clip_grad_value=0.8, weight_decay=0.1, eps=(1e-20, 1e-2),
                   decay_rate=-0.6)


@pytest.mark.parametrize("kwargs", [dict(lr=0.05), ALL_OPTIONS], ids=["defaults", "all-options"])
def test_adalomo_matches_reference(kwargs):
    optimizer = _compare(lambda p: gradwise.AdaLomo(p, compile=False, **kwargs),
                         lambda p: ReferenceAdaLomo(p, **kwargs))
    matrix = next(p for p in optimizer.state if p.dim() == 2 and p.numel())
    state = optimizer.state[matrix]
    assert state["adalomo.exp_avg_sq_row"].shape == (matrix.shape[0], 1)
    assert state["adalomo.exp_avg_sq_col"].shape == (1, matrix.shape[1]), "a matrix keeps rows and columns only"


@pytest.mark.parametrize("recipe,kwargs", [(gradwise.LOMO, dict(lr=0.05, clip_grad_value=0.5, weight_decay=0.01)),
                                           (gradwise.AdaLomo, dict(lr=0.01, weight_decay=0.01))],
                         ids=["LOMO", "AdaLomo"])
@pytest.mark.parametrize("compile", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["eager", "compiled"])
def test_update_in_backward_equals_step(recipe, kwargs, compile):
    fused_model, plain_model = mlp(torch.float32), mlp(torch.float32)
    fused = recipe(fused_model.parameters(), compile=compile, **kwargs)
    plain = recipe(plain_model.parameters(), compile=compile, fused_backward=False, **kwargs)
    assert fused.fused_backward is not None and plain.fused_backward is None
    for step in range(8):
        x, y = regression_batch(torch.float32, step)
        torch.nn.functional.mse_loss(fused_model(x), y).backward()
        plain.zero_grad()
        torch.nn.functional.mse_loss(plain_model(x), y).backward()
        plain.step()
    for a, b in zip(fused_model.parameters(), plain_model.parameters()):
        assert torch.equal(a, b)
    if compile:
        assert fused.compile_stats["compiles"] >= 1


@pytest.mark.slow
def test_adalomo_compiled_equals_eager():
    params = bag_of_tensors(torch.float32)
    runs = []
    for compile in (True, False):
        ours = [p.detach().clone().requires_grad_() for p in params]
        optimizer = gradwise.AdaLomo(ours, lr=0.05, weight_decay=0.1, compile=compile)
        for step in range(10):
            _loss(ours, step).backward()
        runs.append(ours)
        if compile:
            assert optimizer.compile_stats["compiles"] >= 1
    for a, b in zip(*runs):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("kwargs,pattern", [
    (dict(decay_rate=0.8), r"decay_rate=0\.8: expected a finite number < 0"),
    (dict(eps=(1e-30,)), r"eps=\(1e-30,\): expected a pair \(eps1, eps2\)"),
    (dict(eps=(1e-30, -1.0)), r"eps\[1\]=-1\.0 in eps=\(1e-30, -1\.0\): expected a finite number > 0"),
    (dict(clip_threshold=0.0), r"clip_threshold=0\.0: expected a finite number > 0"),
    (dict(clip_grad_value=-1.0), r"clip_grad_value=-1\.0: expected a finite number >= 0"),
    (dict(fused_backward="yes"), r"fused_backward='yes': expected True or False"),
])
def test_adalomo_bad_input(kwargs, pattern):
    params = [torch.zeros(3, 2, requires_grad=True)]
    with pytest.raises((ValueError, TypeError), match=pattern):
        gradwise.AdaLomo(params, **kwargs)
    assert params[0]._post_accumulate_grad_hooks is None, "a failed construction installs no hook"
