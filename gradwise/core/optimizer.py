"""``gradwise.Optimizer``: a real ``torch.optim.Optimizer`` that runs a chain of transforms.

Param groups hold the hyperparameters under their usual names (``lr``, ``betas``, ``eps``,
``weight_decay``); LR schedulers, hooks, named parameters, ``add_param_group``, ``zero_grad`` and
``step(closure)`` behave as in torch, and ``state_dict()``/``load_state_dict()`` resume bit-identically.
Parameters are bucketed by (group, device, dtype); each bucket runs the whole chain at once, eagerly
or compiled (``compile="auto" | True | False``).
"""
from __future__ import annotations

import inspect
import warnings
from collections import defaultdict
from itertools import chain as chain_iterables
from typing import Any, Iterable

import torch
from torch import Tensor

from gradwise.core.eager import run_eager
from gradwise.core.executor import CompiledStep, pack
from gradwise.core.hyper import Hyper, boolean
from gradwise.core.params import DTensor, any_rank, check_new_group, local, param_label
from gradwise.core.transform import Transform, chain, state_dtype
from gradwise.state.engine import EncodedState
from gradwise.state.store import has_buffer

#: param-group keys that are not hyperparameters but that torch itself puts in groups.
_BOOKKEEPING_KEYS = ("params", "param_names", "initial_lr", "name")
#: ``compile="auto"`` compiles when the optimizer holds at least this many parameter elements.
AUTO_COMPILE_MIN_NUMEL = 1 << 20


