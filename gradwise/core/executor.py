"""Running a chain over a bucket of parameters: the eager reference path and the compiled path.

Eager: the chain's list code runs once over the whole bucket. Compiled: ``torch.compile`` turns the
chain into one fused loop that reads grad, param and state once and writes param and state once; for
an elementwise chain it is compiled for 1-D tensors of symbolic length, so one compilation serves
every parameter of the bucket whatever its shape, and nothing is allocated per step.
Hyperparameters arrive as 0-d tensors, so changing them never recompiles.
"""
from __future__ import annotations

import time
import types
from typing import Any, Callable, Mapping

import torch
from torch import Tensor
from torch._dynamo.decorators import mark_unbacked

from gradwise.core.transform import Context, Transform, state_dtype


def run_chain(
    transform: Transform,
    params: list[Tensor],
    grads: list[Tensor],
    state: Mapping[str, list[Tensor]],
    steps: list[Tensor],
    hyper: Mapping[str, Any],
    static: Mapping[str, Any],
) -> None:
    """One optimizer step over aligned lists: ``p <- p + chain(g)``; mutates params, state and steps."""
    for step in steps:
        step.add_(1)
    maximize = static["maximize"]
    updates = [(-g if maximize else g).to(state_dtype(p)) for p, g in zip(params, grads)]
    ctx = Context(params, grads, steps, hyper, static)
    updates = transform.update(updates, state, ctx)
    for p, u in zip(params, updates):
        p.add_(u)


def _step_one(transform, param, grad, state, step, hyper, static):
    run_chain(transform, [param], [grad], {k: [v] for k, v in state.items()}, [step], hyper, static)


class CompiledStep:
    """``torch.compile`` of one parameter's step, with its own dynamo cache, counted and timed.

    Each instance compiles a private copy of the step function, so optimizers never share (or
    exhaust) one recompile budget. ``compiles`` counts graph compilations and ``compile_seconds``
    adds up the wall time of the calls that compiled (tracing, code generation and that first run).
    """

    def __init__(self, transform: Transform):
        self.transform = transform
        self.compiles = 0
        self.compile_seconds = 0.0
        self.done = 0
        fn = _private_copy(_step_one)
        self._flatten = transform.elementwise
        self._compiled = torch.compile(fn, backend=self._backend, dynamic=self._flatten, fullgraph=True)

    def _backend(self, gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
        from torch._inductor.compile_fx import compile_fx

        self.compiles += 1
        return compile_fx(gm, example_inputs)

    def __call__(self, params, grads, state, steps, hyper, static) -> int:
        """Step every parameter; returns how many were stepped (``done`` tells, if a compile fails)."""
        self.done = 0
        for i, (p, g, step) in enumerate(zip(params, grads, steps)):
            own = {k: v[i] for k, v in state.items()}
            if self._flatten and _flattenable(p, g, own):
                own = {k: _flat_alias(v) if v.shape == p.shape else v for k, v in own.items()}
                p, g = _flat_alias(p), _flat_alias(g)
            before = self.compiles
            start = time.perf_counter()
            self._compiled(self.transform, p, g, own, step, hyper, static)
            if self.compiles != before:
                self.compile_seconds += time.perf_counter() - start
            self.done = i + 1
        return self.done


def _flattenable(p: Tensor, g: Tensor, state: Mapping[str, Tensor]) -> bool:
    """True when param, grad and every param-shaped state buffer are dense runs of memory laid out
    alike (contiguous, or permuted the same way), so elementwise math can treat them as 1-D."""
    if not _dense(p):
        return False
    return g.stride() == p.stride() and all(v.stride() == p.stride() for v in state.values() if v.shape == p.shape)


def _dense(t: Tensor) -> bool:
    """True when ``t`` covers exactly ``numel`` consecutive elements of its storage, in some dim order."""
    expected = 1
    for stride, size in sorted((st, sz) for st, sz in zip(t.stride(), t.shape) if sz != 1):
        if stride != expected:
            return False
        expected *= size
    return True


def _flat_alias(t: Tensor) -> Tensor:
    """A 1-D tensor over the same memory as the dense tensor ``t``, in memory order.

    Not a view (``t.view(-1)``): a view carries its ``_base``, and dynamo guards on the base's shape,
    which would recompile for every parameter shape instead of once per rank.
    """
    flat = t.new_empty(0).set_(t.untyped_storage(), t.storage_offset(), (t.numel(),), (1,))
    mark_unbacked(flat, 0)  # sizes 0 and 1 must not compile graphs of their own
    return flat


def _private_copy(fn: types.FunctionType) -> types.FunctionType:
    code = fn.__code__.replace(co_name=f"{fn.__name__}_{id(object())}")
    return types.FunctionType(code, fn.__globals__, code.co_name, fn.__defaults__, fn.__closure__)
