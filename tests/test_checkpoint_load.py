"""What load_state_dict accepts and what a failed step leaves (tests/test_fault_sweep.py has the
refusals): torch's plain-number ``step``, a round trip that adds nothing to the groups, the mode and
counters of older checkpoints (at their top level) and of groups that disagree on them, encoded state
checked part by part, and a step refused before its first write, whichever group fails."""
from __future__ import annotations

import copy

import pytest
import torch

import gradwise
from gradwise.core.transform import Transform, chain
from gradwise.state import StatePolicy
from gradwise.transforms import scale_by_learning_rate, scale_by_nadam
from tests.registry import CASES, build


def _stepped(case, steps=2):
    generator = torch.Generator().manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(4, 3, generator=generator)),
              torch.nn.Parameter(torch.randn(3, generator=generator))]
    optimizer = build(case.recipe, params, compile=False, **case.kwargs)
    for _ in range(steps):
        for p in params:
            p.grad = torch.randn(p.shape, generator=generator)
        optimizer.step()
    return optimizer, params


def _resumed(case, saved):
    optimizer, params = _stepped(case, steps=0)
    optimizer.load_state_dict(saved)
    generator = torch.Generator().manual_seed(5)
    for p in params:
        p.grad = torch.randn(p.shape, generator=generator)
    optimizer.step()
    return optimizer, params


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_a_checkpoint_whose_step_is_a_plain_number_resumes_as_with_a_tensor(case):
    """torch.optim's test_load_nontensor_step: ``state["step"]`` may be a Python number."""
    optimizer, _ = _stepped(case)
    saved = copy.deepcopy(optimizer.state_dict())
    plain = copy.deepcopy(saved)
    for state in plain["state"].values():
        state["step"] = state["step"].item()
    _, expected = _resumed(case, saved)
    _, got = _resumed(case, plain)
    assert all(torch.equal(p, q) for p, q in zip(got, expected))


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_a_loaded_state_dict_saves_back_equal(case):
    optimizer, _ = _stepped(case)
    saved = copy.deepcopy(optimizer.state_dict())
    loaded, _ = _stepped(case, steps=0)
    loaded.load_state_dict(saved)
    again = loaded.state_dict()
    assert again["param_groups"] == saved["param_groups"]  # no torch "differentiable" key added
    assert again["state"].keys() == saved["state"].keys()
    for i, state in saved["state"].items():
        assert again["state"][i].keys() == state.keys()
        assert all(torch.equal(again["state"][i][k], v) and again["state"][i][k].dtype == v.dtype
                   for k, v in state.items())


@pytest.mark.parametrize("part, value, words", [
    ("codes", lambda t: t[:-1], ["'adam.exp_avg'", "int8", "'codes'", "expected shape"]),
    ("absmax", lambda t: t.double(), ["'adam.exp_avg'", "'absmax'", "torch.float64", "expected"]),
])
def test_an_encoded_buffer_is_checked_part_by_part(part, value, words):
    params = [torch.nn.Parameter(torch.randn(64, 40))]
    optimizer = gradwise.AdamW(params, lr=0.01, state=StatePolicy("int8", min_numel=0), compile=False)
    params[0].grad = torch.randn(64, 40)
    optimizer.step()
    saved = copy.deepcopy(optimizer.state_dict())
    key = next(k for k in saved["state"][0] if k.startswith("adam.exp_avg@") and k.endswith("." + part))
    saved["state"][0][key] = value(saved["state"][0][key])
    before = {k: v.clone() for k, v in optimizer.state[params[0]].items()}
    with pytest.raises(ValueError) as error:
        optimizer.load_state_dict(saved)
    assert all(word in str(error.value) for word in words), str(error.value)
    assert optimizer.state[params[0]].keys() == before.keys()
    assert all(torch.equal(optimizer.state[params[0]][k], v) for k, v in before.items())


def test_a_refused_muon_step_applies_no_group():
    """A group the user routes to Newton-Schulz with a vector in it is refused before the AdamW
    group before it moves."""
    vector, matrix, stray = (torch.nn.Parameter(torch.randn(*s)) for s in [(3,), (4, 3), (5,)])
    optimizer = gradwise.Muon([{"params": [vector], "route": "other"}, {"params": [matrix, stray], "route": "matrix"}],
                              compile=False)
    for p in (vector, matrix, stray):
        p.grad = torch.randn_like(p)
    before = [p.detach().clone() for p in (vector, matrix, stray)]
    with pytest.raises(ValueError, match=r"orthogonalizes 2-D matrices only"):
        optimizer.step()
    assert all(torch.equal(p, q) for p, q in zip((vector, matrix, stray), before))
    assert not optimizer.state


