"""SubsetNorm (Subset-Norm step sizes with momentum or Subspace-Momentum) and FRUGAL (AdamW in a GaLore
subspace, signSGD on the rest) against float64 references written from their papers (Nguyen et al. 2024,
arXiv:2411.07120; Zmushko et al. 2024, arXiv:2411.07837), step by step, SVD refreshes included."""
from __future__ import annotations

import math

import pytest
import torch

import gradwise
from tests.models import bag_of_tensors, step_beside_reference

STEPS = 25
GAP = 7  # refreshes at steps 1, 8, 15, 22


class Subspace:
    """GaLore's std projection of an m x n gradient on its top-r singular vectors: right (G B^T) when
    m >= n, else left (A^T G); the basis taken from the gradient at steps 1, 1 + gap, ..."""

    def __init__(self, rank):
        self.rank, self.left, self.right = rank, None, None

    def refresh(self, g):
        u, _, vh = torch.linalg.svd(g, full_matrices=False)
        if g.shape[0] >= g.shape[1]:
            self.right = vh[:self.rank]
        else:
            self.left = u[:, :self.rank]

    def down(self, g):
        return g @ self.right.T if self.right is not None else self.left.T @ g

    def up(self, x):
        return x @ self.right if self.right is not None else self.left @ x


def _subset_sums(g):
    if g.dim() < 2:
        return g * g
    flat = g.reshape(g.shape[0], math.prod(g.shape[1:]))
    return (flat * flat).sum(dim=1, keepdim=True) if flat.shape[0] <= flat.shape[1] else (flat * flat).sum(0, True)


def _divide(d, denominator):
    if d.dim() < 2:
        return d / denominator
    return (d.reshape(d.shape[0], math.prod(d.shape[1:])) / denominator).reshape(d.shape)


class Reference:
    """One parameter's state for both methods, stepped from its gradient at step t."""

    def __init__(self, p, rank, kind, kw):
        self.p, self.kind, self.kw, self.t = p, kind, kw, 0
        self.sub = Subspace(rank) if rank and p.dim() == 2 and p.numel() else None
        self.v_s = torch.zeros_like(_subset_sums(p))
        self.m = self.v = None

    def step(self, g):
        kw, self.t = self.kw, self.t + 1
        if self.sub is not None and (self.t - 1) % GAP == 0:
            self.sub.refresh(g)
        low = self.sub.down(g) if self.sub is not None else g
        rest = g - self.sub.up(low) if self.sub is not None else None
        up = self.sub.up if self.sub is not None else (lambda x: x)
        scale = kw.get("scale", 1.0) if self.sub is not None else 1.0
        if self.m is None:
            self.m, self.v = torch.zeros_like(low), torch.zeros_like(low)
        if self.kind == "subset_norm":  # AdaGrad-Subset-Norm of g; momentum (in the subspace) plus SGD on the rest
            beta = kw.get("momentum", 0.9)
            self.v_s += _subset_sums(g)
            self.m = beta * self.m + (1 - beta) * low
            d = scale * up(self.m) + (rest if rest is not None else 0)
            u = _divide(d, self.v_s.sqrt() + kw.get("eps", 1e-8))
        else:  # FRUGAL: bias-corrected AdamW in the subspace, signSGD on the rest
            b1, b2 = kw.get("betas", (0.9, 0.999))
            self.m = b1 * self.m + (1 - b1) * low
            self.v = b2 * self.v + (1 - b2) * low * low
            a = self.m / (self.v.sqrt() + kw.get("eps", 1e-8)) * math.sqrt(1 - b2**self.t) / (1 - b1**self.t)
            u = scale * up(a) + (kw.get("rest_scale", 1.0) * rest.sign() if rest is not None else 0)
        self.p -= kw["lr"] * (u + kw.get("weight_decay", 0.0) * self.p)


def _compare(recipe, kind, kwargs, rank):
    ours = bag_of_tensors(torch.float64)
    theirs = [p.detach().clone() for p in ours]
    groups = [{"params": ours[:2]}, {"params": ours[2:], "rank": rank, "update_proj_gap": GAP}]
    optimizer = recipe(groups, compile=False, **kwargs)
    references = [Reference(p, rank if i >= 2 else None, kind, kwargs) for i, p in enumerate(theirs)]

    def reference_step(i, p, g):
        references[i].p = p
        references[i].step(g)

    step_beside_reference(optimizer, ours, theirs, STEPS, reference_step)
    return optimizer, ours


SUBSET = {"momentum": dict(lr=0.05), "adagrad-decay": dict(lr=0.1, momentum=0.0, weight_decay=0.1, eps=1e-6),
          "scaled": dict(lr=0.05, momentum=0.8, scale=0.5)}


@pytest.mark.parametrize("rank", [None, 2], ids=["subset-norm", "subspace-momentum"])
@pytest.mark.parametrize("kwargs", SUBSET.values(), ids=SUBSET.keys())
def test_subset_norm_matches_the_paper(kwargs, rank):
    optimizer, params = _compare(gradwise.SubsetNorm, "subset_norm", kwargs, rank)
    state = optimizer.state[params[5]]  # the 4 x 6 matrix: 4 row accumulators
    assert state["subset_norm.sum_sq"].shape == (4, 1)
    momentum = state["subset_norm.galore_rest.ema.momentum_buffer"]
    assert momentum.shape == ((2, 6) if rank else (4, 6))


FRUGAL = {"plain": dict(lr=0.01), "decay-scales": dict(lr=0.01, betas=(0.8, 0.99), weight_decay=0.1, scale=0.5,
                                                       rest_scale=0.3, eps=1e-6)}


@pytest.mark.parametrize("kwargs", FRUGAL.values(), ids=FRUGAL.keys())
def test_frugal_matches_the_paper(kwargs):
    optimizer, params = _compare(gradwise.FRUGAL, "frugal", kwargs, 2)
    assert optimizer.state[params[2]]["galore_rest.adam.exp_avg"].shape == (5, 2)  # 5 x 3: right, rank 2


@pytest.mark.parametrize("recipe", [gradwise.SubsetNorm, gradwise.FRUGAL])
def test_bad_settings_are_refused_by_name(recipe):
    with pytest.raises(ValueError, match=r"invalid rank=4 for a parameter of shape \(5, 3\)"):
        optimizer = recipe([{"params": [torch.zeros(5, 3, requires_grad=True)], "rank": 4}], compile=False)
        optimizer.param_groups[0]["params"][0].grad = torch.ones(5, 3)
        optimizer.step()
    with pytest.raises(ValueError, match=r"invalid eps=0.0: expected a finite number > 0"):
        recipe([torch.zeros(2, requires_grad=True)], eps=0.0)
