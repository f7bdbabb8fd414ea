"""Phases and reductions (core/phases.py): a statistic over every parameter of the step, handed to the
links after it; clip_by_global_norm as torch's clip_grad_norm_ before the step; guards; what is refused."""
from __future__ import annotations

import pytest
import torch

import gradwise
from gradwise import Optimizer, chain, project_low_rank, route, scale_by_learning_rate, trace
from gradwise.core.phases import plan
from gradwise.transforms import clip_by_global_norm, skip_nonfinite
from gradwise.transforms.adam import scale_by_adam_moments


def params(dtype=torch.float64):
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(s, generator=gen, dtype=dtype).requires_grad_() for s in [(6, 5), (5,), (4, 3), ()]]


def by_dim(name, p):
    return "matrix" if p.dim() == 2 else "other"


def run(make, ps, steps=20, clip=None, scale=3.0):
    """``steps`` steps of ``make(ps)`` on seeded gradients large enough to clip; with ``clip``, the
    gradients pass through ``torch.nn.utils.clip_grad_norm_(ps, clip)`` first (torch's way)."""
    optimizer = make(ps)
    for step in range(steps):
        gen = torch.Generator().manual_seed(step)
        for p in ps:
            p.grad = torch.randn(p.shape, generator=gen, dtype=p.dtype) * scale
        if clip is not None:
            norm = torch.nn.utils.clip_grad_norm_(ps, clip)
            # torch divides by (norm + 1e-6); the link, as optax, by the norm itself
            for p in ps:
                p.grad.mul_((norm + 1e-6) / norm if norm > clip else 1.0)
        optimizer.step()
    return [p.detach().clone() for p in ps], optimizer


@pytest.mark.parametrize("compile", [False, True], ids=["eager", "compiled"])
def test_clip_by_global_norm_is_torch_clip_grad_norm_before_sgd(compile):
    ours, optimizer = run(lambda ps: Optimizer(ps, chain(clip_by_global_norm(), trace(), scale_by_learning_rate()),
                                               lr=0.05, momentum=0.9, max_norm=0.7, compile=compile), params())
    theirs, _ = run(lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9), params(), clip=0.7)
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    assert len(plan(optimizer.transform, compile)) == 2  # the norm over every parameter, then the step


def test_the_norm_spans_every_route_and_every_group():
    """The statistic is over the whole step: all groups and both routes' parameters together."""
    transform = chain(clip_by_global_norm(), route(by_dim, matrix=chain(trace(), scale_by_learning_rate()),
                                                   other=chain(scale_by_learning_rate())))
    ps = params()
    groups = [{"params": ps[:2]}, {"params": ps[2:], "lr": 0.02}]
    ours, _ = run(lambda _: Optimizer(groups, transform, lr=0.05, momentum=0.9, max_norm=0.7, compile=False), ps)

    def reference(ps):  # the matrices with momentum, the rest without, each group at its lr
        return _Both(torch.optim.SGD([{"params": [ps[0]], "lr": 0.05}, {"params": [ps[2]], "lr": 0.02}], momentum=0.9),
                     torch.optim.SGD([{"params": [ps[1]], "lr": 0.05}, {"params": [ps[3]], "lr": 0.02}]))

    theirs, _ = run(reference, params(), clip=0.7)
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


class _Both:
    def __init__(self, *optimizers):
        self.optimizers = optimizers

    def step(self):
        for o in self.optimizers:
            o.step()


def test_max_norm_is_a_hyperparameter_checked_and_scheduled_per_group():
    with pytest.raises(ValueError, match=r"invalid max_norm=-1.0"):
        Optimizer(params(), chain(clip_by_global_norm(), scale_by_learning_rate()), max_norm=-1.0)
    ps = params()
    optimizer = Optimizer(ps, chain(clip_by_global_norm(), scale_by_learning_rate()), lr=1.0, max_norm=1.0,
                          compile=False)
    before = [p.detach().clone() for p in ps]
    for p in ps:
        p.grad = torch.full_like(p, 10.0)
    optimizer.param_groups[0]["max_norm"] = 0.5  # as a scheduler would set it
    optimizer.step()
    moved = torch.cat([(b - p.detach()).reshape(-1) for p, b in zip(ps, before)])
    torch.testing.assert_close(moved.norm(), torch.tensor(0.5, dtype=torch.float64))


