"""Bad input fails loudly, early and atomically: a ValueError or TypeError whose message names the
argument, the value it got and what is allowed; a step that fails changes no parameter and no state."""
from __future__ import annotations

import inspect
import pickle
import re

import numpy as np
import pytest
import torch
from torch import nn
from torch.optim import lr_scheduler

import gradwise
from gradwise.core.hyper import (
    betas_pair,
    boolean,
    choice,
    either,
    int_in,
    number_in,
    optional,
    positive_int,
    sequence_of,
    unit_interval,
)
from tests.registry import ENTRY, RECIPES, build


def _default(recipe, keyword):
    parameter = inspect.signature(recipe.__init__).parameters.get(keyword)
    return None if parameter is None else parameter.default


def _adam_betas(recipe) -> bool:
    """Its ``betas`` keyword is the chain's pair (beta1, beta2), each in [0, 1) (not Shampoo's, whose
    beta2 may be 1, nor CAME's three)."""
    checks = {c.hyper["betas"].check for c in ENTRY[recipe].chains if "betas" in c.hyper}
    return _default(recipe, "betas") is not None and checks == {betas_pair}


#: the recipes whose betas are Adam's pair, and those whose eps is one number
BETA_PAIRS = [r for r in RECIPES if _adam_betas(r)]
ONE_EPS = [r for r in RECIPES if isinstance(_default(r, "eps"), float)]


def _params(n=2):
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(3, 2, generator=gen).requires_grad_() for _ in range(n)]


def _snapshot(optimizer, params):
    return ([p.detach().clone() for p in params],
            [{k: v.clone() for k, v in optimizer.state[p].items()} if p in optimizer.state else None for p in params])


def _assert_unchanged(optimizer, params, snapshot):
    before_params, before_state = snapshot
    for p, b in zip(params, before_params):
        assert torch.equal(p.detach(), b), "a parameter changed"
    for p, st in zip(params, before_state):
        now = optimizer.state[p] if p in optimizer.state else None
        if st is None:
            assert not now, "state was created by a failed step"
            continue
        assert set(now) == set(st)
        for k, v in st.items():
            assert torch.equal(now[k], v), f"state {k!r} changed"


# ----------------------------------------------------------------------------------------- hyperparameter values
@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("lr,shown", [(-0.1, r"-0\.1"), (float("nan"), "nan"), (float("inf"), "inf"),
                                      (-float("inf"), "-inf")])
def test_bad_lr(recipe, lr, shown):
    with pytest.raises(ValueError, match=rf"lr={shown}\b.*finite number >=? 0"):
        build(recipe, _params(), lr=lr)


@pytest.mark.parametrize("check, value, error, message", [
    (int_in(1, 99), 100, ValueError, "invalid n=100: expected an integer in [1, 99]"),
    (positive_int, True, ValueError, "invalid n=True: expected an integer >= 1"),
    (positive_int, 2.0, ValueError, "invalid n=2.0: expected an integer >= 1"),
    (number_in(1, note="a ratio"), 0.5, ValueError, "invalid n=0.5: expected a finite number >= 1 (a ratio)"),
    (number_in(0, 1, open_low=True), 0, ValueError, "invalid n=0: expected a number in (0, 1]"),
    (choice(("adam", "sgd")), "adamw", ValueError, "invalid n='adamw': expected one of ['adam', 'sgd']"),
    (either(choice(("row",)), int_in(1, note="elements per block")), "col", ValueError,
     "invalid n='col': expected 'row' or an integer >= 1 (elements per block)"),
    (optional(unit_interval, "= betas[1]"), 1.0, ValueError,
     "invalid n=1.0: expected None (= betas[1]) or a number in [0, 1)"),
    (sequence_of((unit_interval, number_in(0, 1, open_low=True)), ("beta1", "beta2")), (0.9, 0.0), ValueError,
     "invalid n[1]=0.0 in n=(0.9, 0.0): expected a number in (0, 1]"),
    (sequence_of((unit_interval,) * 3, ("b1", "b2", "b3")), (0.9,), ValueError,
     "invalid n=(0.9,): expected a triple (b1, b2, b3), each in [0, 1)"),
    (boolean, 1, TypeError, "invalid n=1: expected True or False"),
])
def test_every_check_refuses_with_one_message_form(check, value, error, message):
    """core/hyper's vocabulary: each kind of check refuses a value as "invalid NAME=VALUE: expected
    ...", and a copy of the check (optimizers pickle theirs) is equal to it and refuses it alike."""
    for each in (check, pickle.loads(pickle.dumps(check))):
        assert each == check
        with pytest.raises(error) as info:
            each("n", value)
        assert str(info.value) == message


