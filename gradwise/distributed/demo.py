"""DeMo: each worker keeps its own momentum and sends only its fastest components.

Peng, Quesnelle, Kingma 2024, "DeMo: Decoupled Momentum Optimization". The workers (the ranks of
``process_group``) do NOT all-reduce their gradients: each calls ``backward()`` on its own batch (under
DDP, inside ``no_sync()``) and ``step()``, which, for every parameter ``x`` with gradient ``g``::

    m <- beta * m + g                                   (this worker's momentum, never averaged)
    c  = DCT(m)        per chunk: the orthonormal DCT-II of each s x s block (gradwise.distributed.dct)
    k largest |c| of each block: their indices i and values v;   m <- m - iDCT(those k components)
    all-gather (i, v) from every worker;   C[j] = mean of the v sent for component j (0 if none sent it)
    q  = iDCT(C);   x <- x * (1 - lr * weight_decay) - lr * sign(q)    (q itself with sign=False)

``adam_beta2=b2`` (with ``sign=False``) is an Adam-like final step: a second moment of ``q``,
``v <- b2 v + (1 - b2) q^2`` and ``x <- x (1 - lr wd) - lr q / (sqrt(v / (1 - b2^t)) + eps)``. Of ``q``, not of
the gradient: ``q`` is the same on every worker, so ``v`` is too and the parameters stay identical without
another byte sent; and ``q`` already is a momentum (the decoupled one, its fast components), so Adam's first
moment is not added on top (a second momentum, which a gradwise transform chain after ``q`` would add). It
keeps what ``sign`` drops, each coordinate's size relative to its own history, at a step of ``lr`` per
coordinate on average, as signum's.

The mean over the workers that sent a component, the chunk size of a dim (its largest divisor <= s), and
the decoupled weight decay follow the authors' released code (bloc97/DeMo); the momentum follows the
paper (the code folds ``lr`` into it: the same with a constant lr). Every worker computes ``q`` from the
same gathered components, so the parameters stay identical on every worker.

What is sent, counted in ``traffic`` (``comm_stats``): ONE all-gather per step of one byte buffer holding
every parameter's values (its own dtype) and indices (int16 when a block has at most 2^15 components,
int32 otherwise): ``blocks x min(k, components) x (value size + index size)`` bytes per parameter, e.g.
192 bytes per 64 x 64 block of float32 where data-parallel training all-reduces 16384.
"""
from __future__ import annotations

import math
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import Tensor

from gradwise.core.collectives import Traffic, all_gather, deepcopy_on_group
from gradwise.core.params import DTensor
from gradwise.distributed.dct import ChunkedDCT


