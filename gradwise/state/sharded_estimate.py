"""``gradwise.estimate_sharded``: each rank's optimizer state and the bytes it sends per step under FSDP2.

Computed from the parameters' shapes alone (meta tensors, no process group), with the step engine's
own decisions: the sharded plan of each group's chain (``core/phases.plan(..., sharded=True)``), which
links run on each parameter's owner (``owned_namespaces``), who the owners are (``assign_owners`` of
``owner_cost``, over the same parameters in the same order as ``ShardedStep``), and the rows each rank
holds (``Sharding.rows``: ``fully_shard``'s ``Shard(0)``). Every parameter with a dimension is taken to
be sharded over ``shards`` ranks (HSDP: ``replicas`` groups of them, each holding and sending the same).

State on a rank: the links that run on shards keep their buffers shaped like the parameter for its
rows only, their 0-d buffers whole; the links of owned phases keep their whole state on the owner and
nothing elsewhere; each buffer is sized as ``gradwise.estimate`` sizes it (its codec's bytes, for the
rows held); plus the 0-d step counter of every parameter.

Bytes sent per step (``core/collectives.py`` counts them so): for each run of consecutive owned phases
and each bucket (a group's parameters of one dtype), a gather all-to-all at its start (each rank sends
the owner its rows of the run's input, and of the parameter when a phase of the run reads it) and at its
end a scatter all-to-all of the parameters (when the run writes them) and one of the result (unless the
run ends the step): the owner sends each rank its rows, in float32 (float64 for float64 parameters),
nothing for what a rank keeps; for each round of phases that reduces statistics, one all-reduce of 8
bytes per statistic for each op (sum, max, any, skip).
FSDP2's own all-gathers and reduce-scatters are not counted.
The step is taken with every parameter at the same step count and, where chains have guards, with every
group's guard in the same round (else the engine adds buckets, or shifts rounds, that this does not see).
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from gradwise.core.owned import assign_owners, owner_cost
from gradwise.core.phases import Phase, owned_namespaces, plan
from gradwise.core.sharding import Sharding
from gradwise.state.engine import EncodedState
from gradwise.state.estimate import STEP_BYTES, meta_optimizer, stored_bytes
from gradwise.state.shards import LocalShard

#: the op kinds whose statistics ``ShardedStep`` all-reduces, each in a collective of its own
REDUCED_OPS = ("sum", "max", "any", "skip")
#: bytes per statistic in those all-reduces (float64)
STATISTIC_BYTES = 8


@dataclass
class ShardedEstimate:
    """Per rank of one shard group (``shards`` ranks; each of the ``replicas`` groups holds the same):
    ``state`` bytes of optimizer state and ``sent`` bytes sent per step, in rank order; the
    ``collectives`` a step runs (every rank runs each one); ``params`` parameter elements."""

    shards: int
    replicas: int
    state: list[int]
    sent: list[int]
    collectives: int
    params: int

    @property
    def world(self) -> int:
        return self.shards * self.replicas

    def table(self) -> str:
        """Max and mean over ranks of the state and of the bytes sent per step."""
        lines = [f"per rank, {self.world} ranks ({self.replicas} replica(s) x {self.shards} shards)"
                 f"{'max':>16}{'mean':>18}"]
        for label, values in (("optimizer state bytes", self.state), ("bytes sent per step", self.sent)):
            lines.append(f"  {label:<46}{max(values):>16,}{sum(values) / len(values):>18,.1f}")
        lines.append(f"  {'collectives per step':<46}{self.collectives:>16,}")
        lines.append(f"  ({self.params:,} parameter elements; FSDP2's own gathers and reduce-scatters not counted)")
        return "\n".join(lines)

    __str__ = table


def estimate_sharded(model: Any, optimizer_or_recipe: Any, world_size: int | None = None,
                     mesh: tuple[int, int] | None = None, **recipe_kwargs: Any) -> ShardedEstimate:
    """Each rank's optimizer state bytes and bytes sent per step when ``model``'s parameters are sharded
    with ``fully_shard`` over ``world_size`` ranks, or over an HSDP ``mesh`` of (replicas, shards).

    Args:
        model, optimizer_or_recipe, **recipe_kwargs: as ``gradwise.estimate`` takes them.
        world_size: ranks, all of them shards (FSDP2); give this or ``mesh``.
        mesh: (replicas, shards): parameters are sharded over ``shards`` ranks, replicated ``replicas`` times.
    """
    replicas, shards = _mesh(world_size, mesh)
    optimizer = meta_optimizer(model, optimizer_or_recipe, "estimate_sharded", **recipe_kwargs)
    # the sharded plan does not depend on compilation: its cuts are the same compiled or eager
    groups = [(g, plan(optimizer.transform.for_group(g), False, sharded=True)) for g in optimizer.param_groups]
    split = shards > 1
    owned = [p for g, phases in groups if owned_namespaces(phases) for p in g["params"] if split and p.dim()]
    owners = dict(zip(map(id, owned), assign_owners([owner_cost(tuple(p.shape)) for p in owned], shards)))
    state = _state(optimizer, groups, owners, shards)
    sent, collectives = _traffic(groups, owners, shards)
    encoding, calls = _encoding_traffic(optimizer, groups, shards)
    sent, collectives = [n + encoding for n in sent], collectives + calls
    params = sum(p.numel() for g in optimizer.param_groups for p in g["params"])
    return ShardedEstimate(shards, replicas, state, sent, collectives, params)


def _mesh(world_size: int | None, mesh: Any) -> tuple[int, int]:
    """(replicas, shards) from the arguments, checked."""
    if (world_size is None) == (mesh is None):
        raise TypeError(f"estimate_sharded() takes world_size or mesh, one of them: got world_size={world_size!r},"
                        f" mesh={mesh!r}")
    if mesh is None:
        if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
            raise ValueError(f"invalid world_size={world_size!r}: expected a positive int")
        return 1, world_size
    if not (isinstance(mesh, (tuple, list)) and len(mesh) == 2
            and all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in mesh)):
        raise ValueError(f"invalid mesh={mesh!r}: expected (replicas, shards), two positive ints")
    return mesh[0], mesh[1]


def _state(optimizer: Any, groups: list[tuple[dict, tuple[Phase, ...]]], owners: dict[int, int],
           shards: int) -> list[int]:
    """Bytes of optimizer state on each rank of the shard group."""
    engine = EncodedState(optimizer.storage.policy, optimizer.transform)  # its decisions, whatever is stored
    held = [0] * shards
    for group, phases in groups:
        at_owner = owned_namespaces(phases)
        names = group.get("param_names") or [None] * len(group["params"])
        for p, name in zip(group["params"], names):
            codec = engine.codec_for(p, name)
            whole = torch.empty(p.shape, dtype=p.dtype, device="meta")
            layout = Sharding(None, shards, 0, tuple(p.shape)) if shards > 1 and p.dim() else None
            for namespace, link in (pair for phase in phases for pair in phase.links()):
                for key, value in link.init(whole, group).items():
                    buffer = f"{namespace}.{key}" if namespace else key
                    if layout is not None and namespace in at_owner:
                        held[owners[id(p)]] += stored_bytes(engine, codec, buffer, value, p)[1]
                    elif layout is not None and value.shape == p.shape:
                        for rank in range(shards):
                            start, stop = layout.rows(rank)
                            held[rank] += stored_bytes(engine, codec, buffer, value, p,
                                                       LocalShard(p.shape, start, stop))[1]
                    else:
                        nbytes = stored_bytes(engine, codec, buffer, value, p)[1]
                        held = [n + nbytes for n in held]
            held = [n + STEP_BYTES for n in held]
    return held


def _encoding_traffic(optimizer: Any, groups: list[tuple[dict, tuple[Phase, ...]]], shards: int) -> tuple[int, int]:
    """Bytes each rank sends per step, and the all-reduces, to encode the encoded buffers it holds on shards
    (``Codec.all_reduced``: scales that a shard boundary cuts, column maxima), each written once a step."""
    if shards == 1:
        return 0, 0
    engine = EncodedState(optimizer.storage.policy, optimizer.transform)
    nbytes = calls = 0
    for group, phases in groups:
        at_owner = owned_namespaces(phases)
        names = group.get("param_names") or [None] * len(group["params"])
        for p, name in zip(group["params"], names):
            codec = engine.codec_for(p, name)
            if codec is None or not p.dim():
                continue
            whole = torch.empty(p.shape, dtype=p.dtype, device="meta")
            split = Sharding(None, shards, 0, tuple(p.shape))
            shard = LocalShard(p.shape, *split.rows(0), split)
            for namespace, link in (pair for phase in phases if not phase.owned for pair in phase.links()):
                for key, value in link.init(whole, group).items():
                    buffer = f"{namespace}.{key}" if namespace else key
                    if namespace not in at_owner and engine.encodable(buffer, value, p):
                        n = codec.all_reduced(shard, buffer not in engine.nonnegative)
                        nbytes, calls = nbytes + 4 * n, calls + (n > 0)
    return nbytes, calls


def _traffic(groups: list[tuple[dict, tuple[Phase, ...]]], owners: dict[int, int],
             shards: int) -> tuple[list[int], int]:
    """Bytes each rank of the shard group sends per step, and the collectives a step runs."""
    sent = [0] * shards
    if shards == 1:
        return sent, 0
    collectives = 0
    buckets = [(phases, members) for group, phases in groups for members in _by_dtype(group["params"])]
    for r in range(max((len(phases) for _, phases in groups), default=0)):
        ops = {name: op for group, phases in groups if r < len(phases) and group["params"] and phases[r].reducer
               for name, op in phases[r].reducer[1].reductions.items()}
        for phases, members in buckets:
            phase = phases[r] if r < len(phases) else None
            if phase is not None and phase.owned:
                collectives += _owned_phase(phase, members, owners, sent)
        for op in REDUCED_OPS:
            count = sum(1 for o in ops.values() if o == op)
            if count:
                sent = [n + STATISTIC_BYTES * count for n in sent]
                collectives += 1
    return sent, collectives


def _owned_phase(phase: Phase, members: list[Tensor], owners: dict[int, int], sent: list[int]) -> int:
    """Add to ``sent`` what an owned phase's gather and scatters send, for one bucket; the collectives."""
    wire = 8 if members[0].dtype == torch.float64 else 4
    gathered = (2 if phase.run_reads_params else 1) if phase.run_start else 0
    scattered = (int(phase.run_writes_params) + int(not phase.last)) if phase.run_end else 0
    for p in members:
        owner = owners[id(p)]
        for rank, count in enumerate(Sharding(None, len(sent), 0, tuple(p.shape)).counts()):
            if rank != owner:
                sent[rank] += gathered * count * wire  # gather: its rows to the owner
                sent[owner] += scattered * count * wire  # scatter: the owner sends them back
    return int(gathered > 0) + scattered


def _by_dtype(params: list[Tensor]) -> list[list[Tensor]]:
    """A group's sharded parameters as the engine buckets them (one device: by dtype)."""
    out: dict[torch.dtype, list[Tensor]] = defaultdict(list)
    for p in params:
        if p.dim():
            out[p.dtype].append(p)
    return list(out.values())
