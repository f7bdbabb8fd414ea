"""The step on sharded DTensor parameters (FSDP2): where state lives, owned phases, global statistics.

A parameter sharded over ranks (``core/sharding.py``) steps as its unsharded self would:

- elementwise phases run on each rank's shard, on state sharded like the parameter (DTensors);
- a phase of whole-tensor links runs on the parameter's owner (``core/owned.py``), on state that
  lives on the owner only, as plain whole tensors: the state of a link is where the link runs;
- the statistics a step reduces (``clip_by_global_norm``'s sum of squares, a guard's flag) are the
  buckets' parts added up on each rank, then over the ranks that share the shards, in one
  all-reduce per op and round.
"""
from __future__ import annotations

from typing import Any, Mapping

import torch
from torch import Tensor

from gradwise.core.buckets import Bucket
from gradwise.core.collectives import Traffic, all_reduce
from gradwise.core.owned import assign_owners, gather, owner_cost, scatter
from gradwise.core.params import local
from gradwise.core.phases import Phase, combine, owned_namespaces
from gradwise.core.sharding import sharding
from gradwise.core.transform import Chain, Transform, state_dtype

#: the value a statistic starts from on a rank that holds no part of it
IDENTITY = {"sum": 0.0, "max": float("-inf"), "any": 0.0, "skip": 0.0}


