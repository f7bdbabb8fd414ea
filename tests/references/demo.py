"""DeMo written out from the paper in numpy float64, every worker simulated in turn in one process.

Peng, Quesnelle, Kingma 2024, "DeMo: Decoupled Momentum Optimization", with the authors' released code's
choices (bloc97/DeMo): scipy's orthonormal DCT-II per block (each dim cut into chunks of its largest divisor
at most ``chunk``), each worker's own momentum ``m <- beta m + g``, its ``topk`` largest components per block
removed from it and sent, each component's mean over the workers that sent it, the inverse DCT ``q``, then
``x <- x (1 - lr wd) - lr sign(q)`` (``q`` itself with ``sign=False``); with ``adam_beta2=b2``, gradwise's Adam-like
final step: ``v <- b2 v + (1 - b2) q^2``, ``x <- x (1 - lr wd) - lr q / (sqrt(v / (1 - b2^t)) + eps)``.
"""
from __future__ import annotations

import numpy as np
import scipy.fft
import torch


def _divisor_at_most(n: int, s: int) -> int:
    return next(d for d in range(min(n, s), 0, -1) if n % d == 0)


def blocks_of(x: np.ndarray, chunk: int) -> np.ndarray:
    """(blocks, c0, c1) of a matrix view, or (blocks, c) of a vector."""
    if x.ndim <= 1:
        x = x.reshape(-1)
        return x.reshape(-1, _divisor_at_most(x.size, chunk))
    x = x.reshape(x.shape[0], -1)
    (n0, n1), c0, c1 = x.shape, _divisor_at_most(x.shape[0], chunk), _divisor_at_most(x.shape[1], chunk)
    return x.reshape(n0 // c0, c0, n1 // c1, c1).transpose(0, 2, 1, 3).reshape(-1, c0, c1)


def unblocks(blocks: np.ndarray, shape) -> np.ndarray:
    if blocks.ndim == 2:
        return blocks.reshape(shape)
    n0 = shape[0]
    n1 = int(np.prod(shape)) // n0
    c0, c1 = blocks.shape[1:]
    return blocks.reshape(n0 // c0, n1 // c1, c0, c1).transpose(0, 2, 1, 3).reshape(shape)


def dct(blocks: np.ndarray) -> np.ndarray:
    return scipy.fft.dctn(blocks, axes=tuple(range(1, blocks.ndim)), norm="ortho")


def idct(blocks: np.ndarray) -> np.ndarray:
    return scipy.fft.idctn(blocks, axes=tuple(range(1, blocks.ndim)), norm="ortho")


def simulate(model: torch.nn.Module, backward, world: int, steps: int, lr: float, beta: float,
             weight_decay: float, sign: bool, chunk: int, topk: int, adam_beta2: float | None = None,
             eps: float = 1e-8) -> list[np.ndarray]:
    """The parameters after ``steps`` steps of DeMo on ``world`` workers (``backward(model, step, rank)``
    fills the gradients of ``model``, whose parameters are set to each worker's in turn)."""
    x = [p.detach().numpy().copy() for p in model.parameters()]
    momenta = [[np.zeros_like(p) for p in x] for _ in range(world)]
    second = [np.zeros_like(p) for p in x]
    for step in range(steps):
        sent = []  # per worker, per parameter: (blocks, components) arrays of the values sent, nan elsewhere
        for rank in range(world):
            with torch.no_grad():
                for p, value in zip(model.parameters(), x):
                    p.copy_(torch.from_numpy(value))
            model.zero_grad()
            backward(model, step, rank)
            mine = []
            for i, p in enumerate(model.parameters()):
                m = momenta[rank][i] = beta * momenta[rank][i] + p.grad.numpy()
                c = dct(blocks_of(m, chunk))
                flat = c.reshape(c.shape[0], -1)
                k = min(topk, flat.shape[1])
                top = np.argsort(-np.abs(flat), axis=1)[:, :k]
                chosen = np.full_like(flat, np.nan)
                np.put_along_axis(chosen, top, np.take_along_axis(flat, top, axis=1), axis=1)
                momenta[rank][i] = m - unblocks(idct(np.nan_to_num(chosen).reshape(c.shape)), m.shape)
                mine.append(chosen)
            sent.append(mine)
        for i in range(len(x)):
            stacked = np.stack([worker[i] for worker in sent])
            count = (~np.isnan(stacked)).sum(axis=0)
            mean = np.where(count > 0, np.nansum(stacked, axis=0) / np.maximum(count, 1), 0.0)
            shape = dct(blocks_of(x[i], chunk)).shape
            q = unblocks(idct(mean.reshape(shape)), x[i].shape)
            if adam_beta2 is None:
                update = np.sign(q) if sign else q
            else:
                second[i] = adam_beta2 * second[i] + (1 - adam_beta2) * q * q
                update = q / (np.sqrt(second[i] / (1 - adam_beta2 ** (step + 1))) + eps)
            x[i] = x[i] * (1 - lr * weight_decay) - lr * update
    return x