def test_integer_checks_take_numpy_integers_as_number_checks_take_numpy_scalars():
    assert positive_int("n", np.int64(3)) == 3 and unit_interval("b", np.float32(0.5)) == 0.5
    assert gradwise.SOAP(_params(), precondition_frequency=np.int64(5)).defaults["precondition_frequency"] == 5


def test_bad_lr_as_numpy_scalar_or_tensor():
    with pytest.raises(ValueError, match=r"lr=(np\.float32\()?-0\.1\)?: expected a finite number >= 0"):
        gradwise.AdamW(_params(), lr=np.float32(-0.1))
    with pytest.raises(ValueError, match=r"lr=tensor\(nan\): expected a finite number >= 0"):
        gradwise.AdamW(_params(), lr=torch.tensor(float("nan")))
    with pytest.raises(ValueError, match=r"lr='0\.1': expected a finite number >= 0"):
        gradwise.AdamW(_params(), lr="0.1")
    with pytest.raises(ValueError, match=r"lr=True: expected a finite number >= 0"):
        gradwise.AdamW(_params(), lr=True)


def test_lr_zero_is_allowed():
    params = _params()
    opt = gradwise.AdamW(params, lr=0.0, weight_decay=0.1, compile=False)
    before = [p.detach().clone() for p in params]
    for p in params:
        p.grad = torch.ones_like(p)
    opt.step()
    assert all(torch.equal(p, b) for p, b in zip(params, before))


@pytest.mark.parametrize("recipe", BETA_PAIRS, ids=lambda r: r.__name__)
@pytest.mark.parametrize(
    "betas,pattern",
    [
        ((1.0, 0.999), r"betas\[0\]=1\.0 in betas=\(1\.0, 0\.999\): expected a number in \[0, 1\)"),
        ((-0.1, 0.999), r"betas\[0\]=-0\.1 .*\[0, 1\)"),
        ((0.9, 1.0), r"betas\[1\]=1\.0 in betas=\(0\.9, 1\.0\): expected a number in \[0, 1\)"),
        ((0.9, 1.5), r"betas\[1\]=1\.5 .*\[0, 1\)"),
        ((0.9, float("nan")), r"betas\[1\]=nan .*\[0, 1\)"),
        ((0.9,), r"betas=\(0\.9,\): expected a pair \(beta1, beta2\), each in \[0, 1\)"),
        ((0.9, 0.99, 0.999), r"betas=\(0\.9, 0\.99, 0\.999\): expected a pair"),
        (0.9, r"betas=0\.9: expected a pair"),
    ],
)
def test_bad_betas(recipe, betas, pattern):
    with pytest.raises(ValueError, match=pattern):
        build(recipe, _params(), betas=betas)


def test_ranger21_checks_betas_as_the_chain_does():
    with pytest.raises(ValueError, match=r"betas=0\.9: expected a pair"):
        build(gradwise.Ranger21, _params(), betas=0.9)
    with pytest.raises(ValueError, match=r"betas\[1\]=1\.0 in betas=\(0\.9, 1\.0\)"):
        build(gradwise.Ranger21, _params(), betas=(0.9, 1.0))


def test_bad_betas_in_a_param_group():
    a, b = _params()
    with pytest.raises(ValueError, match=r"betas\[1\]=1\.0 in betas=\(0\.9, 1\.0\): expected a number in \[0, 1\)"):
        gradwise.AdamW([{"params": [a]}, {"params": [b], "betas": (0.9, 1.0)}])


