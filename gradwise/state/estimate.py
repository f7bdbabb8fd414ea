"""``gradwise.estimate``: the bytes an optimizer's state will take, before any of it is allocated.

The optimizer is built on meta tensors shaped like the model's parameters (or an existing one is
read), each transform's ``init`` runs on the meta device to give the buffers' shapes and dtypes, and
the state policy's codec for each parameter says how many bytes each buffer takes when stored.
"""
from __future__ import annotations

import inspect
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import torch
from torch import Tensor

from gradwise.state.engine import EncodedState
from gradwise.state.shards import LocalShard

#: the 0-d float32 step counter torch.optim keeps per parameter.
STEP_BYTES = 4


@dataclass
class StateEstimate:
    """Bytes of optimizer state: ``rows`` holds one dict per (group, format) with the buffers, the
    parameter elements they belong to, and bytes; ``params`` counts parameter elements."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    params: int = 0

    @property
    def total(self) -> int:
        return sum(r["bytes"] for r in self.rows)

    @property
    def bytes_per_param(self) -> float:
        return self.total / max(self.params, 1)

    def by(self, column: str) -> dict[Any, int]:
        out: dict[Any, int] = defaultdict(int)
        for r in self.rows:
            out[r[column]] += r["bytes"]
        return dict(out)

    def table(self) -> str:
        """A plain-text table: one line per group and format, then totals per format and overall."""
        lines = [f"{'group':>5}  {'format':<22}{'buffers':>8}{'bytes':>16}{'bytes/param':>13}"]
        for r in self.rows:
            lines.append(f"{r['group']:>5}  {r['format']:<22}{r['buffers']:>8}{r['bytes']:>16,}"
                         f"{r['bytes'] / max(self.params, 1):>13.4f}")
        for fmt, nbytes in self.by("format").items():
            lines.append(f"{'all':>5}  {fmt:<22}{'':>8}{nbytes:>16,}{nbytes / max(self.params, 1):>13.4f}")
        lines.append(f"{'total':>5}  {'':<22}{'':>8}{self.total:>16,}{self.bytes_per_param:>13.4f}"
                     f"   ({self.params:,} parameter elements)")
        return "\n".join(lines)

    __str__ = table


def estimate(model: torch.nn.Module | Iterable[Any], optimizer_or_recipe: Any, **recipe_kwargs: Any) -> StateEstimate:
    """Optimizer state bytes per format (codec or dtype), per param group and in total.

    Args:
        model: a module (its ``named_parameters()``), or what an optimizer takes as ``params``.
        optimizer_or_recipe: a ``gradwise.Optimizer`` (read as it is configured), a recipe class or
            any callable building one from params and ``recipe_kwargs`` (``gradwise.AdamW``), or a
            recipe name (``"AdamW"``).
        **recipe_kwargs: passed to the recipe, e.g. ``state="int8"``. A recipe whose ``lr`` has no
            default (CAME, Ranger21) gets ``lr=1.0`` unless one is given: the learning rate changes
            no buffer's size.
    """
    return _estimate(meta_optimizer(model, optimizer_or_recipe, "estimate", **recipe_kwargs))


def meta_optimizer(model: Any, optimizer_or_recipe: Any, caller: str, **recipe_kwargs: Any) -> Any:
    """The optimizer an estimate reads: ``optimizer_or_recipe`` itself when it is one (then no
    ``recipe_kwargs`` may be given: ``caller`` names the function in that error), else the recipe
    built on meta tensors shaped like ``model``'s parameters (``estimate``'s arguments)."""
    from gradwise.core.optimizer import Optimizer

    if isinstance(optimizer_or_recipe, Optimizer):
        if recipe_kwargs:
            raise TypeError(f"{caller}() got recipe keywords {sorted(recipe_kwargs)} with an optimizer instance;"
                            " pass a recipe (e.g. gradwise.AdamW) to configure one")
        return optimizer_or_recipe
    recipe = _recipe(optimizer_or_recipe)
    if "lr" not in recipe_kwargs and _needs_lr(recipe):
        recipe_kwargs = {**recipe_kwargs, "lr": 1.0}
    return recipe(_meta_params(model), **recipe_kwargs)


def _recipe(spec: Any) -> Callable[..., Any]:
    import gradwise

    if isinstance(spec, str):
        names = gradwise.recipes.__all__  # not getattr alone: gradwise.recipes.adam is a module
        if spec not in names:
            near = [n for n in names if n.lower() == spec.lower()]
            hint = f"; did you mean {near[0]!r}?" if near else ""
            raise ValueError(f"invalid optimizer_or_recipe={spec!r}: expected one of {names}, a recipe class, or"
                             f" an optimizer{hint}")
        return getattr(gradwise.recipes, spec)
    if callable(spec):
        return spec
    raise TypeError(f"invalid optimizer_or_recipe={spec!r}: expected a gradwise optimizer, recipe or recipe name")


def _needs_lr(recipe: Callable[..., Any]) -> bool:
    """Whether ``recipe`` takes an ``lr`` without a usable default (none, or None as CAME's)."""
    try:
        lr = inspect.signature(recipe).parameters.get("lr")
    except (TypeError, ValueError):  # a callable without a signature
        return False
    return lr is not None and (lr.default is inspect.Parameter.empty or lr.default is None)


def _meta_params(model: Any) -> list[Any]:
    """The model's parameters as meta tensors (names and groups kept), so nothing is allocated."""
    def meta(p: Tensor) -> Tensor:
        return torch.empty(p.shape, dtype=p.dtype, device="meta", requires_grad=True)

    if isinstance(model, torch.nn.Module):
        return [(n, meta(p)) for n, p in model.named_parameters()]
    out = []
    for item in model:
        if isinstance(item, dict):
            out.append({**item, "params": [(i[0], meta(i[1])) if isinstance(i, tuple) else meta(i)
                                           for i in ([item["params"]] if isinstance(item["params"], Tensor)
                                                     else item["params"])]})
        elif isinstance(item, tuple):
            out.append((item[0], meta(item[1])))
        else:
            out.append(meta(item))
    return out


def _estimate(optimizer: Any) -> StateEstimate:
    transform = optimizer.transform
    engine = EncodedState(optimizer.storage.policy, transform)  # its decisions, whatever the optimizer stores
    counts: dict[tuple[int, str], list[int]] = defaultdict(lambda: [0, 0])
    params = 0
    for index, group in enumerate(optimizer.param_groups):
        names = group.get("param_names") or [None] * len(group["params"])
        for p, name in zip(group["params"], names):
            params += p.numel()
            shape_param = torch.empty(p.shape, dtype=p.dtype, device="meta")
            codec = engine.codec_for(p, name)
            for buffer, value in transform.init(shape_param, group).items():
                fmt, nbytes = stored_bytes(engine, codec, buffer, value, p)
                counts[(index, fmt)][0] += 1
                counts[(index, fmt)][1] += nbytes
            counts[(index, "step counters")][0] += 1
            counts[(index, "step counters")][1] += STEP_BYTES
    rows = [{"group": g, "format": f, "buffers": n, "bytes": b}
            for (g, f), (n, b) in sorted(counts.items(), key=lambda kv: (kv[0][0], kv[0][1] == "step counters"))]
    return StateEstimate(rows, params)


def stored_bytes(engine: EncodedState, codec: Any, buffer: str, value: Tensor, p: Tensor,
                 shard: LocalShard | None = None) -> tuple[str, int]:
    """(format, bytes) of state ``buffer`` (fresh ``value``, of parameter ``p``, whose policy chose
    ``codec``) as the optimizer stores it; ``shard``: of only a rank's rows of it (a buffer shaped like
    a sharded parameter, whose encoded parts are laid out by rows: ``gradwise.state.shards``)."""
    shape = value.shape if shard is None else shard.local_shape
    if codec is not None and engine.encodable(buffer, value, p):
        signed = buffer not in engine.nonnegative
        if shard is None:
            return codec.tag, codec.nbytes(shape, signed)
        parts = codec.empty(shape, signed, torch.device("meta"), shard)
        return codec.tag, sum(t.numel() * t.element_size() for t in parts.values())
    return _dtype_label(value.dtype), shape.numel() * value.element_size()


def _dtype_label(dtype: torch.dtype) -> str:
    """``fp32`` for torch.float32, ``int64`` for torch.int64 (APOLLO's seeds), ``bfloat16`` as it is."""
    name = str(dtype).removeprefix("torch.")
    return name.replace("float", "fp") if name.startswith("float") else name
