"""Quantizing a float buffer to small integer codes: the two normalizations and the bit packing.

- Block-wise (Dettmers et al., "8-bit Optimizers via Block-wise Quantization", ICLR 2022,
  arXiv:2110.02861): the flattened buffer is cut into blocks of ``B`` elements; each block keeps its
  largest magnitude as a float32 scale, so an outlier costs precision in its own block only.
- Rank-1 (Li et al., "Memory Efficient Optimizers with 4-bit States", NeurIPS 2023,
  arXiv:2309.01507): a matrix (a tensor of more dimensions is read as ``shape[0]`` rows) keeps its
  row maxima ``r`` and column maxima ``c``; element (i, j) is stored in units of ``min(r_i, c_j)``,
  which bounds it and adapts to an outlier row (a frequent token) and an outlier column (a large
  input feature) alike, where a block of a row-major weight always mixes every column.

Each element is then stored as the index of the nearest value of a code map (``maps``) in units of
its scale. Scales are the largest *finite* magnitudes: NaN and inf are stored as the map's NaN code,
in their own element, and never inflate a scale.
"""
from __future__ import annotations

from typing import Mapping

import torch
from torch import Tensor

from gradwise.core.hashing import element_index, hash32, unsigned
from gradwise.state.maps import CodeMap


def finite_absmax(x: Tensor, dim: int) -> Tensor:
    """Largest finite magnitude along ``dim`` (kept), 0 where there is none. (``|x| < inf`` is
    ``isfinite``, NaN comparing false, in one comparison where compiled ``isfinite`` makes two.)"""
    magnitude = x.abs()
    return torch.where(magnitude < float("inf"), magnitude, 0.0).amax(dim, keepdim=True)


def to_codes(x: Tensor, scale: Tensor, code_map: CodeMap, signed: bool, seed: Tensor | None = None,
             start: int | Tensor = 0) -> Tensor:
    """Index of the map value nearest to ``x / scale`` (integers, shaped like ``x``); with ``seed``, one
    of the two values around it, rounded stochastically (unbiased: small increments accumulate on
    average instead of being rounded away step after step); ``start``: the flat index of ``x``'s first
    element (an int or a 0-d integer tensor; ``hashing.element_index``), which the random bits depend on.

    For non-negative buffers, a positive value nearer zero than the smallest positive code rounds up
    to that code: a second moment is never stored as zero while its first moment is not, which would
    turn m / (sqrt(v) + eps) into a step of m / eps (the zero-point failure of Li et al.).

    A float8 map (``gradwise.state.float8``) rounds to nearest by its own conversion, ``codes``."""
    if hasattr(code_map, "codes"):
        return code_map.codes(x, scale)
    finite = torch.isfinite(x)
    normalized = torch.where(finite, x / torch.where(scale > 0, scale, 1.0), 0.0).clamp(-1 if signed else 0, 1)
    if seed is None:
        codes = code_map.nearest(normalized)
    else:
        index = element_index(normalized, start)
        codes = code_map.stochastic(normalized, unsigned(hash32(index, seed)).to(torch.float32) / 2**32)
    if not signed and code_map.zero == 0:
        codes = torch.where((codes == 0) & (normalized > 0), 1, codes)
    return torch.where(finite, codes, code_map.nan_code)


