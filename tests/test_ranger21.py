"""Ranger21: pytorch-optimizer's Ranger21 step by step for 120 steps (through warmup and warm-down),
the authors' package's learning-rate schedule, exact resumption from checkpoints, bad input."""
from __future__ import annotations

import contextlib
import copy
import io
import math

import pytest
import torch

import gradwise
from tests.models import mlp, regression_batch, train_regression
from tests.registry import _pytorch_optimizer
from tests.test_parity import assert_trajectories_close, run_mlp

_ranger21 = _pytorch_optimizer("Ranger21")

STEPS = 120


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("kwargs", [
    dict(lr=3e-3, betas=(0.9, 0.99)),  # warmup 26 steps (2 / (1 - b2) = 200 > 45% of 120), warm-down 34
    dict(lr=1e-2, weight_decay=1e-3, normloss_factor=1e-3, agc_clipping_value=0.1, lookahead_mergetime=3,
         lookahead_blending_alpha=0.6, num_warmup_iterations=10, warmdown_start_pct=0.5, warmdown_min_lr=1e-4),
], ids=["defaults", "tuned"])
def test_matches_pytorch_optimizer_ranger21(kwargs, dtype):
    theirs_kwargs = dict(kwargs)
    renames = {"weight_decay": "weight_decay", "normloss_factor": "norm_loss_factor",
               "lookahead_mergetime": "lookahead_merge_time", "num_warmup_iterations": "num_warm_up_iterations",
               "warmdown_min_lr": "warm_down_min_lr"}
    theirs_kwargs = {renames.get(k, k): v for k, v in kwargs.items() if k != "warmdown_start_pct"}
    if "warmdown_start_pct" in kwargs:
        theirs_kwargs["num_warm_down_iterations"] = STEPS - int(kwargs["warmdown_start_pct"] * STEPS)
    ours = run_mlp(lambda p: gradwise.Ranger21(p, num_iterations=STEPS, pnm_momentum_factor=0.9, compile=False,
                                               **kwargs), dtype, STEPS)
    theirs = run_mlp(lambda p: _ranger21(p, num_iterations=STEPS, beta0=0.9, **theirs_kwargs), dtype, STEPS,
                     reference=True)
    assert_trajectories_close(ours, theirs, dtype)


def test_epochs_times_batches_is_the_budget():
    a = run_mlp(lambda p: gradwise.Ranger21(p, lr=3e-3, num_epochs=6, num_batches_per_epoch=10, compile=False),
                torch.float64, 60)
    b = run_mlp(lambda p: gradwise.Ranger21(p, lr=3e-3, num_iterations=60, compile=False), torch.float64, 60)
    assert all(torch.equal(x, y) for s, t in zip(a, b) for x, y in zip(s, t))


@pytest.mark.parametrize("betas, total", [((0.9, 0.999), 1000), ((0.9, 0.99), 5000), ((0.9, 0.999), 300)])
def test_schedule_is_the_ranger21_packages(betas, total):
    r21 = pytest.importorskip("ranger21")
    lr = 2e-3
    with contextlib.redirect_stdout(io.StringIO()):  # the package prints as it goes
        package = r21.Ranger21([torch.nn.Parameter(torch.zeros(1))], lr=lr, betas=betas, num_epochs=total // 10,
                               num_batches_per_epoch=10)
        ours = gradwise.Ranger21([torch.nn.Parameter(torch.zeros(1))], lr=lr, betas=betas, num_epochs=total // 10,
                                 num_batches_per_epoch=10, compile=False)
        for step in range(1, total + 1):
            expected = lr
            if not package.warmup_complete:
                expected = package.warmup_dampening(expected, step)
            expected = package.get_warm_down(expected, step)
            assert lr * ours.schedule(step - 1) == pytest.approx(expected, rel=1e-12), step


