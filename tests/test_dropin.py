"""A torch.optim drop-in that loses nothing: torch's numbers in float32, torch's keywords, AMSGrad, copies
and pickles that step as the original, param-group keys of the user's own, and schedulers that cycle
Muon's momentum. (torch's own optim_db configurations: tests/test_optim_db.py.)"""
from __future__ import annotations

import copy
import inspect
import pickle
import warnings

import pytest
import torch
from torch.optim.lr_scheduler import CyclicLR, OneCycleLR

import gradwise
from tests.models import default_dtype
from tests.registry import CASES, ENTRIES, ENTRY, build

#: the drop-ins: each recipe with the torch.optim optimizer whose keywords and defaults it takes
COUNTERPARTS = {e.recipe: e.torch_counterpart for e in ENTRIES if e.torch_counterpart is not None}
#: torch's implementation flags, accepted where the counterpart takes them
FLAGS = ("foreach", "fused", "differentiable", "capturable")


def steps(optimizer, params, n, first=0):
    for step in range(first, first + n):
        gen = torch.Generator().manual_seed(step)
        for p in params:
            p.grad = torch.randn(p.shape, generator=gen, dtype=p.dtype)
        optimizer.step()


# ----------------------------------------------------------------------------- float32 numbers
@pytest.mark.parametrize("ours, theirs", [
    (lambda p: gradwise.Adam(p, lr=1e-2, compile=False), lambda p: torch.optim.Adam(p, lr=1e-2, foreach=False)),
    (lambda p: gradwise.AdamW(p, lr=1e-2, compile=False), lambda p: torch.optim.AdamW(p, lr=1e-2, foreach=False)),
    (lambda p: gradwise.NAdamW(p, lr=1e-2, compile=False),
     lambda p: torch.optim.NAdam(p, lr=1e-2, weight_decay=1e-2, decoupled_weight_decay=True, foreach=False)),
], ids=["Adam", "AdamW", "NAdamW"])
def test_float32_adam_family_stays_within_float32_rounding_of_torch(ours, theirs):
    """1 - beta2 in float32 (1 - float32(0.999)) is 1.3e-5 off; torch computes it in double. Small
    weights, so the 20 steps' change dominates them: 6e-6 apart with 1 - beta in float32, 4e-7 now
    (torch's own fused and foreach steps are 1e-7 from its for-loop)."""
    results = []
    for make in (ours, theirs):
        p = (0.01 * torch.randn(1000, generator=torch.Generator().manual_seed(0))).requires_grad_()
        steps(make([p]), [p], 20)
        results.append(p.detach())
    assert ((results[0] - results[1]).abs().max() / results[1].abs().max()).item() < 1e-6


# ----------------------------------------------------------------------------- torch's keywords
@pytest.mark.parametrize("recipe", list(COUNTERPARTS), ids=lambda r: r.__name__)
def test_every_keyword_of_the_torch_counterpart_is_accepted_with_its_default(recipe):
    ours = inspect.signature(recipe.__init__).parameters
    theirs = inspect.signature(COUNTERPARTS[recipe].__init__).parameters
    missing = [k for k in theirs if k not in ours]
    assert not missing, f"{recipe.__name__} lacks torch's {missing}"
    positional = [k for k, p in theirs.items() if p.kind is p.POSITIONAL_OR_KEYWORD]
    assert [k for k, p in ours.items() if p.kind is p.POSITIONAL_OR_KEYWORD][:len(positional)] == positional
    differ = {k for k, p in theirs.items() if p.default is not p.empty and ours[k].default != p.default}
    assert differ <= ENTRY[recipe].own_defaults, f"{recipe.__name__} changes torch's defaults of {differ}"


@pytest.mark.parametrize("recipe", [r for r, torch_class in COUNTERPARTS.items()
                                    if set(FLAGS) & set(inspect.signature(torch_class.__init__).parameters)],
                         ids=lambda r: r.__name__)
