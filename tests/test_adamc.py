"""AdamC against pytorch-optimizer 4.1.0 and a float64 AdamC written from the paper, under a decaying learning
rate with normalized and other groups, and bad input (the registry's generic tests cover resume, compile, state
formats, FSDP2)."""
from __future__ import annotations

import math

import pytest
import torch

import gradwise
from tests.models import bag_of_tensors, mlp, regression_batch
from tests.registry import _pytorch_optimizer
from tests.test_parity import _clone, assert_trajectories_close, run_bag

STEPS = 25


def decaying(optimizer, step):
    """A linear decay from each group's initial lr, as a scheduler's, so that lr_t / max_lr moves."""
    for group in optimizer.param_groups:
        group["lr"] = group.setdefault("initial_lr", group["lr"]) * (1 - step / (2 * STEPS))


def normalized_first(params):
    return [dict(params=params[:3], normalized=True), dict(params=params[3:])]


class PaperAdamC(torch.optim.Optimizer):
    """AdamC (Defazio et al. 2025, Algorithm 1), float64: Adam's moments, eps after sqrt(v), the bias corrections on
    the step; p <- p - lr_t (u + wd lr_t / max_lr p) for a normalized layer, p <- p - lr_t (u + wd p) otherwise."""

    def __init__(self, params, lr, betas, eps, weight_decay):
        self.max_lr = lr
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, normalized=False))

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            (b1, b2), lr = group["betas"], group["lr"]
            wd = group["weight_decay"] * (lr / self.max_lr if group["normalized"] else 1.0)
            for p in group["params"]:
                state = self.state[p]
                if not state:
                    state.update(t=0, m=torch.zeros_like(p), v=torch.zeros_like(p))
                state["t"] += 1
                t, g = state["t"], p.grad
                state["m"] = b1 * state["m"] + (1 - b1) * g
                state["v"] = b2 * state["v"] + (1 - b2) * g * g
                u = math.sqrt(1 - b2**t) / (1 - b1**t) * state["m"] / (state["v"].sqrt() + group["eps"])
                p -= lr * (u + wd * p)


KWARGS = dict(lr=0.01, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.5)


def test_matches_the_paper_in_float64_on_a_model_with_tiny_gradients():
    """An MLP's tiny gradients are where pytorch-optimizer's sqrt(v + 1e-15) parts from the paper's sqrt(v)."""
    def run(make):
        model = mlp(torch.float64)
        params = list(model.parameters())
        optimizer = make(normalized_first(params))
        for step in range(STEPS):
            x, y = regression_batch(torch.float64, step)
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            decaying(optimizer, step)
            optimizer.step()
        return [p.detach() for p in params]

    ours = run(lambda p: gradwise.AdamC(p, compile=False, **KWARGS))
    theirs = run(lambda p: PaperAdamC(p, **KWARGS))
    assert_trajectories_close([ours], [theirs], torch.float64)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("kwargs", [KWARGS, dict(lr=0.01, weight_decay=0.1, weight_decouple=False)],
                         ids=["decoupled", "l2"])
def test_matches_pytorch_optimizer_under_a_schedule(kwargs, dtype):
    params = bag_of_tensors(dtype)
    ours = run_bag(lambda p: gradwise.AdamC(normalized_first(p), compile=False, **kwargs), _clone(params), dtype,
                   STEPS, before_step=decaying)
    theirs = run_bag(lambda p: _pytorch_optimizer("AdamC")(normalized_first(p), **kwargs), _clone(params), dtype,
                     STEPS, reference=True, before_step=decaying)
    assert_trajectories_close(ours, theirs, dtype)


def test_the_correction_scales_only_the_normalized_groups_decay():
    """One step from a zero gradient: Adam's part is 0, so p moves by -lr wd p, with wd scaled by lr / max_lr in
    the normalized group only."""
    a, b = (torch.ones(3, dtype=torch.float64, requires_grad=True) for _ in range(2))
    optimizer = gradwise.AdamC([dict(params=[a], normalized=True), dict(params=[b])], lr=0.1, weight_decay=0.5,
                               compile=False)
    for group in optimizer.param_groups:
        group["lr"] = 0.02  # a scheduler's, at a fifth of the peak
    a.grad, b.grad = torch.zeros(3, dtype=torch.float64), torch.zeros(3, dtype=torch.float64)
    optimizer.step()
    torch.testing.assert_close(a.detach(), torch.full((3,), 1 - 0.02 * 0.5 * 0.02 / 0.1, dtype=torch.float64),
                               rtol=1e-15, atol=0)
    torch.testing.assert_close(b.detach(), torch.full((3,), 1 - 0.02 * 0.5, dtype=torch.float64), rtol=1e-15, atol=0)


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(fixed_decay=True), ValueError, r"invalid fixed_decay=True: expected False \(True is not offered\)"),
    (dict(ams_bound=True), ValueError, r"invalid ams_bound=True: expected False \(True is not offered\)"),
    (dict(weight_decouple="yes"), TypeError, r"invalid weight_decouple='yes': expected True or False"),
    (dict(weight_decay=-0.1), ValueError, r"invalid weight_decay=-0\.1: expected a finite number >= 0"),
])
def test_bad_arguments_are_named(kwargs, error, message):
    with pytest.raises(error, match=message):
        gradwise.AdamC([torch.zeros(3, requires_grad=True)], **kwargs)


def test_a_bad_group_is_refused_before_anything_changes():
    p = torch.ones(3, requires_grad=True)
    optimizer = gradwise.AdamC([p], weight_decay=0.1, compile=False)
    p.grad = torch.ones(3)
    optimizer.step()
    before, start = {k: v.clone() for k, v in optimizer.state[p].items()}, p.detach().clone()
    optimizer.param_groups[0]["max_lr"] = 0.0
    with pytest.raises(ValueError, match=r"invalid max_lr=0\.0: expected a finite number > 0"):
        optimizer.step()
    assert torch.equal(p.detach(), start)
    assert all(torch.equal(v, before[k]) for k, v in optimizer.state[p].items())
    with pytest.raises(TypeError, match=r"invalid normalized='yes': expected True or False"):
        gradwise.AdamC([dict(params=[torch.zeros(2, requires_grad=True)], normalized="yes")])
