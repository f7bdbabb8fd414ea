"""Every recipe takes the engine's options (``compile``, ``skip_nonfinite``, ``param_rounding``,
``maximize``) by the same keywords, and each does what it does for AdamW; a recipe that cannot honour
one refuses it with the reason."""
from __future__ import annotations

import inspect

import pytest
import torch

import gradwise
from tests.registry import ENTRIES, ENTRY, RECIPES, build


def updates_inside_backward(recipe) -> bool:
    """The recipes that step inside backward unless told otherwise (``fused_backward=True`` by default)."""
    parameter = inspect.signature(recipe.__init__).parameters.get("fused_backward")
    return parameter is not None and parameter.default is True


def _matrix(dtype=torch.float32) -> torch.nn.Parameter:
    """Values in [1, 2), where a bfloat16 ulp is 2^-7."""
    return torch.nn.Parameter((1 + 0.9 * torch.rand(16, 16, generator=torch.Generator().manual_seed(0))).to(dtype))


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda r: r.__name__)
def test_every_recipe_takes_skip_nonfinite_and_maximize(recipe):
    p = _matrix()
    start = p.detach().clone()
    opt = build(recipe, [p], compile=False, skip_nonfinite=True, maximize=True, param_rounding="nearest")
    assert opt.param_groups[0]["maximize"] is True
    p.grad = torch.full_like(p, float("nan"))
    opt.step()
    assert opt.skipped_steps == 1 and torch.equal(p, start)


@pytest.mark.parametrize("recipe", [e.recipe for e in ENTRIES if e.bf16 and "param_rounding" not in e.refused],
                         ids=lambda r: r.__name__)
def test_every_recipe_writes_bfloat16_parameters_stochastically(recipe):
    """A step far smaller than half a bfloat16 ulp: round-to-nearest writes nothing, stochastic
    rounding moves some elements by one ulp and none by more."""
    moved = {}
    for rounding in ("nearest", "stochastic"):
        p = _matrix(torch.bfloat16)
        start = p.detach().float()
        # CAME's first step is about 11 lr per element; SubsetNorm's about lr / 40 (0.1 g / ||g's row||)
        lr = {gradwise.CAME: 2e-5, gradwise.SubsetNorm: 5e-2}.get(recipe, 5e-4)
        # Ranger21's warmup would make its first step 1/warmup of that: off, with lr a quarter ulp
        extra = dict(use_warmup=False, lr=2e-3) if recipe is gradwise.Ranger21 else dict(lr=lr)
        if recipe is gradwise.MicroAdam:  # every element in its window, not 1% of them: all of them move
            extra["k_init"] = 1.0
        opt = build(recipe, [p], compile=False, param_rounding=rounding, **extra)
        p.grad = (2 * torch.rand(p.shape, generator=torch.Generator().manual_seed(1)) - 1).to(torch.bfloat16)
        for _ in range(1 if ENTRY[recipe].first_step_moves else 2):  # ADOPT's first step moves nothing
            opt.step()
        change = (p.detach().float() - start).abs()
        assert (change <= 2**-7).all()
        moved[rounding] = int((change > 0).sum())
    assert moved["nearest"] == 0 and moved["stochastic"] > 0


@pytest.mark.parametrize("recipe", [r for r in RECIPES if updates_inside_backward(r)], ids=lambda r: r.__name__)
def test_skip_nonfinite_inside_backward_is_refused_with_what_to_do(recipe):
    with pytest.raises(ValueError, match=r"skip_nonfinite=True\) needs fused_backward=False"):
        recipe([_matrix()], skip_nonfinite=True)
