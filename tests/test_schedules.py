"""Schedules equal their closed forms, compose in time, drive torch optimizers, and reject bad input."""
from __future__ import annotations

import math

import pytest
import torch

from gradwise import schedules as S


def test_warmup_closed_form():
    s = S.warmup(10, start=0.1)
    assert [s(t) for t in (0, 5, 10, 50)] == pytest.approx([0.1, 0.1 + 0.9 * 0.5, 1.0, 1.0], abs=1e-15)


def test_cosine_closed_form():
    s = S.cosine(100, final=0.2)
    for t in (0, 13, 50, 99, 100, 500):
        expected = 0.2 + 0.8 * (1 + math.cos(math.pi * min(t, 100) / 100)) / 2
        assert s(t) == pytest.approx(expected, abs=1e-15)


def test_linear_decay_to_zero():
    s = S.linear_decay(40)
    assert [s(t) for t in (0, 10, 40, 41)] == pytest.approx([1.0, 0.75, 0.0, 0.0], abs=1e-15)


def test_sum_runs_parts_in_time_and_flattens():
    s = S.warmup(4) + S.cosine(8) + S.constant(3, value=0.5)
    assert s.length == 15
    assert len(s.parts) == 3
    assert s(2) == pytest.approx(0.5)
    assert s(4) == pytest.approx(1.0)
    assert s(8) == pytest.approx((1 + math.cos(math.pi * 4 / 8)) / 2)
    assert s(12) == 0.5 and s(1000) == 0.5


def test_warmup_stable_decay():
    s = S.warmup_stable_decay(100, warmup_steps=10, decay_steps=20)
    assert s(5) == pytest.approx(0.5)
    assert s(10) == s(79) == 1.0
    assert s(90) == pytest.approx(0.5)
    assert s(100) == 0.0


def test_explore_exploit():
    s = S.explore_exploit(100, warmup_steps=10, warmdown_fraction=0.5, final=0.1)
    assert s(49) == 1.0
    assert s(75) == pytest.approx(1 - 0.9 * 25 / 50)
    assert s(100) == pytest.approx(0.1)


def test_algoperf_baseline_equals_torch_sequential_lr():
    hint, lr = 200, 0.3
    p = torch.nn.Parameter(torch.zeros(1))
    ours_opt = torch.optim.SGD([p], lr=lr)
    ours = S.ScheduleLR(ours_opt, S.algoperf_baseline(hint, warmup_fraction=0.05))
    ref_opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr)
    w = int(0.05 * hint)
    ref = torch.optim.lr_scheduler.SequentialLR(ref_opt, [
        torch.optim.lr_scheduler.LinearLR(ref_opt, start_factor=1e-10, end_factor=1.0, total_iters=w),
        torch.optim.lr_scheduler.CosineAnnealingLR(ref_opt, T_max=hint - w)], milestones=[w])
    for _ in range(hint):
        assert ours_opt.param_groups[0]["lr"] == pytest.approx(ref_opt.param_groups[0]["lr"], rel=1e-9, abs=1e-12)
        ours_opt.step()
        ref_opt.step()
        ours.step()
        ref.step()


def test_schedule_lr_drives_a_gradwise_optimizer_and_resumes():
    import gradwise

    schedule = S.warmup(3) + S.cosine(7)
    p = torch.nn.Parameter(torch.ones(2))
    opt = gradwise.SGD([p], lr=0.5, compile=False)
    sched = S.ScheduleLR(opt, schedule)
    seen = []
    for _ in range(5):
        seen.append(opt.param_groups[0]["lr"])
        p.grad = torch.ones(2)
        opt.step()
        sched.step()
    assert seen == pytest.approx([0.5 * schedule(t) for t in range(5)])
    fresh_opt = gradwise.SGD([torch.nn.Parameter(torch.ones(2))], lr=0.5, compile=False)
    fresh = S.ScheduleLR(fresh_opt, schedule)
    fresh.load_state_dict(sched.state_dict())
    fresh_opt.load_state_dict(opt.state_dict())
    assert fresh_opt.param_groups[0]["lr"] == pytest.approx(0.5 * schedule(5))
    fresh.step()
    sched.step()
    assert fresh_opt.param_groups[0]["lr"] == opt.param_groups[0]["lr"] == pytest.approx(0.5 * schedule(6))


@pytest.mark.parametrize("make, message", [
    (lambda: S.warmup(-1), "steps=-1"),
    (lambda: S.cosine(2.5), "steps=2.5"),
    (lambda: S.warmup(10, start=-0.5), "start=-0.5"),
    (lambda: S.cosine(10, final=float("nan")), "final=nan"),
    (lambda: S.constant(3, value=float("inf")), "value=inf"),
    (lambda: S.warmup_stable_decay(100, warmup_steps=90, decay_steps=20), "longer than the budget"),
    (lambda: S.explore_exploit(10, warmup_steps=11), "longer than the budget"),
    (lambda: S.algoperf_baseline(0), "step_hint=0"),
    (lambda: S.explore_exploit(10, warmup_steps=1, warmdown_fraction=1.5), "warmdown_fraction=1.5"),
    (lambda: S.warmup(3)(-1), "t=-1"),
])
def test_bad_input_names_the_argument(make, message):
    with pytest.raises(ValueError, match=message.replace("+", r"\+")):
        make()


def test_adding_a_non_schedule_is_a_type_error():
    with pytest.raises(TypeError):
        S.warmup(3) + 1.0
    with pytest.raises(TypeError, match="schedule="):
        S.ScheduleLR(torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1), lambda t: 1.0)
