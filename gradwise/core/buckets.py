"""A step's buckets: parameters of one group, device, dtype and step count, as one step runs them, and how a
step that fails or is skipped puts back what preparing them wrote (``roll_back``)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from gradwise.core.executor import Layout
from gradwise.core.phases import Phase
from gradwise.core.sharding import Sharding


@dataclass
class Bucket:
    """Parameters of one group, device, dtype and step count, as one step runs them."""

    group: dict[str, Any]
    phases: tuple[Phase, ...]
    params: list[Tensor]
    states: list[dict[str, Tensor]]
    values: Tensor
    layout: Layout
    static: dict[str, Any]
    inputs: list[Tensor]
    fresh: list[Tensor] = field(default_factory=list)
    #: the 0-d state a roll back puts back (``snapshot``)
    saved: list[tuple[list[Tensor], Tensor]] = field(default_factory=list)
    done: bool = False
    #: each parameter's ``Sharding`` when they are sharded over ranks, else None
    sharding: list[Sharding] | None = None
    #: the optimizer's parameters these stand for (their positions seed, their buffers are kept by), when
    #: ``params`` are an owner's whole copies of them
    keys: list[Tensor] | None = None
    #: during a run of owned phases, the owner's whole copies of its parameters (``ShardedStep._run_owned``)
    whole: "Bucket | None" = None

    def key(self, i: int) -> Tensor:
        return self.params[i] if self.keys is None else self.keys[i]


def roll_back(optimizer, buckets: list[Bucket]) -> None:
    """Undo what preparing ``buckets`` did: step counters, ``advance``'s 0-d state, fresh state."""
    for b in buckets:
        for st in b.states:
            st["step"] -= 1
        for tensors, old in b.saved:
            torch._foreach_copy_(tensors, list(old.unbind()))
        for p in b.fresh:
            optimizer.state.pop(p, None)