def test_torch_implementation_flags(recipe):
    params = [torch.zeros(3, requires_grad=True)]
    takes = inspect.signature(recipe.__init__).parameters
    for flag in FLAGS:
        if flag in takes:
            recipe(params, **{flag: False})  # torch's no-ops are accepted
    if "fused" in takes:
        assert recipe(params, fused=True).compile is True  # the compiled step, or torch's kernel where it has one
        assert recipe(params, fused=True).torch_kernels is (recipe.__name__ in ("Adam", "AdamW", "SGD"))
        assert recipe(params, compile=True).torch_kernels is False
        refused = (r"fused=True asks for a fused step \(torch's kernel or the compiled graph\),"
                   r" which contradicts compile=False")
        with pytest.raises(ValueError, match=refused):
            recipe(params, fused=True, compile=False)
    for flag in ("differentiable", "capturable"):
        if flag in takes:
            with pytest.raises(ValueError, match=rf"{recipe.__name__}\(\): {flag}=True is not supported: "):
                recipe(params, **{flag: True})
    with pytest.raises(TypeError, match=r"invalid foreach='yes': expected None, True or False"):
        recipe(params, foreach="yes")


@pytest.mark.parametrize("recipe, kwargs", [
    (gradwise.Adam, dict(lr=0.1, weight_decay=0.1, amsgrad=True)),
    (gradwise.AdamW, dict(lr=0.1, amsgrad=True)),
    (gradwise.Adam, dict(lr=0.1, weight_decay=0.1, decoupled_weight_decay=True)),
    (gradwise.NAdamW, dict(lr=0.1, weight_decay=0.1, decoupled_weight_decay=False)),
], ids=["Adam-amsgrad", "AdamW-amsgrad", "Adam-decoupled", "NAdamW-L2"])
def test_amsgrad_and_decoupled_weight_decay_match_torch_step_by_step(recipe, kwargs):
    gen = torch.Generator().manual_seed(0)
    ours, theirs = (torch.randn(5, 4, generator=gen, dtype=torch.float64).requires_grad_() for _ in range(2))
    with torch.no_grad():
        theirs.copy_(ours)
    optimizers = recipe([ours], compile=False, **kwargs), COUNTERPARTS[recipe]([theirs], **kwargs)
    for step in range(8):
        steps(optimizers[0], [ours], 1, step)
        with default_dtype(torch.float64):  # torch's NAdam keeps mu_product in the default dtype
            steps(optimizers[1], [theirs], 1, step)
        torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-12)
    if kwargs.get("amsgrad"):
        torch.testing.assert_close(optimizers[0].state[ours]["adam.max_exp_avg_sq"],
                                   optimizers[1].state[theirs]["max_exp_avg_sq"], rtol=1e-12, atol=0)


def test_amsgrad_is_a_param_group_entry_as_in_torch():
    a, b = (torch.randn(4, generator=torch.Generator().manual_seed(i)).requires_grad_() for i in range(2))
    optimizer = gradwise.Adam([{"params": [a]}, {"params": [b], "amsgrad": True}], compile=False)
    steps(optimizer, [a, b], 2)
    assert "adam.max_exp_avg_sq" not in optimizer.state[a] and "adam.max_exp_avg_sq" in optimizer.state[b]


def test_amsgrad_maximum_is_encoded_and_converted_like_the_other_moments():
    p = torch.randn(64, 64, generator=torch.Generator().manual_seed(0)).requires_grad_()
    encoded = gradwise.AdamW([p], amsgrad=True, state="int8", compile=False)
    steps(encoded, [p], 2)
    assert any(k.startswith("adam.max_exp_avg_sq@int8") for k in encoded.state[p])
    plain = gradwise.AdamW([torch.zeros(64, 64, requires_grad=True)], amsgrad=True, compile=False)
    with pytest.warns(UserWarning, match=r"converted 3 state buffer\(s\)"):
        plain.load_state_dict(copy.deepcopy(encoded.state_dict()))
    assert sorted(plain.state[plain.param_groups[0]["params"][0]]) == [
        "adam.exp_avg", "adam.exp_avg_sq", "adam.max_exp_avg_sq", "step"]


