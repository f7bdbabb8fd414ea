"""MicroAdam (Modoranu, Safaryan, Malinovsky, Kurtic, Robert, Richtarik & Alistarh, 2024, "MicroAdam: Accurate
Adaptive Optimization with Low Space Overhead and Provable Convergence", arXiv:2405.15593; LITERATURE.md ¶64):
Adam's moments recomputed each step from a window of the last m Top-K sparse gradients, the compression error
fed back into the next gradient and itself stored in 4 bits."""
from __future__ import annotations

import math

import torch
from torch import Tensor

from gradwise.core.hyper import Hyper, betas_pair, int_in, number_in, positive
from gradwise.core.transform import Context, Transform, state_dtype
from gradwise.state.quantize import pack4, unpack4

#: elements per Top-K block: a block-local index fits in an int16, as in the authors' kernels
TOPK_BLOCK = 2**15
#: the largest 4-bit code of the error feedback
LEVELS = 15


def topk_layout(numel: int, density: float) -> tuple[int, int, int, int]:
    """(block, full blocks, k per full block, k of the shorter last block): Top-K runs in blocks of
    ``min(numel, TOPK_BLOCK)`` elements, ceil(density * block elements) kept in each (the authors' layout)."""
    block = min(numel, TOPK_BLOCK)
    full = numel // block if block else 0
    return block, full, math.ceil(block * density), math.ceil((numel - full * block) * density)


