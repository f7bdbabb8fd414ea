"""gradwise optimizers behave like torch.optim optimizers: groups, schedulers, hooks, closures, named
parameters, odd parameters (no grad, empty, 0-d, complex, bf16, transposed), NaN skipping and
bit-identical resumption from a state_dict."""
from __future__ import annotations

import io

import pytest
import torch
from torch import nn
from torch.optim import lr_scheduler

import gradwise
from tests.registry import CASES, ONE_PER_RECIPE, REFERENCED, build

F64 = dict(rtol=1e-10, atol=1e-12)
F32 = dict(rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------------------------- helpers
@pytest.fixture
def float64_default():
    """torch.optim.NAdam keeps ``mu_product`` in the default dtype; float64 references need float64 there."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(previous)


def _leaves(shapes, dtype=torch.float64, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=gen, dtype=dtype).requires_grad_() for s in shapes]


def _clone(params):
    return [p.detach().clone().requires_grad_() for p in params]


def _set_grads(params, step, scale=1.0):
    """Deterministic gradients that depend on the step and the parameter's position."""
    gen = torch.Generator().manual_seed(100 + step)
    for p in params:
        if p.is_complex():
            g = torch.randn(p.shape, generator=gen, dtype=p.dtype)
        else:
            g = torch.randn(p.shape, generator=gen, dtype=torch.float64).to(p.dtype)
        p.grad = g * scale


def _run(optimizer, params, steps, *, scheduler=None, first=0):
    for step in range(first, first + steps):
        _set_grads(params, step)
        optimizer.step()
        if scheduler is not None:
            scheduler.step()


def _assert_close(ours, theirs, **tol):
    assert len(ours) == len(theirs)
    for i, (a, b) in enumerate(zip(ours, theirs)):
        torch.testing.assert_close(a.detach(), b.detach(), **(tol or F64), msg=lambda m, i=i: f"tensor {i}: {m}")


def _mlp(seed=0, dtype=torch.float32):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 1)).to(dtype)


def _batch(step, dtype=torch.float32):
    gen = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(16, 4, generator=gen, dtype=dtype)
    return x, torch.sin(x.sum(dim=1, keepdim=True))


def _train_mlp(model, optimizer, steps, *, first=0, scheduler=None):
    for step in range(first, first + steps):
        x, y = _batch(step, next(model.parameters()).dtype)
        optimizer.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
        if scheduler is not None:
            scheduler.step()


def _snapshot(optimizer, params):
    """Clones of the params and of every state tensor, to compare bit for bit."""
    state = {
        i: {k: v.clone() for k, v in optimizer.state[p].items()} for i, p in enumerate(params) if p in optimizer.state
    }
    return [p.detach().clone() for p in params], state


def _assert_unchanged(optimizer, params, snapshot):
    before_params, before_state = snapshot
    for a, b in zip(params, before_params):
        assert torch.equal(a.detach(), b), "a parameter changed"
    after = {i: optimizer.state[p] for i, p in enumerate(params) if p in optimizer.state and optimizer.state[p]}
    assert set(after) == set(before_state), "state was created or dropped"
    for i, st in before_state.items():
        assert set(after[i]) == set(st)
        for k, v in st.items():
            assert torch.equal(after[i][k], v), f"state {k!r} of parameter {i} changed"


