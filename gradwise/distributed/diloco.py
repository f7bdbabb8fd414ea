"""DiLoCo: many local inner steps per worker, then one outer step on the averaged pseudo-gradient.

Douillard et al. 2023, "DiLoCo: Distributed Low-Communication Training of Language Models". Each of the
``M`` workers (the ranks of ``process_group``) runs its own inner optimizer on its own data; every ``H``
inner steps the workers average their pseudo-gradients and an outer optimizer steps the synced copy::

    delta = theta_sync - theta_local          (on each worker: what its H inner steps moved)
    delta_bar = (sum over workers of delta) / M      (one all-reduce)
    theta_sync <- outer.step(theta_sync, grad=delta_bar);   theta_local <- theta_sync

The outer optimizer defaults to the paper's Nesterov SGD (momentum 0.9, ``outer_lr`` 0.7).
``pseudo_gradient_dtype=torch.bfloat16`` casts each worker's delta to bfloat16 before the all-reduce
(a plain cast, round to nearest even; the sum runs in bfloat16) and back after: half the bytes.
``pseudo_gradient_codec="int8"`` (or any gradwise state codec) sends them encoded and all-gathered, each
worker summing everyone's decoded values (``gradwise.distributed.encoded``): about a quarter of the bytes.
``fragments=P`` is Streaming DiLoCo's staggering (Douillard et al. 2025, "Streaming DiLoCo with overlapping
communication"): the parameters, in order, are cut into ``P`` runs of about equal count, each with its own
synced copy and outer optimizer, and fragment ``p`` syncs after the inner steps ``s`` with
``(s + p * H // P) % H == 0``, so the bytes of one sync are spread over the phase. ``overlap=tau``
(Streaming DiLoCo's overlapping communication) starts the all-reduce in the background and applies the
outer step ``tau`` inner steps later, the worker's parameters then merged as
``theta_local <- alpha theta_local + (1 - alpha) theta_sync`` (``merge_alpha``; 0 replaces them), so
that the all-reduce runs behind ``tau`` inner steps instead of blocking. ``overlap=H`` hides the
all-reduce behind a whole phase: each phase's average is applied one phase late, at the next sync (the
one-step-stale outer update of Kale et al. 2025's "delayed outer gradients", and CO2's, Sun et al. 2024),
and every phase restarts from the outer copy.
``eager=True`` (with ``overlap=H``) is Kale et al.'s *eager updates* ("Eager Updates For Overlapped Communication
and Computation in DiLoCo"): at each sync the worker does not wait; it steps its outer copy at once with its own
fresh pseudo-gradient in place of its stale one in the last average::

    delta_tilde = delta_bar_prev + (delta_mine - delta_mine_prev) / M    (delta_bar_prev: last phase's average)

so each worker's outer copy follows its own estimate (they differ by ``1/M`` of a phase's local progress).
``staleness_penalty=lambda`` (with ``overlap=H``, not eager) and ``outer_clip=c`` are CO2's corrections
(Sun et al. 2024, ``gradwise.distributed.co2``): the stale average divided element-wise by
``1 + lambda |gap| / mean |gap|``, ``gap`` the last outer step, and clipped to norm ``c`` per fragment
before the outer step.

Every byte this worker sends goes through ``gradwise.core.collectives`` and is counted in ``traffic``
(``comm_stats``): one all-reduce per fragment, device and dtype at each of its syncs, of
``numel x element size`` bytes (the communication dtype's); with a codec, one all-gather of its encoded bytes.
"""
from __future__ import annotations

import math
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import Tensor

from gradwise.core.collectives import Traffic, all_gather_started, all_reduce_started, deepcopy_on_group
from gradwise.distributed.co2 import clip_, penalize_
from gradwise.distributed.diloco_state import DiLoCoState, Pending
from gradwise.distributed.encoded import EncodedBucket
from gradwise.distributed.low_rank import PowerSGDPseudoGradients, powersgd_rank
from gradwise.distributed.sharded import check_sharded, like, shard
from gradwise.state.codec import codec_from


def outer_nesterov(params, lr: float) -> torch.optim.Optimizer:
    """The paper's outer optimizer: ``torch.optim.SGD(params, lr, momentum=0.9, nesterov=True)``."""
    return torch.optim.SGD(params, lr=lr, momentum=0.9, nesterov=True)