@pytest.mark.parametrize("recipe", ONE_EPS, ids=lambda r: r.__name__)
@pytest.mark.parametrize("eps,shown", [(0.0, r"0\.0"), (-1e-8, r"-1e-08"), (float("nan"), "nan")])
def test_bad_eps(recipe, eps, shown):
    with pytest.raises(ValueError, match=rf"eps={shown}: expected a finite number > 0"):
        build(recipe, _params(), eps=eps)


@pytest.mark.parametrize("recipe", RECIPES)
def test_negative_weight_decay(recipe):
    with pytest.raises(ValueError, match=r"weight_decay=-0\.1: expected a finite number >= 0"):
        build(recipe, _params(), weight_decay=-0.1)


def test_negative_weight_decay_in_a_param_group():
    a, b = _params()
    with pytest.raises(ValueError, match=r"weight_decay=-1: expected a finite number >= 0"):
        gradwise.SGD([{"params": [a]}, {"params": [b], "weight_decay": -1}], lr=0.1)


def test_negative_weight_decay_in_add_param_group_leaves_groups_alone():
    a, b = _params()
    opt = gradwise.AdamW([a])
    with pytest.raises(ValueError, match=r"weight_decay=-1\.0: expected a finite number >= 0"):
        opt.add_param_group({"params": [b], "weight_decay": -1.0})
    assert len(opt.param_groups) == 1


def test_sgd_bad_momentum_and_dampening():
    with pytest.raises(ValueError, match=r"momentum=-0\.5: expected a finite number >= 0"):
        gradwise.SGD(_params(), lr=0.1, momentum=-0.5)
    with pytest.raises(ValueError, match=r"dampening=1\.5: expected a number in \[0, 1\]"):
        gradwise.SGD(_params(), lr=0.1, momentum=0.9, dampening=1.5)


@pytest.mark.parametrize("momentum", [0.0, 0])
def test_nesterov_without_momentum(momentum):
    with pytest.raises(ValueError, match=rf"nesterov=True with momentum={momentum}, dampening=0.*momentum > 0"):
        gradwise.SGD(_params(), lr=0.1, momentum=momentum, nesterov=True)


def test_nesterov_with_dampening():
    with pytest.raises(ValueError, match=r"nesterov=True with momentum=0\.9, dampening=0\.1:.*dampening = 0"):
        gradwise.SGD(_params(), lr=0.1, momentum=0.9, dampening=0.1, nesterov=True)


@pytest.mark.parametrize("name,value", [("maximize", 1), ("maximize", "yes"), ("nesterov", "no")])
def test_flags_must_be_booleans(name, value):
    with pytest.raises(TypeError, match=rf"{name}={value!r}: expected True or False"):
        gradwise.SGD(_params(), lr=0.1, momentum=0.9, **{name: value})


@pytest.mark.parametrize("value", ["yes", 1, 0, None, "True"])
def test_bad_compile(value):
    with pytest.raises(ValueError, match=rf"compile={re.escape(repr(value))}: expected 'auto', True or False"):
        gradwise.AdamW(_params(), compile=value)


def test_bad_skip_nonfinite():
    with pytest.raises(TypeError, match=r"skip_nonfinite='yes': expected True or False"):
        gradwise.AdamW(_params(), skip_nonfinite="yes")


# ----------------------------------------------------------------------------------------- unknown names
@pytest.mark.parametrize("recipe", RECIPES)
def test_unknown_keyword_to_a_recipe(recipe):
    with pytest.raises(TypeError, match=r"lrr=0\.1.*allowed: .*'lr'.*'weight_decay'"):
        build(recipe, _params(), lrr=0.1)


def test_keyword_of_another_recipe():
    with pytest.raises(TypeError, match=r"momentum=0\.9.*allowed: .*'betas'"):
        gradwise.AdamW(_params(), momentum=0.9)
    with pytest.raises(TypeError, match=r"eps=1e-08.*allowed: .*'betas'"):
        gradwise.Lion(_params(), eps=1e-8)


def test_unknown_hyperparameter_to_a_custom_chain():
    transform = gradwise.chain(gradwise.scale_by_adam(), gradwise.scale_by_learning_rate())
    with pytest.raises(TypeError, match=r"unknown hyperparameter\(s\) \['momentum'\].*allowed: .*'betas'.*'lr'"):
        gradwise.Optimizer(_params(), transform, momentum=0.9)
    with pytest.raises(TypeError, match=r"transform='adam': expected a gradwise Transform"):
        gradwise.Optimizer(_params(), "adam")


