"""Low-rank gradient projection: GaLore (Zhao et al., 2024, arXiv:2403.03507), and the projector
vocabulary APOLLO shares (``gradwise.transforms.apollo``).

A matrix parameter's gradient G (m x n) is projected on a rank-r subspace, an inner chain keeps its
state there (r x n or m x r instead of m x n), and its output is brought back to m x n. The sides:
``"right"`` projects G -> G B^T with B (r x n) of orthonormal rows, back by X -> X B; ``"left"``
projects G -> A^T G with A (m x r), back by X -> A X; ``"full"`` does both, G -> A^T G B^T.
"""
from __future__ import annotations

from dataclasses import replace

import torch
from torch import Tensor

from gradwise.core.hyper import Hyper, choice, int_in, optional, positive, positive_int
from gradwise.core.transform import Chain, Context, Transform, chain, state_dtype, uses

#: GaLore's projection types, named as galore-torch names them: ``std`` projects the larger side
#: away (right for m >= n, left otherwise), ``reverse_std`` the smaller one.
PROJ_TYPES = ("std", "reverse_std", "right", "left", "full")


def inner_chain(inner: Transform, owner: str) -> Chain:
    """The chain a projection wrapper runs in the projected space (one transform becomes a chain of one).

    It may not keep a copy of the weights (``weights_like`` state: Schedule-Free's z, Lookahead's slow
    weights) nor move the parameters in ``eval()`` (``set_mode``): a projected matrix has no weights
    there, only its projection, and its subspace changes at every refresh."""
    if not isinstance(inner, Transform):
        raise TypeError(f"{owner}(): inner={inner!r} must be a Transform, e.g. scale_by_adam_moments()")
    inner = inner if isinstance(inner, Chain) else chain(inner)
    if inner.weights_like or uses(inner, "set_mode"):
        raise ValueError(f"{owner}(): inner={inner!r} keeps a copy of the weights or moves them in eval(),"
                         " which the projected space has no room for; put it after the projection instead,"
                         f" e.g. chain({owner}(scale_by_adam_moments()), scale_by_schedule_free())"
                         f" or chain({owner}(...), scale_by_learning_rate(), lookahead())")
    statistics = sorted(name for name, op in inner.reductions.items() if op != "skip")
    if statistics:
        raise ValueError(f"{owner}(): inner={inner!r} reduces {statistics} over the step's parameters, which it"
                         " would compute on the updates before their projection; put that link before"
                         f" {owner}(...), e.g. chain(clip_by_global_norm(), {owner}(...))")
    return inner


def projection_hyper(proj_types: tuple[str, ...], scale: float) -> dict[str, Hyper]:
    """The hyperparameters every low-rank projection reads, under galore-torch's names."""
    return {
        "rank": Hyper(None, optional(positive_int, "no projection"), static=True),
        "update_proj_gap": Hyper(200, int_in(1, note="steps between projector refreshes"), static=True),
        "scale": Hyper(scale, positive),
        "proj_type": Hyper("std", choice(proj_types), static=True),
    }


def projects(param: Tensor, rank: int | None) -> bool:
    """Whether a parameter is projected: a non-empty matrix in a group with a rank."""
    return rank is not None and param.dim() == 2 and param.numel() > 0


def side_of(shape: torch.Size, proj_type: str) -> str:
    m, n = shape
    if proj_type == "std":
        return "right" if m >= n else "left"
    if proj_type == "reverse_std":
        return "left" if m >= n else "right"
    return proj_type


def projected_shape(shape: torch.Size, side: str, rank: int) -> tuple[int, int]:
    m, n = shape
    return {"right": (m, rank), "left": (rank, n), "full": (rank, rank)}[side]


def check_fits(shape: torch.Size, rank: int, largest: int, what: str) -> None:
    if rank > largest:
        raise ValueError(f"invalid rank={rank} for a parameter of shape {tuple(shape)}: expected an integer in"
                         f" [1, {largest}] ({what}); put this parameter in a param group with a smaller rank,"
                         " or rank=None for no projection")


def project(g: Tensor, left: Tensor | None, right: Tensor | None) -> Tensor:
    """G -> A^T G, G B^T or A^T G B^T, for the bases that are given."""
    if left is not None:
        g = left.mT @ g
    return g @ right.mT if right is not None else g


def project_back(x: Tensor, left: Tensor | None, right: Tensor | None) -> Tensor:
    """The transpose of ``project``: X -> A X, X B or A X B."""
    if left is not None:
        x = left @ x
    return x @ right if right is not None else x


