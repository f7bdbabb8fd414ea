"""The registry's declarations hold for the recipes they describe (so a filter never silently drops a
recipe), and every recipe takes the engine's keywords the same way: the same names and defaults, the
same validation and errors; a value one cannot honour is refused, naming the argument, the value and
what is allowed."""
from __future__ import annotations

import inspect
import re

import pytest
import torch

import gradwise
from gradwise.recipes import takes_state
from tests.registry import ENGINE_KEYWORDS, ENTRIES, ENTRY, nudge_hyperparameters

#: each engine keyword's default, as every recipe's signature states it
DEFAULTS = {"param_rounding": "nearest", "maximize": False, "skip_nonfinite": False, "compile": "auto", "state": None}
#: a value of the wrong kind for each engine keyword
BAD = {"param_rounding": "up", "maximize": "yes", "skip_nonfinite": "yes", "compile": "fast", "state": 8}


def _params():
    generator = torch.Generator().manual_seed(0)
    return [torch.nn.Parameter(torch.randn(4, 3, generator=generator)),
            torch.nn.Parameter(torch.randn(3, generator=generator))]


def _error(make):
    """The exception ``make()`` raises (its type and message), or None."""
    try:
        make()
    except (TypeError, ValueError) as error:
        return type(error), str(error)
    return None


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: e.name)
def test_declared_state_is_what_the_recipe_does(entry):
    assert (entry.name in takes_state()) is entry.state, "the error messages' list of recipes that take state="
    if entry.state:
        entry.build(_params(), state="int8")
        return
    with pytest.raises(TypeError, match=rf"{entry.name}\(\) does not take state='int8': .+; allowed: .+"
                                        r"\. Recipes that take state=: .*AdamW"):
        entry.build(_params(), state="int8")


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: e.name)
def test_declared_fused_backward_is_what_the_recipe_does(entry):
    optimizer = entry.build(_params(), compile=False)
    if entry.fused_backward:
        gradwise.fused_backward(optimizer).remove()
        return
    with pytest.raises(ValueError, match=rf"fused_backward\({entry.name}\): "):
        gradwise.fused_backward(optimizer)


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: e.name)
def test_declared_torch_counterpart_is_the_checkpoint_format_it_converts(entry):
    declared = getattr(entry.build(_params(), compile=False), "torch_format", None)
    formats = declared.values() if isinstance(declared, dict) else [declared] if declared is not None else []
    names = {f.optimizer for f in formats}
    if entry.torch_counterpart is None:
        assert not names, f"{entry.name} converts {names} checkpoints: declare its torch_counterpart"
    else:
        assert f"torch.optim.{entry.torch_counterpart.__name__}" in names


@pytest.mark.parametrize("entry", [e for e in ENTRIES if not e.compiles], ids=lambda e: e.name)
def test_batched_chains_compile_only_their_elementwise_rest(entry):
    """Their batched links (one eigh or matmul over same-shaped matrices) run eagerly with compile=True;
    the elementwise links after them run as their own compiled phase (core/phases.py), as eager does,
    and a scheduler changing every float hyperparameter before the next steps compiles nothing more."""
    runs = []
    for compile in (True, False):
        params = _params()
        optimizer = entry.build(params, compile=compile, **entry.configs[0].kwargs)
        counts = []
        for step in range(3):
            for p in params:
                p.grad = torch.ones_like(p) * (step + 1)
            nudge_hyperparameters(optimizer, step)
            optimizer.step()
            counts.append(optimizer.compile_stats["compiles"])
        runs.append((params, counts))
    (compiled, graphs), (eager, none) = runs
    assert none == [0, 0, 0] and 1 <= graphs[0] <= 2 and graphs == graphs[:1] * 3  # the elementwise rest, flat
    for a, b in zip(compiled, eager):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def _signature(entry):
    return inspect.signature(entry.recipe.__init__).parameters


@pytest.mark.parametrize("keyword", DEFAULTS)
@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: e.name)
def test_every_recipe_takes_each_engine_keyword_with_the_same_default(entry, keyword):
    if keyword in entry.missing_keywords:  # declared: Ranger21's state=, until it is a plain chain
        assert keyword not in _signature(entry)
        with pytest.raises(TypeError, match=rf"{entry.name}\(\) got unknown keyword argument\(s\) {keyword}="):
            entry.build(_params(), **{keyword: DEFAULTS[keyword]})
        return
    assert _signature(entry)[keyword].default == DEFAULTS[keyword]
    entry.build(_params(), **{keyword: DEFAULTS[keyword]})


def _took_effect(optimizer, keyword):
    group = optimizer.param_groups[0]
    return {"param_rounding": lambda: group["param_rounding"] == "stochastic",
            "maximize": lambda: group["maximize"] is True,
            "skip_nonfinite": lambda: "skip" in optimizer.transform.reductions.values(),
            "compile": lambda: optimizer.compile is False,
            "state": lambda: optimizer.storage.policy is not None}[keyword]()


@pytest.mark.parametrize("keyword", ENGINE_KEYWORDS)
@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: e.name)
def test_every_recipe_honours_each_engine_keyword_or_refuses_it_by_name(entry, keyword):
    value = ENGINE_KEYWORDS[keyword]
    refused = entry.refused.get(keyword) == value or (keyword == "state" and not entry.state)
    if not refused:
        assert _took_effect(entry.build(_params(), **{keyword: value}), keyword)
        return
    found = _error(lambda: entry.build(_params(), **{keyword: value}))
    assert found is not None, f"{entry.name}({keyword}={value!r}) was declared refused but accepted"
    assert f"{keyword}={value!r}" in found[1] and entry.name in found[1], found[1]


@pytest.mark.parametrize("keyword", BAD)
@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: e.name)
def test_every_recipe_rejects_a_bad_engine_keyword_with_adamws_error(entry, keyword):
    expected = _error(lambda: gradwise.AdamW(_params(), **{keyword: BAD[keyword]}))
    found = _error(lambda: entry.build(_params(), **{keyword: BAD[keyword]}))
    assert expected is not None and found is not None
    assert found[0] is expected[0] and found[1] == re.sub(r"\bAdamW\b", entry.name, expected[1])


def test_every_entry_is_one_recipe_and_every_recipe_has_an_entry():
    assert len(ENTRY) == len(ENTRIES)
    from gradwise.by_name import recipe_names

    assert {e.name for e in ENTRIES} == set(recipe_names())
