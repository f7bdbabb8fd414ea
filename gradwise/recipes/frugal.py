"""FRUGAL: AdamW in a low-rank subspace of each matrix's gradient, signSGD on the rest (Zmushko et al. 2024,
"FRUGAL: Memory-Efficient Optimization by Reducing State Overhead for Scalable Training",
arXiv:2411.07837; LITERATURE.md ¶86)."""
from __future__ import annotations

from gradwise.core.hyper import choice
from gradwise.core.optimizer import Optimizer
from gradwise.core.transform import chain
from gradwise.transforms.active_blocks import project_active_blocks
from gradwise.transforms.adam import scale_by_adam_moments, scale_by_bias_correction
from gradwise.transforms.learning_rate import scale_by_learning_rate
from gradwise.transforms.low_rank_rest import project_low_rank_with_rest
from gradwise.transforms.weight_decay import add_decayed_weights

#: how FRUGAL chooses the stateful part: GaLore's SVD subspace of each matrix, or whole tensors in turn
SUBSPACES = ("galore", "blocks")


class FRUGAL(Optimizer):
    """FRUGAL with GaLore's subspace. For each matrix of a group with ``rank`` r, with R = P g (the
    gradient's top-r singular subspace, refreshed every ``update_proj_gap`` steps; ``project_low_rank``):

        m <- b1 m + (1-b1) R;  v <- b2 v + (1-b2) R^2;  a <- sqrt(1-b2^t)/(1-b1^t) m / (sqrt(v) + eps)
        p <- p - lr (scale P^T a + rest_scale sign(g - P^T R) + weight_decay p)

    the state-free signSGD step along the part of the gradient outside the subspace; other parameters
    (vectors, every parameter of a group with ``rank=None``) get that AdamW in full, as the paper keeps
    embeddings, norms and the head on Adam. State per projected m x n matrix (std, m >= n): two m x r
    moments and the r x n basis; the moments persist across refreshes (as GaLore). Keep r below min(m, n):
    at full rank the rest is rounding noise, which sign lifts to a step of lr per entry.

    ``subspace="blocks"``: the paper's block-style subspace instead (``project_active_blocks``): in a group with
    ``block_stride`` n, one parameter tensor in n takes that AdamW (fresh moments each time it becomes active,
    the active set shifting every ``update_proj_gap`` steps) and the others rest_scale sign(g); groups with
    ``block_stride=None`` get AdamW in full. ``rank``, ``scale`` and ``proj_type`` are GaLore's only.
    """

    state_refusal = ("a projected matrix's moments have the projection's shape, not the parameter's, and a codec"
                     " stores only buffers shaped like their parameter")

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, rank=None,
                 update_proj_gap=200, scale=1.0, proj_type="std", rest_scale=1.0, *, subspace="galore",
                 block_stride=None, maximize=False, skip_nonfinite=False, compile="auto", state=None,
                 param_rounding="nearest"):
        adamw = chain(scale_by_adam_moments(), scale_by_bias_correction())
        if choice(SUBSPACES)("subspace", subspace) == "galore":
            if block_stride is not None:
                raise ValueError(f"invalid block_stride={block_stride!r}: subspace='galore' projects on rank; use"
                                 " subspace='blocks' for whole tensors stateful in turn")
            split, own = project_low_rank_with_rest(adamw, rest="sign"), dict(rank=rank, scale=scale,
                                                                               proj_type=proj_type)
        elif rank is not None or scale != 1.0 or proj_type != "std":
            raise ValueError(f"invalid rank={rank!r}, scale={scale!r}, proj_type={proj_type!r} with subspace='blocks':"
                             " those are GaLore's; the blocks' subspace takes block_stride")
        else:
            split, own = project_active_blocks(adamw, rest="sign"), dict(block_stride=block_stride)
        transform = chain(split, add_decayed_weights(), scale_by_learning_rate())
        super().__init__(params, transform, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                         update_proj_gap=update_proj_gap, rest_scale=rest_scale, maximize=maximize,
                         skip_nonfinite=skip_nonfinite, compile=compile, state=state, param_rounding=param_rounding,
                         **own)