# ----------------------------------------------------------------------------------------- param groups
def test_param_groups_step_with_their_own_hyperparameters():
    shapes = [(3, 4), (5,), (2, 2)]
    params = _leaves(shapes)

    def groups(ps):
        return [
            {"params": [ps[0]], "lr": 0.1, "weight_decay": 0.0, "betas": (0.9, 0.999)},
            {"params": [ps[1]], "lr": 0.01, "weight_decay": 0.3, "betas": (0.5, 0.9)},
            {"params": [ps[2]]},  # the defaults
        ]

    ours_p, theirs_p, single_p = _clone(params), _clone(params), _clone(params)
    ours = gradwise.AdamW(groups(ours_p), lr=0.05, weight_decay=0.1, betas=(0.8, 0.95), compile=False)
    theirs = torch.optim.AdamW(groups(theirs_p), lr=0.05, weight_decay=0.1, betas=(0.8, 0.95))
    single = gradwise.AdamW(single_p, lr=0.05, weight_decay=0.1, betas=(0.8, 0.95), compile=False)
    assert [g["lr"] for g in ours.param_groups] == [0.1, 0.01, 0.05]
    assert [g["betas"] for g in ours.param_groups] == [(0.9, 0.999), (0.5, 0.9), (0.8, 0.95)]
    for opt, ps in ((ours, ours_p), (theirs, theirs_p), (single, single_p)):
        _run(opt, ps, 5)
    _assert_close(ours_p, theirs_p)
    # the groups really differ: the first two parameters moved differently than with one group
    assert not torch.allclose(ours_p[0], single_p[0]) and not torch.allclose(ours_p[1], single_p[1])
    torch.testing.assert_close(ours_p[2], single_p[2], **F64)


def test_sgd_param_groups_with_and_without_momentum():
    params = _leaves([(4, 3), (6,)])

    def groups(ps):
        return [{"params": [ps[0]], "momentum": 0.0, "lr": 0.2},
                {"params": [ps[1]], "momentum": 0.9, "dampening": 0.1, "weight_decay": 0.05}]

    ours_p, theirs_p = _clone(params), _clone(params)
    ours = gradwise.SGD(groups(ours_p), lr=0.05, compile=False)
    theirs = torch.optim.SGD(groups(theirs_p), lr=0.05)
    _run(ours, ours_p, 6)
    _run(theirs, theirs_p, 6)
    _assert_close(ours_p, theirs_p)
    assert "momentum.momentum_buffer" not in ours.state[ours_p[0]]
    assert "momentum.momentum_buffer" in ours.state[ours_p[1]]


# ----------------------------------------------------------------------------------------- LR schedulers
STEPS = 8
SCHEDULERS = {
    "StepLR": (gradwise.AdamW, torch.optim.AdamW, dict(lr=0.05, weight_decay=0.1),
               lambda o: lr_scheduler.StepLR(o, step_size=2, gamma=0.5)),
    "OneCycleLR-adamw": (gradwise.AdamW, torch.optim.AdamW, dict(lr=0.05),
                         lambda o: lr_scheduler.OneCycleLR(o, max_lr=0.1, total_steps=STEPS, cycle_momentum=False)),
    "OneCycleLR-adamw-betas": (gradwise.AdamW, torch.optim.AdamW, dict(lr=0.05),
                               lambda o: lr_scheduler.OneCycleLR(o, max_lr=0.1, total_steps=STEPS)),
    "OneCycleLR-sgd-momentum": (gradwise.SGD, torch.optim.SGD, dict(lr=0.05, momentum=0.9),
                                lambda o: lr_scheduler.OneCycleLR(o, max_lr=0.2, total_steps=STEPS,
                                                                  cycle_momentum=True)),
    "LambdaLR": (gradwise.Adam, torch.optim.Adam, dict(lr=0.05, weight_decay=0.01),
                 lambda o: lr_scheduler.LambdaLR(o, lambda s: 1.0 / (1.0 + s))),
    "CosineAnnealingLR": (gradwise.NAdamW, lambda p, **kw: torch.optim.NAdam(p, decoupled_weight_decay=True, **kw),
                          dict(lr=0.05, weight_decay=0.1),
                          lambda o: lr_scheduler.CosineAnnealingLR(o, T_max=STEPS, eta_min=1e-3)),
}


@pytest.mark.parametrize("name", list(SCHEDULERS))
def test_lr_schedulers_work_unchanged(name, float64_default):
    recipe, reference, kwargs, make_scheduler = SCHEDULERS[name]
    params = _leaves([(3, 4), (5,)])
    ours_p, theirs_p = _clone(params), _clone(params)
    ours = recipe(ours_p, compile=False, **kwargs)
    theirs = reference(theirs_p, **kwargs)
    ours_s, theirs_s = make_scheduler(ours), make_scheduler(theirs)
    seen = []
    for step in range(STEPS):
        for opt, ps, sched in ((ours, ours_p, ours_s), (theirs, theirs_p, theirs_s)):
            _set_grads(ps, step)
            opt.step()
            sched.step()
        seen.append(ours.param_groups[0]["lr"])
        assert ours.param_groups[0]["lr"] == theirs.param_groups[0]["lr"]
        _assert_close(ours_p, theirs_p)
    assert len(set(seen)) > 1, "the scheduler never changed the learning rate"
    assert ours_s.get_last_lr() == theirs_s.get_last_lr()


