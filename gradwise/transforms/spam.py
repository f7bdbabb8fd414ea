"""SPAM (Huang, Zhu, Jin, Liu, Wang & Liu, 2025, "SPAM: Spike-Aware Adam with Momentum Reset for Stable LLM
Training", arXiv:2501.06842): periodic momentum resets with a warmup after each, and spike-aware clipping."""
from __future__ import annotations

import math

import torch
from torch import Tensor

from gradwise.core.hashing import hash32, unsigned
from gradwise.core.hyper import Hyper, non_negative, non_negative_int, number_in, positive_int, unit_interval
from gradwise.core.transform import Context, Transform, state_dtype
from gradwise.transforms.around import around

#: the hyperparameters, with pytorch-optimizer 4.1.0's names and defaults
SPAM_HYPER = {"update_proj_gap": Hyper(500, positive_int), "warmup_epoch": Hyper(50, non_negative_int),
              "threshold": Hyper(5000, non_negative, zero_is_identity=True),
              "grad_accu_steps": Hyper(20, non_negative_int)}
#: the second moment ``spam`` keeps itself around an ``inner`` that keeps none (Lion's, Muon's)
OWN_SECOND_MOMENT = "spike_exp_avg_sq"


def warmup_scale(step: int, gap: int, warmup: int) -> float:
    """The step's factor: 1 until the first reset (and at step 1), then at j = t mod gap steps after a reset
    1 - 0.99 (1 + cos(pi (j + 1) / (warmup + 1))) / 2 while j < warmup, then 1 (pytorch-optimizer's cosine)."""
    j = step % gap
    if step < max(gap, 2) or j >= warmup:
        return 1.0
    return 1.0 - 0.99 * (1.0 + math.cos(math.pi * (j + 1) / (warmup + 1))) / 2.0


