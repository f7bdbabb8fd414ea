"""The steady step: the last step's buckets run again, when nothing that decided them has changed.

A training loop calls ``step()`` with the same groups, the same parameters holding gradients and the same
state every time; only the gradients are new tensors and a schedule sets ``lr``. The general step
(``core/stepping.py``) works all of that out again each time: it checks every group and parameter
(``state_check.check_step``), buckets the parameters, looks their state up, resolves each group's chain and
plan, and builds the lists each kernel takes. On a small model that Python is most of the step.

``SteadyStep`` keeps what a step of plain state (no encoded, sharded, complex or stochastically rounded
parameter) and one phase built (``Steady``: per bucket its parameters, state dicts, the lists of each state
buffer, the eager batches or the compiled step) and, at the next step, runs it again after checking, before
any write, everything that could have made the general step do otherwise:

- the same param groups (the same objects), each with the same parameters holding gradients, in order, and
  the same transform (a group's chain is resolved from its static hyperparameters, ``Transform.for_group``);
- every hyperparameter, checked where it changed (``check_hyperparameters``) with the same static values,
  and the engine options a wrapper may put back into a group;
- every parameter shaped, typed and placed as its state was checked for, every gradient dense and alike
  (and, compiled, strided as before, every parameter and state tensor in the memory the compiled calls were
  prepared for: ``CompiledStep.prepare``);
- the same state: the same ``optimizer.state`` (``load_state_dict`` makes a new one), the same dict and the
  same tensor under every key, for every parameter, and no step counter written since (a tensor's
  ``_version`` counts its in-place writes: reading them needs no ``int()``, no device sync).

Anything else, and the general step runs (and, where it refuses, raises its error). So a step here is the
general step's arithmetic, in the same order on the same lists: bit for bit the same result. An exception
raised while it runs puts back the counters and the 0-d state ``advance`` wrote, as the general step does.
``Optimizer.steady_steps = False`` turns it off.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from gradwise.core import lists
from gradwise.core.buckets import Bucket, roll_back
from gradwise.core.eager import EAGER_CHUNK, in_one_call, run_eager
from gradwise.core.executor import CompiledStep, run_chain
from gradwise.core.hyper_check import check_hyperparameters
from gradwise.core.namespaces import Namespaced, strip_namespace
from gradwise.core.options import check_group_options
from gradwise.core.params import DTensor
from gradwise.core.phases import Phase
from gradwise.core.rounding import rounds_stochastically
from gradwise.core.stepping import PhasedStep
from gradwise.core.storage import PlainStorage
from gradwise.core.transform import advance_plan

_VERSION = operator.attrgetter("_version")  # a tensor's count of in-place writes
_STRIDE = Tensor.stride
_DATA_PTR = Tensor.data_ptr
_SHAPE = operator.attrgetter("shape")


@dataclass
class SteadyBucket:
    """One bucket of the last step, as the next one runs it again."""

    group: dict[str, Any]
    slot: tuple  # the ``ConstantBuffers`` slot of its packed constants
    dtype: Any  # theirs (``_prepare``'s: float64 for float64 state, else float32)
    chain: Any
    phase: Phase
    params: list[Tensor]
    states: list[dict[str, Tensor]]
    #: every key's tensors, in ``params`` order (``step`` first)
    buffers: dict[str, list[Tensor]]
    own: list[dict[str, Tensor]]
    hyper: dict[str, Any]
    static: dict[str, Any]
    count: int  # the step counters' value after the last step
    #: the counters stacked, holding their values after the last step, and each one's element of it (``count_up``);
    #: None where they differ in dtype or device
    counters: tuple[Tensor, list[Tensor]] | None
    #: each counter's ``_version`` after the last step (an in-place write to one, as a roll back's, changes it)
    versions: list[int]
    #: each parameter's (shape, dtype, device) then: its state was checked for them
    layouts: list[tuple]
    runner: CompiledStep | None
    #: compiled: the parameters its graphs take (``accepts``; the others, as tensors of one element, run eagerly)
    chosen: list[int]
    #: compiled: the calls ``runner.prepare`` made of the chosen parameters, valid while ``memory`` is the same
    calls: list[tuple] | None
    #: compiled: every parameter and its state tensors, their ``memory_of`` then and the gradients' strides: what
    #: ``accepts`` and the prepared calls read of them
    tensors: list[Tensor] | None
    memory: tuple[list[int], list[tuple], list[tuple]] | None
    grad_strides: list[tuple] | None
    #: eager, small parameters: the ``(start, stop, state lists)`` of each batch ``run_eager`` would make
    batches: list[tuple[int, int, dict[str, list[Tensor]]]] | None
    #: a link advances 0-d state: the calls ``advance_many`` makes (``advance_plan``: each advancing link and its own
    #: states, taken off each parameter's state but its counter once, ``Namespaced``), as ``(link.advancer(states),
    #: namespace)``: each call adds what a roll back restores; None when none does
    advancing: list[tuple[Any, str]] | None
    #: how many keys each parameter's state had
    sizes: list[int]


@dataclass
class Steady:
    """The last step, as ``SteadyStep`` runs it again."""

    state: Any  # the optimizer's ``state`` mapping then
    transform: Any  # and its transform
    groups: list[tuple[dict[str, Any], list[Tensor]]]
    buckets: list[SteadyBucket]


class SteadyStep(PhasedStep):
    """The general step with the steady one before it, as methods of ``gradwise.Optimizer``."""

    #: run the last step's buckets again when nothing that decided them changed (module docstring)
    steady_steps = True

    def _steady_run(self, work: list[tuple[dict[str, Any], list[Tensor]]]) -> bool:
        """Run ``work`` as the last step's buckets if nothing that decided them changed; False (nothing done)
        when the general step must run."""
        last: Steady | None = self.__dict__.get("_steady")
        if last is None or not self.steady_steps or last.state is not self.state \
                or last.transform is not self.transform or len(work) != len(last.groups):
            return False
        for (group, params), (kept, kept_params) in zip(work, last.groups):
            if group is not kept or len(params) != len(kept_params) or not all(map(operator.is_, params, kept_params)):
                return False
        for index, (group, _) in enumerate(work):
            check_group_options(self, group, index)
        checked = self.__dict__.get("_checked_groups", ())
        if len(checked) != len(self.param_groups):  # (forgotten: the general step checks every value)
            return False
        fresh = [check_hyperparameters(self, group, checked[index]) for index, group in enumerate(self.param_groups)]
        self._checked_groups = fresh  # accepted (a refused value raised): the general step need not check them again
        changed = {id(g) for g, new, old in zip(self.param_groups, fresh, checked) if new is not old}
        if any(new.signature != old.signature for new, old in zip(fresh, checked)):
            return False
        runs = []
        for b in last.buckets:
            hyper, static = (b.hyper, b.static) if id(b.group) not in changed else self._hyper_values(b.group)
            grads = [p.grad for p in b.params]
            # (the same static values resolve to the same chain: ``Transform.for_group`` reads only those)
            if static != b.static or not _same_state(self.state, b) \
                    or list(map(_VERSION, b.buffers["step"])) != b.versions or not _gradients_fit(b, grads) \
                    or self._runner(b.phase) is not b.runner \
                    or (b.runner is not None and (list(map(_STRIDE, grads)) != b.grad_strides
                                                  or memory_of(b.tensors) != b.memory)):
                return False
            runs.append((b, hyper, static, grads))
        done = []
        try:
            for b, hyper, static, grads in runs:
                self._steady_bucket(b, hyper, static, grads, done)
        except BaseException:
            roll_back(self, done)
            raise
        return True

    def _steady_bucket(self, b: SteadyBucket, hyper, static, grads: list[Tensor], done: list[Bucket]) -> None:
        """Prepare and run one bucket as ``_prepare`` and ``_run_phase`` would; ``done`` gets what a roll back
        undoes, before anything is written."""
        steps = b.buffers["step"]
        b.hyper, b.static = hyper, static  # (the values of a group whose hyperparameters changed, for next time)
        scalars = b.chain.scalars(b.group, b.count + 1)
        saved = []  # (the advancers add the 0-d state they write, before they write it)
        done.append(Bucket(b.group, (b.phase,), b.params, b.states, None, (), static, grads, [], saved))
        count_up(b, steps)
        b.count += 1
        b.versions = list(map(_VERSION, steps))
        if b.advancing is not None:
            for advance, namespace in b.advancing:
                advance(b.group, strip_namespace(namespace, scalars), saved)
        values, layout = self._constants.pack(b.slot, hyper, scalars, b.dtype, b.params[0].device)
        if b.runner is not None:  # as ``_run_phase``: the graphs take the chosen parameters, the rest run eagerly
            chosen = b.chosen
            taken = set(chosen)
            eager = [i for i in range(len(b.params)) if i not in taken] if len(chosen) < len(b.params) else []
            try:
                b.runner.run_prepared(b.calls, _pick(chosen, grads)[0], values, layout, static)
            except Exception as error:  # under "auto", a failed compile falls back to eager
                self._fall_back(error)  # (the next step sees no runner, and runs the general step)
                eager += chosen[b.runner.done:]
            if eager:
                run_eager(b.phase, *_pick(eager, b.params, grads, b.own), values, layout, static)
            return
        if b.batches is None:
            run_eager(b.phase, b.params, grads, b.own, values, layout, static)
            return
        for start, stop, state in b.batches:
            run_chain(b.phase, b.params[start:stop], grads[start:stop], state, values, layout, static)

    def _stepped(self, work: list[tuple[dict[str, Any], list[Tensor]]], buckets: list[Bucket]) -> None:
        """Keep the step just run (``buckets``, of ``work``) for the next one, if it can run it again."""
        self._steady = None
        if not self.steady_steps or not isinstance(self.storage, PlainStorage) or not buckets:
            return
        kept = []
        for index, b in enumerate(buckets):
            p = b.params[0]
            if len(b.phases) != 1 or b.sharding is not None or b.keys is not None or isinstance(p, DTensor) \
                    or p.is_complex() or rounds_stochastically(b.static, p.dtype):
                return
            phase = b.phases[0]
            if not phase.last or phase.reducer is not None or phase.moves or phase.owned:
                return
            keys = [k for k in phase.run_state if k in b.states[0]]
            own = [{k: st[k] for k in keys} for st in b.states]
            buffers = {k: [st[k] for st in b.states] for k in ("step", *b.states[0])}
            if any(k not in st for st in b.states for k in buffers):
                return
            runner, chain = self._runner(phase), self.chain_of(b.group)
            advances = self._uses(chain, "advance")
            advancing = [(link.advancer(states), namespace) for link, namespace, states in advance_plan(
                chain, [Namespaced({k: v for k, v in st.items() if k != "step"}) for st in b.states])] \
                if advances else None
            chosen = [] if runner is None else _accepted(runner, b.params, b.inputs, own)
            calls = None if runner is None else runner.prepare(*_pick(chosen, b.params, b.inputs, own))
            tensors = None if runner is None else [t for p, st in zip(b.params, own) for t in (p, *st.values())]
            kept.append(SteadyBucket(b.group, ("steady", index), b.values.dtype, chain, phase, list(b.params),
                                     list(b.states), buffers, own, *self._hyper_values(b.group),
                                     int(b.states[0]["step"]), _stacked(buffers["step"]),
                                     list(map(_VERSION, buffers["step"])),
                                     [(p.shape, p.dtype, p.device) for p in b.params], runner, chosen, calls,
                                     tensors, None if runner is None else memory_of(tensors),
                                     None if runner is None else list(map(_STRIDE, b.inputs)),
                                     None if runner is not None else _batches(phase, b.params, keys, buffers, b.static),
                                     advancing, list(map(len, b.states))))
        self._steady = Steady(self.state, self.transform, [(g, list(ps)) for g, ps in work], kept)


def count_up(b: SteadyBucket, counters: list[Tensor]) -> None:
    """``lists.count_up_(counters)``, the counters of ``b``: its stacked copy of them counted up and copied into each in
    one foreach copy (in the CPU's caches, 34 us for 76 counters against 170 us for one ``add_`` a counter; on a GPU,
    one kernel). The copy holds their values: ``_steady_run`` has found no write to them since the last step's."""
    if b.counters is None:
        lists.count_up_(counters)
        return
    stacked, elements = b.counters
    stacked.add_(1)
    torch._foreach_copy_(counters, elements)


