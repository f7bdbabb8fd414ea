"""APOLLO: Adam's per-channel (or per-tensor) step scale estimated in a random low-rank space and
applied to the raw gradient (Zhu et al., 2024, arXiv:2412.05270, "APOLLO: SGD-like Memory,
AdamW-level Performance")."""
from __future__ import annotations

import math
from dataclasses import replace

import torch
from torch import Tensor

from gradwise.core.hyper import Hyper, boolean, choice
from gradwise.core.transform import Context, Transform, state_dtype
from gradwise.transforms.low_rank import (
    check_fits,
    inner_chain,
    project,
    projected_shape,
    projection_hyper,
    projects,
    refresh_bases,
    side_of,
)

#: APOLLO's projections (random ones have no "full" form) and its scale factors' granularity.
PROJ_TYPES = ("std", "reverse_std", "right", "left")
SCALE_TYPES = ("channel", "tensor")
PROJS = ("random", "svd")
#: the norm-growth limiter (Fira; Chen et al., 2024, arXiv:2410.01623): the update's norm grows by at
#: most this factor a step.
GROWTH_LIMIT = 1.01
#: apollo-torch's floor on the denominators of its ratios.
TINY = 1e-8


def next_seed(seed: int) -> int:
    """The seed of the next projection: the 15th int64 drawn from a CPU generator seeded with ``seed``
    (the way apollo-torch advances its seeds, so projections and resumes match it)."""
    generator = torch.Generator().manual_seed(seed)
    return int(torch.randint(0, torch.iinfo(torch.int64).max, (15,), generator=generator)[-1])


def random_basis(seed: int, shape: tuple[int, int], rank: int, dtype: torch.dtype, device) -> Tensor:
    """A Gaussian projection with entries N(0, 1/rank), drawn in float32 from ``seed`` on ``device``."""
    generator = torch.Generator(device=device).manual_seed(seed)
    return (torch.randn(shape, generator=generator, device=device, dtype=torch.float32) / math.sqrt(rank)).to(dtype)


