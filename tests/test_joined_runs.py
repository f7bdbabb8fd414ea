"""Small parameters' eager encoded steps run stacked (gradwise.state.joined): the bits of each parameter's
step on its own, for every run codec, through joins split by size, with plain state written back."""
from __future__ import annotations

import pytest
import torch

import gradwise
import gradwise.state.joined as joined
from gradwise.core.hashing import element_index
from gradwise.state.bf16 import run_index

#: runs of whole blocks of several lengths, short last blocks (333, 2055: of bf16's 8, of int8's blocks too),
#: a matrix, and one parameter above JOIN_NUMEL, which steps alone
SHAPES = [(1000,), (333,), (40, 50), (2055,), (4096,), (24, 8), (joined.JOIN_NUMEL + 8,)]


def _params(seed: int = 0) -> list[torch.nn.Parameter]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(s, generator=generator)) for s in SHAPES]


def _run(build, monkeypatch, steps: int = 20, **limits) -> tuple[list[torch.Tensor], list[dict], int]:
    """(parameters, state, how many stacked runs stepped) after ``steps`` steps of ``build(params)``, with
    ``joined``'s limits patched to ``limits``."""
    for name, value in limits.items():
        monkeypatch.setattr(joined, name, value)
    stacks = []
    real_stack = joined.stack
    monkeypatch.setattr(joined, "stack", lambda queue: stacks.append(len(queue)) or real_stack(queue))
    params = _params()
    opt = build(params)
    generator = torch.Generator().manual_seed(1)
    for _ in range(steps):
        for p in params:
            p.grad = torch.randn(p.shape, generator=generator) * 1e-2
        opt.step()
    monkeypatch.undo()
    states = [{k: v.clone() for k, v in opt.state[p].items()} for p in params]
    return [p.detach().clone() for p in params], states, len(stacks)


def _assert_same(a, b) -> None:
    (params_a, states_a, _), (params_b, states_b, _) = a, b
    for i, (x, y) in enumerate(zip(params_a, params_b)):
        assert torch.equal(x, y), f"parameter {i} {tuple(x.shape)} differs"
    for i, (s, t) in enumerate(zip(states_a, states_b)):
        assert s.keys() == t.keys()
        for key in s:
            assert torch.equal(s[key], t[key]), f"parameter {i}: state {key!r} differs"


BUILDS = {
    f"{recipe}-{fmt}": (lambda recipe, fmt: lambda params: getattr(gradwise, recipe)(
        params, lr=1e-2, weight_decay=0.1, compile=False, state=gradwise.StatePolicy(fmt, min_numel=0)))(recipe, fmt)
    for recipe, fmt in [("AdamW", "bf16"), ("AdamW", "int8"), ("AdamW", "int4"), ("AdamW", "fp8"), ("Lion", "bf16"),
                        ("Lion", "int8")]
}
#: slow weights: plain float32 state shaped like the parameter, written by the stacked step
BUILDS["lookahead-adamw-bf16"] = lambda params: gradwise.Lookahead(
    gradwise.AdamW(params, lr=1e-2, compile=False, state=gradwise.StatePolicy("bf16", min_numel=0)), k=3)


@pytest.mark.parametrize("name", sorted(BUILDS))
def test_stacked_runs_step_each_parameter_bit_for_bit_as_alone(name, monkeypatch):
    alone = _run(BUILDS[name], monkeypatch, JOIN_NUMEL=0)
    stacked = _run(BUILDS[name], monkeypatch)
    assert alone[2] == 0 and stacked[2] >= 20, (alone[2], stacked[2])  # at least one stack a step
    _assert_same(stacked, alone)
    moved = [not torch.equal(p, q) for p, q in zip(stacked[0], _params())]
    assert all(moved), moved


def test_joins_cut_at_their_total_step_alike(monkeypatch):
    build = BUILDS["AdamW-bf16"]
    whole = _run(build, monkeypatch)
    cut = _run(build, monkeypatch, JOIN_TOTAL=2500)  # a join closes as soon as it holds 2500 elements
    assert cut[2] > whole[2]
    _assert_same(cut, whole)


def test_a_stacked_runs_index_is_each_rows_own():
    """Rows of two runs stacked (starts 64 and 8): each element's index is the one it has in its own run."""
    first, second = torch.zeros(3, 8), torch.zeros(2, 8)
    starts = torch.tensor([[64], [72], [80], [8], [16]])
    stacked = run_index(torch.cat([first, second]), starts)
    expected = torch.cat([run_index(first, torch.tensor(64)), run_index(second, torch.tensor(8))])
    assert torch.equal(stacked, expected) and torch.equal(expected[0], element_index(first, 64)[0])