def _stacked(counters: list[Tensor]) -> tuple[Tensor, list[Tensor]] | None:
    """``counters`` stacked, and each one's element of the stack (``count_up``), where they share a dtype and device."""
    if len({(c.dtype, c.device) for c in counters}) != 1:
        return None
    stacked = torch.stack(counters)
    return stacked, list(stacked.unbind())


def _same_state(state, b: SteadyBucket) -> bool:
    """Whether every parameter of ``b`` has the same state dict, holding the same tensor under every key, and as
    many keys (``advancing`` holds them)."""
    if not all(map(operator.is_, map(state.get, b.params), b.states)) or list(map(len, b.states)) != b.sizes:
        return False
    return all(all(map(operator.is_, [st.get(k) for st in b.states], tensors)) for k, tensors in b.buffers.items())


def _gradients_fit(b: SteadyBucket, grads: list[Tensor]) -> bool:
    """Whether each parameter of ``b`` is still shaped, typed and placed as its state was checked for, and its
    gradient dense and alike (as ``check_step`` asks)."""
    for p, g, (shape, dtype, device) in zip(b.params, grads, b.layouts):
        if g is None or g.is_sparse or g.shape != shape or p.shape != shape or g.dtype != dtype \
                or p.dtype != dtype or g.device != device or p.device != device:
            return False
    return True


