"""``GuardedGraphs`` (``core/ahead.py``): dynamo's entries run without its frame hook where their guards pass,
another is compiled where none does, past dynamo's recompile limit a call is refused (``fullgraph``; on the disk
store's path too), a global the chain reads is guarded (the library's own globals are not), kept entries outlive
``torch._dynamo.reset()``, and the path through dynamo at every call (a torch that does not show its entries) steps
an optimizer to the same numbers."""
from __future__ import annotations

import sys

import pytest
import torch

import gradwise
from gradwise import Optimizer, Transform, chain, scale_by_learning_rate
from gradwise.core import ahead, executor
from gradwise.core.ahead import GuardedGraphs
from gradwise.core.executor import private_copy

pytestmark = pytest.mark.slow


def scaled_sum(x, y, scale=2.0):
    """x <- x + scale y, in place; returns the sum of x."""
    x.add_(y * scale)
    return x.sum()


class Counting:
    """A backend that counts its graphs and compiles them with inductor."""

    def __init__(self):
        self.graphs = 0

    def __call__(self, gm, example_inputs):
        from torch._inductor.compile_fx import compile_fx

        self.graphs += 1
        return compile_fx(gm, example_inputs)


def test_one_graph_serves_every_length_and_another_is_compiled_where_the_guards_fail():
    backend = Counting()
    graphs = GuardedGraphs(private_copy(scaled_sum), backend, dynamic=True)
    for n in (5, 9, 33):
        x, y = torch.randn(n), torch.randn(n)
        want = x + y * 2.0
        total = graphs("key", {"x": x, "y": y})
        assert torch.allclose(x, want) and torch.allclose(total, want.sum())
    assert backend.graphs == 1
    # a rank and a dtype the graph was not compiled for: its guards fail
    x, y = torch.randn(4, 3, dtype=torch.float64), torch.randn(4, 3, dtype=torch.float64)
    want = x + y * 2.0
    graphs("key", {"x": x, "y": y})
    assert x.dtype == torch.float64 and torch.allclose(x, want)
    assert backend.graphs == 2
    graphs("key", {"x": torch.randn(6, 2, dtype=torch.float64), "y": torch.randn(6, 2, dtype=torch.float64)})
    assert backend.graphs == 2


@pytest.mark.parametrize("store", [None, "tests.scaled_sum"], ids=["in-process", "disk store"])
def test_past_the_recompile_limit_a_call_is_refused_and_changes_nothing(store, monkeypatch, tmp_path):
    monkeypatch.setattr(torch._dynamo.config, "recompile_limit", 1)
    monkeypatch.setenv("GRADWISE_GRAPH_CACHE", str(tmp_path))
    backend = Counting()
    graphs = GuardedGraphs(private_copy(scaled_sum), backend, dynamic=True, store=store)
    graphs("key", {"x": torch.randn(5), "y": torch.randn(5)})
    x, y = torch.randn(3, dtype=torch.float64), torch.randn(3, dtype=torch.float64)
    before = x.clone()
    with pytest.raises(torch._dynamo.exc.FailOnRecompileLimitHit):
        graphs("key", {"x": x, "y": y})
    assert torch.equal(x, before) and backend.graphs == 1


def _trained(monkeypatch, ahead: bool):
    monkeypatch.setattr(GuardedGraphs, "ahead", ahead)
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(shape)) for shape in [(7, 5), (5,), (3, 3, 2), (11,)] * 3]
    optimizer = gradwise.AdamW(params, lr=1e-2, weight_decay=0.1, compile=True)
    for step in range(6):
        for p in params:
            p.grad = torch.randn_like(p)
        optimizer.param_groups[0]["lr"] = 1e-2 / (1 + step)
        optimizer.step()
    return params, optimizer.compile_stats["compiles"]


def test_the_path_through_dynamo_at_every_call_steps_to_the_same_numbers(monkeypatch):
    ahead, ahead_graphs = _trained(monkeypatch, True)
    through, through_graphs = _trained(monkeypatch, False)
    assert all(torch.equal(a, b) for a, b in zip(ahead, through))
    assert ahead_graphs == through_graphs == 1


#: read by ``flip_by_global`` when it is traced: a graph compiled for one value must not run for the other
FLIP = False


class flip_by_global(Transform):
    """u <- -u where the module's global ``FLIP`` is true, else u."""

    name = "by_global"

    def update(self, updates, state, ctx):
        return [-u if FLIP else u for u in updates]


def test_a_global_the_chain_reads_is_guarded(monkeypatch):
    params = [torch.nn.Parameter(torch.ones(6)) for _ in range(3)]
    optimizer = Optimizer(params, chain(flip_by_global(), scale_by_learning_rate()), lr=0.5, compile=True)
    for p in params:
        p.grad = torch.ones(6)
    optimizer.step()
    assert all(torch.equal(p, torch.full((6,), 0.5)) for p in params)
    monkeypatch.setattr(sys.modules[__name__], "FLIP", True)
    optimizer.step()
    assert all(torch.equal(p, torch.ones(6)) for p in params)
    assert optimizer.compile_stats["compiles"] == 2