@pytest.mark.parametrize("mode", ["train", "eval"])
def test_checkpoint_resumes_exactly(mode):
    n, kwargs = 57, dict(lr=1e-2, num_iterations=120, num_warmup_iterations=20, compile=False)

    model = mlp(torch.float64)
    optimizer = gradwise.Ranger21(model.parameters(), **kwargs)
    train_regression(model, optimizer, 0, n)
    optimizer.train(mode == "train")
    saved = copy.deepcopy({"model": model.state_dict(), "optimizer": optimizer.state_dict()})
    optimizer.train()
    train_regression(model, optimizer, n, 2 * n)

    fresh_model = mlp(torch.float64, seed=3)
    fresh = gradwise.Ranger21(fresh_model.parameters(), **kwargs)
    fresh_model.load_state_dict(saved["model"])
    fresh.load_state_dict(saved["optimizer"])
    fresh.train()
    train_regression(fresh_model, fresh, n, 2 * n)
    assert all(torch.equal(a, b) for a, b in zip(fresh_model.parameters(), model.parameters()))


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(), ValueError, "num_epochs and num_batches_per_epoch"),
    (dict(num_iterations=10, num_epochs=2, num_batches_per_epoch=5), ValueError, "not both"),
    (dict(num_iterations=0), ValueError, "num_iterations=0"),
    (dict(num_epochs=-1, num_batches_per_epoch=5), ValueError, "num_epochs=-1"),
    (dict(num_iterations=10, num_warmup_iterations=11), ValueError, "longer than the budget"),
    (dict(num_iterations=10, num_warmup_iterations=-1), ValueError, "warmup_steps=-1"),
    (dict(num_iterations=10, warmdown_min_lr=1.0), ValueError, "warmdown_min_lr=1.0"),
    (dict(num_iterations=10, warmdown_start_pct=1.5), ValueError, "warmdown_start_pct=1.5"),
    (dict(num_iterations=10, momentum_type="classic"), ValueError, "momentum_type='classic'"),
    (dict(num_iterations=10, lookahead_mergetime=0), ValueError, "lookahead_k=0"),
    (dict(num_iterations=10, agc_clipping_value=-1.0), ValueError, "agc_clipping_value=-1.0"),
    (dict(num_iterations=10, using_gc="yes"), TypeError, "using_gc='yes'"),
])
def test_bad_input(kwargs, error, message):
    with pytest.raises(error, match=message):
        gradwise.Ranger21([torch.nn.Parameter(torch.zeros(2, 2))], lr=1e-3, **kwargs)


def _package(params, **kwargs):
    r21 = pytest.importorskip("ranger21")
    with contextlib.redirect_stdout(io.StringIO()):
        return r21.Ranger21(params, **kwargs)