def quantize_blocks(a: Tensor, block: int) -> tuple[Tensor, Tensor]:
    """4-bit codes of ``a`` (flat) and each block's (min, max): q = floor((a - min) / u + 1/2), u = (max - min) / 15."""
    blocks = -(-a.numel() // block)
    x = torch.cat([a, a[-1:].expand(blocks * block - a.numel())]).view(blocks, block)  # the pad repeats a value
    low, high = x.amin(1, keepdim=True), x.amax(1, keepdim=True)
    unit = (high - low) / LEVELS
    codes = torch.where(unit > 0, torch.floor((x - low) / unit + 0.5), 0.0).clamp_(0, LEVELS)
    return pack4(codes.to(torch.uint8).view(-1)[:a.numel()]), torch.cat([low, high], 1)


def dequantize_blocks(packed: Tensor, ranges: Tensor, numel: int, block: int) -> Tensor:
    """The inverse of ``quantize_blocks``: code q of a block becomes min + q (max - min) / 15."""
    blocks = ranges.shape[0]
    codes = unpack4(packed)[:numel].to(ranges.dtype)
    codes = torch.cat([codes, codes.new_zeros(blocks * block - numel)]).view(blocks, block)
    low, high = ranges[:, :1], ranges[:, 1:]
    return (codes * ((high - low) / LEVELS) + low).view(-1)[:numel]


class scale_by_micro_adam(Transform):  # noqa: N801 - transforms are named like functions (optax grammar)
    """MicroAdam's direction. At step t, with e the error feedback, W the window of the last m = ``m`` sparse
    gradients (row (s - 1) mod m holds step s's), Top-K by magnitude in blocks (``topk_layout``, density
    ``k_init``) and Q 4-bit min-max quantization in blocks of ``quant_block_size``:

        a <- u + Q^-1(e);  I <- TopK(|a|);  W[(t-1) mod m] <- (I, a[I]);  a[I] <- 0;  e <- Q(a)
        m_hat = (1-b1)/(1-b1^t) sum_s b1^(t-s) g_s;  v_hat = (1-b2)/(1-b2^t) sum_s b2^(t-s) g_s^2  (s in the window)
        u <- m_hat / (sqrt(v_hat) + eps)

    with g_s the sparse gradient of step s. The window stores block-local int16 indices and bfloat16 values
    (m k entries each, k ~ ``k_init`` d), the error d / 2 bytes and one float (min, max) pair per quantization
    block, the layout of the authors' kernels; the moments are never kept. Not elementwise (Top-K and
    quantization blocks span the tensor): it runs on whole tensors, eagerly, as a ``batched`` link does (a
    graph of Top-K, index_add and bit packing per tensor shape takes minutes to compile and fuses little).
    """

    name = "micro_adam"
    state = ("error_range", "error", "window_indices", "window_values")
    hyper = {"betas": Hyper((0.9, 0.999), betas_pair), "eps": Hyper(1e-8, positive),
             "m": Hyper(10, int_in(1, note="gradients in the window"), static=True),
             "k_init": Hyper(0.01, number_in(0, 1, open_low=True, note="the Top-K density"), static=True),
             "quant_block_size": Hyper(100_000, int_in(1, note="elements per error quantization block"),
                                       static=True)}
    elementwise = False
    batched = True
    reads_params = False

    def init(self, param: Tensor, group) -> dict[str, Tensor]:
        d, device = param.numel(), param.device
        _, full, k_full, k_rest = topk_layout(d, group["k_init"])
        k = full * k_full + k_rest
        return {"error_range": torch.zeros(-(-d // group["quant_block_size"]), 2, dtype=state_dtype(param),
                                           device=device),
                "error": torch.zeros((d + 1) // 2, dtype=torch.uint8, device=device),
                "window_indices": torch.zeros(group["m"], k, dtype=torch.int16, device=device),
                "window_values": torch.zeros(group["m"], k, dtype=torch.bfloat16, device=device)}

    def scalars(self, hyper, step: int) -> dict[str, float]:
        b1, b2 = map(float, hyper["betas"])
        return {"row": float((step - 1) % int(hyper["m"])), "moment1": (1 - b1) / (1 - b1**step),
                "moment2": (1 - b2) / (1 - b2**step)}

    def update(self, updates: list[Tensor], state, ctx: Context) -> list[Tensor]:
        return [self.one(u, {k: state[k][i] for k in self.state}, ctx) for i, u in enumerate(updates)]

    def one(self, u: Tensor, own: dict[str, Tensor], ctx: Context) -> Tensor:
        d, qblock = u.numel(), ctx["quant_block_size"]
        if d == 0:
            return torch.zeros_like(u)
        block, full, k_full, k_rest = topk_layout(d, ctx["k_init"])
        a = u.reshape(-1).to(own["error_range"].dtype) + dequantize_blocks(own["error"], own["error_range"], d, qblock)
        picked = [a[:full * block].view(full, block).abs().topk(k_full, sorted=False).indices.view(-1)]
        if k_rest:
            picked.append(a[full * block:].abs().topk(k_rest, sorted=False).indices)
        local = torch.cat(picked)
        offsets = torch.cat([torch.arange(full, device=a.device).repeat_interleave(k_full) * block,
                             torch.full((k_rest,), full * block, device=a.device, dtype=torch.long)])
        row = ctx["row"].long().view(1)
        own["window_indices"].index_copy_(0, row, local.to(torch.int16).view(1, -1))
        own["window_values"].index_copy_(0, row, a[local + offsets].to(torch.bfloat16).view(1, -1))
        a.index_fill_(0, local + offsets, 0.0)
        codes, ranges = quantize_blocks(a, qblock)
        own["error"].copy_(codes)
        own["error_range"].copy_(ranges)
        return self.direction(own, offsets, d, ctx).view(u.shape).to(u.dtype)

    def direction(self, own: dict[str, Tensor], offsets: Tensor, d: int, ctx: Context) -> Tensor:
        """m_hat / (sqrt(v_hat) + eps) from the window, one row at a time (each row's indices are distinct, so
        the sums are the same, in the same order, on every device)."""
        b1, b2 = ctx["betas"]
        values, dtype = own["window_values"], own["error_range"].dtype
        ages = torch.remainder(ctx["row"] - torch.arange(values.shape[0], device=values.device), values.shape[0])
        first = torch.zeros(d, dtype=dtype, device=values.device)
        second = torch.zeros_like(first)
        for r in range(values.shape[0]):
            where, g = own["window_indices"][r].long() + offsets, values[r].to(dtype)
            first.index_add_(0, where, g * b1 ** ages[r])
            second.index_add_(0, where, g * g * b2 ** ages[r])
        return ctx["moment1"] * first / ((ctx["moment2"] * second).sqrt() + ctx["eps"])
