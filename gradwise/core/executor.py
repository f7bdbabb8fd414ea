"""Running a chain: ``run_chain`` (one step over aligned lists, the math as written) and the
compiled path, ``CompiledStep``. (The eager path, ``eager.py``, calls ``run_chain`` on pieces.)

Compiled: ``torch.compile`` turns the chain into one fused loop per parameter that reads grad, param
and state once and writes param and state once, allocating nothing per step. An elementwise chain is
compiled for flat 1-D tensors of symbolic length, ``GROUP`` of them per call, a short group padded
with two-element copies: one graph serves every parameter whatever its shape. Hyperparameters and
per-step scalars arrive packed in one tensor, so changing them never recompiles.
"""
from __future__ import annotations

import types
import weakref
from typing import Any, Callable, Mapping

import torch
from torch import Tensor

from gradwise.core import lists
from gradwise.core.ahead import CountsGraphs, GuardedGraphs
from gradwise.core.namespaces import Namespaced
from gradwise.core.phases import Phase
from gradwise.core.rounding import add_stochastically
from gradwise.core.transform import Context, state_dtype

Layout = tuple[tuple[str, str, int], ...]


def flatten(hyper: Mapping[str, Any], scalars: Mapping[str, float]) -> tuple[Layout, list[float]]:
    """The layout and the numbers of the one 1-D tensor that carries all numeric hyperparameters and per-step
    scalars (``ConstantBuffers.pack``, ``core/constants.py``): one tensor (one host-to-device copy, one guard)
    instead of a dozen 0-d tensors, as the compiled step's call overhead is paid per parameter."""
    layout, flat = [], []
    for kind, entries in (("hyper", hyper), ("scalar", scalars)):
        for name, value in entries.items():
            if isinstance(value, (tuple, list)):
                layout.append((kind, name, len(value)))
                flat.extend(float(v) for v in value)
            else:
                layout.append((kind, name, 0))
                flat.append(float(value))
    return tuple(layout), flat


def with_totals(values: Tensor, layout: Layout, totals: Mapping[str, Tensor]) -> tuple[Tensor, Layout]:
    """``values`` and its layout with a step's reduction totals (0-d tensors) appended, on the device:
    nothing waits for them, and changing them never recompiles."""
    if not totals:
        return values, layout
    appended = torch.stack([t.to(device=values.device, dtype=values.dtype) for t in totals.values()])
    return torch.cat([values, appended]), layout + tuple(("reduced", name, 0) for name in totals)


def unpack(values: Tensor, layout: Layout) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """The inverse of ``ConstantBuffers.pack`` and ``with_totals``: ``(hyper, scalars, reduced)`` dicts of 0-d tensors
    (tuples for tuple entries); for a buffer that ``keep_unpacked`` remembers, its views made once."""
    if not torch.compiler.is_compiling():
        kept = _UNPACKED.get(id(values))
        if kept is not None and kept[0] is values and kept[1] == layout:
            return kept[2]
    compiling = torch.compiler.is_compiling()
    out: dict[str, dict[str, Any]] = {"hyper": {}, "scalar": {} if compiling else Namespaced(), "reduced": {}}
    # eagerly, one call for every 0-d view instead of one indexing per entry (traced: the indexing)
    entries = values if compiling else values.unbind()
    i = 0
    for kind, name, width in layout:
        if width:
            out[kind][name] = tuple(entries[i + j] for j in range(width))
            i += width
        else:
            out[kind][name] = entries[i]
            i += 1
    return out["hyper"], out["scalar"], out["reduced"]


#: id of a buffer rewritten in place every step (``core/constants.py``) -> (it, its layout, its unpacked views)
_UNPACKED: dict[int, tuple[Tensor, Layout, tuple]] = {}


def keep_unpacked(values: Tensor, layout: Layout) -> None:
    """Remember ``unpack(values, layout)`` until ``forget_unpacked(values)``: the views read what the
    buffer holds at each step, so they are made once."""
    result = unpack(values, layout)
    _UNPACKED[id(values)] = (values, layout, result)


def forget_unpacked(values: Tensor) -> None:
    """Drop what ``keep_unpacked`` remembers of ``values``."""
    kept = _UNPACKED.get(id(values))
    if kept is not None and kept[0] is values:
        del _UNPACKED[id(values)]


