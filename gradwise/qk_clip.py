"""QK-Clip, the clip of MuonClip (Kimi K2, arXiv:2507.20534): after an optimizer step, the query and key
projections of each attention head whose largest pre-softmax logit passed a threshold are shrunk so that the
logit would be back at the threshold. It touches the weights only, so it follows any optimizer's step."""
from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

from gradwise.core.hyper import closed_unit_interval, positive
from gradwise.core.params import DTensor

Tensors = Tensor | Sequence[Tensor]


@torch.no_grad()
def qk_clip(max_logits: Tensor, *, query: Tensors = (), key: Tensors = (), query_rotary: Tensors = (),
            threshold: float = 100.0, alpha: float = 0.5) -> Tensor:
    """For each head h, with S_h = ``max_logits[h]`` (its largest q.k logit over the step's batch, reduced over
    micro-batches and ranks by the caller) and g_h = ``threshold`` / max(S_h, ``threshold``):

    W_q[h] <- g_h^alpha W_q[h];  W_k[h] <- g_h^(1-alpha) W_k[h];  W_qr[h] <- g_h W_qr[h]

    (``query_rotary``: MLA's per-head rotary query; its shared rotary key is left alone), so q.k shrinks by
    g_h. Each tensor (weights, biases) holds the heads as contiguous blocks along its first dimension, as
    ``nn.Linear(d, heads * head_dim).weight`` does, as pytorch-optimizer's ``MuonClip`` reads them. Everything
    is checked before the first write. Returns g (heads,); call it after ``optimizer.step()``.
    """
    positive("threshold", threshold)
    closed_unit_interval("alpha", alpha)
    if not isinstance(max_logits, Tensor) or max_logits.dim() != 1 or max_logits.numel() == 0:
        raise ValueError(f"invalid max_logits={max_logits!r}: expected a non-empty 1-d tensor, one logit per head")
    if not bool(max_logits.isfinite().all()):
        raise ValueError(f"invalid max_logits={max_logits.tolist()}: expected finite logits")
    heads = max_logits.numel()
    roles = {"query": (query, alpha), "key": (key, 1 - alpha), "query_rotary": (query_rotary, 1.0)}
    work = []
    for role, (tensors, exponent) in roles.items():
        for i, p in enumerate([tensors] if isinstance(tensors, Tensor) else list(tensors)):
            if not isinstance(p, Tensor) or isinstance(p, DTensor):
                raise TypeError(f"invalid {role}[{i}] of type {type(p).__name__}: expected a tensor, not a DTensor"
                                " (a shard holds only some of the heads' rows)")
            if p.dim() == 0 or p.shape[0] % heads:
                raise ValueError(f"invalid {role}[{i}] of shape {tuple(p.shape)}: its first dimension must hold"
                                 f" the {heads} heads of max_logits as equal blocks")
            work.append((p, exponent))
    scales = threshold / max_logits.detach().float().clamp_min(threshold)
    for p, exponent in work:
        rows = scales.pow(exponent).to(device=p.device, dtype=p.dtype).repeat_interleave(p.shape[0] // heads)
        p.mul_(rows.view(-1, *([1] * (p.dim() - 1))))
    return scales
