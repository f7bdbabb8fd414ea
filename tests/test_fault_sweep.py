"""The bad-input and fault sweep: every recipe of the registry, every fault a checkpoint or a step
can bring. Each refusal must name what it refuses (the parameter by name, the key, the value found,
what is allowed), and leave parameters, state, param groups and counters byte for byte as they were;
after a refused load the next step is finite.

A fault maker takes an optimizer (two steps in, on named parameters ``w`` (4, 3) and ``b`` (3,))
and returns ``(action, exception type, substrings of the message)``, or None where it does not apply
(no buffer to corrupt, no second moment to make negative).
"""
from __future__ import annotations

import copy
import math

import pytest
import torch

from gradwise.core.torch_checkpoint import format_for
from tests.registry import CASES, build


def _optimizer(case):
    generator = torch.Generator().manual_seed(0)
    w = torch.nn.Parameter(torch.randn(4, 3, generator=generator))
    b = torch.nn.Parameter(torch.randn(3, generator=generator))
    optimizer = build(case.recipe, [("w", w), ("b", b)], compile=False, **case.kwargs)
    for _ in range(2):
        _grads(optimizer, generator)
        optimizer.step()
    return optimizer, w, b


def _grads(optimizer, generator=None):
    for group in optimizer.param_groups:
        for p in group["params"]:
            p.grad = torch.randn(p.shape, generator=generator)


def _buffers(optimizer, p, nonnegative=False):
    """``p``'s plain state keys holding at least one element (the chain's ``nonnegative`` ones)."""
    group = next(g for g in optimizer.param_groups if any(q is p for q in g["params"]))
    allowed = optimizer.transform.for_group(group).nonnegative if nonnegative else None
    return [k for k, v in optimizer.state[p].items() if k != "step" and v.numel() > 0
            and v.is_floating_point() and (allowed is None or k in allowed)]


# ---------------------------------------------------------------------------- checkpoint faults
def _loading(edit, error, *words):
    """A fault that edits a copy of the optimizer's own state dict (state id 1 is ``b``) and loads it."""
    def make(optimizer, w, b):
        saved = copy.deepcopy(optimizer.state_dict())
        found = edit(optimizer, b, saved)
        if found is None:
            return None
        return (lambda: optimizer.load_state_dict(saved)), error, [w.format(found=found) for w in words]
    return make


def _wrong_shape(optimizer, b, saved):
    keys = _buffers(optimizer, b)
    if keys:
        saved["state"][1][keys[0]] = torch.zeros(5, 2)
        return keys[0]


def _python_float(optimizer, b, saved):
    keys = _buffers(optimizer, b)
    if keys:
        saved["state"][1][keys[0]] = 0.5
        return keys[0]


def _integer_tensor(optimizer, b, saved):
    keys = _buffers(optimizer, b)
    if keys:
        saved["state"][1][keys[0]] = torch.ones(saved["state"][1][keys[0]].shape, dtype=torch.int64)
        return keys[0]


def _negative_moment(optimizer, b, saved):
    keys = _buffers(optimizer, b, nonnegative=True)
    if keys:
        saved["state"][1][keys[0]] = -1 - saved["state"][1][keys[0]]
        return keys[0]


def _nan_buffer(optimizer, b, saved):
    keys = _buffers(optimizer, b)
    if keys:
        saved["state"][1][keys[0]].view(-1)[0] = math.nan
        return keys[0]


def _missing_buffer(optimizer, b, saved):
    keys = _buffers(optimizer, b)
    if keys:
        del saved["state"][1][keys[0]]
        return keys[0]


def _missing_step(optimizer, b, saved):
    del saved["state"][1]["step"]
    return "step"


def _unknown_buffer(optimizer, b, saved):
    saved["state"][1]["bogus.buffer"] = torch.zeros(3)
    return "bogus.buffer"


def _setting_step(value):
    def edit(optimizer, b, saved):
        saved["state"][1]["step"] = value
        return repr(value)
    return edit


def _not_a_dict(optimizer, b, saved):
    saved["state"][1] = [0.0, 1.0]
    return "list"


