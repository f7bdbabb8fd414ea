"""The arena's low-communication entries and how each is built on one worker of a multi-worker trial.

Entries (``gradwise arena run --workers-per-trial N --optimizers ...``), each on ``N`` gloo workers:

* any recipe, e.g. ``AdamW``: data parallel, under ``DistributedDataParallel``; every step all-reduces the
  gradients (torch's all-reduce hook, each bucket's bytes counted);
* ``DiLoCo[H=h]``: DiLoCo-AdamW (``gradwise.DiLoCo``), AdamW inner steps at AdamW's self-tuning point, the
  pseudo-gradients averaged every ``h`` steps and stepped by Nesterov SGD, outer lr 0.7, momentum 0.9
  (Douillard et al. 2023's outer optimizer);
* ``StreamingDiLoCo[H=h]``: the same with Streaming DiLoCo's fragments (Douillard et al. 2025): 2 fragments
  (at most the parameter count) synced at staggered steps, each sync overlapped with 1 inner step and merged with
  alpha 0.5 (our setting, not tuned);
* ``DiLoCoPowerSGD[H=h]``: ``DiLoCo[H=h]`` with its pseudo-gradients compressed by PowerSGD at rank 4
  (``pseudo_gradient_codec="powersgd-r4"``: warm-started Q, error feedback per worker);
* ``DeMo``: ``gradwise.DeMo`` at the authors' defaults (bloc97/DeMo: momentum decay 0.999, top-32 of each 64 x 64
  DCT chunk, no weight decay, the sign step), AdamW's lr 2e-3 and the arena's warmup and cosine decay;
* ``PowerSGD[r=r]``: DDP with torch's PowerSGD hook (``gradwise.distributed.powersgd``): rank ``r``, error
  feedback and warm start (Vogels et al. 2019), 2 plain all-reduced steps first (torch's least), AdamW's point.

Names are parsed and checked here alone; a low-communication entry always runs on workers (``--workers-per-trial``).

External tuning (``--ruleset external``: the shipped ``gradwise/arena/spaces/<method>.json``, or ``--search-space``)
draws points over the inner optimizer's keys (AdamW's; DeMo's are its own) and the method's ``METHOD_KEYS``; a
key a point leaves out keeps the default of ``build`` (DiLoCo's outer lr 0.7, momentum 0.9) or of the optimizer,
and the bracket's value (``H``, ``r``) comes from the name. ``check_space`` refuses, before any study is written,
an unknown key, the bracket's key, an int or bool key given as a range, and values the method refuses (each
key's extremes built on a dummy parameter), every error naming the key.
"""

import re
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import Tensor, nn

from gradwise.core.collectives import Traffic

#: entry -> the name of its bracketed integer (None: no bracket)
METHODS = {"DiLoCo": "H", "StreamingDiLoCo": "H", "DiLoCoPowerSGD": "H", "PowerSGD": "r", "DeMo": None}
#: the keys each method adds to AdamW's point (DeMo's are its own keywords)
METHOD_KEYS = {"DiLoCo": ("sync_every", "outer_lr", "outer_momentum"),
               "StreamingDiLoCo": ("sync_every", "outer_lr", "outer_momentum", "fragments", "overlap", "merge_alpha"),
               "DiLoCoPowerSGD": ("sync_every", "outer_lr", "outer_momentum", "powersgd_rank"),
               "PowerSGD": ("rank", "start_powerSGD_iter"),
               "DeMo": ("lr", "momentum", "chunk", "topk", "weight_decay", "sign", "adam_beta2", "eps")}
#: the keys that take ints or bools: a search space gives them as feasible points, not ranges
DISCRETE_KEYS = {"sync_every", "fragments", "overlap", "powersgd_rank", "rank", "start_powerSGD_iter", "chunk",
                 "topk", "sign"}
_BRACKET_KEY = {"DiLoCo": "sync_every", "StreamingDiLoCo": "sync_every", "DiLoCoPowerSGD": "sync_every",
                "PowerSGD": "rank"}
_NAME = re.compile(r"(\w+)(?:\[(\w+)=(\d+)\])?")


