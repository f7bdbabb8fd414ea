"""What a submission enters: an optimizer (any gradwise recipe, ``torch.<Name>`` for any ``torch.optim``
optimizer, or a recipe's state-format variant ``NAME[FORMAT]``, see ``variants``) with hyperparameters, a search
space for external tuning, or the fixed self-tuning defaults. A recipe with a projection ``rank`` projects only
the matrices wider than it (``parameter_groups``); one that takes its step budget (Ranger21) gets the trial's.

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
from gradwise.arena.variants import check_entry, split_variant
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
    # PSGD Kron (Li 2018, arXiv:1809.10232): pytorch-optimizer 4.1.0's Kron defaults (lr 1e-3, momentum 0.9, no weight
    # decay, its update-probability schedule), with the arena's warmup and cosine decay; not tuned here
    "PSGDKron": {"lr": 1e-3, "momentum": 0.9, "weight_decay": 0.0, "warmup_factor": 0.05},
    # KL-Shampoo and KL-SOAP (Lin et al. 2025, arXiv:2509.03378): betas, eps and frequency of the authors' code
    # (github.com/yorkerlin/KL-Methods, optim/kl_opt.py), whose lr 1e-4 is a placeholder (the paper tunes it):
    # SOAP's lr and weight decay above instead (not tuned here)
    "KLShampoo": {"lr": 3e-3, "beta1": 0.9, "beta2": 0.98, "weight_decay": 0.01, "precondition_frequency": 10,
                  "warmup_factor": 0.05},
    "KLSOAP": {"lr": 3e-3, "beta1": 0.9, "beta2": 0.98, "weight_decay": 0.01, "precondition_frequency": 10,
               "warmup_factor": 0.05},
    # MicroAdam (Modoranu et al. 2024, arXiv:2405.15593): the authors' window of 10 gradients at 1% density
    # (ista_daslab_optimizers' m and k_init), with AdamW's point above for the rest (not tuned here)
    "MicroAdam": {"lr": 2e-3, "beta1": 0.9, "beta2": 0.999, "weight_decay": 0.05, "m": 10, "k_init": 0.01,
                  "warmup_factor": 0.05},
    # Schedule-Free AdamW (Defazio et al. 2024, arXiv:2405.15682): schedulefree 1.4.1's defaults, and no LR
    # schedule, which is the method's point; the runner evaluates it at x (its eval mode)
    "ScheduleFreeAdamW": {"lr": 2.5e-3, "beta1": 0.9, "beta2": 0.999, "weight_decay": 0.0, "schedule": "constant"},
    "SGD": {"lr": 0.05, "momentum": 0.9, "nesterov": True, "weight_decay": 1e-5, "warmup_factor": 0.05},
    "torch.SGD": {"lr": 0.05, "momentum": 0.9, "nesterov": True, "weight_decay": 1e-5, "warmup_factor": 0.05},
    # the memory-lean recipes, at their authors' settings with the arena's warmup and cosine decay (not tuned
    # here). A ``rank`` projects the matrices whose shorter side exceeds it (``parameter_groups``);
    # rank 32 is a quarter of shakespeare_charlm's model width (128), as the papers' rank 128 is
    # a quarter of their 60M LLaMA's 512. GaLore, Zhao et al. 2024 (galore-torch's README: lr 0.01, scale 0.25,
    # update_proj_gap 200); APOLLO and APOLLO-Mini, Zhu et al. 2024 (apollo-torch's README: lr 0.01, scale 1,
    # channel-wise, random projection; Mini: rank 1, scale 128, tensor-wise; update_proj_gap 200); FRUGAL,
    # Zmushko et al. 2024 (AdamW's lr 1e-3, signSGD on the rest, update_proj_gap 200); SubsetNorm, Nguyen et al.
    # 2024 (AdaGrad-Subset-Norm with momentum 0.9, no subspace, at AdaGrad-Norm's customary lr 1: its sum of
    # squares only grows, so the step shrinks by itself; gradwise's default 1e-2 barely moves these models);
    # Adam-mini, Zhang et al. 2024 ("the same hyperparameters as AdamW": AdamW's point above). LOMO and AdaLomo,
    # Lv et al. 2023, update inside backward; lomo-optim 0.1.1's lr 1e-3 is a fine-tuning rate that leaves
    # these models, trained from scratch, where they start: LOMO (plain SGD) takes the step of the arena's SGD
    # point (lr 0.05 with momentum 0.9: 0.5), AdaLomo Adafactor's point above (the same relative step)
    "GaLoreAdamW": {"lr": 1e-2, "rank": 32, "update_proj_gap": 200, "scale": 0.25, "warmup_factor": 0.05},
    "APOLLO": {"lr": 1e-2, "rank": 32, "update_proj_gap": 200, "scale": 1.0, "scale_type": "channel",
               "proj": "random", "warmup_factor": 0.05},
    "APOLLOMini": {"lr": 1e-2, "rank": 1, "update_proj_gap": 200, "scale": 128.0, "scale_type": "tensor",
                   "warmup_factor": 0.05},
    "FRUGAL": {"lr": 1e-3, "rank": 32, "update_proj_gap": 200, "warmup_factor": 0.05},
    "SubsetNorm": {"lr": 1.0, "momentum": 0.9, "warmup_factor": 0.05},
    "AdamMini": {"lr": 2e-3, "beta1": 0.9, "beta2": 0.999, "weight_decay": 0.05, "warmup_factor": 0.05},
    "LOMO": {"lr": 0.5, "warmup_factor": 0.05},
    "AdaLomo": {"lr": 1e-2, "warmup_factor": 0.05},
    # Shampoo, Distributed Shampoo's README example (Shi et al. 2023, arXiv:2309.06497: lr 1e-3, betas (0.9,
    # 0.999), epsilon 1e-12, decoupled weight decay 1e-5, Adam grafting, inverse roots every 100 steps)
    "Shampoo": {"lr": 1e-3, "beta1": 0.9, "beta2": 0.999, "weight_decay": 1e-5, "precondition_frequency": 100,
                "warmup_factor": 0.05},
    # Ranger21 (Wright & Demeure 2021, arXiv:2106.13731): pytorch-optimizer's lr 1e-3 and the authors' own
    # schedule (warmup 2 / (1 - beta2) steps, warm-down over the last 28 %) over the trial's step budget, which
    # the arena passes as num_iterations; so no arena schedule on top
    "Ranger21": {"lr": 1e-3, "schedule": "constant"},
    # Schedule-Free SGD (Defazio et al. 2024): schedulefree 1.4.1's SGDScheduleFree defaults (lr 1.0, momentum
    # 0.9), no LR schedule
    "ScheduleFreeSGD": {"lr": 1.0, "momentum": 0.9, "weight_decay": 0.0, "schedule": "constant"},
}


def self_tuning_point(name: str) -> dict[str, Any]:
    """A copy of the entry's self-tuning point (a variant's is its recipe's); ``ValueError`` if it has none."""
    recipe, _ = split_variant(name)
    if recipe not in SELF_TUNING:
        raise ValueError(f"no self-tuning defaults for optimizer {name!r}; have: {sorted(SELF_TUNING)}."
                         f" Give it hyperparameters (--hyperparameters '{{\"lr\": 1e-3}}') or a search space"
                         " (--search-space FILE, or --ruleset external for its shipped space)")
    return dict(SELF_TUNING[recipe])