class ShardedStep:
    """Methods of ``gradwise.Optimizer`` for sharded parameters (mixed into ``PhasedStep``)."""

    @property
    def traffic(self) -> Traffic:
        """What this optimizer's steps have sent to other ranks (``core/collectives.py``)."""
        return self.__dict__.setdefault("_traffic", Traffic())

    @property
    def comm_stats(self) -> dict[str, int]:
        """``{"collectives": n, "bytes_sent": b, ...}``: the collectives the steps ran so far, and the bytes
        this rank sent in them (FSDP2's own all-gathers and reduce-scatters are not the optimizer's)."""
        return self.traffic.summary()

    # ----------------------------------------------------------------- owners and state homes
    def _owner(self, p: Tensor) -> int:
        """The rank that holds ``p``'s whole tensor for its whole-tensor links: assigned once, over every
        sharded parameter whose chain has such links, by logical shape only."""
        count = sum(len(g["params"]) for g in self.param_groups)
        cached = self.__dict__.get("_owners")
        if cached is None or cached[1] != count:
            owned = [(q, layout) for g in self.param_groups if self._owned_links(g)
                     for q in g["params"] if (layout := sharding(q)) is not None]
            ranks = assign_owners([owner_cost(q.shape) for q, _ in owned], owned[0][1].world) if owned else []
            cached = ({id(q): r for (q, _), r in zip(owned, ranks)}, count)
            self._owners = cached
        return cached[0][id(p)]

    def owner(self, p: Tensor) -> int | None:
        """The rank (in ``p``'s shard group) that keeps the state of ``p``'s whole-tensor links and runs them;
        None when ``p`` is not sharded or its chain has no such link."""
        group = next(g for g in self.param_groups if any(q is p for q in g["params"]))
        return self._owner(p) if sharding(p) is not None and self._owned_links(group) else None

    def _owned_links(self, group: Mapping[str, Any]) -> set[str]:
        """The namespaces of the group's links whose state lives on a sharded parameter's owner."""
        return owned_namespaces(self._plan(group, sharded=True))

    def _homed_here(self, p: Tensor, group: Mapping[str, Any]) -> list[tuple[str, Transform]]:
        """The (namespace, link) pairs whose state this rank keeps for ``p``."""
        links = _links(self.transform.for_group(group))
        layout = sharding(p)
        if layout is None:
            return links
        owned = self._owned_links(group)
        mine = not owned or self._owner(p) == layout.rank
        return [(n, t) for n, t in links if n not in owned or mine]

    def keys_here(self, p: Tensor, group: Mapping[str, Any]) -> list[str]:
        """The state keys this rank keeps for ``p`` (all of the chain's, unless ``p`` is sharded and an
        owned link's state lives on another rank)."""
        return [_key(n, k) for n, t in self._homed_here(p, group) for k in t.state]

    def held_whole(self, p: Tensor, group: Mapping[str, Any]) -> set[str]:
        """The state keys of a sharded ``p`` held as whole tensors (its whole-tensor links', on its owner);
        the rest are sharded like ``p``."""
        owned = self._owned_links(group) if sharding(p) is not None else set()
        return {_key(n, k) for n, t in _links(self.transform.for_group(group)) if n in owned for k in t.state}

    def _sharded_init(self, p: Tensor, group: Mapping[str, Any]) -> dict[str, Tensor]:
        """Fresh state of a sharded ``p``: DTensors sharded like it for the links that run on shards,
        whole tensors for the owned links, on the owner. A collective (every rank calls it for the
        same parameters in the same order: the parameter's whole tensor is gathered once)."""
        owned = self._owned_links(group)
        full = p.full_tensor() if owned else None
        fresh: dict[str, Tensor] = {}
        for namespace, t in self._homed_here(p, group):
            target = full if namespace in owned else p
            view = torch.view_as_real(target) if target.is_complex() else target
            fresh.update({_key(namespace, k): v for k, v in t.init(view, group).items()})
        return fresh

    # ----------------------------------------------------------------- owned phases
    def _run_owned(self, bucket, phase: Phase) -> list[dict[str, Tensor]]:
        """Run an owned phase on the bucket's sharded parameters (``core/owned.py``): the first phase of a
        run of owned phases gathers the whole tensors to their owners, which keep them (``bucket.whole``)
        for the rest of the run; the last scatters the results back."""
        views = [local(p) for p in bucket.params]
        owners = [self._owner(p) for p in bucket.params]
        if phase.run_start:
            inputs = [local(x) for x in bucket.inputs]
            shapes = [_whole_shape(p) for p in bucket.params]
            pieces = [[v, x] if phase.run_reads_params else [x] for v, x in zip(views, inputs)]
            whole = gather(pieces, bucket.sharding, owners, shapes, self.traffic)
            mine = sorted(whole)
            params = [whole[i][0] if phase.run_reads_params else
                      torch.empty(shapes[i], dtype=views[i].dtype, device=views[i].device) for i in mine]
            bucket.whole = Bucket(bucket.group, bucket.phases, params, [bucket.states[i] for i in mine],
                                  bucket.values, bucket.layout, bucket.static, [whole[i][-1] for i in mine],
                                  keys=[bucket.params[i] for i in mine])
        owned = bucket.whole
        owned.values, owned.layout = bucket.values, bucket.layout  # with this round's totals
        parts = self._run_phase(owned, phase) if owned.params else []
        if phase.run_end:
            index = {id(p): i for i, p in enumerate(bucket.params)}
            mine = [index[id(k)] for k in owned.keys]
            if phase.run_writes_params:
                for view, value in zip(views, scatter(dict(zip(mine, owned.params)), bucket.sharding, owners, views,
                                                      self.traffic)):
                    view.copy_(value)
            if not phase.last:
                outputs = [torch.empty_like(local(x), dtype=state_dtype(views[0])) for x in bucket.inputs]
                bucket.inputs = scatter(dict(zip(mine, owned.inputs)), bucket.sharding, owners, outputs,
                                        self.traffic)
            bucket.whole = None
        return parts

    # ----------------------------------------------------------------- statistics over ranks
    def _totals(self, ops: Mapping[str, str], plain: list[Mapping[str, Tensor]],
                sharded: list[Mapping[str, Tensor]], group) -> dict[str, Tensor]:
        """The round's totals: parts of unsharded buckets added once, parts of sharded ones over ``group``
        (one all-reduce per op), every statistic present on every rank."""
        totals = combine(ops, plain)
        if group is None:
            return totals
        local_totals = combine(ops, sharded)
        for op, reduce_op in (("sum", "sum"), ("max", "max"), ("any", "max"), ("skip", "max")):
            names = [n for n, o in ops.items() if o == op]
            if not names:
                continue
            stacked = torch.stack([local_totals.get(n, torch.tensor(IDENTITY[op], dtype=torch.float64))
                                   for n in names])
            all_reduce(stacked, reduce_op, group, self.traffic)
            for n, value in zip(names, stacked):
                if n not in totals:
                    totals[n] = value
                elif op == "sum":
                    totals[n] = totals[n] + value
                else:
                    totals[n] = torch.maximum(totals[n], value)
        return totals


def shard_group(buckets) -> Any:
    """The process group the step's sharded buckets are sharded over (None when none is); one only."""
    groups = {b.sharding[0].group for b in buckets if b.sharding}
    if len(groups) > 1:
        raise NotImplementedError("the optimizer's parameters are sharded over different process groups; gradwise"
                                  " steps one FSDP2 mesh per optimizer (make one optimizer per mesh)")
    return next(iter(groups), None)


def _links(transform: Transform) -> list[tuple[str, Transform]]:
    return transform.links() if isinstance(transform, Chain) else [("", transform)]


def _key(namespace: str, key: str) -> str:
    return f"{namespace}.{key}" if namespace else key


def _whole_shape(p: Tensor) -> torch.Size:
    """The logical shape of what the chain computes on: a complex parameter's real view adds a 2."""
    return torch.Size((*p.shape, 2)) if p.is_complex() else p.shape