class project_low_rank(Transform):  # noqa: N801 - transforms are named like functions (optax grammar)
    """GaLore (Zhao et al., 2024, arXiv:2403.03507): ``inner`` run in a low-rank subspace of each
    matrix's gradient, the subspace refreshed from the gradient's SVD.

    For each matrix parameter in a group whose ``rank`` r is set, at steps 1, 1 + T, 1 + 2T, ...
    (T = ``update_proj_gap``): U S V^T = svd(G), A = U[:, :r], B = V^T[:r, :] (computed in at least
    float32; same-shaped gradients share one batched SVD). Every step:
    R = project(G) (see ``side_of`` and the module docstring for ``proj_type``);  N = inner(R);
    u <- scale * project_back(N).
    ``inner``'s state lives in the projected shape and persists across refreshes, as in the paper;
    ``inner`` sees the projected gradient as its updates and grads and the projected parameter as
    its params. Other parameters (vectors, scalars, groups with ``rank=None``) get ``inner`` as it is.
    ``inner``'s hooks are forwarded (``Transform.wrapped``); it may not keep a copy of the weights
    (``inner_chain``).

    It is not elementwise (a matmul and an SVD per matrix), so it runs eagerly on whole tensors
    (``batched``); a sharded (FSDP2) parameter's on its owner (``core/owned.py``). ``rank`` larger than
    min(m, n) raises ``ValueError``.
    """

    name = "galore"
    elementwise = False
    batched = True

    def __init__(self, inner: Transform):
        self.inner = inner_chain(inner, "project_low_rank")
        own = projection_hyper(PROJ_TYPES, 1.0)
        clash = sorted(set(own) & set(self.inner.hyper))
        if clash:
            raise ValueError(f"project_low_rank(): inner declares {clash}, which the projection reads itself")
        self.hyper = {**self.inner.hyper, **own}
        self.state = ("basis_left", "basis_right", *self.inner.state)
        self.reductions = self.inner.reductions  # guards only (inner_chain), decided on the unprojected updates
        self.nonnegative = self.inner.nonnegative

    def init(self, param: Tensor, group) -> dict[str, Tensor]:
        dtype, device = state_dtype(param), param.device
        empty = torch.zeros(0, 0, dtype=dtype, device=device)
        rank = group["rank"]
        if not projects(param, rank):
            return {"basis_left": empty, "basis_right": empty.clone(), **self.inner.init(param, group)}
        m, n = param.shape
        check_fits(param.shape, rank, min(m, n), "a GaLore projection keeps at most min(m, n) singular vectors")
        side = side_of(param.shape, group["proj_type"])
        low = param.new_empty(projected_shape(param.shape, side, rank))
        return {"basis_left": torch.zeros(m, rank, dtype=dtype, device=device) if side != "right" else empty,
                "basis_right": torch.zeros(rank, n, dtype=dtype, device=device) if side != "left" else empty.clone(),
                **self.inner.init(low, group)}

    def wrapped(self, group=None) -> list[tuple[str, Transform]]:
        return [("", self.inner)]

    def scalars(self, hyper, step: int) -> dict[str, float]:
        return {"refresh": float((step - 1) % hyper["update_proj_gap"] == 0), **self.inner.scalars(hyper, step)}

    def update(self, updates: list[Tensor], state, ctx: Context) -> list[Tensor]:
        chosen = [i for i, u in enumerate(updates) if projects(u, ctx["rank"])]
        bases = {i: (state["basis_left"][i] if state["basis_left"][i].numel() else None,
                     state["basis_right"][i] if state["basis_right"][i].numel() else None) for i in chosen}
        if bool(ctx["refresh"]):
            refresh_bases([updates[i] for i in chosen], [bases[i] for i in chosen], ctx["rank"])
        low = list(updates)
        params, grads = list(ctx.params), list(ctx.grads)
        for i in chosen:
            low[i] = project(updates[i], *bases[i])
            params[i] = project(ctx.params[i].to(low[i].dtype), *bases[i])
            grads[i] = low[i]
        inner_state = {k: state[k] for k in self.inner.state}
        out = self.inner.update(low, inner_state, replace(ctx, params=params, grads=grads))
        for i in chosen:
            out[i] = project_back(out[i], *bases[i]) * ctx["scale"]
        return out

    def __repr__(self) -> str:
        return f"project_low_rank({self.inner!r})"


def refresh_bases(grads: list[Tensor], bases: list[tuple[Tensor | None, Tensor | None]], rank: int) -> None:
    """Write each matrix's new bases: the top ``rank`` singular vectors of its gradient, one batched
    SVD per shape, in at least float32 (bases of 16-bit parameters are float32 state anyway)."""
    by_shape: dict[tuple, list[int]] = {}
    for i, g in enumerate(grads):
        by_shape.setdefault((tuple(g.shape), g.dtype, g.device), []).append(i)
    for members in by_shape.values():
        stacked = torch.stack([grads[i] for i in members])
        work = torch.promote_types(stacked.dtype, torch.float32)
        u, _, vh = torch.linalg.svd(stacked.to(work), full_matrices=False)
        for k, i in enumerate(members):
            left, right = bases[i]
            if left is not None:
                left.copy_(u[k, :, :rank])
            if right is not None:
                right.copy_(vh[k, :rank, :])
