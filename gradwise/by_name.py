"""Optimizers by name, for config-driven training (Hydra, YAML, HF-style ``optim="adamw"``).

``create("adamw", model, lr=3e-4, weight_decay=0.1)`` builds any gradwise recipe or ``torch.<Name>`` for any
``torch.optim`` optimizer; names are case-insensitive. ``weight_decay_exclude=True`` puts the parameters that
training code usually keeps out of weight decay (biases, norm weights and embeddings: 1-D and 0-d tensors,
the parameters of a module's norm and embedding layers, and, when the parameters are named, names matching
``bias``, ``norm`` or ``embed``) in a second group with ``weight_decay=0``, as HF Trainer and nanoGPT do by
hand; a string is a regular expression over the names to use in place of the layer types and that default one.
"""
from __future__ import annotations

import inspect
import re
from typing import Any, Iterable

import torch

import gradwise.recipes

#: names excluded from weight decay by ``weight_decay_exclude=True`` (searched, case-insensitive).
DEFAULT_EXCLUDE = r"bias|norm|embed"
#: the layers whose parameters ``weight_decay_exclude=True`` excludes when ``create`` is given a module.
EXCLUDED_LAYERS = (torch.nn.Embedding, torch.nn.EmbeddingBag, torch.nn.LayerNorm, torch.nn.GroupNorm,
                   torch.nn.RMSNorm, torch.nn.modules.batchnorm._NormBase)


def _optimizers(module) -> list[str]:
    return sorted(n for n in dir(module) if isinstance(getattr(module, n), type)
                  and issubclass(getattr(module, n), torch.optim.Optimizer) and n != "Optimizer")


def recipe_names() -> list[str]:
    """The gradwise recipes that take parameters. Wrappers that take an optimizer or a transform
    (``Lookahead``, ``schedule_free``) are not among them."""
    return [n for n in _optimizers(gradwise.recipes) if n in gradwise.recipes.__all__]


def optimizer_names() -> list[str]:
    """Every name ``create`` takes: the gradwise recipes, then ``torch.<Name>`` for torch.optim."""
    return recipe_names() + [f"torch.{n}" for n in _optimizers(torch.optim)]


def canonical_name(name: str, names: list[str] | None = None, argument: str = "name") -> str:
    """``name`` as spelled in ``names`` (default: every optimizer name), matched case-insensitively;
    otherwise a ``ValueError`` naming ``argument``, the value and the valid names."""
    names = optimizer_names() if names is None else names
    by_lower = {n.lower(): n for n in names}
    if isinstance(name, str) and name.lower() in by_lower:
        return by_lower[name.lower()]
    hint = ""
    if isinstance(name, str) and f"torch.{name}".lower() in {n.lower() for n in optimizer_names()}:
        hint = f" (torch's optimizer is spelled 'torch.{name}')"
    raise ValueError(f"invalid {argument}={name!r}{hint}: expected one of {', '.join(names)}"
                     " (case-insensitive)")


def optimizer_class(name: str) -> type[torch.optim.Optimizer]:
    """The optimizer class a name stands for (``"adamw"`` -> ``gradwise.AdamW``, ``"torch.sgd"`` ->
    ``torch.optim.SGD``)."""
    name = canonical_name(name)
    if name.startswith("torch."):
        return getattr(torch.optim, name.removeprefix("torch."))
    return getattr(gradwise.recipes, name)


def create(name: str, params: torch.nn.Module | Iterable[Any], *, weight_decay_exclude: bool | str = False,
           **hyperparameters: Any) -> torch.optim.Optimizer:
    """Build the optimizer ``name`` (see ``optimizer_names()``) over ``params`` with ``hyperparameters``.

    Args:
        name: a gradwise recipe (``"AdamW"``) or ``"torch.<Name>"``, in any case.
        params: a module (its named parameters), ``named_parameters()``, parameters or param groups.
        weight_decay_exclude: ``True`` moves 1-D and 0-d tensors, and named parameters matching
            ``DEFAULT_EXCLUDE``, and those of a module's ``EXCLUDED_LAYERS``, into a group with
            ``weight_decay=0``; a string is the regular expression for the names instead (1-D and 0-d
            tensors are still excluded). Needs a module or parameters, not param groups.
        **hyperparameters: the optimizer's own keywords (``lr``, ``weight_decay``, ``betas``, ...).
    """
    cls = optimizer_class(name)
    layers: set[int] = set()
    if isinstance(params, torch.nn.Module):
        if weight_decay_exclude is True:
            layers = {id(p) for m in params.modules() if isinstance(m, EXCLUDED_LAYERS)
                      for p in m.parameters(recurse=False)}
        params = params.named_parameters()
    if weight_decay_exclude is not False:
        params = _decay_groups(canonical_name(name), cls, list(params), weight_decay_exclude, layers)
    return cls(params, **hyperparameters)


def _decay_groups(name: str, cls, params: list, exclude: bool | str, layers: set[int]) -> list[dict[str, Any]]:
    """Two groups: the parameters weight decay applies to, and those it does not (``weight_decay=0``);
    ``layers`` holds the ids of tensors excluded for the layer they belong to."""
    if exclude is not True and not isinstance(exclude, str):
        raise ValueError(f"invalid weight_decay_exclude={exclude!r}: expected True, False or a regular expression")
    if "weight_decay" not in inspect.signature(cls.__init__).parameters:
        raise ValueError(f"invalid weight_decay_exclude={exclude!r}: optimizer {name!r} has no weight_decay")
    if any(isinstance(p, dict) for p in params):
        raise ValueError(f"invalid weight_decay_exclude={exclude!r} with param groups: pass parameters,"
                         " named_parameters() or a module and let create() build the groups")
    named = all(isinstance(p, tuple) for p in params) and bool(params)
    if isinstance(exclude, str):
        if not named:
            raise ValueError(f"invalid weight_decay_exclude={exclude!r}: a name pattern needs named parameters"
                             " (a module or named_parameters())")
        try:
            pattern = re.compile(exclude, re.IGNORECASE)
        except re.error as error:
            raise ValueError(f"invalid weight_decay_exclude={exclude!r}: {error}") from None
    else:
        pattern = re.compile(DEFAULT_EXCLUDE, re.IGNORECASE)

    def excluded(entry) -> bool:
        tensor = entry[1] if named else entry
        return tensor.dim() <= 1 or id(tensor) in layers or (named and pattern.search(entry[0]) is not None)

    decay = [p for p in params if not excluded(p)]
    no_decay = [p for p in params if excluded(p)]
    return [g for g in ({"params": decay}, {"params": no_decay, "weight_decay": 0.0}) if g["params"]]
