"""PowerSGD in place of FSDP2's gradient reduce-scatter: ``register_powersgd_fsdp(model, rank=4)``.

Vogels, Karimireddy, Jaggi 2019, "PowerSGD: Practical Low-Rank Gradient Compression for Distributed
Optimization" (Algorithm 1: one power-iteration step, warm-started Q, error feedback), as torch's DDP hook
(``gradwise/distributed/powersgd.py``) runs it, here on FSDP2's buffers. torch 2.13's
``FSDPModule.set_custom_reduce_scatter(comm)`` hands ``comm`` the flat input of each module's reduce-scatter:
``world`` rows, row ``r`` the concatenation of every parameter's ``r``-th block of rows (its gradient padded
to ``world * ceil(n / world)`` rows), in the order FSDP2 manages the module's parameters; rank ``r`` receives
the reduction of every rank's row ``r``. Each parameter with a gradient of two dimensions or more seen as ``(n, m)``
(``n = shape[0]``), ``r = min(rank, n, m)`` and ``(n + m) r min_compression_rate < n m`` is compressed,
this worker's error of its last step added first::

    M = G + error          (G: this worker's whole gradient, its rows from every block of the input)
    P = M Q                all-reduced (summed), then orthonormalized (``torch.linalg.qr``)
    Q = M^T P              all-reduced, divided by the workers    (kept: the next step's warm start)
    mean ~ P Q^T;          error <- M - P Q^T;   this rank keeps its rows of the mean

and every other gradient is reduce-scattered exactly (one reduce-scatter of those blocks alone), FSDP2's
reduction op kept (``AVG``, or ``SUM`` of inputs FSDP2 divided beforehand, as for float64). Before
``start_powerSGD_iter`` reductions of a module, its whole buffer is reduce-scattered as FSDP2 would. ``Q``
starts as a Gaussian draw seeded by ``random_seed`` plus the parameter's index in ``model.parameters()``, the
same on every worker. At ``rank >= min(n, m)`` (with ``min_compression_rate=0``) ``P P^T`` keeps the whole
column space: FSDP2's reduction, to rounding.

Sent per worker, module and compressed step (counted in ``comm_stats`` as the collectives start): one
reduce-scatter of the other gradients' padded elements (counted as the ``(world - 1) / world`` of its input
this rank hands to the others: what a ring puts on each link), one all-reduce of ``sum n r`` (P) and one of
``sum m r`` (Q) elements (counted as their payload; a ring all-reduce puts ``2 (world - 1) / world`` of it on
each link, so on 2 workers the counts are the link's bytes). On a ring a compressed matrix thus puts
``2 (n + m) r`` elements on a link where FSDP2's reduce-scatter puts ``n m`` (times ``(world - 1) / world``
both): half of the element ratio, so torch's ``min_compression_rate=2`` only breaks even there. Memory:
each rank keeps every compressed matrix's error whole (its own, unsharded) and ``Q``, besides FSDP2's
sharded state; and computes ``M Q`` and ``M^T P`` on whole matrices, each rank all of them.

The state (``state_dict``) holds each module's reductions so far, the bytes, ``Q`` (the same on every rank)
and the errors as DTensors of ``(world, n, m)`` with one worker's error per rank (``Shard(0)``), so a
``torch.distributed.checkpoint`` save under one key keeps every worker's and a load into a fresh
registration's ``state_dict`` (same world size) resumes bit-identically. Needs: ``fully_shard`` on a 1-D
mesh with rows sharded (``Shard(0)``; not HSDP), float32 or float64 matrices reduced in their own dtype,
every parameter that requires a gradient getting one in each backward (the buffer's layout is read from the
parameters; a missing one is refused by name of the module).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor, Shard

from gradwise.core.collectives import Traffic, all_reduce, reduce_scatter

#: the kinds of collective sent, in the order of the state's ``traffic`` tensor (calls, then bytes)
KINDS = ("all_reduce", "reduce_scatter")


@dataclass
class _Slot:
    """One parameter in a module's reduce-scatter input: its name, rows per rank's block (padding included),
    row width, whether it is compressed, and where its block starts in each rank's row of the input."""

    name: str
    param: Tensor
    rows: int  # ceil(n / world)
    width: int  # m
    compressed: bool
    offset: int = 0

    @property
    def numel(self) -> int:
        return self.rows * self.width


