"""KL-Shampoo: Kronecker factors estimated by Kullback-Leibler minimization, each one whitened by the
other, with their eigenvalues tracked in the eigenbasis (Lin et al., 2025, arXiv:2509.03378)."""
from __future__ import annotations

import torch
from torch import Tensor

from gradwise.core.hyper import Hyper, betas_pair, positive, positive_int
from gradwise.core.transform import Context
from gradwise.transforms.blocking import accumulate_factor, refresh_eigenbases, stacked, write_back
from gradwise.transforms.matrix_root import finite_blocks, keep_previous
from gradwise.transforms.soap import scale_by_soap


class KLFactors(scale_by_soap):
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
    Parameters of fewer dimensions get Adam (bias-corrected), and blocks, batching, hyperparameters and
    fallbacks are SOAP's (``scale_by_soap``, which this extends).
    As the authors' code (github.com/yorkerlin/KL-Methods, optim/kl_opt.py) with these differences: the
    first step is taken rather than skipped; a side above ``max_precond_dim`` is cut into blocks (the
    authors keep one factor per dimension of 2-D and 3-D tensors; here a tensor is a matrix (d0, d1 * ...)),
    an edge block zero-padded (which, unlike for Shampoo, can change that block's preconditioner: a
    rank-deficient factor's basis may mix its padded and real coordinates); float32, not bfloat16.
    Same-shaped blocks of all parameters share each batched matmul, ``eigh`` and ``qr``; a basis whose
    ``eigh`` or QR fails keeps its value (``eigh_failures``); a factor update that would not be finite
    is skipped (``skipped_factor_updates``), and so are such eigenvalues.
    """

    state = (*scale_by_soap.state, "eigen_left", "eigen_right")
    nonnegative = ("exp_avg_sq",)
    hyper = {**scale_by_soap.hyper, "betas": Hyper((0.9, 0.98), betas_pair), "init_factor": Hyper(0.1, positive),
             "max_clamp_value": Hyper(4000, positive_int, static=True)}

    def init(self, param: Tensor, group) -> dict[str, Tensor]:
        out = super().init(param, group)
        for side, basis in (("left", out["basis_left"]), ("right", out["basis_right"])):
            out[f"eigen_{side}"] = basis.new_zeros(basis.shape[:2])
        if out["factor_left"].numel() > 0:
            out["exp_avg_sq"] = self.matrix_second_moment(out["exp_avg_sq"])
        return out

    def matrix_second_moment(self, blocks: Tensor) -> Tensor:
        """The second moment of a matrix, given SOAP's (n, r, c) blocks: none for KL-Shampoo."""
        return blocks.new_zeros(0)

    def block_step(self, g: Tensor, moments: list[Tensor], members, state, ctx: Context, first: bool,
                   refresh: bool) -> Tensor:
        if first:
            self._first_factors(g, members, state, ctx)
        direction = self.direction(g, moments, members, state, ctx)
        if not first:
            self._estimate(g, members, state, ctx)
        if refresh:
            self.factor_skips.flush()
            self._refresh_bases(members, state)
        return direction

    def direction(self, g: Tensor, moments: list[Tensor], members, state, ctx: Context) -> Tensor:
        """KL-Shampoo's: U = Q_L [(Q_L^T m Q_R) / (sqrt(d_L d_R^T) + eps)] Q_R^T, from the previous Q and d (no
        bias correction, as the authors' code)."""
        ql, qr, dl, dr = (stacked([state[key][i][k] for i, k in members])
                          for key in ("basis_left", "basis_right", "eigen_left", "eigen_right"))
        m = stacked(moments)
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