@pytest.mark.slow
def test_scheduler_changing_lr_every_step_does_not_recompile():
    model, twin = _mlp(), _mlp()
    compiled = gradwise.AdamW(model.parameters(), lr=0.01, compile=True)
    eager = gradwise.AdamW(twin.parameters(), lr=0.01, compile=False)
    schedulers = [lr_scheduler.OneCycleLR(o, max_lr=0.05, total_steps=10) for o in (compiled, eager)]
    lrs = []
    for step in range(10):
        for m, o, s in ((model, compiled, schedulers[0]), (twin, eager, schedulers[1])):
            _train_mlp(m, o, 1, first=step)
            s.step()
        lrs.append(compiled.param_groups[0]["lr"])
    assert len(set(lrs)) == 10
    assert compiled.compile_stats["compiles"] == 1
    _assert_close(list(model.parameters()), list(twin.parameters()), rtol=1e-6, atol=1e-7)


# ----------------------------------------------------------------------------------------- named parameters
def test_named_parameters():
    model, twin = _mlp(), _mlp()
    named = gradwise.AdamW(model.named_parameters(), lr=0.01, compile=False)
    plain = gradwise.AdamW(twin.parameters(), lr=0.01, compile=False)
    names = [n for n, _ in model.named_parameters()]
    assert named.param_groups[0]["param_names"] == names
    assert all(isinstance(p, torch.Tensor) for p in named.param_groups[0]["params"])
    _train_mlp(model, named, 3)
    _train_mlp(twin, plain, 3)
    for a, b in zip(model.parameters(), twin.parameters()):
        assert torch.equal(a, b)
    sd = named.state_dict()
    assert sd["param_groups"][0]["param_names"] == names
    assert "param_names" not in plain.state_dict()["param_groups"][0]
    # named groups resume as well
    buf = io.BytesIO()
    torch.save(sd, buf)
    buf.seek(0)
    fresh = gradwise.AdamW(_mlp(seed=1).named_parameters(), lr=0.01, compile=False)
    fresh.load_state_dict(torch.load(buf))
    assert fresh.param_groups[0]["param_names"] == names


def test_named_parameter_groups():
    model = _mlp()
    named = list(model.named_parameters())
    opt = gradwise.AdamW([{"params": named[:2], "lr": 0.1}, {"params": named[2:]}], lr=0.01, compile=False)
    sd = opt.state_dict()
    assert sd["param_groups"][0]["param_names"] == [n for n, _ in named[:2]]
    assert sd["param_groups"][1]["param_names"] == [n for n, _ in named[2:]]


# ----------------------------------------------------------------------------------------- torch.optim API
def test_add_param_group_mid_training():
    params = _leaves([(3, 4), (5,), (2,)])
    ours_p, theirs_p = _clone(params), _clone(params)
    ours = gradwise.AdamW([ours_p[0]], lr=0.05, betas=(0.8, 0.9), compile=False)
    theirs = torch.optim.AdamW([theirs_p[0]], lr=0.05, betas=(0.8, 0.9))
    for opt, ps in ((ours, ours_p), (theirs, theirs_p)):
        _run(opt, ps, 3)  # every param has a grad, only the first is optimized
    assert torch.equal(ours_p[1], params[1]) and torch.equal(ours_p[2], params[2])
    for opt, ps in ((ours, ours_p), (theirs, theirs_p)):
        opt.add_param_group({"params": [ps[1]], "lr": 0.1, "weight_decay": 0.0})
        opt.add_param_group({"params": ps[2]})  # a bare tensor, all defaults
        _run(opt, ps, 3, first=3)
    assert ours.param_groups[1]["betas"] == (0.8, 0.9) and ours.param_groups[1]["lr"] == 0.1
    assert ours.param_groups[2]["lr"] == 0.05 and ours.param_groups[2]["params"] == [ours_p[2]]
    assert int(ours.state[ours_p[0]]["step"]) == 6 and int(ours.state[ours_p[1]]["step"]) == 3
    _assert_close(ours_p, theirs_p)


