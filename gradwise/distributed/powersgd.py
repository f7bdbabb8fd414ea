"""PowerSGD for DDP: torch's communication hook, with the bytes it sends counted.

Vogels, Karimireddy, Jaggi 2019, "PowerSGD: Practical Low-Rank Gradient Compression for Distributed
Optimization". torch ships the algorithm as ``torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook``;
``register_powersgd(ddp_model, ...)`` registers it and counts what it all-reduces. Per DDP bucket and
step, after ``start_powerSGD_iter`` plain all-reduced steps, each gradient matrix ``M`` (a tensor seen as
``(shape[0], rest)``, plus this worker's error of the last step: error feedback) with
``(n + m) r min_compression_rate < n m`` (``r = min(n, m, rank)``) is compressed::

    P = M Q             all-reduced (summed), then orthonormalized
    Q = M^T P           all-reduced, divided by the workers     (kept: the next step's warm start)
    M ~ P Q^T;          error <- M - P Q^T                       (this worker's, added next step)

and every other gradient of the bucket (vectors, and matrices not worth it) is all-reduced whole. So
three all-reduces per bucket and step, of ``sum (n m)`` uncompressed, ``sum n r`` (P) and ``sum m r`` (Q)
elements, counted in ``traffic`` as they start (one of the bucket's elements each during the plain steps).
"""

from dataclasses import dataclass, field
from typing import Any

import torch
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as torch_powersgd

from gradwise.core.collectives import Traffic


@dataclass
class CountedPowerSGD:
    """torch's ``PowerSGDState`` and what the hook sent from this worker."""

    state: torch_powersgd.PowerSGDState
    traffic: Traffic = field(default_factory=Traffic)

    @property
    def comm_stats(self) -> dict[str, Any]:
        """``{"collectives", "bytes_sent", "all_reduce_bytes", "steps", "bytes_sent_per_step"}`` since the
        hook was registered; steps are DDP's backward passes (torch's ``state.iter``)."""
        out: dict[str, Any] = self.traffic.summary()
        out.update(steps=self.state.iter, bytes_sent_per_step=out["bytes_sent"] / max(self.state.iter, 1))
        return out


def register_powersgd(model: torch.nn.parallel.DistributedDataParallel, rank: int = 1,
                      start_powerSGD_iter: int = 1_000, min_compression_rate: float = 2,
                      use_error_feedback: bool = True, warm_start: bool = True, random_seed: int = 0,
                      process_group: Any = None) -> CountedPowerSGD:
    """Register torch's PowerSGD hook (rank-``rank`` compression) on ``model``; returns its counted state.

    The arguments are ``PowerSGDState``'s (``rank`` is its ``matrix_approximation_rank``); with error
    feedback or warm start, torch needs ``start_powerSGD_iter >= 2``."""
    if not isinstance(model, torch.nn.parallel.DistributedDataParallel):
        raise TypeError(f"invalid model, a {type(model).__name__}: expected a DistributedDataParallel module"
                        " (PowerSGD replaces its gradient all-reduce)")
    check_powersgd(rank, start_powerSGD_iter, min_compression_rate, use_error_feedback, warm_start)
    state = torch_powersgd.PowerSGDState(
        process_group=process_group, matrix_approximation_rank=rank, start_powerSGD_iter=start_powerSGD_iter,
        min_compression_rate=min_compression_rate, use_error_feedback=use_error_feedback, warm_start=warm_start,
        random_seed=random_seed)
    counted = CountedPowerSGD(state)
    model.register_comm_hook(counted, counted_powersgd_hook)
    return counted


def check_powersgd(rank: int = 1, start_powerSGD_iter: int = 1_000, min_compression_rate: float = 2,
                   use_error_feedback: bool = True, warm_start: bool = True) -> None:
    """``register_powersgd``'s argument checks alone (no model needed): a ``ValueError`` naming the argument."""
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise ValueError(f"invalid rank={rank!r}: expected an int >= 1 (the approximation's rank)")
    least = 2 if use_error_feedback or warm_start else 1
    if isinstance(start_powerSGD_iter, bool) or not isinstance(start_powerSGD_iter, int) \
            or start_powerSGD_iter < least:
        raise ValueError(f"invalid start_powerSGD_iter={start_powerSGD_iter!r}: expected an int >= {least}"
                         " (torch's hook needs 2 with error feedback or warm start)")
    if isinstance(min_compression_rate, bool) or not isinstance(min_compression_rate, (int, float)) \
            or not min_compression_rate >= 0:
        raise ValueError(f"invalid min_compression_rate={min_compression_rate!r}: expected a number >= 0")


def sent_elements(gradients: list[torch.Tensor], state: torch_powersgd.PowerSGDState) -> tuple[int, int, int]:
    """(uncompressed, P, Q): the elements the hook all-reduces for a bucket of ``gradients``."""
    uncompressed = ps = qs = 0
    for gradient in gradients:
        n = gradient.shape[0] if gradient.dim() else 1
        m = gradient.numel() // n
        r = min(n, m, state.matrix_approximation_rank)
        if gradient.dim() > 0 and (n + m) * r * state.min_compression_rate < n * m:
            ps, qs = ps + n * r, qs + m * r
        else:
            uncompressed += gradient.numel()
    return uncompressed, ps, qs


def counted_powersgd_hook(counted: CountedPowerSGD, bucket) -> torch.futures.Future[torch.Tensor]:
    """torch's ``powerSGD_hook`` on ``counted.state``, its all-reduces counted in ``counted.traffic``."""
    state, buffer = counted.state, bucket.buffer()
    if state.iter < state.start_powerSGD_iter:
        counted.traffic.record("all_reduce", buffer.nbytes)
        return torch_powersgd.powerSGD_hook(state, bucket)
    sizes = sent_elements(bucket.gradients(), state)
    before = state.total_numel_after_compression
    future = torch_powersgd.powerSGD_hook(state, bucket)
    if state.total_numel_after_compression - before != sum(sizes):
        raise RuntimeError(f"torch's PowerSGD hook sent {state.total_numel_after_compression - before} elements"
                           f" for a bucket, gradwise counted {sum(sizes)} {sizes}: the hook's rule changed")
    for numel in sizes:
        counted.traffic.record("all_reduce", numel * buffer.element_size())
    return future