def block_pieces(numel: int, block: int, offset: int = 0) -> list[tuple[int, int, int]]:
    """``(start, stop, blocks)`` of the runs of a flat buffer that fill blocks alike, for a buffer whose
    first element is element ``offset`` of the logical tensor (a shard's): the end of a block begun
    before it, whole blocks, then the start of one it ends in; empty runs left out."""
    head = min(numel, -offset % block)
    whole = head + (numel - head) // block * block
    runs = ((0, head, 1), (head, whole, (whole - head) // block), (whole, numel, 1))
    return [run for run in runs if run[1] > run[0]]


def encode_blocks(x: Tensor, block: int, code_map: CodeMap, signed: bool, seed: Tensor | None,
                  codes: Tensor, absmax: Tensor, bits: int = 8) -> None:
    """Write the codes of ``x`` (``bits`` per element, packed two per byte when 4) and one float32
    absmax per block into ``codes`` and ``absmax``. The whole blocks and the remainder (a shorter
    last block) are encoded separately, each into its own slice: no padded or concatenated copy of
    the buffer is made, and a compiled step reads and writes every element exactly once."""
    write_pieces({"codes": codes, "absmax": absmax}, block_pieces_codes(x, block, code_map, signed, seed, bits))


def block_pieces_codes(x: Tensor, block: int, code_map: CodeMap, signed: bool, seed: Tensor | None, bits: int = 8
                       ) -> list[tuple[str, int, Tensor]]:
    """``encode_blocks``' codes and absmax as new tensors, ``(part, offset, values)`` for each piece of whole
    blocks and the last block (``Codec.encode_pieces``). (A piece's ``start`` is even when ``bits`` is 4:
    blocks are powers of two of at least 2 elements.)"""
    flat = x.reshape(-1).float()
    out = []
    for start, stop, rows in block_pieces(flat.numel(), block):
        codes, scale = block_rows_codes(flat[start:stop].view(rows, -1), code_map, signed, seed, start, bits)
        out += [("codes", start * bits // 8, codes), ("absmax", start // block, scale)]
    return out


def write_pieces(parts: Mapping[str, Tensor], pieces: list[tuple[str, int, Tensor]]) -> None:
    """Copy each ``(part, offset, values)`` into ``parts[part]`` (flat) from element ``offset`` on."""
    for name, offset, value in pieces:
        parts[name][offset: offset + value.numel()].copy_(value.view(-1))


def block_rows_codes(rows: Tensor, code_map: CodeMap, signed: bool, seed: Tensor | None, start: int | Tensor,
                     bits: int = 8) -> tuple[Tensor, Tensor]:
    """The new parts of ``rows`` (float32, one block a row; ``start``: the flat index of its first element)
    as tensors of their own: the codes (``uint8``, a block a row,
    two elements a byte when ``bits`` is 4) and the absmax (one per row)."""
    scale = finite_absmax(rows, 1)
    row_codes = to_codes(rows, scale, code_map, signed, seed, start=start)
    if bits == 4:
        row_codes = pack4(row_codes.view(-1)).view(rows.shape[0], -1)
    return row_codes.to(torch.uint8), scale.view(-1)


def decode_block_rows(codes: Tensor, absmax: Tensor, code_map: CodeMap, width: int) -> Tensor:
    """The float32 values of blocks of ``width`` elements, a row each, from their codes (one per
    element) and absmax."""
    return code_map.value(codes).view(-1, width) * absmax.view(-1, 1)


def decode_blocks(codes: Tensor, absmax: Tensor, block: int, code_map: CodeMap, shape: torch.Size) -> Tensor:
    whole = shape.numel() // block * block
    head = decode_block_rows(codes[:whole], absmax[: whole // block], code_map, block).view(-1)
    if whole == shape.numel():
        return head.view(shape)
    return torch.cat([head, code_map.value(codes[whole: shape.numel()]) * absmax[-1]]).view(shape)


def encode_rank1(x: Tensor, code_map: CodeMap, signed: bool,
                 seed: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """(codes: flat integers, row maxima, column maxima) of ``x`` read as a ``shape[0]``-row matrix."""
    matrix = x.reshape(x.shape[0], -1).float()
    row_max, col_max = finite_absmax(matrix, 1), finite_absmax(matrix, 0)
    codes = to_codes(matrix, torch.minimum(row_max, col_max), code_map, signed, seed)
    return codes.view(-1), row_max.view(-1), col_max.view(-1)


def decode_rank1(codes: Tensor, row_max: Tensor, col_max: Tensor, code_map: CodeMap, shape: torch.Size) -> Tensor:
    scale = torch.minimum(row_max.view(-1, 1), col_max.view(1, -1))
    return (code_map.value(codes[: shape.numel()]).view(shape[0], -1) * scale).view(shape)


def pack4(codes: Tensor) -> Tensor:
    """Codes in [0, 16) into bytes: element 2k in the low nibble, 2k+1 in the high one."""
    codes = codes.reshape(-1)
    pairs = torch.cat([codes, codes.new_zeros(codes.numel() % 2)]).view(-1, 2)
    return (pairs[:, 0] | (pairs[:, 1] << 4)).to(torch.uint8)


def unpack4(packed: Tensor) -> Tensor:
    wide = packed.to(torch.int32)
    return torch.stack([wide & 0xF, wide >> 4], dim=1).view(-1)
