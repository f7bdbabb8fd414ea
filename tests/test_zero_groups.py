"""What ``ZeroRedundancyOptimizer`` needs of an optimizer's param groups, checked in one process (the
2-rank runs are tests/test_zero_ddp.py):

* ZeRO copies every keyword it is given into the groups it hands each rank's optimizer, which it builds
  with the same keywords. Every recipe's constructor keywords that are not hyperparameters (read here
  off its signature and the groups it builds, not listed) are accepted in a group at the value the
  optimizer was built with, kept out of its groups and its ``state_dict``, dropped from a checkpoint's
  groups on load, and refused at any other value, in ``add_param_group`` and before a step.
* ZeRO asserts that each rank's optimizer keeps as many groups as it was given: ``split_groups`` gives
  the groups already split (Muon's routes, AdamMini's blocks), and an optimizer built from any subset
  of their parameters keeps exactly those groups.
"""
from __future__ import annotations

import copy
import inspect
import pickle
import re

import pytest
import torch

import gradwise
from tests.registry import ENTRIES, ENTRY


def _params():
    generator = torch.Generator().manual_seed(0)
    return [torch.nn.Parameter(torch.randn(4, 3, generator=generator)),
            torch.nn.Parameter(torch.randn(3, generator=generator))]


def _kwargs(entry) -> dict:
    return {**entry.required, **entry.configs[0].kwargs, "compile": False}


def _options(entry) -> dict:
    """The recipe's constructor keywords that no group it builds holds (so not hyperparameters), with
    the values it is built with here."""
    kwargs = _kwargs(entry)
    optimizer = entry.recipe(_params(), **kwargs)
    named = [p for p in inspect.signature(entry.recipe.__init__).parameters.values()
             if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)][2:]
    in_groups = set().union(*optimizer.param_groups)
    return {p.name: kwargs.get(p.name, p.default) for p in named if p.name not in in_groups}


def _step(optimizer, params, steps=2):
    for i in range(steps):
        generator = torch.Generator().manual_seed(i)
        for p in params:
            p.grad = torch.randn(p.shape, generator=generator)
        optimizer.step()


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: e.name)
def test_engine_options_repeated_in_a_group_are_accepted_and_kept_out(entry):
    options = _options(entry)
    assert {"compile", "skip_nonfinite"} <= set(options)
    plain_params, repeated_params = _params(), _params()
    plain = entry.recipe(plain_params, **_kwargs(entry))
    repeated = entry.recipe([{"params": repeated_params, **options}], **_kwargs(entry))  # as ZeRO builds it
    assert repeated.engine_options == options
    assert not set(options) & set().union(*repeated.param_groups), "an engine option became a group entry"
    _step(plain, plain_params)
    _step(repeated, repeated_params)
    assert all(torch.equal(p, q) for p, q in zip(plain_params, repeated_params))
    assert repr(repeated.state_dict()["param_groups"]) == repr(plain.state_dict()["param_groups"])
    copied = copy.deepcopy(repeated)
    assert copied.engine_options.keys() == options.keys()


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: e.name)
def test_an_engine_option_at_another_value_in_a_group_is_refused_by_name(entry):
    for key, built in _options(entry).items():
        other = not built if isinstance(built, bool) else object()
        message = (re.escape(f"param_groups[0] has {key}={other!r}, but {entry.name} was built with {key}={built!r}")
                   + ".*" + re.escape(f"allowed in a group: {key}={built!r} or no {key!r} key"))
        with pytest.raises(ValueError, match=message):
            entry.recipe([{"params": _params(), key: other}], **_kwargs(entry))