def _check(name: str, value: Any, ok: bool, allowed: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not ok:
        raise ValueError(f"invalid {name}={value!r}: expected {allowed}")


class DeMo(torch.optim.Optimizer):
    """Decoupled momentum: per-worker momentum, its top-k DCT components per chunk exchanged each step.

    Args:
        params: the parameters (every worker the same, in the same order, from the same values).
        lr: the learning rate (>= 0).
        momentum: beta, the momentum's decay (0 <= beta < 1; the authors' default 0.999).
        chunk: s, the target chunk size along each dim of a parameter (an int >= 1; each dim's chunk is its
            largest divisor <= s).
        topk: k, the components of each block sent per step (an int >= 1, at most the block's size).
        weight_decay: decoupled weight decay (>= 0), ``x <- x * (1 - lr * weight_decay)``.
        sign: take ``sign(q)`` (the paper's signum variant, default) or ``q`` itself.
        adam_beta2: None, or the decay (0 <= b2 < 1) of a second moment of ``q`` that divides it (the
            Adam-like final step; needs ``sign=False``).
        eps: added to the second moment's square root (> 0).
        process_group: the workers (default: the default group; one worker when torch.distributed is not
            initialized, which then applies its own top-k components).
    """

    def __init__(self, params, lr: float = 1e-3, momentum: float = 0.999, chunk: int = 64, topk: int = 32,
                 weight_decay: float = 0.0, sign: bool = True, process_group: Any = None,
                 adam_beta2: float | None = None, eps: float = 1e-8) -> None:
        _check("lr", lr, 0 <= lr < math.inf, "a finite number >= 0")
        _check("momentum", momentum, 0 <= momentum < 1, "a number from 0 to 1 (1 excluded)")
        _check("weight_decay", weight_decay, 0 <= weight_decay < math.inf, "a finite number >= 0")
        for name, value in (("chunk", chunk), ("topk", topk)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"invalid {name}={value!r}: expected an int >= 1")
        if not isinstance(sign, bool):
            raise TypeError(f"invalid sign={sign!r}: expected True (the signum step) or False (q itself)")
        if adam_beta2 is not None:
            _check("adam_beta2", adam_beta2, 0 <= adam_beta2 < 1, "None or a number from 0 to 1 (1 excluded)")
            if sign:
                raise ValueError(f"invalid adam_beta2={adam_beta2!r} with sign=True: the Adam-like step divides q"
                                 " itself by its second moment; expected sign=False with it")
        _check("eps", eps, 0 < eps < math.inf, "a finite number > 0")
        if process_group is not None and not dist.is_initialized():
            raise ValueError(f"invalid process_group={process_group!r}: torch.distributed is not initialized")
        super().__init__(params, {"lr": lr, "momentum": momentum, "weight_decay": weight_decay})
        for i, p in enumerate(self._params()):
            if isinstance(p, DTensor):
                raise NotImplementedError(f"parameter {i} is a DTensor: DeMo exchanges components of whole"
                                          " replicas (one full copy per worker), not FSDP shards")
            if not p.is_floating_point():
                raise ValueError(f"parameter {i} has dtype {p.dtype}: DeMo steps floating-point parameters")
            if p.device != self.param_groups[0]["params"][0].device:
                raise ValueError(f"parameter {i} is on {p.device}, parameter 0 on"
                                 f" {self.param_groups[0]['params'][0].device}: DeMo sends one buffer per step,"
                                 " from one device")
        self.chunk, self.topk, self.sign = chunk, topk, sign
        self.adam_beta2, self.eps = (None if adam_beta2 is None else float(adam_beta2)), float(eps)
        self.process_group = process_group
        self.world = dist.get_world_size(process_group) if dist.is_initialized() else 1
        self.traffic = Traffic()
        #: steps taken since training began (kept in ``state_dict``)
        self.steps = 0
        self._dct: dict[tuple, ChunkedDCT] = {}
        # every momentum from the start (zero; the first step adds the gradient to it exactly), so that
        # state_dict has one layout from the first step on, as torch.distributed.checkpoint needs
        for p in self._params():
            self.state[p]["momentum"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            if adam_beta2 is not None:
                self.state[p]["q_second_moment"] = torch.zeros_like(p, memory_format=torch.preserve_format)

    def _params(self) -> list[Tensor]:
        return [p for group in self.param_groups for p in group["params"]]

    def _transform(self, p: Tensor) -> ChunkedDCT:
        key = (p.shape, p.dtype, p.device)
        if key not in self._dct:
            self._dct[key] = ChunkedDCT.of(p, self.chunk)
        return self._dct[key]

    # ------------------------------------------------------------------ the step
    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Extract this worker's components, all-gather everyone's, step every parameter on their mean."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        stepped = [(group, p) for group in self.param_groups for p in group["params"] if p.requires_grad]
        for i, (_, p) in enumerate(stepped):
            if p.grad is None or p.grad.is_sparse:
                raise ValueError(f"DeMo.step: parameter {i} (shape {tuple(p.shape)}) has"
                                 f" {'no' if p.grad is None else 'a sparse'} gradient; every worker must send"
                                 " components of every parameter each step (a dense zero gradient is valid)")
        transforms = [self._transform(p) for _, p in stepped]
        index_dtype = torch.int16 if max((t.components for t in transforms), default=1) <= 2**15 else torch.int32
        sent = [self._extract(group, p, t) for (group, p), t in zip(stepped, transforms)]
        payload = torch.cat([v.reshape(-1).view(torch.uint8) for _, v in sent]
                            + [i.to(index_dtype).reshape(-1).view(torch.uint8) for i, _ in sent])
        gathered = all_gather(payload, self.process_group, self.traffic) if self.world > 1 else [payload]
        workers = [self._unpack(buffer, sent, index_dtype) for buffer in gathered]
        for n, ((group, p), t) in enumerate(zip(stepped, transforms)):
            q = t.decode(_mean_of_sent([w[n] for w in workers], sent[n][1].shape[0], t.components, p.dtype))
            if group["weight_decay"]:
                p.mul_(1 - group["lr"] * group["weight_decay"])
            p.add_(self._final(p, q), alpha=-group["lr"])
        self.steps += 1
        return loss

    def _final(self, p: Tensor, q: Tensor) -> Tensor:
        """What the parameter steps along: ``sign(q)``, ``q``, or ``q`` over its second moment's root."""
        if self.adam_beta2 is None:
            return q.sign() if self.sign else q
        v = self.state[p]["q_second_moment"]
        v.mul_(self.adam_beta2).addcmul_(q, q, value=1 - self.adam_beta2)
        return q / (v / (1 - self.adam_beta2 ** (self.steps + 1))).sqrt_().add_(self.eps)

    def _extract(self, group: dict, p: Tensor, transform: ChunkedDCT) -> tuple[Tensor, Tensor]:
        """The momentum's top-k components per block (indices, values), removed from the momentum."""
        momentum = self.state[p]["momentum"]
        momentum.mul_(group["momentum"]).add_(p.grad)
        coefficients = transform.encode(momentum)
        k = min(self.topk, transform.components)
        indices = coefficients.abs().topk(k, dim=-1, sorted=False).indices
        values = coefficients.gather(-1, indices)
        momentum.sub_(transform.decode(torch.zeros_like(coefficients).scatter_(-1, indices, values)))
        return indices, values

    @staticmethod
    def _unpack(buffer: Tensor, sent: list[tuple[Tensor, Tensor]], index_dtype: torch.dtype) -> list:
        """One worker's (indices, values) per parameter from its byte buffer, laid out as this worker's."""
        sizes = [v.nbytes for _, v in sent] + [i.numel() * index_dtype.itemsize for i, _ in sent]
        pieces = buffer.split(sizes)
        values = [piece.clone().view(v.dtype).view(v.shape) for piece, (_, v) in zip(pieces, sent)]
        indices = [piece.clone().view(index_dtype).view(i.shape).long()
                   for piece, (i, _) in zip(pieces[len(sent):], sent)]
        return list(zip(indices, values))

    @property
    def comm_stats(self) -> dict[str, Any]:
        """``{"collectives", "bytes_sent", "all_gather_bytes", "steps", "bytes_sent_per_step"}``: what this
        worker sent since training began (resumes included), and per step."""
        out: dict[str, Any] = self.traffic.summary()
        out.update(steps=self.steps, bytes_sent_per_step=out["bytes_sent"] / max(self.steps, 1))
        return out

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        """torch's optimizer state (each parameter's momentum, there from the start), the step count, the
        settings and what was sent: one layout from the first step on, as ``torch.distributed.checkpoint``
        needs. Each worker's momentum is its own (key the state by rank under DCP)."""
        out = super().state_dict()
        out["demo"] = {"steps": self.steps, "chunk": self.chunk, "topk": self.topk, "sign": self.sign,
                       "adam_beta2": self.adam_beta2,
                       "traffic": self.traffic.state_dict(("all_gather",))}
        return out

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Resume from ``state_dict()``, bit-identically. Checked before anything is written."""
        if "demo" not in state_dict:
            raise ValueError("DeMo.load_state_dict: the state lacks 'demo' (not saved by DeMo.state_dict)")
        demo = state_dict["demo"]
        for key in ("chunk", "topk", "sign", "adam_beta2"):
            if demo.get(key) != getattr(self, key):  # a state saved before adam_beta2 existed has none
                raise ValueError(f"DeMo.load_state_dict: the state has {key}={demo.get(key)!r}, this DeMo"
                                 f" {key}={getattr(self, key)!r}; build it with the same {key}")
        params = self._params()
        for index, saved in state_dict["state"].items():
            shape = tuple(saved["momentum"].shape)
            if index >= len(params) or shape != tuple(params[index].shape):
                raise ValueError(f"DeMo.load_state_dict: the momentum of parameter {index} has shape {shape},"
                                 f" this model's {tuple(params[index].shape) if index < len(params) else 'none'}")
        super().load_state_dict({k: v for k, v in state_dict.items() if k != "demo"})
        self.steps = int(demo["steps"])
        self.traffic = Traffic.from_state_dict(demo["traffic"])

    def __deepcopy__(self, memo: dict) -> "DeMo":
        """A copy with its own tensors, on the same process group (a group is not copied)."""
        return deepcopy_on_group(self, memo, self.process_group)

    def __repr__(self) -> str:
        group = self.defaults
        return (f"DeMo(lr={group['lr']}, momentum={group['momentum']}, chunk={self.chunk}, topk={self.topk},"
                f" weight_decay={group['weight_decay']}, sign={self.sign}"
                + ("" if self.adam_beta2 is None else f", adam_beta2={self.adam_beta2}, eps={self.eps}")
                + f", workers={self.world})")


def _mean_of_sent(sent: list[tuple[Tensor, Tensor]], blocks: int, components: int, dtype) -> Tensor:
    """``(blocks, components)``: each component's mean over the workers that sent it, 0 where none did.
    One scatter per worker (a worker's indices are distinct within a block), so the sums run in worker
    order on every device, and every worker computes the same bits."""
    total = torch.zeros(blocks, components, dtype=dtype, device=sent[0][1].device)
    count = torch.zeros_like(total)
    for indices, values in sent:
        total.scatter_add_(-1, indices, values)
        count.scatter_add_(-1, indices, torch.ones_like(values))
    return total / count.clamp_min(1)