def optimizer_class(name: str) -> type[torch.optim.Optimizer]:
    """The class an entry names (a variant's: its recipe's)."""
    recipe, state = split_variant(name)
    if recipe not in optimizer_names():
        raise ValueError(f"unknown optimizer {name!r}; valid: {optimizer_names()}")
    if state is not None:
        check_entry(name)
    if recipe.startswith("torch."):
        return getattr(torch.optim, recipe.removeprefix("torch."))
    return getattr(gradwise.recipes, recipe)


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
    if split_variant(name)[1] is not None and "state" in hyperparameters:
        raise ValueError(f"invalid state={hyperparameters['state']!r} for {name!r}: the variant's bracket is its"
                         f" state; enter {split_variant(name)[0]}[FORMAT] or give state= to the plain recipe")


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
    state = split_variant(name)[1]
    if state is not None:
        kwargs["state"] = state
    if not name.startswith("torch."):
        # as a user builds it: on the arena's models (under 2^20 elements) eager, with torch's fused kernel where the
        # step has one; a larger model's compile would count as training, as AlgoPerf counts it
        kwargs.setdefault("compile", "auto")
    return kwargs


def _tensor(item) -> torch.Tensor:
    """The parameter of a ``(name, parameter)`` pair, or the parameter itself."""
    return item[1] if isinstance(item, tuple) else item