def _stray_state(optimizer, b, saved):
    saved["state"][99] = {}
    return "99"


def _extra_group(optimizer, b, saved):
    saved["param_groups"].append({**saved["param_groups"][-1], "params": []})
    return str(len(saved["param_groups"]))


def _longer_group(optimizer, b, saved):
    saved["param_groups"][-1]["params"].append(99)
    return str(len(saved["param_groups"][-1]["params"]))


def _group_value(key, value):
    def edit(optimizer, b, saved):
        if key in saved["param_groups"][-1]:
            saved["param_groups"][-1][key] = value
            return repr(value)
    return edit


def _params_not_a_list(optimizer, b, saved):
    saved["param_groups"][-1]["params"] = 5
    return "params=5"


def _counter(key, value):
    def edit(optimizer, b, saved):
        for group in saved["param_groups"]:
            group["gradwise"][key] = value
        return repr(value)
    return edit


def _torch_sgd_checkpoint(optimizer, b, saved):
    if type(optimizer).__name__ == "SGD":
        return None  # a torch SGD checkpoint is SGD's own
    groups = [{"params": g["params"], "lr": 0.1, "momentum": 0.9, "dampening": 0, "weight_decay": 0,
               "nesterov": False, "maximize": False, "foreach": None, "differentiable": False, "fused": None}
              for g in saved["param_groups"]]
    saved.clear()
    saved.update(state={1: {"momentum_buffer": torch.zeros(3)}}, param_groups=groups)
    return "torch.optim"


def _torch_checkpoint(edit, error, *words):
    """A fault in this optimizer's own checkpoint exported as torch.optim's (``state_dict(format="torch")``)."""
    def make(optimizer, w, b):
        saved = copy.deepcopy(optimizer.state_dict(format="torch"))
        found = edit(saved)
        if found is None:
            return None
        return (lambda: optimizer.load_state_dict(saved)), error, [w.format(found=found) for w in words]
    return make


def _torch_wrong_shape(saved):
    key = next(k for k in saved["state"][1] if k != "step")
    saved["state"][1][key] = torch.zeros(5, 2)
    return key


def _torch_missing(saved):
    key = next(k for k in saved["state"][1] if k != "step")
    del saved["state"][1][key]
    return key


def _torch_unknown(saved):
    saved["state"][1]["bogus"] = torch.zeros(3)
    return "bogus"


def _torch_amsgrad(saved):
    if "amsgrad" in saved["param_groups"][-1]:  # AMSGrad without its running max of v
        saved["param_groups"][-1]["amsgrad"] = True
        return "max_exp_avg_sq"


