"""An encoded step worked out once is taken again while it fits (gradwise.state.prepared): the same bits as
working it out at every step, kept across steady steps, and worked out anew when the parameter's memory, its
state's tensors or keys, or its gradient's layout change."""
from __future__ import annotations

import gc

import pytest
import torch

import gradwise
from tests.guard_checks import log_guard_checks

#: a run codec's short last block (333), a matrix stepped in its shape for its rank-1 second moment (int8's
#: 40 x 50), bf16's paired moments
SHAPES = [(333,), (40, 50), (2048,)]
FORMATS = ["bf16", "int8", "fp8"]


def _params() -> list[torch.nn.Parameter]:
    generator = torch.Generator().manual_seed(0)
    return [torch.nn.Parameter(torch.randn(s, generator=generator)) for s in SHAPES]


def _build(params, fmt: str, compile: bool):
    return gradwise.AdamW(params, lr=1e-2, weight_decay=0.1, compile=compile,
                          state=gradwise.StatePolicy(fmt, min_numel=0))


def _train(fmt: str, compile: bool, keep: bool, change=None, steps: int = 8):
    """Parameters and state after ``steps`` steps; ``keep=False`` forgets every kept step before each one;
    ``change(opt, params, step)`` runs before each step."""
    params = _params()
    opt = _build(params, fmt, compile)
    generator = torch.Generator().manual_seed(1)
    for step in range(steps):
        for p in params:
            p.grad = torch.randn(p.shape, generator=generator) * 1e-2
        if change is not None:
            change(opt, params, step)
        if not keep:
            opt.storage._ready.clear()
        opt.step()
    return params, opt


def _assert_same(a, b) -> None:
    (params_a, opt_a), (params_b, opt_b) = a, b
    for i, (x, y) in enumerate(zip(params_a, params_b)):
        assert torch.equal(x, y), f"parameter {i} {tuple(x.shape)} differs"
        s, t = opt_a.state[x], opt_b.state[y]
        assert s.keys() == t.keys()
        for key in s:
            assert torch.equal(s[key], t[key]), f"parameter {i}: state {key!r} differs"


def _new_memory(opt, params, step):
    """``p.data = ...``: the parameter's values in new memory (the same values)."""
    if step == 4:
        for p in params:
            p.data = p.data.clone()


def _state_replaced(opt, params, step):
    """A state tensor replaced under its key (the same values, new memory)."""
    if step == 3:
        for p in params:
            state = opt.state[p]
            for key in [k for k in state if "@" in k and not k.endswith(".value")]:
                state[key] = state[key].clone()


def _strided_grad(opt, params, step):
    """A transposed (not contiguous) gradient at one step: the matrix steps in its shape then."""
    if step == 5:
        matrix = params[1]
        matrix.grad = matrix.grad.t().contiguous().t()


def _every_change(opt, params, step):
    """New memory, a replaced state tensor and a transposed gradient, at steps of their own."""
    for change in (_new_memory, _state_replaced, _strided_grad):
        change(opt, params, step)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("change", [None, _new_memory, _state_replaced, _strided_grad],
                         ids=["steady", "new_memory", "state_replaced", "strided_grad"])
def test_kept_steps_have_the_bits_of_fresh_ones(fmt, change):
    _assert_same(_train(fmt, False, keep=True, change=change), _train(fmt, False, keep=False, change=change))


@pytest.mark.parametrize("fmt", ["bf16", "int8"])
def test_kept_compiled_steps_have_the_bits_of_fresh_ones(fmt):
    """Compiled, through every change in one run (int8: its runs and its in-shape step; each compile costs
    seconds)."""
    _assert_same(_train(fmt, True, keep=True, change=_every_change),
                 _train(fmt, True, keep=False, change=_every_change))


def test_a_steady_step_takes_the_kept_step_and_a_change_makes_it_anew():
    params, opt = _train("bf16", False, keep=True, steps=2)
    kept = dict(opt.storage._ready)
    assert len(kept) == len(params)
    for p in params:
        p.grad = torch.randn_like(p)  # new gradient tensors: the kept steps still fit
    opt.step()
    assert all(opt.storage._ready[key] is value for key, value in kept.items())
    params[0].data = params[0].data.clone()
    opt.step()
    renewed = [key for key, value in kept.items() if opt.storage._ready[key] is not value]
    assert renewed == [key for key in kept if key[1] == id(params[0])]


def test_a_step_of_new_memory_writes_there_and_load_state_dict_forgets_the_kept_steps():
    params, opt = _train("int8", False, keep=True, steps=2)
    old = params[0].data
    params[0].data = old.clone()
    before = params[0].detach().clone()
    opt.step()
    assert not torch.equal(params[0], before), "the step must update the parameter's new memory"
    assert torch.equal(old, before), "and leave its old memory alone"
    opt.load_state_dict(opt.state_dict())
    assert not opt.storage._ready


def test_a_parameter_taken_out_of_the_optimizer_takes_its_kept_steps_with_it():
    params, opt = _train("bf16", False, keep=True, steps=2)
    assert len(opt.storage._ready) == 3
    gone = params.pop()
    del opt.param_groups[0]["params"][-1]
    del opt.state[gone]
    for p in params:
        p.grad = torch.randn_like(p)
    opt.step()
    del gone
    gc.collect()
    assert len(opt.storage._ready) == 2


def test_a_compiled_encoded_step_checks_every_calls_guards_before_its_first_graph_runs(monkeypatch):
    """The three parameters' four runs (one graph of symbolic sizes): their guards checked, then the graphs run. A guard
    that fails (dynamo guards the thread count) compiles that call anew, as it would alone: the same bits as a run
    without the change (bf16 has no reduction a thread count could reorder)."""
    reference = _train("bf16", True, keep=True, steps=4)
    params = _params()
    opt = _build(params, "bf16", True)
    generator = torch.Generator().manual_seed(1)
    threads, events = torch.get_num_threads(), []
    for step in range(4):
        for p in params:
            p.grad = torch.randn(p.shape, generator=generator) * 1e-2
        if step == 2:
            events = log_guard_checks(monkeypatch)
        if step == 3:
            calls = sum(len(ready.runs) for ready in opt.storage._ready.values())
            assert calls == 4  # the short vector's whole blocks and its last block, the matrix, the long vector
            assert events == ["check"] * calls + ["run"] * calls
            events.clear()
            compiles = opt.compile_stats["compiles"]
            torch.set_num_threads(threads + 1)
        try:
            opt.step()
        finally:
            torch.set_num_threads(threads)
    # the four checks before any graph, then the first call's own: it compiles (or loads) a graph for two threads
    assert events[:5] == ["fail"] * 5 and opt.compile_stats["compiles"] > compiles
    _assert_same(reference, (params, opt))
