"""MicroAdam against a float64 reference written from the paper's Algorithm 1 (Modoranu et al. 2024,
arXiv:2405.15593) with the authors' storage (bfloat16 window values, 4-bit min-max error blocks, Top-K in
blocks of 2^15), step by step; what the window and the error feedback hold; bad input (the registry's generic
tests cover resume, compile, state formats, FSDP2). pytorch-optimizer 4.1.0 has no MicroAdam, and the authors'
package needs CUDA kernels."""
from __future__ import annotations

import math

import pytest
import torch

import gradwise
from tests.models import bag_of_tensors, step_beside_reference

STEPS = 25


class Reference:
    """One parameter, flattened: the window as m dense vectors (zeros outside each step's Top-K), the error
    feedback as the dense value its 4-bit codes stand for."""

    def __init__(self, p, kw):
        self.kw, self.d, self.t = kw, p.numel(), 0
        self.window = [torch.zeros(self.d, dtype=torch.float64) for _ in range(kw.get("m", 10))]
        self.error = torch.zeros(self.d, dtype=torch.float64)

    def direction(self, g):
        kw, self.t = self.kw, self.t + 1
        density, qblock = kw.get("k_init", 0.01), kw.get("quant_block_size", 100_000)
        a = g.reshape(-1) + self.error
        kept = torch.zeros(self.d, dtype=torch.bool)
        block = max(min(self.d, 2**15), 1)
        for start in range(0, self.d, block):
            piece = a[start:start + block]
            kept[piece.abs().topk(math.ceil(piece.numel() * density)).indices + start] = True
        self.window[(self.t - 1) % len(self.window)] = torch.where(kept, a.to(torch.bfloat16).double(), 0.0)
        a = torch.where(kept, 0.0, a)
        block_of = torch.arange(self.d) // qblock  # e <- Q^-1(Q(a)), block by block
        low = torch.zeros(-(-self.d // qblock), dtype=torch.float64).scatter_reduce(0, block_of, a, "amin",
                                                                                    include_self=False)[block_of]
        high = torch.zeros_like(low).scatter_reduce(0, block_of, a, "amax", include_self=False)[block_of]
        unit = (high - low) / 15
        codes = torch.where(unit > 0, torch.floor((a - low) / unit + 0.5).clamp(0, 15), 0.0)
        self.error = codes * unit + low
        b1, b2 = kw.get("betas", (0.9, 0.999))
        ages = [(self.t - 1 - r) % len(self.window) for r in range(len(self.window))]
        m = sum(b1**age * w for age, w in zip(ages, self.window)) * (1 - b1) / (1 - b1**self.t)
        v = sum(b2**age * w * w for age, w in zip(ages, self.window)) * (1 - b2) / (1 - b2**self.t)
        return (m / (v.sqrt() + kw.get("eps", 1e-8))).view(g.shape)


def _params():
    gen = torch.Generator().manual_seed(1)
    long = torch.randn(40_000, generator=gen, dtype=torch.float64).requires_grad_()  # two Top-K blocks
    return [*bag_of_tensors(torch.float64), long]


def _compare(kwargs):
    ours = _params()
    theirs = [p.detach().clone() for p in ours]
    optimizer = gradwise.MicroAdam(ours, compile=False, **kwargs)
    references = [Reference(p, kwargs) for p in theirs]

    def reference_step(i, p, g):
        p -= kwargs["lr"] * (references[i].direction(g) + kwargs.get("weight_decay", 0.0) * p)

    step_beside_reference(optimizer, ours, theirs, STEPS, reference_step)
    return optimizer, ours


CONFIGS = {"defaults": dict(lr=0.01),
           "short-window": dict(lr=0.01, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1, m=3, k_init=0.3,
                                quant_block_size=7)}


@pytest.mark.parametrize("kwargs", CONFIGS.values(), ids=CONFIGS.keys())
def test_matches_the_paper(kwargs):
    optimizer, params = _compare(kwargs)
    state = optimizer.state[params[-1]]
    k = math.ceil(2**15 * kwargs.get("k_init", 0.01)) + math.ceil((40_000 - 2**15) * kwargs.get("k_init", 0.01))
    assert state["micro_adam.window_indices"].shape == (kwargs.get("m", 10), k)
    assert state["micro_adam.window_values"].dtype == torch.bfloat16
    assert state["micro_adam.error"].shape == (20_000,) and state["micro_adam.error"].dtype == torch.uint8


def test_a_step_moves_only_the_window_entries_and_feeds_the_rest_back():
    """One step from zero state moves exactly the Top-K entries; the others come back in the next gradient."""
    p = torch.zeros(100, dtype=torch.float64, requires_grad=True)
    optimizer = gradwise.MicroAdam([p], lr=0.1, k_init=0.05, quant_block_size=100, compile=False)
    p.grad = torch.arange(1, 101, dtype=torch.float64) * torch.tensor([1.0, -1.0], dtype=torch.float64).repeat(50)
    optimizer.step()
    assert torch.equal((p.detach() != 0).nonzero().view(-1), torch.arange(95, 100))
    p.grad = torch.zeros(100, dtype=torch.float64)
    optimizer.step()  # the gradient is zero: its Top-K is the largest fed-back error, beside the last step's
    assert (p.detach() != 0).sum() == 10


def test_the_window_forgets_a_gradient_after_m_steps():
    p = torch.zeros(4, dtype=torch.float64, requires_grad=True)
    optimizer = gradwise.MicroAdam([p], lr=1.0, m=2, k_init=0.25, compile=False)
    for grad in ([0.0, 0.0, 0.0, 8.0], [0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]):
        before = p.detach().clone()
        p.grad = torch.tensor(grad, dtype=torch.float64)
        optimizer.step()
    assert torch.equal(p.detach()[3], before[3]) and torch.all(p.detach()[:3] == 0)  # 8 has left the window


@pytest.mark.parametrize("kwargs, message", [
    (dict(m=0), r"invalid m=0: expected an integer >= 1 \(gradients in the window\)"),
    (dict(k_init=0.0), r"invalid k_init=0\.0: expected a number in \(0, 1\] \(the Top-K density\)"),
    (dict(k_init=1.5), r"invalid k_init=1\.5: expected a number in \(0, 1\]"),
    (dict(quant_block_size=0), r"invalid quant_block_size=0: expected an integer >= 1"),
    (dict(eps=0.0), r"invalid eps=0\.0: expected a finite number > 0"),
])
def test_bad_arguments_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        gradwise.MicroAdam([torch.zeros(3, requires_grad=True)], **kwargs)


def test_estimate_counts_the_window_and_the_error_feedback():
    params = [*bag_of_tensors(torch.float32), torch.zeros(40_000, requires_grad=True)]
    optimizer = gradwise.MicroAdam(params, compile=False)
    for p in params:
        p.grad = torch.ones_like(p)
    optimizer.step()
    held = sum(v.numel() * v.element_size() for state in optimizer.state.values() for v in state.values())
    assert gradwise.estimate(params, gradwise.MicroAdam).total == held
    assert gradwise.estimate(params, gradwise.MicroAdam).by("format")["uint8"] == sum((p.numel() + 1) // 2
                                                                                     for p in params)