def test_a_param_group_key_one_edit_from_a_hyperparameter_warns_and_is_kept():
    a, b = _params()
    with pytest.warns(UserWarning,
                      match=r"param_groups\[1\] has key 'lrr', which AdamW does not read; did you mean 'lr'\?"):
        opt = gradwise.AdamW([{"params": [a]}, {"params": [b], "lrr": 0.1}])
    assert opt.param_groups[1]["lrr"] == 0.1 and opt.param_groups[1]["lr"] == opt.defaults["lr"]
    with pytest.warns(UserWarning, match=r"key 'weight_decy'.*did you mean 'weight_decay'\?"):
        opt.add_param_group({"params": [torch.zeros(2, requires_grad=True)], "weight_decy": 0.5})
    assert len(opt.param_groups) == 3


# ----------------------------------------------------------------------------------------- bad parameters
def test_parameter_listed_twice_in_one_group():
    a, b = _params()
    with pytest.raises(ValueError, match=r"param_groups\[0\]\['params'\]\[2\] is the same tensor as "
                                         r"param_groups\[0\]\['params'\]\[0\]; list each parameter once"):
        gradwise.AdamW([a, b, a])


def test_named_parameter_listed_twice_names_it():
    model = nn.Linear(2, 2)
    named = list(model.named_parameters())
    with pytest.raises(ValueError, match=r"\('weight'\) is the same tensor as .*\('weight'\)"):
        gradwise.AdamW(named + named[:1])


def test_parameter_in_two_groups():
    a, b, c = _params(3)
    with pytest.raises(ValueError, match=r"param_groups\[1\]\['params'\]\[1\] is already in param_groups\[0\]; "
                                         r"a parameter belongs to one group"):
        gradwise.AdamW([{"params": [a, b]}, {"params": [c, a], "lr": 0.1}])
    opt = gradwise.AdamW([{"params": [a, b]}])
    with pytest.raises(ValueError, match=r"param_groups\[1\]\['params'\]\[0\] is already in param_groups\[0\]"):
        opt.add_param_group({"params": [b]})
    assert len(opt.param_groups) == 1 and opt.param_groups[0]["params"] == [a, b]


def test_named_parameter_in_two_groups_names_it():
    model = nn.Linear(2, 2)
    named = list(model.named_parameters())
    with pytest.raises(ValueError, match=r"\('bias'\) is already in param_groups\[0\]"):
        gradwise.AdamW([{"params": named}, {"params": named[1:]}])


def test_non_leaf_tensor():
    a = torch.randn(3, requires_grad=True)
    with pytest.raises(ValueError, match=r"param_groups\[0\]\['params'\]\[0\] is not a leaf tensor.*leaf tensors"):
        gradwise.AdamW([a * 2])


def test_not_a_tensor():
    with pytest.raises(TypeError, match=r"param_groups\[0\]\['params'\]\[1\] is a float; expected a torch\.Tensor"):
        gradwise.AdamW([torch.randn(3, requires_grad=True), 1.0])


def test_params_as_a_set():
    with pytest.raises(TypeError, match=r"is a set.*pass a list"):
        gradwise.AdamW([{"params": set(_params())}])


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.uint8, torch.bool])
def test_integer_dtype_parameters(dtype):
    bad = torch.zeros(3, dtype=dtype)
    with pytest.raises(TypeError, match=rf"param_groups\[0\]\['params'\]\[1\] has dtype {dtype}; "
                                        r"gradwise optimizes floating-point or complex tensors"):
        gradwise.AdamW([torch.randn(3, requires_grad=True), bad])


# ----------------------------------------------------------------------------------------- bad steps
def _sparse_model():
    torch.manual_seed(0)
    return nn.ModuleDict({"dense": nn.Linear(4, 3), "emb": nn.Embedding(10, 4, sparse=True)})


