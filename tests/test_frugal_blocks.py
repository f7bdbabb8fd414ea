"""FRUGAL's block-style subspace (``subspace="blocks"``) against a float64 reference written from the paper
(Zmushko et al. 2024, arXiv:2411.07837): AdamW on the active blocks, fresh at each activation, signSGD on the
others, the active set shifting every T steps; exact resume across a switch; bad input."""
from __future__ import annotations

import math

import pytest
import torch

import gradwise
from tests.models import bag_of_tensors, sin_loss
from tests.test_parity import _clone, assert_trajectories_close, run_bag

STEPS = 25
GAP = 4  # switches at steps 5, 9, 13, ...


def _reference(params, kw, strided, steps):
    """AdamW state only for the active block: created at zero when it becomes active, counted from there."""
    b1, b2 = kw.get("betas", (0.9, 0.999))
    stride, moments = kw["block_stride"], {}
    for t in range(1, steps + 1):
        leaves = [p.detach().requires_grad_() for p in params]
        grads = torch.autograd.grad(sin_loss(leaves, t - 1), leaves)
        period, s = (t - 1) // GAP, (t - 1) % GAP + 1
        params = [p.detach() for p in leaves]
        for i, (p, g) in enumerate(zip(params, grads)):
            active = i not in strided or (i - period) % stride == 0
            if active:
                if i in strided and s == 1 or i not in moments:
                    moments[i] = (torch.zeros_like(p), torch.zeros_like(p))
                m, v = moments[i]
                m.mul_(b1).add_((1 - b1) * g)
                v.mul_(b2).add_((1 - b2) * g * g)
                count = s if i in strided else t
                u = m / (v.sqrt() + kw.get("eps", 1e-8)) * math.sqrt(1 - b2**count) / (1 - b1**count)
            else:
                u = kw.get("rest_scale", 1.0) * g.sign()
            p -= kw["lr"] * (u + kw.get("weight_decay", 0.0) * p)
    return params


def _ours(params, kw, steps, optimizer=None):
    groups = [{"params": params[:2], "block_stride": None}, {"params": params[2:]}]
    optimizer = optimizer or gradwise.FRUGAL(groups, compile=False, subspace="blocks", update_proj_gap=GAP, **kw)
    for step in range(steps):
        optimizer.zero_grad()
        sin_loss(params, step).backward()
        optimizer.step()
    return optimizer


CASES = {"stride-3": dict(lr=0.01, block_stride=3),
         "stride-2-decay": dict(lr=0.01, block_stride=2, betas=(0.8, 0.99), weight_decay=0.1, rest_scale=0.3, eps=1e-6)}


@pytest.mark.parametrize("kwargs", CASES.values(), ids=CASES.keys())
def test_blocks_match_the_paper(kwargs):
    ours = bag_of_tensors(torch.float64)
    theirs = _reference([p.detach().clone() for p in ours], kwargs, set(range(2, len(ours))), STEPS)
    _ours(ours, kwargs, STEPS)
    for i, (a, b) in enumerate(zip(ours, theirs)):
        torch.testing.assert_close(a.detach(), b, rtol=1e-10, atol=1e-10, msg=lambda m, i=i: f"{i}: {m}")


def test_resume_across_a_switch_is_exact():
    kwargs = CASES["stride-3"]
    straight = bag_of_tensors(torch.float64)
    _ours(straight, kwargs, 10)
    first = bag_of_tensors(torch.float64)
    saved = _ours(first, kwargs, 6).state_dict()
    resumed = [p.detach().clone().requires_grad_() for p in first]
    groups = [{"params": resumed[:2], "block_stride": None}, {"params": resumed[2:]}]
    optimizer = gradwise.FRUGAL(groups, compile=False, subspace="blocks", update_proj_gap=GAP, **kwargs)
    optimizer.load_state_dict(saved)
    for step in range(6, 10):
        optimizer.zero_grad()
        sin_loss(resumed, step).backward()
        optimizer.step()
    assert all(torch.equal(a, b) for a, b in zip(straight, resumed))


@pytest.mark.parametrize("kwargs, message", [
    (dict(subspace="tiles"), r"invalid subspace='tiles': expected one of \['galore', 'blocks'\]"),
    (dict(subspace="blocks", rank=2), r"invalid rank=2, scale=1\.0, proj_type='std' with subspace='blocks'"),
    (dict(block_stride=2), r"invalid block_stride=2: subspace='galore' projects on rank"),
    (dict(subspace="blocks", block_stride=0), r"invalid block_stride=0: expected None \(always stateful\) or an int"),
])
def test_bad_settings_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        gradwise.FRUGAL([torch.zeros(2, requires_grad=True)], **kwargs)


@pytest.mark.slow
def test_blocks_compiled_equal_eager():
    """Elementwise (the choice is one 0-d factor per tensor): one flat graph per route, across three switches and
    the state resets at each, the unstrided group beside the strided one (20 steps)."""
    gen = torch.Generator().manual_seed(5)
    params = [torch.randn(n, generator=gen).requires_grad_() for n in (3, 4, 6, 7, 8)]
    holder = []

    def make(p, compile):
        groups = [{"params": p[:1], "block_stride": None}, {"params": p[1:]}]
        return gradwise.FRUGAL(groups, compile=compile, subspace="blocks", update_proj_gap=GAP,
                               **CASES["stride-2-decay"])

    compiled = run_bag(lambda p: holder.append(make(p, True)) or holder[-1], _clone(params), torch.float32, 20)
    eager = run_bag(lambda p: make(p, False), _clone(params), torch.float32, 20)
    assert holder[0].transform.elementwise and holder[0].compile_stats["compiles"] >= 1
    assert_trajectories_close(compiled, eager, torch.float32, rtol=1e-6, atol=1e-7)
