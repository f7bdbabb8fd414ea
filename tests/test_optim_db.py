"""torch's own optimizer test configurations (``optim_db``) run against gradwise, and the generic behaviours
a torch.optim drop-in must keep.

Every configuration torch's test_optim.py builds for SGD, Adam, AdamW, NAdam, Adafactor and Muon, with the
global flags (``_get_optim_inputs_including_global_cliquey_kwargs``: ``fused``, ``differentiable``), runs
20 steps on gradwise's counterpart and on torch's, on the eager path: float64 within 1e-10, float32 within
rtol 1e-5. Keywords a configuration leaves out get torch's default (NAdamW's own defaults are AdamW-like).
``fused=True`` runs torch's own fused kernel on these CPU float parameters (else gradwise's compiled step):
the sweep runs those configurations eagerly without it, ``test_fused_configurations_run_the_kernel_and_compiled``
with it and compiled. ``differentiable=True`` is refused, with its reason (the README's drop-in table).
"""
from __future__ import annotations

import copy
import inspect

import pytest
import torch
from torch import nn
from torch.optim.lr_scheduler import CyclicLR, OneCycleLR
from torch.testing._internal.common_optimizers import (  # needs expecttest, in .[test]
    _get_optim_inputs_including_global_cliquey_kwargs,
    optim_db,
)

from tests.models import default_dtype, regression_batch
from tests.registry import ENTRIES

#: each torch.optim optimizer with the recipe that is its drop-in (tests/registry.py)
COUNTERPARTS = {e.torch_counterpart: e.recipe for e in ENTRIES if e.torch_counterpart is not None}
#: configurations gradwise refuses, by the flag that asks for them, and why
UNSUPPORTED = {"differentiable": "gradwise steps under torch.no_grad and updates parameters and state in place"}
STEPS = 20
TOLERANCES = {torch.float64: dict(rtol=1e-10, atol=1e-10), torch.float32: dict(rtol=1e-5, atol=1e-6)}


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny tensors: a thread pool's hand-off costs more than it saves (bfloat16 matmuls ms instead of us)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def configurations(dtype: torch.dtype) -> list[tuple[type, dict, str]]:
    out = []
    with default_dtype(dtype):  # a configuration's tensor lr in the run's dtype
        for info in optim_db:
            if info.optim_cls in COUNTERPARTS:
                for entry in _get_optim_inputs_including_global_cliquey_kwargs("cpu", dtype, info):
                    out.append((info.optim_cls, entry.kwargs, f"{info.optim_cls.__name__}-{entry.desc}"))
    return out


CONFIGURATIONS = [(dtype, *c) for dtype in (torch.float64, torch.float32) for c in configurations(dtype)]


def unsupported(kwargs: dict) -> str | None:
    return next((flag for flag in UNSUPPORTED if kwargs.get(flag) is True), None)


def gradwise_kwargs(torch_cls: type, kwargs: dict) -> dict:
    """``kwargs`` with torch's default for every keyword where gradwise's counterpart defaults otherwise."""
    ours = inspect.signature(COUNTERPARTS[torch_cls].__init__).parameters
    theirs = inspect.signature(torch_cls.__init__).parameters
    defaults = {k: p.default for k, p in theirs.items() if p.default is not p.empty and k in ours
                and ours[k].default != p.default}
    return {**defaults, **kwargs}


def make_params(torch_cls: type, dtype: torch.dtype) -> list[torch.Tensor]:
    """Small parameters of varied shapes (matrices only for Muon, which takes nothing else)."""
    gen = torch.Generator().manual_seed(0)
    shapes = [(5, 3), (4, 6)] if torch_cls is torch.optim.Muon else [(5, 3), (7,), (2, 3, 4), ()]
    return [torch.randn(s, generator=gen, dtype=dtype).requires_grad_() for s in shapes]


def run(make, params: list[torch.Tensor], steps: int = STEPS) -> list[torch.Tensor]:
    """``steps`` steps on the same gradients every time (seeded by step), and the parameters after them."""
    optimizer = make(params)
    for step in range(steps):
        gen = torch.Generator().manual_seed(100 + step)
        for p in params:
            p.grad = torch.randn(p.shape, generator=gen, dtype=p.dtype)
        optimizer.step()
    return [p.detach() for p in params]


def check_against_torch(dtype, torch_cls, kwargs, compile=False) -> None:
    with default_dtype(dtype):
        theirs = run(lambda ps: torch_cls(ps, **kwargs), make_params(torch_cls, dtype))
    ours_kwargs = gradwise_kwargs(torch_cls, kwargs)
    if not compile:
        ours_kwargs = {k: v for k, v in ours_kwargs.items() if k != "fused"}
    ours = run(lambda ps: COUNTERPARTS[torch_cls](ps, compile=compile, **ours_kwargs), make_params(torch_cls, dtype))
    for mine, reference in zip(ours, theirs):
        torch.testing.assert_close(mine, reference, **TOLERANCES[dtype])


@pytest.mark.parametrize("dtype, torch_cls, kwargs, desc", CONFIGURATIONS,
                         ids=[f"{str(c[0])[6:]}-{c[3]}" for c in CONFIGURATIONS])