def run_chain(
    phase: Phase,
    params: list[Tensor],
    inputs: list[Tensor],
    state: Mapping[str, list[Tensor]],
    values: Tensor,
    layout: Layout,
    static: Mapping[str, Any],
    rounding: Tensor | None = None,
    outputs: list[Tensor] | None = None,
    keep: list[Tensor] | None = None,
    scratch: list[Tensor] | None = None,
    once: list[Tensor] | None = None,
) -> dict[str, Tensor]:
    """One phase of an optimizer step over aligned lists; mutates state, and the params (the last
    phase: ``p <- p + phase(g)``) or ``outputs`` (an earlier one: the update so far, for the next
    phase; or, eagerly, ``keep``, which gets the update tensors themselves, which the phase's last link
    may have written into ``scratch``: ``Context.out``). ``inputs`` are the
    gradients, or the previous phase's outputs. Returns the parts of the next phase's reductions, from
    this phase's output (``Phase.partials``).

    ``rounding`` (int64, one row (seed, first element's index) per parameter) is given when the
    parameters are bfloat16 and written with stochastic rounding (``gradwise.core.rounding``). ``once`` gets what
    the links compute once per call (``Context.once``), for a compiled caller to return."""
    hyper, scalars, reduced = unpack(values, layout)
    negate = static["maximize"] and phase.reads_grads
    updates = [_as(-g if negate else g, state_dtype(p)) for p, g in zip(params, inputs)]
    ctx = Context(params, inputs, hyper, static, scalars, reduced, scratch, once)
    if phase.last and rounding is None and all(p.dtype == u.dtype for p, u in zip(params, updates)):
        phase.apply(updates, state, ctx)  # its links write the parameters (a last phase has no reducer)
        return {}
    updates = phase.update(updates, state, ctx)
    parts = phase.partials(updates, state, ctx)
    if not phase.last:
        if keep is not None:
            keep.extend(updates)
        elif outputs is not None:  # an empty phase (a reduction of the gradients) passes them on as they are
            for out, u in zip(outputs, updates):
                out.copy_(u)
        return parts
    if rounding is None:  # parameters below the update's precision: the float32 update, rounded once
        lists.add_(params, updates)
        return parts
    for i, (p, u) in enumerate(zip(params, updates)):
        add_stochastically(p, u, rounding[i, 0], rounding[i, 1])
    return parts


def run_chain_once(phase: Phase, params: list[Tensor], inputs: list[Tensor], state: Mapping[str, list[Tensor]],
                   values: Tensor, layout: Layout, static: Mapping[str, Any], rounding: Tensor | None = None,
                   outputs: list[Tensor] | None = None) -> tuple[dict[str, Tensor], list[Tensor]]:
    """``run_chain``, and what its links computed once per call (``Context.once``): the function ``CompiledStep``
    compiles, whose graph returns them, so that inductor computes them into buffers before the loop. (Its
    arguments are named, not ``**``: ``GuardedGraphs`` checks a kept graph's guards on them as the frame's locals.)"""
    once: list[Tensor] = []
    return run_chain(phase, params, inputs, state, values, layout, static, rounding, outputs, once=once), once


def _as(t: Tensor, dtype: torch.dtype) -> Tensor:
    """``t.to(dtype)``, without the call when it has that dtype (a microsecond a tensor on small models)."""
    return t if t.dtype == dtype else t.to(dtype)


def rounding_rows(seeds: list[int], starts: list[int], device) -> Tensor:
    """``run_chain``'s ``rounding`` argument: one row (seed, index of the first element) per tensor."""
    return torch.tensor([[s, o] for s, o in zip(seeds, starts)], dtype=torch.int64, device=device)


#: parameters per compiled call: one dynamo call's overhead (tens of microseconds) is shared by this many.
GROUP = 8