@pytest.mark.parametrize("set_to_none", [True, False])
def test_zero_grad(set_to_none):
    model = _mlp()
    opt = gradwise.SGD(model.parameters(), lr=0.1, compile=False)
    _train_mlp(model, opt, 1)
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())
    opt.zero_grad(set_to_none=set_to_none)
    for p in model.parameters():
        if set_to_none:
            assert p.grad is None
        else:
            assert p.grad is not None and torch.equal(p.grad, torch.zeros_like(p))
    before = [p.detach().clone() for p in model.parameters()]
    opt.step()  # no grads (or zero grads, no momentum, no decay): nothing moves
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), before))


def test_zero_grad_defaults_to_none():
    model = _mlp()
    opt = gradwise.Adam(model.parameters(), compile=False)
    _train_mlp(model, opt, 1)
    opt.zero_grad()
    assert all(p.grad is None for p in model.parameters())


def test_step_with_closure_returns_the_loss_and_uses_it():
    model, twin = _mlp(), _mlp()
    ours = gradwise.Adam(model.parameters(), lr=0.01, compile=False)
    theirs = torch.optim.Adam(twin.parameters(), lr=0.01)
    x, y = _batch(0)
    calls = []

    def closure_for(m, opt):
        def closure():
            calls.append(torch.is_grad_enabled())
            opt.zero_grad()
            loss = nn.functional.mse_loss(m(x), y)
            loss.backward()
            return loss
        return closure

    losses = []
    for _ in range(4):
        loss = ours.step(closure_for(model, ours))
        ref = theirs.step(closure_for(twin, theirs))
        assert isinstance(loss, torch.Tensor) and loss.grad_fn is not None
        torch.testing.assert_close(loss, ref, **F32)
        losses.append(loss.item())
    assert calls == [True] * 8, "the closure runs once per step, with grad enabled"
    assert losses[-1] < losses[0]
    _assert_close(list(model.parameters()), list(twin.parameters()), **F32)
    assert ours.step() is None


def test_step_hooks_fire():
    model = _mlp()
    opt = gradwise.AdamW(model.parameters(), lr=0.01, compile=False)
    events = []
    weight = model[0].weight

    def pre(optimizer, args, kwargs):
        events.append(("pre", optimizer is opt, int(opt.state[weight]["step"]) if weight in opt.state else 0))

    def post(optimizer, args, kwargs):
        events.append(("post", optimizer is opt, int(opt.state[weight]["step"])))

    h1 = opt.register_step_pre_hook(pre)
    h2 = opt.register_step_post_hook(post)
    _train_mlp(model, opt, 2)
    assert events == [("pre", True, 0), ("post", True, 1), ("pre", True, 1), ("post", True, 2)]
    h1.remove()
    h2.remove()
    _train_mlp(model, opt, 1, first=2)
    assert len(events) == 4


@pytest.mark.parametrize("case", [c for c in REFERENCED if c.entry.maximize_reference and "maximize" not in c.kwargs],
                         ids=lambda c: c.name)
def test_maximize_equals_the_reference(case, float64_default):
    params = _leaves([(3, 4), (5,)])
    ours_p, theirs_p, minimizing_p = _clone(params), _clone(params), _clone(params)
    ours = case.ours(ours_p, compile=False, maximize=True)
    theirs = case.theirs(theirs_p, maximize=True)
    minimizing = case.ours(minimizing_p, compile=False)
    for opt, ps in ((ours, ours_p), (theirs, theirs_p), (minimizing, minimizing_p)):
        _run(opt, ps, 5)
    _assert_close(ours_p, theirs_p)
    assert not torch.allclose(ours_p[0], minimizing_p[0])