# ----------------------------------------------------------------------------- copies
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
def test_a_copy_steps_exactly_as_the_original(case, how):
    gen = torch.Generator().manual_seed(0)
    params = [torch.randn(6, 5, generator=gen).requires_grad_(), torch.randn(5, generator=gen).requires_grad_()]
    original = build(case.recipe, params, compile=False, **case.kwargs)
    steps(original, params, 2)
    twin = copy.deepcopy(original) if how == "deepcopy" else pickle.loads(pickle.dumps(original))
    twin_params = [p for group in twin.param_groups for p in group["params"]]
    assert twin_params[0] is not params[0] and len(twin_params) == len(params)
    steps(original, params, 3, first=2)
    steps(twin, twin_params, 3, first=2)
    assert all(torch.equal(p, q) for p, q in zip(params, twin_params))
    assert (twin.mode, twin.skipped_steps, twin.compile) == (original.mode, original.skipped_steps, original.compile)
    assert twin.state_dict()["param_groups"] == original.state_dict()["param_groups"]  # its own hooks came along


# ----------------------------------------------------------------------------- param-group keys
def test_param_group_keys_of_the_users_own_are_kept_as_torch_keeps_them():
    a, b = (torch.randn(3, generator=torch.Generator().manual_seed(i)).requires_grad_() for i in range(2))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # keys no hyperparameter resembles: no warning
        optimizer = gradwise.AdamW([{"params": [a], "layer_id": 3}, {"params": [b], "lr_scale": 0.5}], compile=False)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    steps(optimizer, [a, b], 2)
    schedule.step()
    assert optimizer.param_groups[0]["layer_id"] == 3 and optimizer.param_groups[1]["lr_scale"] == 0.5
    saved = copy.deepcopy(optimizer.state_dict())
    assert [g.get("layer_id") for g in saved["param_groups"]] == [3, None]
    resumed = gradwise.AdamW([{"params": [a], "layer_id": 3}, {"params": [b], "lr_scale": 0.5}], compile=False)
    resumed.load_state_dict(saved)
    assert resumed.param_groups[1]["lr_scale"] == 0.5


# ----------------------------------------------------------------------------- Muon and momentum schedules
@pytest.mark.parametrize("make", [lambda o: OneCycleLR(o, max_lr=0.05, total_steps=30),
                                  lambda o: CyclicLR(o, base_lr=0.01, max_lr=0.05, step_size_up=5)],
                         ids=["OneCycleLR", "CyclicLR"])
def test_schedulers_cycle_muons_momentum_as_torch_optim_muons(make):
    gen = torch.Generator().manual_seed(0)
    ours, theirs = (torch.randn(6, 5, generator=gen, dtype=torch.float64).requires_grad_() for _ in range(2))
    with torch.no_grad():
        theirs.copy_(ours)
    optimizers = gradwise.Muon([ours], lr=0.02, compile=False), torch.optim.Muon([theirs], lr=0.02)
    schedules = [make(o) for o in optimizers]
    for step in range(20):
        for optimizer, p, schedule in zip(optimizers, (ours, theirs), schedules):
            steps(optimizer, [p], 1, step)
            schedule.step()
        assert optimizers[0].param_groups[0]["momentum"] == optimizers[1].param_groups[0]["momentum"]
    torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("seed", [171, 208])  # gradients where batched and 2-D bfloat16 matmuls round apart
def test_newton_schulz_on_a_lone_matrix_is_torch_optim_muons_bit_for_bit(seed):
    from torch.optim._muon import _zeropower_via_newtonschulz

    from gradwise.transforms.newton_schulz import newton_schulz

    g = torch.randn(4, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    coefficients = (3.4, -4.7, 2.0)
    ours = newton_schulz(g.bfloat16()[None], coefficients, 5, 1e-7)[0]
    assert torch.equal(ours, _zeropower_via_newtonschulz(g, coefficients, 5, 1e-7))