def _growing_gradient_run(make, steps, resume_at=None):
    """One parameter tensor, gradients growing 5% a step (so a running max of v equals v): the regime in
    which the authors' package's three slips (see README) change nothing."""
    p = torch.nn.Parameter(torch.randn(6, 5, generator=torch.Generator().manual_seed(0), dtype=torch.float64))
    optimizer = make([p])
    base = torch.randn(6, 5, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    trajectory = []
    for step in range(steps):
        if step == resume_at:
            saved = copy.deepcopy(optimizer.state_dict())
            optimizer = make([p])
            optimizer.load_state_dict(saved)
        p.grad = base * 1.05**step
        with contextlib.redirect_stdout(io.StringIO()):
            optimizer.step()
        trajectory.append([p.detach().clone()])
    return trajectory


# AGC, gradient centralization and normalization off: normalization would undo the growth
PACKAGE_CASE = dict(lr=1e-2, weight_decay=0.0, use_adaptive_gradient_clipping=False, using_gc=False,
                    using_normgc=False, num_epochs=12, num_batches_per_epoch=10, num_warmup_iterations=20)


def test_matches_the_ranger21_package_where_its_slips_are_inert():
    # the package divides positive-negative momentum by sqrt((1 + b2)^2 + b2^2) where the PNM paper (and
    # pytorch-optimizer) use beta0 = 1 in its place: a constant factor on the step, moved here into lr;
    # norm loss, which the factor does not touch, is off
    b2 = 0.999
    factor = math.sqrt(5) / math.sqrt((1 + b2) ** 2 + b2**2)
    case = dict(PACKAGE_CASE, lr=PACKAGE_CASE["lr"] * factor, warmdown_min_lr=3e-5 * factor, normloss_active=False)
    ours = _growing_gradient_run(lambda p: gradwise.Ranger21(p, compile=False, **case), STEPS)
    theirs = _growing_gradient_run(lambda p: _package(p, **dict(PACKAGE_CASE, normloss_active=False)), STEPS)
    assert_trajectories_close(ours, theirs, torch.float64)


def test_ranger21_package_loses_lookahead_on_resume_and_we_do_not():
    """The package keeps its Lookahead counter outside ``state_dict``: a resumed run merges at other steps."""
    resumed = _growing_gradient_run(lambda p: _package(p, **PACKAGE_CASE), 40, resume_at=13)
    straight = _growing_gradient_run(lambda p: _package(p, **PACKAGE_CASE), 40)
    assert not torch.allclose(resumed[-1][0], straight[-1][0], rtol=1e-6, atol=0)
    resumed = _growing_gradient_run(lambda p: gradwise.Ranger21(p, compile=False, **PACKAGE_CASE), 40, resume_at=13)
    straight = _growing_gradient_run(lambda p: gradwise.Ranger21(p, compile=False, **PACKAGE_CASE), 40)
    assert torch.equal(resumed[-1][0], straight[-1][0])


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
def test_three_dim_and_conv_shaped_parameters_match_pytorch_optimizer(dtype):
    """AGC's units of a 3-d tensor (fibres [i, :, k]) are not centralization's (slices [i]); 4-d ones are."""
    from tests.test_parity import run_bag

    gen = torch.Generator().manual_seed(5)
    params = [torch.randn(s, generator=gen, dtype=dtype).requires_grad_() for s in [(4, 3, 5), (3, 2, 2, 2), (7,), ()]]
    kwargs = dict(lr=1e-2, num_iterations=STEPS, agc_clipping_value=0.5)
    ours = run_bag(lambda p: gradwise.Ranger21(p, pnm_momentum_factor=0.9, num_warmup_iterations=10, compile=False,
                                               **kwargs), [p.detach().clone().requires_grad_() for p in params],
                   dtype, STEPS)
    theirs = run_bag(lambda p: _ranger21(p, beta0=0.9, num_warm_up_iterations=10, **kwargs),
                     [p.detach().clone().requires_grad_() for p in params], dtype, STEPS, reference=True)
    assert_trajectories_close(ours, theirs, dtype)


@pytest.mark.parametrize("bad_step, use_madgrad", [(3, False), (0, True)], ids=["adam-step-4", "madgrad-step-1"])
def test_a_nan_gradient_raises_naming_the_parameter_and_changes_nothing(bad_step, use_madgrad):
    """torch.optim.AdamW would poison one element; Ranger21's standard deviation and mean over all
    parameters would poison every one, and the NaN normalizer then failed every later step. The
    step is refused instead: parameters, state and the run that follows are those of a run that
    never saw it."""
    kwargs = dict(lr=1e-2, num_iterations=20, use_madgrad=use_madgrad, compile=False)
    model, clean = mlp(torch.float64), mlp(torch.float64)
    opt = gradwise.Ranger21(model.named_parameters(), **kwargs)
    reference = gradwise.Ranger21(clean.named_parameters(), **kwargs)
    train_regression(model, opt, 0, bad_step)
    train_regression(clean, reference, 0, bad_step)
    before = copy.deepcopy(opt.state_dict())
    weights = [p.detach().clone() for p in model.parameters()]
    x, y = regression_batch(torch.float64, bad_step)
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    model[0].bias.grad[1] = float("nan")
    with pytest.raises(ValueError, match=r"parameter '0.bias' has NaN or inf in its gradient.*skip_nonfinite=True"):
        opt.step()
    assert all(torch.equal(p, w) for p, w in zip(model.parameters(), weights))
    after = opt.state_dict()
    assert before["state"].keys() == after["state"].keys()
    for key, entry in before["state"].items():
        assert entry.keys() == after["state"][key].keys()
        assert all(torch.equal(v, after["state"][key][k]) for k, v in entry.items())
    train_regression(model, opt, bad_step, bad_step + 4)
    train_regression(clean, reference, bad_step, bad_step + 4)
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), clean.parameters()))


@pytest.mark.parametrize("use_madgrad", [False, True])
def test_a_checkpoint_from_before_it_was_a_plain_chain_resumes_exactly(use_madgrad):
    """Ranger21's prologue saved the running sum of v as 'ranger21.variance_sum'; the chain's second-moment
    link keeps the same value under its own name, and a load renames it."""
    kwargs = dict(lr=1e-2, num_iterations=60, num_warmup_iterations=10, use_madgrad=use_madgrad, compile=False)
    model = mlp(torch.float64)
    optimizer = gradwise.Ranger21(model.parameters(), **kwargs)
    train_regression(model, optimizer, 0, 7)
    saved = copy.deepcopy({"model": model.state_dict(), "optimizer": optimizer.state_dict()})
    new_key = "second_moment.variance_sum" if use_madgrad else "pnm.variance_sum"
    for entry in saved["optimizer"]["state"].values():  # the layout the prologue saved
        entry["ranger21.variance_sum"] = entry.pop(new_key)
    train_regression(model, optimizer, 7, 14)

    resumed_model = mlp(torch.float64, seed=3)
    resumed = gradwise.Ranger21(resumed_model.parameters(), **kwargs)
    resumed_model.load_state_dict(saved["model"])
    resumed.load_state_dict(saved["optimizer"])
    train_regression(resumed_model, resumed, 7, 14)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), resumed_model.parameters()))
    assert all(new_key in entry for entry in resumed.state_dict()["state"].values())