@pytest.mark.parametrize("case", ONE_PER_RECIPE, ids=lambda c: c.name)
def test_parameters_without_grads_are_skipped(case):
    params = _leaves([(3, 4), (5,), (2, 2)])
    opt = build(case.recipe, params, compile=False, **case.kwargs)
    frozen = params[1].detach().clone()
    for step in range(3):
        _set_grads([params[0], params[2]], step)
        params[1].grad = None
        opt.step()
    assert params[1] not in opt.state or not opt.state[params[1]]
    assert torch.equal(params[1], frozen), "a parameter without grad moved (weight decay applied to it?)"
    assert int(opt.state[params[0]]["step"]) == 3
    assert len(opt.state_dict()["state"]) == 2


def test_parameters_joining_late_count_their_own_steps():
    params = _leaves([(3, 4), (5,)])
    ours_p, theirs_p = _clone(params), _clone(params)
    ours = gradwise.AdamW(ours_p, lr=0.05, compile=False)
    theirs = torch.optim.AdamW(theirs_p, lr=0.05)
    for step in range(6):
        for opt, ps in ((ours, ours_p), (theirs, theirs_p)):
            _set_grads(ps, step)
            if step < 3:
                ps[1].grad = None
            opt.step()
    assert int(ours.state[ours_p[0]]["step"]) == 6 and int(ours.state[ours_p[1]]["step"]) == 3
    _assert_close(ours_p, theirs_p)


# ----------------------------------------------------------------------------------------- odd parameters
def test_mixed_dtypes_in_one_group():
    params = _leaves([(3, 4), (5,)], dtype=torch.float32) + _leaves([(2, 3), ()], dtype=torch.float64, seed=1)
    ours_p, theirs_p = _clone(params), _clone(params)
    ours = gradwise.AdamW(ours_p, lr=0.05, weight_decay=0.1, compile=False)
    theirs = torch.optim.AdamW(theirs_p, lr=0.05, weight_decay=0.1)
    _run(ours, ours_p, 4)
    _run(theirs, theirs_p, 4)
    assert [p.dtype for p in ours_p] == [p.dtype for p in params]
    assert [ours.state[p]["adam.exp_avg"].dtype for p in ours_p] == [p.dtype for p in params]
    _assert_close(ours_p[:2], theirs_p[:2], **F32)
    _assert_close(ours_p[2:], theirs_p[2:])


def test_lr_as_tensor_or_numpy_scalar():
    import numpy as np

    params = _leaves([(3, 4)])
    results = []
    for lr in (0.05, torch.tensor(0.05, dtype=torch.float64), np.float64(0.05), np.float32(0.05)):
        ps = _clone(params)
        opt = gradwise.AdamW(ps, lr=lr, compile=False)
        _run(opt, ps, 2)
        results.append(ps[0])
    assert torch.equal(results[0], results[1]) and torch.equal(results[0], results[2])
    ps = _clone(params)
    _run(gradwise.AdamW(ps, lr=float(np.float32(0.05)), compile=False), ps, 2)
    assert torch.equal(results[3], ps[0])


