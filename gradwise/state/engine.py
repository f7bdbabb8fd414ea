"""What the optimizer does with encoded state: choose codecs, store fresh buffers, run steps, convert
checkpoints. ``EncodedState`` is the storage (``gradwise.core.storage``'s protocol) that ``state=`` asks
for; the core optimizer calls it through that protocol and knows nothing else."""
from __future__ import annotations

import warnings
import weakref
from collections import Counter
from functools import partial
from itertools import chain as chain_iterables
from typing import Any, Callable, Mapping

import torch
from torch import Tensor

from gradwise.core.collectives import Traffic
from gradwise.core.executor import rounding_rows
from gradwise.core.hashing import seed
from gradwise.core.params import DTensor, local
from gradwise.core.phases import Phase
from gradwise.core.rounding import rounds_stochastically
from gradwise.core.state_keys import MARK, has_buffer, layout, parts_of
from gradwise.core.transform import Transform, state_dtype
from gradwise.state.bf16_pairs import pair_buffers
from gradwise.state.codec import Codec, codec_from
from gradwise.state.fused import CompiledCodedStep, Specs, coded_step, store_pieces
from gradwise.state.joined import Joins, joins
from gradwise.state.policy import StatePolicy, policy_from
from gradwise.state.prepared import Prepared
from gradwise.state.runs import step_run, store_run
from gradwise.state.shards import LocalShard
from gradwise.state.store import local_parts, store, stored_as, take


