"""A low-rank subspace for a stateful rule and a state-free rule on the rest of the gradient: FRUGAL's
gradient splitting (Zmushko et al. 2024, arXiv:2411.07837; LITERATURE.md ¶86) and Subspace-Momentum
(Nguyen et al. 2024, arXiv:2411.07120; ¶80)."""
from __future__ import annotations

from torch import Tensor

from gradwise.core.hyper import Hyper, choice, non_negative
from gradwise.core.transform import Context, Transform
from gradwise.transforms.low_rank import project, project_back, project_low_rank, projects

#: the state-free rules for the part of the gradient outside the subspace
RESTS = ("sgd", "sign")


class project_low_rank_with_rest(project_low_rank):  # noqa: N801 - transforms are named like functions
    """``project_low_rank(inner)`` plus a state-free step along the rest of the gradient. For each matrix
    of a group with ``rank`` r (the subspace from the gradient's SVD every ``update_proj_gap`` steps, as
    GaLore), with R = project(u) and the residual u - project_back(R):

        u <- scale project_back(inner(R)) + rest_scale rest(u - project_back(R)),

    rest = the identity (``"sgd"``: Subspace-Momentum's SGD in the orthogonal complement) or sign
    (``"sign"``: FRUGAL's signSGD). Other parameters (vectors, groups with ``rank=None``) get ``inner``
    alone, as under ``project_low_rank``. ``inner``'s state lives in the projected shape.
    """

    name = "galore_rest"

    def __init__(self, inner: Transform, rest: str = "sign"):
        super().__init__(inner)
        self.rest = choice(RESTS)("rest", rest)
        self.hyper = {**self.hyper, "rest_scale": Hyper(1.0, non_negative)}

    def update(self, updates: list[Tensor], state, ctx: Context) -> list[Tensor]:
        out = super().update(updates, state, ctx)  # refreshes the bases in place on a refresh step
        for i, u in enumerate(updates):
            if projects(u, ctx["rank"]):
                bases = (state["basis_left"][i] if state["basis_left"][i].numel() else None,
                         state["basis_right"][i] if state["basis_right"][i].numel() else None)
                residual = u - project_back(project(u, *bases), *bases)
                out[i] = out[i] + (residual.sign() if self.rest == "sign" else residual) * ctx["rest_scale"]
        return out

    def __repr__(self) -> str:
        return f"project_low_rank_with_rest({self.inner!r}, rest={self.rest!r})"
