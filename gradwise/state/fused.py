"""One step of a parameter whose state is encoded: decode, run the chain, encode, in one function.

Eagerly, the function runs as written (one parameter at a time, so the float copies of the state
exist for one parameter only). Compiled, ``torch.compile`` turns it into one graph per chain, codec
layout and parameter rank: dequantization, the update and quantization fuse, and the float state is
never written to memory. Shapes are static (one graph per parameter shape): with dynamic sizes,
inductor indexes the block and rank-1 views modulo symbolic lengths and runs those loops one element
at a time, several times slower than the compiles saved.
"""
from __future__ import annotations

import inspect
from typing import Any, Callable, Mapping

import torch
from torch import Tensor

from gradwise.core.ahead import CountsGraphs, GuardedGraphs
from gradwise.core.executor import private_copy, run_chain
from gradwise.core.phases import Phase
from gradwise.core.transform import state_dtype
from gradwise.state.codec import Codec
from gradwise.state.quantize import write_pieces
from gradwise.state.shards import LocalShard

#: (buffer, codec, signed) for each encoded buffer of a parameter, in a fixed order.
Specs = tuple[tuple[str, Codec, bool], ...]


def coded_step(phase: Phase, specs: Specs, param: Tensor, grad: Tensor, plain: Mapping[str, Tensor],
               parts: Mapping[str, Mapping[str, Tensor]], seeds: Tensor, values: Tensor, layout, static,
               rounding: Tensor | None = None, output: Tensor | None = None, shard: LocalShard | None = None
               ) -> tuple[dict[str, Tensor], dict[str, list]]:
    """One phase of ``p <- p + chain(g)`` (``grad``: the phase's input; ``output``: as ``run_chain``'s)
    with the state in ``specs`` decoded from ``parts``, and the buffers the phase writes encoded back
    (``rounding``: as ``run_chain``'s, for a bfloat16 parameter written stochastically; ``shard``: a
    DTensor parameter's, whose local shard ``param`` is). Returns the parts of the next phase's
    reductions, and the pieces of the buffers left to store (``Codec.encode_pieces``: a block codec's whole
    blocks and short last block, which written in the step would be a select between the two over the whole
    buffer, as new tensors) for ``store_pieces``."""
    state = dict(plain)
    dtype = state_dtype(param)
    for buffer, codec, signed in specs:
        state[buffer] = codec.decode(parts[buffer], param.shape, signed, dtype, shard)
    reduced = run_chain(phase, [param], [grad], {k: [v] for k, v in state.items()}, values, layout, static, rounding,
                        None if output is None else [output])
    later = {}
    for i, (buffer, codec, signed) in enumerate(specs):
        if buffer in phase.writes:
            pieces = None if shard is not None else codec.encode_pieces(state[buffer], signed, seeds[i])
            if pieces is None:
                codec.encode(state[buffer], parts[buffer], signed, seeds[i], shard)
            else:
                later[buffer] = pieces
    return reduced, later


def store_pieces(parts: Mapping[str, Mapping[str, Tensor]], later: Mapping[str, list]) -> None:
    """Copy what ``coded_step`` left to store (``Codec.encode_pieces``) into the parts."""
    for buffer, pieces in later.items():
        write_pieces(parts[buffer], pieces)


#: Inductor's settings for a graph that ``recompute``s: a value read by several loops is recomputed in
#: each from what it reads, whatever the number of buffers it reads (by default, more than 4 make it a
#: buffer of its own). Its operations still bound it: past inductor's opcount and accumulated-reads
#: thresholds, left as they are, a value is stored.
RECOMPUTE = {"realize_reads_threshold": 1 << 20}
#: Only graphs of at most this many FX operations recompute (AdamW's run with fp8 state: 53), so that a long,
#: many-branched chain cannot inline without bound.
RECOMPUTE_OPS = 150


class CompiledCodedStep(CountsGraphs):
    """``torch.compile`` of ``coded_step`` (or of ``fn``, called with the phase first, as
    ``gradwise.state.runs.step_run`` with ``dynamic=True``), private to one optimizer, with its compiles
    counted, its graphs called without dynamo's frame hook once compiled (``GuardedGraphs``).
    ``recompute``: graphs of at most ``RECOMPUTE_OPS`` operations compile with ``RECOMPUTE`` (a run's
    step: the decoded state is recomputed in the pass that reduces a block's new scale and in the one
    that encodes it and updates the parameter, where by default it is stored, a float32 copy written to
    memory and read back by each loop). The settings, and the full-width loads of 8-bit codes
    (``gradwise.state.byte_loads``), are patched around this compile only; inductor's size asserts are off, as
    for the float step (``core/executor.py``): dynamo's guards have checked every input. The engine
    does not recompute a graph that writes a plain state buffer (Schedule-Free's z): read and
    overwritten in the one loop, it makes torch 2.13's fusion of that loop fail, as in-place codes do
    (``gradwise.state.runs``)."""

    def __init__(self, phase: Phase, fn: Callable = coded_step, dynamic: bool = False, recompute: bool = False):
        self.phase = phase
        self.recompute = recompute
        self.compile_seconds = 0.0
        self._names = tuple(inspect.signature(fn).parameters)
        self._graphs = GuardedGraphs(private_copy(fn), self._backend, dynamic,
                                     store=f"{fn.__module__}.{fn.__qualname__}, recompute={recompute}")

    def _backend(self, gm: torch.fx.GraphModule, example_inputs: list):
        from torch._inductor import config
        from torch._inductor.compile_fx import compile_fx

        from gradwise.state.byte_loads import full_width_byte_loads

        operations = sum(node.op == "call_function" for node in gm.graph.nodes)
        settings = RECOMPUTE if self.recompute and operations <= RECOMPUTE_OPS else {}
        with config.patch(settings), full_width_byte_loads():
            return compile_fx(gm, example_inputs, config_patches={"size_asserts": False})

    def ready(self, *args: Any) -> Callable[[], Any] | None:
        """``self(*args)`` as a call of no arguments where a graph compiled or loaded before takes them (its guards
        checked now: ``GuardedGraphs.ready``), else None."""
        return self._graphs.ready(None, dict(zip(self._names, (self.phase, *args))))

    def __call__(self, *args: Any) -> Any:
        marks = self._marks()
        reduced = self._graphs(None, dict(zip(self._names, (self.phase, *args))))
        self._counted(marks, "%r with encoded state", self.phase)
        return reduced