class EncodedState:
    """The optimizer's state policy at work. ``policy=None`` (no ``state=`` given) still reads and
    converts encoded checkpoints, into plain float32 buffers."""

    def __init__(self, policy: StatePolicy | None, transform: Transform):
        self.policy = policy
        self.transform = transform
        self.nonnegative = frozenset(transform.nonnegative)
        self.weights_like = frozenset(transform.weights_like)
        #: one per phase that runs (chains of routes, phases), and whether it recomputes (``_step``)
        self._compiled: dict[tuple[Phase, bool], CompiledCodedStep] = {}
        self._compiled_runs: dict[tuple[Phase, bool], CompiledCodedStep] = {}  # the same, on runs of flat blocks
        self._specs: dict[tuple, Specs] = {}
        #: each parameter's step in each phase as worked out at its last step, by (phase, id(parameter))
        self._ready: dict[tuple[Phase, int], Prepared] = {}
        #: where the collectives of encoding sharded state are counted (set by the optimizer: its ``traffic``)
        self.traffic: Traffic | None = None

    @classmethod
    def from_argument(cls, state: Any, transform: Transform) -> "EncodedState":
        return cls(policy_from(state), transform)

    def __reduce__(self):
        """A copy keeps the policy and the chain; compiled graphs and cached specs are built afresh."""
        return (EncodedState, (self.policy, self.transform))

    # ------------------------------------------------------------- decisions
    def check(self, param_groups: list[dict[str, Any]]) -> None:
        if self.policy is not None:
            self.policy.check_matches([n for _, n, _ in _named(param_groups)])

    def codec_for(self, p: Tensor, name: str | None) -> Codec | None:
        return None if self.policy is None else self.policy.codec_for(name, p.shape)

    def encodable(self, buffer: str, value: Tensor, p: Tensor) -> bool:
        """Whether a codec may store ``buffer``: floating, shaped like the parameter, not the weights' copy."""
        return value.is_floating_point() and value.shape == p.shape and buffer not in self.weights_like

    # ------------------------------------------------------------- fresh state
    def init(self, state: dict[str, Tensor], fresh: Mapping[str, Tensor], p: Tensor, name: str | None,
             position: int) -> None:
        codec, shard = self.codec_for(p, name), LocalShard.of(p, self.traffic)
        for buffer, value in fresh.items():
            if has_buffer(state, buffer):
                continue
            encode = codec is not None and self.encodable(buffer, value, p)
            # the state of a sharded parameter's whole-tensor links is whole, on its owner (core/owned.py)
            store(state, buffer, value, codec if encode else None, buffer not in self.nonnegative,
                  seed(0, position, buffer), shard if isinstance(value, DTensor) else None)
        pair_buffers(state)

    @staticmethod
    def is_encoded(state: Mapping[str, Tensor]) -> bool:
        return bool(layout(tuple(state))[1])

    def decoded(self, state: Mapping[str, Tensor], p: Tensor) -> dict[str, Tensor]:
        """A parameter's state with every encoded buffer decoded to float, for reading only (the
        Schedule-Free ``set_mode`` reads z to move the parameters between y and x)."""
        plain_keys, encoded = layout(tuple(state))
        buffers = {k: local(state[k]) for k in plain_keys if k != "step"}
        for buffer, tag in encoded:
            signed = buffer not in self.nonnegative
            shard = _shard_of(state, buffer, p, self.traffic)
            buffers[buffer] = codec_from(tag).decode(local_parts(state, buffer, tag),
                                                     p.shape if shard is None else local(p).shape, signed,
                                                     state_dtype(p), shard)
        return buffers

    # ------------------------------------------------------------- the step
    def run(self, phase: Phase, params: list[Tensor], inputs: list[Tensor], states: list[dict[str, Tensor]],
            positions: list[int], values: Tensor, layout_: Any, static: Mapping[str, Any], compiled: bool,
            fall_back: Callable[[Exception], None], outputs: list[Tensor] | None = None) -> list[dict[str, Tensor]]:
        """One phase of the step (``core/phases.py``: the whole chain of these parameters' group, a
        route's own chain under ``route()``, unless it runs in phases) for every parameter in ``params``
        (all with encoded state), one parameter at a time (eagerly, small parameters' runs stacked into one:
        ``gradwise.state.joined``); a batched phase sees a batch of one. Only the
        buffers of the phase are decoded, and only those it writes encoded again. Returns the parts of
        the next phase's reductions. ``fall_back(error)`` is called when a compile fails: it re-raises,
        or the rest runs eagerly. A DTensor parameter steps its local shard eagerly, the same parameter
        on every rank in the same order (``gradwise.state.shards``: encoding it may all-reduce)."""
        parts_out = []

        def step_stacked(key: tuple, run: tuple, seeds: Tensor) -> None:
            reduced, later = step_run(phase, *key[:2], *run, seeds, values, layout_, static)
            store_run(run[3], later)
            parts_out.append(reduced)

        stacked = Joins(phase, step_stacked)  # small parameters' eager runs, stepped together
        # every parameter's step worked out (or its kept one checked) before any steps: the same work as one
        # loop doing both, measured 15-20% faster a step on 100 small parameters (README: "The per-parameter
        # work of an encoded step, apart from its steps")
        grads = [local(g) for g in inputs]
        outs = [None] * len(params) if outputs is None else [local(o) for o in outputs]
        readies = [self._prepared(phase, p, state, position, grad, output)
                   for p, state, position, grad, output in zip(params, states, positions, grads, outs)]
        steps = [int(state["step"]) for state in states]
        planned = []  # each step as (graphs, key, fn, args, small, store what it left), in the parameters' order
        for p, position, grad, output, ready, step, seeds in zip(
                params, positions, grads, outs, readies, steps, _seeds(readies, steps, positions, params)):
            specs, plain, parts = ready.specs, ready.plain, ready.parts
            shard = LocalShard.of(p, self.traffic)
            param_seed = seed(step, position, "param") if rounds_stochastically(static, p.dtype) else None
            if ready.runs is not None:
                # a plain buffer written in the graph keeps the decoded state stored (fused.RECOMPUTE)
                key = (phase, plain.keys().isdisjoint(phase.writes))
                join = not compiled and joins(phase, p, plain, param_seed, output)
                for (start, _, _), run in zip(ready.runs, ready.run_arguments(grad, param_seed, output)):
                    if join:
                        stacked.add((specs, ready.pairs, tuple(plain), run[0].shape[1], p.dtype, p.device), run,
                                    start, seeds)
                        continue
                    planned.append((self._compiled_runs, key, step_run, (specs, ready.pairs, *run, seeds, values,
                                    layout_, static), run[0].numel() < 2, partial(store_run, run[3])))
                continue
            rounding = None if param_seed is None else \
                rounding_rows([param_seed], [0 if shard is None else shard.offset], p.device)
            args = (specs, local(p), grad, plain, parts, seeds, values, layout_, static, rounding, output)
            if shard is not None:  # eagerly: a scale a shard boundary cuts is all-reduced mid-step
                planned.append((None, None, partial(coded_step, shard=shard), args, True, None))
                continue
            planned.append((self._compiled, (phase, False), coded_step, args, p.numel() < 2,
                            partial(store_pieces, parts)))
        # every compiled step's guards checked before the first graph runs (``CompiledStep.run_prepared``)
        checked = [graphs[key].ready(*args) if compiled and not small and key in graphs else None
                   for graphs, key, _, args, small, _ in planned]
        for (graphs, key, fn, args, small, keep), ready in zip(planned, checked):
            if graphs is None:
                parts_out.append(fn(phase, *args)[0])
                continue
            (reduced, later), compiled = self._step(graphs, key, fn, args, compiled, small, fall_back, ready)
            keep(later)
            parts_out.append(reduced)
        stacked.flush()
        return parts_out

    def _step(self, graphs: dict[tuple[Phase, bool], CompiledCodedStep], key: tuple[Phase, bool], fn: Callable,
              args: tuple, compiled: bool, small: bool, fall_back: Callable[[Exception], None],
              ready: Callable[[], Any] | None = None) -> tuple[Any, bool]:
        """``fn(phase, *args)``'s result (``key``: the phase and whether its graph may recompute, as
        ``CompiledCodedStep``'s): compiled (its graph in ``graphs``, of symbolic sizes for ``step_run``'s
        runs; ``ready``: that graph's call, its guards already checked) when ``compiled``, else eagerly, as is a
        ``small`` tensor (a graph of its own would cost a compile for nothing) and the rest after a compile that
        failed; and whether the next call may compile (False after such a failure)."""
        phase, recompute = key
        if compiled and not small:
            if key not in graphs:
                graphs[key] = CompiledCodedStep(phase, fn, dynamic=fn is step_run, recompute=recompute)
            try:
                return (graphs[key](*args) if ready is None else ready()), True
            except Exception as error:
                fall_back(error)
                compiled = False
        return fn(phase, *args), compiled

    def _prepared(self, phase: Phase, p: Tensor, state: dict[str, Tensor], position: int, grad: Tensor,
                  output: Tensor | None) -> Prepared:
        """What this parameter's step in ``phase`` works out from its state: kept from its last step where it
        still fits (``gradwise.state.prepared``), else worked out and kept."""
        kept = self._ready.get((phase, id(p)))
        if kept is not None and kept.fits(p, state, position, grad, output):
            return kept
        keep = not isinstance(p, DTensor)  # (a DTensor's local shard is a new tensor at every step)
        ready = Prepared(phase, self._specs_for, p, state, position, grad, output, keep)
        if keep:
            key = (phase, id(p))
            if key not in self._ready:
                weakref.finalize(p, self._ready.pop, key, None)  # a collected parameter drops its kept steps
            self._ready[key] = ready
        return ready

    def _specs_for(self, encoded: tuple[tuple[str, str], ...]) -> Specs:
        if encoded not in self._specs:
            self._specs[encoded] = tuple((b, codec_from(tag), b not in self.nonnegative) for b, tag in encoded)
        return self._specs[encoded]

    @property
    def compile_stats(self) -> tuple[int, float, int]:
        steps = [*self._compiled.values(), *self._compiled_runs.values()]
        return (sum(c.compiles for c in steps), sum(c.compile_seconds for c in steps), sum(c.loaded for c in steps))

    # ------------------------------------------------------------- checkpoints
    @staticmethod
    def expected_parts(tag: str, shape: torch.Size, signed: bool, param: Tensor | None = None) -> dict[str, Tensor]:
        """The parts (meta tensors) of a buffer of ``shape`` encoded as ``tag``, to check a checkpoint by;
        for a DTensor ``param``, the global shapes of its parts' DTensors."""
        shard = LocalShard.whole(shape) if isinstance(param, DTensor) else None
        return codec_from(tag).empty(shape, signed, torch.device("meta"), shard)

    def after_load(self, optimizer: torch.optim.Optimizer, state_dict: dict[str, Any]) -> None:
        """Put encoded parts back exactly as saved (torch.optim casts floating state to the parameter's
        dtype), then convert every buffer whose stored format differs from this optimizer's policy."""
        self._ready.clear()  # (every state dict is new: no kept step fits, and none keeps the old state alive)
        saved_ids = chain_iterables.from_iterable(g["params"] for g in state_dict["param_groups"])
        conversions: Counter = Counter()
        for saved_id, (p, name, position) in zip(saved_ids, _named(optimizer.param_groups)):
            saved = state_dict["state"].get(saved_id)
            if saved is None:
                continue
            state = optimizer.state[p]
            for key, value in saved.items():
                if MARK in key and isinstance(value, Tensor):
                    state[key] = value.to(device=local(p).device, dtype=value.dtype, copy=True)
            conversions.update(self._convert(state, p, name, position))
            pair_buffers(state)
        if conversions:
            summary = ", ".join(f"{old} -> {new}: {n}" for (old, new), n in sorted(conversions.items()))
            warnings.warn(f"gradwise: load_state_dict converted {sum(conversions.values())} state buffer(s) to this"
                          f" optimizer's state policy ({summary}); the values are re-quantized, so this resume"
                          " is not bit-identical", stacklevel=3)

    def _convert(self, state: dict[str, Tensor], p: Tensor, name: str | None, position: int) -> list[tuple[str, str]]:
        codec = self.codec_for(p, name)
        done = []
        for buffer in self.transform.state:
            if not has_buffer(state, buffer):
                continue
            signed = buffer not in self.nonnegative
            current = stored_as(state, buffer)
            if buffer in state and state[buffer].shape != p.shape:
                continue  # not shaped like the parameter: never encoded
            kept = None if buffer in self.weights_like else codec
            wanted = kept.tag if kept is not None else str(state_dtype(p)).replace("torch.float", "fp")
            if current == wanted:
                continue
            here = _shard_of(state, buffer, p, self.traffic)
            value = take(state, buffer, p.shape, signed, state_dtype(p), here)
            store(state, buffer, value, kept, signed, seed(int(state.get("step", 0)), position, buffer), here)
            done.append((current, wanted))
        return done


