"""Whole-tensor links on sharded parameters: each parameter's whole tensor on one rank, its owner.

A link that is not elementwise (Muon's Newton-Schulz, Shampoo's and SOAP's factors, Adafactor's
factored moments, Ranger21's per-unit norms) needs the whole tensor of each parameter. Under FSDP2
every rank holds a shard (``core/sharding.py``). A phase of such links runs on sharded parameters as:

1. **gather**: one all-to-all per phase and bucket sends every rank's shards of the phase's input
   (and, where a link reads them, of the parameters) to each parameter's owner, who joins them in
   rank order into the whole tensor;
2. **run**: the owner runs the phase on the whole tensors of the parameters it owns, exactly as an
   unsharded optimizer runs it, on that link's state, which lives on the owner only;
3. **scatter**: one all-to-all sends each rank its rows of the result: the phase's output (the next
   phase's input), or, after a phase that writes the parameters, their new values.

So the results are bit-identical to an unsharded run, the owners' state and work add up to one
unsharded optimizer's (split ``1 / world`` each), and each owned tensor crosses the network twice
(three times when its parameter is read). Owners are chosen once per optimizer, from the logical
shapes only (so every rank, at every world size, computes the same assignment): the costliest
tensors first, each to the least loaded rank (``assign_owners``).
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

from gradwise.core.collectives import Traffic, all_to_all
from gradwise.core.sharding import Sharding


def owner_cost(shape: tuple[int, ...]) -> float:
    """What the whole-tensor work on a tensor of ``shape`` costs, roughly: a matrix root or a Newton-
    Schulz iteration is ``m n min(m, n)``, a row or column statistic ``m n``."""
    numel = math.prod(shape)
    return float(numel * min(shape[0], math.prod(shape[1:]))) if len(shape) >= 2 else float(numel)


def assign_owners(costs: list[float], world: int) -> list[int]:
    """An owner rank for each tensor: by decreasing cost (then position), to the least loaded rank
    (then the lowest), the longest-processing-time rule."""
    load = [0.0] * world
    owners = [0] * len(costs)
    for i in sorted(range(len(costs)), key=lambda i: (-costs[i], i)):
        rank = min(range(world), key=lambda r: (load[r], r))
        owners[i] = rank
        load[rank] += costs[i]
    return owners


def _wire_dtype(tensors: list[Tensor]) -> torch.dtype:
    """A dtype every tensor converts to and back exactly (bfloat16 and float32 as float32)."""
    return torch.float64 if any(t.dtype == torch.float64 for t in tensors) else torch.float32


def gather(pieces: list[list[Tensor]], layouts: list[Sharding], owners: list[int], shapes: list[torch.Size],
           traffic: Traffic) -> dict[int, list[Tensor]]:
    """The whole tensors of the parameters this rank owns: ``{i: [whole of each of pieces[i]]}``.

    ``pieces[i]``: this rank's local shards of parameter i's tensors (the same number for every
    parameter), ``shapes[i]`` their whole shape (a complex parameter's real view included)."""
    first = layouts[0]
    world, rank, group = first.world, first.rank, first.group
    flat = [t for ts in pieces for t in ts]
    wire = _wire_dtype(flat)
    device = flat[0].device
    width = len(pieces[0])
    counts = [[n * _unit(layout, shape) for n in layout.counts()] for layout, shape in zip(layouts, shapes)]
    chunks = [torch.cat([t.reshape(-1).to(wire) for i, ts in enumerate(pieces) if owners[i] == dst for t in ts]
                        or [torch.empty(0, dtype=wire, device=device)]) for dst in range(world)]
    mine = [i for i in range(len(pieces)) if owners[i] == rank]
    sizes = [width * sum(counts[i][src] for i in mine) for src in range(world)]
    received = all_to_all(chunks, sizes, group, traffic)
    out: dict[int, list[Tensor]] = {i: [] for i in mine}
    cursors = [0] * world
    for i in mine:
        for j in range(width):
            parts = []
            for src in range(world):
                n = counts[i][src]
                parts.append(received[src][cursors[src]:cursors[src] + n])
                cursors[src] += n
            out[i].append(torch.cat(parts).to(pieces[i][j].dtype).view(shapes[i]))
    return out


def scatter(results: dict[int, Tensor], layouts: list[Sharding], owners: list[int], locals_: list[Tensor],
            traffic: Traffic) -> list[Tensor]:
    """Each rank's rows of the whole ``results`` (this rank's owned parameters' results), as tensors
    shaped and typed like ``locals_`` (this rank's shard of each parameter)."""
    first = layouts[0]
    world, group = first.world, first.group
    wire = _wire_dtype([*results.values(), *locals_])
    device = locals_[0].device
    chunks = []
    for dst in range(world):
        rows = []
        for i in sorted(results):
            unit = _unit(layouts[i], results[i].shape)
            start, stop = layouts[i].rows(dst)
            flat = results[i].reshape(-1)
            rows.append(flat[start * layouts[i].row_numel * unit:stop * layouts[i].row_numel * unit].to(wire))
        chunks.append(torch.cat(rows) if rows else torch.empty(0, dtype=wire, device=device))
    sizes = [sum(locals_[i].numel() for i in range(len(locals_)) if owners[i] == src) for src in range(world)]
    received = all_to_all(chunks, sizes, group, traffic)
    cursors = [0] * world
    out = []
    for i, local in enumerate(locals_):
        src = owners[i]
        n = local.numel()
        out.append(received[src][cursors[src]:cursors[src] + n].to(local.dtype).view(local.shape))
        cursors[src] += n
    return out


def _unit(layout: Sharding, shape: torch.Size) -> int:
    """Elements per logical element: 2 for a complex parameter's real view, else 1."""
    return math.prod(shape) // max(1, math.prod(layout.shape)) if math.prod(layout.shape) else 1
