"""One registry of recipes: each recipe's capabilities, its reference and its input configurations,
declared once, as torch's ``OptimizerInfo`` declares them for torch.optim.

Every generic test walks ``CASES`` (one per input configuration) or ``ENTRIES`` (one per recipe) and
filters on what an entry declares: parity with the reference step by step (entries whose reference is
None are checked against float64 implementations from their papers in their own test files),
compiled equals eager, exact resume, encoded state, complex and bfloat16 parameters, FSDP2.
What a recipe's own code can tell is derived, not declared (``compiles``, from its chains'
``batched``); what is declared and can also be observed (``state``, ``fused_backward``, the torch
counterpart, the engine keywords) is checked against the recipe by tests/test_registry.py, so the
two cannot drift. The next recipe costs one entry here.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Callable

import torch

import gradwise

#: the keywords the engine gives every recipe, each with a value that differs from its default
ENGINE_KEYWORDS = {"param_rounding": "stochastic", "maximize": True, "skip_nonfinite": True, "compile": False,
                   "state": "int8"}


@dataclass(frozen=True)
class Config:
    """One input configuration: the recipe's keyword arguments, and the reference's where it spells an
    option differently; ``trains=False`` for one that makes no sense on a training loss (gradient ascent)."""

    name: str
    kwargs: dict[str, Any]
    reference_kwargs: dict[str, Any] | None = None
    trains: bool = True


@dataclass(frozen=True, eq=False)
class Entry:
    """A recipe, its reference, its input configurations and its capabilities."""

    recipe: type[gradwise.Optimizer]
    reference: Callable[..., torch.optim.Optimizer] | None  # None: float64 paper references in its test file
    configs: tuple[Config, ...]
    #: constructor arguments it cannot do without (Ranger21's lr and step budget); LOMO and AdaLomo in
    #: their ordinary-step mode, as the generic tests check what step() does with a backward's gradients
    required: dict[str, Any] = field(default_factory=dict)
    #: keeps encoded state (``state="int8"``); False: refuses it, naming why (``state_refusal``)
    state: bool = True
    #: matches its reference on complex parameters
    complex: bool = False
    #: its reference takes ``maximize=True`` too, so gradient ascent is compared step by step (every
    #: recipe takes ``maximize``: tests/test_engine_options.py)
    maximize_reference: bool = False
    #: its first step moves the parameters (ADOPT's only fills its second moment)
    first_step_moves: bool = True
    #: steps bfloat16 parameters in float32 and rounds each result once into the parameter
    bf16: bool = True
    #: the state buffers it keeps in formats of its own, the same for every parameter dtype (MicroAdam's int16
    #: indices, bfloat16 values and 4-bit codes)
    compressed_state: frozenset[str] = frozenset()
    #: ``gradwise.fused_backward(optimizer)`` accepts it (no chain batched across parameters, no step()
    #: of its own)
    fused_backward: bool = True
    #: its step amplifies a small error of its state (Newton-Schulz lifts every singular value to about
    #: 1, preconditioners divide by small eigenvalues): encoded state is held to a loss, not a trajectory
    amplifies_state_error: bool = False
    #: the torch.optim optimizer whose keywords, order and defaults it takes (a drop-in), and the
    #: defaults it changes on purpose
    torch_counterpart: type[torch.optim.Optimizer] | None = None
    own_defaults: frozenset[str] = frozenset()
    #: engine keywords (``ENGINE_KEYWORDS``) its signature lacks, and the values it refuses with a reason
    missing_keywords: frozenset[str] = frozenset()
    refused: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.recipe.__name__

    def build(self, params, **kwargs) -> gradwise.Optimizer:
        """``recipe(params, **kwargs)`` with the arguments it requires filled in."""
        return self.recipe(params, **{**self.required, **kwargs})

    @cached_property
    def chains(self) -> list:
        """The chains its param groups run (one per route), built on a matrix and a vector."""
        optimizer = self.build([torch.nn.Parameter(torch.zeros(4, 3)), torch.nn.Parameter(torch.zeros(3))],
                               compile=False, **self.configs[0].kwargs)
        return list({id(c): c for c in (optimizer.transform.for_group(g) for g in optimizer.param_groups)}.values())

    @property
    def compiles(self) -> bool:
        """Derived: some route's chain is not batched across parameters (batched links always run eagerly,
        and only their elementwise rest compiles: the generic compiled-equals-eager tests leave them out)."""
        return any(not c.batched for c in self.chains)


@dataclass(frozen=True)
class Case:
    """One input configuration of one entry, for the tests that walk configurations."""

    entry: Entry
    config: Config

    name = property(lambda self: self.config.name)
    recipe = property(lambda self: self.entry.recipe)
    reference = property(lambda self: self.entry.reference)
    kwargs = property(lambda self: self.config.kwargs)
    trains = property(lambda self: self.config.trains)
    compiles = property(lambda self: self.entry.compiles)

    def ours(self, params, compile: bool, **kwargs) -> gradwise.Optimizer:
        return self.recipe(params, compile=compile, **self.kwargs, **kwargs)

    def theirs(self, params, **kwargs) -> torch.optim.Optimizer:
        own = self.kwargs if self.config.reference_kwargs is None else self.config.reference_kwargs
        return self.reference(params, **own, **kwargs)


def _lion(params, **kwargs):
    from lion_pytorch import Lion

    return Lion(params, **kwargs)


def _schedulefree(name):
    def make(params, **kwargs):
        import schedulefree

        optimizer = getattr(schedulefree, name)(params, foreach=False, **kwargs)
        optimizer.train()  # the reference starts in eval mode; ours starts in train mode
        return optimizer

    return make


def _adafactor(params, **kwargs):
    # torch.optim.Adafactor divides by sqrt(numel) in Python: an empty tensor raises ZeroDivisionError
    # there (ours leaves it alone), so the reference gets the non-empty ones
    return torch.optim.Adafactor([p for p in params if p.numel()], **kwargs)


def _came(params, **kwargs):
    from came_pytorch import CAME

    return CAME(params, **kwargs)


def _galore(params, **kwargs):
    from galore_torch import GaLoreAdamW

    return GaLoreAdamW(params, no_deprecation_warning=True, **kwargs)


def _apollo(params, **kwargs):
    from apollo_torch import APOLLOAdamW

    return APOLLOAdamW(params, **kwargs)


def _pytorch_optimizer(name, **fixed):
    def make(params, **kwargs):
        import pytorch_optimizer

        return getattr(pytorch_optimizer, name)(params, foreach=False, **{**fixed, **kwargs})

    return make


def _entry(recipe, reference, *configs, **capabilities) -> Entry:
    return Entry(recipe, reference, tuple(Config(*c) if isinstance(c, tuple) else c for c in configs), **capabilities)


ENTRIES = [
    _entry(gradwise.SGD, torch.optim.SGD, ("sgd", dict(lr=0.05)),
           ("sgd-momentum-dampening", dict(lr=0.05, momentum=0.9, dampening=0.1, weight_decay=0.01)),
           ("sgd-nesterov", dict(lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.01)),
           complex=True, maximize_reference=True, torch_counterpart=torch.optim.SGD),
    _entry(gradwise.Adam, torch.optim.Adam, ("adam", dict(lr=0.01, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.05)),
           complex=True, maximize_reference=True, torch_counterpart=torch.optim.Adam),
    _entry(gradwise.AdamW, torch.optim.AdamW, ("adamw", dict(lr=0.01, betas=(0.9, 0.95), weight_decay=0.1)),
           Config("adamw-maximize", dict(lr=0.01, maximize=True), trains=False),
           complex=True, maximize_reference=True, torch_counterpart=torch.optim.AdamW),
    _entry(gradwise.NAdamW, torch.optim.NAdam,
           ("nadamw", dict(lr=0.01, weight_decay=0.1, momentum_decay=4e-3),
            dict(lr=0.01, weight_decay=0.1, momentum_decay=4e-3, decoupled_weight_decay=True)),
           maximize_reference=True, torch_counterpart=torch.optim.NAdam,
           own_defaults=frozenset({"weight_decay", "decoupled_weight_decay"})),  # NAdam with AdamW's decay
    _entry(gradwise.Lion, _lion, ("lion", dict(lr=1e-3, betas=(0.9, 0.99), weight_decay=0.1))),
    _entry(gradwise.ScheduleFreeAdamW, _schedulefree("AdamWScheduleFree"),
           ("schedule-free-adamw",
            dict(lr=0.01, betas=(0.9, 0.95), weight_decay=0.1, warmup_steps=10, r=0.5, weight_lr_power=2.0)),),
    _entry(gradwise.ScheduleFreeSGD, _schedulefree("SGDScheduleFree"),
           ("schedule-free-sgd", dict(lr=0.05, momentum=0.8, weight_decay=0.01, warmup_steps=10, r=1.0,
                                      weight_lr_power=1.0)),
           state=False, complex=True),
    _entry(gradwise.Ranger21, _pytorch_optimizer("Ranger21"),
           ("ranger21", dict(lr=3e-3, num_iterations=50, pnm_momentum_factor=0.9),
            dict(lr=3e-3, num_iterations=50, beta0=0.9)),
           required=dict(lr=1e-3, num_iterations=100), fused_backward=False),
    _entry(gradwise.Muon, None, ("muon", dict(lr=0.02, adamw_lr=1e-3)), fused_backward=False,
           amplifies_state_error=True, torch_counterpart=torch.optim.Muon),
    # pytorch-optimizer's NorMuon takes use_muon groups and runs Newton-Schulz in bfloat16 only:
    # tests/test_normuon.py compares with it step by step, and with a float64 reference from the paper
    _entry(gradwise.NorMuon, None, ("normuon", dict(lr=0.02, adamw_lr=1e-3, weight_decay=0.1)), fused_backward=False,
           amplifies_state_error=True),
    _entry(gradwise.Shampoo, None, ("shampoo", dict(lr=0.01, precondition_frequency=2, max_preconditioner_dim=8)),
           fused_backward=False, amplifies_state_error=True),
    _entry(gradwise.SOAP, None, ("soap", dict(lr=0.01, precondition_frequency=2, max_precond_dim=8)),
           fused_backward=False, amplifies_state_error=True),
    # float64 references from the paper in tests/test_kl_shampoo.py
    _entry(gradwise.KLShampoo, None, ("kl-shampoo", dict(lr=0.01, precondition_frequency=2, max_precond_dim=8)),
           fused_backward=False),
    _entry(gradwise.KLSOAP, None, ("kl-soap", dict(lr=0.01, precondition_frequency=2, max_precond_dim=8)),
           fused_backward=False, amplifies_state_error=True),
    _entry(gradwise.Adafactor, _adafactor, ("adafactor", dict(lr=0.01, weight_decay=0.1, d=1.5)),
           maximize_reference=True, torch_counterpart=torch.optim.Adafactor),
    _entry(gradwise.CAME, _came, ("came", dict(lr=1e-3, weight_decay=0.1, clip_threshold=1.5)),
           required=dict(lr=1e-3)),
    _entry(gradwise.AdamMini, None, ("adam-mini", dict(lr=0.01, weight_decay=0.1))),  # tests/test_adam_mini.py
    # updated inside backward (fused_backward=True by default); float64 references in tests/test_lomo.py
    _entry(gradwise.LOMO, None, ("lomo", dict(lr=0.05, clip_grad_value=0.5, weight_decay=0.01)),
           required=dict(fused_backward=False)),
    _entry(gradwise.AdaLomo, None, ("adalomo", dict(lr=0.01, weight_decay=0.01)), required=dict(fused_backward=False)),
    # unprojected here (the references project only groups that carry "rank"): tests/test_galore.py and
    # tests/test_apollo.py compare the projections step by step, APOLLO-Mini's included
    _entry(gradwise.GaLoreAdamW, _galore, ("galore-adamw", dict(lr=0.01, betas=(0.9, 0.95), weight_decay=0.1)),
           state=False, fused_backward=False),
    _entry(gradwise.APOLLO, _apollo, ("apollo", dict(lr=0.01, eps=1e-7, weight_decay=0.1)), state=False,
           fused_backward=False),
    # pytorch-optimizer 4.1.0; AdEMAMix decays decoupled by default (the paper), the package's default is L2
    _entry(gradwise.ADOPT, _pytorch_optimizer("ADOPT"),
           ("adopt", dict(lr=0.01, betas=(0.9, 0.99), weight_decay=0.1)), maximize_reference=True,
           first_step_moves=False),
    _entry(gradwise.AdEMAMix, _pytorch_optimizer("AdEMAMix", weight_decouple=True),
           ("ademamix", dict(lr=0.01, betas=(0.8, 0.99, 0.999), alpha=3.0, t_alpha_beta3=20, weight_decay=0.1)),
           maximize_reference=True),
    # pytorch-optimizer's MARS adds 1e-15 to v under its square root: tests/test_mars.py compares with it
    # within 1e-8 (float64) and with a float64 reference from the paper within 1e-10
    _entry(gradwise.MARS, None, ("mars", dict(lr=0.01, gamma=0.05, weight_decay=0.1))),
    # pytorch-optimizer 4.1.0 (density=1.0); a reset every 8 steps, clipping from 2 steps after it, a 3-step warmup
    _entry(gradwise.SPAM, _pytorch_optimizer("SPAM"),
           ("spam", dict(lr=0.01, weight_decay=0.1, update_proj_gap=8, warmup_epoch=3, grad_accu_steps=2,
                         threshold=2.0)), maximize_reference=True),
    # pytorch-optimizer's AdamC adds 1e-15 to v under its square root: tests/test_adamc.py compares with it
    _entry(gradwise.AdamC, None, ("adamc", dict(lr=0.01, weight_decay=0.1))),
    _entry(gradwise.APOLLOMini, None, ("apollo-mini", dict(lr=0.01, weight_decay=0.1)), state=False,
           fused_backward=False),
    # float64 references from the papers in tests/test_subset_norm.py; here projected (rank 1) on every matrix
    _entry(gradwise.SubsetNorm, None, ("subset-norm", dict(lr=0.05, weight_decay=0.1, rank=1, update_proj_gap=3)),
           state=False, fused_backward=False),
    _entry(gradwise.FRUGAL, None, ("frugal", dict(lr=0.01, weight_decay=0.1, rank=1, update_proj_gap=3)),
           state=False, fused_backward=False),
    # pytorch-optimizer 4.1.0's Kron draws its random vectors from the global generator: tests/test_psgd_kron.py
    # seeds it with ours for each parameter and compares step by step
    _entry(gradwise.PSGDKron, None, ("psgd-kron", dict(lr=0.01, weight_decay=0.1, balance_prob=0.5)),
           fused_backward=False),
    # float64 reference from the paper in tests/test_micro_adam.py; a window of 3, a third of each tensor kept
    _entry(gradwise.MicroAdam, None, ("micro-adam", dict(lr=0.01, weight_decay=0.1, m=3, k_init=0.34,
                                                         quant_block_size=4)), state=False, fused_backward=False,
           compressed_state=frozenset({"micro_adam.window_indices", "micro_adam.window_values", "micro_adam.error"})),
]

#: every input configuration of every entry
CASES = [Case(entry, config) for entry in ENTRIES for config in entry.configs]
#: one training case per recipe (its last), for the generic tests that need one configuration of each
ONE_PER_RECIPE = list({c.recipe: c for c in CASES if c.trains}.values())
#: the cases with a reference optimizer to compare against step by step
REFERENCED = [c for c in CASES if c.reference is not None]
#: every recipe class the registry covers, for the generic tests that need a class, not a case
RECIPES = [e.recipe for e in ENTRIES]
#: the entry of each recipe class
ENTRY = {e.recipe: e for e in ENTRIES}


def build(recipe, params, **kwargs):
    """``recipe(params, **kwargs)`` with the arguments it requires filled in."""
    return ENTRY[recipe].build(params, **kwargs)


def nudge_hyperparameters(optimizer, step):
    """Move every float hyperparameter of every group (each number of a tuple too) by a factor step / 100
    away from 1: one under 1 shrinks, one of 1 or more grows. A schedule of all of them at once, within
    every recipe's bounds (betas stay in (0, 1), Adafactor's d and CAME's clip threshold >= 1, zero stays zero)."""
    def nudged(value):
        return value * (1 + step / 100 if value >= 1 else 1 - step / 100)

    for group in optimizer.param_groups:
        for key, spec in optimizer.hyper_specs.items():
            value = group[key]
            if spec.static:
                continue
            if isinstance(value, float):
                group[key] = nudged(value)
            elif isinstance(value, tuple) and all(isinstance(v, float) for v in value):
                group[key] = tuple(nudged(v) for v in value)