def _seeds(readies: list[Prepared], steps: list[int], positions: list[int], params: list[Tensor]) -> list[Tensor]:
    """Each parameter's seeds at this step, one a buffer of its specs (``hashing.seed``), as int64 views of one
    tensor: one tensor made a call, not one a parameter (a few microseconds each), where the parameters share
    a device."""
    rows = [[seed(step, position, b) for b, _, _ in ready.specs]
            for ready, step, position in zip(readies, steps, positions)]
    devices = {p.device for p in params}
    if len(devices) > 1:
        return [torch.tensor(row, dtype=torch.int64, device=p.device) for row, p in zip(rows, params)]
    flat = torch.tensor([s for row in rows for s in row], dtype=torch.int64, device=devices.pop() if devices else None)
    return list(flat.split([len(row) for row in rows]))


def _shard_of(state: Mapping[str, Tensor], buffer: str, p: Tensor, traffic: Traffic | None) -> LocalShard | None:
    """The shard ``buffer`` (plain or encoded) holds: the parameter's, or None for a buffer held whole (a
    plain parameter's, or the state of a sharded parameter's whole-tensor link, on its owner)."""
    values = [state[buffer]] if buffer in state else parts_of(state, buffer, stored_as(state, buffer)).values()
    return LocalShard.of(p, traffic) if any(isinstance(v, DTensor) for v in values) else None


def _named(param_groups: list[dict[str, Any]]):
    """(parameter, name or None, position) over every group, in order."""
    position = 0
    for group in param_groups:
        names = group.get("param_names") or [None] * len(group["params"])
        for p, name in zip(group["params"], names):
            yield p, name, position
            position += 1
