"""MeZO against a float64 reference written from Algorithm 1 of Malladi et al. (2023) (Sparse-MeZO's mask
from Liu et al. 2024), step by step; it trains a small model from forward passes alone, resumes
bit-identically, and refuses bad input before anything is written."""
from __future__ import annotations

import math

import pytest
import torch

import gradwise
from gradwise.recipes.mezo import perturbation_seed
from tests.models import bag_of_tensors, mlp, regression_batch, sin_loss

STEPS = 25


class ReferenceMeZO:
    """Algorithm 1 of the paper in float64, z kept for the step: theta +- eps z, the projected gradient
    (l+ - l-) / (2 eps), then theta <- theta - lr (g z + weight_decay theta). A sparse mask keeps the
    ceil((1 - sparsity) n) entries of smallest |theta| (or a random fraction from the mask's seed)."""

    def __init__(self, params, lr, eps=1e-3, weight_decay=0.0, sparsity=0.0, mask="magnitude", seed=0):
        self.params, self.lr, self.eps, self.wd = params, lr, eps, weight_decay
        self.sparsity, self.mask, self.seed, self.t = sparsity, mask, seed, 0

    def _mask(self, p, index):
        keep = 1 - self.sparsity
        if keep == 1:
            return torch.ones(p.shape, dtype=torch.bool)
        if self.mask == "random":
            gen = torch.Generator().manual_seed(perturbation_seed(self.seed, self.t, 0, index, stream=1))
            return torch.rand(p.shape, generator=gen) < keep
        k = math.ceil(keep * p.numel())
        return p.abs() <= torch.sort(p.abs().flatten()).values[k - 1]

    @torch.no_grad()
    def step(self, loss_fn):
        zs = []
        for i, p in enumerate(self.params):
            gen = torch.Generator().manual_seed(perturbation_seed(self.seed, self.t, 0, i))
            z = torch.randn(p.shape, generator=gen, dtype=p.dtype)
            zs.append(z * self._mask(p, i) if p.numel() else z)
        for p, z in zip(self.params, zs):
            p += self.eps * z
        plus = float(loss_fn())
        for p, z in zip(self.params, zs):
            p -= 2 * self.eps * z
        minus = float(loss_fn())
        for p, z in zip(self.params, zs):
            p += self.eps * z
        g = (plus - minus) / (2 * self.eps)
        for p, z in zip(self.params, zs):
            p -= self.lr * (g * z + self.wd * p)
        self.t += 1


CONFIGS = {"plain": dict(lr=0.01), "decay": dict(lr=0.02, eps=1e-2, weight_decay=0.1, seed=7),
           "magnitude-mask": dict(lr=0.01, sparsity=0.6), "random-mask": dict(lr=0.01, sparsity=0.3, mask="random")}


@pytest.mark.parametrize("kwargs", CONFIGS.values(), ids=CONFIGS.keys())
def test_mezo_matches_the_paper_step_by_step(kwargs):
    ours = bag_of_tensors(torch.float64)
    theirs = [p.detach().clone() for p in ours]
    optimizer, reference = gradwise.MeZO(ours, **kwargs), ReferenceMeZO(theirs, **kwargs)
    for step in range(STEPS):
        optimizer.step(lambda: sin_loss(ours, step))
        reference.step(lambda: sin_loss(theirs, step))
        for i, (a, b) in enumerate(zip(ours, theirs)):
            torch.testing.assert_close(a.detach(), b, rtol=1e-12, atol=1e-12, msg=lambda m, i=i: f"{step}, {i}: {m}")
    assert not optimizer.state, "MeZO keeps no per-parameter state"
    assert optimizer.param_groups[0]["step"] == STEPS
    if kwargs.get("sparsity"):  # only the masked entries moved: the first step leaves the rest as they were
        start = bag_of_tensors(torch.float64)[3].detach()
        moved = gradwise.MeZO([p := start.clone().requires_grad_()], **kwargs)
        moved.step(lambda: sin_loss([p], 0))
        changed = (p.detach() != start).sum().item()
        assert 0 < changed <= math.ceil((1 - kwargs["sparsity"]) * start.numel()) + 10
        assert changed < start.numel() * (1 - kwargs["sparsity"] / 2)


def test_mezo_trains_a_small_model_from_forward_passes():
    model = mlp(torch.float32)
    x, y = regression_batch(torch.float32, 0)
    optimizer = gradwise.MeZO(model.parameters(), lr=0.02, eps=1e-3)
    first = torch.nn.functional.mse_loss(model(x), y).item()
    for _ in range(150):
        optimizer.step(lambda: torch.nn.functional.mse_loss(model(x), y))
    assert all(p.grad is None for p in model.parameters()), "no backward ran"
    assert torch.nn.functional.mse_loss(model(x), y).item() < 0.5 * first


def _run(optimizer, params, start, stop):
    for step in range(start, stop):
        optimizer.step(lambda: sin_loss(params, step))