@pytest.mark.parametrize("compile", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_zero_size_and_zero_dim_parameters(compile):
    shapes = [(), (0,), (0, 3), (4, 3), ()]
    params = _leaves(shapes, dtype=torch.float32)
    ours_p, theirs_p = _clone(params), _clone(params)
    ours = gradwise.AdamW(ours_p, lr=0.05, weight_decay=0.1, compile=compile, skip_nonfinite=True)
    theirs = torch.optim.AdamW(theirs_p, lr=0.05, weight_decay=0.1)
    _run(ours, ours_p, 4)
    _run(theirs, theirs_p, 4)
    _assert_close(ours_p, theirs_p, **F32)
    assert [tuple(p.shape) for p in ours_p] == shapes
    assert not torch.equal(ours_p[0], params[0]) and not torch.equal(ours_p[4], params[4])
    assert ours.state[ours_p[1]]["adam.exp_avg"].shape == (0,)
    assert ours.state[ours_p[0]]["adam.exp_avg"].shape == ()
    assert ours.compile_stats["compiles"] == (1 if compile else 0)


@pytest.mark.parametrize("case", [c for c in REFERENCED if c.entry.complex], ids=lambda c: c.name)
def test_complex_parameters_match_the_reference(case):
    params = _leaves([(3, 4), (5,), ()], dtype=torch.complex128)
    ours_p, theirs_p = _clone(params), _clone(params)
    ours = case.ours(ours_p, compile=False)
    theirs = case.theirs(theirs_p)
    _run(ours, ours_p, 5)
    _run(theirs, theirs_p, 5)
    assert all(p.dtype == torch.complex128 for p in ours_p)
    _assert_close(ours_p, theirs_p)


@pytest.mark.slow
def test_complex_parameters_compiled():
    params = _leaves([(3, 4), (6,), ()], dtype=torch.complex64)
    ours_p, theirs_p = _clone(params), _clone(params)
    ours = gradwise.AdamW(ours_p, lr=0.05, weight_decay=0.1, compile=True)
    theirs = torch.optim.AdamW(theirs_p, lr=0.05, weight_decay=0.1)
    _run(ours, ours_p, 4)
    _run(theirs, theirs_p, 4)
    assert ours.compile_stats["compiles"] >= 1
    _assert_close(ours_p, theirs_p, **F32)


@pytest.mark.parametrize("case", [c for c in ONE_PER_RECIPE if c.entry.bf16], ids=lambda c: c.name)
def test_bf16_parameters(case):
    params = _leaves([(8, 4), (16,)], dtype=torch.bfloat16)
    reference = [p.detach().float().requires_grad_() for p in params]
    opt = build(case.recipe, params, compile=False, **case.kwargs)
    fp32 = build(case.recipe, reference, compile=False, **case.kwargs)
    before = [p.detach().clone() for p in params]
    for step in range(1 if case.entry.first_step_moves else 2):  # the step that moves them is compared
        _set_grads(params, step)
        for p, q in zip(params, reference):
            q.grad = p.grad.float()
        opt.step()
        fp32.step()
    for p, b, q in zip(params, before, reference):
        assert p.dtype == torch.bfloat16
        assert not torch.equal(p, b), "a bf16 step changed nothing"
        # the update is computed in float32 and rounded once into the parameter
        assert torch.equal(p, q.detach().to(torch.bfloat16))
    for p, q in zip(params, reference):  # no state in bfloat16: tensors in float32 (0-d scalars and counters as
        for key, value in opt.state[p].items():  # each keeps them), or a compressed format of the recipe's own
            if key in case.entry.compressed_state:
                assert value.dtype == fp32.state[q][key].dtype, key
            else:
                assert value.dtype != torch.bfloat16 and (value.dim() == 0 or value.dtype == torch.float32), key


@pytest.mark.slow
def test_bf16_parameters_compiled_equal_eager():
    params = _leaves([(8, 4), (16,)], dtype=torch.bfloat16)
    compiled_p, eager_p = _clone(params), _clone(params)
    compiled = gradwise.AdamW(compiled_p, lr=0.05, compile=True)
    eager = gradwise.AdamW(eager_p, lr=0.05, compile=False)
    _run(compiled, compiled_p, 3)
    _run(eager, eager_p, 3)
    assert compiled.compile_stats["compiles"] == 1
    assert all(not torch.equal(p, q) for p, q in zip(compiled_p, params))
    assert all(torch.equal(p, q) for p, q in zip(compiled_p, eager_p))
    assert all(v.dtype == torch.float32 for p in compiled_p for v in compiled.state[p].values())


def test_bf16_state_stays_float32_through_state_dict():
    params = _leaves([(8, 4), (16,)], dtype=torch.bfloat16)
    opt = gradwise.AdamW(params, lr=0.05, compile=False)
    _run(opt, params, 2)
    buf = io.BytesIO()
    torch.save(opt.state_dict(), buf)
    buf.seek(0)
    fresh_p = _clone(params)
    fresh = gradwise.AdamW(fresh_p, lr=0.05, compile=False)
    fresh.load_state_dict(torch.load(buf))
    for p, q in zip(params, fresh_p):
        for key, value in opt.state[p].items():
            assert fresh.state[q][key].dtype == value.dtype, f"state {key!r} was cast on load"
            assert torch.equal(fresh.state[q][key], value)
    _run(opt, params, 2, first=2)
    _run(fresh, fresh_p, 2, first=2)
    assert all(torch.equal(p, q) for p, q in zip(params, fresh_p))


@pytest.mark.parametrize("compile", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_non_contiguous_parameters(compile):
    gen = torch.Generator().manual_seed(0)
    f64 = dict(generator=gen, dtype=torch.float64)
    transposed = torch.randn(6, 4, **f64).t().requires_grad_()
    strided = torch.randn(4, 10, **f64)[:, ::2].requires_grad_()  # not one dense run of memory
    plain = torch.randn(7, **f64).requires_grad_()
    params = [transposed, strided, plain]
    assert not transposed.is_contiguous() and not strided.is_contiguous() and all(p.is_leaf for p in params)
    ours_p = [transposed, strided, plain]
    theirs_p = _clone(params)
    ours = gradwise.AdamW(ours_p, lr=0.05, weight_decay=0.1, compile=compile)
    theirs = torch.optim.AdamW(theirs_p, lr=0.05, weight_decay=0.1)
    strides = [p.stride() for p in ours_p]
    w = [torch.randn(p.shape, **f64) for p in params]
    for _ in range(4):
        for opt, ps in ((ours, ours_p), (theirs, theirs_p)):
            opt.zero_grad()
            sum(((p - q) ** 2 * q).sum() for p, q in zip(ps, w)).backward()
            opt.step()
    assert [p.stride() for p in ours_p] == strides, "parameters were re-laid out"
    _assert_close(ours_p, theirs_p)
    if compile:
        assert ours.compile_stats["compiles"] >= 1


# ----------------------------------------------------------------------------------------- skipping non-finite steps
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")], ids=["nan", "inf", "-inf"])
def test_skip_nonfinite(bad):
    params = _leaves([(3, 4), (5,), ()], dtype=torch.float32)
    guarded_p, plain_p = _clone(params), _clone(params)
    guarded = gradwise.AdamW(guarded_p, lr=0.05, weight_decay=0.1, skip_nonfinite=True, compile=False)
    plain = gradwise.AdamW(plain_p, lr=0.05, weight_decay=0.1, compile=False)

    # a non-finite first step creates no state
    _set_grads(guarded_p, 0)
    guarded_p[1].grad[2] = bad
    guarded.step()
    assert guarded.skipped_steps == 1 and not any(guarded.state.get(p) for p in guarded_p)
    assert all(torch.equal(a, b) for a, b in zip(guarded_p, params))

    finite = 0
    for step in range(1, 7):
        if step in (2, 4):
            snap = _snapshot(guarded, guarded_p)
            _set_grads(guarded_p, step)
            guarded_p[0 if step == 2 else 2].grad.view(-1)[0] = bad
            guarded.step()
            _assert_unchanged(guarded, guarded_p, snap)
            continue
        finite += 1
        _set_grads(guarded_p, step)
        _set_grads(plain_p, step)
        guarded.step()
        plain.step()
    assert guarded.skipped_steps == 3
    assert int(guarded.state[guarded_p[0]]["step"]) == finite == 4
    # the finite steps proceed exactly as without the guard
    assert all(torch.equal(a, b) for a, b in zip(guarded_p, plain_p))

    buf = io.BytesIO()
    torch.save(guarded.state_dict(), buf)
    buf.seek(0)
    fresh = gradwise.AdamW(_clone(guarded_p), lr=0.05, weight_decay=0.1, skip_nonfinite=True, compile=False)
    assert fresh.skipped_steps == 0
    fresh.load_state_dict(torch.load(buf))
    assert fresh.skipped_steps == 3


def test_without_skip_nonfinite_nan_propagates():
    (p,) = _leaves([(4,)], dtype=torch.float32)
    opt = gradwise.AdamW([p], lr=0.05, compile=False)
    p.grad = torch.tensor([1.0, float("nan"), 1.0, 1.0])
    opt.step()
    assert opt.skipped_steps == 0 and p.isnan().any()


# ----------------------------------------------------------------------------------------- resuming
#: the recipes also resumed compiled: one per kind of link the compiled path steps (a momentum, Adam's moments,
#: a sign, Schedule-Free's two points, Ranger21's phases and lookahead, orthogonalization on owners, a
#: preconditioner refreshed every few steps, factored moments, a low-rank projection, a modifier that resets
#: state). The other recipes' compiled steps are checked against eager (tests/test_parity.py) and their resume
#: eagerly here: a compile per recipe twice over cost about four minutes of the suite.
RESUMED_COMPILED = {"sgd-nesterov", "adamw", "lion", "schedule-free-adamw", "ranger21", "muon", "shampoo",
                    "adafactor", "galore-adamw", "spam"}
RESUME_CASES = [pytest.param(c, compile, id=f"{c.name}-{'compiled' if compile else 'eager'}",
                             marks=[pytest.mark.slow] if compile else [])
                for c in CASES if c.trains for compile in (False, True)
                if not compile or c.name in RESUMED_COMPILED]


def test_every_recipe_resumed_compiled_is_a_case():
    assert RESUMED_COMPILED <= {c.name for c in CASES if c.trains}, RESUMED_COMPILED - {c.name for c in CASES}


@pytest.mark.parametrize(("case", "compile"), RESUME_CASES)
def test_state_dict_round_trip_resumes_bit_identically(case, compile):
    n = 3
    model = _mlp()
    opt = case.ours(model.named_parameters(), compile=compile)
    scheduler = lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    _train_mlp(model, opt, n, scheduler=scheduler)
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "sched": scheduler.state_dict()}, buf)
    _train_mlp(model, opt, n, first=n, scheduler=scheduler)  # the uninterrupted run: 2n steps

    buf.seek(0)
    checkpoint = torch.load(buf)
    resumed_model = _mlp(seed=123)
    resumed = case.ours(resumed_model.named_parameters(), compile=compile)
    resumed_scheduler = lr_scheduler.StepLR(resumed, step_size=2, gamma=0.5)
    resumed_model.load_state_dict(checkpoint["model"])
    resumed.load_state_dict(checkpoint["opt"])
    resumed_scheduler.load_state_dict(checkpoint["sched"])
    _train_mlp(resumed_model, resumed, n, first=n, scheduler=resumed_scheduler)

    for (pname, a), b in zip(model.named_parameters(), resumed_model.parameters()):
        assert torch.equal(a, b), f"{pname} differs after resuming"
    for a, b in zip(model.parameters(), resumed_model.parameters()):
        assert set(opt.state[a]) == set(resumed.state[b])
        for key in opt.state[a]:
            assert torch.equal(opt.state[a][key], resumed.state[b][key]), key
    assert opt.param_groups[0]["lr"] == resumed.param_groups[0]["lr"]
    if compile and case.compiles:
        assert resumed.compile_stats["compiles"] >= 1


