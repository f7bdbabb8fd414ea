"""Ranger21's components written from their papers' formulas, one tensor at a time, for the tests.

Written independently of gradwise's transforms (loops over units, explicit formulas) so that a test
comparing the two compares two readings of the papers.
"""
from __future__ import annotations

import math

import torch


def units(x: torch.Tensor) -> list[torch.Tensor]:
    """Ranger21's units of a tensor: all of it (0-d, 1-d), its [i, :, k] fibres (2-d, 3-d), or its
    [i, ...] slices (4-d and more)."""
    if x.dim() <= 1:
        return [x]
    if x.dim() == 2:
        return [x[i, :] for i in range(x.shape[0])]
    if x.dim() == 3:
        return [x[i, :, k] for i in range(x.shape[0]) for k in range(x.shape[2])]
    return [x[i] for i in range(x.shape[0])]


def agc(p, g, clip, eps, grad_eps=1e-6):
    """Brock et al. (2021): a unit of g whose norm exceeds clip * max(||p unit||, eps) is scaled down to it."""
    out = g.clone()
    for pu, gu, ou in zip(units(p), units(g), units(out)):
        max_norm = clip * max(math.sqrt(float((pu * pu).sum())), eps)
        g_norm = max(math.sqrt(float((gu * gu).sum())), grad_eps)
        if g_norm > max_norm:
            ou.copy_(gu * (max_norm / g_norm))
    return out


def centralize(g, conv_only=False):
    """Yong et al. (2020): subtract from each g[i, ...] its mean (tensors of 2+ dims; 4+ with conv_only)."""
    if g.dim() <= (3 if conv_only else 1):
        return g.clone()
    out = g.clone()
    for i in range(g.shape[0]):
        out[i] = g[i] - g[i].mean()
    return out


def normalize(g, eps=1e-8):
    """Ranger21: divide by the (unbiased) standard deviation of the whole tensor plus eps, above 2 elements."""
    n = g.numel()
    if n <= 2:
        return g.clone()
    mean = float(g.sum()) / n
    std = math.sqrt(float(((g - mean) ** 2).sum()) / (n - 1))
    return g / (std + eps)


def norm_loss_term(p, factor, eps):
    """Ranger21's norm loss gradient: 2 f (1 - 1 / (||unit|| + eps)) p, unit by unit."""
    out = torch.empty_like(p)
    if p.dim() <= 1:
        return p * (2 * factor * (1 - 1 / (math.sqrt(float((p * p).sum())) + eps)))
    for pu, ou in zip(units(p), units(out)):
        ou.copy_(pu * (2 * factor * (1 - 1 / (math.sqrt(float((pu * pu).sum())) + eps))))
    return out


class PNMAdam:
    """Positive-negative momentum (Xie et al., 2021) over an AMSGrad, softplus-smoothed Adam denominator;
    with ``belief``, the second moment of g - m_t (AdaBelief, Zhuang et al., 2020), m_t the momentum
    fed this step."""

    def __init__(self, like, betas, eps, beta0, softplus_beta=None, belief=False):
        self.m = [torch.zeros_like(like), torch.zeros_like(like)]
        self.v = torch.zeros_like(like)
        self.v_max = torch.zeros_like(like)
        self.betas, self.eps, self.beta0, self.softplus_beta, self.t = betas, eps, beta0, softplus_beta, 0
        self.belief = belief

    def direction(self, g_second_moment, g_momentum):
        b1, b2 = self.betas
        self.t += 1
        this, other = (0, 1) if self.t % 2 == 1 else (1, 0)
        self.m[this] = b1**2 * self.m[this] + (1 - b1**2) * g_momentum
        x = g_second_moment - self.m[this] if self.belief else g_second_moment
        self.v = b2 * self.v + (1 - b2) * x**2
        self.v_max = torch.maximum(self.v_max, self.v)
        denom = self.v_max.sqrt() / math.sqrt(1 - b2**self.t) + self.eps
        if self.softplus_beta is not None:
            z = self.softplus_beta * denom  # torch's softplus, which Ranger21 calls: linear above z = 20
            denom = torch.where(z > 20, denom, torch.log1p(torch.exp(z)) / self.softplus_beta)
        pnm = ((1 + self.beta0) * self.m[this] - self.beta0 * self.m[other]) / math.sqrt(
            (1 + self.beta0) ** 2 + self.beta0**2)
        return pnm / (1 - b1**self.t) / denom
