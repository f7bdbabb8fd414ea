"""The integer codecs: ``int8`` and ``int4``, each a choice of normalization, code map and rounding
per kind of buffer (signed: first moments and the like; non-negative: second moments).

=========  ========================================  ==============================================
codec      signed buffers                            non-negative buffers
=========  ========================================  ==============================================
``int8``   2048-blocks, 8-bit dynamic map, nearest   rank-1, 8-bit unsigned dynamic map, nearest
``int4``   128-blocks, 4-bit dynamic map,            rank-1, 4-bit zero-point-free linear map,
           stochastic rounding                       nearest ("Rank-1/Linear", Li et al.)
=========  ========================================  ==============================================

Where this departs from the papers, measurements decided (``python bench/memory.py``: mean final
loss over 3 seeds relative to float32 on an MLP with outlier input features):

- Dettmers et al.'s ``int8`` quantizes second moments in blocks too (``Int8(normalization="block")``,
  tag ``int8-b2048-block``): 1.14. A row-major weight's blocks always mix the outlier columns with
  the others, whose second moments then fall in the map's coarse low decades. Rank-1 normalization
  gives each column its own range: 1.003.
- Li et al.'s ``int4`` rounds first moments to nearest ("B128/DE"): 1.47. An increment
  (1 - b1) g smaller than half a code gap is rounded away every step; stochastic rounding keeps
  the moment unbiased: 1.024.

``normalization=`` (``"block"`` or ``"rank1"``) and ``rounding=`` (``"nearest"`` or ``"stochastic"``)
override both kinds of buffer; 0-d and 1-d buffers, and empty ones (no row or column to take a
maximum over), always use blocks. A DTensor parameter's buffer is encoded shard by shard with the
blocks, scales and random bits of its logical tensor (``gradwise.state.shards``).
"""
from __future__ import annotations

import torch
from torch import Tensor

from gradwise.core.hyper import choice
from gradwise.state.codec import Codec, alias, check_block_size, n_blocks
from gradwise.state.maps import code_map
from gradwise.state.quantize import (
    block_pieces,
    block_pieces_codes,
    block_rows_codes,
    decode_block_rows,
    decode_blocks,
    decode_rank1,
    encode_blocks,
    encode_rank1,
    pack4,
    unpack4,
)
from gradwise.state.shards import (
    decode_blocks_on_shard,
    decode_rank1_on_shard,
    encode_blocks_on_shard,
    encode_rank1_on_shard,
    pack_rows,
    unpack_rows,
)

_NORMALIZATIONS = ("default", "block", "rank1")
_ROUNDINGS = ("default", "nearest", "stochastic")


