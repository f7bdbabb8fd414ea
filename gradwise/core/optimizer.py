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
from typing import Any, Iterable

import torch
from torch import Tensor

from gradwise.core.executor import CompiledStep
from gradwise.core.hyper import Hyper, boolean, likely_misspelling
from gradwise.core.options import bound_arguments, check_group_options, engine_options, without_options
from gradwise.core.params import check_disjoint, check_new_group, local
from gradwise.core.phases import Phase
from gradwise.core.rounding import check_rounding
from gradwise.core.split_groups import split_groups
from gradwise.core.state_check import (
    BOOKKEEPING_KEYS,
    check_step,
    checked_load,
    group_defaults,
    load_counters,
    put_back_uncast,
    save_counters,
)
from gradwise.core.steady import SteadyStep
from gradwise.core.storage import optimizers_taking_state, storage_for
from gradwise.core.torch_checkpoint import from_torch, is_torch_format, to_torch
from gradwise.core.transform import Transform, chain

#: attributes a copy rebuilds instead of copying (compiled graphs, caches)
_REBUILT = ("_compiled", "_positions", "_plans", "_scratch", "_checked_groups", "_constants", "_chains", "_keys_of",
            "_hooks_of", "_expected_state", "_group_specs", "_rounds_of", "_steady", "_kernels_take")


