"""Compiled graphs called without dynamo's frame hook (``GuardedGraphs``).

A function made by ``torch.compile`` pays dynamo's entry at every call before its graph runs: its wrapper, and the
frame hook that looks the call's frame up among the compiled entries of the function's code object, evaluating
their guards (on small tensors, several times what the graph itself takes: ``bench/overhead.py --rows "gradwise
compiled"``). ``GuardedGraphs`` calls dynamo the usual way the first time for each kind of call: dynamo traces,
compiles (or loads the graph from inductor's caches) and keeps an entry, its transformed code and its guard
manager. From then on a call evaluates those entries' guards itself, in the same C++ guard manager, and runs the
transformed code of the first entry whose guards pass as a plain function: the same guards, the same code, without
the hook and the wrapper around them. Where none passes, dynamo is called again (it recompiles, or past its
recompile limit refuses it, as a ``fullgraph`` compile does). A caller with several calls to make checks them all
before it runs the first (``ready``): between two large graphs the guards' objects have left the CPU's caches.
While dynamo may trace, its duck shapes are off (equal lengths today need not be equal tomorrow).

The entries are read with ``torch._dynamo.eval_frame._debug_get_cache_entry_list``; on a torch without it, every
call goes through dynamo.

A caller that names a ``store`` (the optimizers' compiled steps do) gets its graphs from disk instead
(``core/graph_store.py``): a graph stored by an earlier call or process whose guards pass is loaded, without
tracing; else the graph is compiled with ``aot_compile`` (the same tracing, guards and backend, as one serializable
object) and stored. The kept entry is then that graph's guard manager and transformed code, as above. Where
``aot_compile`` fails (a guard torch cannot write), dynamo's own path compiles it; a graph keeping a guard on a
user's global is not stored (torch rebuilds such a guard at load from the module as it is then), only kept. Past
dynamo's recompile limit a call is refused here too.

Two costs of each call are not compiled in. Dynamo guards every global the traced code reached: gradwise's own
modules, functions and classes, torch's, the builtins, ``dataclasses`` (about half the guards of an AdamW graph).
Those do not change while a process runs, so a guard rooted at one of them is left out (``library_global``; a
module-level setting of gradwise is read when a graph is compiled); a global of any other module (a transform of a
user's own) keeps its guard. Left out too (``left_out``): a module's identity (a module is found by its name) and
a library function's reached through a link's class (its inherited ``apply``). And dynamo's pre-graph code marks its
span for the profiler with two calls around it at every call, left out (``record_runtime_overhead``): a profile
shows that span as part of the graph call.

A Python float the graph is called with (a chain's static hyperparameters: Ranger21's ``beta_softplus``) is compiled
in as a constant (``specialize_float``), where dynamo's default makes it a 0-d float64 input that the generated loop
loads and converts at every vector. Such a float is static by contract (the executor compiles a graph per set of
static values), so its guard recompiles nothing that would not be compiled anyway; the values that change between
steps reach the graph packed in a tensor.
"""
from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import re
import time
import types
from collections.abc import Callable, Hashable, Iterator
from typing import Any

import torch
from torch.fx.experimental import _config as fx_config

from gradwise.core import graph_store

logger = logging.getLogger("gradwise")
_cache_entries = getattr(torch._dynamo.eval_frame, "_debug_get_cache_entry_list", None)

#: top-level packages whose globals keep no guards (module docstring)
LIBRARY_PACKAGES = frozenset({"gradwise", "torch", "builtins", "dataclasses"})
_GLOBAL_ROOT = re.compile(r"G\['([^']+)'\]")


def library_global(entry, fn_globals: dict[str, Any]) -> bool:
    """Whether a guard (a ``torch.compile`` guard filter's entry) is rooted at a global of ``LIBRARY_PACKAGES``: a
    module (dynamo names the modules it imports ``__import_...``), or a class or function defined in one, as found
    in the traced function's globals; dynamo's copies of the builtins' dict count as ``builtins``."""
    match = _GLOBAL_ROOT.match(entry.name) if entry.is_global else None
    if match is None:
        return False
    name = match.group(1)
    if name.startswith("__builtins_dict"):
        return True
    root = fn_globals.get(name)
    module = root.__name__ if isinstance(root, types.ModuleType) else getattr(root, "__module__", None)
    return isinstance(module, str) and module.partition(".")[0] in LIBRARY_PACKAGES


