"""Fused-backward updates: each parameter steps inside ``backward()`` as soon as its gradient is
complete, and its gradient is freed, so no full set of gradients ever exists (LOMO, Lv et al. 2023,
"Full Parameter Fine-tuning for Large Language Models with Limited Resources", arXiv:2306.09782;
AdaLomo, Lv et al. 2023, arXiv:2310.10195).

PyTorch's tutorial ("How to save memory by fusing the optimizer step into the backward pass") builds
one optimizer per parameter. Here one optimizer serves every parameter: one ``state_dict``, one set of
param groups that LR schedulers change, and each parameter's step counter advances once per backward.
A hook registered with ``Tensor.register_post_accumulate_grad_hook`` runs the optimizer's chain on
that one parameter (exactly what ``optimizer.step()`` would compute for it) and sets ``p.grad = None``::

    optimizer = gradwise.AdamW(model.parameters(), lr=1e-3)
    handle = gradwise.fused_backward(optimizer)
    for x, y in data:
        loss_fn(model(x), y).backward()   # every parameter is updated here
        optimizer.step()                  # finds no gradient: a no-op, kept for schedulers and hooks
        scheduler.step()
    handle.remove()                       # back to ordinary steps

Every backward is a step: gradient accumulation over several backward passes is not possible, and
``torch.nn.utils.clip_grad_norm_`` between backward and step sees no gradients. Chains that need all
gradients of a step before any update (a guard such as ``skip_nonfinite``, a reduction over every
parameter such as ``clip_by_global_norm``, matrix preconditioners that batch matrices across
parameters) raise at ``fused_backward``. A hook that raises (a bad hyperparameter set by a
scheduler, a sparse gradient) leaves the parameters already stepped in that backward stepped.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torch.utils.weak import WeakIdKeyDictionary

from gradwise.core.hyper_check import Checked, check_hyperparameters
from gradwise.core.params import DTensor, param_label
from gradwise.core.transform import uses

#: parameter -> the handle whose hook updates it, so that two optimizers never both step one tensor.
_INSTALLED = WeakIdKeyDictionary()


class FusedBackward:
    """The hooks of one optimizer; ``remove()`` (or leaving a ``with`` block) takes them off."""

    def __init__(self, optimizer: Any):
        self.optimizer = optimizer
        self._where: dict[int, tuple[int, int]] = {}
        #: id(group) -> what ``check_hyperparameters`` accepted there last: a hook checks only changed values
        self._checked: dict[int, Checked] = {}
        self._hooks = []
        params = [p for g in optimizer.param_groups for p in g["params"] if p.requires_grad]
        for p in params:
            if p in _INSTALLED:
                raise ValueError(f"{self._label(p)} is already updated in backward by another fused_backward();"
                                 " call remove() on that handle first")
        for p in params:
            self._hooks.append(p.register_post_accumulate_grad_hook(self._step_parameter))
            _INSTALLED[p] = self

    def _label(self, p: Tensor) -> str:
        for index, group in enumerate(self.optimizer.param_groups):
            if any(q is p for q in group["params"]):
                return param_label(group, p, index)
        return "a parameter"

    def _group_of(self, p: Tensor) -> dict[str, Any]:
        """``p``'s param group now (``load_state_dict`` replaces the group dicts, so look it up)."""
        groups = self.optimizer.param_groups
        place = self._where.get(id(p))
        if place is None or place[0] >= len(groups) or place[1] >= len(groups[place[0]]["params"]) \
                or groups[place[0]]["params"][place[1]] is not p:
            self._where = {id(q): (i, j) for i, g in enumerate(groups) for j, q in enumerate(g["params"])}
            place = self._where[id(p)]
        return groups[place[0]]

    @torch.no_grad()
    def _step_parameter(self, p: Tensor) -> None:
        optimizer = self.optimizer
        if optimizer.mode == "eval" and uses(optimizer.transform, "set_mode"):
            raise RuntimeError(f"{type(optimizer).__name__}: backward() in eval mode with fused_backward(): the"
                               " parameters hold the evaluation point; call optimizer.train() first")
        group = self._group_of(p)
        self._checked[id(group)] = check_hyperparameters(optimizer, group, self._checked.get(id(group)))
        if p.grad.is_sparse:
            raise TypeError(f"{self._label(p)} has a sparse gradient; gradwise optimizers need dense gradients")
        optimizer.step_parameters(group, [p])
        p.grad = None

    def remove(self) -> None:
        """Take the hooks off: from the next backward on, gradients accumulate and ``step()`` applies them."""
        for hook in self._hooks:
            hook.remove()
        self._hooks = []
        for p in [p for p, handle in _INSTALLED.items() if handle is self]:
            del _INSTALLED[p]

    def __enter__(self) -> "FusedBackward":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.remove()


def installed_on(optimizer: Any) -> list[FusedBackward]:
    """The handles whose hooks step ``optimizer`` inside backward (none, or one)."""
    return list({id(h): h for h in _INSTALLED.values() if h.optimizer is optimizer}.values())


def fused_backward(optimizer: Any) -> FusedBackward:
    """Update every parameter of ``optimizer`` inside ``backward()`` and free its gradient; returns a
    handle whose ``remove()`` undoes it (also a context manager). See the module docstring."""
    from gradwise.core.optimizer import Optimizer

    if not isinstance(optimizer, Optimizer):
        kind = f"{type(optimizer).__module__}.{type(optimizer).__qualname__}"
        raise TypeError(f"invalid optimizer of type {kind}: fused_backward() takes a gradwise Optimizer"
                        " (e.g. gradwise.AdamW); for torch.optim, see PyTorch's per-parameter-optimizer tutorial")
    name = type(optimizer).__name__
    statistics = optimizer.transform.reductions
    if any(op == "skip" for op in statistics.values()):
        raise ValueError(f"fused_backward({name}): its chain has a guard ({optimizer.transform!r}) that decides"
                         " from every gradient of the step whether to skip it (skip_nonfinite=True); inside"
                         " backward the first parameters are updated before the last gradients exist")
    if statistics:
        raise ValueError(f"fused_backward({name}): its chain reduces {sorted(statistics)} over every parameter of"
                         " the step before updating any (e.g. clip_by_global_norm); inside backward the first"
                         " parameters are updated before the last gradients exist")
    for group in optimizer.param_groups:
        if optimizer.transform.for_group(group).batched:
            raise ValueError(f"fused_backward({name}): {optimizer.transform.for_group(group)!r} batches"
                             " matrices across parameters, so it needs every gradient of the step first")
    for group in optimizer.param_groups:
        for index, p in enumerate(group["params"]):
            if isinstance(p, DTensor):
                raise NotImplementedError(f"fused_backward({name}): parameter {index} of a group is a DTensor;"
                                          " FSDP2 reduce-scatters gradients into sharded parameters after"
                                          " autograd's accumulation, so the hooks would never run. Build the"
                                          " optimizer with fused_backward=False and call step() after"
                                          " backward: it steps the shards exactly as unsharded")
    return FusedBackward(optimizer)