def test_a_guard_skips_before_any_route_writes():
    """A guard in one route skips the whole step: the other route's parameters wait for its verdict."""
    transform = route(by_dim, matrix=chain(skip_nonfinite(), trace(), scale_by_learning_rate()),
                      other=chain(scale_by_learning_rate()))
    ps = params()
    optimizer = Optimizer(ps, transform, lr=0.1, momentum=0.9, compile=False)
    before = [p.detach().clone() for p in ps]
    for p in ps:
        p.grad = torch.ones_like(p)
    ps[0].grad[0, 0] = float("nan")
    optimizer.step()
    assert optimizer.skipped_steps == 1 and all(torch.equal(p, b) for p, b in zip(ps, before))
    assert not optimizer.state or all(int(s["step"]) == 0 for s in optimizer.state.values())


def test_what_a_chain_of_reductions_refuses():
    with pytest.raises(ValueError, match=r"two links of one chain compute the statistic 'sum_of_squares'"):
        chain(clip_by_global_norm(), trace(), clip_by_global_norm())
    ps = params()
    late_guard = Optimizer(ps, chain(trace(), skip_nonfinite(), scale_by_learning_rate()), lr=0.1, momentum=0.9,
                           compile=False)
    for p in ps:
        p.grad = torch.ones_like(p)
    with pytest.raises(ValueError, match=r"skips whole steps, but comes after trace\(\)"):
        late_guard.step()
    assert not late_guard.state
    with pytest.raises(ValueError, match=r"reads the statistic\(s\) \['second_moment_sum', 'second_moment_count'\]"):
        chain(scale_by_learning_rate(), gradwise.transforms.add_stable_weight_decay())
    with pytest.raises(ValueError, match=r"project_low_rank\(\): .* reduces \['sum_of_squares'\].*before"):
        project_low_rank(chain(clip_by_global_norm(), scale_by_adam_moments()))
    with pytest.raises(ValueError, match=r"fused_backward\(Optimizer\): its chain reduces \['sum_of_squares'\]"):
        gradwise.fused_backward(Optimizer(params(), chain(clip_by_global_norm(), scale_by_learning_rate())))


def test_a_nan_statistic_is_refused_naming_the_parameter_and_nothing_changes():
    ps = [torch.nn.Parameter(p.detach()) for p in params()]
    named = [(f"w{i}", p) for i, p in enumerate(ps)]
    optimizer = gradwise.Ranger21(named, lr=1e-2, num_iterations=20, compile=False)
    run(lambda _: optimizer, ps, steps=2)
    saved = {k: {n: v.clone() for n, v in s.items()} for k, s in optimizer.state_dict()["state"].items()}
    weights = [p.detach().clone() for p in ps]
    for p in ps:
        p.grad = torch.ones_like(p)
    ps[2].grad[1, 1] = float("inf")
    with pytest.raises(ValueError, match=r"parameter 'w2' has NaN or inf in its gradient; shrink_like_ranger21"):
        optimizer.step()
    assert all(torch.equal(p, w) for p, w in zip(ps, weights))
    after = optimizer.state_dict()["state"]
    assert all(torch.equal(v, after[k][n]) for k, s in saved.items() for n, v in s.items())


@pytest.mark.parametrize("state", ["int8", "bf16"])
def test_ranger21_keeps_encoded_state_and_follows_fp32(state):
    """A plain chain, so its state shaped like the parameters is encoded as any chain's."""
    big = [torch.nn.Parameter(torch.randn(64, 96, generator=torch.Generator().manual_seed(1)))]
    runs = {}
    for fmt in ("fp32", state):
        ps = [torch.nn.Parameter(p.detach().clone()) for p in big]
        final, optimizer = run(lambda ps: gradwise.Ranger21(ps, lr=1e-2, num_iterations=30, compile=False,
                                                            state=fmt), ps, steps=15, scale=0.1)
        runs[fmt] = final[0]
        encoded = [k for k in optimizer.state[ps[0]] if "@" in k]
        assert bool(encoded) == (fmt != "fp32"), sorted(optimizer.state[ps[0]])
    drift = (runs[state] - runs["fp32"]).abs().max() / (runs["fp32"] - big[0].detach()).abs().max()
    assert 0 < drift < 0.05
