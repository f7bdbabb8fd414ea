"""Every recipe equals its authors' implementation step by step, and compiled equals eager."""
from __future__ import annotations

import contextlib

import pytest
import torch

from tests.models import bag_of_tensors, default_dtype, mlp, regression_batch
from tests.registry import CASES, REFERENCED, Case, nudge_hyperparameters

STEPS = 50
TOLERANCE = {torch.float64: dict(rtol=1e-10, atol=1e-10), torch.float32: dict(rtol=1e-5, atol=1e-6)}


def _clone(params):
    return [p.detach().clone().requires_grad_() for p in params]


def _random_grads(params, step):
    gen = torch.Generator().manual_seed(step)
    return [torch.randn(p.shape, generator=gen, dtype=p.dtype).to(p.device) for p in params]  # CPU draws, any device


def run_bag(make, params, dtype, steps=STEPS, reference=False, before_step=None):
    """The trajectory of ``make(params)`` on random gradients; ``before_step(optimizer, step)``, when
    given, runs before each step (a scheduler)."""
    with default_dtype(dtype) if reference else contextlib.nullcontext():
        optimizer = make(params)
        trajectory = []
        for step in range(steps):
            for p, g in zip(params, _random_grads(params, step)):
                p.grad = g.t().contiguous().t() if not p.is_contiguous() else g
            if before_step is not None:
                before_step(optimizer, step)
            optimizer.step()
            trajectory.append([p.detach().clone() for p in params])
    return trajectory


def run_mlp(make, dtype, steps=STEPS, reference=False):
    model = mlp(dtype)
    with default_dtype(dtype) if reference else contextlib.nullcontext():
        optimizer = make(list(model.parameters()))
        trajectory = []
        for step in range(steps):
            x, y = regression_batch(dtype, step)
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
            trajectory.append([p.detach().clone() for p in model.parameters()])
    return trajectory


def assert_trajectories_close(ours, theirs, dtype, **tolerance):
    tolerance = tolerance or TOLERANCE[dtype]
    for step, (a, b) in enumerate(zip(ours, theirs)):
        for i, (x, y) in enumerate(zip(a, b)):
            torch.testing.assert_close(x, y, **tolerance, msg=lambda m: f"step {step}, tensor {i}: {m}")


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("case", REFERENCED, ids=lambda c: c.name)
def test_bag_of_tensors_matches_reference(case: Case, dtype):
    params = bag_of_tensors(dtype)
    ours = run_bag(lambda p: case.ours(p, compile=False), _clone(params), dtype)
    theirs = run_bag(case.theirs, _clone(params), dtype, reference=True)
    assert_trajectories_close(ours, theirs, dtype)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("case", [c for c in REFERENCED if c.trains], ids=lambda c: c.name)
def test_mlp_training_matches_reference(case: Case, dtype):
    ours = run_mlp(lambda p: case.ours(p, compile=False), dtype)
    theirs = run_mlp(case.theirs, dtype, reference=True)
    assert_trajectories_close(ours, theirs, dtype)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("case", [c for c in CASES if c.compiles], ids=lambda c: c.name)
def test_compiled_equals_eager(case: Case, dtype):
    """Every tensor of the bag in float32; in float64 (where a constant computed in float32 would show, at 1e-12)
    the 0-d, vector, matrix and empty ones: the 4-d and the transposed matrix compile graphs of their own (a rank,
    a layout) at some seconds each, their float32 graphs checked here and their float64 eager steps by the
    reference tests above."""
    params = bag_of_tensors(dtype)
    if dtype == torch.float64:
        params = [p for p in params if p.dim() < 3 and p.is_contiguous()]
    steps = 20
    compiled_optimizers = []

    def make_compiled(p):
        compiled_optimizers.append(case.ours(p, compile=True))
        return compiled_optimizers[-1]

    compiled = run_bag(make_compiled, _clone(params), dtype, steps)
    eager = run_bag(lambda p: case.ours(p, compile=False), _clone(params), dtype, steps)
    assert compiled_optimizers[0].compile_stats["compiles"] >= 1, "the compiled path did not compile"
    tight = dict(rtol=1e-12, atol=1e-12) if dtype == torch.float64 else dict(rtol=1e-6, atol=1e-7)
    assert_trajectories_close(compiled, eager, dtype, **tight)


