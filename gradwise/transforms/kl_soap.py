"""KL-SOAP: Adam in the eigenbasis of KL-Shampoo's factors (Lin et al., 2025, arXiv:2509.03378)."""
from __future__ import annotations

from torch import Tensor

from gradwise.core.transform import Context
from gradwise.transforms.kl_shampoo import KLFactors


class scale_by_kl_soap(KLFactors):  # noqa: N801 - transforms are named like functions (optax grammar)
    """KL-SOAP (Lin et al., 2025, arXiv:2509.03378, as the authors' code): the factors and bases of
    ``KLFactors`` (whose eigenvalues d serve only their estimation here), with Adam run in the eigenbasis,
    per block G (m as the parameter, per parameter, before):

    G' = Q_L^T G Q_R;  m <- b1 m + (1-b1) G;  v <- b2 v + (1-b2) G'^2  (v lives in the eigenbasis);
    U = Q_L [(Q_L^T m Q_R) / (sqrt(v) + eps)] Q_R^T  (no bias correction, as the authors' code).
    The authors keep m' = Q_L^T m Q_R, rotated into each new basis at a refresh (v is not): the same
    numbers, but m shaped like the parameter can be encoded (``state="int8"``), as SOAP's.
    """

    name = "kl_soap"

    def matrix_second_moment(self, blocks: Tensor) -> Tensor:
        return blocks

    def direction(self, g: Tensor, moments: list[Tensor], members, state, ctx: Context) -> Tensor:
        return self.eigenbasis_adam(g, moments, members, state, ctx)