def test_mezo_resumes_bit_identically_and_the_seed_decides_the_draws():
    full = bag_of_tensors(torch.float64)
    _run(gradwise.MeZO(full, lr=0.01, seed=3, sparsity=0.2, mask="random"), full, 0, 10)
    first = bag_of_tensors(torch.float64)
    optimizer = gradwise.MeZO(first, lr=0.01, seed=3, sparsity=0.2, mask="random")
    _run(optimizer, first, 0, 6)
    resumed = [p.detach().clone().requires_grad_() for p in first]
    second = gradwise.MeZO(resumed, lr=0.5)
    second.load_state_dict(optimizer.state_dict())
    _run(second, resumed, 6, 10)
    assert all(torch.equal(a, b) for a, b in zip(full, resumed))
    other = bag_of_tensors(torch.float64)
    _run(gradwise.MeZO(other, lr=0.01, seed=4, sparsity=0.2, mask="random"), other, 0, 10)
    assert not torch.equal(other[2], full[2])


def test_mezo_leaves_frozen_parameters_alone():
    frozen, trained = torch.ones(3, 2), torch.ones(4, requires_grad=True)
    optimizer = gradwise.MeZO([frozen, trained], lr=0.1)
    optimizer.step(lambda: (trained.sin().sum() + frozen.sum()))
    assert torch.equal(frozen, torch.ones(3, 2)) and not torch.equal(trained.detach(), torch.ones(4))


@pytest.mark.parametrize("kwargs, message", [
    (dict(lr=-1.0), r"invalid lr=-1.0: expected a finite number >= 0"),
    (dict(eps=0.0), r"invalid eps=0.0: expected a finite number > 0"),
    (dict(sparsity=1.0), r"invalid sparsity=1.0: expected a number in \[0, 1\)"),
    (dict(mask="top"), r"invalid mask='top': expected one of \['magnitude', 'random'\]"),
    (dict(seed=-2), r"invalid seed=-2: expected an integer >= 0"),
])
def test_mezo_refuses_bad_settings_by_name(kwargs, message):
    with pytest.raises(ValueError, match=message):
        gradwise.MeZO(bag_of_tensors(torch.float64), **kwargs)


def _unchanged(make_step, check_loss=False):
    params = bag_of_tensors(torch.float64)
    optimizer = gradwise.MeZO(params, lr=0.1)
    before = [p.detach().clone() for p in params]
    with pytest.raises(ValueError) as error:
        make_step(optimizer, params)
    close = dict(rtol=0, atol=1e-15) if check_loss else dict(rtol=0, atol=0)
    for a, b in zip(params, before):
        torch.testing.assert_close(a.detach(), b, **close)
    assert optimizer.param_groups[0]["step"] == 0
    return str(error.value)


def test_mezo_refuses_a_step_without_closure_or_with_bad_groups_and_changes_nothing():
    assert "invalid closure=None: MeZO.step() needs closure=" in _unchanged(lambda o, p: o.step())

    def two_eps(optimizer, params):
        optimizer.add_param_group({"params": [torch.zeros(2, requires_grad=True)], "eps": 1e-2})
        optimizer.step(lambda: sin_loss(params, 0))
    assert "invalid eps: the param groups hold [0.001, 0.01]" in _unchanged(two_eps)

    def scheduled_nan(optimizer, params):
        optimizer.param_groups[0]["lr"] = float("nan")
        optimizer.step(lambda: sin_loss(params, 0))
    assert "invalid param_groups[0]['lr']=nan" in _unchanged(scheduled_nan)


def test_mezo_refuses_a_non_finite_loss_and_puts_the_parameters_back():
    def nan_loss(optimizer, params):
        optimizer.step(lambda: sin_loss(params, 0) * float("nan"))
    assert "invalid loss=tensor(nan" in _unchanged(nan_loss, check_loss=True)

    def vector_loss(optimizer, params):
        optimizer.step(lambda: torch.ones(2))
    assert "MeZO's closure must return a finite number or a one-element tensor" in _unchanged(vector_loss, True)


def _raising_on_second_call(params, error: BaseException):
    calls = []

    def closure():
        calls.append(1)
        if len(calls) == 2:  # at theta - eps z
            raise error
        return sin_loss(params, 0)
    return closure


@pytest.mark.parametrize("error", [RuntimeError("data loader died"), KeyboardInterrupt()], ids=["error", "interrupt"])
def test_a_closure_raising_mid_step_leaves_the_parameters_bit_for_bit_with_exact_restore(error):
    """The closure raises at its 2nd call (the parameters at theta - eps z): the error propagates, the parameters
    are theta bit for bit with exact_restore, within an ulp from the seed by default; no step is counted and the
    next step is the one an untouched optimizer takes."""
    for exact in (True, False):
        params = bag_of_tensors(torch.float64)
        optimizer = gradwise.MeZO(params, lr=0.1, sparsity=0.3, exact_restore=exact)
        before, groups = [p.detach().clone() for p in params], optimizer.state_dict()
        with pytest.raises(type(error)):
            optimizer.step(_raising_on_second_call(params, error))
        for a, b in zip(params, before):
            torch.testing.assert_close(a.detach(), b, rtol=0, atol=0 if exact else 1e-15)
        assert optimizer.state_dict() == groups and not optimizer.state
    optimizer.step(lambda: sin_loss(params, 0))
    fresh = [p.detach().clone().requires_grad_() for p in before]
    gradwise.MeZO(fresh, lr=0.1, sparsity=0.3).step(lambda: sin_loss(fresh, 0))
    for a, b in zip(params, fresh):
        torch.testing.assert_close(a.detach(), b, rtol=0, atol=1e-14)


def test_mezo_refuses_a_non_bool_exact_restore():
    with pytest.raises(TypeError, match="invalid exact_restore=1: expected True"):
        gradwise.MeZO(bag_of_tensors(torch.float64), exact_restore=1)
