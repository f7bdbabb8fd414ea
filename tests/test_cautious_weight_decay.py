"""``cautious_weight_decay`` after the cores of AdamW, Lion and Muon against float64 references written from
the paper (Chen et al. 2025, arXiv:2510.12402; pytorch-optimizer 4.1.0 has no such option), the mask on
one step, and compiled equals eager (it is elementwise)."""
from __future__ import annotations

import pytest
import torch

from gradwise import Optimizer, chain
from gradwise.transforms import (
    cautious_weight_decay,
    orthogonalize_by_newton_schulz,
    scale_by_adam,
    scale_by_learning_rate,
    scale_by_lion,
    scale_by_shape,
    trace_ema,
)
from tests.models import bag_of_tensors
from tests.test_parity import _clone, assert_trajectories_close, run_bag

STEPS = 25


def _adam(state, g, b1=0.9, b2=0.95, eps=1e-8):
    state["t"] = state.get("t", 0) + 1
    state["m"] = b1 * state.get("m", 0 * g) + (1 - b1) * g
    state["v"] = b2 * state.get("v", 0 * g) + (1 - b2) * g * g
    return (state["m"] / (1 - b1 ** state["t"])) / ((state["v"] / (1 - b2 ** state["t"])).sqrt() + eps)


def _lion(state, g, b1=0.9, b2=0.99):
    m = state.get("m", 0 * g)
    u = (b1 * m + (1 - b1) * g).sign()
    state["m"] = b2 * m + (1 - b2) * g
    return u


class CautiousDecay(torch.optim.Optimizer):
    """p <- p - lr (u + wd 1(u p >= 0) p), u the core's update (float64, the paper's Algorithm 1)."""

    def __init__(self, params, core, lr, weight_decay):
        super().__init__(params, dict(lr=lr, weight_decay=weight_decay))
        self.core = core

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            for p in group["params"]:
                u = self.core(self.state[p], p.grad)
                p -= group["lr"] * (u + group["weight_decay"] * (u * p >= 0).to(p.dtype) * p)


@pytest.mark.parametrize("core, reference, kwargs", [
    (scale_by_adam, _adam, dict(betas=(0.9, 0.95), eps=1e-8)),
    (scale_by_lion, _lion, dict(betas=(0.9, 0.99))),
], ids=["adamw", "lion"])
def test_matches_the_paper_in_float64(core, reference, kwargs):
    params = bag_of_tensors(torch.float64)
    transform = chain(core(), cautious_weight_decay(), scale_by_learning_rate())
    ours = run_bag(lambda p: Optimizer(p, transform, lr=0.01, weight_decay=0.5, compile=False, **kwargs),
                   _clone(params), torch.float64, STEPS)
    theirs = run_bag(lambda p: CautiousDecay(p, reference, lr=0.01, weight_decay=0.5), _clone(params), torch.float64,
                     STEPS)
    assert_trajectories_close(ours, theirs, torch.float64)


def test_decays_only_where_the_update_agrees_with_the_parameter():
    """Muon's chain: one step of a 2 x 2 matrix whose update agrees with p on the diagonal only."""
    p = torch.tensor([[1.0, 1.0], [1.0, 1.0]], dtype=torch.float64, requires_grad=True)
    muon = chain(trace_ema(), orthogonalize_by_newton_schulz(), scale_by_shape(), cautious_weight_decay(),
                 scale_by_learning_rate())
    optimizer = Optimizer([p], muon, lr=0.1, weight_decay=0.5, ns_dtype=None, compile=False)
    undecayed = Optimizer([q := p.detach().clone().requires_grad_()], muon, lr=0.1, weight_decay=0.0, ns_dtype=None,
                          compile=False)
    p.grad = torch.tensor([[1.0, -1.0], [-1.0, 1.0]], dtype=torch.float64)
    q.grad = p.grad.clone()
    optimizer.step()
    undecayed.step()
    decayed = torch.tensor([[1.0, 0.0], [0.0, 1.0]], dtype=torch.float64)  # where the step (-u) shrinks p
    torch.testing.assert_close(p.detach(), q.detach() - 0.1 * 0.5 * decayed, rtol=1e-14, atol=1e-14)


@pytest.mark.slow
def test_compiled_equals_eager():
    params = bag_of_tensors(torch.float32)
    transform = chain(scale_by_adam(), cautious_weight_decay(), scale_by_learning_rate())
    holder = []

    def compiled(p):
        holder.append(Optimizer(p, transform, lr=0.01, weight_decay=0.5, compile=True))
        return holder[-1]

    ours = run_bag(compiled, _clone(params), torch.float32, 10)
    eager = run_bag(lambda p: Optimizer(p, transform, lr=0.01, weight_decay=0.5, compile=False), _clone(params),
                    torch.float32, 10)
    assert holder[0].compile_stats["compiles"] >= 1
    assert_trajectories_close(ours, eager, torch.float32, rtol=1e-6, atol=1e-7)
