"""The disk store of compiled graphs (``core/graph_store.py``): a graph compiled once is loaded by a later optimizer,
in this process or another, and steps to the same bits; a stored graph is used only where its guards pass and the
user's sources it traced are unchanged; a graph that guards a user's global is not stored; unreadable entries are
skipped; a folder keeps at most ``ENTRIES``; ``GRADWISE_GRAPH_CACHE=0`` stores nothing (past dynamo's recompile
limit a call is refused: ``tests/test_ahead.py``). Each test stores in a folder of its own
(``GRADWISE_GRAPH_CACHE``)."""
from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import gradwise
from gradwise import Optimizer, chain, scale_by_learning_rate
from gradwise.core import graph_store
from gradwise.core.ahead import GuardedGraphs
from gradwise.core.executor import private_copy
from tests import test_ahead
from tests.test_ahead import Counting, flip_by_global, scaled_sum

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def store(tmp_path, monkeypatch) -> Path:
    folder = tmp_path / "graphs"
    monkeypatch.setenv("GRADWISE_GRAPH_CACHE", str(folder))
    return folder


def stored(folder: Path) -> list[Path]:
    return sorted(folder.glob("*/*.graph")) if folder.exists() else []


def graphs_of(backend) -> GuardedGraphs:
    return GuardedGraphs(private_copy(scaled_sum), backend, dynamic=True, store="tests.scaled_sum")


def _params(dtype=torch.float32) -> list[torch.nn.Parameter]:
    gen = torch.Generator().manual_seed(0)
    return [torch.nn.Parameter(torch.randn(shape, generator=gen, dtype=dtype)) for shape in [(7, 5), (5,), (3, 3, 2)]]


def _steps(optimizer, params, steps=4) -> None:
    gen = torch.Generator().manual_seed(1)
    for _ in range(steps):
        for p in params:
            p.grad = torch.randn(p.shape, generator=gen, dtype=p.dtype)
        optimizer.step()


def _no_compiling(monkeypatch) -> None:
    """Make inductor's compile fail: a graph can then only be loaded."""
    def refuse(*args, **kwargs):
        raise AssertionError("compiled where the store should have been read")

    monkeypatch.setattr("torch._inductor.compile_fx.compile_fx", refuse)


def test_a_new_optimizer_loads_the_stored_graph_and_steps_to_the_same_bits(store, monkeypatch):
    first = _params()
    optimizer = gradwise.AdamW(first, lr=1e-2, weight_decay=0.1, compile=True)
    _steps(optimizer, first)
    assert len(stored(store)) == 1 and optimizer.compile_stats["compiles"] == 1
    assert optimizer.compile_stats["loaded"] == 0
    _no_compiling(monkeypatch)
    second = _params()
    again = gradwise.AdamW(second, lr=1e-2, weight_decay=0.1, compile=True)
    _steps(again, second)
    assert again.compile_stats["compiles"] == again.compile_stats["loaded"] == 1 and len(stored(store)) == 1
    assert all(torch.equal(a, b) for a, b in zip(first, second))
    for a, b in zip(first, second):
        assert optimizer.state[a].keys() == again.state[b].keys()
        assert all(torch.equal(optimizer.state[a][k], again.state[b][k]) for k in optimizer.state[a])


_ANOTHER_PROCESS = textwrap.dedent("""
    import json, sys
    import torch
    sys.path.insert(0, sys.argv[1])
    torch.set_num_threads(int(sys.argv[3]))  # the parent's: the graph's guards hold the thread count
    from tests.test_graph_store import _params, _steps
    import gradwise
    params = _params()
    optimizer = gradwise.AdamW(params, lr=1e-2, weight_decay=0.1, compile=True)
    _steps(optimizer, params)
    torch.save([p.detach() for p in params], sys.argv[2])
    print(json.dumps({k: optimizer.compile_stats[k] for k in ("compiles", "loaded")}))
""")


