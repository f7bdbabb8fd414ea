"""route(): parameters sent to different chains by a rule, in one optimizer and one state_dict."""
from __future__ import annotations

import copy

import pytest
import torch

import gradwise
from gradwise import chain, route, scale_by_adam, scale_by_learning_rate, trace


def by_dim(name, p):
    return "sgd" if p.dim() >= 2 else "adam"


def sgd_adam(**kwargs):
    return route(by_dim, sgd=(chain(trace(), scale_by_learning_rate()), dict(lr=0.1, momentum=0.9)),
                 adam=chain(scale_by_adam(), scale_by_learning_rate()))


def params(seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=gen).requires_grad_() for s in [(4, 3), (3,), (2, 2, 2), ()]]


def step(optimizer, ps, n):
    for i in range(n):
        gen = torch.Generator().manual_seed(i)
        for p in ps:
            p.grad = torch.randn(p.shape, generator=gen)
        optimizer.step()


def test_each_route_matches_its_torch_optimizer():
    ours_params, theirs_params = params(), params()
    ours = gradwise.Optimizer(ours_params, sgd_adam(), lr=0.01, betas=(0.8, 0.99))
    assert [g["route"] for g in ours.param_groups] == ["sgd", "adam"]
    assert [g["lr"] for g in ours.param_groups] == [0.1, 0.01]
    sgd = torch.optim.SGD([theirs_params[0], theirs_params[2]], lr=0.1, momentum=0.9)
    adam = torch.optim.Adam([theirs_params[1], theirs_params[3]], lr=0.01, betas=(0.8, 0.99))
    for i in range(30):
        gen = torch.Generator().manual_seed(i)
        for p, q in zip(ours_params, theirs_params):
            p.grad = torch.randn(p.shape, generator=gen)
            q.grad = p.grad.clone()
        ours.step(), sgd.step(), adam.step()
    for p, q in zip(ours_params, theirs_params):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
    # each parameter keeps only its own route's state
    assert set(ours.state[ours_params[0]]) == {"momentum.momentum_buffer", "step"}
    assert set(ours.state[ours_params[1]]) == {"adam.exp_avg", "adam.exp_avg_sq", "step"}


def test_state_dict_round_trip_resumes_bit_identically():
    straight_params = params()
    straight = gradwise.Optimizer(straight_params, sgd_adam(), lr=0.01)
    step(straight, straight_params, 10)

    first_params = params()
    first = gradwise.Optimizer(first_params, sgd_adam(), lr=0.01)
    step(first, first_params, 5)
    saved = copy.deepcopy(first.state_dict())
    resumed_params = [p.detach().clone().requires_grad_() for p in first_params]
    resumed = gradwise.Optimizer(resumed_params, sgd_adam(), lr=0.01)
    resumed.load_state_dict(saved)
    for i in range(5, 10):
        gen = torch.Generator().manual_seed(i)
        for p in resumed_params:
            p.grad = torch.randn(p.shape, generator=gen)
        resumed.step()
    for p, q in zip(resumed_params, straight_params):
        assert torch.equal(p, q)


def test_scheduler_scales_every_route():
    ps = params()
    optimizer = gradwise.Optimizer(ps, sgd_adam(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    step(optimizer, ps, 1)
    scheduler.step()
    assert [g["lr"] for g in optimizer.param_groups] == [0.05, 0.005]


def test_user_groups_and_route_tags():
    ps = params()
    optimizer = gradwise.Optimizer([{"params": ps[:2], "lr": 0.3}, {"params": ps[2:], "route": "adam"}],
                                   sgd_adam(), lr=0.01)
    # a user's value applies to every route of the group; a tagged group is not split
    assert [(g["route"], g["lr"], len(g["params"])) for g in optimizer.param_groups] == [
        ("sgd", 0.3, 1), ("adam", 0.3, 1), ("adam", 0.01, 2)]
    extra = torch.randn(5, 5, requires_grad=True)
    optimizer.add_param_group({"params": [extra]})
    assert optimizer.param_groups[-1]["route"] == "sgd"
    step(optimizer, ps + [extra], 2)


def test_skip_nonfinite_wraps_the_routes():
    ps = params()
    optimizer = gradwise.Optimizer(ps, sgd_adam(), lr=0.01, skip_nonfinite=True)
    before = [p.detach().clone() for p in ps]
    for p in ps:
        p.grad = torch.full(p.shape, float("nan"))
    optimizer.step()
    assert optimizer.skipped_steps == 1 and all(torch.equal(p, b) for p, b in zip(ps, before))
    step(optimizer, ps, 2)
    assert not any(torch.equal(p, b) for p, b in zip(ps, before))


def test_bad_rules_and_routes():
    with pytest.raises(ValueError, match=r"parameter 'w'.*'conv'"):
        gradwise.Optimizer([("w", torch.zeros(2, 2, requires_grad=True))],
                           route(lambda name, p: "conv", sgd=chain(trace(), scale_by_learning_rate())))
    with pytest.raises(ValueError, match="route='muon'"):
        gradwise.Optimizer([{"params": [torch.zeros(2, requires_grad=True)], "route": "muon"}], sgd_adam())
    with pytest.raises(TypeError, match=r"unknown hyperparameter\(s\) \['betas'\]"):
        route(by_dim, sgd=(chain(trace(), scale_by_learning_rate()), dict(betas=(0.9, 0.9))))
    with pytest.raises(ValueError, match="momentum=-1"):
        route(by_dim, sgd=(chain(trace(), scale_by_learning_rate()), dict(momentum=-1)))
    with pytest.raises(TypeError, match="rule"):
        route("dim", sgd=chain(trace(), scale_by_learning_rate()))


@pytest.mark.slow
def test_compiled_routes_equal_eager():
    """The AdamW route compiles (elementwise); the Muon route runs eagerly (batched matmuls)."""
    runs = []
    for compile in (True, False):
        ps = params() + [torch.randn(6, 6, generator=torch.Generator().manual_seed(1)).requires_grad_()]
        optimizer = gradwise.Muon(ps, lr=0.02, compile=compile)
        step(optimizer, ps, 5)
        runs.append((ps, optimizer.compile_stats["compiles"]))
    assert runs[0][1] >= 1 and runs[1][1] == 0
    for p, q in zip(runs[0][0], runs[1][0]):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7)