def test_an_engine_option_changed_in_a_group_refuses_the_step_and_changes_nothing():
    params = _params()
    optimizer = gradwise.AdamW(params, lr=0.1, compile=False)
    _step(optimizer, params, 1)
    before = [p.detach().clone() for p in params]
    optimizer.param_groups[0]["compile"] = True  # a wrapper syncing its own groups in, as ZeRO does
    with pytest.raises(ValueError, match=r"param_groups\[0\] has compile=True, but AdamW was built with compile=False"):
        _step(optimizer, params, 1)
    assert all(torch.equal(p, b) for p, b in zip(params, before))
    assert float(optimizer.state[params[0]]["step"]) == 1
    optimizer.param_groups[0]["compile"] = False  # the value it was built with: accepted
    _step(optimizer, params, 1)


def test_a_state_policy_repeated_in_a_group_is_the_same_after_a_checkpoint():
    """ZeRO's wrapper groups hold the policy it was given; loaded from a checkpoint, they hold a copy."""
    policy = gradwise.state.StatePolicy("int8", min_numel=0)
    params = _params()
    optimizer = gradwise.AdamW([{"params": params, "state": pickle.loads(pickle.dumps(policy))}], state=policy,
                               compile=False)
    optimizer.param_groups[0]["state"] = pickle.loads(pickle.dumps(policy))
    _step(optimizer, params, 1)
    optimizer.param_groups[0]["state"] = gradwise.state.StatePolicy("bf16", min_numel=0)
    with pytest.raises(ValueError, match=r"param_groups\[0\] has state=.*, but AdamW was built with state="):
        _step(optimizer, params, 1)


def test_a_checkpoint_whose_groups_hold_engine_options_loads_and_keeps_the_optimizers_own():
    """A ZeRO checkpoint saves its wrapper's groups, with whatever keywords that ZeRO was given."""
    saved_params, params = _params(), _params()
    saved = gradwise.Muon(saved_params, lr=0.02, compile=False)
    _step(saved, saved_params)
    state_dict = saved.state_dict()
    for group in state_dict["param_groups"]:
        group.update(compile=True, adamw_lr=0.5, state=None)
    optimizer = gradwise.Muon(params, lr=0.02, compile=False)
    optimizer.load_state_dict(state_dict)
    assert not {"compile", "adamw_lr", "state"} & set().union(*optimizer.param_groups)
    assert [g["lr"] for g in optimizer.param_groups] == [0.02, 3e-4]  # the AdamW route's lr is its group's


@pytest.mark.parametrize("recipe", [gradwise.Muon, gradwise.AdamMini], ids=lambda r: r.__name__)
def test_split_groups_are_the_groups_the_recipe_keeps_and_a_subset_keeps_them(recipe):
    model = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Linear(4, 6), torch.nn.LayerNorm(6))
    kwargs = {**ENTRY[recipe].configs[0].kwargs, "compile": False}
    kwargs.update({"dim": 4, "n_heads": 2} if recipe is gradwise.AdamMini else {})
    direct = recipe(model.named_parameters(), **kwargs)
    groups = recipe.split_groups(model.named_parameters(), **kwargs)
    assert len(groups) == len(direct.param_groups) > 1
    for group, kept in zip(groups, direct.param_groups):
        assert [id(p) for p in group["params"]] == [id(p) for p in kept["params"]]  # the model's own tensors
        assert {k: v for k, v in group.items() if k != "params"} == \
            {k: v for k, v in kept.items() if k not in ("params", "param_names")}
    # as ZeRO gives each rank a copy of every group holding some (or none) of its parameters
    subset = [{**g, "params": g["params"][:i % 2]} for i, g in enumerate(groups)]
    local = recipe(subset, **kwargs)
    assert len(local.param_groups) == len(groups)
    assert [len(g["params"]) for g in local.param_groups] == [len(g["params"]) for g in subset]


def test_split_groups_leaves_the_parameters_alone():
    """Built on meta stand-ins: no hook installed (LOMO steps inside backward), nothing allocated."""
    params = _params()
    groups = gradwise.LOMO.split_groups(params, lr=0.1)
    assert [p for g in groups for p in g["params"]] == params
    params[0].sum().backward()
    assert all(p.grad is not None for p in params[:1]) and torch.equal(params[0], _params()[0])