class Quantized(Codec):
    """Base of the integer codecs: ``bits`` per element, packed two per byte when 4."""

    bits = 8
    default_block = 2048
    #: (normalization, map, rounding) for signed and for non-negative buffers, where the constructor's
    #: ``normalization`` and ``rounding`` say "default".
    signed_layout = ("block", "dynamic", "nearest")
    unsigned_layout = ("rank1", "dynamic", "nearest")

    def __init__(self, block_size: int | None = None, normalization: str = "default", rounding: str = "default"):
        self.rounding = choice(_ROUNDINGS)("rounding", rounding)
        self.block_size = check_block_size("block_size", self.default_block if block_size is None else block_size)
        self.normalization = choice(_NORMALIZATIONS)("normalization", normalization)
        #: the code map of signed and of non-negative buffers, built here (not while compiling a step)
        self.maps = {signed: self.code_map(layout[1], signed)
                     for signed, layout in ((True, self.signed_layout), (False, self.unsigned_layout))}
        self._zero_bytes: dict[tuple[bool, bool], int] = {}

    def code_map(self, kind: str, signed: bool):
        """The map of ``kind`` (a layout's second field) for signed or non-negative buffers."""
        return code_map(kind, self.bits, signed)

    @property
    def tag(self) -> str:
        suffix = "" if self.normalization == "default" else f"-{self.normalization}"
        suffix += "" if self.rounding == "default" else f"-{self.rounding}"
        return f"{self.name}-b{self.block_size}{suffix}"

    def layout(self, shape: torch.Size, signed: bool) -> tuple[bool, str, bool]:
        """(rank-1 normalization?, map kind, stochastic rounding?) for a buffer of ``shape``."""
        normalization, kind, rounding = self.signed_layout if signed else self.unsigned_layout
        normalization = normalization if self.normalization == "default" else self.normalization
        rounding = rounding if self.rounding == "default" else self.rounding
        rank1 = normalization == "rank1" and len(shape) >= 2 and shape.numel() > 0
        return rank1, kind, rounding == "stochastic"

    def empty(self, shape, signed, device, shard=None):
        if shard is not None:
            return self._empty_on_shard(shard, signed, device)
        numel = shape.numel()
        codes = numel if self.bits == 8 else (numel + 1) // 2
        parts = {"codes": torch.zeros(codes, dtype=torch.uint8, device=device)}
        if self.layout(shape, signed)[0]:
            parts["row_max"] = torch.zeros(shape[0], dtype=torch.float32, device=device)
            parts["col_max"] = torch.zeros(numel // max(shape[0], 1), dtype=torch.float32, device=device)
        else:
            parts["absmax"] = torch.zeros(n_blocks(numel, self.block_size), dtype=torch.float32, device=device)
        return parts

    def zeros(self, shape, signed, device):
        """Every code byte the map's code of 0 (two codes of 0 a byte at 4 bits), every scale 0; a 4-bit buffer of
        odd length (its last byte half padding) is encoded."""
        if self.bits == 4 and shape.numel() % 2:
            return super().zeros(shape, signed, device)
        rank1 = self.layout(shape, signed)[0]
        parts = self.empty(shape, signed, device)
        parts["codes"].fill_(self._zero_byte(signed, rank1))
        return parts

    def _zero_byte(self, signed: bool, rank1: bool) -> int:
        """The code byte of zeros, read from encoding a 2 x 2 (rank-1 scales) or 2-element buffer of zeros."""
        key = (signed, rank1)
        if key not in self._zero_bytes:
            shape = torch.Size((2, 2) if rank1 else (2,))
            self._zero_bytes[key] = int(super().zeros(shape, signed, torch.device("cpu"))["codes"][0])
        return self._zero_bytes[key]

    def _empty_on_shard(self, shard, signed, device):
        """A DTensor parameter's local parts, rows first (``gradwise.state.shards``)."""
        rows = shard.local_rows
        parts = {"codes": torch.zeros(rows, shard.row_bytes(self.bits), dtype=torch.uint8, device=device)}
        if self.layout(shard.shape, signed)[0]:
            parts["row_max"] = torch.zeros(rows, dtype=torch.float32, device=device)
            parts["col_max"] = torch.zeros(shard.row_numel, dtype=torch.float32, device=device)
        else:
            size = (shard.vector_blocks(self.block_size),) if shard.is_vector else \
                (rows, shard.table_width(self.block_size))
            parts["absmax"] = torch.zeros(size, dtype=torch.float32, device=device)
        return parts

    def replicated_parts(self, shape, signed):
        if self.layout(shape, signed)[0]:
            return ("col_max",)
        return ("absmax",) if len(shape) <= 1 else ()

    def all_reduced(self, shard, signed) -> int:
        """float32 elements one encode of a sharded buffer all-reduces (``gradwise.state.shards``): every
        block scale of a vector, the scales of the blocks a shard boundary cuts, or the column maxima."""
        if shard.split is None:
            return 0
        if self.layout(shard.shape, signed)[0]:
            return shard.row_numel
        return shard.vector_blocks(self.block_size) if shard.is_vector else len(shard.cut_blocks(self.block_size))

    def encode(self, x, parts, signed, seed, shard=None):
        rank1, _, stochastic = self.layout(x.shape if shard is None else shard.shape, signed)
        values, seed = self.maps[signed], seed if stochastic else None
        if not rank1 and shard is None:
            encode_blocks(x, self.block_size, values, signed, seed, parts["codes"], parts["absmax"], self.bits)
        elif not rank1:
            encode_blocks_on_shard(x, self.block_size, values, signed, seed, shard, parts, self.bits)
        else:
            if shard is None:
                codes, row_max, col_max = encode_rank1(x, values, signed, seed)
                codes = codes if self.bits == 8 else pack4(codes)
            else:
                codes, row_max, col_max = encode_rank1_on_shard(x, values, signed, seed, shard)
                codes = pack_rows(codes, shard, self.bits)
            parts["codes"].copy_(codes)
            parts["row_max"].copy_(row_max)
            parts["col_max"].copy_(col_max)

    def encode_pieces(self, x, signed, seed):
        rank1, _, stochastic = self.layout(x.shape, signed)
        if rank1 or len(block_pieces(x.numel(), self.block_size)) < 2:
            return None
        return block_pieces_codes(x, self.block_size, self.maps[signed], signed, seed if stochastic else None,
                                  self.bits)

    def decode(self, parts, shape, signed, dtype, shard=None) -> Tensor:
        rank1 = self.layout(shape if shard is None else shard.shape, signed)[0]
        values = self.maps[signed]
        if shard is not None:
            codes = unpack_rows(parts["codes"], shard, self.bits)
            decoded = decode_rank1_on_shard(codes, parts["row_max"], parts["col_max"], values, shard) if rank1 \
                else decode_blocks_on_shard(codes, parts["absmax"], self.block_size, values, shard)
            return decoded.view(shape).to(dtype)
        codes = parts["codes"] if self.bits == 8 else unpack4(parts["codes"])
        if rank1:
            return decode_rank1(codes, parts["row_max"], parts["col_max"], values, shape).to(dtype)
        return decode_blocks(codes, parts["absmax"], self.block_size, values, shape).to(dtype)


    def run_width(self, shape, signed):
        odd = self.bits == 4 and shape.numel() % 2  # a last byte holding half an element
        return None if self.layout(shape, signed)[0] or odd else self.block_size

    def run_parts(self, parts, start, stop, rows):
        bytes_per_row = ((stop - start) * self.bits + 7) // 8 // rows
        return {"codes": alias(parts["codes"], start * self.bits // 8, (rows, bytes_per_row)),
                "absmax": alias(parts["absmax"], start // self.block_size, (rows,))}

    def decode_run(self, parts, signed, dtype):
        codes, rows = parts["codes"], parts["absmax"].numel()
        if self.bits == 4:
            codes = unpack4(codes.view(-1)).view(rows, -1)
        return decode_block_rows(codes, parts["absmax"], self.maps[signed], codes.shape[1]).to(dtype)

    def encode_run(self, x, parts, signed, seed, start):
        stochastic = self.layout(x.shape, signed)[2]
        codes, absmax = block_rows_codes(x.float(), self.maps[signed], signed, seed if stochastic else None, start,
                                         self.bits)
        return {"codes": codes, "absmax": absmax}


class Int8(Quantized):
    """1 byte per element plus a float32 scale per 2048-element block: 1.002 bytes per element."""

    name = "int8"


class Int4(Quantized):
    """Half a byte per element plus 4 bytes per 128-element block (first moments) or per row and
    column (second moments of matrices): about 0.53 bytes per element."""

    name = "int4"
    bits = 4
    default_block = 128
    signed_layout = ("block", "dynamic", "stochastic")
    unsigned_layout = ("rank1", "linear", "nearest")
