"""Cutting a parameter into square-ish blocks for Kronecker-factored preconditioners.

A parameter of shape (d0, d1, ...) is seen as the matrix (d0, d1 * ...); a side of length d longer
than ``max_dim`` is cut into k = ceil(d / max_dim) runs of ceil(d / k) (the last one shorter by less
than k): balanced, where Distributed Shampoo cuts runs of exactly ``max_dim`` and a short remainder,
so that a side just over the limit (1152 at 1024) makes two blocks of 576, not 1024 and 128.
The blocks of one parameter are returned as one (n, rows, cols) stack: the short edge blocks are
zero-padded to full size, which changes nothing (a zero row of G adds a zero row and column to
G G^T, whose inverse root is then block-diagonal, and a zero row of G stays zero), and it lets every
block of every parameter with the same block shape go through one batched matmul or eigh.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import torch
from torch import Tensor

from gradwise.transforms.matrix_root import eigenbases, finite_blocks


@dataclass(frozen=True)
class Blocking:
    """How one parameter shape is cut: matrix (rows, cols) into a grid of (block_rows, block_cols)."""

    shape: tuple[int, ...]
    rows: int
    cols: int
    block_rows: int
    block_cols: int

    @classmethod
    def of(cls, shape: torch.Size | tuple[int, ...], max_dim: int) -> "Blocking":
        rows = shape[0]
        cols = math.prod(shape[1:])
        return cls(tuple(shape), rows, cols, _balanced(rows, max_dim), _balanced(cols, max_dim))

    @property
    def grid(self) -> tuple[int, int]:
        return -(-self.rows // self.block_rows), -(-self.cols // self.block_cols)

    @property
    def count(self) -> int:
        return self.grid[0] * self.grid[1]

    def split(self, x: Tensor) -> Tensor:
        """(n, block_rows, block_cols) blocks of ``x`` (a tensor of ``shape``), row-major over the grid."""
        gr, gc = self.grid
        m = x.reshape(self.rows, self.cols)
        pad_rows, pad_cols = gr * self.block_rows - self.rows, gc * self.block_cols - self.cols
        if pad_rows or pad_cols:
            m = torch.nn.functional.pad(m, (0, pad_cols, 0, pad_rows))
        blocks = m.reshape(gr, self.block_rows, gc, self.block_cols).transpose(1, 2)
        return blocks.reshape(-1, self.block_rows, self.block_cols)

    def merge(self, blocks: Tensor) -> Tensor:
        """The inverse of ``split``: a tensor of ``shape`` from its blocks (padding dropped)."""
        gr, gc = self.grid
        m = blocks.reshape(gr, gc, self.block_rows, self.block_cols).transpose(1, 2)
        m = m.reshape(gr * self.block_rows, gc * self.block_cols)[: self.rows, : self.cols]
        return m.reshape(self.shape)


def _balanced(length: int, max_dim: int) -> int:
    runs = -(-length // max_dim)
    return -(-length // runs)


#: a batched call holds at most this many elements per stacked operand (64 MiB of float32): past
#: that, a batch of huge blocks only adds temporaries on fresh pages, and no launches are saved.
BATCH_ELEMENTS = 1 << 24


def block_groups(matrices: list[int], blockings: dict[int, Blocking], batch: bool) -> list[list[tuple[int, slice]]]:
    """Lists of (parameter index, slice of its blocks) whose blocks go through one batched call:
    blocks of one shape together, up to ``BATCH_ELEMENTS`` per stack, or (``batch=False``) each
    block alone."""
    if not batch:
        return [[(i, slice(k, k + 1))] for i in matrices for k in range(blockings[i].count)]
    groups: dict[tuple[int, int], list[list[tuple[int, slice]]]] = {}
    for i in matrices:
        b = blockings[i]
        per_batch = max(1, BATCH_ELEMENTS // max(b.block_rows, b.block_cols) ** 2)
        chunks = groups.setdefault((b.block_rows, b.block_cols), [[]])
        start = 0
        while start < b.count:
            room = per_batch - sum(k.stop - k.start for _, k in chunks[-1])
            if room == 0:
                chunks.append([])
                continue
            stop = min(b.count, start + room)
            chunks[-1].append((i, slice(start, stop)))
            start = stop
    return [chunk for chunks in groups.values() for chunk in chunks if chunk]


def pieces(stack: Tensor, members: list[tuple[int, slice]]) -> list[Tensor]:
    """``stack`` (the members' blocks, concatenated) cut back into one piece per member."""
    return list(stack.split([k.stop - k.start for _, k in members]))


def stacked(parts: list[Tensor]) -> Tensor:
    """``torch.cat(parts)``; a lone contiguous part is returned itself, a view, not copied (a group of one
    parameter's blocks, such as an embedding's: copying its factors or roots each step would be a pass over all
    of them). A lone part that is not contiguous is copied, as ``cat`` would, so that reductions over it add in
    the same order."""
    return parts[0].contiguous() if len(parts) == 1 else torch.cat(parts)


def write_back(stack: Tensor, members: list[tuple[int, slice]], buffers: list[Tensor]) -> None:
    """Copy ``stack`` (the members' blocks) into each member's blocks of ``buffers``, unless it is already
    them (``stacked`` of one part)."""
    for (i, k), piece in zip(members, pieces(stack, members)):
        if piece.data_ptr() != buffers[i][k].data_ptr():
            buffers[i][k].copy_(piece)


def accumulate_factors(grads: Tensor, members, state, weight: Tensor | None) -> Tensor:
    """Shampoo's Kronecker statistics for stacked blocks ``grads``: L <- L + G G^T and R <- R + G^T G
    (``weight`` None: AdaGrad-style sums), or L <- L + weight (G G^T - L) and likewise R (moving averages),
    each side through ``accumulate_factor``. Returns the number of (block, side) updates skipped."""
    return (accumulate_factor(grads @ grads.mT, members, state["factor_left"], weight)
            + accumulate_factor(grads.mT @ grads, members, state["factor_right"], weight))


def accumulate_factor(outer: Tensor, members, factors: list[Tensor], weight: Tensor | None) -> Tensor:
    """F <- F + X (``weight`` None) or F <- F + weight (X - F) for each member block's factor F of
    ``factors``, X the block's matrix in the stack ``outer`` (overwritten).

    A block whose new factor would not be finite (a gradient entry of 1e20 squares past float32's
    range; a NaN) keeps its factor, so one bad gradient never poisons the preconditioner for good.
    Returns the number of blocks skipped, a 0-d tensor on the device (no sync)."""
    skipped = torch.zeros((), dtype=torch.int64, device=outer.device)
    for (i, k), piece in zip(members, pieces(outer, members)):
        factor = factors[i][k]
        # the new factor is written over the product (a temporary), then where it is finite over the factor
        new = torch.add(factor, piece, out=piece) if weight is None else torch.lerp(factor, piece, weight, out=piece)
        ok = finite_blocks(new)[:, None, None]
        torch.where(ok, new, factor, out=factor)
        skipped += (~ok).sum()
    return skipped


def refresh_eigenbases(members, state) -> int:
    """Each member block's ``basis_left`` and ``basis_right`` set to the eigenvectors of its factors
    (``factor_left``, ``factor_right``) by decreasing eigenvalue, computed in at least float32; a block
    whose ``eigh`` fails keeps its basis (a warning). Returns the number of bases that fell back."""
    failed = 0
    for side in ("left", "right"):
        factors = stacked([state[f"factor_{side}"][i][k] for i, k in members])
        previous = stacked([state[f"basis_{side}"][i][k] for i, k in members])
        bases, fell_back = eigenbases(factors, torch.promote_types(factors.dtype, torch.float32), previous)
        failed += fell_back
        write_back(bases, members, state[f"basis_{side}"])
    return failed


class SkippedUpdates:
    """A transform's count of skipped factor updates, kept on the device between the steps that sync
    anyway (root or basis refreshes), where it is read and a warning names the new ones."""

    def __init__(self, count: int = 0) -> None:
        self.count, self._pending = count, None

    def add(self, skipped: Tensor) -> None:
        self._pending = skipped if self._pending is None else self._pending + skipped.to(self._pending.device)

    def flush(self) -> None:
        """Add the pending count to ``count`` (a sync), with a warning when it grew."""
        if self._pending is not None:
            new, self._pending = int(self._pending), None
            self.count += new
            if new:
                warnings.warn(f"gradwise: {new} preconditioner factor update(s) would have made a factor NaN or"
                              " inf (a non-finite or overflowing gradient) and were skipped; the factors keep"
                              " their previous values", RuntimeWarning, stacklevel=5)

    @property
    def total(self) -> int:
        """Every skipped update so far, pending ones included."""
        return self.count + (0 if self._pending is None else int(self._pending))


class FactorCounters:
    """The counters of a Kronecker-factored preconditioner (Shampoo, SOAP), declared as the transform's
    ``counters``, so that ``state_dict()`` saves them and ``load_state_dict`` sets them back:
    ``eigh_failures``, the factors whose eigendecomposition (or basis refresh) failed and kept their
    previous value, and ``skipped_factor_updates``, the factor updates skipped because they would have
    made a factor NaN or inf (``factor_skips``)."""

    counters = ("eigh_failures", "skipped_factor_updates")

    def __init__(self) -> None:
        self.eigh_failures = 0
        self.factor_skips = SkippedUpdates()

    @property
    def skipped_factor_updates(self) -> int:
        return self.factor_skips.total

    @skipped_factor_updates.setter
    def skipped_factor_updates(self, count: int) -> None:
        self.factor_skips = SkippedUpdates(count)
