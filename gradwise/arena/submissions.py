"""What a submission enters: an optimizer (any gradwise recipe, ``torch.<Name>`` for any ``torch.optim``
optimizer) with hyperparameters, a search space for external tuning, or the fixed self-tuning defaults.

Hyperparameters are the optimizer's own keywords plus a few the arena maps:
``beta1``/``beta2``/``one_minus_beta1`` (AlgoPerf's convention) build ``betas``; ``warmup_factor`` (the
fraction of the step budget spent in linear warmup, then cosine decay to 0; default 0.05) and
``schedule`` (``"warmup_cosine"`` or ``"constant"``) set the learning-rate schedule.
A search space (JSON or TOML) uses AlgoPerf's dict form: each hyperparameter maps to
``{"min": a, "max": b, "scaling": "linear" | "log"}`` or ``{"feasible_points": [...]}``; or its list form:
a list of fixed points, of which each study takes the first ``trials``.
"""
from __future__ import annotations

import inspect
import json
import math
from pathlib import Path
from typing import Any

import torch

import gradwise.recipes
from gradwise.by_name import optimizer_names

SCHEDULE_KEYS = {"warmup_factor", "schedule"}
BETA_KEYS = {"beta1", "beta2", "one_minus_beta1"}
SCHEDULES = ("warmup_cosine", "constant")

#: Self-tuning defaults: one point per optimizer, the same on every workload (AlgoPerf forbids workload-specific
#: hyperparameters). NAdamW's is the AlgoPerf self-tuning baseline point.
SELF_TUNING: dict[str, dict[str, Any]] = {
    "AdamW": {"lr": 2e-3, "beta1": 0.9, "beta2": 0.999, "weight_decay": 0.05, "warmup_factor": 0.05},
    "torch.AdamW": {"lr": 2e-3, "beta1": 0.9, "beta2": 0.999, "weight_decay": 0.05, "warmup_factor": 0.05},
    "NAdamW": {"lr": 0.0017486, "one_minus_beta1": 0.0673, "beta2": 0.99552, "weight_decay": 0.0812,
               "warmup_factor": 0.02},
    "torch.NAdam": {"lr": 0.0017486, "one_minus_beta1": 0.0673, "beta2": 0.99552, "weight_decay": 0.0812,
                    "decoupled_weight_decay": True, "warmup_factor": 0.02},
    "Lion": {"lr": 3e-4, "beta1": 0.9, "beta2": 0.99, "weight_decay": 0.5, "warmup_factor": 0.05},
    # ADOPT, AdEMAMix, MARS: their papers' defaults with AdamW's point above (not tuned here)
    "ADOPT": {"lr": 2e-3, "beta1": 0.9, "beta2": 0.9999, "weight_decay": 0.05, "weight_decouple": True,
              "warmup_factor": 0.05},
    "AdEMAMix": {"lr": 2e-3, "beta1": 0.9, "beta2": 0.999, "alpha": 5.0, "weight_decay": 0.05,
                 "warmup_factor": 0.05},
    "MARS": {"lr": 3e-3, "beta1": 0.95, "beta2": 0.99, "weight_decay": 0.05, "warmup_factor": 0.05},
    # NorMuon (Li et al. 2025, arXiv:2510.05491; pytorch-optimizer's lr, momentum and beta2): AdamW's point above
    # for the AdamW route and the weight decay (not tuned)
    "NorMuon": {"lr": 0.02, "momentum": 0.95, "beta2": 0.95, "weight_decay": 0.05, "adamw_lr": 2e-3,
                "adamw_betas": (0.9, 0.999), "adamw_wd": 0.05, "warmup_factor": 0.05},
    # SPAM (arXiv:2501.06842): AdamW's point, pytorch-optimizer's defaults for the resets (every 500 steps,
    # theta 5000); AdamC (arXiv:2506.02285): AdamW's point; it corrects the decay of normalized layers only,
    # which a group marks with normalized=True, and the arena's flat parameter list marks none. Not tuned here
    "SPAM": {"lr": 2e-3, "beta1": 0.9, "beta2": 0.999, "weight_decay": 0.05, "warmup_factor": 0.05},
    "AdamC": {"lr": 2e-3, "beta1": 0.9, "beta2": 0.999, "weight_decay": 0.05, "warmup_factor": 0.05},
    # the authors' defaults, with the arena's warmup and cosine decay: Adam, Kingma & Ba 2015 (Algorithm 1);
    # Adafactor, Shazeer & Stern 2018 (lr 1e-2, beta2 decay -0.8, eps2 1e-3, clipping d 1: torch.optim.Adafactor's);
    # CAME, Luo et al. 2023 (came-pytorch's README); SOAP, Vyas et al. 2024 (the authors' SOAP defaults);
    # Muon, Jordan et al. 2024 (KellerJordan/Muon's README: lr 0.02, momentum 0.95, AdamW 3e-4, (0.9, 0.95), 0.01)
    "Adam": {"lr": 1e-3, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "warmup_factor": 0.05},
    "Adafactor": {"lr": 1e-2, "beta2_decay": -0.8, "d": 1.0, "warmup_factor": 0.05},
    "CAME": {"lr": 2e-4, "weight_decay": 1e-2, "warmup_factor": 0.05},
    "SOAP": {"lr": 3e-3, "beta1": 0.95, "beta2": 0.95, "weight_decay": 0.01, "precondition_frequency": 10,
             "warmup_factor": 0.05},
    "Muon": {"lr": 0.02, "momentum": 0.95, "weight_decay": 0.0, "adamw_lr": 3e-4, "adamw_betas": (0.9, 0.95),
             "adamw_weight_decay": 0.01, "warmup_factor": 0.05},
    # KL-Shampoo and KL-SOAP (Lin et al. 2025, arXiv:2509.03378): betas, eps and frequency of the authors' code
    # (github.com/yorkerlin/KL-Methods, optim/kl_opt.py), whose lr 1e-4 is a placeholder (the paper tunes it):
    # SOAP's lr and weight decay above instead (not tuned here)
    "KLShampoo": {"lr": 3e-3, "beta1": 0.9, "beta2": 0.98, "weight_decay": 0.01, "precondition_frequency": 10,
                  "warmup_factor": 0.05},
    "KLSOAP": {"lr": 3e-3, "beta1": 0.9, "beta2": 0.98, "weight_decay": 0.01, "precondition_frequency": 10,
               "warmup_factor": 0.05},
    # Schedule-Free AdamW (Defazio et al. 2024, arXiv:2405.15682): schedulefree 1.4.1's defaults, and no LR
    # schedule, which is the method's point; the runner evaluates it at x (its eval mode)
    "ScheduleFreeAdamW": {"lr": 2.5e-3, "beta1": 0.9, "beta2": 0.999, "weight_decay": 0.0, "schedule": "constant"},
    "SGD": {"lr": 0.05, "momentum": 0.9, "nesterov": True, "weight_decay": 1e-5, "warmup_factor": 0.05},
    "torch.SGD": {"lr": 0.05, "momentum": 0.9, "nesterov": True, "weight_decay": 1e-5, "warmup_factor": 0.05},
}