def parse(name: str, argument: str = "optimizer") -> tuple[str, int | None] | None:
    """``("DiLoCo", 10)`` for ``"DiLoCo[H=10]"`` (case-insensitive), ``("DeMo", None)`` for ``"DeMo"``; None for
    a name that is no low-communication method; a ``ValueError`` for one of their names spelled wrong."""
    match = _NAME.fullmatch(name.strip()) if isinstance(name, str) else None
    by_lower = {m.lower(): m for m in METHODS}
    if match is None or match[1].lower() not in by_lower:
        return None
    method = by_lower[match[1].lower()]
    key = METHODS[method]
    if key is None and match[2] is None:
        return method, None
    if key is None or match[2] is None or match[2].lower() != key.lower() or int(match[3]) < 1:
        form = method if key is None else f"{method}[{key}=<int >= 1>]"
        raise ValueError(f"invalid {argument}={name!r}: the low-communication entry is spelled {form}")
    return method, int(match[3])


def canonical(name: str) -> str:
    method, value = parse(name)
    return method if value is None else f"{method}[{METHODS[method]}={value}]"


def self_tuning_point(name: str) -> dict[str, Any]:
    """The entry's point: AdamW's self-tuning point plus the method's settings (see the module's docstring)."""
    from gradwise.arena.submissions import SELF_TUNING

    method, value = parse(name)
    adamw = dict(SELF_TUNING["AdamW"])
    if method == "DeMo":
        return {"lr": adamw["lr"], "momentum": 0.999, "chunk": 64, "topk": 32, "weight_decay": 0.0,
                "warmup_factor": adamw["warmup_factor"]}
    if method == "PowerSGD":
        return {**adamw, "rank": value, "start_powerSGD_iter": 2}
    point = {**adamw, "sync_every": value, "outer_lr": 0.7, "outer_momentum": 0.9}
    if method == "StreamingDiLoCo":
        point.update(fragments=2, overlap=1, merge_alpha=0.5)
    if method == "DiLoCoPowerSGD":
        point.update(powersgd_rank=4)
    return point


def check_hyperparameters(name: str, hyperparameters: dict[str, Any]) -> None:
    """The entry's keys only, and its bracket's value where the point repeats it."""
    from gradwise.arena.submissions import SCHEDULE_KEYS, allowed_hyperparameters
    from gradwise.arena.submissions import check_hyperparameters as check_recipe

    method, value = parse(name)
    base = set(SCHEDULE_KEYS) if method == "DeMo" else set(allowed_hyperparameters("AdamW"))
    allowed = sorted(base | set(METHOD_KEYS[method]))
    unknown = sorted(set(hyperparameters) - set(allowed))
    if unknown:
        raise ValueError(f"unknown hyperparameter(s) {unknown} for {canonical(name)!r}; allowed: {allowed}")
    key = _BRACKET_KEY.get(method)
    if key in hyperparameters and hyperparameters[key] != value:
        raise ValueError(f"invalid {key}={hyperparameters[key]!r} for {canonical(name)!r}: the bracket sets it to"
                         f" {value}; enter {method}[{METHODS[method]}={hyperparameters[key]}] instead")
    if method != "DeMo":
        check_recipe("AdamW", {k: v for k, v in hyperparameters.items() if k not in METHOD_KEYS[method]})


def check_space(name: str, space: dict[str, dict] | list[dict[str, Any]]) -> dict | list:
    """Entry ``name``'s search space (AlgoPerf's dict or list form), checked (see the module's docstring)."""
    from gradwise.arena.submissions import check_search_space

    method, _ = parse(name)
    if isinstance(space, list):
        check_search_space(None, space)
        for point in space:
            check_point(name, point)
        return space
    check_search_space(None, space)  # the form of each entry; the keys below
    base = {k: _first(spec) for k, spec in space.items()}
    check_hyperparameters(name, base)
    key = _BRACKET_KEY.get(method)
    if key in space:
        raise ValueError(f"invalid search space key {key!r} for {canonical(name)!r}: the bracket sets it; tune it"
                         f" with one entry per value ({method}[{METHODS[method]}=<int>])")
    ranged = sorted(k for k, spec in space.items() if k in DISCRETE_KEYS and "feasible_points" not in spec)
    if ranged:
        raise ValueError(f"invalid search space key(s) {ranged} for {canonical(name)!r}: they take ints or bools;"
                         " give them as feasible_points, not a min/max range")
    try:
        check_point(name, base)
    except (TypeError, ValueError) as error:
        raise ValueError(f"invalid search space for {canonical(name)!r} at each key's first value {base}:"
                         f" {error}") from error
    for k, spec in space.items():
        for value in spec["feasible_points"] if "feasible_points" in spec else (spec["min"], spec["max"]):
            try:
                check_point(name, {**base, k: value})
            except (TypeError, ValueError) as error:
                raise ValueError(f"invalid search space key {k!r} for {canonical(name)!r} at {k}={value!r}:"
                                 f" {error}") from error
    return space


