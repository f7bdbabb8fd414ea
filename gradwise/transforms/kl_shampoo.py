"""KL-Shampoo: Kronecker factors estimated by Kullback-Leibler minimization, each one whitened by the
other, with their eigenvalues tracked in the eigenbasis (Lin et al., 2025, arXiv:2509.03378)."""
from __future__ import annotations

import math

import torch
from torch import Tensor

from gradwise.core.hyper import Hyper, betas_pair, boolean, optional, positive, positive_int, unit_interval
from gradwise.core.transform import Context, Transform, state_dtype
from gradwise.transforms.blocking import (
    Blocking,
    FactorCounters,
    accumulate_factor,
    block_groups,
    pieces,
    refresh_eigenbases,
    stacked,
    write_back,
)
from gradwise.transforms.matrix_root import finite_blocks, keep_previous


class KLFactors(FactorCounters, Transform):
    """The estimation KL-Shampoo and KL-SOAP share, for each block G (r x c) of a parameter of two or
    more dimensions (seen as a matrix, cut into blocks of at most ``max_precond_dim`` per side), with
    factors S_L, S_R, bases Q_L, Q_R and eigenvalues d_L (r), d_R (c); s = ``shampoo_beta`` (betas[1]):

    step 1: S_L = (1-s) G G^T / c, S_R = (1-s) G^T G / r; Q_L, Q_R their eigenvectors (``eigh``, by
    decreasing eigenvalue); d_L = d_R = ``init_factor``;
    every later step, after the direction, from the previous Q and d, with A = Q_L^T G Q_R:
    S_L <- s S_L + (1-s)/c G Q_R diag(1/d_R) Q_R^T G^T,  S_R <- s S_R + (1-s)/r G^T Q_L diag(1/d_L) Q_L^T G,
    d_L <- max(s d_L + (1-s)/c (A*A) (1/d_R), k_L^-2),  d_R <- max(s d_R + (1-s)/r (1/d_L)^T (A*A), k_R^-2),
    k = max(10, min(side, ``max_clamp_value``)) (the authors' clamp of d^(-1/2));
    every ``precondition_frequency`` steps after (t % f == 0), Q <- qr(S Q) (one power iteration).
    Parameters of fewer dimensions get Adam (bias-corrected, as gradwise's SOAP gives them).
    As the authors' code (github.com/yorkerlin/KL-Methods, optim/kl_opt.py) with these differences: the
    first step is taken rather than skipped; a side above ``max_precond_dim`` is cut into blocks (the
    authors keep one factor per dimension of 2-D and 3-D tensors; here a tensor is a matrix (d0, d1 * ...)),
    an edge block zero-padded (which, unlike for Shampoo, can change that block's preconditioner: a
    rank-deficient factor's basis may mix its padded and real coordinates); float32, not bfloat16.
    Same-shaped blocks of all parameters share each batched matmul, ``eigh`` and ``qr``; a basis whose
    ``eigh`` or QR fails keeps its value (``eigh_failures``); a factor update that would not be finite
    is skipped (``skipped_factor_updates``), and so are such eigenvalues.
    """

    state = ("exp_avg", "exp_avg_sq", "factor_left", "factor_right", "basis_left", "basis_right", "eigen_left",
             "eigen_right")
    nonnegative = ("exp_avg_sq",)
    elementwise = False
    reads_params = False
    batched = True
    hyper = {
        "betas": Hyper((0.9, 0.98), betas_pair),
        "shampoo_beta": Hyper(None, optional(unit_interval, "= betas[1]"), static=True),
        "eps": Hyper(1e-8, positive),
        "precondition_frequency": Hyper(10, positive_int, static=True),
        "max_precond_dim": Hyper(10000, positive_int, static=True),
        "init_factor": Hyper(0.1, positive),
        "max_clamp_value": Hyper(4000, positive_int, static=True),
        "batch_blocks": Hyper(True, boolean, static=True),
    }
    def init(self, param: Tensor, group) -> dict[str, Tensor]:
        dtype, device = state_dtype(param), param.device
        out = {"exp_avg": torch.zeros_like(param, dtype=dtype), "exp_avg_sq": torch.zeros_like(param, dtype=dtype)}
        n, r, c = 0, 0, 0
        if param.dim() >= 2 and param.numel() > 0:
            b = Blocking.of(param.shape, group["max_precond_dim"])
            n, r, c = b.count, b.block_rows, b.block_cols
            out["exp_avg_sq"] = self.matrix_second_moment(n, r, c, dtype, device)
        for side, size in (("left", r), ("right", c)):
            out[f"factor_{side}"] = torch.zeros(n, size, size, dtype=dtype, device=device)
            out[f"basis_{side}"] = torch.eye(size, dtype=dtype, device=device).expand(n, size, size).clone()
            out[f"eigen_{side}"] = torch.zeros(n, size, dtype=dtype, device=device)
        return out

    def matrix_second_moment(self, n: int, r: int, c: int, dtype, device) -> Tensor:
        """The second moment of a matrix of n (r, c) blocks: none for KL-Shampoo."""
        return torch.zeros(0, dtype=dtype, device=device)

    def scalars(self, hyper, step: int) -> dict[str, float]:
        b1, b2 = hyper["betas"]
        s = b2 if hyper["shampoo_beta"] is None else hyper["shampoo_beta"]
        return {"one_minus_beta1": 1 - b1, "one_minus_beta2": 1 - b2, "one_minus_shampoo_beta": 1 - s,
                "step_scale": math.sqrt(1 - b2**step) / (1 - b1**step), "first": float(step == 1),
                "refresh": float(step > 1 and step % hyper["precondition_frequency"] == 0)}

    def update(self, updates: list[Tensor], state, ctx: Context) -> list[Tensor]:
        matrices = [i for i, f in enumerate(state["factor_left"]) if f.numel() > 0]
        out = list(updates)
        for i, (u, m, v) in enumerate(zip(updates, state["exp_avg"], state["exp_avg_sq"])):
            m.lerp_(u, ctx["one_minus_beta1"])
            if i not in matrices:
                v.mul_(ctx["betas"][1]).add_(u * u * ctx["one_minus_beta2"])
                out[i] = m / (v.sqrt() + ctx["eps"]) * ctx["step_scale"]
        if not matrices:
            return out
        first, refresh = bool(ctx["first"]), bool(ctx["refresh"])
        blockings = {i: Blocking.of(updates[i].shape, ctx["max_precond_dim"]) for i in matrices}
        grads = {i: blockings[i].split(updates[i]) for i in matrices}
        result = {i: torch.empty_like(grads[i]) for i in matrices}
        moments = {i: blockings[i].split(state["exp_avg"][i]) for i in matrices}
        for members in block_groups(matrices, blockings, ctx["batch_blocks"]):
            g = stacked([grads[i][k] for i, k in members])
            if first:
                self._first_factors(g, members, state, ctx)
            direction = self.direction(g, members, moments, state, ctx)
            for (i, k), piece in zip(members, pieces(direction, members)):
                result[i][k] = piece
            if not first:
                self._estimate(g, members, state, ctx)
            if refresh:
                self.factor_skips.flush()
                self._refresh_bases(members, state)
        for i in matrices:
            out[i] = blockings[i].merge(result[i])
        return out

    def direction(self, g: Tensor, members, moments: dict[int, Tensor], state, ctx: Context) -> Tensor:
        """KL-Shampoo's: M <- b1 M + (1-b1) G (before, per parameter), U = Q_L [(Q_L^T M Q_R) / (sqrt(d_L d_R^T)
        + eps)] Q_R^T, from the previous Q and d (no bias correction, as the authors' code)."""
        ql, qr, dl, dr = (stacked([state[key][i][k] for i, k in members])
                          for key in ("basis_left", "basis_right", "eigen_left", "eigen_right"))
        m = stacked([moments[i][k] for i, k in members])
        return ql @ ((ql.mT @ m @ qr) / ((dl[:, :, None] * dr[:, None, :]).sqrt() + ctx["eps"])) @ qr.mT

    def _first_factors(self, g: Tensor, members, state, ctx: Context) -> None:
        rows, cols = g.shape[-2:]
        w = ctx["one_minus_shampoo_beta"]
        skips = (accumulate_factor(g @ g.mT / cols, members, state["factor_left"], w)
                 + accumulate_factor(g.mT @ g / rows, members, state["factor_right"], w))
        self.factor_skips.add(skips)
        self.factor_skips.flush()
        self.eigh_failures += refresh_eigenbases(members, state)
        for i, k in members:
            state["eigen_left"][i][k].fill_(ctx["init_factor"])
            state["eigen_right"][i][k].fill_(ctx["init_factor"])

    def _estimate(self, g: Tensor, members, state, ctx: Context) -> None:
        rows, cols = g.shape[-2:]
        w = ctx["one_minus_shampoo_beta"]
        ql, qr, dl, dr = (stacked([state[key][i][k] for i, k in members])
                          for key in ("basis_left", "basis_right", "eigen_left", "eigen_right"))
        left_half, right_half = (g @ qr) * dr.rsqrt()[:, None, :], ql.mT @ g  # G Q_R d_R^-1/2, Q_L^T G
        rotated_sq = (right_half @ qr).square()  # (Q_L^T G Q_R)^2
        right_half = right_half * dl.rsqrt()[:, :, None]
        skips = (accumulate_factor(left_half @ left_half.mT / cols, members, state["factor_left"], w)
                 + accumulate_factor(right_half.mT @ right_half / rows, members, state["factor_right"], w))
        self.factor_skips.add(skips)
        for side, d, diagonal, size in (("left", dl, (rotated_sq / dr[:, None, :]).mean(-1), rows),
                                        ("right", dr, (rotated_sq / dl[:, :, None]).mean(-2), cols)):
            floor = max(10, min(size, ctx["max_clamp_value"])) ** -2.0
            new = torch.lerp(d, diagonal, w).clamp_(min=floor)
            write_back(torch.where(finite_blocks(new[:, None, :])[:, None], new, d), members, state[f"eigen_{side}"])

    def _refresh_bases(self, members, state) -> None:
        for side in ("left", "right"):
            f = stacked([state[f"factor_{side}"][i][k] for i, k in members])
            q = stacked([state[f"basis_{side}"][i][k] for i, k in members])
            work = torch.promote_types(f.dtype, torch.float32)
            new, _ = torch.linalg.qr(f.to(work) @ q.to(work))
            new, failed = keep_previous(new, finite_blocks(new), q, "eigenbasis")
            self.eigh_failures += failed
            write_back(new, members, state[f"basis_{side}"])


class scale_by_kl_shampoo(KLFactors):  # noqa: N801 - transforms are named like functions (optax grammar)
    """KL-Shampoo (Lin et al., 2025, arXiv:2509.03378, the practical scheme of the authors' code): the
    factors of ``KLFactors`` precondition the momentum with the tracked eigenvalues, no Adam, no grafting:
    m <- b1 m + (1-b1) g;  U = Q_L [(Q_L^T m Q_R) / (sqrt(d_L d_R^T) + eps)] Q_R^T per block.
    """

    name = "kl_shampoo"