def optimizer_class(name: str) -> type[torch.optim.Optimizer]:
    if name not in optimizer_names():
        raise ValueError(f"unknown optimizer {name!r}; valid: {optimizer_names()}")
    if name.startswith("torch."):
        return getattr(torch.optim, name.removeprefix("torch."))
    return getattr(gradwise.recipes, name)


def allowed_hyperparameters(name: str) -> list[str]:
    """The optimizer's keywords (less ``params``) plus the arena's schedule and beta keys."""
    signature = inspect.signature(optimizer_class(name).__init__)
    own = [p for p in signature.parameters if p not in ("self", "params")]
    betas = BETA_KEYS if "betas" in own else set()
    return sorted(set(own) | betas | SCHEDULE_KEYS)


def check_hyperparameters(name: str, hyperparameters: dict[str, Any]) -> None:
    allowed = allowed_hyperparameters(name)
    unknown = sorted(set(hyperparameters) - set(allowed))
    if unknown:
        raise ValueError(f"unknown hyperparameter(s) {unknown} for optimizer {name!r}; allowed: {allowed}")
    schedule = hyperparameters.get("schedule", "warmup_cosine")
    if schedule not in SCHEDULES:
        raise ValueError(f"invalid schedule={schedule!r}: expected one of {list(SCHEDULES)}")
    warmup = hyperparameters.get("warmup_factor", 0.05)
    if not 0 <= warmup < 1:
        raise ValueError(f"invalid warmup_factor={warmup!r}: expected 0 <= warmup_factor < 1")


def optimizer_kwargs(name: str, hyperparameters: dict[str, Any]) -> dict[str, Any]:
    """The keywords passed to the optimizer: beta keys folded into ``betas``, schedule keys dropped."""
    check_hyperparameters(name, hyperparameters)
    parameters = inspect.signature(optimizer_class(name).__init__).parameters
    folded = BETA_KEYS if "betas" in parameters else set()  # NorMuon's beta2 is a keyword of its own
    kwargs = {k: v for k, v in hyperparameters.items() if k not in SCHEDULE_KEYS | folded}
    if folded & set(hyperparameters):
        default = parameters["betas"].default
        beta1 = 1 - hyperparameters["one_minus_beta1"] if "one_minus_beta1" in hyperparameters else \
            hyperparameters.get("beta1", default[0])
        # a third beta (AdEMAMix's slow EMA) keeps its default
        kwargs["betas"] = (float(beta1), float(hyperparameters.get("beta2", default[1])), *default[2:])
    if not name.startswith("torch."):
        kwargs.setdefault("compile", False)  # these models are small; compile time would count as training
    return kwargs