def memory_of(tensors: list[Tensor]) -> tuple[list[int], list[tuple], list[tuple]]:
    """Where each tensor's memory starts, its shape and its strides: while they stay the same for a bucket's
    parameters and state (and its gradients' strides), ``accepts`` answers as before and the prepared calls' flat
    aliases read the same memory (``p.data = ...`` or an in-place ``set_`` changes them)."""
    return list(map(_DATA_PTR, tensors)), list(map(_SHAPE, tensors)), list(map(_STRIDE, tensors))


def _accepted(runner: CompiledStep, params: list[Tensor], grads: list[Tensor], own: list[dict[str, Tensor]]):
    """The indices of the parameters ``runner``'s graphs take."""
    return [i for i, (p, g, st) in enumerate(zip(params, grads, own)) if runner.accepts(p, g, st)]


def _pick(indices: list[int], *columns: list) -> list[list]:
    """Each column at ``indices`` (the column itself when they are all of it, in order)."""
    whole = len(indices) == len(columns[0])
    return [column if whole else [column[i] for i in indices] for column in columns]


def _batches(phase: Phase, params: list[Tensor], keys: list[str], buffers: dict[str, list[Tensor]], static):
    """The batches ``run_eager`` makes of a bucket (all its parameters, where the phase runs ``in_one_call``; else
    of small parameters, each its own piece, batched until ``EAGER_CHUNK`` elements), as ``(start, stop, state
    lists)``; None when a parameter is not small."""
    if in_one_call(phase, static):
        return [(0, len(params), Namespaced({k: buffers[k] for k in keys}))]
    if not phase.elementwise or not all(0 < p.numel() <= EAGER_CHUNK for p in params):
        return None
    out, start, size = [], 0, 0
    for i, p in enumerate(params):
        size += p.numel()
        if size >= EAGER_CHUNK or i == len(params) - 1:
            out.append((start, i + 1, Namespaced({k: buffers[k][start:i + 1] for k in keys})))
            start, size = i + 1, 0
    return out