def _first(spec: dict[str, Any]) -> Any:
    return spec["feasible_points"][0] if "feasible_points" in spec else spec["min"]


def check_point(name: str, point: dict[str, Any]) -> None:
    """``point``'s keys (``check_hyperparameters``) and values: the method built on a dummy parameter, outside
    any process group (PowerSGD, whose hook needs DDP and a group: AdamW and the hook's arguments alone)."""
    from gradwise.arena.submissions import build_optimizer
    from gradwise.distributed.powersgd import check_powersgd

    check_hyperparameters(name, point)
    method = parse(name)[0]
    model = nn.Linear(2, 2)
    if method == "PowerSGD":
        own = {k: point[k] for k in METHOD_KEYS[method] if k in point}
        check_powersgd(**{"rank": parse(name)[1], "start_powerSGD_iter": 2, **own})
        build_optimizer("AdamW", {k: v for k, v in point.items() if k not in own}, model.parameters(), 10)
    else:
        build(name, point, model, 10)


@dataclass
class Method:
    """One worker's training: call ``module``, step ``optimizer`` then ``schedule``; ``traffic`` counts what
    it sent; ``eval_point`` (DiLoCo's outer copy) the parameters to evaluate at, None for the model's own."""

    module: nn.Module
    optimizer: Any
    schedule: torch.optim.lr_scheduler.LRScheduler
    traffic: Traffic
    eval_point: list[Tensor] | None = None


def _counted_allreduce(traffic: Traffic, bucket) -> torch.futures.Future[Tensor]:
    """torch's DDP all-reduce hook (the gradients averaged), the bucket's bytes counted as an all-reduce."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    traffic.record("all_reduce", bucket.buffer().nbytes)
    return allreduce_hook(None, bucket)


def _outer_nesterov(momentum: float) -> Callable[..., torch.optim.Optimizer]:
    return lambda params, lr: torch.optim.SGD(params, lr=lr, momentum=momentum, nesterov=True)


def build(name: str, hyperparameters: dict[str, Any], model: nn.Module, total_steps: int) -> Method:
    """Entry ``name`` (a recipe: data parallel) on this worker, over the default process group."""
    import gradwise
    from gradwise.arena.submissions import build_optimizer, lr_schedule
    from gradwise.distributed.powersgd import register_powersgd

    parsed = parse(name)
    method = parsed[0] if parsed else None
    point = dict(hyperparameters)
    own = {k: point.pop(k) for k in METHOD_KEYS.get(method, ()) if k in point}
    if method in _BRACKET_KEY:  # an external-tuning point leaves it out: the name holds it
        own.setdefault(_BRACKET_KEY[method], parsed[1])
    if method == "DeMo":
        demo = gradwise.DeMo(model.parameters(), **own)
        return Method(model, demo, lr_schedule(demo, point, total_steps), demo.traffic)
    if method in ("DiLoCo", "StreamingDiLoCo", "DiLoCoPowerSGD"):
        inner, schedule = build_optimizer("AdamW", point, model.parameters(), total_steps)
        count = sum(1 for _ in model.parameters())
        diloco = gradwise.DiLoCo(inner, outer=_outer_nesterov(own.get("outer_momentum", 0.9)),
                                 outer_lr=own.get("outer_lr", 0.7), sync_every=own["sync_every"],
                                 fragments=min(own.get("fragments", 1), count), overlap=own.get("overlap", 0),
                                 merge_alpha=own.get("merge_alpha", 0.0),
                                 pseudo_gradient_codec=f"powersgd-r{own['powersgd_rank']}" if "powersgd_rank" in own
                                 else None)
        return Method(model, diloco, schedule, diloco.traffic, diloco.synced)
    ddp = nn.parallel.DistributedDataParallel(model)
    optimizer, schedule = build_optimizer("AdamW" if method == "PowerSGD" else name, point, model.parameters(),
                                          total_steps)
    if method == "PowerSGD":
        counted = register_powersgd(ddp, rank=own["rank"], start_powerSGD_iter=own.get("start_powerSGD_iter", 2))
        return Method(ddp, optimizer, schedule, counted.traffic)
    traffic = Traffic()
    ddp.register_comm_hook(traffic, _counted_allreduce)
    return Method(ddp, optimizer, schedule, traffic)