def test_guards_rooted_at_the_library_are_left_out_and_the_rest_kept(monkeypatch):
    """The guard filter's answers on the entries of a real compile (Adam's chain with a transform of this module,
    which reads this module's ``FLIP``): every guard rooted at a global of gradwise, torch, the builtins or
    dataclasses is left out, every other one (the call's arguments, grad mode, this module's global) kept."""
    decided = []
    library_global = ahead.library_global

    def recording(entry, fn_globals):
        left_out = library_global(entry, fn_globals)
        decided.append((entry.name, entry.is_global, left_out))
        return left_out

    monkeypatch.setattr(ahead, "library_global", recording)
    params = [torch.nn.Parameter(torch.ones(6)) for _ in range(3)]
    transform = chain(flip_by_global(), gradwise.transforms.scale_by_adam(), scale_by_learning_rate())
    optimizer = Optimizer(params, transform, lr=0.5, compile=True)
    for p in params:
        p.grad = torch.ones(6)
    optimizer.step()
    roots = {name: name.split("]")[0][3:-1] for name, is_global, _ in decided if is_global}

    def of_the_library(root: str) -> bool:
        if root.startswith("__import_"):
            return root.startswith(("__import_gradwise_dot_", "__import_torch", "__import_dataclasses"))
        if root.startswith("__builtins_dict"):
            return True
        value = getattr(executor, root)  # the traced function's module
        return root == "torch" or value.__module__.startswith("gradwise.")

    assert set(roots.values()) >= {"Context", "torch", "__import_gradwise_dot_transforms_dot_adam",
                                   "__import_tests_dot_test_ahead"}
    for name, is_global, left_out in decided:
        assert left_out == (is_global and of_the_library(roots[name])), name
    assert any(name.startswith("params[") and not left_out for name, _, left_out in decided)


class Recording(Counting):
    """Counting, keeping each graph's example inputs."""

    def __init__(self):
        super().__init__()
        self.inputs = []

    def __call__(self, gm, example_inputs):
        self.inputs.append(list(example_inputs))
        return super().__call__(gm, example_inputs)


def test_a_python_float_argument_is_compiled_in_as_a_constant():
    """A float the graph is called with (a chain's static hyperparameter, such as Ranger21's ``beta_softplus``) is a
    constant of the graph, not an input its loop loads and converts at every vector; another value compiles another
    graph, and each value runs its own."""
    backend = Recording()
    graphs = GuardedGraphs(private_copy(scaled_sum), backend, dynamic=True)
    x, y = torch.randn(8), torch.randn(8)
    for scale in (3.0, 0.5, 3.0):
        want = x + y * scale
        graphs("key", {"x": x, "y": y, "scale": scale})
        assert torch.equal(x, want)
    assert backend.graphs == 2
    for inputs in backend.inputs:
        tensors = [t for t in inputs if isinstance(t, torch.Tensor)]
        assert len(tensors) == 2 and all(t.dim() == 1 for t in tensors)  # x and y, no 0-d float
        assert not any(isinstance(t, torch.SymFloat) for t in inputs)


def test_kept_entries_run_on_after_dynamo_is_reset():
    params = [torch.nn.Parameter(torch.ones(6)) for _ in range(3)]
    optimizer = Optimizer(params, chain(flip_by_global(), scale_by_learning_rate()), lr=0.5, compile=True)
    for p in params:
        p.grad = torch.ones(6)
    optimizer.step()
    torch._dynamo.reset()
    optimizer.step()
    assert all(torch.equal(p, torch.zeros(6)) for p in params)


def test_an_elementwise_graph_is_compiled_on_two_element_copies_then_runs_the_parameters(monkeypatch):
    """The first call of a kind runs on copies (a failed compile then changes nothing): for an elementwise chain,
    the first two elements of each tensor it writes or reads, so compiling copies nothing of a large parameter; the
    same graph then steps the parameters themselves, to eager's numbers (within float32 rounding: inductor's
    arithmetic is not eager's op for op)."""
    calls = []
    call = GuardedGraphs.__call__

    def spying(self, key, args):
        seen = {name: [t.untyped_storage().data_ptr() for t in args[name]] for name in ("params", "inputs")}
        calls.append({**seen, "sizes": [t.numel() for t in args["params"]],
                      "state": [len(ts[0]) for ts in args["state"].values()]})
        return call(self, key, args)

    monkeypatch.setattr(GuardedGraphs, "__call__", spying)
    params = [torch.nn.Parameter(torch.randn(300, 40)), torch.nn.Parameter(torch.randn(500))]
    twins = [torch.nn.Parameter(p.detach().clone()) for p in params]
    for p, q in zip(params, twins):
        p.grad = q.grad = torch.randn_like(p)
    compiled = gradwise.AdamW(params, lr=0.1, weight_decay=0.1, compile=True)
    eager = gradwise.AdamW(twins, lr=0.1, weight_decay=0.1, compile=False)
    for _ in range(2):
        compiled.step()
        eager.step()
    assert compiled.compile_stats["compiles"] == 1
    first, second = calls[0], calls[1]
    assert first["sizes"][:2] == [2, 2] and second["sizes"][:2] == [12000, 500]
    assert all(length in (1, 2) for length in first["state"])  # moments cut to two; the 0-d step whole
    real = {p.untyped_storage().data_ptr() for p in params} | {p.grad.untyped_storage().data_ptr() for p in params}
    assert not real & set(first["params"] + first["inputs"])
    assert set(second["params"][:2]) == {p.untyped_storage().data_ptr() for p in params}
    for p, q in zip(params, twins):
        torch.testing.assert_close(p, q, rtol=2e-6, atol=1e-7)
