"""The step engine of ``gradwise.Optimizer``: buckets, phases, reductions, compiled or eager runs.

A step (``_run_step``) first prepares every bucket of parameters (group x device x dtype x step
count): fresh state, step counters, per-step scalars, ``advance``, the packed hyperparameters. It then
runs the phases of each bucket's chain (``core/phases.py``) in rounds: round r runs phase r of every
bucket, the reductions its phases end with are combined over all buckets (``phases.combine``), a guard
may skip the step there, and the totals are appended to the values the next round reads. A chain that
needs no cut is one phase, one pass per bucket, as before phases existed.
"""
from __future__ import annotations

import warnings
from collections import defaultdict
from typing import Any

import torch
from torch import Tensor

from gradwise.core import lists
from gradwise.core.buckets import Bucket, roll_back
from gradwise.core.constants import ConstantBuffers
from gradwise.core.eager import run_eager
from gradwise.core.executor import CompiledStep, rounding_rows, run_chain, unpack, with_totals
from gradwise.core.hashing import seed
from gradwise.core.params import DTensor, local
from gradwise.core.phase_rounds import after_guards, check_rounds, guards
from gradwise.core.phases import Phase, plan, skips
from gradwise.core.rounding import add_stochastically, rounds_stochastically
from gradwise.core.sharded_step import ShardedStep, shard_group
from gradwise.core.sharding import sharding
from gradwise.core.state_check import refuse_nonfinite
from gradwise.core.state_keys import has_buffer
from gradwise.core.storage import PlainStorage
from gradwise.core.transform import Context, state_dtype, uses

#: ``compile="auto"`` compiles when the optimizer holds at least this many parameter elements.
AUTO_COMPILE_MIN_NUMEL = 1 << 20