LOAD_FAULTS = {
    "buffer of the wrong shape": _loading(_wrong_shape, ValueError, "parameter 'b'", "{found}", "(5, 2)",
                                          "expected shape"),
    "buffer a python float": _loading(_python_float, TypeError, "parameter 'b'", "{found}", "0.5 (a float)",
                                      "expected a tensor"),
    "buffer of integers": _loading(_integer_tensor, ValueError, "parameter 'b'", "{found}", "torch.int64",
                                   "torch.float32"),
    "negative second moment": _loading(_negative_moment, ValueError, "parameter 'b'", "{found}", "negative",
                                       ">= 0"),
    "buffer holding NaN": _loading(_nan_buffer, ValueError, "parameter 'b'", "{found}", "NaN", "finite"),
    "missing buffer": _loading(_missing_buffer, ValueError, "parameter 'b'", "missing ['{found}']"),
    "missing step": _loading(_missing_step, ValueError, "parameter 'b'", "missing ['step']"),
    "unknown buffer": _loading(_unknown_buffer, ValueError, "parameter 'b'", "unknown ['bogus.buffer']"),
    "negative step": _loading(_setting_step(torch.tensor(-1.0)), ValueError, "parameter 'b'", "tensor(-1.)",
                              "whole number >= 0"),
    "fractional step": _loading(_setting_step(2.5), ValueError, "parameter 'b'", "'step'=2.5", "whole number"),
    "step a string": _loading(_setting_step("2"), ValueError, "parameter 'b'", "'step'='2'", "whole number"),
    "infinite step": _loading(_setting_step(math.inf), ValueError, "parameter 'b'", "'step'=inf", "whole number"),
    "state not a dict": _loading(_not_a_dict, TypeError, "parameter 'b'", "is a list", "expected a dict"),
    "state for no parameter": _loading(_stray_state, ValueError, "entries for 99", "no param group"),
    "one group too many": _loading(_extra_group, ValueError, "{found} param group(s)", "this optimizer has"),
    "group one parameter longer": _loading(_longer_group, ValueError, "lists {found} parameter(s)"),
    "negative lr": _loading(_group_value("lr", -1.0), ValueError, "'lr'", "-1.0", "expected"),
    "NaN weight decay": _loading(_group_value("weight_decay", math.nan), ValueError, "'weight_decay'", "nan",
                                 "expected"),
    "betas out of range": _loading(_group_value("betas", (0.9, 1.5)), ValueError, "betas", "1.5", "expected"),
    "group params not a list": _loading(_params_not_a_list, TypeError, "{found}", "expected a dict whose 'params'"),
    "bad mode": _loading(_counter("mode", "test"), ValueError, "'mode'", "'test'", "['train', 'eval']"),
    "negative skipped_steps": _loading(_counter("skipped_steps", -3), ValueError, "skipped_steps", "-3", ">= 0"),
    "torch SGD checkpoint": _loading(_torch_sgd_checkpoint, ValueError, "{found}"),
    "torch checkpoint, wrong-shaped buffer": _torch_checkpoint(_torch_wrong_shape, ValueError, "parameter 'b'",
                                                               "{found}'", "(5, 2)", "expected shape"),
    "torch checkpoint, missing buffer": _torch_checkpoint(_torch_missing, ValueError, "torch.optim state of",
                                                          "parameter 'b'", "'{found}'", "keeps"),
    "torch checkpoint, unknown buffer": _torch_checkpoint(_torch_unknown, ValueError, "torch.optim state of",
                                                          "parameter 'b'", "'bogus'", "keeps"),
    "torch checkpoint, amsgrad": _torch_checkpoint(_torch_amsgrad, ValueError, "torch.optim state of", "keeps",
                                                   "'{found}'"),
}


# ---------------------------------------------------------------------------- step faults
def _stepping(edit, error, *words):
    """A fault that puts something wrong into the live optimizer, then steps (every parameter has a
    fresh gradient, so a step that is not refused up front writes the first group first)."""
    def make(optimizer, w, b):
        _grads(optimizer)
        found = edit(optimizer, b)
        if found is None:
            return None
        return optimizer.step, error, [w.format(found=found) for w in words]
    return make


def _gradient_shape(optimizer, b):
    b.grad.data = torch.zeros(4)
    return ""


def _gradient_dtype(optimizer, b):
    b.grad.data = b.grad.double()
    return ""


def _sparse_gradient(optimizer, b):
    b.grad = b.grad.to_sparse()
    return ""


def _state_shape(optimizer, b):
    keys = _buffers(optimizer, b)
    if keys:
        optimizer.state[b][keys[0]] = torch.zeros(5, 2)
        return keys[0]


def _step_a_float(optimizer, b):
    optimizer.state[b]["step"] = 2.0
    return ""


def _last_group_lr(value):
    def edit(optimizer, b):
        optimizer.param_groups[-1]["lr"] = value
        return ""
    return edit


STEP_FAULTS = {
    "gradient of the wrong shape": _stepping(_gradient_shape, ValueError, "parameter 'b'", "shape (4,)",
                                             "expected", "shape (3,)"),
    "gradient of another dtype": _stepping(_gradient_dtype, ValueError, "parameter 'b'", "torch.float64",
                                           "expected", "torch.float32"),
    "sparse gradient": _stepping(_sparse_gradient, TypeError, "parameter 'b'", "sparse gradient"),
    "state of the wrong shape": _stepping(_state_shape, ValueError, "parameter 'b'", "{found}", "(5, 2)",
                                          "expected shape"),
    "step counter a float": _stepping(_step_a_float, TypeError, "parameter 'b'", "'step'=2.0", "0-d tensor"),
    "NaN lr in the last group": _stepping(_last_group_lr(math.nan), ValueError, "lr=nan", "expected"),
    "negative lr in the last group": _stepping(_last_group_lr(-0.1), ValueError, "lr=-0.1", "expected"),
}