def parameter_groups(name: str, kwargs: dict[str, Any], params) -> list:
    """The parameters (or ``(name, parameter)`` pairs, as the runner passes them, so that Muon's rule keeps
    embeddings and heads on AdamW by name) as the optimizer gets them. A recipe with a projection ``rank``
    (GaLore, APOLLO, FRUGAL, SubsetNorm) projects the matrices whose shorter side exceeds the rank, the others
    (vectors, convolutions, narrow heads) are in a group with ``rank=None``, on its full-rank rule, as the papers
    keep embeddings, norms and heads on AdamW: one rank then suits every workload."""
    params = list(params)
    default = inspect.signature(optimizer_class(name).__init__).parameters.get("rank")
    rank = kwargs.get("rank", default.default if default is not None else None)
    if rank is None:
        return params
    projected = [p for p in params if _tensor(p).dim() == 2 and min(_tensor(p).shape) > rank]
    rest = [p for p in params if not any(p is q for q in projected)]
    return [g for g in ({"params": projected}, {"params": rest, "rank": None}) if g["params"]]


def build_optimizer(name: str, hyperparameters: dict[str, Any], params, total_steps: int):
    """The optimizer and a per-step LR schedule: linear warmup over ``warmup_factor * total_steps``, then
    cosine decay to 0 at ``total_steps`` (or a constant LR). A recipe that takes its budget (Ranger21's
    ``num_iterations``) gets ``total_steps`` unless the hyperparameters give one."""
    kwargs = optimizer_kwargs(name, hyperparameters)
    budget = {"num_iterations", "num_epochs", "num_batches_per_epoch"}
    if "num_iterations" in inspect.signature(optimizer_class(name).__init__).parameters and not budget & set(kwargs):
        kwargs["num_iterations"] = total_steps  # Ranger21 schedules itself over the trial's step budget
    optimizer = optimizer_class(name)(parameter_groups(name, kwargs, params), **kwargs)
    return optimizer, lr_schedule(optimizer, hyperparameters, total_steps)


def lr_schedule(optimizer: torch.optim.Optimizer, hyperparameters: dict[str, Any],
                total_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    """The arena's per-step LR schedule on ``optimizer``: linear warmup over ``warmup_factor * total_steps``
    (default 0.05), then cosine decay to 0 at ``total_steps``; or a constant LR (``schedule="constant"``)."""
    warmup = max(1, int(hyperparameters.get("warmup_factor", 0.05) * total_steps))
    if hyperparameters.get("schedule", "warmup_cosine") == "constant":
        factor = lambda step: 1.0  # noqa: E731
    else:
        def factor(step: int) -> float:
            if step < warmup:
                return (step + 1) / warmup
            progress = min(1.0, (step - warmup) / max(1, total_steps - warmup))
            return 0.5 * (1 + math.cos(math.pi * progress))
    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


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
    With ``optimizer=None`` (an AlgoPerf submission, which reads its own hyperparameters) any names are allowed;
    a low-communication entry's (``DiLoCo[H=10]``, ``DeMo``) is checked by ``low_comm.check_space``."""
    from gradwise.arena import low_comm

    if optimizer is not None and low_comm.parse(optimizer) is not None:
        return low_comm.check_space(optimizer, space)
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
