"""``Context``: what a transform's ``update`` sees besides its updates and its own state (the bucket's
parameters and gradients, its hyperparameters, scalars and the step's reductions), for one bucket."""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Mapping

import torch
from torch import Tensor


@dataclass
class Context:
    """What a transform sees besides the updates and its own state, for one bucket of parameters.

    ``params`` and ``grads`` are aligned with the update list. ``hyper`` maps each hyperparameter
    name to a 0-d tensor (a tuple of them for tuple-valued entries such as ``betas``); ``scalars``
    holds the link's own values from ``Transform.scalars`` as 0-d tensors; ``static`` holds Python
    values: static hyperparameters, and for every ``zero_is_identity`` hyperparameter the flag
    ``"<name>!=0"``; ``reduced`` holds the totals of the step's reductions computed so far (0-d
    tensors, over every parameter of the step). ``ctx[name]`` looks in ``static``, ``scalars``,
    ``reduced``, then ``hyper``.
    """

    params: list[Tensor]
    grads: list[Tensor]
    hyper: Mapping[str, Any]
    static: Mapping[str, Any] = field(default_factory=dict)
    scalars: Mapping[str, Tensor] = field(default_factory=dict)
    reduced: Mapping[str, Tensor] = field(default_factory=dict)
    #: for the last link of a phase whose results the next phase reads: tensors shaped like the
    #: updates, kept between steps, that it may write its results into (``out=``) instead of new memory
    out: list[Tensor] | None = None
    #: compiled (``CompiledStep``): where ``once`` collects the values the graph returns; else None
    once_per_call: list[Tensor] | None = None

    def __getitem__(self, name: str) -> Any:
        if name in self.static:
            return self.static[name]
        if name in self.scalars:
            return self.scalars[name]
        if name in self.reduced:
            return self.reduced[name]
        return self.hyper[name]

    def but(self, **changes: Any) -> "Context":
        """A copy with ``changes`` (``dataclasses.replace`` without its per-call field walk, which a step
        pays once per link and bucket); ``replace`` itself where torch.compile traces it."""
        if torch.compiler.is_compiling():
            return replace(self, **changes)
        copy = object.__new__(type(self))
        copy.__dict__.update(self.__dict__, **changes)
        return copy

    def once(self, value: Tensor) -> Tensor:
        """``value`` (a link's per-parameter coefficients, computed from 0-d state), computed once per compiled call
        rather than once per vector of the loop that reads it. Inductor inlines a scalar expression into the
        elementwise loop that reads it, and its CPU code evaluates it at every iteration (NAdam's two divisions in
        double, Schedule-Free's conversion and products); a value the graph returns is computed into a buffer
        before the loop, which then loads it. Eagerly, and where no compiled caller collects them (an encoded state's
        step, a ``torch.compile`` around ``optimizer.step()``), ``value`` as it is."""
        if self.once_per_call is not None:
            self.once_per_call.append(value)
        return value

    @property
    def torch_kernels(self) -> bool:
        """Whether a link may run torch's fused kernel of its ops in place of its list ops: eagerly, under
        ``compile="auto"`` or torch's ``fused=True`` (the engine's ``static["torch_kernels"]``); never while
        traced, nor under ``compile=False``, whose eager path keeps the bits of torch.optim's for-loop."""
        return bool(self.static.get("torch_kernels")) and not torch.compiler.is_compiling()

    def active(self, name: str) -> bool:
        """False when the ``zero_is_identity`` hyperparameter ``name`` is 0 for this group."""
        return self.static[f"{name}!=0"]
