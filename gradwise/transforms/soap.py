"""SOAP: Adam run in the eigenbasis of Shampoo's preconditioner (Vyas et al., 2024, arXiv:2409.11321)."""
from __future__ import annotations

import math

import torch
from torch import Tensor

from gradwise.core.hyper import Hyper, betas_pair, boolean, optional, positive, positive_int, unit_interval
from gradwise.core.transform import Context, Transform, state_dtype
from gradwise.transforms.blocking import (
    Blocking,
    FactorCounters,
    accumulate_factors,
    block_groups,
    pieces,
    refresh_eigenbases,
    stacked,
    write_back,
)
from gradwise.transforms.matrix_root import finite_blocks, keep_previous


class scale_by_soap(FactorCounters, Transform):  # noqa: N801 - transforms are named like functions (optax grammar)
    """For each block G of a parameter of two or more dimensions (seen as a matrix, cut into blocks of
    at most ``max_precond_dim`` per side), with Q_L, Q_R the eigenbases of Shampoo's factors:

    G' = Q_L^T G Q_R;  m <- b1 m + (1-b1) G;  v <- b2 v + (1-b2) G'^2  (v lives in the eigenbasis);
    U = sqrt(1-b2^t)/(1-b1^t) * Q_L [(Q_L^T m Q_R) / (sqrt(v) + eps)] Q_R^T;
    then L <- s L + (1-s) G G^T, R <- s R + (1-s) G^T G  (s = ``shampoo_beta``, default b2).
    At step 1 the factors are accumulated first and Q_L, Q_R are their eigenvectors (``eigh``, by
    decreasing eigenvalue); every ``precondition_frequency`` steps after, each basis is refreshed by
    one power iteration with QR, Q <- qr(L Q), after sorting its columns (and v's rows or columns)
    by the estimated eigenvalues diag(Q^T L Q), as the authors' implementation does.
    Parameters of fewer dimensions get Adam with the same bias-correction placement.
    Same-shaped blocks of all parameters share each batched matmul, ``eigh`` and ``qr``.
    A basis whose ``eigh`` or QR step fails or is not finite keeps its previous value (a warning;
    ``eigh_failures`` counts them); a factor update that would make a factor NaN or inf (an
    overflowing or non-finite gradient) is skipped, keeping the factor (a warning at the next
    refresh; ``factor_skips``).
    """

    name = "soap"
    state = ("exp_avg", "exp_avg_sq", "factor_left", "factor_right", "basis_left", "basis_right")
    elementwise = False
    reads_params = False
    batched = True
    hyper = {
        "betas": Hyper((0.95, 0.95), betas_pair),
        "shampoo_beta": Hyper(None, optional(unit_interval, "= betas[1]"), static=True),
        "eps": Hyper(1e-8, positive),
        "precondition_frequency": Hyper(10, positive_int, static=True),
        "max_precond_dim": Hyper(10000, positive_int, static=True),
        "batch_blocks": Hyper(True, boolean, static=True),
    }

    def init(self, param: Tensor, group) -> dict[str, Tensor]:
        dtype, device = state_dtype(param), param.device
        out = {"exp_avg": torch.zeros_like(param, dtype=dtype), "exp_avg_sq": torch.zeros_like(param, dtype=dtype)}
        n, r, c = 0, 0, 0
        if param.dim() >= 2 and param.numel() > 0:
            b = Blocking.of(param.shape, group["max_precond_dim"])
            n, r, c = b.count, b.block_rows, b.block_cols
            out["exp_avg_sq"] = torch.zeros(n, r, c, dtype=dtype, device=device)
        for side, size in (("left", r), ("right", c)):
            out[f"factor_{side}"] = torch.zeros(n, size, size, dtype=dtype, device=device)
            out[f"basis_{side}"] = torch.eye(size, dtype=dtype, device=device).expand(n, size, size).clone()
        return out

    def scalars(self, hyper, step: int) -> dict[str, float]:
        b1, b2 = hyper["betas"]
        s = b2 if hyper["shampoo_beta"] is None else hyper["shampoo_beta"]
        return {"one_minus_beta1": 1 - b1, "one_minus_beta2": 1 - b2, "one_minus_shampoo_beta": 1 - s,
                "step_scale": math.sqrt(1 - b2**step) / (1 - b1**step), "first": float(step == 1),
                "refresh": float(step > 1 and step % hyper["precondition_frequency"] == 0)}

    def update(self, updates: list[Tensor], state, ctx: Context) -> list[Tensor]:
        out: list[Tensor] = []
        for u, m in zip(updates, state["exp_avg"]):
            m.lerp_(u, ctx["one_minus_beta1"])
        matrices = [i for i, f in enumerate(state["factor_left"]) if f.numel() > 0]
        for i, (u, m, v) in enumerate(zip(updates, state["exp_avg"], state["exp_avg_sq"])):
            if i not in matrices:
                v.mul_(ctx["betas"][1]).add_(u * u * ctx["one_minus_beta2"])
            out.append(m / (v.sqrt() + ctx["eps"]) * ctx["step_scale"] if i not in matrices else u)
        if not matrices:
            return out
        first, refresh = bool(ctx["first"]), bool(ctx["refresh"])
        blockings = {i: Blocking.of(updates[i].shape, ctx["max_precond_dim"]) for i in matrices}
        grads = {i: blockings[i].split(updates[i]) for i in matrices}
        moments = {i: blockings[i].split(state["exp_avg"][i]) for i in matrices}
        result = {i: torch.empty_like(grads[i]) for i in matrices}
        for members in block_groups(matrices, blockings, ctx["batch_blocks"]):
            g = stacked([grads[i][k] for i, k in members])
            direction = self.block_step(g, [moments[i][k] for i, k in members], members, state, ctx, first, refresh)
            for (i, k), piece in zip(members, pieces(direction, members)):
                result[i][k] = piece
        for i in matrices:
            out[i] = blockings[i].merge(result[i])
        return out

    def block_step(self, g: Tensor, moments: list[Tensor], members, state, ctx: Context, first: bool,
                   refresh: bool) -> Tensor:
        """The direction of the stacked blocks ``g`` (their first moments ``moments``, already updated), and
        their factors and bases updated."""
        if first:
            self.factor_skips.add(accumulate_factors(g, members, state, ctx["one_minus_shampoo_beta"]))
            self.factor_skips.flush()
            self.eigh_failures += refresh_eigenbases(members, state)
        direction = self.eigenbasis_adam(g, moments, members, state, ctx) * ctx["step_scale"]
        if not first:
            self.factor_skips.add(accumulate_factors(g, members, state, ctx["one_minus_shampoo_beta"]))
        if refresh:
            self.factor_skips.flush()
            self._power_iteration(members, state)
        return direction

    def eigenbasis_adam(self, g: Tensor, moments: list[Tensor], members, state, ctx: Context) -> Tensor:
        """Q_L [(Q_L^T m Q_R) / (sqrt(v) + eps)] Q_R^T, v <- b2 v + (1-b2) (Q_L^T G Q_R)^2 (no bias correction)."""
        ql, qr = (stacked([state[f"basis_{side}"][i][k] for i, k in members]) for side in ("left", "right"))
        rotated = ql.mT @ g @ qr
        v = stacked([state["exp_avg_sq"][i][k] for i, k in members])  # the state itself for a lone member
        v.mul_(ctx["betas"][1]).add_(rotated * rotated * ctx["one_minus_beta2"])
        write_back(v, members, state["exp_avg_sq"])
        rotated_moment = ql.mT @ stacked(moments) @ qr
        return ql @ (rotated_moment / (v.sqrt() + ctx["eps"])) @ qr.mT

    def _power_iteration(self, members, state) -> None:
        v = stacked([state["exp_avg_sq"][i][k] for i, k in members])
        for side, axis in (("left", -2), ("right", -1)):
            f = stacked([state[f"factor_{side}"][i][k] for i, k in members])
            q = stacked([state[f"basis_{side}"][i][k] for i, k in members])
            work = torch.promote_types(f.dtype, torch.float32)
            f, q = f.to(work), q.to(work)
            order = ((f @ q) * q).sum(-2).argsort(dim=-1, descending=True)
            q = q.gather(-1, order[:, None, :].expand_as(q))
            index = order[:, :, None] if axis == -2 else order[:, None, :]
            v = v.gather(axis, index.expand_as(v))
            new, _ = torch.linalg.qr(f @ q)
            new, failed = keep_previous(new, finite_blocks(new), q, "eigenbasis")
            self.eigh_failures += failed
            write_back(new, members, state[f"basis_{side}"])
        write_back(v, members, state["exp_avg_sq"])
