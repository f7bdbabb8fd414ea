"""Graphs compiled ahead of time, called without dynamo's frame hook (``GuardedGraphs``).

A function made by ``torch.compile`` pays dynamo's entry at every call before its graph runs: the wrapper, the
frame hook that finds the frame's cached code and evaluates its guards, then the code that unpacks the arguments
(on small tensors, several times what the graph itself takes: ``bench/overhead.py --rows "gradwise compiled"``).
``torch.compile(fn, fullgraph=True).aot_compile(example)`` (torch 2.9 and later) traces and compiles ``fn`` for
the example and hands back the compiled function with its guards, to be called as a plain function. So:

- a call looks up the graphs compiled for its key (what the caller knows decides the graph: the phase, counts,
  dtypes, layout) and runs the first whose guards its arguments pass, in dynamo's own C++ guard manager, without
  the frame hook around it. The guards are dynamo's (on every tensor's metadata, on the values traced, on the
  globals read: ``aot_compile`` would drop those) but the identity checks it cannot hold (that an object, a
  function or a closure's cell is the very one traced: gradwise's functions and the phase's links, which an
  optimizer keeps for its life);
- where none passes, it compiles another, as dynamo recompiles, up to dynamo's ``recompile_limit`` graphs a key;
  past that it runs ``fn`` as written, eagerly, as dynamo does;
- while it traces, dynamo's duck shapes are off (equal lengths today need not be equal tomorrow), and it traces
  again where dynamo asks to start over;
- on a torch without ``aot_compile``, each call goes through ``torch.compile``'s function as before.

Compiling traces on the arguments' metadata and runs nothing, so a graph that fails to compile has changed
nothing.
"""
from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Hashable
from typing import Any

import torch
from torch.fx.experimental import _config as fx_config

logger = logging.getLogger("gradwise")


class GuardedGraphs:
    """``fn`` compiled with ``backend`` (``fullgraph=True``, ``dynamic`` as given), its graphs kept per key with
    their guards; ``fn`` must have a code object of its own (``executor.private_copy``), as dynamo's caches and
    limits go by code object."""

    #: False makes every call go through ``torch.compile``'s function, as on a torch without ``aot_compile``
    ahead = True

    def __init__(self, fn: Callable, backend: Callable, dynamic: bool):
        self._fn = fn
        # the guards on globals too (``aot_compile`` drops them by default, for graphs written to disk)
        self._compiled = torch.compile(fn, backend=backend, dynamic=dynamic, fullgraph=True,
                                       options={"guard_filter_fn": _kept_guards})
        self._defaults = {name: p.default for name, p in inspect.signature(fn).parameters.items()
                          if p.default is not inspect.Parameter.empty}
        self._graphs: dict[Hashable, list[Any]] = {}

    def __call__(self, key: Hashable, args: dict[str, Any]) -> Any:
        """``fn(**args)``, by a graph compiled for ``key`` whose guards ``args`` pass (compiled now if none does)."""
        if not (self.ahead and hasattr(self._compiled, "aot_compile")):
            with _no_duck_shapes():
                return self._compiled(**args)
        frame = {**self._defaults, **args}  # the frame's locals, as the guards read them
        graphs = self._graphs.setdefault(key, [])
        for graph in graphs:
            if graph._artifacts.guard_manager.check(frame):
                return graph.fn(**args)
        if len(graphs) >= torch._dynamo.config.recompile_limit:
            logger.warning("%d graphs compiled for one key of %s, none taking these inputs: running it eagerly",
                           len(graphs), self._fn.__name__)
            return self._fn(**args)
        graph = self._compile(args)
        graphs.append(graph)
        return graph.fn(**args)


    def _compile(self, args: dict[str, Any]) -> Any:
        """A graph for ``args``. Tracing again where dynamo asks to (it turned a Python number into a tensor and
        must start over; dynamo's own calls do the same), as many times as dynamo allows itself."""
        for attempt in range(_RESTARTS):
            try:
                with _no_duck_shapes():
                    return self._compiled.aot_compile(((), args))
            except torch._dynamo.exc.TensorifyScalarRestartAnalysis:
                if attempt == _RESTARTS - 1:
                    raise


#: how many times a trace may start over (``torch._dynamo.convert_frame`` gives up past 100 attempts)
_RESTARTS = 100


def _kept_guards(entries: list) -> list[bool]:
    """Every guard but those ``aot_compile`` cannot hold (identities of objects, functions, closures' contents)."""
    unheld = torch._dynamo.guards.CheckFunctionManager.UNSUPPORTED_SERIALIZATION_GUARD_TYPES
    return [entry.guard_type not in unheld for entry in entries]


class _no_duck_shapes:
    """Dynamo's duck shapes off, set and put back by hand (``fx_config.patch`` costs several times as much)."""

    def __enter__(self):
        self._saved, fx_config.use_duck_shape = fx_config.use_duck_shape, False

    def __exit__(self, *exc):
        fx_config.use_duck_shape = self._saved
