"""The 4-bit codec of Li et al., "Memory Efficient Optimizers with 4-bit States" (NeurIPS 2023,
arXiv:2309.01507): two codes per byte.

- First moments (signed): small blocks (128 elements) with a per-block absmax scale and the 4-bit
  dynamic map ("B128/DE").
- Second moments (non-negative): rank-1 normalization with a zero-point-free linear map
  ("Rank-1/Linear"). A matrix ``v`` (a tensor of more dimensions is read as ``shape[0]`` rows) keeps
  its row maxima ``r`` and column maxima ``c``; element (i, j) is stored in units of
  ``min(r_i, c_j)``, which is at least the element itself and, unlike one scale per block, adapts to
  an outlier row (a large input feature) and an outlier column alike. 0-d and 1-d buffers use
  128-element blocks with the same linear map.

Scales are the largest finite values; NaN and inf are stored as the NaN code of their element.
"""
from __future__ import annotations

import torch
from torch import Tensor

from gradwise.state.blockwise import blockwise_decode, blockwise_encode, finite_absmax, quantize, table
from gradwise.state.codec import Codec, check_block_size, n_blocks


def pack(codes: Tensor) -> Tensor:
    """Codes in [0, 16) into bytes: element 2k in the low nibble, 2k+1 in the high one."""
    codes = codes.reshape(-1)
    pairs = torch.cat([codes, codes.new_zeros(codes.numel() % 2)]).view(-1, 2)
    return (pairs[:, 0] | (pairs[:, 1] << 4)).to(torch.uint8)


def unpack(packed: Tensor) -> Tensor:
    wide = packed.long()
    return torch.stack([wide & 0xF, wide >> 4], dim=1).view(-1)


def _rank1(shape: torch.Size) -> bool:
    return len(shape) >= 2


class Int4(Codec):
    """Half a byte per element, plus 4 bytes per 128-element block (first moments) or per row and
    column (second moments of matrices): about 0.53 bytes per element each."""

    name = "int4"

    def __init__(self, block_size: int = 128):
        self.block_size = check_block_size("block_size", block_size)

    @property
    def tag(self) -> str:
        return f"int4-b{self.block_size}"

    def empty(self, shape, signed, device):
        block = self.block_size
        parts = {"codes": torch.zeros((shape.numel() + 1) // 2, dtype=torch.uint8, device=device)}
        if not signed and _rank1(shape):
            rows = shape[0]
            parts["row_max"] = torch.zeros(rows, dtype=torch.float32, device=device)
            parts["col_max"] = torch.zeros(shape.numel() // max(rows, 1), dtype=torch.float32, device=device)
        else:
            parts["absmax"] = torch.zeros(n_blocks(shape.numel(), block), dtype=torch.float32, device=device)
        return parts

    def encode(self, x, parts, signed, seed):
        if not signed and _rank1(x.shape):
            codes = self._encode_rank1(x, parts)
        else:
            code_map, bounds = table("dynamic" if signed else "linear", 4, signed, x.device)
            codes, absmax = blockwise_encode(x, self.block_size, code_map, bounds)
            parts["absmax"].copy_(absmax)
        parts["codes"].copy_(pack(codes.view(-1)[: x.numel()]))

    def _encode_rank1(self, x: Tensor, parts: dict[str, Tensor]) -> Tensor:
        code_map, bounds = table("linear", 4, False, x.device)
        matrix = x.reshape(x.shape[0], -1).float()
        row_max, col_max = finite_absmax(matrix, 1), finite_absmax(matrix, 0)
        scale = torch.minimum(row_max, col_max)
        finite = torch.isfinite(matrix)
        normalized = torch.where(finite, matrix / torch.where(scale > 0, scale, 1.0), 0.0).clamp(0, 1)
        codes = quantize(normalized, finite, bounds, code_map.numel() - 1).view(-1)
        parts["row_max"].copy_(row_max.view(-1))
        parts["col_max"].copy_(col_max.view(-1))
        return codes

    def decode(self, parts, shape, signed, dtype):
        codes = unpack(parts["codes"])
        if not signed and _rank1(shape):
            code_map, _ = table("linear", 4, False, codes.device)
            rows = shape[0]
            scale = torch.minimum(parts["row_max"].view(rows, 1), parts["col_max"].view(1, -1))
            values = code_map[codes[: shape.numel()]].view(rows, -1) * scale
            return values.view(shape).to(dtype)
        code_map, _ = table("dynamic" if signed else "linear", 4, signed, codes.device)
        return blockwise_decode(codes, parts["absmax"], self.block_size, code_map, shape, dtype)