class _fails(Transform):  # noqa: N801
    """Raises in ``update`` when told to, before the chain writes anything shaped like a parameter."""

    name = "fails"
    armed = False

    def update(self, updates, state, ctx):
        if self.armed:
            raise RuntimeError("failure inside the chain")
        return updates


def test_an_exception_inside_the_chain_rolls_back_step_counters_and_running_scalars():
    """``advance`` (NAdam's mu product) and the step counter run before ``update``: an exception in
    ``update`` puts both back, so that a retried step is the step that failed."""
    failing = _fails()
    params = [torch.nn.Parameter(torch.randn(4, 3)), torch.nn.Parameter(torch.randn(3))]
    optimizer = gradwise.Optimizer(params, chain(failing, scale_by_nadam(), scale_by_learning_rate()), lr=0.01,
                                   compile=False)
    for _ in range(2):
        for p in params:
            p.grad = torch.randn_like(p)
        optimizer.step()
    before = {id(p): {k: v.clone() for k, v in optimizer.state[p].items()} for p in params}
    failing.armed = True
    with pytest.raises(RuntimeError, match="failure inside the chain"):
        optimizer.step()
    for p in params:
        assert all(torch.equal(optimizer.state[p][k], v) for k, v in before[id(p)].items())


def test_keys_of_the_users_own_in_a_group_save_and_load_as_they_were():
    """torch keeps param-group keys it does not read (timm's lr_scale, a layer id): so does a load."""
    w, b = torch.nn.Parameter(torch.randn(3, 2)), torch.nn.Parameter(torch.randn(3))
    optimizer = gradwise.AdamW([{"params": [w], "layer_id": 0, "lr_scale": 0.5}, {"params": [b], "layer_id": 1}],
                               lr=0.1, compile=False)
    w.grad, b.grad = torch.randn(3, 2), torch.randn(3)
    optimizer.step()
    saved = copy.deepcopy(optimizer.state_dict())
    saved["param_groups"][1]["layer_id"] = 7
    optimizer.load_state_dict(saved)
    assert [g["layer_id"] for g in optimizer.param_groups] == [0, 7]
    assert optimizer.param_groups[0]["lr_scale"] == 0.5


def _two_groups_stepped():
    w, b = torch.nn.Parameter(torch.randn(3, 2)), torch.nn.Parameter(torch.randn(3))
    optimizer = gradwise.AdamW([{"params": [w]}, {"params": [b], "weight_decay": 0.0}], lr=0.1, compile=False)
    w.grad, b.grad = torch.randn(3, 2), torch.randn(3)
    optimizer.step()
    return optimizer


def test_a_checkpoint_that_keeps_mode_and_counters_at_its_top_level_still_loads():
    """Before they were kept in every param group (where torch.distributed.checkpoint keeps them), a
    checkpoint kept them under a top-level "gradwise" key; the groups never hold them once loaded."""
    saved = copy.deepcopy(_two_groups_stepped().state_dict())
    older = {**saved, "param_groups": [{k: v for k, v in g.items() if k != "gradwise"} for g in saved["param_groups"]],
             "gradwise": {"skipped_steps": 3, "mode": "eval"}}
    optimizer = _two_groups_stepped()
    optimizer.load_state_dict(older)
    assert (optimizer.mode, optimizer.skipped_steps) == ("eval", 3)
    assert not any("gradwise" in g for g in optimizer.param_groups)
    assert [g["gradwise"] for g in optimizer.state_dict()["param_groups"]] == [{"skipped_steps": 3, "mode": "eval"}] * 2


def test_param_groups_that_keep_different_counters_are_refused_and_change_nothing():
    optimizer = _two_groups_stepped()
    saved = copy.deepcopy(optimizer.state_dict())
    saved["param_groups"][1]["gradwise"]["skipped_steps"] = 5
    before = copy.deepcopy(optimizer.state_dict())
    with pytest.raises(ValueError, match=r"\['param_groups'\]\[1\]\['gradwise'\]=.*'skipped_steps': 5.* differs from"
                                         r" state_dict\['param_groups'\]\[0\]\['gradwise'\]"):
        optimizer.load_state_dict(saved)
    after = optimizer.state_dict()
    assert (optimizer.mode, optimizer.skipped_steps) == ("train", 0) and after["param_groups"] == before["param_groups"]
    assert all(torch.equal(after["state"][i][k], v) for i, state in before["state"].items() for k, v in state.items())