@pytest.mark.parametrize("dtype", [torch.complex64, torch.bfloat16], ids=str)
def test_resume_keeps_real_or_float32_state(dtype):
    """Complex parameters keep state on their real view and 16-bit ones in float32, through a checkpoint."""
    gen = torch.Generator().manual_seed(0)
    start = torch.randn(6, 3, generator=gen).to(dtype)

    def grads(step):
        return torch.randn(6, 3, generator=torch.Generator().manual_seed(step)).to(dtype)

    a = start.clone().requires_grad_()
    opt = gradwise.AdamW([a], lr=0.05, compile=False)
    for step in range(3):
        a.grad = grads(step)
        opt.step()
    buf = io.BytesIO()
    torch.save({"p": a.detach().clone(), "opt": opt.state_dict()}, buf)
    for step in range(3, 6):
        a.grad = grads(step)
        opt.step()

    buf.seek(0)
    checkpoint = torch.load(buf)
    b = checkpoint["p"].clone().requires_grad_()
    resumed = gradwise.AdamW([b], lr=0.05, compile=False)
    resumed.load_state_dict(checkpoint["opt"])
    assert not resumed.state[b]["adam.exp_avg"].is_complex()
    assert resumed.state[b]["adam.exp_avg"].dtype in (torch.float32,)
    for step in range(3, 6):
        b.grad = grads(step)
        resumed.step()
    assert torch.equal(a, b)
