"""DiLoCo with FSDP2 inside each worker (HSDP-like): shard within a worker group, DiLoCo across groups.

The ranks form a 2-D mesh of (worker groups, shards). Each group ``fully_shard``s its model over its own
ranks (FSDP2's ``Shard(0)`` on a 1-D mesh: the mesh's ``"shard"`` slice), so the inner optimizer steps
DTensors whose local shard is a block of rows; DiLoCo's ``process_group`` joins the ranks that hold the
same shard in every group (the mesh's other slice). A pseudo-gradient is then per shard: each rank's local
rows of ``theta_sync - theta_local``, averaged with the same rows of the other groups; nothing is gathered,
and since every outer optimizer torch ships steps elementwise, the outer step on the shards is the outer
step on the whole tensors, cut into rows. The synced copy is a DTensor like its parameter (the outer
optimizer steps DTensors, as the inner one does).

A ``state_dict`` under ``torch.distributed.checkpoint`` goes under one key per worker group (its ranks
share their DTensors, the rows of one tensor); so what differs between the ranks of a group is saved as
DTensors too: a sync under way as one DTensor per parameter laid out like it, and the bytes sent as one row
per rank (``traffic_state``).
"""
from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from gradwise.core.params import DTensor

#: the kinds of collective DiLoCo sends, in the order of ``traffic_state``'s columns
KINDS = ("all_gather", "all_reduce")


def shard(t: Tensor) -> Tensor:
    """The local rows of a DTensor (a view: writing it writes the parameter), a plain tensor itself."""
    return t.to_local() if isinstance(t, DTensor) else t


def check_sharded(params: list[Tensor], process_group: Any, staleness_penalty: float,
                  outer_clip: float | None) -> bool:
    """Whether the parameters are FSDP2 shards (all of them, or none: else a ``ValueError``), checked against
    what DiLoCo over shards needs: rows (``Shard(0)``) on one 1-D mesh, a ``process_group`` that meets that
    mesh in this rank alone, and no correction that needs a whole tensor."""
    sharded = [i for i, p in enumerate(params) if isinstance(p, DTensor)]
    if not sharded:
        return False
    if len(sharded) != len(params):
        plain = next(i for i in range(len(params)) if i not in sharded)
        raise ValueError(f"inner's parameter {plain} is a plain tensor and parameter {sharded[0]} a DTensor:"
                         " DiLoCo over FSDP2 expects every parameter fully_shard'ed, or none")
    mesh = params[0].device_mesh
    for i, p in enumerate(params):
        if p.device_mesh != mesh or mesh.ndim != 1 or len(p.placements) != 1 or not p.placements[0].is_shard(0):
            raise NotImplementedError(
                f"inner's parameter {i} is a DTensor placed {p.placements} on a {p.device_mesh.ndim}-D mesh:"
                " DiLoCo over FSDP2 averages the rows each rank holds (Shard(0) on one 1-D mesh, the worker"
                " group's: fully_shard(model, mesh=mesh['shard'])); HSDP's Replicate() would average every step")
    ranks = set(mesh.mesh.flatten().tolist())
    across = set(dist.get_process_group_ranks(process_group or dist.group.WORLD))
    if ranks & across != {dist.get_rank()}:
        raise ValueError(f"invalid process_group={process_group!r} (ranks {sorted(across)}) for parameters sharded"
                         f" over ranks {sorted(ranks)}: expected the ranks holding the same shard in every worker"
                         " group, which meet the shard mesh in this rank alone (e.g. mesh['replicate'].get_group())")
    if staleness_penalty or outer_clip is not None:
        raise NotImplementedError(f"staleness_penalty={staleness_penalty!r}, outer_clip={outer_clip!r} with FSDP2"
                                  " shards: CO2's penalty (mean |gap| per tensor) and clipping (a norm per"
                                  " fragment) need whole tensors, which a rank of a worker group does not hold")
    return True


def like(local: Tensor, p: Tensor) -> Tensor:
    """``local`` (shaped like ``p``'s local rows) as a DTensor laid out like ``p``; ``p`` plain: ``local``."""
    if not isinstance(p, DTensor):
        return local
    return DTensor.from_local(local, p.device_mesh, p.placements, run_check=False, shape=p.shape, stride=p.stride())


def per_parameter(flat: Tensor, params: list[Tensor]) -> list[Tensor]:
    """A bucket's flat local buffer cut into one DTensor per parameter, laid out like it."""
    pieces = flat.split([shard(p).numel() for p in params])
    return [like(piece.view(shard(p).shape), p) for piece, p in zip(pieces, params)]


def flat_of(pieces: list[Tensor]) -> Tensor:
    """The inverse of ``per_parameter``: the local rows, one flat buffer."""
    return torch.cat([shard(t).reshape(-1) for t in pieces])


def traffic_state(state: dict[str, dict[str, int]], p: Tensor) -> Tensor:
    """``Traffic.state_dict`` as a DTensor of one row per rank of ``p``'s mesh: calls then bytes, by ``KINDS``."""
    row = torch.tensor([[state["calls"].get(k, 0) for k in KINDS] + [state["bytes_sent"].get(k, 0) for k in KINDS]],
                       dtype=torch.int64, device=p.device)
    return DTensor.from_local(row, p.device_mesh, p.placements, run_check=False,
                              shape=(p.device_mesh.size(), row.shape[1]), stride=(row.shape[1], 1))


def traffic_from(t: Tensor) -> dict[str, dict[str, int]]:
    """The inverse of ``traffic_state``: this rank's row."""
    row = shard(t).reshape(-1).tolist()
    return {"calls": dict(zip(KINDS, row[:len(KINDS)])), "bytes_sent": dict(zip(KINDS, row[len(KINDS):]))}
