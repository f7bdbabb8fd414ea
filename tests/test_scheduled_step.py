"""A learning-rate schedule changes ``lr`` before every step (the arena's runner: warmup, then cosine). Such a
step checks the changed value only, builds no expected state and plans nothing anew
(``core/hyper_check.py``), and gives the bits of torch.optim.AdamW and of a step that checks everything
afresh; a scheduled value that is refused still changes nothing."""
from __future__ import annotations

import dataclasses
import math
from collections import Counter

import pytest
import torch

import gradwise
import gradwise.core.hyper_check as hyper_check
import gradwise.core.state_check as state_check
import gradwise.core.stepping as stepping

STEPS = 25


def _factor(step: int) -> float:
    """The arena's schedule over STEPS steps: 2 steps of warmup, then cosine decay to 0."""
    return (step + 1) / 2 if step < 2 else 0.5 * (1 + math.cos(math.pi * (step - 2) / (STEPS - 2)))


def _lr_checks(step: int) -> Counter:
    """The checks a step takes when only the schedule changed the groups: lr in each of the 2 groups, where
    it changed (the cosine starts where the warmup ends: step 2 has step 1's lr)."""
    return Counter(lr=2) if _factor(step) != _factor(step - 1) else Counter()


def _params(seed: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=gen).requires_grad_() for s in [(6, 4), (4,), (3, 2, 2), (5,)]]


def _build(kind: str, params: list[torch.Tensor]):
    groups = [{"params": params[:2]}, {"params": params[2:], "weight_decay": 0.1, "betas": (0.95, 0.99)}]
    if kind == "torch":
        optimizer = torch.optim.AdamW(groups, lr=0.01, weight_decay=0.02, foreach=False)
    else:
        optimizer = gradwise.AdamW(groups, lr=0.01, weight_decay=0.02, compile=False)
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, _factor)


def _counting(monkeypatch, optimizer) -> Counter:
    """Count every hyperparameter check by name, and each call of what a changed group would rebuild."""
    calls: Counter = Counter()
    for key, spec in optimizer.hyper_specs.items():
        def check(name, value, _check=spec.check):
            calls[name] += 1
            return _check(name, value)
        optimizer.hyper_specs[key] = dataclasses.replace(spec, check=check)
    for module, name in [(hyper_check, "shape_signature"), (state_check, "expected_state"), (stepping, "plan")]:
        def counted(*args, _f=getattr(module, name), _name=name, **kwargs):
            calls[_name] += 1
            return _f(*args, **kwargs)
        monkeypatch.setattr(module, name, counted)
    return calls


def test_a_scheduled_step_checks_only_lr_and_rebuilds_nothing(monkeypatch):
    params = {kind: _params() for kind in ("gradwise", "afresh", "torch")}
    optimizers = {kind: _build(kind, p) for kind, p in params.items()}
    calls = Counter()
    for step in range(STEPS):
        for kind, (optimizer, schedule) in optimizers.items():
            if kind == "afresh":  # forget every check: this optimizer validates and looks up all each step
                optimizer._checked_groups, optimizer._group_specs = (), {}
            for p, g in zip(params[kind], grads_of(step, params[kind])):
                p.grad = g
            optimizer.step()
            schedule.step()
            if kind == "gradwise" and step:  # the lr of each of the 2 groups where it changed, nothing else
                assert calls == _lr_checks(step), (step, calls)
            if kind == "gradwise":
                monkeypatch.undo()
        for kind in ("afresh", "torch"):
            assert all(torch.equal(p.detach(), q.detach()) for p, q in zip(params["gradwise"], params[kind])), kind
        calls = _counting(monkeypatch, optimizers["gradwise"][0])  # from the second step on
    assert optimizers["gradwise"][0].param_groups[0]["lr"] == pytest.approx(0.01 * _factor(STEPS), rel=1e-12)


def test_a_scheduled_change_that_decides_state_shapes_is_seen(monkeypatch):
    # weight_decay 0 drops its link (zero_is_identity): the shape signature is computed again, once
    params = _params()
    theirs = [p.detach().clone().requires_grad_() for p in params]
    (mine, schedule), (torch_optimizer, torch_schedule) = _build("gradwise", params), _build("torch", theirs)
    calls = Counter()
    for step in range(STEPS):
        if step == 10:
            for optimizer in (mine, torch_optimizer):
                optimizer.param_groups[1]["weight_decay"] = 0.0
        for ps, optimizer, lr in ((params, mine, schedule), (theirs, torch_optimizer, torch_schedule)):
            for p, g in zip(ps, grads_of(step, ps)):
                p.grad = g
            optimizer.step()
            lr.step()
            if optimizer is mine and step == 10:
                assert (calls["lr"], calls["weight_decay"], calls["shape_signature"]) == (2, 1, 1), calls
            elif optimizer is mine and step:
                assert calls == _lr_checks(step), (step, calls)
            monkeypatch.undo()
        assert all(torch.equal(p.detach(), q.detach()) for p, q in zip(params, theirs)), step
        calls = _counting(monkeypatch, mine)


def grads_of(step: int, params) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(100 + step)
    return [torch.randn(p.shape, generator=gen) for p in params]


def test_a_refused_scheduled_value_changes_nothing_and_is_refused_until_fixed():
    params = _params()
    optimizer, schedule = _build("gradwise", params)
    for step in range(4):
        for p, g in zip(params, grads_of(step, params)):
            p.grad = g
        optimizer.step()
        schedule.step()
    before = [p.detach().clone() for p in params], [{k: v.clone() for k, v in optimizer.state[p].items()}
                                                    for p in params]
    for _ in range(2):
        optimizer.param_groups[1]["lr"] = -0.5  # a schedule gone wrong
        with pytest.raises(ValueError, match=r"lr=-0\.5"):
            optimizer.step()
        assert all(torch.equal(p.detach(), b) for p, b in zip(params, before[0]))
        for p, saved in zip(params, before[1]):
            assert all(torch.equal(optimizer.state[p][k], v) for k, v in saved.items())
    optimizer.param_groups[1]["lr"] = 0.005
    optimizer.step()
    assert int(optimizer.state[params[2]]["step"]) == 5