def test_configuration_matches_torch_or_is_refused_with_a_reason(dtype, torch_cls, kwargs, desc):
    flag = unsupported(kwargs)
    if flag is not None:
        with pytest.raises(ValueError, match=rf"{flag}=True is not supported: {UNSUPPORTED[flag]}"):
            COUNTERPARTS[torch_cls](make_params(torch_cls, dtype), **gradwise_kwargs(torch_cls, kwargs))
        return
    check_against_torch(dtype, torch_cls, kwargs)


FUSED = [c for c in CONFIGURATIONS if c[0] == torch.float32
         and c[3] in ("SGD-momentum & fused", "Adam-amsgrad & fused", "AdamW-nonzero weight_decay & fused")]


@pytest.mark.slow
@pytest.mark.parametrize("dtype, torch_cls, kwargs, desc", FUSED, ids=[c[3] for c in FUSED])
def test_fused_configurations_run_the_kernel_and_compiled(dtype, torch_cls, kwargs, desc):
    """``fused=True`` (torch's fused kernel here, nothing compiled) matches torch's fused step; so does the
    compiled step (``compile=True``), and eager equals it."""
    optimizer = COUNTERPARTS[torch_cls](make_params(torch_cls, dtype), **kwargs)
    assert optimizer.compile is True and optimizer.torch_kernels
    check_against_torch(dtype, torch_cls, kwargs, compile=True)
    unfused = {k: v for k, v in gradwise_kwargs(torch_cls, kwargs).items() if k != "fused"}
    with default_dtype(dtype):
        theirs = run(lambda ps: torch_cls(ps, **kwargs), make_params(torch_cls, dtype))
    compiled = COUNTERPARTS[torch_cls](make_params(torch_cls, dtype), compile=True, **unfused)
    after = run(lambda ps: compiled, compiled.param_groups[0]["params"])
    eager = run(lambda ps: COUNTERPARTS[torch_cls](ps, compile=False, **unfused), make_params(torch_cls, dtype))
    assert compiled.compile_stats["compiles"] >= 1
    for a, b, reference in zip(after, eager, theirs):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(a, reference, **TOLERANCES[dtype])


# ------------------------------------------------------------------------------------ generic behaviours
#: one configuration per optimizer for the generic behaviours
BEHAVIOUR_KWARGS = {torch.optim.SGD: dict(lr=0.05, momentum=0.9, weight_decay=0.01),
                    torch.optim.Adam: dict(lr=0.01, weight_decay=0.01, amsgrad=True),
                    torch.optim.AdamW: dict(lr=0.01), torch.optim.NAdam: dict(lr=0.01, decoupled_weight_decay=True),
                    torch.optim.Adafactor: dict(lr=0.01), torch.optim.Muon: dict(lr=0.02)}
BEHAVIOURS = list(BEHAVIOUR_KWARGS)


@pytest.fixture(autouse=True)
def float64_scalars(request):
    """The behaviours run in float64; torch keeps its scalar state in the default dtype (see ``default_dtype``)."""
    if request.function.__name__.startswith("test_configuration") or "fused" in request.function.__name__:
        yield
        return
    with default_dtype(torch.float64):
        yield


def model(torch_cls: type) -> nn.Module:
    torch.manual_seed(0)
    bias = torch_cls is not torch.optim.Muon  # torch.optim.Muon takes matrices only
    return nn.Sequential(nn.Linear(8, 6, bias=bias), nn.Tanh(), nn.Linear(6, 1, bias=bias)).double()


def pair(torch_cls: type):
    """(our model, our optimizer, torch's model, torch's optimizer), the models equal."""
    kwargs = BEHAVIOUR_KWARGS[torch_cls]
    ours_model, theirs_model = model(torch_cls), model(torch_cls)
    ours = COUNTERPARTS[torch_cls](ours_model.parameters(), compile=False, **gradwise_kwargs(torch_cls, kwargs))
    return ours_model, ours, theirs_model, torch_cls(theirs_model.parameters(), **kwargs)


def loss_of(net: nn.Module, step: int) -> torch.Tensor:
    x, y = regression_batch(torch.float64, step)
    return nn.functional.mse_loss(net(x), y)


def assert_same_params(a: nn.Module, b: nn.Module, **tolerance) -> None:
    for p, q in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(p, q, **(tolerance or dict(rtol=1e-10, atol=1e-10)))


@pytest.mark.parametrize("torch_cls", BEHAVIOURS, ids=lambda c: c.__name__)
def test_state_dict_round_trip_is_equal_and_resumes_bit_identically(torch_cls):
    net, optimizer, _, _ = pair(torch_cls)
    for step in range(3):
        optimizer.zero_grad()
        loss_of(net, step).backward()
        optimizer.step()
    saved = copy.deepcopy(optimizer.state_dict())  # as torch.save would: a live state_dict shares its tensors
    twin_net, twin, _, _ = pair(torch_cls)
    twin_net.load_state_dict(net.state_dict())
    twin.load_state_dict(saved)
    again = twin.state_dict()
    assert again["param_groups"] == saved["param_groups"]
    assert again["state"].keys() == saved["state"].keys()
    for key, buffers in saved["state"].items():
        assert all(torch.equal(again["state"][key][name], value) for name, value in buffers.items())
    for step in range(3, 6):
        for n, o in ((net, optimizer), (twin_net, twin)):
            o.zero_grad()
            loss_of(n, step).backward()
            o.step()
    for p, q in zip(net.parameters(), twin_net.parameters()):
        assert torch.equal(p, q)


