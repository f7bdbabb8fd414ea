"""MARS against pytorch-optimizer 4.1.0 and a float64 MARS-AdamW written from the paper, ``mars_correction``
on its own, and bad input (the registry's generic tests cover resume, compile, state formats, FSDP2)."""
from __future__ import annotations

import math

import pytest
import torch

import gradwise
from gradwise import Optimizer, chain
from gradwise.transforms import mars_correction, scale_by_bias_correction, scale_by_learning_rate
from tests.models import bag_of_tensors
from tests.registry import _pytorch_optimizer
from tests.test_parity import _clone, assert_trajectories_close, run_bag

STEPS = 25
CONFIGS = [dict(lr=0.01, gamma=0.05, weight_decay=0.1), dict(lr=0.01, optimize_1d=True, betas=(0.9, 0.99)),
           dict(lr=0.01, lr_1d=0.02, weight_decay_1d=0.05, betas_1d=(0.8, 0.9))]


class PaperMARS(torch.optim.Optimizer):
    """MARS-AdamW (Yuan et al. 2024, Algorithm 2 with the approximate correction), float64, for tensors of 2+
    dimensions: c = g + gamma b1 / (1 - b1) (g - g_prev), clipped to norm 1; Adam's moments of c, eps after
    sqrt(v), bias corrections on the step; decoupled weight decay."""

    def __init__(self, params, lr, betas=(0.95, 0.99), gamma=0.025, weight_decay=0.0, eps=1e-8):
        super().__init__(params, dict(lr=lr, betas=betas, gamma=gamma, weight_decay=weight_decay, eps=eps))

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            (b1, b2), lr = group["betas"], group["lr"]
            for p in group["params"]:
                state = self.state[p]
                if not state:
                    state.update(t=0, m=torch.zeros_like(p), v=torch.zeros_like(p), last=torch.zeros_like(p))
                state["t"] += 1
                t, g = state["t"], p.grad
                c = g + group["gamma"] * b1 / (1 - b1) * (g - state["last"])
                c = c / max(float(c.norm()), 1.0)
                state["last"] = g.clone()
                state["m"] = b1 * state["m"] + (1 - b1) * c
                state["v"] = b2 * state["v"] + (1 - b2) * c * c
                u = math.sqrt(1 - b2**t) / (1 - b1**t) * state["m"] / (state["v"].sqrt() + group["eps"])
                p -= lr * (u + group["weight_decay"] * p)


def test_matrices_match_the_paper_in_float64():
    params = [p for p in bag_of_tensors(torch.float64) if p.dim() >= 2]
    kwargs = dict(lr=0.01, gamma=0.05, weight_decay=0.1)
    ours = run_bag(lambda p: gradwise.MARS(p, compile=False, **kwargs), _clone(params), torch.float64, STEPS)
    theirs = run_bag(lambda p: PaperMARS(p, **kwargs), _clone(params), torch.float64, STEPS)
    assert_trajectories_close(ours, theirs, torch.float64)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("kwargs", CONFIGS, ids=["matrices", "optimize_1d", "own-1d"])
def test_matches_pytorch_optimizer(kwargs, dtype):
    """Within 1e-8 in float64: the package takes sqrt(v + 1e-15) where the paper takes sqrt(v)."""
    params = bag_of_tensors(dtype)
    ours = run_bag(lambda p: gradwise.MARS(p, compile=False, **kwargs), _clone(params), dtype, STEPS)
    theirs = run_bag(lambda p: _pytorch_optimizer("MARS")(p, **kwargs), _clone(params), dtype, STEPS,
                     reference=True)
    tolerance = dict(rtol=1e-8, atol=1e-8) if dtype == torch.float64 else {}
    assert_trajectories_close(ours, theirs, dtype, **tolerance)


def test_the_correction_is_clipped_to_unit_norm_and_remembers_the_gradient():
    p = torch.zeros(2, 2, dtype=torch.float64, requires_grad=True)
    # scale_by_bias_correction declares betas and, with correct_bias=False, passes the correction through
    optimizer = Optimizer([p], chain(mars_correction(), scale_by_bias_correction(), scale_by_learning_rate()),
                          lr=1.0, gamma=0.5, betas=(0.5, 0.9), correct_bias=False, compile=False)
    grads = [torch.tensor([[0.1, 0.0], [0.0, 0.2]]), torch.tensor([[3.0, 0.0], [4.0, 0.1]])]
    moved = []
    for g in grads:
        before = p.detach().clone()
        p.grad = g.double()
        optimizer.step()
        moved.append(p.detach() - before)
    torch.testing.assert_close(moved[0], -1.5 * grads[0].double())  # gamma b1 / (1 - b1) = 0.5; norm < 1
    c = grads[1] + 0.5 * (grads[1] - grads[0])
    torch.testing.assert_close(moved[1], -(c / c.norm()).double())
    assert torch.equal(optimizer.state[p]["mars.last_grad"], grads[1].double())


def test_a_chain_without_betas_is_refused_at_its_first_step_and_nothing_changes():
    p = torch.ones(3, requires_grad=True)
    optimizer = Optimizer([p], chain(mars_correction(), scale_by_learning_rate()), lr=0.1, compile=False)
    p.grad = torch.ones(3)
    with pytest.raises(ValueError, match=r"mars_correction\(\) reads beta1 from the group's 'betas'"):
        optimizer.step()
    assert torch.equal(p.detach(), torch.ones(3)) and not optimizer.state


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match=r"invalid gamma=-0\.1: expected a finite number >= 0"):
        gradwise.MARS([torch.zeros(3, 3, requires_grad=True)], gamma=-0.1)
    with pytest.raises(ValueError, match=r"invalid betas\[0\]=1\.0 in betas=\(1\.0, 0\.99\)"):
        gradwise.MARS([torch.zeros(3, 3, requires_grad=True)], betas=(1.0, 0.99))
