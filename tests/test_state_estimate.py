"""``gradwise.estimate`` and ``gradwise estimate``: predicted bytes equal the bytes a step allocates."""
from __future__ import annotations

import pytest
import torch

import gradwise
from bench.step import state_bytes
from gradwise.cli import main


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Embedding(300, 32), torch.nn.Linear(32, 200), torch.nn.LayerNorm(200))


@pytest.mark.parametrize("recipe", ["AdamW", "NAdamW", "Lion", "SGD"])
@pytest.mark.parametrize("state", [None, "bf16", "int8", "int4", "fp8",
                                   gradwise.StatePolicy("int4", rules={r"^0\.": "int8"}, min_numel=100)])
def test_estimate_equals_the_bytes_a_step_allocates(recipe, state):
    net = model()
    kwargs = {"momentum": 0.9} if recipe == "SGD" else {}
    predicted = gradwise.estimate(net, recipe, state=state, **kwargs)
    params = list(net.named_parameters())
    before = [p.detach().clone() for _, p in params]
    assert all(p.device.type == "cpu" for _, p in params) and not any(p.grad is not None for _, p in params)
    opt = getattr(gradwise, recipe)(params, state=state, compile=False, **kwargs)
    assert predicted.total == gradwise.estimate(net, opt).total, "an optimizer and its recipe estimate alike"
    for _, p in params:
        p.grad = torch.randn_like(p)
    opt.step()
    assert predicted.total == state_bytes(opt)
    assert predicted.params == sum(p.numel() for p in before)


def test_estimate_splits_by_format_and_group():
    net = model()
    groups = [{"params": list(net[0].named_parameters())}, {"params": list(net[1].named_parameters()), "lr": 1e-4}]
    result = gradwise.estimate(groups, gradwise.AdamW, state=gradwise.StatePolicy("int8", min_numel=0))
    assert {(r["group"], r["format"]) for r in result.rows} == {
        (0, "int8-b2048"), (0, "step counters"), (1, "int8-b2048"), (1, "step counters")}
    assert result.by("format")["step counters"] == 4 * 3
    assert "total" in result.table() and "int8-b2048" in result.table()


def test_estimate_allocates_nothing():
    big = torch.nn.Linear(1, 1)
    big.weight = torch.nn.Parameter(torch.empty(1 << 20, 1 << 12, device="meta"))  # 16 GiB were it real
    result = gradwise.estimate(big, gradwise.AdamW, state="int4")
    assert result.bytes_per_param == pytest.approx(1.03, abs=0.01)


def test_bad_recipes_are_named():
    with pytest.raises(ValueError, match="optimizer_or_recipe='Adamw'"):
        gradwise.estimate(model(), "Adamw")
    with pytest.raises(TypeError, match="recipe keywords"):
        gradwise.estimate(model(), gradwise.AdamW(model().parameters()), state="int8")


def test_cli_prints_the_table(capsys):
    assert main(["estimate", "--size", "tiny", "--state", "int8", "--fp32", "wte"]) == 0
    out = capsys.readouterr().out
    assert "int8-b2048" in out and "fp32" in out and "total" in out
    with pytest.raises(SystemExit) as exit_info:
        main(["estimate", "--state", "int3"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "argument --state: invalid value 'int3'" in err and "int8-b256" in err


def test_a_lowercase_module_name_is_refused_with_the_recipes_name():
    with pytest.raises(ValueError, match="optimizer_or_recipe='adam'.*did you mean 'Adam'"):
        gradwise.estimate(model(), "adam")


@pytest.mark.parametrize("recipe", ["CAME", gradwise.CAME])
def test_a_recipe_without_a_default_lr_is_estimated_without_one(recipe):
    net = model()
    predicted = gradwise.estimate(net, recipe)
    opt = gradwise.CAME(net.parameters(), lr=1e-3, compile=False)
    assert predicted.total == gradwise.estimate(net, opt).total
    assert main(["estimate", "--size", "tiny", "--recipe", "CAME"]) == 0
