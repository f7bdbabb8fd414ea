"""Block-wise quantization with a per-block absmax scale, and the 8-bit codec built on it.

Dettmers et al., "8-bit Optimizers via Block-wise Quantization" (ICLR 2022, arXiv:2110.02861): the
flattened buffer is cut into blocks of ``B`` elements; each block stores its largest magnitude as a
float32 scale and every element as the index of the nearest value of a code map in units of that
scale. An outlier then costs precision in its own block only. The scale is the largest *finite*
magnitude: NaN and inf are stored as the map's NaN code, so they stay in their own element.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from gradwise.state.codec import Codec, check_block_size, n_blocks
from gradwise.state.maps import dynamic_map, midpoints

_TABLES: dict[tuple, tuple[Tensor, Tensor]] = {}


def table(kind: str, bits: int, signed: bool, device: torch.device) -> tuple[Tensor, Tensor]:
    """(code map, rounding boundaries) on ``device``, built once."""
    key = (kind, bits, signed, device)
    if key not in _TABLES:
        from gradwise.state.maps import linear_map

        values = dynamic_map(bits, signed) if kind == "dynamic" else linear_map(bits)
        _TABLES[key] = (values.to(device), midpoints(values).to(device))
    return _TABLES[key]


def to_blocks(x: Tensor, block: int) -> Tensor:
    """``x`` flattened, zero-padded to whole blocks, as a (blocks, block) float32 matrix."""
    flat = x.reshape(-1).float()
    return F.pad(flat, (0, (-flat.numel()) % block)).view(-1, block)


def finite_absmax(blocks: Tensor, dim: int) -> Tensor:
    """Largest finite magnitude along ``dim`` (kept), 0 where there is none."""
    return torch.where(torch.isfinite(blocks), blocks.abs(), 0.0).amax(dim, keepdim=True)


def quantize(normalized: Tensor, finite: Tensor, bounds: Tensor, nan_code: int) -> Tensor:
    """Index of the nearest code for each value of ``normalized`` (already in the map's range);
    ``nan_code`` where the original value was not finite."""
    codes = torch.bucketize(normalized, bounds)
    return torch.where(finite, codes, nan_code)


def blockwise_encode(x: Tensor, block: int, code_map: Tensor, bounds: Tensor) -> tuple[Tensor, Tensor]:
    """(codes as int64 (blocks, block), padding included; absmax (blocks,)) of ``x``."""
    blocks = to_blocks(x, block)
    absmax = finite_absmax(blocks, 1)
    finite = torch.isfinite(blocks)
    normalized = torch.where(finite, blocks / torch.where(absmax > 0, absmax, 1.0), 0.0).clamp(-1, 1)
    return quantize(normalized, finite, bounds, code_map.numel() - 1), absmax.view(-1)


def blockwise_decode(codes: Tensor, absmax: Tensor, block: int, code_map: Tensor, shape, dtype) -> Tensor:
    """``shape``-shaped values of the first ``shape.numel()`` codes (a flat tensor) and their scales."""
    numel = shape.numel()
    values = to_blocks(code_map[codes[:numel].long()], block) * absmax.view(-1, 1)
    return values.view(-1)[:numel].view(shape).to(dtype)


class Int8(Codec):
    """1 byte per element plus a float32 scale per block (2048 elements by default: 1.002 bytes);
    Dettmers et al.'s dynamic tree map, signed for first moments, unsigned for second moments."""

    name = "int8"

    def __init__(self, block_size: int = 2048):
        self.block_size = check_block_size("block_size", block_size)

    @property
    def tag(self) -> str:
        return f"int8-b{self.block_size}"

    def empty(self, shape, signed, device):
        blocks = n_blocks(shape.numel(), self.block_size)
        return {"codes": torch.zeros(shape.numel(), dtype=torch.uint8, device=device),
                "absmax": torch.zeros(blocks, dtype=torch.float32, device=device)}

    def encode(self, x, parts, signed, seed):
        code_map, bounds = table("dynamic", 8, signed, x.device)
        codes, absmax = blockwise_encode(x, self.block_size, code_map, bounds)
        parts["codes"].copy_(codes.view(-1)[: x.numel()])
        parts["absmax"].copy_(absmax)

    def decode(self, parts, shape, signed, dtype):
        code_map, _ = table("dynamic", 8, signed, parts["codes"].device)
        return blockwise_decode(parts["codes"], parts["absmax"], self.block_size, code_map, shape, dtype)
