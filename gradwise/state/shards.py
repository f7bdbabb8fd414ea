"""Encoded state of a DTensor parameter: kept for the local shard, defined on the logical tensor.

A parameter sharded by rows (FSDP2's ``Shard(0)``, ``gradwise.core.sharding``) holds rows
``[start_row, stop_row)`` of its logical tensor, one contiguous run of elements from ``offset`` on.
Every codec reads its buffer as that run of the logical tensor, so a model gets the same codes, bit
for bit, on any number of ranks (and on one, unsharded):

- blocks are today's blocks of the flattened logical tensor (block ``b``: elements ``[bB, (b+1)B)``),
  so an unsharded run keeps exactly the codes it had before sharding existed. A block that a shard
  boundary cuts (only possible where the row length is not a multiple of the block size) has its
  absmax taken as the max over the ranks holding a piece of it: one all-reduce (MAX) of the cut
  blocks' partial maxima per buffer and step, ``world - 1`` floats at most. Blocks aligned to rows
  instead would need no collective, but would change the codes of every unsharded tensor whose rows
  are not a multiple of the block size (GPT-2's 768-wide int8 matrices), and blocks as short as a row
  cost a scale per row of a narrow matrix;
- rank-1 scales: row maxima are local (a row is never split); column maxima are all-reduced (MAX);
- stochastic rounding draws its bits from the logical element index ``offset + local index``.

Between steps the parts are DTensors sharded like their parameter, with the logical tensor's rows as
their first dimension, so ``state_dict()``, ``torch.distributed.checkpoint`` and its resharding
(any world size to any other) carry them with no hook and no decode: codes are ``(rows, bytes per
row)`` (int4 packed two per byte within a row: for even rows the very bytes of the unsharded flat
packing; odd rows end on a half-filled byte); row maxima ``(rows,)``; column maxima ``(row
length,)``, replicated; and block scales a ``(rows, k)`` table, row ``i`` holding the scales of the
``k`` blocks it meets (zero past its last), ``k`` the most blocks a row can meet. A flat vector of
blocks cannot be a DTensor sharded like the parameter (``Shard(0)`` would split it by block count,
not by the rows each rank holds), so the table repeats a block's scale in each row it meets: ``4 k``
bytes per row (a 768-wide int8 matrix: 1.0% of its codes, against 0.2% for the blocks alone).
Decoding rebuilds the shard's blocks from its rows of the table. A vector's rows are its elements:
there every rank keeps all its block scales instead (replicated, all-reduced each step: ``n / B``
floats), and int4 spends a byte per code (two codes of a byte could lie on two ranks).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from gradwise.core.collectives import Traffic, all_reduce
from gradwise.core.params import DTensor
from gradwise.core.sharding import Sharding, sharding
from gradwise.state.codec import n_blocks
from gradwise.state.quantize import block_pieces, finite_absmax, pack4, to_codes, unpack4


@dataclass(frozen=True)
class LocalShard:
    """Where the local shard of a DTensor parameter lies in its logical tensor (``shape``): rows
    ``[start_row, stop_row)``; ``split`` is the parameter's ``Sharding`` (None: every rank holds all
    of it); ``mesh`` and ``placements`` are the parameter's, for the parts' DTensors."""

    shape: torch.Size
    start_row: int
    stop_row: int
    split: Sharding | None = None
    mesh: Any = None
    placements: tuple = ()
    #: where the collectives of encoding it are counted (the optimizer's ``comm_stats``)
    traffic: Traffic = field(default_factory=Traffic, compare=False)

    @classmethod
    def of(cls, p: Tensor, traffic: Traffic | None = None) -> "LocalShard | None":
        """``p``'s shard, or None when ``p`` is a plain tensor (its parts stay plain, flat tensors)."""
        if not isinstance(p, DTensor):
            return None
        split = sharding(p)
        rows = p.shape[0] if p.dim() else 1
        start, stop = (0, rows) if split is None else split.rows(split.rank)
        return cls(p.shape, start, stop, split, p.device_mesh, tuple(p.placements), traffic or Traffic())

    @classmethod
    def whole(cls, shape: torch.Size) -> "LocalShard":
        """The logical tensor as one shard: ``empty`` then gives the parts' global shapes."""
        return cls(torch.Size(shape), 0, shape[0] if len(shape) else 1)

    # ------------------------------------------------------------- geometry
    @property
    def rows(self) -> int:
        return self.shape[0] if len(self.shape) else 1

    @property
    def row_numel(self) -> int:
        return math.prod(self.shape[1:])

    @property
    def local_rows(self) -> int:
        return self.stop_row - self.start_row

    @property
    def local_shape(self) -> torch.Size:
        return torch.Size([self.local_rows, *self.shape[1:]]) if len(self.shape) else self.shape

    @property
    def offset(self) -> int:
        """Logical index of the local shard's first element."""
        return self.start_row * self.row_numel

    @property
    def numel(self) -> int:
        return self.local_rows * self.row_numel

    @property
    def is_vector(self) -> bool:
        """0-d or 1-d: rows of one element, so each rank keeps all block scales (replicated) rather
        than a table row per element."""
        return len(self.shape) <= 1

    def vector_blocks(self, block: int) -> int:
        return n_blocks(self.rows * self.row_numel, block)

    def row_bytes(self, bits: int) -> int:
        return self.row_numel if bits == 8 else (self.row_numel + 1) // 2

    # ------------------------------------------------------------- blocks
    def blocks(self, block: int) -> tuple[int, int]:
        """(first block the shard meets, how many it meets)."""
        if self.numel == 0:
            return 0, 0
        first = self.offset // block
        return first, -(-(self.offset + self.numel) // block) - first

    def table_width(self, block: int) -> int:
        """The most blocks of ``block`` elements one row can meet: the columns of the scale table."""
        if self.row_numel == 0:
            return 0
        g = math.gcd(self.row_numel, block)
        return (block - g + self.row_numel - 1) // block + 1

    def table_index(self, block: int, device: torch.device) -> tuple[Tensor, Tensor]:
        """(index among the shard's blocks of the ``k`` blocks each local row meets, clamped; whether
        the row meets it), each ``(local rows, k)``."""
        first, count = self.blocks(block)
        rows = torch.arange(self.start_row, self.stop_row, device=device)
        low = rows * self.row_numel // block
        high = (rows * self.row_numel + self.row_numel - 1) // block
        index = low[:, None] + torch.arange(self.table_width(block), device=device)[None, :]
        return (index - first).clamp(0, max(count - 1, 0)), index <= high[:, None]

    def cut_blocks(self, block: int) -> list[int]:
        """The blocks a shard boundary cuts, the same list on every rank."""
        if self.split is None:
            return []
        starts = (self.split.rows(r)[0] * self.row_numel for r in range(1, self.split.world))
        numel = self.rows * self.row_numel
        return sorted({s // block for s in starts if 0 < s < numel and s % block})

    # ------------------------------------------------------------- across ranks
    def max_over_ranks(self, t: Tensor) -> Tensor:
        """``t``, in place, the elementwise max over the ranks sharing the parameter (a collective:
        every one of them calls it, in the same order)."""
        if self.split is not None and t.numel():
            all_reduce(t, "max", self.split.group, self.traffic)
        return t

    def dtensor(self, local: Tensor, whole: bool = False) -> Tensor:
        """``local`` as the DTensor of the parameter's mesh: its first dimension the logical rows,
        sharded like the parameter's (``whole``: the same tensor on every rank, replicated)."""
        from torch.distributed.tensor import DTensor as _DTensor
        from torch.distributed.tensor import Replicate

        placements = (Replicate(),) * self.mesh.ndim if whole else self.placements
        shape = local.shape if whole or self.split is None else torch.Size([self.rows, *local.shape[1:]])
        return _DTensor.from_local(local, self.mesh, placements, run_check=False, shape=shape,
                                   stride=_contiguous_stride(shape))


def _contiguous_stride(shape: torch.Size) -> tuple[int, ...]:
    stride, out = 1, []
    for size in reversed(shape):
        out.append(stride)
        stride *= max(size, 1)
    return tuple(reversed(out))


# ----------------------------------------------------------------- codes
def pack_rows(codes: Tensor, shard: LocalShard, bits: int) -> Tensor:
    """Local flat codes as ``(local rows, bytes per row)``; int4 packed within each row, which for
    even rows is byte for byte the flat packing of an unsharded tensor."""
    matrix = codes.reshape(shard.local_rows, shard.row_numel)
    if bits == 8:
        return matrix
    if shard.row_numel % 2:
        matrix = torch.cat([matrix, matrix.new_zeros(shard.local_rows, 1)], 1)
    return pack4(matrix).view(shard.local_rows, shard.row_bytes(bits))


def unpack_rows(packed: Tensor, shard: LocalShard, bits: int) -> Tensor:
    if bits == 8:
        return packed.reshape(-1)
    padded = unpack4(packed.reshape(-1)).view(shard.local_rows, 2 * shard.row_bytes(bits))
    return padded[:, : shard.row_numel].reshape(-1)


def encode_blocks_on_shard(x: Tensor, block: int, code_map, signed: bool, seed: Tensor | None, shard: LocalShard,
                           parts: dict[str, Tensor], bits: int) -> None:
    """Block-wise codes of the local shard ``x`` into ``parts`` ("codes", "absmax": the scale table);
    the blocks a shard boundary cuts get the max over ranks of their pieces' maxima."""
    flat = x.reshape(-1).float()
    pieces = [(flat[start:stop].view(rows, -1), start) for start, stop, rows in
              block_pieces(flat.numel(), block, shard.offset)]
    scales = torch.cat([finite_absmax(piece, 1).view(-1) for piece, _ in pieces] or [flat.new_zeros(0)])
    first, count = shard.blocks(block)
    if shard.is_vector:  # every rank holds every block's scale
        every = flat.new_zeros(shard.vector_blocks(block))
        every[first: first + count] = scales
        scales = shard.max_over_ranks(every)[first: first + count]
    cut = [] if shard.is_vector else shard.cut_blocks(block)
    if cut:
        ids = torch.tensor(cut, device=flat.device) - first
        here = (ids >= 0) & (ids < count)
        across = flat.new_zeros(len(cut))
        across[here] = scales[ids[here]]
        scales[ids[here]] = shard.max_over_ranks(across)[here]
    codes, done = [], 0
    for piece, start in pieces:
        rows = piece.shape[0]
        codes.append(to_codes(piece, scales[done: done + rows, None], code_map, signed, seed,
                              start=shard.offset + start).view(-1))
        done += rows
    parts["codes"].copy_(pack_rows(torch.cat(codes) if codes else flat.new_zeros(0, dtype=torch.uint8), shard, bits))
    if shard.is_vector:
        parts["absmax"].copy_(every)
    else:
        index, meets = shard.table_index(block, flat.device)
        parts["absmax"].copy_(torch.where(meets, scales[index], 0.0))


def decode_blocks_on_shard(codes: Tensor, absmax: Tensor, block: int, code_map, shard: LocalShard) -> Tensor:
    """The local shard's float32 values (flat) from its codes and block scales (a vector's: all of
    them; else the table of its rows)."""
    first, count = shard.blocks(block)
    if shard.is_vector:
        scales = absmax[first: first + count]
    else:
        index, meets = shard.table_index(block, absmax.device)
        scales = absmax.new_zeros(count)
        scales[index[meets]] = absmax[meets]
    values, out, done = code_map.value(codes), [], 0
    for start, stop, rows in block_pieces(shard.numel, block, shard.offset):
        out.append((values[start:stop].view(rows, -1) * scales[done: done + rows, None]).view(-1))
        done += rows
    return torch.cat(out) if out else values.float()


def encode_rank1_on_shard(x: Tensor, code_map, signed: bool, seed: Tensor | None,
                          shard: LocalShard) -> tuple[Tensor, Tensor, Tensor]:
    """(flat codes, row maxima, column maxima) of the local rows; column maxima are over all ranks."""
    matrix = x.reshape(shard.local_rows, shard.row_numel).float()
    row_max = finite_absmax(matrix, 1)
    col_max = finite_absmax(matrix, 0) if shard.local_rows else matrix.new_zeros(1, shard.row_numel)
    shard.max_over_ranks(col_max)
    codes = to_codes(matrix, torch.minimum(row_max, col_max), code_map, signed, seed, start=shard.offset)
    return codes.view(-1), row_max.view(-1), col_max.view(-1)


def decode_rank1_on_shard(codes: Tensor, row_max: Tensor, col_max: Tensor, code_map, shard: LocalShard) -> Tensor:
    """The local rows' float32 values, ``(local rows, row length)``, from their codes and scales."""
    scale = torch.minimum(row_max.view(-1, 1), col_max.view(1, -1))
    return code_map.value(codes).view(shard.local_rows, shard.row_numel) * scale