class Optimizer(SteadyStep, torch.optim.Optimizer):
    """Run ``transform`` as a drop-in ``torch.optim.Optimizer``.

    Args:
        params: parameters, named parameters, or param-group dicts, as for any torch optimizer.
        transform: the chain to run (``gradwise.chain(...)``).
        compile: ``True`` compiles each bucket's step with ``torch.compile``; ``False`` runs eagerly;
            ``"auto"`` compiles when the parameters hold at least ``AUTO_COMPILE_MIN_NUMEL`` elements
            and falls back to eager, with a warning, if compilation fails; eagerly it lets a link run torch's
            fused kernel of its ops (Adam's: ``torch._fused_adamw_``), which ``False`` never does
            (``torch_kernels``).
        skip_nonfinite: start the chain with ``skip_nonfinite()``: a step whose gradients hold NaN or
            inf changes nothing and is counted in ``skipped_steps``.
        state: how state buffers shaped like their parameter are stored between steps: ``None`` or
            ``"fp32"`` (as computed), ``"bf16"`` (stochastic rounding), ``"int8"``, ``"int4"``, or a
            ``gradwise.state.StatePolicy`` choosing per parameter. Transforms always see float tensors.
        **hyperparameters: defaults for the hyperparameters the chain declares, plus ``maximize`` and
            ``param_rounding``: ``"nearest"`` (as ``p.add_(u)``) or ``"stochastic"``, which writes
            bfloat16 parameters with unbiased stochastic rounding (``gradwise.core.rounding``).
    """

    def __new__(cls, *args: Any, **kwargs: Any):
        # A recipe's own signature lists its keywords; say which are allowed, not just which is not.
        parameters = inspect.signature(cls.__init__).parameters.values()
        if not any(p.kind is p.VAR_KEYWORD for p in parameters):
            allowed = [p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)][1:]
            unknown = [f"{k}={v!r}" for k, v in kwargs.items() if k not in allowed]
            if "state" in kwargs and "state" not in allowed and kwargs["state"] is not None:
                raise state_refused(cls, kwargs["state"], getattr(cls, "state_refusal", None), "no state= at all")
            if unknown:
                raise TypeError(f"{cls.__name__}() got unknown keyword argument(s) {', '.join(unknown)};"
                                f" allowed: {allowed}")
        instance = super().__new__(cls)
        arguments = bound_arguments(cls, args, kwargs)  # None when unpickled or copied (no arguments)
        if arguments is not None:
            instance._constructor_arguments = arguments  # sorted into engine_options by __init__
        return instance

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
        self.hyper_specs: dict[str, Hyper] = {**transform.hyper, "maximize": Hyper(False, boolean, static=True),
                                              "param_rounding": Hyper("nearest", check_rounding, static=True)}
        #: constructor keywords that are not hyperparameters, as given (``core/options.py``)
        self.engine_options = engine_options(self.__dict__.pop("_constructor_arguments", None), self.hyper_specs)
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
        #: whether a step ending in a link that names torch's fused kernel of its ops runs that kernel on
        #: CPU float parameters instead of a graph or list ops: under ``compile="auto"``, and in a recipe
        #: given torch's ``fused=True`` (``gradwise.core.torch_flags``)
        self.torch_kernels = compile == "auto"
        self.skipped_steps = 0
        self.mode = "train"
        self._use_compiled: bool | None = None if compile == "auto" else compile
        self._compiled: dict[Phase, CompiledStep] = {}  # one per phase that runs (of each route's chain)
        self.storage = storage_for(state, transform)  # where state buffers live: float32, or encoded
        self.storage.traffic = self.traffic  # what encoding sharded state sends is this optimizer's traffic
        reason = getattr(type(self), "state_refusal", None) if self.storage.policy is not None else None
        if reason:
            raise state_refused(type(self), state, reason)
        super().__init__(params, defaults)
        self.storage.check(self.param_groups)
        self.register_state_dict_post_hook(save_counters)
        self.register_load_state_dict_pre_hook(load_counters)

    @classmethod
    def split_groups(cls, params: Iterable[Any], *args: Any, **kwargs: Any) -> list[dict[str, Any]]:
        """The param groups ``cls(params, *args, **kwargs)`` keeps, already split (one per route, or
        per kind of block) and tagged, for ``ZeroRedundancyOptimizer``, which needs every rank's optimizer
        to keep the groups it was given (``core/split_groups.py``)."""
        return split_groups(cls, params, *args, **kwargs)

    # ----------------------------------------------------------------- copies
    def __getstate__(self) -> dict[str, Any]:
        """What ``copy.deepcopy`` and ``pickle`` keep: torch's defaults, state and param groups, and all
        that makes this optimizer step as it does (transform, hyper_specs, mode, skipped_steps, compile,
        a recipe's own settings, the storage's policy). Left behind, as torch leaves them: the hooks (ours
        are registered again); and what is rebuilt on first use: compiled graphs and cached positions."""
        return {k: v for k, v in self.__dict__.items() if k not in _REBUILT and not k.startswith("_optimizer_")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        had_flag = "differentiable" in (state.get("defaults") or self.__dict__.get("defaults", {}))
        super().__setstate__(state)  # torch's load_state_dict puts state and param_groups back through here too
        if not had_flag:  # torch's __setstate__ adds it to defaults; gradwise has no such hyperparameter
            self.defaults.pop("differentiable", None)
        if "transform" not in state:
            return
        self.__dict__.setdefault("torch_kernels", self.compile == "auto")  # pickled before it was kept
        self._compiled = {}
        self.register_state_dict_post_hook(save_counters)
        self.register_load_state_dict_pre_hook(load_counters)

    # ----------------------------------------------------------------- groups and validation
    def add_param_group(self, param_group: dict[str, Any]) -> None:
        index = len(getattr(self, "param_groups", []))
        check_new_group(param_group, index)
        # an engine option repeated in a group (ZeroRedundancyOptimizer copies every keyword into its
        # groups) is accepted at the value the optimizer was built with, and kept out of the group
        check_group_options(self, param_group, index)
        param_group = without_options(self, param_group)
        # keys of the user's own (layer_id, timm's lr_scale) stay in the group, as torch keeps them;
        # one that looks like a misspelt hyperparameter gets a warning
        for key in param_group:
            likely = likely_misspelling(key, self.hyper_specs) if key not in BOOKKEEPING_KEYS else None
            if likely is not None:
                warnings.warn(f"param_groups[{index}] has key {key!r}, which {type(self).__name__} does not read;"
                              f" did you mean {likely!r}? (the group keeps {key!r} as it is)", stacklevel=3)
        for key in self.hyper_specs:
            if key in param_group:
                self.hyper_specs[key].validate(key, param_group[key])
        check_disjoint(param_group, index, getattr(self, "param_groups", []))
        for group in self.transform.split_group(param_group):  # one group, or one per route
            super().add_param_group(group)
            for key, value in group_defaults(self).items():  # with those a recipe keeps out of its defaults
                self.param_groups[-1].setdefault(key, value)
        self.__dict__.pop("_kernels_take", None)  # whether torch's kernels take every parameter: found again

    def state_dict(self, format: str = "gradwise") -> dict[str, Any]:
        """The optimizer's state; ``format="torch"``: as the torch.optim optimizer this recipe equals
        keeps it (``torch_format``; encoded buffers decoded), for that optimizer's ``load_state_dict``."""
        if format not in ("gradwise", "torch"):
            raise ValueError(f"invalid format={format!r}: expected 'gradwise' or 'torch'")
        state_dict = super().state_dict()
        return to_torch(self, state_dict) if format == "torch" else state_dict

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a gradwise or a torch.optim state dict (``torch_checkpoint``), checked against the chain
        first (``state_check.checked_load``): a refused load leaves state and param groups as they were."""
        if is_torch_format(state_dict):
            state_dict = from_torch(self, state_dict)
        if isinstance(state_dict, dict) and isinstance(state_dict.get("param_groups"), list):
            # a ZeroRedundancyOptimizer checkpoint saves its wrapper's groups, engine options and all;
            # this optimizer keeps its own
            state_dict = {**state_dict, "param_groups": [without_options(self, g) if isinstance(g, dict) else g
                                                         for g in state_dict["param_groups"]]}
        state_dict = checked_load(self, state_dict)
        super().load_state_dict(state_dict)
        self.__dict__.pop("_constants", None)  # its buffers are kept per group, and the groups are new
        for group in self.param_groups:  # a checkpoint from before an option existed: its default
            for key, value in group_defaults(self).items():
                group.setdefault(key, value)
        put_back_uncast(self, state_dict)
        self.storage.after_load(self, state_dict)

    def _check_inputs(self) -> None:
        """Before anything changes, for every group (``state_check.check_step``): hyperparameters,
        gradients (dense, shaped, typed and placed as their parameter), whether the chain accepts
        each parameter (``init`` on the meta device may refuse one, as GaLore refuses a rank above
        min(m, n)) and the shapes of the state it has; and any engine option a wrapper put back into a
        group (``core/options.py``)."""
        for index, group in enumerate(self.param_groups):
            check_group_options(self, group, index)
        check_step(self)

    # ----------------------------------------------------------------- train and eval points
    def train(self, mode: bool = True) -> "Optimizer":
        """Put the parameters at the point gradients are taken at (``mode=False``: as ``eval()``).

        For most chains both points are the parameters themselves and this only records the mode.
        Schedule-Free keeps gradients at y and evaluates at x: ``eval()`` moves every parameter from
        y to x and ``train()`` moves it back, through the chain's ``Transform.set_mode``. Both are
        idempotent: calling ``eval()`` twice moves the parameters once. An optimizer starts in train
        mode; ``step()`` in eval mode raises, and changes nothing. The mode is saved in
        ``state_dict()`` and restored by ``load_state_dict()``, so a checkpoint of model and optimizer
        taken together, in either mode, resumes with the model holding the weights the mode says.
        """
        boolean("mode", mode)
        target = "train" if mode else "eval"
        if target == self.mode:  # (a training loop calls train() every step: no no_grad() context for nothing)
            return self
        with torch.no_grad():
            self._move_to(target)
        self.mode = target
        return self

    def _move_to(self, target: str) -> None:
        """Move every parameter from the current mode's point to ``target``'s (``train``)."""
        if self._has_modes():
            for group in self.param_groups:
                transform = self.transform.for_group(group)  # the chain whose keys the state has
                for p in group["params"]:
                    state = self.state.get(p)
                    if state and "step" in state:
                        own = self.storage.decoded(state, p)  # set_mode only reads the state
                        view = torch.view_as_real(local(p)) if p.is_complex() else local(p)
                        transform.set_mode(target, view, own, group)

    def eval(self) -> "Optimizer":
        """Put the parameters at the point to evaluate the model at (see ``train``)."""
        return self.train(False)

    def _has_modes(self) -> bool:
        return self._uses(self.transform, "set_mode")

    # ----------------------------------------------------------------- the step
    @torch.compiler.disable
    def step(self, closure=None):
        """Apply one step of the chain to every parameter that has a gradient (``core/stepping.py``).

        Under ``torch.compile(train_step)`` the step runs outside dynamo's graph (``torch.compiler.disable``,
        as torch.optim's ``zero_grad``): tracing the engine's Python would guard on its per-step floats and
        recompile every step; outside, it runs eagerly or on its own compiled graphs, as ``compile=`` says."""
        if self.mode == "eval" and self._has_modes():
            raise RuntimeError(f"{type(self).__name__}.step() called in eval mode: the parameters hold the"
                               " evaluation point, not the training point; call optimizer.train() first")
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        work = [(group, [p for p in group["params"] if p.grad is not None]) for group in self.param_groups]
        self._chains = {}  # each group's chain, resolved once in this step (``chain_of``)
        grad_was = torch.is_grad_enabled()
        torch._C._set_grad_enabled(False)  # as torch.no_grad(), without its few microseconds a call
        try:
            if not self._steady_run(work):  # the last step's buckets again, if nothing changed (``core/steady.py``)
                self._check_inputs()
                if not self._run_step(work):
                    self.skipped_steps += 1
        finally:
            torch._C._set_grad_enabled(grad_was)
            self._chains = None
        return loss

    def step_parameters(self, group: dict[str, Any], params: list[Tensor]) -> None:
        """Step only ``params`` of ``group`` (each with its gradient, which the caller has checked): what
        ``fused_backward`` runs as each gradient is made."""
        self._chains = {}
        try:
            self._run_step([(group, params)])
        finally:
            self._chains = None

    # ----------------------------------------------------------------- introspection
    @property
    def compile_stats(self) -> dict[str, float]:
        """``{"compiles": n, "seconds": s, "loaded": k}``: graphs compiled so far (or loaded from the disk store:
        ``core/graph_store.py``), the wall time they took, and how many of them were loaded."""
        compiles, seconds, loaded = self.storage.compile_stats
        steps = self._compiled.values()
        return {"compiles": compiles + sum(c.compiles for c in steps),
                "seconds": seconds + sum(c.compile_seconds for c in steps),
                "loaded": loaded + sum(c.loaded for c in steps)}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.transform!r}, compile={self.compile!r})"




def state_refused(cls: type, state: Any, reason: str | None, allowed: str = "state=None (its state as computed)"
                  ) -> TypeError:
    """The one error of a recipe that keeps no encoded state, asked for some."""
    reason = reason or "its step does not run one parameter at a time on the chain's own state, as encoded state needs"
    return TypeError(f"{cls.__name__}() does not take state={state!r}: {reason}; allowed: {allowed}."
                     f" Recipes that take state=: {', '.join(optimizers_taking_state())}")
