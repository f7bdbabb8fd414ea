"""One registry of recipes, their references and their hyperparameter cases.

Every generic test walks ``CASES``: parity with the reference step by step (cases whose reference is
None are checked against float64 implementations from their papers in their own test files),
compiled equals eager, exact resume. The next recipe costs one entry here.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch

import gradwise


@dataclass(frozen=True)
class Case:
    name: str
    recipe: type[gradwise.Optimizer]
    reference: Callable[..., torch.optim.Optimizer] | None  # None: a float64 paper reference elsewhere
    kwargs: dict[str, Any] = field(default_factory=dict)
    reference_kwargs: dict[str, Any] | None = None  # when the reference spells an option differently
    trains: bool = True  # False for cases that make no sense on a training loss (gradient ascent)
    compiles: bool = True  # False for batched chains (matrix preconditioners), which always run eagerly

    def ours(self, params, compile: bool) -> gradwise.Optimizer:
        return self.recipe(params, compile=compile, **self.kwargs)

    def theirs(self, params) -> torch.optim.Optimizer:
        kwargs = self.kwargs if self.reference_kwargs is None else self.reference_kwargs
        return self.reference(params, **kwargs)


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


def _ranger21(params, **kwargs):
    from pytorch_optimizer import Ranger21

    return Ranger21(params, foreach=False, **kwargs)


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


CASES = [
    Case("sgd", gradwise.SGD, torch.optim.SGD, dict(lr=0.05)),
    Case("sgd-momentum-dampening", gradwise.SGD, torch.optim.SGD,
         dict(lr=0.05, momentum=0.9, dampening=0.1, weight_decay=0.01)),
    Case("sgd-nesterov", gradwise.SGD, torch.optim.SGD, dict(lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.01)),
    Case("adam", gradwise.Adam, torch.optim.Adam, dict(lr=0.01, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.05)),
    Case("adamw", gradwise.AdamW, torch.optim.AdamW, dict(lr=0.01, betas=(0.9, 0.95), weight_decay=0.1)),
    Case("nadamw", gradwise.NAdamW, torch.optim.NAdam, dict(lr=0.01, weight_decay=0.1, momentum_decay=4e-3),
         dict(lr=0.01, weight_decay=0.1, momentum_decay=4e-3, decoupled_weight_decay=True)),
    Case("lion", gradwise.Lion, _lion, dict(lr=1e-3, betas=(0.9, 0.99), weight_decay=0.1)),
    Case("schedule-free-adamw", gradwise.ScheduleFreeAdamW, _schedulefree("AdamWScheduleFree"),
         dict(lr=0.01, betas=(0.9, 0.95), weight_decay=0.1, warmup_steps=10, r=0.5, weight_lr_power=2.0)),
    Case("schedule-free-sgd", gradwise.ScheduleFreeSGD, _schedulefree("SGDScheduleFree"),
         dict(lr=0.05, momentum=0.8, weight_decay=0.01, warmup_steps=10, r=1.0, weight_lr_power=1.0)),
    Case("ranger21", gradwise.Ranger21, _ranger21, dict(lr=3e-3, num_iterations=50, pnm_momentum_factor=0.9),
         dict(lr=3e-3, num_iterations=50, beta0=0.9)),
    Case("adamw-maximize", gradwise.AdamW, torch.optim.AdamW, dict(lr=0.01, maximize=True), trains=False),
    Case("muon", gradwise.Muon, None, dict(lr=0.02, adamw_lr=1e-3)),
    Case("shampoo", gradwise.Shampoo, None, dict(lr=0.01, precondition_frequency=2, max_preconditioner_dim=8),
         compiles=False),
    Case("soap", gradwise.SOAP, None, dict(lr=0.01, precondition_frequency=2, max_precond_dim=8), compiles=False),
    Case("adafactor", gradwise.Adafactor, _adafactor, dict(lr=0.01, weight_decay=0.1, d=1.5)),
    Case("came", gradwise.CAME, _came, dict(lr=1e-3, weight_decay=0.1, clip_threshold=1.5)),
    Case("adam-mini", gradwise.AdamMini, None, dict(lr=0.01, weight_decay=0.1)),  # adam-mini: tests/test_adam_mini.py
    # updated inside backward (fused_backward=True by default); float64 references in tests/test_lomo.py
    Case("lomo", gradwise.LOMO, None, dict(lr=0.05, clip_grad_value=0.5, weight_decay=0.01)),
    Case("adalomo", gradwise.AdaLomo, None, dict(lr=0.01, weight_decay=0.01)),
    # unprojected here (the references project only groups that carry "rank"): tests/test_galore.py and
    # tests/test_apollo.py compare the projections step by step, APOLLO-Mini's included
    Case("galore-adamw", gradwise.GaLoreAdamW, _galore, dict(lr=0.01, betas=(0.9, 0.95), weight_decay=0.1),
         compiles=False),
    Case("apollo", gradwise.APOLLO, _apollo, dict(lr=0.01, eps=1e-7, weight_decay=0.1), compiles=False),
    Case("apollo-mini", gradwise.APOLLOMini, None, dict(lr=0.01, weight_decay=0.1), compiles=False),
]

#: the cases with a reference optimizer to compare against step by step
REFERENCED = [c for c in CASES if c.reference is not None]
#: every recipe class the registry covers, for the generic tests that need a class, not a case.
RECIPES = list(dict.fromkeys(c.recipe for c in CASES))

#: keyword arguments a recipe cannot do without (Ranger21's lr and step budget, CAME's lr), for generic
#: tests; LOMO and AdaLomo in their ordinary-step mode, as those tests check what step() does with a
#: backward's gradients (tests/test_fused_backward.py and tests/test_lomo.py cover the update inside backward).
REQUIRED = {gradwise.Ranger21: dict(lr=1e-3, num_iterations=100), gradwise.CAME: dict(lr=1e-3),
            gradwise.LOMO: dict(fused_backward=False), gradwise.AdaLomo: dict(fused_backward=False)}


def build(recipe, params, **kwargs):
    """``recipe(params, **kwargs)`` with the arguments it requires filled in."""
    return recipe(params, **{**REQUIRED.get(recipe, {}), **kwargs})
