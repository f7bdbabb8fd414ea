"""The collectives a step sends, each counted: what gradwise adds to a training step's communication.

``Traffic`` counts, per kind of collective, the calls and the bytes this rank hands to other ranks:
an all-reduce counts its payload once (``tensor.nbytes``, whatever algorithm the backend runs), an
all-gather this rank's contribution once (``tensor.nbytes``), an all-to-all the chunks it addresses to
other ranks (not the one it keeps), a reduce-scatter likewise the blocks of its input it addresses to other
ranks (``(world - 1) / world`` of ``input.nbytes``). These are the figures ``gradwise estimate
--world-size`` predicts and ``optimizer.comm_stats`` reports; FSDP2's own all-gather and reduce-scatter of
parameters and gradients are not the optimizer's and are not counted (PowerSGD's replacement of that
reduce-scatter counts its own: ``gradwise/distributed/powersgd_fsdp.py``).
"""
from __future__ import annotations

import copy
from collections import Counter
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import Tensor


@dataclass
class Traffic:
    """Calls and bytes sent by this rank, by kind of collective."""

    calls: Counter = field(default_factory=Counter)
    bytes_sent: Counter = field(default_factory=Counter)

    def record(self, kind: str, nbytes: int) -> None:
        self.calls[kind] += 1
        self.bytes_sent[kind] += nbytes

    def summary(self) -> dict[str, int]:
        """``{"collectives": n, "bytes_sent": b, "<kind>_bytes": ...}`` since the optimizer was built."""
        out = {"collectives": sum(self.calls.values()), "bytes_sent": sum(self.bytes_sent.values())}
        out.update({f"{kind}_bytes": n for kind, n in sorted(self.bytes_sent.items())})
        return out

    def state_dict(self, kinds: tuple[str, ...]) -> dict[str, dict[str, int]]:
        """``{"calls": {kind: n}, "bytes_sent": {kind: b}}`` with every one of ``kinds`` present (0 if none
        was sent yet): one layout from the first step on, as ``torch.distributed.checkpoint`` needs (it
        loads into the state_dict of a fresh object, and skips what that lacks)."""
        names = sorted(set(kinds) | set(self.calls))
        return {"calls": {k: self.calls[k] for k in names}, "bytes_sent": {k: self.bytes_sent[k] for k in names}}

    @classmethod
    def from_state_dict(cls, state: dict[str, dict[str, int]]) -> "Traffic":
        """The inverse of ``state_dict`` (kinds never sent left out, as before the save)."""
        return cls(Counter({k: int(n) for k, n in state["calls"].items() if n}),
                   Counter({k: int(n) for k, n in state["bytes_sent"].items() if n}))


def all_reduce(tensor: Tensor, op: str, group, traffic: Traffic) -> Tensor:
    """``tensor`` reduced in place over ``group`` by ``op`` ("sum" or "max")."""
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MAX, group=group)
    traffic.record("all_reduce", tensor.nbytes)
    return tensor


def all_reduce_started(tensor: Tensor, group, traffic: Traffic):
    """``tensor`` summed in place over ``group`` in the background; returns the ``Work`` to ``wait()`` on
    before reading it. Counted when it starts, as ``all_reduce``."""
    work = dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=group, async_op=True)
    traffic.record("all_reduce", tensor.nbytes)
    return work


def reduce_scatter(output: Tensor, input: Tensor, op, group, traffic: Traffic) -> Tensor:
    """``input`` (``world`` equal blocks, flat) reduced by ``op`` (a ``dist.ReduceOp``) over ``group``; this
    rank's block of the result written to ``output``. Counted as ``reduce_scatter``: the other ranks' blocks."""
    world = dist.get_world_size(group)
    dist.reduce_scatter_single(output, input, op=op, group=group)
    traffic.record("reduce_scatter", input.nbytes * (world - 1) // world)
    return output


def all_gather(tensor: Tensor, group, traffic: Traffic) -> list[Tensor]:
    """Every rank's ``tensor`` (one shape and dtype on all ranks), in rank order; counted as
    ``all_gather``, this rank's ``tensor.nbytes``."""
    gathered = [torch.empty_like(tensor) for _ in range(dist.get_world_size(group))]
    dist.all_gather(gathered, tensor, group=group)
    traffic.record("all_gather", tensor.nbytes)
    return gathered


def all_gather_started(tensor: Tensor, group, traffic: Traffic) -> tuple[list[Tensor], object]:
    """Every rank's ``tensor`` gathering in the background: (the buffers, in rank order, and the ``Work``
    to ``wait()`` on before reading them). Counted when it starts, as ``all_gather``."""
    gathered = [torch.empty_like(tensor) for _ in range(dist.get_world_size(group))]
    work = dist.all_gather(gathered, tensor, group=group, async_op=True)
    traffic.record("all_gather", tensor.nbytes)
    return gathered, work


def all_to_all(chunks: list[Tensor], sizes: list[int], group, traffic: Traffic) -> list[Tensor]:
    """Send ``chunks[r]`` (1-D, one dtype) to rank r of ``group``; returns what each rank sent here,
    ``sizes[r]`` elements from rank r."""
    rank = dist.get_rank(group)
    received = torch.empty(sum(sizes), dtype=chunks[0].dtype, device=chunks[0].device)
    # one buffer each way with split sizes: gloo's list form needs chunks of one size
    dist.all_to_all_single(received, torch.cat(chunks), output_split_sizes=sizes,
                           input_split_sizes=[c.numel() for c in chunks], group=group)
    traffic.record("all_to_all", sum(c.nbytes for r, c in enumerate(chunks) if r != rank))
    return list(received.split(sizes))


def deepcopy_on_group(obj, memo: dict, group):
    """``copy.deepcopy(obj)`` for an object holding a process group: its own copies of everything else,
    the same ``group`` (a process group cannot be copied)."""
    memo[id(group)] = group
    new = type(obj).__new__(type(obj))
    memo[id(obj)] = new
    for key, value in obj.__dict__.items():
        setattr(new, key, copy.deepcopy(value, memo))
    return new