def _library_object(value: Any) -> bool:
    module = getattr(value, "__module__", None)
    return isinstance(module, str) and module.partition(".")[0] in LIBRARY_PACKAGES


def left_out(entry, fn_globals: dict[str, Any]) -> bool:
    """Whether ``GuardedGraphs`` leaves a guard out: one rooted at a library global (``library_global``), a module's
    identity (a module is found by its name), or the identity of a library function reached another way (a link's
    inherited method, through its class)."""
    if library_global(entry, fn_globals) or entry.guard_type == "MODULE_MATCH":
        return True
    return entry.guard_type in ("CLOSURE_MATCH", "FUNCTION_MATCH") and entry.has_value and _library_object(entry.value)


@contextlib.contextmanager
def _tracing() -> Iterator[None]:
    """The settings dynamo traces with here: no duck shapes, no profiler marks, Python floats as constants."""
    saved, fx_config.use_duck_shape = fx_config.use_duck_shape, False
    try:
        with torch._dynamo.config.patch(record_runtime_overhead=False, specialize_float=True):
            yield
    finally:
        fx_config.use_duck_shape = saved


class GuardedGraphs:
    """``fn`` compiled with ``backend`` (``fullgraph=True``, ``dynamic`` as given), and the entries dynamo compiled
    for it kept per key (what the caller knows decides the graph: the phase, counts, dtypes, layout) with their
    guards. ``fn`` must have a code object of its own (``executor.private_copy``): dynamo keeps its entries, and
    counts its recompiles, by code object."""

    #: False makes every call go through dynamo, as on a torch that does not show its entries
    ahead = True

    def __init__(self, fn: Callable, backend: Callable, dynamic: bool, store: str | None = None):
        self._fn = fn
        self._store, self._dynamic = store, dynamic
        #: graphs compiled by ``backend`` or loaded from the store; of them, loaded
        self.compiles = self.loaded = 0

        def counted(gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
            self.compiles += 1
            return backend(gm, example_inputs)

        #: whether the last compile kept a guard on a global (read at load from the module as it is then: not stored)
        self._global_guards = False

        def kept(entries: list) -> list[bool]:
            keep = [not left_out(entry, fn.__globals__) for entry in entries]
            self._global_guards = any(k and entry.is_global for k, entry in zip(keep, entries))
            return keep

        self._compiled = torch.compile(fn, backend=counted, dynamic=dynamic, fullgraph=True,
                                       options={"guard_filter_fn": kept})
        self._defaults = {name: p.default for name, p in inspect.signature(fn).parameters.items()
                          if p.default is not inspect.Parameter.empty}
        self._graphs: dict[Hashable, list[tuple[Any, Callable]]] = {}

    def __call__(self, key: Hashable, args: dict[str, Any]) -> Any:
        """``fn(**args)``: by a kept entry for ``key`` whose guards ``args`` pass, else by one from the store (when
        the caller named one), else through dynamo."""
        frame = {**self._defaults, **args}  # the frame's locals, as the guards read them
        run = self._passing(key, frame)
        if run is not None:
            return run(**frame)
        if self._store is not None and self.ahead and _cache_entries is not None and graph_store.enabled():
            run = self._from_store(key, args, frame)
            if run is not None:
                return run(**frame)
        with _tracing():
            result = self._compiled(**args)
        if self.ahead and _cache_entries is not None:
            self._keep(key, frame)
        return result

    def ready(self, key: Hashable, args: dict[str, Any]) -> Callable[[], Any] | None:
        """``fn(**args)`` as a call of no arguments, by a kept entry for ``key`` whose guards ``args`` pass now (None
        where none does: ``__call__`` then compiles or loads one). For a caller that checks several calls' guards
        before it runs the first (``CompiledStep.run_prepared``): a graph's run leaves the guards' objects out of
        the CPU's caches, where the next check would find them again, one memory access at a time."""
        frame = {**self._defaults, **args}
        run = self._passing(key, frame)
        return None if run is None else functools.partial(run, **frame)

    def _passing(self, key: Hashable, frame: dict[str, Any]) -> Callable | None:
        """The transformed code of the first kept entry for ``key`` whose guards ``frame`` passes, or None."""
        for guards, run in self._graphs.get(key, ()):
            if guards.check(frame):
                return run
        return None

    def _from_store(self, key: Hashable, args: dict[str, Any], frame: dict[str, Any]) -> Callable | None:
        """A graph for this call from the disk store (``core/graph_store.py``), kept for ``key``: loaded, else
        compiled ahead of time and written there. None where ``aot_compile`` fails (dynamo's own path then compiles
        it, or raises what it raised). Past dynamo's recompile limit, refused as dynamo refuses it."""
        limit = torch._dynamo.config.recompile_limit
        if sum(map(len, self._graphs.values())) >= limit:
            raise torch._dynamo.exc.FailOnRecompileLimitHit(
                f"{self._fn.__name__}: {limit} graphs already (torch._dynamo.config.recompile_limit)")
        where = graph_store.folder(self._store, key, frame, self._dynamic)
        entry = graph_store.load(where, self._fn.__globals__, frame)
        if entry is not None:
            self.compiles += 1
            self.loaded += 1
        else:
            before = self.compiles
            try:
                with _tracing():
                    compiled = self._compiled.aot_compile(((), args))
            except Exception as error:
                logger.debug("aot_compile of %s failed (%s); compiling through dynamo", self._fn.__name__, error)
                self.compiles = before
                return None
            if not self._global_guards:
                graph_store.save(where, compiled)
            entry = graph_store.guards_and_code(compiled)
        self._graphs.setdefault(key, []).append(entry)
        return entry[1]

    def _keep(self, key: Hashable, frame: dict[str, Any]) -> None:
        """Keep the entry dynamo ran ``frame`` by (none, where it ran the function eagerly): its guard manager and
        its code as a function of the globals dynamo put its graph in (``fn``'s, which the guards read too)."""
        kept = self._graphs.setdefault(key, [])
        for entry in _cache_entries(self._fn.__code__):
            if all(guards is not entry.guard_manager for guards, _ in kept) and entry.guard_manager.check(frame):
                code = entry.code
                kept.append((entry.guard_manager, types.FunctionType(code, self._fn.__globals__, code.co_name)))
                return


class CountsGraphs:
    """For an owner of a ``GuardedGraphs`` (``self._graphs``): its counts, and the seconds of the calls that compiled
    or loaded a graph (``compile_seconds``, which the owner sets to 0.0), each logged."""

    _graphs: GuardedGraphs
    compile_seconds: float

    @property
    def compiles(self) -> int:
        """Graphs compiled (or loaded from the disk store: ``core/graph_store.py``)."""
        return self._graphs.compiles

    @property
    def loaded(self) -> int:
        """Of ``compiles``, the graphs loaded from the disk store."""
        return self._graphs.loaded

    def _marks(self) -> tuple[int, int, float]:
        """The counts and the time before a call, for ``_counted``."""
        return self.compiles, self.loaded, time.perf_counter()

    def _counted(self, marks: tuple[int, int, float], what: str, *args: Any) -> None:
        """After a call begun at ``marks``: where it compiled or loaded a graph, add its seconds to
        ``compile_seconds`` and log ``what % args`` with them."""
        compiles, loaded, start = marks
        if self.compiles != compiles:
            seconds = time.perf_counter() - start
            self.compile_seconds += seconds
            logger.info("%s " + what + " in %.2f s", "loaded" if self.loaded != loaded else "compiled", *args, seconds)