class DiLoCo(DiLoCoState):
    """``step()`` where ``inner.step()`` was; every ``sync_every`` steps the workers average what they moved.

    Args:
        inner: the worker's optimizer (any ``torch.optim.Optimizer``, gradwise's included); its state is
            kept across syncs. Schedule its learning rate on it (``LambdaLR(diloco.inner, ...)``).
        outer: a class or factory called as ``outer(param_groups, lr=outer_lr)`` over the synced copy
            (default: ``outer_nesterov``); any torch.optim class or gradwise recipe.
        outer_lr: the outer learning rate (> 0).
        sync_every: H, inner steps per phase (an int >= 1).
        process_group: the workers (default: the default group; one worker when torch.distributed is not
            initialized). Every worker must start from the same parameters, as DDP's replicas do.
        pseudo_gradient_dtype: the dtype the pseudo-gradients travel in (None: the parameters' own).
        pseudo_gradient_codec: None, or a codec they travel encoded by (``"int8"``, ``"int8-b256"``, ``"int4"``,
            ``"fp8"``, ``"bf16"`` or a ``gradwise.state`` codec); all-gathered, not all-reduced.
        fragments: Streaming DiLoCo's fragments, synced at staggered steps (1: plain DiLoCo).
        overlap: inner steps the all-reduce runs behind before its outer step applies (0: it blocks;
            ``sync_every``: a whole phase, the average applied at the next sync).
        merge_alpha: how much of its own parameters a worker keeps when an overlapped outer step applies.
        eager: Kale et al.'s eager updates (needs ``overlap=sync_every``): the outer step at each sync on the
            last average with this worker's fresh pseudo-gradient in place of its stale one.
        staleness_penalty: CO2's staleness-gap penalty lambda (>= 0; > 0 needs ``overlap=sync_every`` and
            ``eager=False``): the stale average divided by ``1 + lambda |gap| / mean |gap|``.
        outer_clip: CO2's clipping (None, or a norm > 0): each fragment's averaged pseudo-gradient scaled
            to at most this L2 norm before the outer step.
    """

    def __init__(self, inner: torch.optim.Optimizer, outer: Callable[..., torch.optim.Optimizer] = outer_nesterov,
                 outer_lr: float = 0.7, sync_every: int = 500, process_group: Any = None, *,
                 pseudo_gradient_dtype: torch.dtype | None = None, fragments: int = 1, overlap: int = 0,
                 merge_alpha: float = 0.0, eager: bool = False, staleness_penalty: float = 0.0,
                 outer_clip: float | None = None, pseudo_gradient_codec: Any = None) -> None:
        if not isinstance(inner, torch.optim.Optimizer):
            raise TypeError(f"invalid inner, a {type(inner).__name__}: expected a torch.optim.Optimizer"
                            " (e.g. gradwise.AdamW(model.parameters()))")
        if isinstance(sync_every, bool) or not isinstance(sync_every, int) or sync_every < 1:
            raise ValueError(f"invalid sync_every={sync_every!r}: expected an int >= 1 (inner steps per sync)")
        if isinstance(outer_lr, bool) or not isinstance(outer_lr, (int, float)) or not 0 < outer_lr < math.inf:
            raise ValueError(f"invalid outer_lr={outer_lr!r}: expected a finite number > 0")
        if not callable(outer):
            raise TypeError(f"invalid outer={outer!r}: expected an optimizer class or a factory"
                            " outer(param_groups, lr=...) returning a torch.optim.Optimizer")
        if pseudo_gradient_dtype is not None and not (isinstance(pseudo_gradient_dtype, torch.dtype)
                                                      and pseudo_gradient_dtype.is_floating_point):
            raise ValueError(f"invalid pseudo_gradient_dtype={pseudo_gradient_dtype!r}: expected None or a"
                             " floating-point torch.dtype (e.g. torch.bfloat16)")
        low_rank = powersgd_rank(pseudo_gradient_codec)
        codec = codec_from(pseudo_gradient_codec, "pseudo_gradient_codec") \
            if pseudo_gradient_codec is not None and low_rank is None else None
        if low_rank is not None and (overlap or eager or pseudo_gradient_dtype is not None):
            raise ValueError(f"invalid pseudo_gradient_codec={pseudo_gradient_codec!r} with overlap={overlap!r},"
                             f" eager={eager!r}, pseudo_gradient_dtype={pseudo_gradient_dtype!r}: PowerSGD's two"
                             " all-reduces depend on each other and block; expected overlap=0, eager=False and"
                             " no pseudo_gradient_dtype")
        if codec is not None and pseudo_gradient_dtype is not None:
            raise ValueError(f"invalid pseudo_gradient_codec={pseudo_gradient_codec!r} with pseudo_gradient_dtype="
                             f"{pseudo_gradient_dtype!r}: expected one of them, not both")
        if isinstance(overlap, bool) or not isinstance(overlap, int) or not 0 <= overlap <= sync_every:
            raise ValueError(f"invalid overlap={overlap!r}: expected an int from 0 to sync_every"
                             f" ({sync_every}), the inner steps an all-reduce may run behind")
        if not isinstance(eager, bool) or (eager and overlap != sync_every):
            raise ValueError(f"invalid eager={eager!r} with overlap={overlap!r}: eager updates hide the all-reduce"
                             f" behind a whole phase; expected eager=False, or eager=True with overlap=sync_every"
                             f" ({sync_every})")
        if isinstance(merge_alpha, bool) or not isinstance(merge_alpha, (int, float)) or not 0 <= merge_alpha <= 1:
            raise ValueError(f"invalid merge_alpha={merge_alpha!r}: expected a number from 0 to 1")
        if isinstance(staleness_penalty, bool) or not isinstance(staleness_penalty, (int, float)) \
                or not 0 <= staleness_penalty < math.inf:
            raise ValueError(f"invalid staleness_penalty={staleness_penalty!r}: expected a finite number >= 0")
        if staleness_penalty and (overlap != sync_every or eager):
            raise ValueError(f"invalid staleness_penalty={staleness_penalty!r} with overlap={overlap!r},"
                             f" eager={eager!r}: CO2's penalty is for the one-step-stale outer update; expected"
                             f" overlap=sync_every ({sync_every}) and eager=False")
        if outer_clip is not None and (isinstance(outer_clip, bool) or not isinstance(outer_clip, (int, float))
                                       or not 0 < outer_clip < math.inf):
            raise ValueError(f"invalid outer_clip={outer_clip!r}: expected None or a finite norm > 0")
        if process_group is not None and not dist.is_initialized():
            raise ValueError(f"invalid process_group={process_group!r}: torch.distributed is not initialized")
        params = [p for g in inner.param_groups for p in g["params"]]
        #: FSDP2 inside each worker: the parameters are DTensors, each rank's rows averaged across the groups
        self.sharded = check_sharded(params, process_group, staleness_penalty, outer_clip)
        if self.sharded and low_rank is not None:
            raise NotImplementedError(f"pseudo_gradient_codec={pseudo_gradient_codec!r} with FSDP2 shards: PowerSGD"
                                      " compresses whole matrices (Q = M^T P sums over every row), not a rank's rows")
        if isinstance(fragments, bool) or not isinstance(fragments, int) or not 1 <= fragments <= len(params):
            raise ValueError(f"invalid fragments={fragments!r}: expected an int from 1 to the number of"
                             f" parameters ({len(params)})")
        self.inner = inner
        self.outer_lr = float(outer_lr)
        self.sync_every = sync_every
        self.process_group = process_group
        self.pseudo_gradient_dtype = pseudo_gradient_dtype
        self.codec = codec
        #: PowerSGD's warm-start Q and error feedback, with ``pseudo_gradient_codec="powersgd"``
        self.powersgd = PowerSGDPseudoGradients(low_rank, params) if low_rank is not None else None
        #: each (fragment, bucket)'s encoded layout, with a codec
        self.encoded: dict[tuple[int, int], EncodedBucket] = {}
        self.overlap = overlap
        self.merge_alpha = float(merge_alpha)
        self.eager = eager
        self.staleness_penalty = float(staleness_penalty)
        self.outer_clip = None if outer_clip is None else float(outer_clip)
        #: the syncs started and not applied yet, oldest first
        self.pending: list[Pending] = []
        self.world = dist.get_world_size(process_group) if dist.is_initialized() else 1
        self.traffic = Traffic()
        #: inner steps taken since the start of training (kept in ``state_dict``)
        self.local_step = 0
        self.params = params
        self.synced = [p.detach().clone() for p in params]
        #: CO2's staleness gap: each parameter's last outer step (kept only with a staleness penalty)
        self.gaps = [torch.zeros_like(s) for s in self.synced] if staleness_penalty else []
        #: the parameter indices of each fragment, a contiguous run
        self.fragments = [range(f * len(params) // fragments, (f + 1) * len(params) // fragments)
                          for f in range(fragments)]
        self.outer = [self._outer(outer, indices) for indices in self.fragments]

    def _outer(self, outer: Callable, indices: range) -> torch.optim.Optimizer:
        built = outer([{"params": [self.synced[i] for i in indices]}], lr=self.outer_lr)
        if not isinstance(built, torch.optim.Optimizer):
            raise TypeError(f"invalid outer={outer!r}: outer(param_groups, lr=...) returned a"
                            f" {type(built).__name__}, not a torch.optim.Optimizer")
        return built

    # ------------------------------------------------------------------ the step
    @property
    def param_groups(self) -> list[dict[str, Any]]:
        """The inner optimizer's groups (their ``lr`` is the inner learning rate)."""
        return self.inner.param_groups

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.inner.zero_grad(set_to_none=set_to_none)

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """One inner step; then each fragment whose phase ends here starts its sync, and each sync due
        (``overlap`` steps after it started) applies its outer step."""
        loss = self.inner.step() if closure is None else self.inner.step(closure)
        self.local_step += 1
        for f in range(len(self.fragments)):
            if self.due(f, self.local_step):
                started = self._start(f)
                if self.overlap == self.sync_every:
                    self._apply_stale(started, self._take_due(f))
                self.pending.append(started)
        while self.pending and self.pending[0].apply_at == self.local_step:
            self._apply(self.pending.pop(0))
        return loss

    def _take_due(self, fragment: int) -> Pending | None:
        """The sync of ``fragment`` due after this step, taken off the queue (None in the first phase)."""
        for k, pending in enumerate(self.pending):
            if pending.fragment == fragment and pending.apply_at == self.local_step:
                return self.pending.pop(k)
        return None

    def due(self, fragment: int, step: int) -> bool:
        """Whether ``fragment`` syncs after inner step ``step`` (counted from 1)."""
        return (step + fragment * self.sync_every // len(self.fragments)) % self.sync_every == 0

    def _buckets(self, fragment: int) -> list[list[int]]:
        """``fragment``'s parameter indices by device and dtype: one buffer, one all-reduce, each."""
        buckets: dict[tuple, list[int]] = {}
        for i in self.fragments[fragment]:
            buckets.setdefault((self.params[i].device, self.params[i].dtype), []).append(i)
        return list(buckets.values())

    @torch.no_grad()
    def _start(self, fragment: int) -> Pending:
        """Each worker's pseudo-gradient of ``fragment``, in one buffer per device and dtype, all-reducing."""
        buffers, works, own = [], [], []
        for b, members in enumerate(self._buckets(fragment)):
            flat = torch.cat([(shard(self.synced[i]) - shard(self.params[i])).reshape(-1) for i in members])
            if self.powersgd is not None:  # compressed and averaged now (blocking); kept as a sum, as the others
                means = self.powersgd.mean(dict(zip(members, flat.split([self.params[i].numel() for i in members]))),
                                           self.process_group, self.world, self.traffic)
                sent, work = torch.cat([means[i].reshape(-1) for i in members]).mul_(self.world), None
            elif self.codec is not None:  # the encoded bytes, all-gathered: a list of every worker's
                encoded = self.encoded.setdefault((fragment, b), EncodedBucket(self.codec, flat.numel(), flat.dtype))
                payload = encoded.payload(flat, self.local_step)
                if self.eager:
                    own.append(encoded.decode(payload))
                sent, work = all_gather_started(payload, self.process_group, self.traffic) if self.world > 1 \
                    else ([payload], None)
            else:
                sent = flat if self.pseudo_gradient_dtype is None else flat.to(self.pseudo_gradient_dtype)
                if self.eager:
                    own.append(sent.clone())
                work = all_reduce_started(sent, self.process_group, self.traffic) if self.world > 1 else None
            works.append(work)
            buffers.append((members, sent))
        return Pending(fragment, self.local_step + self.overlap, buffers, works, own if self.eager else None)

    @torch.no_grad()
    def _apply(self, pending: Pending) -> None:
        """The outer step on the averaged pseudo-gradient; the worker restarts from (or merges with) it."""
        pending.wait()
        self._outer_step(pending.fragment, [(members, self._summed(pending, b).div_(self.world))
                                            for b, (members, _) in enumerate(pending.buffers)])

    def _summed(self, pending: Pending, b: int) -> Tensor:
        """Bucket ``b``'s sum over the workers, in the parameters' dtype (a codec's: decoded, summed here)."""
        members, summed = pending.buffers[b]
        if isinstance(summed, list):
            return self.encoded[pending.fragment, b].summed(summed)
        return summed.to(self.params[members[0]].dtype)

    @torch.no_grad()
    def _apply_stale(self, started: Pending, previous: Pending | None) -> None:
        """``overlap=H``, at a sync: the outer step on the last phase's average (eager: with this worker's
        fresh pseudo-gradient in place of its stale one); in the first phase, without eager, the worker
        only restarts from the outer copy."""
        if not self.eager:
            if previous is not None:
                self._apply(previous)
            else:
                for i in self.fragments[started.fragment]:
                    shard(self.params[i]).copy_(shard(self.synced[i]))
            return
        if previous is not None:
            previous.wait()
        means = []
        for b, (members, _) in enumerate(started.buffers):
            dtype = self.params[members[0]].dtype
            mean = started.own[b].to(dtype, copy=True)
            if previous is not None:
                mean.sub_(previous.own[b].to(dtype))
            mean.div_(self.world)
            if previous is not None:
                mean.add_(self._summed(previous, b) / self.world)
            means.append((members, mean))
        self._outer_step(started.fragment, means)

    def _outer_step(self, fragment: int, means: list[tuple[list[int], Tensor]]) -> None:
        """``fragment``'s outer step on the given mean pseudo-gradients (flat, one per bucket); the worker
        restarts from (or merges with) the outer copy."""
        deltas = [(i, delta.view_as(shard(self.synced[i]))) for members, mean in means
                  for i, delta in zip(members, mean.split([shard(self.params[i]).numel() for i in members]))]
        for i, delta in deltas:
            if self.gaps:
                penalize_(delta, self.gaps[i], self.staleness_penalty)
                self.gaps[i].copy_(self.synced[i])
            self.synced[i].grad = like(delta, self.synced[i])
        if self.outer_clip is not None:
            clip_([delta for _, delta in deltas], self.outer_clip)
        self.outer[fragment].step()
        for i in self.fragments[fragment]:
            self.synced[i].grad = None
            if self.gaps:  # the step just taken: theta_new - theta_old
                self.gaps[i].sub_(self.synced[i]).neg_()
            if self.merge_alpha:
                shard(self.params[i]).lerp_(shard(self.synced[i]), 1 - self.merge_alpha)
            else:
                shard(self.params[i]).copy_(shard(self.synced[i]))

    @property
    def comm_stats(self) -> dict[str, Any]:
        """``{"collectives", "bytes_sent", "all_reduce_bytes", "steps", "bytes_sent_per_step"}``: what this
        worker sent since training began (resumes included), and per inner step."""
        out: dict[str, Any] = self.traffic.summary()
        out.update(steps=self.local_step, bytes_sent_per_step=out["bytes_sent"] / max(self.local_step, 1))
        return out

    def __deepcopy__(self, memo: dict) -> "DiLoCo":
        """A copy with its own tensors and optimizers, on the same process group (a group is not copied);
        a sync under way is waited for first."""
        for pending in self.pending:
            pending.wait()
        return deepcopy_on_group(self, memo, self.process_group)

    def __repr__(self) -> str:
        dtype = "" if self.pseudo_gradient_dtype is None else f", pseudo_gradient_dtype={self.pseudo_gradient_dtype}"
        dtype += "" if self.codec is None else f", pseudo_gradient_codec={self.codec.tag!r}"
        dtype += "" if self.powersgd is None else f", pseudo_gradient_codec='powersgd-r{self.powersgd.rank}'"
        fragments = "" if len(self.fragments) == 1 else f", fragments={len(self.fragments)}"
        overlap = f", overlap={self.overlap}, merge_alpha={self.merge_alpha}" if self.overlap else ""
        overlap += ", eager=True" if self.eager else ""
        overlap += f", staleness_penalty={self.staleness_penalty}" if self.staleness_penalty else ""
        overlap += f", outer_clip={self.outer_clip}" if self.outer_clip is not None else ""
        return (f"DiLoCo(inner={type(self.inner).__name__}, outer={type(self.outer[0]).__name__},"
                f" outer_lr={self.outer_lr}, sync_every={self.sync_every}, workers={self.world}{dtype}{fragments}"
                f"{overlap})")
