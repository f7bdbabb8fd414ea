"""NorMuon (Li, Liu, Liang, Chen & Zhao, 2025, "NorMuon: Making Muon more efficient and scalable",
arXiv:2510.05491): an Adam-like second moment per neuron of Muon's orthogonalized update, so that no
neuron (row) dominates the step."""
from __future__ import annotations

import math

import torch
from torch import Tensor

from gradwise.core.hyper import Hyper, boolean, choice, positive, unit_interval
from gradwise.core.transform import Context, Transform, state_dtype
from gradwise.transforms.newton_schulz import shape_scale

UPDATE_SCALES = ("preserve_norm", "match_rms")


class scale_by_neuron_second_moment(Transform):  # noqa: N801
    """After Newton-Schulz, for an (m, n) update O (one row per output neuron):

    v <- b2 v + (1-b2) mean_cols(O * O)  (v: m x 1);   P <- O / (sqrt(v) + eps);
    "preserve_norm":  P <- s ||O||_F P / (||P||_F + eps), s = sqrt(max(1, m/n)) (Jordan's shape factor;
                      ``use_adjusted_lr``: 0.2 sqrt(max(m, n)), Moonlight's);
    "match_rms":      P <- 0.2 sqrt(m n) P / (||P||_F + eps)  (the paper's Algorithm 1: RMS 0.2, AdamW's)

    ``update_scale`` "preserve_norm" is the authors' released code and pytorch-optimizer's default. v
    starts at zero and is not bias-corrected, as in both. 1 - b2 is computed in double. Put it after
    ``orthogonalize_by_newton_schulz`` and before weight decay and the learning rate (the shape factor
    scales the update only, not the decay, as pytorch-optimizer's adjusted lr does).
    """

    name = "neuron_norm"
    state = ("second_momentum_buffer",)
    nonnegative = ("second_momentum_buffer",)
    elementwise = False
    reads_params = False
    hyper = {
        "beta2": Hyper(0.95, unit_interval),
        "eps": Hyper(1e-10, positive),
        "update_scale": Hyper("preserve_norm", choice(UPDATE_SCALES), static=True),
        "use_adjusted_lr": Hyper(False, boolean, static=True),
    }

    def init(self, param: Tensor, group) -> dict[str, Tensor]:
        if param.dim() != 2:
            raise ValueError(f"scale_by_neuron_second_moment: got a parameter of shape {tuple(param.shape)};"
                             " it keeps one second moment per row of 2-D matrices only (route others elsewhere)")
        return {"second_momentum_buffer": torch.zeros((param.shape[0], 1), dtype=state_dtype(param),
                                                      device=param.device)}

    def scalars(self, hyper, step: int) -> dict[str, float]:
        return {"one_minus_beta2": 1 - float(hyper["beta2"])}

    def update(self, updates: list[Tensor], state, ctx: Context) -> list[Tensor]:
        eps, preserve = ctx["eps"], ctx["update_scale"] == "preserve_norm"
        adjust = "match_rms_adamw" if ctx["use_adjusted_lr"] else "original"
        out = []
        for o, v in zip(updates, state["second_momentum_buffer"]):
            v.lerp_(o.square().mean(dim=-1, keepdim=True), ctx["one_minus_beta2"])
            p = o / (v.sqrt() + eps)
            if preserve:
                target = torch.linalg.vector_norm(o) * shape_scale(adjust, o.shape)
            else:
                target = 0.2 * math.sqrt(o.numel())
            out.append(p * (target / (torch.linalg.vector_norm(p) + eps)))
        return out