@pytest.mark.parametrize("recipe", RECIPES)
def test_sparse_gradient_fails_the_step_and_changes_nothing(recipe):
    model = _sparse_model()
    params = list(model.parameters())  # dense.weight, dense.bias, emb.weight
    opt = build(recipe, model.named_parameters(), lr=0.1, compile=False)
    # a first, dense step so that state exists
    for p in params:
        p.grad = torch.ones_like(p)
    opt.step()
    opt.zero_grad()
    idx = torch.tensor([1, 2, 7])
    model["dense"](model["emb"](idx)).sum().backward()
    assert params[2].grad.is_sparse and not params[0].grad.is_sparse
    snap = _snapshot(opt, params)
    with pytest.raises(TypeError, match=r"parameter 'emb\.weight' has a sparse gradient; .*need dense gradients"):
        opt.step()
    _assert_unchanged(opt, params, snap)


def test_sparse_gradient_on_the_first_step_creates_no_state():
    model = _sparse_model()
    params = list(model.parameters())
    opt = gradwise.AdamW([{"params": params[:2]}, {"params": params[2:]}], compile=False)
    model["dense"](model["emb"](torch.tensor([0, 3]))).sum().backward()
    snap = _snapshot(opt, params)
    with pytest.raises(TypeError, match=r"param_groups\[1\]\['params'\]\[0\] has a sparse gradient"):
        opt.step()
    _assert_unchanged(opt, params, snap)
    assert len(opt.state) == 0


@pytest.mark.parametrize(
    "key,value,pattern",
    [
        ("lr", float("nan"), r"lr=nan: expected a finite number >= 0"),
        ("lr", float("inf"), r"lr=inf: expected a finite number >= 0"),
        ("lr", -1e-3, r"lr=-0\.001: expected a finite number >= 0"),
        ("betas", (0.9, 1.0), r"betas\[1\]=1\.0 in betas=\(0\.9, 1\.0\)"),
        ("weight_decay", float("nan"), r"weight_decay=nan: expected a finite number >= 0"),
        ("eps", 0.0, r"eps=0\.0: expected a finite number > 0"),
    ],
)
def test_bad_value_set_between_steps_fails_the_step_and_changes_nothing(key, value, pattern):
    a, b = _params()
    opt = gradwise.AdamW([{"params": [a]}, {"params": [b]}], lr=0.1, weight_decay=0.1, compile=False)
    for p in (a, b):
        p.grad = torch.ones_like(p)
    opt.step()
    snap = _snapshot(opt, [a, b])
    opt.param_groups[1][key] = value  # the second group: the first must not move either
    with pytest.raises(ValueError, match=pattern):
        opt.step()
    _assert_unchanged(opt, [a, b], snap)
    # fixing the value lets training continue
    opt.param_groups[1][key] = opt.defaults[key]
    opt.step()
    assert not torch.equal(a, snap[0][0]) and int(opt.state[b]["step"]) == 2


def test_scheduler_producing_nan_lr_fails_the_step_and_changes_nothing():
    params = _params()
    opt = gradwise.SGD(params, lr=0.1, momentum=0.9, compile=False)
    scheduler = lr_scheduler.LambdaLR(opt, lambda step: float("nan") if step >= 2 else 1.0)
    for _ in range(2):
        for p in params:
            p.grad = torch.ones_like(p)
        opt.step()
        scheduler.step()
    assert opt.param_groups[0]["lr"] != opt.param_groups[0]["lr"]  # NaN
    snap = _snapshot(opt, params)
    with pytest.raises(ValueError, match=r"lr=nan: expected a finite number >= 0"):
        opt.step()
    _assert_unchanged(opt, params, snap)


@pytest.mark.slow
def test_nan_lr_between_compiled_steps_changes_nothing():
    params = [torch.randn(8, 4).requires_grad_(), torch.randn(16).requires_grad_()]
    opt = gradwise.AdamW(params, lr=0.1, compile=True)
    for p in params:
        p.grad = torch.randn_like(p)
    opt.step()
    assert opt.compile_stats["compiles"] == 1
    snap = _snapshot(opt, params)
    opt.param_groups[0]["lr"] = float("nan")
    with pytest.raises(ValueError, match=r"lr=nan: expected a finite number >= 0"):
        opt.step()
    _assert_unchanged(opt, params, snap)