@pytest.mark.slow
@pytest.mark.parametrize("case", [c for c in CASES if c.compiles], ids=lambda c: c.name)
def test_compiled_groups_equal_eager(case: Case):
    """Enough parameters, each of its own length, to fill grouped compiled calls and leave a remainder,
    which runs padded in the same graph; a scheduler changes every float hyperparameter (lr, betas,
    weight decay, eps, ...) before every step, and nothing compiles after the first step."""
    gen = torch.Generator().manual_seed(3)
    params = [torch.randn(n + 2, generator=gen).requires_grad_() for n in range(19)]
    holder, first = [], []

    def schedule(optimizer, step):
        if step == 1:
            first.append(optimizer.compile_stats["compiles"])
        nudge_hyperparameters(optimizer, step)

    compiled = run_bag(lambda p: holder.append(case.ours(p, compile=True)) or holder[-1], _clone(params),
                       torch.float32, 10, before_step=schedule)
    eager = run_bag(lambda p: case.ours(p, compile=False), _clone(params), torch.float32, 10,
                    before_step=nudge_hyperparameters)
    assert first[0] >= 1 and holder[0].compile_stats["compiles"] == first[0], "a hyperparameter change recompiled"
    if holder[0].transform.elementwise:
        assert first[0] == 1, "one grouped graph, the remainder padded"
    assert_trajectories_close(compiled, eager, torch.float32, rtol=1e-6, atol=1e-7)



@pytest.mark.parametrize("case", REFERENCED, ids=lambda c: c.name)
def test_eager_pieces_match_reference(case: Case):
    """A tensor larger than the eager path's piece (EAGER_CHUNK elements) is stepped piece by piece."""
    from gradwise.core.eager import EAGER_CHUNK

    gen = torch.Generator().manual_seed(5)
    params = [torch.randn(3, EAGER_CHUNK + 7, generator=gen, dtype=torch.float64).requires_grad_(),
              torch.randn(5, generator=gen, dtype=torch.float64).requires_grad_()]
    ours = run_bag(lambda p: case.ours(p, compile=False), _clone(params), torch.float64, 5)
    theirs = run_bag(case.theirs, _clone(params), torch.float64, 5, reference=True)
    assert_trajectories_close(ours, theirs, torch.float64)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("name, options", [("AdamW", {}), ("AdamW", {"amsgrad": True}), ("AdamW", {"maximize": True}),
                                           ("AdamW", {"weight_decay": 0.0}), ("Adam", {})], ids=str)
def test_adam_eagerly_has_torchs_bits(name, options, dtype):
    """Eagerly, AdamW and Adam without L2 decay run torch.optim's ops in its order (``transforms/adam.py``):
    its bits at every step, on its for-loop path and its foreach path alike, in one piece or in several."""
    import gradwise
    from gradwise.core.eager import EAGER_CHUNK

    gen = torch.Generator().manual_seed(6)
    params = bag_of_tensors(dtype) + [torch.randn(EAGER_CHUNK + 7, generator=gen, dtype=dtype).requires_grad_()]
    kwargs = dict(lr=0.01, betas=(0.8, 0.99), **options)
    ours = run_bag(lambda p: getattr(gradwise, name)(p, compile=False, **kwargs), _clone(params), dtype, 20)
    for foreach in (False, True):
        theirs = run_bag(lambda p: getattr(torch.optim, name)(p, foreach=foreach, **kwargs), _clone(params), dtype, 20)
        for step, (a, b) in enumerate(zip(ours, theirs)):
            assert all(torch.equal(x, y) for x, y in zip(a, b)), f"foreach={foreach}, step {step}"
