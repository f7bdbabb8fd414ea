"""Chunked DCT-II of a tensor, as DeMo compresses momentum (Peng, Quesnelle, Kingma 2024).

A tensor is seen as a matrix (a vector stays a vector; 0-d is a vector of one; more than two dims are
``(shape[0], rest)``), each of its dims cut into chunks of ``c``, the largest divisor of the dim that is at
most the target chunk size ``s``. Each ``c0 x c1`` block (each run of ``c`` for a vector) is transformed by
the orthonormal DCT-II along each of its dims::

    C[k, n] = sqrt(2 / c) * w_k * cos(pi * (2n + 1) * k / (2c)),   w_0 = 1 / sqrt(2), w_k = 1 otherwise
    coefficients = C0 @ block @ C1^T,   block = C0^T @ coefficients @ C1     (C is orthogonal)

``encode`` returns the coefficients as ``(blocks, c0 * c1)`` rows, one row per block, row-major within
a block; ``decode`` is its inverse, back to the tensor's shape.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor


def chunk_size(dim: int, target: int) -> int:
    """The largest divisor of ``dim`` that is at most ``target`` (``dim`` itself when it is smaller)."""
    return max(d for d in range(1, min(dim, target) + 1) if dim % d == 0)


def dct_matrix(size: int, dtype: torch.dtype, device: torch.device | str = "cpu") -> Tensor:
    """The orthonormal DCT-II matrix of ``size`` (rows are frequencies), computed in float64."""
    n = torch.arange(size, dtype=torch.float64)
    matrix = torch.cos(math.pi * (2 * n[None, :] + 1) * n[:, None] / (2 * size)) * math.sqrt(2 / size)
    matrix[0] /= math.sqrt(2)
    return matrix.to(dtype=dtype, device=device)


@dataclass
class ChunkedDCT:
    """The blocks of one tensor shape and their DCT matrices (one per dim of the matrix view)."""

    shape: torch.Size
    #: the matrix view's dims and their chunk sizes (one entry for a vector)
    dims: tuple[int, ...]
    chunks: tuple[int, ...]
    matrices: tuple[Tensor, ...]

    @classmethod
    def of(cls, tensor: Tensor, target: int) -> "ChunkedDCT":
        dims = (tensor.shape[0], tensor.numel() // tensor.shape[0]) if tensor.dim() > 1 else (tensor.numel(),)
        chunks = tuple(chunk_size(d, target) for d in dims)
        matrices = tuple(dct_matrix(c, tensor.dtype, tensor.device) for c in chunks)
        return cls(tensor.shape, dims, chunks, matrices)

    @property
    def components(self) -> int:
        """Coefficients per block (per row of ``encode``)."""
        return math.prod(self.chunks)

    @property
    def blocks(self) -> int:
        return math.prod(d // c for d, c in zip(self.dims, self.chunks))

    def encode(self, tensor: Tensor) -> Tensor:
        """``(blocks, components)``: each block's DCT-II coefficients."""
        if len(self.dims) == 1:
            return tensor.reshape(self.blocks, self.chunks[0]) @ self.matrices[0].T
        (n0, n1), (c0, c1) = self.dims, self.chunks
        blocks = tensor.reshape(n0 // c0, c0, n1 // c1, c1).permute(0, 2, 1, 3)
        return (self.matrices[0] @ blocks @ self.matrices[1].T).reshape(self.blocks, c0 * c1)

    def decode(self, coefficients: Tensor) -> Tensor:
        """The tensor whose ``encode`` is ``coefficients``, in the tensor's shape."""
        if len(self.dims) == 1:
            return (coefficients @ self.matrices[0]).reshape(self.shape)
        (n0, n1), (c0, c1) = self.dims, self.chunks
        blocks = self.matrices[0].T @ coefficients.reshape(n0 // c0, n1 // c1, c0, c1) @ self.matrices[1]
        return blocks.permute(0, 2, 1, 3).reshape(self.shape)