def register_powersgd_fsdp(model: torch.nn.Module, rank: int = 1, start_powerSGD_iter: int = 1_000,
                           min_compression_rate: float = 2, random_seed: int = 0) -> "FSDPPowerSGD":
    """Replace the gradient reduce-scatter of every ``fully_shard``'ed module in ``model`` (``model`` itself an
    ``FSDPModule``) by rank-``rank`` PowerSGD; returns the state, with ``comm_stats`` and ``state_dict``."""
    check_powersgd_fsdp(rank, start_powerSGD_iter, min_compression_rate, random_seed)
    if not isinstance(model, FSDPModule):
        raise TypeError(f"invalid model, a {type(model).__name__}: expected a module fully_shard'ed by FSDP2"
                        " (an FSDPModule; PowerSGD replaces its gradient reduce-scatter)")
    return FSDPPowerSGD(model, rank, start_powerSGD_iter, min_compression_rate, random_seed)


def check_powersgd_fsdp(rank: int = 1, start_powerSGD_iter: int = 1_000, min_compression_rate: float = 2,
                        random_seed: int = 0) -> None:
    """``register_powersgd_fsdp``'s argument checks alone: a ``ValueError`` naming the argument."""
    for name, value, least in (("rank", rank, 1), ("start_powerSGD_iter", start_powerSGD_iter, 0),
                               ("random_seed", random_seed, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ValueError(f"invalid {name}={value!r}: expected an int >= {least}")
    if isinstance(min_compression_rate, bool) or not isinstance(min_compression_rate, (int, float)) \
            or not 0 <= min_compression_rate < math.inf:
        raise ValueError(f"invalid min_compression_rate={min_compression_rate!r}: expected a finite number >= 0")


def managed_parameters(module: FSDPModule) -> list[tuple[str, Tensor]]:
    """The parameters ``fully_shard(module)`` manages, in FSDP2's order: those of its submodules (post-order,
    not inside another ``fully_shard``'ed module), each once, sharded (ignored ones stay plain tensors)."""
    modules: list[tuple[str, torch.nn.Module]] = []
    seen: set[int] = set()

    def visit(prefix: str, m: torch.nn.Module) -> None:
        seen.add(id(m))
        for name, child in m.named_children():
            if id(child) not in seen and not isinstance(child, FSDPModule):
                visit(f"{prefix}{name}.", child)
        modules.append((prefix, m))

    visit("", module)
    params, ids = [], set()
    for prefix, m in modules:
        for name, p in m.named_parameters(recurse=False):
            if id(p) not in ids and isinstance(p, DTensor):
                ids.add(id(p))
                params.append((prefix + name, p))
    return params


class FSDPPowerSGD:
    """The registration's settings and state: per compressed matrix ``Q`` and this worker's error, per module
    its reductions so far, and what was sent (``traffic``)."""

    def __init__(self, model: FSDPModule, rank: int, start_powerSGD_iter: int, min_compression_rate: float,
                 random_seed: int) -> None:
        self.rank, self.start_powerSGD_iter, self.min_compression_rate = rank, start_powerSGD_iter, min_compression_rate
        self.traffic = Traffic()
        prefix = {id(m): (name + "." if name else "") for name, m in model.named_modules()}
        index = {id(p): i for i, p in enumerate(model.parameters())}
        self.comms: list[_PowerSGDReduceScatter] = []
        self.q: dict[str, Tensor] = {}
        self.error: dict[str, Tensor] = {}
        self.mesh = None
        for m in model.modules():
            if not isinstance(m, FSDPModule):
                continue
            params = [(prefix[id(m)] + name, p) for name, p in managed_parameters(m)]
            if not params:
                continue  # FSDP2 gives a module with no parameters of its own no reduce-scatter
            for name, p in params:
                self._check(name, p)
            self.comms.append(_PowerSGDReduceScatter(self, m, prefix[id(m)].rstrip(".") or "<root>", params))
            for name, p in params:
                if self.compressed(p):
                    n, width = p.shape[0], p.numel() // p.shape[0]
                    g = torch.Generator().manual_seed(random_seed + index[id(p)])
                    r = min(rank, n, width)
                    self.q[name] = torch.randn(width, r, generator=g, dtype=torch.float64).to(p.dtype)
                    self.error[name] = torch.zeros(n, width, dtype=p.dtype, device=p.device)
        if not self.comms:
            raise ValueError(f"invalid model, a {type(model).__name__} with no fully_shard'ed parameter: nothing to"
                             " reduce-scatter")
        for comm in self.comms:  # every check passed: nothing was replaced before
            comm.module.set_custom_reduce_scatter(comm)

    def _check(self, name: str, p: Tensor) -> None:
        mesh = p.device_mesh
        if mesh.ndim != 1 or len(p.placements) != 1 or not p.placements[0].is_shard(0):
            raise NotImplementedError(
                f"parameter {name!r} is a DTensor placed {p.placements} on a {mesh.ndim}-D mesh: PowerSGD for"
                " FSDP2 replaces the reduce-scatter of rows (Shard(0)) on one 1-D mesh; HSDP's all-reduce and"
                " other placements are not replaced")
        if self.mesh is not None and mesh != self.mesh:
            raise NotImplementedError(f"parameter {name!r} is on another mesh than the model's first parameter")
        self.mesh = mesh
        if self.compressed(p) and p.dtype not in (torch.float32, torch.float64):
            raise NotImplementedError(f"parameter {name!r} has dtype {p.dtype}: PowerSGD for FSDP2 compresses"
                                      " float32 and float64 matrices (their QR), reduced in their own dtype")

    def compressed(self, p: Tensor) -> bool:
        """Whether ``p``'s gradient is compressed: 2+ dims, rank-r factors ``min_compression_rate`` times smaller."""
        if p.dim() < 2 or not p.numel():
            return False
        n, m = p.shape[0], p.numel() // p.shape[0]
        return (n + m) * min(self.rank, n, m) * self.min_compression_rate < n * m

    @property
    def steps(self) -> int:
        """Backward passes so far: the reductions of the module reduced most often."""
        return max((c.calls for c in self.comms), default=0)

    @property
    def comm_stats(self) -> dict[str, Any]:
        """``{"collectives", "bytes_sent", "<kind>_bytes", "steps", "bytes_sent_per_step"}`` since registration."""
        out: dict[str, Any] = self.traffic.summary()
        out.update(steps=self.steps, bytes_sent_per_step=out["bytes_sent"] / max(self.steps, 1))
        return out

    def state_dict(self) -> dict[str, Any]:
        """``{"calls", "traffic", "q", "error"}`` as tensors (errors: DTensors of one worker's error per rank)."""
        world = self.mesh.size()
        calls = torch.tensor([c.calls for c in self.comms], dtype=torch.int64)
        state = self.traffic.state_dict(KINDS)
        traffic = torch.tensor([state["calls"][k] for k in KINDS] + [state["bytes_sent"][k] for k in KINDS])
        error = {name: DTensor.from_local(e.unsqueeze(0), self.mesh, [Shard(0)], run_check=False,
                                          shape=(world, *e.shape), stride=(e.numel(), *e.stride()))
                 for name, e in self.error.items()}
        return {"calls": calls, "traffic": traffic, "q": {k: v.clone() for k, v in self.q.items()}, "error": error}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from ``state_dict()``'s (this model and rank, the same world size): checked before any write."""
        ok = set(state.get("q", {})) == set(self.q) and set(state.get("error", {})) == set(self.error) \
            and tuple(state["calls"].shape) == (len(self.comms),) \
            and all(state["q"][k].shape == q.shape for k, q in self.q.items()) \
            and all(tuple(state["error"][k].shape) == (self.mesh.size(), *e.shape) for k, e in self.error.items())
        if not ok:
            raise ValueError(f"FSDPPowerSGD.load_state_dict: the state is not one of this model's at rank {self.rank}"
                             f" on {self.mesh.size()} workers (its matrices {sorted(state.get('q', {}))}, this"
                             f" registration's {sorted(self.q)})")
        for comm, calls in zip(self.comms, state["calls"].tolist()):
            comm.calls = calls
        row = state["traffic"].tolist()
        self.traffic = Traffic.from_state_dict({"calls": dict(zip(KINDS, row[:len(KINDS)])),
                                                "bytes_sent": dict(zip(KINDS, row[len(KINDS):]))})
        for name in self.q:
            self.q[name] = state["q"][name].clone()
            local = state["error"][name]
            self.error[name] = (local.to_local() if isinstance(local, DTensor) else local)[0].clone()


class _PowerSGDReduceScatter:
    """One module's reduce-scatter (torch's ``ReduceScatter`` protocol: ``allocate`` and ``__call__``)."""

    def __init__(self, owner: FSDPPowerSGD, module: FSDPModule, module_name: str,
                 params: list[tuple[str, Tensor]]) -> None:
        self.owner, self.module, self.module_name, self.params, self.calls = owner, module, module_name, params, 0

    def allocate(self, size, *, dtype: torch.dtype, device: torch.device) -> Tensor:
        return torch.empty(*size, dtype=dtype, device=device)

    def _slots(self, numel: int, world: int, dtype: torch.dtype) -> list[_Slot]:
        """This reduction's parameters and their blocks, checked against the buffer's size and dtype."""
        slots = []
        for name, p in self.params:
            if p.requires_grad:
                n = p.shape[0] if p.dim() else 1
                slots.append(_Slot(name, p, -(-n // world), p.numel() // n if n else 0, name in self.owner.q))
        offset = 0
        for s in slots:
            s.offset, offset = offset, offset + s.numel
        expected = world * offset
        if numel != expected:
            raise RuntimeError(f"PowerSGD for FSDP2: the reduce-scatter of module {self.module_name!r} holds {numel}"
                               f" elements, its parameters that require a gradient {expected} padded: a parameter"
                               " got no gradient in this backward (unused); every one must get one")
        matrices = {s.param.dtype for s in slots if s.compressed}
        if matrices and matrices != {dtype}:
            raise NotImplementedError(f"PowerSGD for FSDP2: module {self.module_name!r} reduces in {dtype}, its"
                                      f" matrices are {sorted(map(str, matrices))}: a MixedPrecisionPolicy's"
                                      " reduce_dtype is not supported; reduce in the parameters' dtype")
        return slots

    @torch.no_grad()
    def __call__(self, output_tensor: Tensor, input_tensor: Tensor, group, op, async_op: bool = False):
        if async_op:
            raise NotImplementedError("PowerSGD for FSDP2 reduces synchronously (async_op=True asked)")
        world = group.size()
        if op == dist.ReduceOp.AVG:
            unscale = 1  # FSDP2's result is the mean itself
        elif op == dist.ReduceOp.SUM:
            unscale = world  # FSDP2 divided each input beforehand: the sum of the inputs
        else:
            raise NotImplementedError(f"PowerSGD for FSDP2 takes FSDP2's AVG or SUM reduction, not {op!r}"
                                      " (set_gradient_divide_factor changes it)")
        slots = self._slots(input_tensor.numel(), world, input_tensor.dtype)
        self.calls += 1
        if self.calls <= self.owner.start_powerSGD_iter or not any(s.compressed for s in slots):
            reduce_scatter(output_tensor, input_tensor, op, group, self.owner.traffic)
            return None
        blocks = input_tensor.view(world, -1)  # row r: every parameter's r-th block of rows
        whole = [s for s in slots if not s.compressed]
        if whole:
            sent = torch.cat([blocks[:, s.offset:s.offset + s.numel] for s in whole], dim=1)
            received = reduce_scatter(sent.new_empty(sent.shape[1]), sent.reshape(-1), op, group, self.owner.traffic)
            for s, piece in zip(whole, received.split([s.numel for s in whole])):
                output_tensor[s.offset:s.offset + s.numel].copy_(piece)
        matrices = [s for s in slots if s.compressed]
        means = self._compressed_means(
            [blocks[:, s.offset:s.offset + s.numel].reshape(world * s.rows, s.width)[:s.param.shape[0]]
             for s in matrices], [s.name for s in matrices], group, world)
        for s, mean in zip(matrices, means):
            block = output_tensor[s.offset:s.offset + s.numel].view(s.rows, s.width)
            block.zero_()  # the padding rows
            mine = mean[group.rank() * s.rows:(group.rank() + 1) * s.rows]
            block[:mine.shape[0]].copy_(mine * unscale)
        return None

    def _compressed_means(self, gradients: list[Tensor], names: list[str], group, world: int) -> list[Tensor]:
        """The workers' mean of each ``(n, m)`` gradient, rank-r: two all-reduces (P, then Q) for them all."""
        owner = self.owner
        ms = [g + owner.error[name] for g, name in zip(gradients, names)]
        qs = [owner.q[name] for name in names]
        flat = all_reduce(torch.cat([(m @ q).reshape(-1) for m, q in zip(ms, qs)]), "sum", group, owner.traffic)
        ps = [torch.linalg.qr(p.view(m.shape[0], -1)).Q for m, p in zip(ms, flat.split([m.shape[0] * q.shape[1]
                                                                                      for m, q in zip(ms, qs)]))]
        flat = all_reduce(torch.cat([(m.T @ p).reshape(-1) for m, p in zip(ms, ps)]), "sum", group, owner.traffic)
        means = []
        for name, m, p, q in zip(names, ms, ps, flat.div_(world).split([q.numel() for q in qs])):
            owner.q[name] = q.view_as(owner.q[name]).clone()
            means.append(p @ owner.q[name].T)
            owner.error[name] = m - means[-1]
        return means