def build_optimizer(name: str, hyperparameters: dict[str, Any], params, total_steps: int):
    """The optimizer and a per-step LR schedule: linear warmup over ``warmup_factor * total_steps``, then
    cosine decay to 0 at ``total_steps`` (or a constant LR)."""
    optimizer = optimizer_class(name)(params, **optimizer_kwargs(name, hyperparameters))
    warmup = max(1, int(hyperparameters.get("warmup_factor", 0.05) * total_steps))
    if hyperparameters.get("schedule", "warmup_cosine") == "constant":
        factor = lambda step: 1.0  # noqa: E731
    else:
        def factor(step: int) -> float:
            if step < warmup:
                return (step + 1) / warmup
            progress = min(1.0, (step - warmup) / max(1, total_steps - warmup))
            return 0.5 * (1 + math.cos(math.pi * progress))
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def load_search_space(path: str | Path, optimizer: str | None = None) -> tuple[str, dict[str, dict]]:
    """``(optimizer, space)`` from a JSON or TOML file; the file may name its optimizer (``"optimizer"``)
    and hold the space under ``"space"``, or be the space itself (then ``optimizer`` must be given)."""
    path = Path(path)
    if not path.exists():
        raise ValueError(f"invalid search space file {str(path)!r}: no such file")
    text = path.read_text()
    try:
        if path.suffix == ".toml":
            import tomllib  # Python 3.11+

            raw = tomllib.loads(text)
        else:
            raw = json.loads(text)
    except ImportError as error:
        raise ValueError(f"cannot read {str(path)!r}: TOML needs Python 3.11+; use JSON") from error
    except ValueError as error:  # json.JSONDecodeError and tomllib.TOMLDecodeError are ValueErrors
        raise ValueError(f"invalid search space file {str(path)!r}: {error}") from error
    if "space" in raw:
        optimizer = raw.get("optimizer", optimizer)
        raw = raw["space"]
    if optimizer is None:
        raise ValueError(f"search space {str(path)!r} names no optimizer: add \"optimizer\" or pass --optimizer")
    return optimizer, check_search_space(optimizer, raw)


def check_search_space(optimizer: str | None, space: dict[str, Any] | list[dict[str, Any]]) -> dict | list:
    """A dict-form space (ranges and feasible points) or a list-form one (fixed points, taken in order).
    With ``optimizer=None`` (an AlgoPerf submission, which reads its own hyperparameters) any names are allowed."""
    if isinstance(space, list):
        if not space or not all(isinstance(point, dict) for point in space):
            raise ValueError(f"invalid search space {space!r}: a list-form space is a non-empty list of points")
        for point in space if optimizer is not None else ():
            unknown = sorted(set(point) - set(allowed_hyperparameters(optimizer)))
            if unknown:
                raise ValueError(f"search space has unknown hyperparameter(s) {unknown} for optimizer"
                                 f" {optimizer!r}; allowed: {allowed_hyperparameters(optimizer)}")
            check_hyperparameters(optimizer, point)
        return space
    if not isinstance(space, dict) or not space:
        raise ValueError(f"invalid search space {space!r}: expected a non-empty mapping of hyperparameters")
    allowed = allowed_hyperparameters(optimizer) if optimizer is not None else sorted(space)
    unknown = sorted(set(space) - set(allowed))
    if unknown:
        raise ValueError(f"search space has unknown hyperparameter(s) {unknown} for optimizer {optimizer!r};"
                         f" allowed: {allowed}")
    for key, spec in space.items():
        if not isinstance(spec, dict):
            raise ValueError(f"invalid search space entry {key}={spec!r}: expected a table with min/max/scaling"
                             " or feasible_points")
        if "feasible_points" in spec:
            if not isinstance(spec["feasible_points"], list) or not spec["feasible_points"]:
                raise ValueError(f"invalid {key}.feasible_points={spec['feasible_points']!r}: expected a"
                                 " non-empty list")
            continue
        low, high, scaling = spec.get("min"), spec.get("max"), spec.get("scaling", "linear")
        if not (isinstance(low, (int, float)) and isinstance(high, (int, float)) and low < high):
            raise ValueError(f"invalid {key} range min={low!r}, max={high!r}: expected numbers with min < max")
        if scaling not in ("linear", "log") or (scaling == "log" and low <= 0):
            raise ValueError(f"invalid {key}.scaling={scaling!r} with min={low!r}: expected 'linear', or 'log'"
                             " with min > 0")
    return space