def test_another_process_loads_the_stored_graph_and_steps_to_the_same_bits(store, tmp_path):
    params = _params()
    _steps(gradwise.AdamW(params, lr=1e-2, weight_decay=0.1, compile=True), params)
    out = tmp_path / "params.pt"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.run([sys.executable, "-c", _ANOTHER_PROCESS, str(ROOT), str(out), str(torch.get_num_threads())],
                         env=env,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert json.loads(run.stdout.strip().splitlines()[-1]) == {"compiles": 1, "loaded": 1}
    assert all(torch.equal(a, b) for a, b in zip(params, torch.load(out)))
    assert len(stored(store)) == 1


def test_a_stored_graph_runs_only_where_its_guards_pass(store):
    backend = Counting()
    x, y = torch.randn(9), torch.randn(9)
    graphs_of(backend)("key", {"x": x, "y": y})
    assert backend.graphs == 1 and len(stored(store)) == 1
    # a new instance: float32 vectors load that graph; float64 matrices fail its guards and compile another
    backend = Counting()
    graphs = graphs_of(backend)
    for dtype, shape in [(torch.float32, (12,)), (torch.float64, (4, 3)), (torch.float64, (5, 2))]:
        x, y = torch.randn(shape, dtype=dtype), torch.randn(shape, dtype=dtype)
        want = x + 2.0 * y
        total = graphs("key", {"x": x, "y": y})
        assert torch.equal(x, want) and torch.allclose(total, want.sum())
    assert backend.graphs == 1 and graphs.loaded == 1 and graphs.compiles == 2
    assert len(stored(store)) == 2
    backend = Counting()
    graphs = graphs_of(backend)
    for dtype in (torch.float64, torch.float32):  # both stored now: the guards pick each one's own
        x = torch.randn(3, 4, dtype=dtype) if dtype == torch.float64 else torch.randn(7)
        y = torch.ones_like(x)
        want = x + 2.0
        graphs("key", {"x": x, "y": y})
        assert torch.equal(x, want)
    assert backend.graphs == 0 and graphs.loaded == 2


_USER_TRANSFORM = '''
from gradwise import Transform


class scaled(Transform):
    """u <- {factor} u."""

    name = "scaled"

    def update(self, updates, state, ctx):
        return [u * {factor} for u in updates]
'''


def test_a_graph_is_not_loaded_once_a_user_module_it_traced_changes(store, tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "dont_write_bytecode", True)  # the second source is read, not a cached first
    module_file = tmp_path / "user_transform_for_the_store.py"
    results = []
    for factor in (2.0, 3.0):
        module_file.write_text(_USER_TRANSFORM.format(factor=factor))
        importlib.invalidate_caches()
        module = importlib.reload(sys.modules["user_transform_for_the_store"]) if factor == 3.0 else \
            importlib.import_module("user_transform_for_the_store")
        params = [torch.nn.Parameter(torch.zeros(6)) for _ in range(2)]
        optimizer = Optimizer(params, chain(module.scaled(), scale_by_learning_rate()), lr=1.0, compile=True)
        for p in params:
            p.grad = torch.ones(6)
        optimizer.step()
        results.append(params[0].detach().clone())
    assert torch.equal(results[0], torch.full((6,), -2.0)) and torch.equal(results[1], torch.full((6,), -3.0))
    assert len(stored(store)) == 2  # the second compiled anew, beside the first


def test_a_graph_that_guards_a_user_global_is_not_stored_and_the_global_is_still_guarded(store, monkeypatch):
    """Torch rebuilds a loaded graph's guards on a module's attribute from the module as it is at load: such a
    graph could not tell ``FLIP`` changed, so it is kept in the process only."""
    params = [torch.nn.Parameter(torch.ones(6)) for _ in range(3)]
    optimizer = Optimizer(params, chain(flip_by_global(), scale_by_learning_rate()), lr=0.5, compile=True)
    for p in params:
        p.grad = torch.ones(6)
    optimizer.step()
    monkeypatch.setattr(test_ahead, "FLIP", True)
    optimizer.step()
    again = [torch.nn.Parameter(torch.ones(6)) for _ in range(3)]
    fresh = Optimizer(again, chain(flip_by_global(), scale_by_learning_rate()), lr=0.5, compile=True)
    for p in again:
        p.grad = torch.ones(6)
    fresh.step()
    assert all(torch.equal(p, torch.ones(6)) for p in params)
    assert all(torch.equal(p, torch.full((6,), 1.5)) for p in again)
    assert stored(store) == [] and optimizer.compile_stats["compiles"] == 2


def test_unreadable_entries_are_skipped(store):
    backend = Counting()
    graphs_of(backend)("key", {"x": torch.randn(5), "y": torch.randn(5)})
    (good,) = stored(store)
    (good.parent / "cut-short.graph").write_bytes(good.read_bytes()[:1000])
    (good.parent / "garbage.graph").write_bytes(b"not a graph")
    backend = Counting()
    graphs = graphs_of(backend)
    x, y = torch.zeros(5), torch.ones(5)
    graphs("key", {"x": x, "y": y})
    assert torch.equal(x, torch.full((5,), 2.0)) and backend.graphs == 0 and graphs.loaded == 1


def test_a_folder_keeps_at_most_its_entries(store, monkeypatch):
    monkeypatch.setattr(graph_store, "ENTRIES", 2)
    graphs = graphs_of(Counting())
    # one folder (float32 vectors), three graphs: a length of 1 and a stride of 2 fail the others' guards
    for x in (torch.zeros(4), torch.zeros(1), torch.zeros(8)[::2]):
        graphs("key", {"x": x, "y": torch.ones_like(x)})
    assert graphs.compiles == 3 and len(stored(store)) == 2 and len({path.parent for path in stored(store)}) == 1


def test_zero_stores_nothing_and_compiles_in_process(store, monkeypatch):
    monkeypatch.setenv("GRADWISE_GRAPH_CACHE", "0")
    backend = Counting()
    graphs = graphs_of(backend)
    x = torch.zeros(4)
    graphs("key", {"x": x, "y": torch.ones(4)})
    graphs("key", {"x": x, "y": torch.ones(4)})
    assert torch.equal(x, torch.full((4,), 4.0)) and backend.graphs == 1 and not store.exists()


def test_the_folder_follows_the_settings_the_key_and_the_tensors():
    def folder(name="name", key=("key",), x=torch.zeros(3, 4), dynamic=True):
        return graph_store.folder(name, key, {"x": x, "n": 2}, dynamic)

    with torch._inductor.config.patch(fallback_random=not torch._inductor.config.fallback_random):
        patched = folder()
    assert folder() == folder() != patched
    assert folder() != folder(key=("other",)) and folder() != folder(name="other")
    assert folder() == folder(x=torch.zeros(5, 2)) != folder(x=torch.zeros(3, 4, dtype=torch.float64))
    assert folder() != folder(x=torch.zeros(12))
    assert folder(dynamic=False) != folder(x=torch.zeros(5, 2), dynamic=False)


def test_the_vector_instruction_sets_are_probed_once_per_machine_and_probed_again_where_a_probe_refused_one(
        tmp_path, monkeypatch):
    """``vector_isa``: a process with no record probes as inductor does and records the list; a later process (its
    probes forgotten, as a new one has them) takes the record without a probe, and picks the same; a record the
    CPU's own list does not match (a probe refused one there) makes the probes again and is written anew."""
    from torch._inductor import cpu_vec_isa

    probes = []
    real = cpu_vec_isa.VecISA.check_build
    monkeypatch.setattr(cpu_vec_isa.VecISA, "check_build",
                        lambda self, code: probes.append(str(self)) or real(self, code))

    def new_process():
        cpu_vec_isa.valid_vec_isa_list.cache_clear()
        cpu_vec_isa.VecISA._VecISA__bool__impl.cache_clear()

    new_process()
    picked = graph_store.vector_isa(tmp_path)
    probed = list(map(str, cpu_vec_isa.valid_vec_isa_list()))
    (record,) = tmp_path.glob("isa-*.txt")
    assert picked == str(cpu_vec_isa.pick_vec_isa()) and record.read_text().split() == probed
    reported = cpu_vec_isa.x86_isa_checker()
    if "avx2" in reported:  # (a CPU that reports one probes it: the first call did)
        assert probes
    made = len(probes)
    new_process()
    assert graph_store.vector_isa(tmp_path) == picked and len(probes) == made
    assert list(map(str, cpu_vec_isa.valid_vec_isa_list())) == probed
    record.write_text("\n".join([*probed, "amx_tile_refused"]))
    new_process()
    assert graph_store.vector_isa(tmp_path) == picked and record.read_text().split() == probed
    if "avx2" in reported:
        assert len(probes) > made
    new_process()


def _entry(guard_type: str, value, name="L['phase']._links[1][1].apply", is_global=False):
    from torch._dynamo.types import GuardFilterEntry

    return GuardFilterEntry(name=name, has_value=True, value=value, guard_type=guard_type, derived_guard_types=(),
                            is_global=is_global, orig_guard=None)


def test_a_modules_identity_and_a_library_functions_are_left_out_a_users_function_kept():
    from gradwise.core import ahead

    def users_own(x):
        return x

    assert ahead.left_out(_entry("MODULE_MATCH", sys.modules[__name__], "G['__import_tests']", True), {})
    assert ahead.left_out(_entry("CLOSURE_MATCH", gradwise.Transform.apply), {})
    assert ahead.left_out(_entry("FUNCTION_MATCH", torch.add), {})
    assert not ahead.left_out(_entry("CLOSURE_MATCH", users_own), {})
    assert not ahead.left_out(_entry("TYPE_MATCH", gradwise.Transform), {})


def test_sgds_graph_is_stored(store, monkeypatch):
    """SGD with momentum reaches a library method through a link's class (a closure guard torch cannot write):
    left out, its graph is stored and loaded like any other."""
    first = _params()
    _steps(gradwise.SGD(first, lr=1e-2, momentum=0.9, compile=True), first)
    assert len(stored(store)) == 1
    _no_compiling(monkeypatch)
    second = _params()
    _steps(gradwise.SGD(second, lr=1e-2, momentum=0.9, compile=True), second)
    assert all(torch.equal(a, b) for a, b in zip(first, second))


def test_an_encoded_step_is_stored_and_loaded_to_the_same_bits(store, monkeypatch):
    """``int8`` state's graphs (a run's step, ``CompiledCodedStep``) are stored and loaded like the float32 step's,
    and ``compile_stats`` counts them."""
    def run() -> tuple[list[torch.Tensor], dict]:
        gen = torch.Generator().manual_seed(0)
        params = [torch.nn.Parameter(torch.randn(4096, generator=gen))]
        optimizer = gradwise.AdamW(params, lr=1e-2, state=gradwise.StatePolicy("int8", min_numel=0), compile=True)
        _steps(optimizer, params, steps=3)
        tensors = [p.detach().clone() for p in params] + list(optimizer.state[params[0]].values())
        return tensors, optimizer.compile_stats

    first, stats = run()
    assert stats["compiles"] >= 1 and stats["loaded"] == 0 and len(stored(store)) == stats["compiles"]
    _no_compiling(monkeypatch)
    second, again = run()
    assert again["compiles"] == again["loaded"] == stats["compiles"]
    assert all(torch.equal(a, b) for a, b in zip(first, second))