@pytest.mark.parametrize("torch_cls", [c for c in BEHAVIOURS if c is not torch.optim.Adafactor],
                         ids=lambda c: c.__name__)
@pytest.mark.parametrize("scheduler", ["OneCycleLR", "CyclicLR"])
def test_schedulers_that_cycle_momentum_match_torch(torch_cls, scheduler):
    ours_net, ours, theirs_net, theirs = pair(torch_cls)
    make = {"OneCycleLR": lambda o: OneCycleLR(o, max_lr=0.05, total_steps=12),
            "CyclicLR": lambda o: CyclicLR(o, base_lr=0.005, max_lr=0.05, step_size_up=3)}[scheduler]
    schedules = make(ours), make(theirs)
    for step in range(10):
        for net, optimizer, schedule in ((ours_net, ours, schedules[0]), (theirs_net, theirs, schedules[1])):
            optimizer.zero_grad()
            loss_of(net, step).backward()
            optimizer.step()
            schedule.step()
    assert_same_params(ours_net, theirs_net)


@pytest.mark.parametrize("torch_cls", BEHAVIOURS, ids=lambda c: c.__name__)
def test_grad_scaler_steps_as_torch_and_skips_an_inf_step(torch_cls):
    ours_net, ours, theirs_net, theirs = pair(torch_cls)
    scalers = torch.amp.GradScaler("cpu", init_scale=2.0**8), torch.amp.GradScaler("cpu", init_scale=2.0**8)
    for step in range(4):
        for net, optimizer, scaler in ((ours_net, ours, scalers[0]), (theirs_net, theirs, scalers[1])):
            optimizer.zero_grad()
            loss = loss_of(net, step) * (float("inf") if step == 2 else 1.0)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
    assert scalers[0].get_scale() == scalers[1].get_scale() == 2.0**7  # halved once, at the inf step
    assert_same_params(ours_net, theirs_net)


@pytest.mark.parametrize("torch_cls", BEHAVIOURS, ids=lambda c: c.__name__)
def test_step_and_state_dict_hooks_run_as_in_torch(torch_cls):
    calls = {}
    for side, (_, optimizer) in {"ours": pair(torch_cls)[:2], "theirs": pair(torch_cls)[2:]}.items():
        log = calls[side] = []
        optimizer.register_step_pre_hook(lambda o, args, kwargs: log.append("step_pre"))
        optimizer.register_step_post_hook(lambda o, args, kwargs: log.append("step_post"))
        optimizer.register_state_dict_pre_hook(lambda o: log.append("state_dict_pre"))
        optimizer.register_state_dict_post_hook(lambda o, sd: log.append("state_dict_post"))
        optimizer.register_load_state_dict_pre_hook(lambda o, sd: log.append("load_pre"))
        optimizer.register_load_state_dict_post_hook(lambda o: log.append("load_post"))
        for p in (p for g in optimizer.param_groups for p in g["params"]):
            p.grad = torch.ones_like(p)
        optimizer.step()
        optimizer.load_state_dict(optimizer.state_dict())
    assert calls["ours"] == calls["theirs"] == ["step_pre", "step_post", "state_dict_pre", "state_dict_post",
                                                "load_pre", "load_post"]


@pytest.mark.parametrize("torch_cls", BEHAVIOURS, ids=lambda c: c.__name__)
def test_closure_is_evaluated_with_grad_and_its_loss_returned(torch_cls):
    ours_net, ours, theirs_net, theirs = pair(torch_cls)
    for step in range(3):
        losses = []
        for net, optimizer in ((ours_net, ours), (theirs_net, theirs)):
            def closure(net=net, optimizer=optimizer):
                optimizer.zero_grad()
                loss = loss_of(net, step)
                loss.backward()
                return loss
            losses.append(optimizer.step(closure))
        torch.testing.assert_close(losses[0], losses[1], rtol=1e-10, atol=1e-10)
    assert_same_params(ours_net, theirs_net)


@pytest.mark.parametrize("torch_cls", BEHAVIOURS, ids=lambda c: c.__name__)
def test_parameters_without_grad_are_left_alone(torch_cls):
    ours_net, ours, theirs_net, theirs = pair(torch_cls)
    frozen = [list(net.parameters())[0] for net in (ours_net, theirs_net)]
    before = frozen[0].detach().clone()
    for step in range(3):
        for net, optimizer, first in ((ours_net, ours, frozen[0]), (theirs_net, theirs, frozen[1])):
            optimizer.zero_grad()
            loss_of(net, step).backward()
            first.grad = None
            optimizer.step()
    assert torch.equal(frozen[0], before) and frozen[0] not in ours.state
    assert_same_params(ours_net, theirs_net)
