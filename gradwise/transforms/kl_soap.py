"""KL-SOAP: Adam in the eigenbasis of KL-Shampoo's factors (Lin et al., 2025, arXiv:2509.03378)."""
from __future__ import annotations

import torch
from torch import Tensor

from gradwise.core.transform import Context
from gradwise.transforms.blocking import stacked, write_back
from gradwise.transforms.kl_shampoo import KLFactors


class scale_by_kl_soap(KLFactors):  # noqa: N801 - transforms are named like functions (optax grammar)
    """KL-SOAP (Lin et al., 2025, arXiv:2509.03378, as the authors' code): the factors and bases of
    ``KLFactors`` (whose eigenvalues d serve only their estimation here), with Adam run in the eigenbasis,
    both of its moments kept there, per block G:

    G' = Q_L^T G Q_R;  m' <- b1 m' + (1-b1) G';  v <- b2 v + (1-b2) G'^2;
    U = Q_L [m' / (sqrt(v) + eps)] Q_R^T  (no bias correction, as the authors' code);
    when the bases are refreshed, m' is carried over: m' <- Q_L'^T (Q_L m' Q_R^T) Q_R' (v is not).
    """

    name = "kl_soap"
    moment_in_parameter_space = False

    def matrix_moments(self, n: int, r: int, c: int, dtype, device) -> dict[str, Tensor]:
        return {key: torch.zeros(n, r, c, dtype=dtype, device=device) for key in ("exp_avg", "exp_avg_sq")}

    def direction(self, g: Tensor, members, moments, state, ctx: Context) -> Tensor:
        ql, qr = (stacked([state[f"basis_{side}"][i][k] for i, k in members]) for side in ("left", "right"))
        rotated = ql.mT @ g @ qr
        m, v = (stacked([state[key][i][k] for i, k in members]) for key in ("exp_avg", "exp_avg_sq"))
        m.lerp_(rotated, ctx["one_minus_beta1"])  # the state itself for a lone member, else a copy written back
        v.mul_(ctx["betas"][1]).add_(rotated * rotated * ctx["one_minus_beta2"])
        write_back(m, members, state["exp_avg"])
        write_back(v, members, state["exp_avg_sq"])
        return ql @ (m / (v.sqrt() + ctx["eps"])) @ qr.mT

    def refresh_bases(self, members, state) -> None:
        ql, qr, m = (stacked([state[key][i][k] for i, k in members]) for key in ("basis_left", "basis_right",
                                                                                   "exp_avg"))
        m = ql @ m @ qr.mT  # back in the parameter's space
        super().refresh_bases(members, state)
        ql, qr = (stacked([state[f"basis_{side}"][i][k] for i, k in members]) for side in ("left", "right"))
        write_back(ql.mT @ m @ qr, members, state["exp_avg"])