class Optimizer(torch.optim.Optimizer):
    """Run ``transform`` as a drop-in ``torch.optim.Optimizer``.

    Args:
        params: parameters, named parameters, or param-group dicts, as for any torch optimizer.
        transform: the chain to run (``gradwise.chain(...)``).
        compile: ``True`` compiles each bucket's step with ``torch.compile``; ``False`` runs eagerly;
            ``"auto"`` compiles when the parameters hold at least ``AUTO_COMPILE_MIN_NUMEL`` elements
            and falls back to eager, with a warning, if compilation fails.
        skip_nonfinite: start the chain with ``skip_nonfinite()``: a step whose gradients hold NaN or
            inf changes nothing and is counted in ``skipped_steps``.
        state: how state buffers shaped like their parameter are stored between steps: ``None`` or
            ``"fp32"`` (as computed), ``"bf16"`` (stochastic rounding), ``"int8"``, ``"int4"``, or a
            ``gradwise.state.StatePolicy`` choosing per parameter. Transforms always see float tensors.
        **hyperparameters: defaults for the hyperparameters the chain declares, plus ``maximize``.
    """

    def __new__(cls, *args: Any, **kwargs: Any):
        # A recipe's own signature lists its keywords; say which are allowed, not just which is not.
        parameters = inspect.signature(cls.__init__).parameters.values()
        if not any(p.kind is p.VAR_KEYWORD for p in parameters):
            allowed = [p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)][1:]
            unknown = [f"{k}={v!r}" for k, v in kwargs.items() if k not in allowed]
            if unknown:
                raise TypeError(f"{cls.__name__}() got unknown keyword argument(s) {', '.join(unknown)};"
                                f" allowed: {allowed}")
        return super().__new__(cls)

    def __init__(
        self,
        params: Iterable[Any],
        transform: Transform,
        *,
        compile: bool | str = "auto",
        skip_nonfinite: bool = False,
        state: Any = None,
        **hyperparameters: Any,
    ):
        if not isinstance(transform, Transform):
            raise TypeError(f"invalid transform={transform!r}: expected a gradwise Transform, e.g. chain(...)")
        if not (isinstance(compile, bool) or (isinstance(compile, str) and compile == "auto")):
            raise ValueError(f"invalid compile={compile!r}: expected 'auto', True or False")
        boolean("skip_nonfinite", skip_nonfinite)
        if skip_nonfinite:
            from gradwise.transforms.nonfinite import skip_nonfinite as guard

            transform = chain(guard(), transform)
        self.transform = transform
        self.hyper_specs: dict[str, Hyper] = {**transform.hyper, "maximize": Hyper(False, boolean, static=True)}
        unknown = sorted(set(hyperparameters) - set(self.hyper_specs))
        if unknown:
            raise TypeError(
                f"unknown hyperparameter(s) {unknown} for {transform!r}; allowed: {sorted(self.hyper_specs)}"
            )
        defaults = {k: spec.default for k, spec in self.hyper_specs.items()}
        defaults.update(hyperparameters)
        for key, value in defaults.items():
            self.hyper_specs[key].validate(key, value)
        self.compile = compile
        self.skipped_steps = 0
        self._use_compiled: bool | None = None if compile == "auto" else compile
        self._compiled: CompiledStep | None = None
        self._encoded = EncodedState.from_argument(state, transform)
        super().__init__(params, defaults)
        self._encoded.check(self.param_groups)
        self.register_state_dict_post_hook(_save_counters)
        self.register_load_state_dict_pre_hook(_load_counters)

    # ----------------------------------------------------------------- groups and validation
    def add_param_group(self, param_group: dict[str, Any]) -> None:
        index = len(getattr(self, "param_groups", []))
        check_new_group(param_group, index)
        _check_disjoint(param_group, index, getattr(self, "param_groups", []))
        unknown = sorted(k for k in param_group if k not in self.hyper_specs and k not in _BOOKKEEPING_KEYS)
        if unknown:
            raise ValueError(
                f"param_groups[{index}] has unknown hyperparameter(s) {unknown}; allowed: {sorted(self.hyper_specs)}"
            )
        for key in self.hyper_specs:
            if key in param_group:
                self.hyper_specs[key].validate(key, param_group[key])
        super().add_param_group(param_group)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        # torch.optim casts floating-point state to its parameter's dtype; 16-bit parameters keep
        # theirs in float32 (``state_dtype``), so put back the saved values, uncast.
        saved_ids = chain_iterables.from_iterable(g["params"] for g in state_dict["param_groups"])
        params = chain_iterables.from_iterable(g["params"] for g in self.param_groups)
        for saved_id, p in zip(saved_ids, params):
            saved = state_dict["state"].get(saved_id)
            if saved is None or state_dtype(p) == p.dtype:
                continue
            for key, value in saved.items():
                if key != "step" and isinstance(value, Tensor) and value.is_floating_point():
                    self.state[p][key] = value.to(device=p.device, dtype=state_dtype(p))
        self._encoded.after_load(self, state_dict)

    def _validate(self, group: dict[str, Any]) -> None:
        for key, spec in self.hyper_specs.items():
            spec.validate(key, group[key])

    # ----------------------------------------------------------------- the step
    @torch.no_grad()
    def step(self, closure=None):
        """Apply one step of the chain to every parameter that has a gradient."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        work = []
        for index, group in enumerate(self.param_groups):
            self._validate(group)
            params = [p for p in group["params"] if p.grad is not None]
            for p in params:
                if p.grad.is_sparse:
                    raise TypeError(
                        f"{param_label(group, p, index)} has a sparse gradient; gradwise optimizers need dense"
                        " gradients (use torch.optim.SparseAdam for sparse embeddings)"
                    )
            work.append((group, params))
        if self._must_skip(work):
            self.skipped_steps += 1
            return loss
        for group, params in work:
            for bucket in _buckets(params):
                self._run_bucket(group, bucket)
        return loss

    def _must_skip(self, work) -> bool:
        grads = [local(p.grad) for _, params in work for p in params]
        flag = self.transform.skip_step(grads) if grads else None
        if any(type(t).skip_step is not Transform.skip_step for _, t in self.transform.links()):
            # each rank of a sharded (DTensor) model checks only its own shards: skip on all or none
            flag = any_rank(flag, [p for group in self.param_groups for p in group["params"]])
        return bool(flag) if flag is not None else False

    def _run_bucket(self, group: dict[str, Any], params: list[Tensor]) -> None:
        states = [self._state_for(p, group) for p in params]
        device = params[0].device
        dtype = torch.float64 if state_dtype(local(params[0])) == torch.float64 else torch.float32
        hyper, static = self._hyper_values(group)
        by_step: dict[int, list[int]] = defaultdict(list)
        for i, st in enumerate(states):
            st["step"] += 1
            by_step[int(st["step"])].append(i)
        advances = any(type(t).advance is not Transform.advance for _, t in self.transform.links())
        for step, members in by_step.items():
            scalars = self.transform.scalars(group, step)
            if advances:
                for i in members:
                    self.transform.advance({k: local(v) for k, v in states[i].items() if k != "step"}, group, scalars)
            values, layout = pack(hyper, scalars, dtype, device)
            self._run([params[i] for i in members], [states[i] for i in members], values, layout, static)

    def _run(self, params, states, values, layout, static) -> None:
        if not self.transform.elementwise and isinstance(params[0], DTensor):
            raise NotImplementedError(
                f"{self.transform!r} needs whole tensors, and gradwise does not yet gather DTensor shards;"
                " use an elementwise recipe (SGD, Adam, AdamW, NAdamW, Lion) with FSDP2"
            )
        encoded = {i for i, s in enumerate(states) if self._encoded.is_encoded(s)}
        if encoded:
            self._encoded.run([params[i] for i in sorted(encoded)], [states[i] for i in sorted(encoded)],
                              [self._position(params[i]) for i in sorted(encoded)], values, layout, static,
                              compiled=self._runner() is not None, fall_back=self._fall_back)
            params = [p for i, p in enumerate(params) if i not in encoded]
            states = [s for i, s in enumerate(states) if i not in encoded]
            if not params:
                return
        keys = [k for k in states[0] if k != "step"]
        views = [local(p) for p in params]
        grads = [local(p.grad) for p in params]
        own = [{k: local(s[k]) for k in keys} for s in states]
        eager = list(range(len(views)))
        runner = self._runner()
        if runner is not None:
            chosen = [i for i in eager if runner.accepts(views[i], grads[i], own[i])]
            compiled = set(chosen)
            eager = [i for i in eager if i not in compiled]
            for n, i in enumerate(chosen):
                try:
                    runner(views[i], grads[i], own[i], values, layout, static)
                except Exception as error:  # under "auto", a failed compile falls back to eager
                    self._fall_back(error)
                    eager += chosen[n:]
                    break
        if eager:
            run_eager(self.transform, [views[i] for i in eager], [grads[i] for i in eager],
                      [own[i] for i in eager], values, layout, static)

    def _fall_back(self, error: Exception) -> None:
        """Under ``compile="auto"``, a failed compile warns and runs eagerly from now on; else re-raise."""
        if self.compile is True or not _is_compile_error(error):
            raise error
        warnings.warn(f"gradwise: torch.compile failed ({error!r}); running eagerly from now on", stacklevel=5)
        self._use_compiled = False

    def _runner(self) -> CompiledStep | None:
        if self._use_compiled is None:
            numel = sum(p.numel() for g in self.param_groups for p in g["params"])
            self._use_compiled = numel >= AUTO_COMPILE_MIN_NUMEL
        if not self._use_compiled:
            return None
        if self._compiled is None:
            self._compiled = CompiledStep(self.transform)
        return self._compiled

    def _state_for(self, p: Tensor, group: dict[str, Any]) -> dict[str, Tensor]:
        state = self.state[p]
        if "step" not in state or any(not has_buffer(state, k) for k in self.transform.state):
            fresh = self.transform.init(torch.view_as_real(p) if p.is_complex() else p, group)
            names = group.get("param_names")
            name = names[next(j for j, q in enumerate(group["params"]) if q is p)] if names else None
            self._encoded.init(state, fresh, p, name, self._position(p))
            state.setdefault("step", torch.zeros((), dtype=torch.float32))  # on the CPU, as in torch.optim
        return state

    def _position(self, p: Tensor) -> int:
        """``p``'s index among all parameters, in group order (seeds stochastic rounding)."""
        count = sum(len(g["params"]) for g in self.param_groups)
        if getattr(self, "_positions", (None, 0))[1] != count:
            self._positions = ({id(q): i for i, q in enumerate(q for g in self.param_groups for q in g["params"])}, count)
        return self._positions[0][id(p)]

    def _hyper_values(self, group: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """The group's numeric hyperparameters (``hyper``) and its Python-valued ones (``static``)."""
        hyper: dict[str, Any] = {}
        static: dict[str, Any] = {}
        for key, spec in self.hyper_specs.items():
            value = group[key]
            if spec.static:
                static[key] = value
                continue
            if spec.zero_is_identity:
                static[f"{key}!=0"] = float(value) != 0.0
            hyper[key] = tuple(map(float, value)) if isinstance(value, (tuple, list)) else float(value)
        return hyper, static

    # ----------------------------------------------------------------- introspection
    @property
    def compile_stats(self) -> dict[str, float]:
        """``{"compiles": n, "seconds": s}``: graphs compiled so far and the wall time they took."""
        compiles, seconds = self._encoded.compile_stats
        if self._compiled is not None:
            compiles, seconds = compiles + self._compiled.compiles, seconds + self._compiled.compile_seconds
        return {"compiles": compiles, "seconds": seconds}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.transform!r}, compile={self.compile!r})"


