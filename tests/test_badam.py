"""BAdam around gradwise and torch.optim optimizers against a float64 reference written from Algorithm 1 of
Luo et al. (2024): each block in turn gets a fresh Adam for K steps; state and gradients are held for the
active block only, and a checkpoint resumes bit-identically."""
from __future__ import annotations

import pytest
import torch

import gradwise
from tests.models import bag_of_tensors, sin_loss

STEPS = 30
ADAMW = dict(betas=(0.9, 0.95), weight_decay=0.1)
LRS = (0.01, 0.02, 0.03)


def _groups(params):
    return [{"params": params[2 * i:2 * i + 2], "lr": lr} for i, lr in enumerate(LRS)]


def reference(params, k, order, seed=0, steps=STEPS, block=2):
    """Algorithm 1: for each pass, for each block in the pass's order, a fresh AdamW over the block takes K
    steps on the block's gradient; the other blocks stay as they are."""
    blocks = [list(range(i, min(i + block, len(params)))) for i in range(0, len(params), block)]
    lrs = [LRS[i // 2] for i in range(len(params))]
    t, sweep = 0, 0
    while t < steps:
        indices = list(range(len(blocks)))
        if order == "descending":
            indices.reverse()
        elif order == "random":
            indices = torch.randperm(len(blocks), generator=torch.Generator().manual_seed(seed + sweep)).tolist()
        for b in indices:
            leaves = [params[i] for i in blocks[b]]
            adam = torch.optim.AdamW([{"params": [p], "lr": lrs[i]} for p, i in zip(leaves, blocks[b])], **ADAMW)
            for _ in range(k):
                if t == steps:
                    return params
                grads = torch.autograd.grad(sin_loss(params, t), leaves, allow_unused=True)
                for p, g in zip(leaves, grads):
                    p.grad = g
                adam.step()
                t += 1
        sweep += 1
    return params


def _ours(params, inner, start=0, stop=STEPS, **kwargs):
    optimizer = kwargs.pop("optimizer", None) or gradwise.BAdam(inner(_groups(params)), **kwargs)
    for step in range(start, stop):
        optimizer.zero_grad()
        sin_loss(params, step).backward()
        optimizer.step()
        active = {id(p) for p in optimizer.blocks[optimizer.active]}
        assert {id(p) for p in optimizer.optimizer.state} <= active, "state is held for the active block only"
        assert all(p.requires_grad is (id(p) in active) for p in params)
    return optimizer


INNER = {"gradwise": lambda g: gradwise.AdamW(g, compile=False, **ADAMW),
         "torch": lambda g: torch.optim.AdamW(g, **ADAMW)}


@pytest.mark.parametrize("order, k, seed", [("ascending", 4, 0), ("descending", 3, 0), ("random", 2, 5)])
@pytest.mark.parametrize("inner", INNER, ids=INNER.keys())
def test_badam_matches_block_coordinate_adamw_step_by_step(inner, order, k, seed):
    ours = bag_of_tensors(torch.float64)
    theirs = reference([p.detach().clone().requires_grad_() for p in ours], k, order, seed)
    optimizer = _ours(ours, INNER[inner], switch_every=k, order=order, seed=seed)
    assert optimizer.steps == STEPS
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a.detach(), b.detach(), rtol=1e-10, atol=1e-12)


def test_badam_blocks_of_n_parameters_in_order_and_gradients_dropped_without_freezing():
    ours = bag_of_tensors(torch.float64)
    theirs = reference([p.detach().clone().requires_grad_() for p in ours], 3, "ascending", block=3)
    inner = gradwise.AdamW(_groups(ours), compile=False, **ADAMW)
    optimizer = gradwise.BAdam(inner, switch_every=3, blocks=3, freeze_inactive=False)
    assert [len(b) for b in optimizer.blocks] == [3, 3]
    for step in range(STEPS):
        optimizer.zero_grad()
        sin_loss(ours, step).backward()
        optimizer.step()
        assert all(p.requires_grad for p in ours)
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a.detach(), b.detach(), rtol=1e-10, atol=1e-12)


def test_badam_resumes_bit_identically_across_a_switch():
    full = bag_of_tensors(torch.float64)
    _ours(full, INNER["gradwise"], switch_every=4, order="random", seed=1)
    first = bag_of_tensors(torch.float64)
    optimizer = _ours(first, INNER["gradwise"], stop=10, switch_every=4, order="random", seed=1)
    checkpoint = optimizer.state_dict()
    resumed = [p.detach().clone() for p in first]
    second = gradwise.BAdam(INNER["gradwise"](_groups(resumed)), switch_every=4, order="random", seed=1)
    with pytest.raises(ValueError, match=r"invalid state_dict: saved with .*'switch_every': 4.*this BAdam has"):
        gradwise.BAdam(INNER["gradwise"](_groups(bag_of_tensors(torch.float64))), switch_every=5).load_state_dict(
            checkpoint)
    second.load_state_dict(checkpoint)
    assert second.active == optimizer.active and [p.requires_grad for p in resumed] == [p.requires_grad for p in first]
    _ours(resumed, None, start=10, optimizer=second)
    assert all(torch.equal(a, b) for a, b in zip(full, resumed))


def test_badam_shares_groups_with_its_optimizer_for_lr_schedulers():
    params = bag_of_tensors(torch.float64)
    optimizer = gradwise.BAdam(torch.optim.AdamW(_groups(params)), switch_every=2)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    sin_loss(params, 0).backward()
    optimizer.step()
    scheduler.step()
    assert [g["lr"] for g in optimizer.optimizer.param_groups] == [lr / 2 for lr in LRS]


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(switch_every=0), ValueError, r"invalid switch_every=0: expected an integer >= 1"),
    (dict(order="sideways"), ValueError, r"invalid order='sideways': expected one of \['ascending'"),
    (dict(blocks=0), ValueError, r"invalid blocks=0: expected an integer >= 1"),
    (dict(seed=-1), ValueError, r"invalid seed=-1: expected an integer >= 0"),
    (dict(freeze_inactive="yes"), TypeError, r"invalid freeze_inactive='yes'"),
])
def test_badam_refuses_bad_settings_by_name(kwargs, error, message):
    with pytest.raises(error, match=message):
        gradwise.BAdam(torch.optim.AdamW(bag_of_tensors(torch.float64)), **kwargs)


def test_badam_refuses_a_stepped_optimizer_or_a_non_optimizer_and_new_groups():
    params = bag_of_tensors(torch.float64)
    inner = torch.optim.AdamW(params)
    with pytest.raises(TypeError, match=r"invalid optimizer \(a list\): expected a torch.optim.Optimizer"):
        gradwise.BAdam(params)
    sin_loss(params, 0).backward()
    inner.step()
    with pytest.raises(ValueError, match="invalid optimizer: it has already stepped"):
        gradwise.BAdam(inner)
    optimizer = gradwise.BAdam(torch.optim.AdamW([torch.zeros(2, requires_grad=True)]))
    with pytest.raises(ValueError, match="BAdam.add_param_group: the blocks are fixed"):
        optimizer.add_param_group({"params": [torch.zeros(3, requires_grad=True)]})
