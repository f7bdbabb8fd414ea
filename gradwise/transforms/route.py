"""Per-parameter routing: one optimizer, several chains, each parameter sent to one by a rule."""
from __future__ import annotations

from typing import Any, Callable, Mapping

from torch import Tensor

from gradwise.core.hyper import Hyper, choice
from gradwise.core.transform import Context, Transform

#: ``rule(name, param) -> route name``; ``name`` is None unless the user passed named parameters.
Rule = Callable[[str | None, Tensor], str]


class route(Transform):  # noqa: N801 - transforms are named like functions (optax grammar)
    """u <- chain_r(u), where r = ``rule(name, param)`` is fixed for each parameter at construction.

    ``route(rule, muon=chain(...), adamw=(chain(...), {"lr": 3e-4}))`` splits every param group the
    optimizer receives into one group per route, tagged ``group["route"]``; the optimizer then runs
    each group with its route's chain, eagerly or compiled as that chain allows. So the routes share
    one optimizer, one ``state_dict`` and one LR scheduler (which scales every group's ``lr``), and
    each route's hyperparameters live in its own groups.

    A group's value for a hyperparameter is, first to last: the value in the user's param group (it
    applies to every route of that group), the route's own dict, the optimizer's keyword argument.
    Where two routes declare the same hyperparameter with different defaults (Newton-Schulz's
    ``eps`` and Adam's ``eps``), each route gets its own chain's default. A group the user tags with
    ``"route"`` is not split. Each parameter keeps only its own route's state, under the same keys
    as without routing, and gets its route's hooks (``Optimizer.eval()`` moves the parameters of a
    Schedule-Free route); a guard (``skip_nonfinite``) in any route checks every gradient and skips
    the whole step.
    """

    name = "route"

    def __init__(self, rule: Rule, **routes: Transform | tuple[Transform, Mapping[str, Any]]):
        if not callable(rule):
            raise TypeError(f"route(): rule={rule!r} must be callable as rule(name, param) -> route name")
        if not routes:
            raise ValueError("route(): give at least one route, e.g. route(rule, muon=..., adamw=...)")
        self.rule = rule
        self.routes: dict[str, Transform] = {}
        self.route_defaults: dict[str, dict[str, Any]] = {}
        merged: dict[str, Hyper] = {}
        for key, entry in routes.items():
            transform, values = entry if isinstance(entry, tuple) else (entry, {})
            if not isinstance(transform, Transform):
                raise TypeError(f"route(): {key}={entry!r} must be a Transform or (Transform, dict)")
            unknown = sorted(set(values) - set(transform.hyper))
            if unknown:
                raise TypeError(f"route(): {key} got unknown hyperparameter(s) {unknown};"
                                f" allowed: {sorted(transform.hyper)}")
            for name, spec in transform.hyper.items():
                other = merged.setdefault(name, spec)
                if ((other.check, other.static, other.zero_is_identity)
                        != (spec.check, spec.static, spec.zero_is_identity)):
                    raise ValueError(f"route(): routes declare hyperparameter {name!r} differently; rename one")
            for name, value in values.items():
                transform.hyper[name].validate(name, value)
            own = {name: spec.default for name, spec in transform.hyper.items() if spec.default != merged[name].default}
            self.routes[key] = transform
            self.route_defaults[key] = {**own, **values}
        self.hyper = {**merged, "route": Hyper(next(iter(self.routes)), choice(tuple(self.routes)), static=True)}
        self.state = tuple(dict.fromkeys(k for t in self.routes.values() for k in t.state))
        self.nonnegative = tuple(dict.fromkeys(k for t in self.routes.values() for k in t.nonnegative))
        self.weights_like = tuple(dict.fromkeys(k for t in self.routes.values() for k in t.weights_like))
        self.elementwise = all(t.elementwise for t in self.routes.values())
        self.batched = any(t.batched for t in self.routes.values())
        # each route's own (a group runs one route: route.for_group), by name
        self.reductions = {name: op for t in self.routes.values() for name, op in t.reductions.items()}

    def split_group(self, group: dict[str, Any]) -> list[dict[str, Any]]:
        if "route" in group:
            self.hyper["route"].validate("route", group["route"])
            return [{**self.route_defaults[group["route"]], **group}]
        members: dict[str, list[Any]] = {key: [] for key in self.routes}
        for j, item in enumerate(group["params"]):
            name, p = item if isinstance(item, tuple) else (None, item)
            key = self.rule(name, p)
            if key not in self.routes:
                label = f"parameter {name!r}" if name else f"params[{j}] of shape {tuple(p.shape)}"
                raise ValueError(f"route(): the rule sent {label} to {key!r}; expected one of {list(self.routes)}")
            members[key].append(item)
        options = {k: v for k, v in group.items() if k != "params"}
        split = [{**self.route_defaults[key], **options, "params": items, "route": key}
                 for key, items in members.items() if items]
        return split or [{**group, "route": next(iter(self.routes))}]

    def for_group(self, group: Mapping[str, Any]) -> Transform:
        return self.routes[group["route"]].for_group(group)

    def wrapped(self, group: Mapping[str, Any] | None = None) -> list[tuple[str, Transform]]:
        return [("", t) for t in self.routes.values()] if group is None else [("", self.routes[group["route"]])]

    def init(self, param: Tensor, group: Mapping[str, Any]) -> dict[str, Tensor]:
        return self.for_group(group).init(param, group)

    def scalars(self, hyper: Mapping[str, Any], step: int) -> dict[str, float]:
        return self.for_group(hyper).scalars(hyper, step)

    def update(self, updates: list[Tensor], state: Mapping[str, list[Tensor]], ctx: Context) -> list[Tensor]:
        return self.routes[ctx["route"]].update(updates, state, ctx)

    def __repr__(self) -> str:
        return "route(" + ", ".join(f"{k}={t!r}" for k, t in self.routes.items()) + ")"


def matrices(name: str | None, param: Tensor) -> str:
    """The rule Muon uses: 2-D parameters to ``"matrix"``, except embeddings and output heads
    (recognized by name: ``embed``, ``wte``, ``wpe``, ``lm_head``, ``head``), and everything else to
    ``"other"`` (complex matrices too). Without names (plain ``model.parameters()``) only the shape decides."""
    if param.dim() != 2 or param.is_complex():
        return "other"
    if name is not None and any(word in name.lower() for word in ("embed", "wte", "wpe", "head")):
        return "other"
    return "matrix"


def at_least_2d(name: str | None, param: Tensor) -> str:
    """Tensors of two or more dimensions to ``"matrix"``, the others to ``"other"``, whatever their names
    (pytorch-optimizer's rule for MARS's correction and for Kron's weight decay)."""
    return "matrix" if param.dim() >= 2 else "other"
