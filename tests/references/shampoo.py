"""Blocked Shampoo with grafting, written from the papers (Gupta et al., 2018; Anil et al., 2020; Shi
et al., 2023) one block at a time in float64, without padding: an independent reference for
``gradwise.Shampoo``."""
from __future__ import annotations

import math

import torch


def inverse_fourth_root(a: torch.Tensor, eps: float) -> torch.Tensor:
    lam, q = torch.linalg.eigh(a + eps * torch.eye(a.shape[0], dtype=a.dtype))
    return q @ torch.diag(lam.clamp(min=eps) ** -0.25) @ q.T


class ShampooReference:
    def __init__(self, params, lr, betas=(0.9, 0.999), epsilon=1e-12, weight_decay=1e-5, max_preconditioner_dim=8192,
                 precondition_frequency=100, start_preconditioning_step=None, use_decoupled_weight_decay=True,
                 grafting="adam", grafting_beta2=0.999, grafting_epsilon=1e-8):
        self.params = list(params)
        self.o = dict(lr=lr, b1=betas[0], b2=betas[1], eps=epsilon, wd=weight_decay, dim=max_preconditioner_dim,
                      f=precondition_frequency, start=start_preconditioning_step or precondition_frequency,
                      decoupled=use_decoupled_weight_decay, grafting=grafting, bg=grafting_beta2,
                      eps_g=grafting_epsilon)
        self.t = 0
        self.m = [torch.zeros_like(p) for p in self.params]
        self.v = [torch.zeros_like(p) for p in self.params]
        self.blocks = [self._blocks(p) for p in self.params]

    def _blocks(self, p):
        if p.dim() < 2 or p.numel() == 0:
            return []
        rows, cols = p.shape[0], math.prod(p.shape[1:])
        out = []
        dr, dc = block_run(rows, self.o["dim"]), block_run(cols, self.o["dim"])
        for r in range(0, rows, dr):
            for c in range(0, cols, dc):
                nr, nc = min(dr, rows - r), min(dc, cols - c)
                out.append(dict(rows=slice(r, r + nr), cols=slice(c, c + nc), L=torch.zeros(nr, nr, dtype=p.dtype),
                                R=torch.zeros(nc, nc, dtype=p.dtype), PL=None, PR=None))
        return out

    @torch.no_grad()
    def step(self):
        o = self.o
        self.t += 1
        t = self.t
        for p, m, v, blocks in zip(self.params, self.m, self.v, self.blocks):
            g = p.grad.clone()
            if not o["decoupled"]:
                g = g + o["wd"] * p
            m.copy_(o["b1"] * m + (1 - o["b1"]) * g)
            m_hat = m / (1 - o["b1"] ** t)
            if o["grafting"] == "adagrad":
                v.add_(g * g)
            elif o["grafting"] in ("adam", "rmsprop"):
                v.copy_(o["bg"] * v + (1 - o["bg"]) * g * g)
            if o["grafting"] == "sgd":
                graft = m_hat
            else:
                v_hat = v / (1 - o["bg"] ** t) if o["grafting"] == "adam" else v
                graft = m_hat / (v_hat.sqrt() + o["eps_g"])
            direction = graft.clone()
            if blocks:
                g2, m2, d2 = (x.reshape(p.shape[0], -1) for x in (g, m_hat, direction))
                graft2 = graft.reshape(p.shape[0], -1)
                for b in blocks:
                    gb = g2[b["rows"], b["cols"]]
                    if o["b2"] == 1:
                        b["L"] += gb @ gb.T
                        b["R"] += gb.T @ gb
                    else:
                        b["L"] = o["b2"] * b["L"] + (1 - o["b2"]) * gb @ gb.T
                        b["R"] = o["b2"] * b["R"] + (1 - o["b2"]) * gb.T @ gb
                    if t >= o["start"] and (t - o["start"]) % o["f"] == 0:
                        bias = 1 - o["b2"] ** t if o["b2"] < 1 else 1.0
                        b["PL"] = inverse_fourth_root(b["L"] / bias, o["eps"])
                        b["PR"] = inverse_fourth_root(b["R"] / bias, o["eps"])
                    if t >= o["start"]:
                        s = b["PL"] @ m2[b["rows"], b["cols"]] @ b["PR"]
                        gn = graft2[b["rows"], b["cols"]].norm()
                        d2[b["rows"], b["cols"]] = s * (gn / s.norm()) if s.norm() > 0 else graft2[b["rows"], b["cols"]]
            if o["decoupled"]:
                direction = direction + o["wd"] * p
            p.sub_(o["lr"] * direction)


def block_run(length: int, max_dim: int) -> int:
    """Blocks of a side: ceil(length / max_dim) runs of equal length, the last one shorter."""
    return math.ceil(length / math.ceil(length / max_dim))
