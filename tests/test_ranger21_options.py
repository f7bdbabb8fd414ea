"""Ranger21's options that pytorch-optimizer's Ranger21 lacks: MADGRAD, Chebyshev steps, AdaBelief and
evaluating at the slow weights. MADGRAD and Chebyshev against the authors' package (120 steps, float64,
through warmup and warm-down); AdaBelief against the float64 PNM reference with the paper's belief."""
from __future__ import annotations

import contextlib
import copy
import io

import pytest
import torch

import gradwise
from tests.models import mlp, train_regression
from tests.test_parity import assert_trajectories_close, run_mlp

STEPS = 120
CASE = dict(lr=1e-2, weight_decay=1e-3, normloss_factor=1e-3, num_epochs=12, num_batches_per_epoch=10,
            num_warmup_iterations=20, use_madgrad=True)


class _Unlogged(list):
    """Stands in for the package's ``cheb_logging`` list, which it compares with a NumPy float (and fails)."""

    def __getitem__(self, index):
        return None


def _package(params, **kwargs):
    r21 = pytest.importorskip("ranger21")
    with contextlib.redirect_stdout(io.StringIO()):  # the package prints as it goes
        optimizer = r21.Ranger21(params, **kwargs)
    # use_cheb: the package reads self.num_batches, which it never sets, then logs into a list in a way
    # that raises; both patched here so that its schedule can be compared
    optimizer.num_batches, optimizer.cheb_logging = kwargs["num_batches_per_epoch"], _Unlogged()
    return optimizer


def _quadratic_run(make, shape, steps=STEPS):
    """One parameter tensor (the package applies decay and norm loss to the last parameter only, so with
    one they reach every parameter) on a noisy quadratic: g = (p M - T) / 2 + noise."""
    gen = torch.Generator().manual_seed(0)
    p = torch.nn.Parameter(torch.randn(*shape, generator=gen, dtype=torch.float64))
    m = torch.randn(shape[-1], shape[-1], generator=gen, dtype=torch.float64)
    target = torch.randn(*shape, generator=gen, dtype=torch.float64)
    optimizer = make([p])
    trajectory = []
    for _ in range(steps):
        p.grad = (p.detach() @ m - target) * 0.5 + 0.1 * torch.randn(*shape, generator=gen, dtype=torch.float64)
        with contextlib.redirect_stdout(io.StringIO()):
            optimizer.step()
        trajectory.append([p.detach().clone()])
    return trajectory


@pytest.mark.parametrize("shape", [(6, 5), (3, 2, 2, 2)], ids=["matrix", "conv"])
@pytest.mark.parametrize("kwargs", [
    dict(),
    dict(momentum=0.0),
    dict(softplus=False, using_gc=False, lookahead_mergetime=3, momentum=0.8),
    dict(use_cheb=True, num_epochs=10, num_batches_per_epoch=12),  # 8 Chebyshev steps, one per epoch
], ids=["defaults", "no-momentum", "plain-denominator", "cheb"])
def test_madgrad_matches_the_ranger21_package(kwargs, shape):
    case = {**CASE, **kwargs}
    ours = _quadratic_run(lambda p: gradwise.Ranger21(p, compile=False, **case), shape)
    theirs = _quadratic_run(lambda p: _package(p, **case), shape)
    assert_trajectories_close(ours, theirs, torch.float64)


def test_pytorch_optimizer_ignores_use_madgrad():
    """Why MADGRAD follows the authors' package: pytorch-optimizer's Ranger21 takes use_madgrad=True
    (into its param groups) and steps exactly as without it."""
    from pytorch_optimizer import Ranger21

    runs = [run_mlp(lambda p: Ranger21(p, num_iterations=20, foreach=False, **extra), torch.float64, 20)
            for extra in ({}, {"use_madgrad": True})]
    assert_trajectories_close(*runs, torch.float64, rtol=0, atol=0)


@pytest.mark.parametrize("use_warmup", [True, False])
def test_cheb_schedule_is_the_ranger21_packages(use_warmup):
    """The learning rate of every step, as the package's use_cheb computes it after the warmup (the
    package never applies it without warmup: it waits for a warmup_complete flag only the warmup sets;
    gradwise applies it from the first step then)."""
    lr, epochs, batches = 2e-3, 34, 30  # 32 Chebyshev steps
    package = _package([torch.nn.Parameter(torch.zeros(1))], lr=lr, num_epochs=epochs, num_batches_per_epoch=batches,
                       use_cheb=True, use_warmup=use_warmup)
    ours = gradwise.Ranger21([torch.nn.Parameter(torch.zeros(1))], lr=lr, num_epochs=epochs,
                             num_batches_per_epoch=batches, use_cheb=True, use_warmup=use_warmup, compile=False)
    for step in range(1, epochs * batches + 1):
        expected = lr
        with contextlib.redirect_stdout(io.StringIO()):
            if use_warmup and not package.warmup_complete:
                expected = package.warmup_dampening(expected, step)
            if package.warmup_complete or not use_warmup:
                expected = package.get_cheb_lr(expected, step)
            expected = package.get_warm_down(expected, step)
        assert lr * ours.schedule(step - 1) == pytest.approx(expected, rel=1e-12), step


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
def test_adabelief_matches_its_reference(dtype):
    """use_adabelief: every component as pytorch-optimizer computes it, v the belief (g - m_t)^2; checked
    against gradwise's own chain with pnm's belief (itself tested against the float64 reference in
    test_ranger21_components) and against the plain recipe, from which it must differ."""
    kwargs = dict(lr=3e-3, num_iterations=STEPS, pnm_momentum_factor=0.9, compile=False)
    belief = run_mlp(lambda p: gradwise.Ranger21(p, use_adabelief=True, **kwargs), dtype, STEPS)
    plain = run_mlp(lambda p: gradwise.Ranger21(p, **kwargs), dtype, STEPS)
    assert not torch.allclose(belief[-1][0], plain[-1][0], rtol=1e-3, atol=0)
    schedule = gradwise.Ranger21([torch.nn.Parameter(torch.zeros(1))], **kwargs).schedule
    chained = run_mlp(lambda p: _belief_chain(p, schedule, kwargs["lr"]), dtype, STEPS)
    assert_trajectories_close(belief, chained, dtype)