def _check_disjoint(group: dict[str, Any], index: int, groups: list[dict[str, Any]]) -> None:
    """Reject a parameter that an earlier group already holds, naming both places."""
    owner = {id(p): i for i, g in enumerate(groups) for p in g["params"]}
    for j, item in enumerate(group["params"]):
        name, p = item if isinstance(item, tuple) and len(item) == 2 else (None, item)
        if id(p) in owner:
            label = f"param_groups[{index}]['params'][{j}]" + (f" ({name!r})" if name else "")
            raise ValueError(f"{label} is already in param_groups[{owner[id(p)]}]; a parameter belongs to one group")


def _buckets(params: list[Tensor]) -> list[list[Tensor]]:
    groups: dict[tuple, list[Tensor]] = defaultdict(list)
    for p in params:
        groups[(p.device, p.dtype, type(p))].append(p)
    return list(groups.values())


def _is_compile_error(error: Exception) -> bool:
    return type(error).__module__.startswith(("torch._dynamo", "torch._inductor"))


def _save_counters(optimizer: Optimizer, state_dict: dict[str, Any]) -> dict[str, Any]:
    state_dict["gradwise"] = {"skipped_steps": optimizer.skipped_steps}
    return state_dict


def _load_counters(optimizer: Optimizer, state_dict: dict[str, Any]) -> dict[str, Any]:
    optimizer.skipped_steps = state_dict.get("gradwise", {}).get("skipped_steps", 0)
    return state_dict