class spam(around):  # noqa: N801 - transforms are named like functions (optax grammar)
    """``inner`` (any transform or chain: Adam's moments, Lion's, Muon's momentum and Newton-Schulz) with
    SPAM's two changes, at step t (counted from 1) with T = ``update_proj_gap``, N = ``warmup_epoch``,
    theta = ``threshold``, A = ``grad_accu_steps``:

    reset:  when t mod T = 0, every buffer of ``inner``'s state (all but weights) <- 0
    clip:   when t mod T >= A and theta > 0:  u <- sign(u) sqrt(theta v) where u^2 > theta v
    o <- inner(u);  o <- s_t o,  s_t = ``warmup_scale(t, T, N)`` (a cosine from 0.01 to 1 over N steps
    after each reset)

    v is ``inner``'s second moment before this step's update (its ``exp_avg_sq``, as the paper's Adam);
    around an ``inner`` that keeps none, ``spam`` keeps its own, v <- b v + (1-b) u^2 of the clipped u
    (b = ``spike_beta``; kept while theta > 0), reset with the rest. Place it around the core, before
    weight decay and the learning rate, so the warmup scales the step and not the decay. The reset
    multiplies every buffer by a per-step 0 or 1, so ``inner``'s buffers must be shaped like the parameter
    (``init`` says which is not). Elementwise when ``inner`` is; its state, scalars and hooks are
    ``inner``'s (``wrapped``).

    ``density`` < 1: SPAM's sparse masks. Each matrix (2-D) keeps a mask M of that density for the period
    between two resets (entry e of parameter i in period j = t // T: hash32(e, hash32(i + 1, j)) / 2^32 <
    density), u <- M u before the clip and o <- M o after ``inner``, so the masked-out entries take no step
    and their moments stay 0; the mask is recomputed from the seed, never stored. It runs on whole tensors
    (the mask needs each element's index). The moments are kept dense: the arithmetic, not the memory saving.
    """

    name = "spam"

    def __init__(self, inner: Transform, density: float = 1.0):
        super().__init__(inner)
        self.density = number_in(0, 1, open_low=True, note="the masked fraction of each matrix")("density", density)
        clash = sorted(set(inner.hyper) & (set(SPAM_HYPER) | {"spike_beta"}))
        if clash:
            raise ValueError(f"spam(): inner={inner!r} declares hyperparameter(s) {clash}, which spam() reads")
        found = [k for k in inner.nonnegative if k.rsplit(".", 1)[-1] == "exp_avg_sq"]
        self.second_moment = found[0] if found else OWN_SECOND_MOMENT
        own = () if found else (OWN_SECOND_MOMENT,)
        self.state, self.nonnegative = inner.state + own, inner.nonnegative + own
        self.resets = tuple(k for k in self.state if k not in inner.weights_like)
        self.hyper = {**inner.hyper, **SPAM_HYPER, **({"spike_beta": Hyper(0.999, unit_interval)} if own else {})}
        self.elementwise = inner.elementwise and density == 1
        if density < 1:
            self.state = ("mask_seed", *self.state)
        else:
            self.hooks = self.hooks - {"seed"}

    def rewrapped(self, inner: Transform) -> "spam":
        return spam(inner, self.density)

    def seed(self, state, index: int) -> None:
        state["mask_seed"].fill_(index + 1)
        super().seed(state, index)

    def mask(self, u: Tensor, seed: Tensor, period: Tensor) -> Tensor:
        """The period's mask of a matrix: entry e kept when hash32(e, hash32(seed, period)) / 2^32 < density."""
        bits = hash32(torch.arange(u.numel(), device=u.device).view(u.shape), hash32(seed, period.long()))
        return (unsigned(bits) < self.density * 2.0**32).to(u.dtype)

    def init(self, param: Tensor, group) -> dict[str, Tensor]:
        buffers = self.inner.init(param, group)
        for key, buffer in buffers.items():
            if key in self.resets and buffer.shape != param.shape:
                raise ValueError(f"spam(): inner={self.inner!r} keeps {key!r} of shape {tuple(buffer.shape)} for a"
                                 f" parameter of shape {tuple(param.shape)}; spam() resets buffers shaped like"
                                 " the parameter only")
        if self.second_moment == OWN_SECOND_MOMENT:
            buffers[OWN_SECOND_MOMENT] = torch.zeros_like(param, dtype=state_dtype(param),
                                                          memory_format=torch.preserve_format)
        if self.density < 1:
            buffers["mask_seed"] = torch.zeros((), dtype=torch.int64, device=param.device)
        return buffers

    def scalars(self, hyper, step: int) -> dict[str, float]:
        gap, accumulate = int(hyper["update_proj_gap"]), int(hyper["grad_accu_steps"])
        out = {**self.inner.scalars(hyper, step), "spam_keep": float(step % gap != 0),
               "spam_clip": float(step % gap >= accumulate),
               "spam_scale": warmup_scale(step, gap, int(hyper["warmup_epoch"])), "spam_period": float(step // gap)}
        if self.second_moment == OWN_SECOND_MOMENT:
            out["spam_one_minus_beta"] = 1 - float(hyper["spike_beta"])
        return out

    def update(self, updates: list[Tensor], state, ctx: Context) -> list[Tensor]:
        for key in self.resets:
            for buffer in state[key]:
                buffer.mul_(ctx["spam_keep"])
        masks = [self.mask(u, seed, ctx["spam_period"]) if u.dim() == 2 else None
                 for u, seed in zip(updates, state["mask_seed"])] if self.density < 1 else [None] * len(updates)
        updates = [u if m is None else u * m for u, m in zip(updates, masks)]
        if ctx.active("threshold"):
            clip, out = ctx["spam_clip"] > 0, []
            for u, v in zip(updates, state[self.second_moment]):
                limit = v * ctx["threshold"]
                out.append(torch.where(clip & (u * u > limit), u.sign() * limit.sqrt(), u))
            updates = out
            if self.second_moment == OWN_SECOND_MOMENT:
                for u, v in zip(updates, state[OWN_SECOND_MOMENT]):
                    v.mul_(ctx["spike_beta"]).add_(u * u * ctx["spam_one_minus_beta"])
        out = self.inner.update(updates, state, ctx)
        return [o * ctx["spam_scale"] if m is None else o * m * ctx["spam_scale"] for o, m in zip(out, masks)]

    def __repr__(self) -> str:
        return f"spam({self.inner!r})"
