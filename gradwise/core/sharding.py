"""What a parameter's placement means for the step: is it sharded, over which ranks, which rows are here.

A ``DTensor`` is *sharded* when one of its mesh dimensions holds ``Shard(0)`` over more than one rank
(FSDP2's ``fully_shard`` layout; HSDP adds ``Replicate()`` dimensions). A DTensor on a 1-rank mesh, or
replicated on every mesh dimension, holds the whole tensor on each rank: it steps as a plain tensor.
Any other placement (``Shard(d)`` with d > 0, ``Partial``, several sharded dimensions) is refused by
name, before anything changes.

Rows are split as ``torch.chunk`` (and DTensor) splits them: ``c = ceil(n / world)`` rows per rank,
rank r holding rows ``[min(r c, n), min((r + 1) c, n))``, so the last ranks may hold fewer rows or none.
A shard of a row-major tensor is then one contiguous run of the logical tensor's elements, starting
at ``offset`` = first row x elements per row: blocks, codes and random bits defined on the logical
tensor's element index are the same at every world size.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from torch import Tensor

from gradwise.core.params import DTensor


@dataclass(frozen=True)
class Sharding:
    """How the logical tensor of a sharded parameter is split: over ``group`` (``world`` ranks, this one
    ``rank``), by rows; ``shape`` is the logical shape."""

    group: Any
    world: int
    rank: int
    shape: tuple[int, ...]

    @property
    def row_numel(self) -> int:
        return math.prod(self.shape[1:])

    def rows(self, rank: int) -> tuple[int, int]:
        """``[start, stop)`` of the rows ``rank`` holds."""
        n = self.shape[0]
        per = -(-n // self.world)
        return min(rank * per, n), min((rank + 1) * per, n)

    def counts(self) -> list[int]:
        """Elements each rank holds, in rank order."""
        return [(stop - start) * self.row_numel for start, stop in map(self.rows, range(self.world))]

    @property
    def offset(self) -> int:
        """Index, in the logical tensor's row-major order, of this rank's first element."""
        return self.rows(self.rank)[0] * self.row_numel


def sharding(p: Tensor, label: str = "a parameter") -> Sharding | None:
    """``p``'s ``Sharding``, or None when every rank holds all of it (a plain tensor, a DTensor replicated
    or on a 1-rank mesh). Raises ``NotImplementedError`` naming ``label`` for placements gradwise does
    not step."""
    if not isinstance(p, DTensor):
        return None
    mesh = p.device_mesh
    split = [dim for dim, placement in enumerate(p.placements) if not placement.is_replicate()]
    split = [dim for dim in split if mesh.size(dim) > 1]
    if not split:
        return None
    placement = p.placements[split[0]]
    if len(split) > 1 or not placement.is_shard(0) or type(placement).__name__ != "Shard":
        raise NotImplementedError(
            f"{label} is a DTensor placed {tuple(p.placements)} on a mesh of shape {tuple(mesh.shape)}: gradwise"
            " steps DTensors sharded by rows over one mesh dimension (Shard(0), FSDP2's layout, with Replicate()"
            " on the others, as HSDP) or replicated; reshard it, e.g. fully_shard without shard_placement_fn")
    if p.dim() and not p.to_local().is_contiguous():
        raise NotImplementedError(f"{label}: its local shard is not contiguous; gradwise steps row-major shards")
    dim = split[0]
    return Sharding(mesh.get_group(dim), mesh.size(dim), mesh.get_local_rank(dim), tuple(p.shape))


def is_sharded(p: Tensor) -> bool:
    """Whether some rank holds elements of ``p`` that this one does not (``sharding`` is not None)."""
    return sharding(p) is not None


def shard_offset(p: Tensor) -> int:
    """Index, in ``p``'s logical row-major order, of the first element this rank holds (0 unless sharded)."""
    layout = sharding(p)
    return 0 if layout is None else layout.offset