class scale_by_apollo(Transform):  # noqa: N801 - transforms are named like functions (optax grammar)
    """APOLLO (Zhu et al., 2024, arXiv:2412.05270), around ``inner`` (APOLLO's own is
    ``scale_by_adam_moments``): for each matrix G (m x n) in a group whose ``rank`` r is set,

    P: a random (r x n) (right side) or (m x r) (left side) matrix with N(0, 1/r) entries, redrawn
    from a new seed at steps 1 + T, 1 + 2T, ... (T = ``update_proj_gap``); R = G P^T or P^T G
    (``proj="svd"``: P is GaLore's basis instead, the top singular vectors of G at steps 1, 1 + T, ...);
    N = inner(R);  s = ||N_c|| / (||R_c|| + 1e-8) per channel c (a row of R for the right side, a
    column for the left; ``scale_type="tensor"``: one s from the whole matrices, APOLLO-Mini);
    u <- G * s;  norm-growth limiter (unless ``disable_nl``): from the second step on,
    u <- u / (max(||u|| / (prev + 1e-8), 1.01) / 1.01) and prev <- ||u|| after it (at step 1, prev <- ||u||);
    u <- sqrt(``scale``) u (before the limiter when ``scale_front``).
    Other parameters get ``inner`` as it is; ``inner``'s hooks are forwarded, and it may not keep a
    copy of the weights (``low_rank.inner_chain``).

    A random projection is never stored: it is redrawn every step from the 0-d ``seed`` state, which
    starts at the parameter's index (in group order) + 1 and goes through ``state_dict``, so a resume
    is exact. Seeds and draws follow apollo-torch's, so the trajectory matches it. It runs eagerly on
    whole tensors (``batched``): a sharded parameter's on its owner (``core/owned.py``). ``rank`` larger
    than the side it projects raises.
    """

    name = "apollo"
    elementwise = False
    batched = True

    def __init__(self, inner: Transform):
        self.inner = inner_chain(inner, "scale_by_apollo")
        own = {**projection_hyper(PROJ_TYPES, 1.0),
               "scale_type": Hyper("channel", choice(SCALE_TYPES), static=True),
               "proj": Hyper("random", choice(PROJS), static=True),
               "scale_front": Hyper(False, boolean, static=True),
               "disable_nl": Hyper(False, boolean, static=True)}
        clash = sorted(set(own) & set(self.inner.hyper))
        if clash:
            raise ValueError(f"scale_by_apollo(): inner declares {clash}, which APOLLO reads itself")
        self.hyper = {**self.inner.hyper, **own}
        self.state = ("seed", "limiter_norm", "basis_left", "basis_right", *self.inner.state)
        self.reductions = self.inner.reductions  # guards only (inner_chain), decided on the unprojected updates
        self.nonnegative = ("limiter_norm", *self.inner.nonnegative)

    def init(self, param: Tensor, group) -> dict[str, Tensor]:
        dtype, device = state_dtype(param), param.device
        own = {"seed": torch.zeros((), dtype=torch.int64, device=device),
               "limiter_norm": torch.zeros((), dtype=dtype, device=device),
               "basis_left": torch.zeros(0, 0, dtype=dtype, device=device),
               "basis_right": torch.zeros(0, 0, dtype=dtype, device=device)}
        rank = group["rank"]
        if not projects(param, rank):
            return {**own, **self.inner.init(param, group)}
        (m, n), side = param.shape, side_of(param.shape, group["proj_type"])
        if group["proj"] == "svd":
            check_fits(param.shape, rank, min(m, n), "an SVD basis holds at most min(m, n) singular vectors")
            own[f"basis_{side}"] = torch.zeros((m, rank) if side == "left" else (rank, n), dtype=dtype, device=device)
        else:
            largest = n if side == "right" else m
            check_fits(param.shape, rank, largest, f"a random {side} projection maps a side of {largest} to rank")
        return {**own, **self.inner.init(param.new_empty(projected_shape(param.shape, side, rank)), group)}

    def wrapped(self, group=None) -> list[tuple[str, Transform]]:
        return [("", self.inner)]

    def seed(self, state, index: int) -> None:
        state["seed"].fill_(index + 1)
        super().seed(state, index)

    def scalars(self, hyper, step: int) -> dict[str, float]:
        refresh = (step - 1) % hyper["update_proj_gap"] == 0
        return {"first": float(step == 1), "refresh": float(refresh), "redraw": float(refresh and step > 1),
                "sqrt_scale": math.sqrt(hyper["scale"]), **self.inner.scalars(hyper, step)}

    def advance(self, state, hyper, scalars) -> None:
        if scalars["redraw"] and hyper["proj"] == "random":
            state["seed"].fill_(next_seed(int(state["seed"])))
        super().advance(state, hyper, scalars)

    def update(self, updates: list[Tensor], state, ctx: Context) -> list[Tensor]:
        rank = ctx["rank"]
        chosen = [i for i, u in enumerate(updates) if projects(u, rank)]
        sides = {i: side_of(updates[i].shape, ctx["proj_type"]) for i in chosen}
        bases = {i: self._bases(updates[i], rank, sides[i], state, i, ctx) for i in chosen}
        if ctx["proj"] == "svd" and bool(ctx["refresh"]):
            refresh_bases([updates[i] for i in chosen], [bases[i] for i in chosen], rank)
        low, params, grads = list(updates), list(ctx.params), list(ctx.grads)
        for i in chosen:
            u = updates[i]
            low[i] = grads[i] = project(u, *bases[i])
            params[i] = project(ctx.params[i].to(u.dtype), *bases[i])
        inner_state = {k: state[k] for k in self.inner.state}
        out = self.inner.update(low, inner_state, replace(ctx, params=params, grads=grads))
        for i in chosen:
            out[i] = self._scaled(updates[i], low[i], out[i], sides[i], state["limiter_norm"][i], ctx)
        return out

    @staticmethod
    def _bases(u: Tensor, rank: int, side: str, state, i: int, ctx: Context) -> tuple[Tensor | None, Tensor | None]:
        """(left, right): the stored SVD basis, or the random one drawn from the parameter's seed."""
        if ctx["proj"] == "svd":
            return (state["basis_left"][i], None) if side == "left" else (None, state["basis_right"][i])
        m, n = u.shape
        shape = (rank, n) if side == "right" else (m, rank)
        basis = random_basis(int(state["seed"][i]), shape, rank, u.dtype, u.device)
        return (None, basis) if side == "right" else (basis, None)

    @staticmethod
    def _scaled(g: Tensor, low: Tensor, direction: Tensor, side: str, prev: Tensor, ctx: Context) -> Tensor:
        if ctx["scale_type"] == "tensor":
            factor = direction.norm() / (low.norm() + TINY)
        else:
            dim = 1 if side == "right" else 0  # the projected dimension; channels are the other one
            factor = direction.norm(dim=dim, keepdim=True) / (low.norm(dim=dim, keepdim=True) + TINY)
        u = g * factor
        if ctx["scale_front"]:
            u = u * ctx["sqrt_scale"]
        if not ctx["disable_nl"]:
            norm = u.norm()
            if bool(ctx["first"]):
                prev.copy_(norm)
            else:
                limiter = torch.clamp(norm / (prev + TINY), min=GROWTH_LIMIT) / GROWTH_LIMIT
                u = u / limiter
                prev.copy_(norm / limiter)
        if not ctx["scale_front"]:
            u = u * ctx["sqrt_scale"]
        return u

    def __repr__(self) -> str:
        return f"scale_by_apollo({self.inner!r})"