# ---------------------------------------------------------------------------- the sweep
def _snapshot(optimizer):
    params = [p.detach().clone() for g in optimizer.param_groups for p in g["params"]]
    state = {id(p): {k: v.clone() if isinstance(v, torch.Tensor) else copy.deepcopy(v) for k, v in st.items()}
             for p, st in optimizer.state.items()}
    groups = [{k: copy.deepcopy(v) for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
    return params, state, groups, optimizer.skipped_steps, optimizer.mode


def _same(a, b):
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and a.layout == b.layout \
            and torch.equal(a.to_dense() if a.is_sparse else a, b.to_dense() if b.is_sparse else b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b or (a != a and b != b)  # NaN equals NaN here: an untouched NaN hyperparameter


FAULTS = {**LOAD_FAULTS, **STEP_FAULTS}


def _features(case):
    """What a case has for faults to corrupt: buffers of ``b``, second moments of ``b``, group keys, and
    the torch.optim format of ``b``'s group, if any."""
    optimizer, _, b = _optimizer(case)
    group = optimizer.param_groups[-1]  # b's
    declared = getattr(optimizer, "torch_format", None)
    fmt = format_for(optimizer, group) if declared is not None else None
    return {"buffer": bool(_buffers(optimizer, b)), "nonnegative": bool(_buffers(optimizer, b, nonnegative=True)),
            "betas": "betas" in group, "weight_decay": "weight_decay" in group,
            "not SGD": case.recipe.__name__ != "SGD",
            "torch": fmt is not None and bool(_buffers(optimizer, b)),
            # torch.optim.SGD keeps no step: a parameter without a momentum buffer is one it never stepped
            "torch counts steps": fmt is not None and fmt.counts_steps,
            "torch amsgrad": fmt is not None and "amsgrad" in fmt.group}


#: the faults that need something of the case to corrupt; the others apply to every case
NEEDS = {"buffer of the wrong shape": "buffer", "buffer a python float": "buffer", "buffer of integers": "buffer",
         "negative second moment": "nonnegative", "buffer holding NaN": "buffer", "missing buffer": "buffer",
         "betas out of range": "betas", "missing step": "buffer", "NaN weight decay": "weight_decay",
         "torch SGD checkpoint": "not SGD",
         "state of the wrong shape": "buffer", "torch checkpoint, wrong-shaped buffer": "torch",
         "torch checkpoint, missing buffer": "torch counts steps", "torch checkpoint, unknown buffer": "torch",
         "torch checkpoint, amsgrad": "torch amsgrad"}
SWEEP = [pytest.param(case, name, id=f"{case.name}-{name.replace(' ', '_')}")
         for case, features in ((c, _features(c)) for c in CASES)
         for name in FAULTS if name not in NEEDS or features[NEEDS[name]]]


@pytest.mark.parametrize("case, fault", SWEEP)
def test_a_refused_operation_names_the_fault_and_changes_nothing(case, fault):
    optimizer, w, b = _optimizer(case)
    made = FAULTS[fault](optimizer, w, b)
    assert made is not None, "the fault applies to this case (NEEDS)"
    action, error, words = made
    before = _snapshot(optimizer)
    with pytest.raises(error) as raised:
        action()
    message = str(raised.value)
    missing = [word for word in words if word not in message]
    assert not missing, f"{missing} not in {message!r}"
    after = _snapshot(optimizer)
    assert _same(after, before), "a refused operation changed parameters, state, param groups or counters"
    if fault in LOAD_FAULTS:  # the optimizer still steps from where it was, to finite values
        _grads(optimizer)
        optimizer.step()
        values = [p for g in optimizer.param_groups for p in g["params"]]
        values += [v for st in optimizer.state.values() for v in st.values() if v.is_floating_point()]
        assert all(bool(torch.isfinite(v).all()) for v in values)