class PhasedStep(ShardedStep):
    """The step, as methods of ``gradwise.Optimizer`` (which sets ``transform``, ``hyper_specs``,
    ``compile``, ``_use_compiled``, ``_compiled`` and ``storage``)."""

    def _run_step(self, work: list[tuple[dict[str, Any], list[Tensor]]]) -> bool:
        """One step of ``work`` ((group, parameters with gradients) pairs, checked by ``check_step``);
        False when a guard skipped it, which then changed nothing.

        Everything a step can check was checked before its first write. On an exception here the
        counters, the 0-d state ``advance`` wrote and newly created state of every bucket whose last
        phase has not run are put back, so a compile failure (graphs compile on copies first) changes
        nothing. An exception the chain raises once it has written (a bug, Ctrl-C) leaves earlier buckets
        stepped and this bucket's parameters and param-shaped state in part (README)."""
        plans, refusing = self._rounds({id(g): self._plan(g, any(sharding(p) is not None for p in params))
                                        for g, params in work if params})
        buckets: list[Bucket] = []
        try:
            for group, params in work:
                for slot, same in enumerate(_buckets(params)):
                    buckets += self._prepare(group, plans[id(group)], same, slot)
            over = shard_group(buckets)
            for r in range(max((len(b.phases) for b in buckets), default=0)):
                active = [b for b in buckets if r < len(b.phases)]
                parts = {True: [], False: []}
                for b in active:
                    parts[b.sharding is not None] += self._run_phase(b, b.phases[r])
                ops = {k: op for b in active if b.phases[r].reducer
                       for k, op in b.phases[r].reducer[1].reductions.items()}
                if not ops:  # no statistic to total (one all-reduce per op, so none over ranks either)
                    for b in active:
                        b.done = b.phases[r].last
                    continue
                totals = self._totals(ops, parts[False], parts[True], over)
                if refusing and totals and not bool(torch.stack(list(totals.values())).isfinite().all()):
                    refuse_nonfinite(self, work, refusing[0])  # raises: the handler below undoes the step
                if "skip" in ops.values() and skips(ops, totals):  # totals are the same on every rank
                    roll_back(self, buckets)
                    return False
                for b in active:
                    b.done = b.phases[r].last
                    b.values, b.layout = with_totals(b.values, b.layout, totals)
        except BaseException:
            roll_back(self, [b for b in buckets if not b.done])
            raise
        self._stepped(work, buckets)
        return True

    def _stepped(self, work: list[tuple[dict[str, Any], list[Tensor]]], buckets: list[Bucket]) -> None:
        """Called after each step that ran with its buckets (``SteadyStep`` keeps them for the next step)."""

    def _rounds(self, plans: dict[int, tuple[Phase, ...]]) -> tuple[dict[int, tuple[Phase, ...]], list]:
        """The plans as their rounds run them (``after_guards``, checked by ``check_rounds``:
        ``core/phase_rounds.py``) and the links that refuse non-finite values in chains no guard skips, kept for
        the last step's plans (they seldom change)."""
        key = tuple(plans.items())
        kept = self.__dict__.get("_rounds_of")
        if kept is not None and kept[0] == key:
            return kept[1], kept[2]
        rounds = after_guards(plans)
        check_rounds(rounds.values())
        refusing = [t for phases in rounds.values() if not any(guards(ph) for ph in phases)
                    for ph in phases for _, t in ph.links() if t.refuses_nonfinite]
        self._rounds_of = (key, rounds, refusing)
        return rounds, refusing

    def _prepare(self, group: dict[str, Any], phases: tuple[Phase, ...], params: list[Tensor],
                 slot: int = 0) -> list[Bucket]:
        """The buckets of ``params`` (one device, dtype and kind of tensor, the group's ``slot``-th such
        set): state made where missing, counters stepped, each step count's constants packed."""
        transform = self.chain_of(group)
        sharded = sharding(params[0]) is not None  # alike in the set (``_buckets``)
        fresh = {id(p) for p in params if p not in self.state}
        states = self._states_for(params, group, transform, sharded)
        device = params[0].device
        # torch's fused kernels take their numbers as doubles: packed in float64, a kernel's step is torch's
        # (not with a 0-d parameter: a link before the kernel, L2 decay, would make its update float64)
        kernel = self._runs_torch_kernel(phases[-1]) and all(p.dim() for p in params)
        dtype = torch.float64 if kernel or state_dtype(local(params[0])) == torch.float64 else torch.float32
        hyper, static = self._hyper_values(group)
        advances = self._uses(transform, "advance")
        # 0-d state that advance() or a link's prepare() writes is put back by a roll back
        writes_0d = advances or any(ph.reducer and ph.reducer[1].prepares for ph in phases)
        steps = [st["step"] for st in states]
        by_step: dict[int, list[int]] = defaultdict(list)
        for i, count in enumerate(steps):
            by_step[int(count) + 1].append(i)
        try:  # a link may refuse its step's constants (a schedule of the user's own): nothing is changed yet
            scalars_of = {step: transform.scalars(group, step) for step in by_step}
        except BaseException:
            for p in params:
                if id(p) in fresh:
                    self.state.pop(p, None)
            raise
        lists.count_up_(steps)
        constants = self.__dict__.get("_constants")
        if constants is None:  # (not ``setdefault``: that would build, and drop, one every step)
            constants = self._constants = ConstantBuffers()
        out = []
        for ordinal, (step, members) in enumerate(by_step.items()):
            scalars = scalars_of[step]
            whole = len(members) == len(params)
            chosen = params if whole else [params[i] for i in members]
            chosen_states = states if whole else [states[i] for i in members]
            saved = lists.snapshot(lists.scalar_state(chosen_states, sharded)) if writes_0d else []
            if advances:  # the whole bucket in one call (a link may advance it in one op per list)
                transform.advance_many([{k: local(v) if sharded else v for k, v in st.items() if k != "step"}
                                        for st in chosen_states], group, scalars)
            values, layout = constants.pack((id(group), slot, ordinal), hyper, scalars, dtype, device)
            out.append(Bucket(group, phases, chosen, chosen_states, values, layout, static,
                              [p.grad for p in chosen], [p for p in chosen if id(p) in fresh], saved,
                              sharding=[sharding(p) for p in chosen] if sharded else None))
        return out

    def _states_for(self, params: list[Tensor], group: dict[str, Any], transform, sharded: bool
                    ) -> list[dict[str, Tensor]]:
        """Each parameter's state (``_state_for``), looked up directly where it holds every plain buffer."""
        if sharded:
            return [self._state_for(p, group, transform) for p in params]
        keys = self._state_keys(transform)
        out = []
        for p in params:
            state = self.state.get(p)
            out.append(state if state is not None and state.keys() >= keys else self._state_for(p, group, transform))
        return out

    def _state_keys(self, transform) -> frozenset[str]:
        """The plain keys of a parameter's full state under ``transform`` (``step`` with its buffers)."""
        cache = self.__dict__.setdefault("_keys_of", {})
        if transform not in cache:
            cache[transform] = frozenset((*transform.state, "step"))
        return cache[transform]

    def _uses(self, transform, hook: str) -> bool:
        """``uses(transform, hook)``, kept per chain (what a chain declares does not change)."""
        cache = self.__dict__.setdefault("_hooks_of", {})
        key = (transform, hook)
        if key not in cache:
            cache[key] = uses(transform, hook)
        return cache[key]

    def chain_of(self, group: dict[str, Any]):
        """``transform.for_group(group)``, resolved once per group in a step (``step_scope``)."""
        memo = self.__dict__.get("_chains")
        if memo is None:
            return self.transform.for_group(group)
        entry = memo.get(id(group))
        if entry is None or entry[0] is not group:
            entry = memo[id(group)] = (group, self.transform.for_group(group))
        return entry[1]

    def _run_phase(self, bucket: Bucket, phase: Phase) -> list[dict[str, Tensor]]:
        """Run ``phase`` on the bucket; its outputs become the bucket's inputs for the next phase."""
        if not phase.links() and phase.reducer is None:
            return []  # a round this bucket waits out (``after_guards``)
        if phase.owned and bucket.sharding is not None:
            return self._run_owned(bucket, phase)
        if phase.moves:
            self._move_point(bucket, phase)
            return []
        params, states, inputs = bucket.params, bucket.states, bucket.inputs
        runner = self._runner(phase)
        plain_storage = isinstance(self.storage, PlainStorage)  # it holds nothing encoded
        outputs = None if phase.last or not phase.links() else \
            [torch.empty_like(local(x), dtype=state_dtype(local(p))) if runner is not None or phase.elementwise
             or (not plain_storage and self.storage.is_encoded(st)) else None
             for p, x, st in zip(params, inputs, states)]
        values, layout, static = bucket.values, bucket.layout, bucket.static
        parts: list[dict[str, Tensor]] = []
        encoded = [] if plain_storage else [i for i, s in enumerate(states) if self.storage.is_encoded(s)]
        if encoded:
            parts += self.storage.run(phase, [params[i] for i in encoded], [inputs[i] for i in encoded],
                                       [states[i] for i in encoded], [self._position(bucket.key(i)) for i in encoded],
                                       values, layout, static, compiled=runner is not None, fall_back=self._fall_back,
                                       outputs=None if outputs is None else [outputs[i] for i in encoded])
        skipped = set(encoded)
        plain = [i for i in range(len(params)) if i not in skipped] if encoded else list(range(len(params)))
        seeds = [seed(int(states[i]["step"]), self._position(bucket.key(i)), "param") for i in plain] \
            if phase.last and rounds_stochastically(static, params[0].dtype) else None
        starts = [0] * len(plain) if bucket.sharding is None else [bucket.sharding[i].offset for i in plain]
        keys = [k for k in phase.run_state if k in states[plain[0]]] if plain else []
        if not encoded and not isinstance(params[0], DTensor) and not params[0].is_complex():
            views, given = params, inputs  # what ``local`` gives for every tensor of the bucket
            own = [{k: st[k] for k in keys} for st in states]
        else:
            views = [local(params[i]) for i in plain]
            given = [local(inputs[i]) for i in plain]
            own = [{k: local(states[i][k]) for k in keys} for i in plain]
        if outputs is not None and runner is None and not phase.elementwise and plain:
            # whole tensors, eagerly: the phase's own results are the next phase's inputs, not copied
            kept: list[Tensor] = []
            bucket_state = {k: [o[k] for o in own] for k in keys}
            scratch = self.__dict__.setdefault("_scratch", {})
            buffers = [scratch.setdefault((phase, p), torch.empty_like(x, dtype=state_dtype(v)))
                       for p, x, v in zip((bucket.key(i) for i in plain), given, views)]
            parts.append(run_chain(phase, views, given, bucket_state, values, layout, static, keep=kept,
                                   scratch=buffers))
            for i, u in zip(plain, kept):
                outputs[i] = u
            bucket.inputs = outputs
            return parts
        outs = None if outputs is None else [local(outputs[i]) for i in plain]
        eager = list(range(len(plain)))
        if runner is not None and plain:
            chosen = [i for i in eager if runner.accepts(views[i], given[i], own[i])]
            compiled = set(chosen)
            eager = [i for i in eager if i not in compiled]
            try:
                parts += runner([views[i] for i in chosen], [given[i] for i in chosen], [own[i] for i in chosen],
                                values, layout, static, None if seeds is None else [seeds[i] for i in chosen],
                                None if outs is None else [outs[i] for i in chosen], [starts[i] for i in chosen])
            except Exception as error:  # under "auto", a failed compile falls back to eager
                self._fall_back(error)
                eager += chosen[runner.done:]
        if eager and len(eager) == len(plain):  # all of them, in order: the lists as they are
            parts += run_eager(phase, views, given, own, values, layout, static, seeds, outs, starts)
        elif eager:
            parts += run_eager(phase, [views[i] for i in eager], [given[i] for i in eager], [own[i] for i in eager],
                               values, layout, static, None if seeds is None else [seeds[i] for i in eager],
                               None if outs is None else [outs[i] for i in eager], [starts[i] for i in eager])
        if outputs is not None:
            bucket.inputs = outputs
        return parts

    def _move_point(self, bucket: Bucket, phase: Phase) -> None:
        """Write the bucket's parameters where ``phase``'s links move them (whole tensors, eagerly; a
        bfloat16 parameter with ``param_rounding="stochastic"`` is moved with stochastic rounding)."""
        hyper, scalars, reduced = unpack(bucket.values, bucket.layout)
        views = [local(p) for p in bucket.params]
        ctx = Context(views, [local(x) for x in bucket.inputs], hyper, bucket.static, scalars, reduced)
        state = {k: [local(st[k]) for st in bucket.states] for k in phase.state}
        factors = phase.point_factors([v.to(state_dtype(v)) for v in views], state, ctx)
        stochastic = rounds_stochastically(bucket.static, views[0].dtype)
        for i, (view, factor, st) in enumerate(zip(views, factors, bucket.states)):
            if stochastic:
                row = rounding_rows([seed(int(st["step"]), self._position(bucket.key(i)), "point")], [0], view.device)
                moved = view.to(state_dtype(view))
                add_stochastically(view, moved * factor - moved, row[0, 0], row[0, 1])
            else:
                view.mul_(factor)

    def _plan(self, group: dict[str, Any], sharded: bool = False) -> tuple[Phase, ...]:
        """The phases of the group's chain, made once (compiled graphs are kept per phase); ``sharded``:
        for parameters sharded over ranks."""
        key = (self.chain_of(group), self._compiling(), sharded)
        cache = self.__dict__.setdefault("_plans", {})
        if key not in cache:
            cache[key] = plan(*key)
        return cache[key]

    def _compiling(self) -> bool:
        if self._use_compiled is None:
            numel = sum(p.numel() for g in self.param_groups for p in g["params"])
            self._use_compiled = numel >= AUTO_COMPILE_MIN_NUMEL
        return self._use_compiled

    def _runner(self, phase: Phase) -> CompiledStep | None:
        """The compiled step for the phase; None (run eagerly) when compilation is off, when the phase is
        ``batched`` (matrix preconditioners run over the whole bucket, so that their update can stack
        same-shaped matrices into one batched matmul or eigh), or when it reads whole tensors for a
        later phase (Ranger21's shaping): eagerly it writes its results into buffers kept between steps,
        in fewer passes than a graph per tensor rank with symbolic sizes makes; or when it has no links; or,
        with ``torch_kernels`` (``compile="auto"``, or torch's ``fused=True``), when it ends in torch's fused
        kernel and the parameters are ones it takes (``_kernel_parameters``): on the CPU that kernel outruns
        the phase's graph, and compiles nothing."""
        if not self._compiling() or phase.batched or not (phase.elementwise or phase.last) or not phase.links() \
                or self._runs_torch_kernel(phase):
            return None  # (a phase of no links only reduces the gradients: foreach kernels, no graph)
        if phase not in self._compiled:
            self._compiled[phase] = CompiledStep(phase)
        return self._compiled[phase]

    def _runs_torch_kernel(self, phase: Phase) -> bool:
        """Whether ``phase`` runs eagerly, ending in torch's fused kernel: it ends in a link that names one, the
        optimizer lets it (``torch_kernels``), and the kernels take every parameter (``_kernel_parameters``)."""
        return phase.torch_kernel and self.torch_kernels and self._kernel_parameters()

    def _kernel_parameters(self) -> bool:
        """Whether every parameter is one torch's fused CPU kernels take, in plain state: a CPU float32 or float64
        tensor, not a DTensor (found once, and again when a group is added)."""
        found = self.__dict__.get("_kernels_take")
        if found is None:
            found = self._kernels_take = isinstance(self.storage, PlainStorage) and all(
                p.device.type == "cpu" and p.dtype in lists.FUSED_KERNEL_DTYPES and not isinstance(p, DTensor)
                for g in self.param_groups for p in g["params"])
        return found

    def _fall_back(self, error: Exception) -> None:
        """Under ``compile="auto"``, a failed compile warns and runs eagerly from now on; else re-raise."""
        if self.compile is True or not _is_compile_error(error):
            raise error
        warnings.warn(f"gradwise: torch.compile failed ({error!r}); running eagerly from now on", stacklevel=6)
        self._use_compiled = False

    def _state_for(self, p: Tensor, group: dict[str, Any], transform) -> dict[str, Tensor]:
        """``p``'s state, made (``init``, ``seed``, stored) where it lacks a buffer of ``transform``, the
        group's chain."""
        state = self.state[p]
        sharded = sharding(p) is not None
        keys = self.keys_here(p, group) if sharded else transform.state
        if "step" not in state or any(k not in state and not has_buffer(state, k) for k in keys):
            fresh = self._sharded_init(p, group) if sharded else \
                transform.init(torch.view_as_real(p) if p.is_complex() else p, group)
            transform.seed(fresh, self._position(p))
            names = group.get("param_names")
            name = names[next(j for j, q in enumerate(group["params"]) if q is p)] if names else None
            self.storage.init(state, fresh, p, name, self._position(p))
            state.setdefault("step", torch.zeros((), dtype=torch.float32))  # on the CPU, as in torch.optim
        return state

    def _position(self, p: Tensor) -> int:
        """``p``'s index among all parameters, in group order (seeds stochastic rounding)."""
        count = sum(len(g["params"]) for g in self.param_groups)
        if getattr(self, "_positions", (None, 0))[1] != count:
            ordered = (q for g in self.param_groups for q in g["params"])
            self._positions = ({id(q): i for i, q in enumerate(ordered)}, count)
        return self._positions[0][id(p)]

    def _hyper_values(self, group: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """The group's numeric hyperparameters (``hyper``) and its Python-valued ones (``static``), with the
        engine's ``torch_kernels`` flag (``Optimizer.torch_kernels``): an eager link may then run torch's fused
        kernel of its ops (``Context.torch_kernels``); without it (``compile=False``) it runs its list ops,
        torch's for-loop bits."""
        hyper: dict[str, Any] = {}
        static: dict[str, Any] = {"torch_kernels": self.torch_kernels}
        for key, spec in self.hyper_specs.items():
            value = group[key]
            if spec.static:
                static[key] = value
                continue
            if spec.zero_is_identity:
                static[f"{key}!=0"] = float(value) != 0.0
            hyper[key] = tuple(map(float, value)) if isinstance(value, (tuple, list)) else float(value)
        return hyper, static


def _buckets(params: list[Tensor]) -> list[list[Tensor]]:
    groups: dict[tuple, list[Tensor]] = defaultdict(list)
    for p in params:
        groups[(p.device, p.dtype, type(p), isinstance(p, DTensor) and sharding(p) is not None)].append(p)
    return list(groups.values())


def _is_compile_error(error: Exception) -> bool:
    return type(error).__module__.startswith(("torch._dynamo", "torch._inductor"))