class CompiledStep(CountsGraphs):
    """``torch.compile`` of one phase of the chain's step, with its own dynamo cache, counted and timed.

    An elementwise phase is compiled for flat 1-D tensors of symbolic length, ``GROUP`` parameters
    per call (each its own length), the last call's short group padded with throwaway two-element
    copies (``pad``): one graph serves every parameter whatever its shape, and each graph costs
    seconds of C++ compilation. A phase whose output feeds a reduction is not padded (a copy's update
    would count in the statistic): its remainder runs one parameter at a time, a second graph. Other
    chains are compiled one parameter at a time for its shape. A steady step (``core/steady.py``) runs
    the same calls step after step: ``prepare`` makes their arguments once and ``run_prepared`` adds the
    new gradients, where a call otherwise aliases, pads and gathers every tensor again.
    Each instance compiles a private copy of the step function, so optimizers never share (or
    exhaust) one recompile budget. ``compiles`` counts graphs compiled (or loaded from the disk store:
    ``core/graph_store.py``) and ``compile_seconds`` adds up the wall time of the calls that compiled (tracing,
    code generation and that first run).
    """

    def __init__(self, phase: Phase):
        self.phase = phase
        self.compile_seconds = 0.0
        self.done = 0
        self._compiled_for: set[tuple] = set()
        self._flatten = phase.elementwise
        self._aliases: dict[int, tuple[weakref.ref, Tensor]] = {}
        # symbolic sizes: an elementwise chain compiles once for 1-D tensors of any length, any other chain
        # once per tensor rank (static shapes would compile once per shape and hit dynamo's recompile limit)
        self._graphs = GuardedGraphs(private_copy(run_chain_once), self._backend, dynamic=True,
                                     store="executor.run_chain_once")

    def _backend(self, gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
        """Inductor, without its size asserts: dynamo's guards have checked every input's sizes and strides before
        the graph runs, and checking them again costs a call per tensor at every graph call."""
        from torch._inductor.compile_fx import compile_fx

        return compile_fx(gm, example_inputs, config_patches={"size_asserts": False})

    def _flat(self, t: Tensor) -> Tensor:
        """``flat_alias(t)``, cached for the tensors that live across steps (params and state) while they live (a
        tensor that is its own alias is not kept: the cache would keep it alive)."""
        key = id(t)
        entry = self._aliases.get(key)
        if (entry is not None and entry[0]() is t and entry[1].data_ptr() == t.data_ptr()
                and entry[1].numel() == t.numel()):
            return entry[1]
        flat = flat_alias(t)
        if flat is not t:
            self._aliases[key] = (weakref.ref(t, lambda _, key=key: self._aliases.pop(key, None)), flat)
        return flat

    def accepts(self, p: Tensor, g: Tensor, state: Mapping[str, Tensor]) -> bool:
        """Whether this parameter runs compiled. Tensors of fewer than two elements run eagerly (a
        graph of their own would cost a compile for nothing), and so does an elementwise chain's
        parameter whose memory is not one dense run shared by its grad and state."""
        if p.numel() < 2:
            return False
        return not self._flatten or flattenable(p, g, state)

    def __call__(self, params, inputs, states, values: Tensor, layout, static, seeds=None,
                 outputs=None, starts=None) -> list[dict[str, Tensor]]:
        """Run the phase on the parameters (``accepts`` must have said yes to each) and return the
        parts of the next phase's reductions, one dict per call. ``done`` counts the parameters run, so
        that a caller can finish the rest eagerly if a compilation fails. ``seeds``, one per parameter,
        are the stochastic-rounding seeds of bfloat16 parameters (else None), ``starts`` the logical index
        of each one's first element (a shard's offset; 0 when None); ``outputs``: as ``run_chain``'s."""
        self.done = 0
        parts = []
        for n, padding in self._batches(len(params)):
            batch = slice(self.done, self.done + n)
            first = [0] * n if starts is None else starts[batch]
            extra = [0] * padding  # the padding's seeds and starts (its writes are thrown away)
            rounding = None if seeds is None else rounding_rows(seeds[batch] + extra, first + extra, params[0].device)
            parts.append(self._call(params[batch], inputs[batch], states[batch], values, layout, static, rounding,
                                    None if outputs is None else outputs[batch], padding))
            self.done += n
        return parts

    def prepare(self, params, grads, states) -> list[tuple]:
        """The calls ``__call__`` would make on these parameters (``accepts`` said yes to each, no rounding, no
        outputs), each ``(start, stop, params, state lists, padding gradients)`` with its parameters and state
        made flat and padded once, for ``run_prepared`` at every steady step (``core/steady.py``): only the
        gradients are new. Valid while the tensors keep their memory and layout, which the caller checks."""
        calls, done = [], 0
        for n, padding in self._batches(len(params)):
            batch = slice(done, done + n)
            args = self._arguments(params[batch], grads[batch], states[batch], None, padding)
            calls.append((done, done + n, args[0], self._state_lists(args[2]), args[1][n:]))
            done += n
        return calls

    def run_prepared(self, calls: list[tuple], grads: list[Tensor], values: Tensor, layout, static) -> None:
        """Run the calls ``prepare`` made with this step's gradients; ``done`` counts as in ``__call__``. Every
        call's arguments are made and its guards checked (``GuardedGraphs.ready``) before the first graph runs: a
        large parameter's graph streams its tensors through the CPU's caches, and checked after it, the next
        call's guards read their objects from memory (121 us a call on the 25m set, against 1.3 us in cache)."""
        self.done = 0
        planned = []
        for start, stop, params, state, padding in calls:
            given = grads[start:stop]
            if self._flatten:
                given = [flat_alias(g) for g in given] + padding
            args = self._arguments_of(params, given, state, values, layout, static, None, None)
            planned.append((stop, args, self._graphs.ready(self._key(args), args)))
        for stop, args, ready in planned:
            if ready is None:
                self._run(args)
            else:
                ready()
            self.done = stop

    def _batches(self, count: int) -> list[tuple[int, int]]:
        """``(parameters, padding)`` of each call over ``count`` parameters, in order."""
        size = GROUP if self._flatten else 1
        padded = self._flatten and self.phase.reducer is None
        out = []
        while count:
            n = size if count >= size else count if padded else 1
            out.append((n, size - n if padded else 0))
            count -= n
        return out

    def _arguments(self, params, grads, states, outputs, padding: int):
        """One call's ``(params, grads, states, outputs)`` as the graph takes them: an elementwise phase's flat
        aliases, padded; else a ``Parameter`` as a plain tensor (dynamo keeps a Parameter's sizes static, and
        they would pin the grad's and state's too)."""
        if not self._flatten:
            return ([p.new_empty(0).set_(p.untyped_storage(), p.storage_offset(), p.shape, p.stride())
                     if isinstance(p, torch.nn.Parameter) else p for p in params], grads, states, outputs)
        states = [{k: self._flat(v) if v.shape == p.shape else v for k, v in st.items()}
                  for p, st in zip(params, states)]
        params, grads = [self._flat(p) for p in params], [flat_alias(g) for g in grads]
        outputs = None if outputs is None else [flat_alias(o) for o in outputs]
        if padding:
            return pad(params, grads, states, outputs, padding)
        return params, grads, states, outputs

    def _state_lists(self, states: list[dict[str, Tensor]]) -> dict[str, list[Tensor]]:
        """Each state key's tensors, a list per key. 0-d state goes in as shape (1,): inductor (torch 2.13, CPU)
        drops writes to 0-d float64 inputs, should a transform ever write one in update() (``Transform.advance``
        is the place)."""
        return {k: [self._flat(st[k]) if st[k].dim() == 0 else st[k] for st in states] for k in states[0]}

    def _call(self, params, grads, states, values, layout, static, rounding, outputs, padding=0) -> dict[str, Tensor]:
        params, grads, states, outputs = self._arguments(params, grads, states, outputs, padding)
        return self._run(self._arguments_of(params, grads, self._state_lists(states), values, layout, static, rounding,
                                            outputs))

    def _arguments_of(self, params, grads, state, values, layout, static, rounding, outputs) -> dict[str, Any]:
        """The graph's arguments, by name."""
        return {"phase": self.phase, "params": params, "inputs": grads, "state": state, "values": values,
                "layout": layout, "static": static, "rounding": rounding, "outputs": outputs}

    @staticmethod
    def _key(args: dict[str, Any]) -> tuple:
        """What decides a call's graph, as ``GuardedGraphs`` keys it."""
        params = args["params"]
        return (len(params), params[0].dtype, params[0].device, args["layout"],
                tuple(sorted(args["static"].items())), tuple(args["state"]))

    def _run(self, args: dict[str, Any]) -> dict[str, Tensor]:
        """One graph call on arguments as the graph takes them (``_arguments_of``), compiling first if none takes
        them."""
        key, params = self._key(args), args["params"]
        marks = self._marks()
        if key not in self._compiled_for:
            # compile on copies first: a graph that fails to compile then changes nothing
            self._graphs(key, self._stand_ins(args))
            self._compiled_for.add(key)
        parts, _ = self._graphs(key, args)
        self._counted(marks, "%r for %d %s tensors on %s", self.phase, len(params), params[0].dtype, params[0].device)
        return parts

    def _stand_ins(self, args: dict[str, Any]) -> dict[str, Any]:
        """``args`` with copies of the tensors, for a graph's first call: a graph that fails to compile then changes
        nothing. An elementwise phase's graph takes flat tensors of any length of two or more (dynamo
        specializes 0 and 1), so its copies are each tensor's first two elements (the graph's inputs too, so that
        no copy is a view): compiling then copies nothing of a large parameter, where whole copies added the group's
        parameters and state to the first step's peak memory (463 MB on the 124m set). Another chain's graph is
        compiled for its tensors' shapes (a transform may branch on them): its copies are whole."""
        params = args["params"]

        def copies(ts: list[Tensor]) -> list[Tensor]:
            return [two_element_copy(t, p) if self._flatten else t.clone() for t, p in zip(ts, params)]

        return {**args, "params": copies(params), "inputs": copies(args["inputs"]),
                "state": {k: copies(vs) for k, vs in args["state"].items()},
                "outputs": None if args["outputs"] is None else copies(args["outputs"])}


def pad(params: list[Tensor], grads: list[Tensor], states: list[dict[str, Tensor]], outputs: list[Tensor] | None,
        count: int) -> tuple[list[Tensor], list[Tensor], list[dict[str, Tensor]], list[Tensor] | None]:
    """The flat tensors of a short group followed by ``count`` throwaway copies of the last parameter's
    first two elements (and its other state whole), so that the group's graph runs it: two elements, as
    dynamo specializes lengths 0 and 1. What the copies write is thrown away."""
    p, g, st = params[-1], grads[-1], states[-1]
    twin = {k: two_element_copy(v, p) for k, v in st.items()}
    copies = [{k: v.clone() for k, v in twin.items()} for _ in range(count)]
    return (params + [p[:2].clone() for _ in range(count)], grads + [g[:2].clone() for _ in range(count)],
            states + copies, None if outputs is None else outputs + [outputs[-1][:2].clone() for _ in range(count)])


def two_element_copy(t: Tensor, p: Tensor) -> Tensor:
    """A copy of the flat tensor ``t``'s first two elements where it is shaped as its flat parameter ``p`` (a
    parameter, its gradient or a state buffer of it), else of all of ``t`` (other state)."""
    return t[:2].clone() if t.shape == p.shape else t.clone()


def flattenable(p: Tensor, g: Tensor, state: Mapping[str, Tensor]) -> bool:
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


def flat_alias(t: Tensor) -> Tensor:
    """A 1-D tensor over the same memory as the dense tensor ``t``, in memory order: ``t`` itself where it is one
    already (a plain tensor, not a Parameter, whose sizes dynamo would keep static; 1-D, dense, not a view, needing
    no grad: most of a model's gradients are biases and norms' weights), else a new one.

    Not a view (``t.view(-1)``): a view carries its ``_base``, and dynamo guards on the base's shape,
    which would recompile for every parameter shape instead of once per rank.
    """
    if type(t) is Tensor and t.dim() == 1 and t._base is None and t.stride(0) == 1 and not t.requires_grad:
        return t
    return t.new_empty(0).set_(t.untyped_storage(), t.storage_offset(), (t.numel(),), (1,))


def private_copy(fn: types.FunctionType) -> types.FunctionType:
    """``fn`` with a code object (and name) of its own: dynamo keys its caches and recompile limit by code
    object, so each compiled step that compiles a private copy has its own budget."""
    code = fn.__code__.replace(co_name=f"{fn.__name__}_{id(object())}")
    return types.FunctionType(code, fn.__globals__, code.co_name, fn.__defaults__, fn.__closure__)
