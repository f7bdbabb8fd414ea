"""An eager step's calls of torch ops from Python do not grow with the number of parameters beyond one or two per
parameter: the links of the recipes a small model runs eagerly (``compile="auto"`` below 2^20 elements; the arena's
quick suite runs AdamW, NAdamW and Lion) are written with list ops (``core/lists.py``: one foreach call per list), not
a loop of several tensor ops per parameter, each paying the interpreter and torch's argument parsing. Counted with
``sys.setprofile`` (calls of torch's C functions and tensor methods), on steady steps of 8 and of 32 parameters. The
foreach calls give the bits of the per-tensor ops: one optimizer over many parameters steps them exactly as one
optimizer per parameter (whose lists of one tensor take the plain ops) does."""
from __future__ import annotations

import sys

import pytest
import torch

import gradwise

#: torch op calls a step may make per parameter: each step counter's add_ (``lists.count_up_``) and a 0-d state's
#: advance (NAdam's running product of mu)
PER_PARAMETER = 2
RECIPES = {
    "AdamW": dict(lr=1e-3, weight_decay=0.1),
    "NAdamW": dict(lr=1e-3, weight_decay=0.1),
    "Lion": dict(lr=1e-4, weight_decay=0.1),
    "ScheduleFreeAdamW": dict(lr=1e-3, weight_decay=0.1, warmup_steps=2),
}


def _c_calls_of_a_step(name: str, count: int) -> int:
    gen = torch.Generator().manual_seed(count)
    params = [torch.nn.Parameter(torch.randn(3 + i % 5, 4, generator=gen)) for i in range(count)]
    opt = getattr(gradwise, name)(params, compile=False, **RECIPES[name])
    for p in params:
        p.grad = torch.randn(p.shape, generator=gen)
    for _ in range(3):  # state made; then steady steps
        opt.step()
    calls = 0

    def counting(frame, event, arg):
        nonlocal calls
        if event == "c_call" and (arg.__qualname__.startswith("Tensor.") or (arg.__module__ or "").startswith("torch")):
            calls += 1
    sys.setprofile(counting)
    try:
        opt.step()
    finally:
        sys.setprofile(None)
    return calls


@pytest.mark.parametrize("name", list(RECIPES))
def test_an_eager_step_makes_a_few_calls_per_parameter(name):
    few, many = _c_calls_of_a_step(name, 8), _c_calls_of_a_step(name, 32)
    assert few > 0
    assert (many - few) / 24 <= PER_PARAMETER, (few, many)


@pytest.mark.parametrize("name", list(RECIPES))
def test_list_ops_over_many_parameters_equal_each_parameter_stepped_alone(name):
    gen = torch.Generator().manual_seed(1)
    values = [torch.randn(3 + i % 5, 4, generator=gen) for i in range(6)]
    together = [torch.nn.Parameter(v.clone()) for v in values]
    alone = [torch.nn.Parameter(v.clone()) for v in values]
    opts = [getattr(gradwise, name)(together, compile=False, **RECIPES[name])]
    opts += [getattr(gradwise, name)([p], compile=False, **RECIPES[name]) for p in alone]
    for _ in range(5):
        for p, q in zip(together, alone):
            p.grad = torch.randn(p.shape, generator=gen)
            q.grad = p.grad.clone()
        for opt in opts:
            opt.step()
    for p, q, opt in zip(together, alone, opts[1:]):
        assert torch.equal(p, q)
        assert all(torch.equal(a, b) for a, b in zip(opts[0].state[p].values(), opt.state[q].values()))