def _belief_chain(params, schedule, lr):
    """Ranger21 with AdaBelief built by hand from the transforms: n, the stable weight decay's
    normalizer, is the reduction scale_by_pnm_adam reports over every parameter of the step."""
    from gradwise.transforms import (
        centralize_gradient,
        clip_by_agc,
        lookahead,
        normalize_gradient,
        scale_by_learning_rate,
        scale_by_pnm_adam,
        scale_by_schedule,
        shrink_like_ranger21,
    )

    shaping = gradwise.chain(clip_by_agc(), centralize_gradient(), normalize_gradient())
    pnm = scale_by_pnm_adam(recentralize=True, renormalize=True, belief=True, second_moment_statistics=True)
    transform = gradwise.chain(shaping, pnm, scale_by_schedule(schedule), scale_by_learning_rate(),
                               shrink_like_ranger21(schedule), lookahead())
    return gradwise.Optimizer(params, transform, compile=False, lr=lr, pnm_momentum_factor=0.9, weight_decay=1e-4,
                              betas=(0.9, 0.999))


@pytest.mark.parametrize("use_madgrad", [False, True])
def test_lookahead_load_at_validation_evaluates_the_slow_weights(use_madgrad):
    kwargs = dict(lr=1e-2, num_iterations=60, lookahead_load_at_validation=True, use_madgrad=use_madgrad,
                  compile=False)
    model = mlp(torch.float64)
    optimizer = gradwise.Ranger21(model.parameters(), **kwargs)
    train_regression(model, optimizer, 0, 13)  # a merge at 10, three fast steps since
    fast = [p.detach().clone() for p in model.parameters()]
    slow = [optimizer.state[p]["lookahead.slow"].clone() for p in model.parameters()]
    assert not any(torch.equal(a, b) for a, b in zip(fast, slow))
    optimizer.eval()
    optimizer.eval()  # idempotent
    assert all(torch.equal(p, s) for p, s in zip(model.parameters(), slow))
    with pytest.raises(RuntimeError, match="eval mode"):
        optimizer.step()
    saved = copy.deepcopy({"model": model.state_dict(), "optimizer": optimizer.state_dict()})  # in eval mode
    optimizer.train()
    optimizer.train()
    assert all(torch.equal(p, f) for p, f in zip(model.parameters(), fast))
    train_regression(model, optimizer, 13, 40)

    fresh_model = mlp(torch.float64, seed=3)
    fresh = gradwise.Ranger21(fresh_model.parameters(), **kwargs)
    fresh_model.load_state_dict(saved["model"])
    fresh.load_state_dict(saved["optimizer"])
    assert fresh.mode == "eval" and all(torch.equal(p, s) for p, s in zip(fresh_model.parameters(), slow))
    fresh.train()
    train_regression(fresh_model, fresh, 13, 40)
    assert all(torch.equal(a, b) for a, b in zip(fresh_model.parameters(), model.parameters()))


def test_without_load_at_validation_eval_moves_nothing():
    model = mlp(torch.float64)
    optimizer = gradwise.Ranger21(model.parameters(), lr=1e-2, num_iterations=60, compile=False)
    train_regression(model, optimizer, 0, 13)
    before = [p.detach().clone() for p in model.parameters()]
    optimizer.eval()
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before))
    train_regression(model, optimizer, 13, 14)  # stepping in eval mode is allowed: there is nothing to move


@pytest.mark.parametrize("kwargs, message", [
    (dict(num_iterations=100, use_cheb=True), "num_epochs and num_batches_per_epoch, not num_iterations"),
    (dict(num_epochs=7, num_batches_per_epoch=10, use_cheb=True), "num_epochs=7 with use_cheb=True"),
    (dict(num_iterations=100, use_madgrad=True, use_adabelief=True), "use_adabelief=True"),
    (dict(num_iterations=100, use_madgrad=True, momentum=1.0), "momentum=1.0"),
    (dict(num_iterations=100, use_madgrad="yes"), "use_madgrad='yes'"),
])
def test_bad_input(kwargs, message):
    error = TypeError if "'yes'" in message else ValueError
    with pytest.raises(error, match=message):
        gradwise.Ranger21([torch.nn.Parameter(torch.zeros(2, 2))], lr=1e-3, **kwargs)
