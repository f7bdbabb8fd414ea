"""SOAP written from the paper (Vyas et al., 2024, arXiv:2409.11321, with the eigenbasis refresh of the
authors' implementation: one power iteration and QR) one block at a time in float64, without padding:
an independent reference for ``gradwise.SOAP``."""
from __future__ import annotations

import math

import torch

from tests.references.shampoo import block_run


class SOAPReference:
    def __init__(self, params, lr, betas=(0.95, 0.95), shampoo_beta=None, eps=1e-8, weight_decay=0.01,
                 precondition_frequency=10, max_precond_dim=10000):
        self.params = list(params)
        self.o = dict(lr=lr, b1=betas[0], b2=betas[1], s=betas[1] if shampoo_beta is None else shampoo_beta, eps=eps,
                      wd=weight_decay, f=precondition_frequency, d=max_precond_dim)
        self.t = 0
        self.m = [torch.zeros_like(p) for p in self.params]
        self.v = [torch.zeros_like(p) for p in self.params]  # for parameters without blocks
        self.blocks = []
        for p in self.params:
            blocks = []
            if p.dim() >= 2 and p.numel():
                rows, cols = p.shape[0], math.prod(p.shape[1:])
                dr, dc = block_run(rows, max_precond_dim), block_run(cols, max_precond_dim)
                for r in range(0, rows, dr):
                    for c in range(0, cols, dc):
                        nr, nc = min(dr, rows - r), min(dc, cols - c)
                        blocks.append(dict(rows=slice(r, r + nr), cols=slice(c, c + nc),
                                           v=torch.zeros(nr, nc, dtype=p.dtype),
                                           L=torch.zeros(nr, nr, dtype=p.dtype), R=torch.zeros(nc, nc, dtype=p.dtype)))
            self.blocks.append(blocks)

    def _accumulate(self, b, g):
        s = self.o["s"]
        b["L"] = s * b["L"] + (1 - s) * g @ g.T
        b["R"] = s * b["R"] + (1 - s) * g.T @ g

    @torch.no_grad()
    def step(self):
        o = self.o
        self.t += 1
        t = self.t
        scale = math.sqrt(1 - o["b2"] ** t) / (1 - o["b1"] ** t)
        for j, (p, m, v, blocks) in enumerate(zip(self.params, self.m, self.v, self.blocks)):
            g = p.grad.clone()
            m.copy_(o["b1"] * m + (1 - o["b1"]) * g)
            if not blocks:
                v.copy_(o["b2"] * v + (1 - o["b2"]) * g * g)
                p.sub_(o["lr"] * (scale * m / (v.sqrt() + o["eps"]) + o["wd"] * p))
                continue
            g2, m2 = g.reshape(p.shape[0], -1), m.reshape(p.shape[0], -1)
            direction = torch.zeros_like(g2)
            for n, b in enumerate(blocks):
                rows, cols = b["rows"], b["cols"]
                direction[rows, cols] = self._block(b, g2[rows, cols], m2[rows, cols], scale, (j, n))
            p.sub_(o["lr"] * (direction.reshape(p.shape) + o["wd"] * p))

    def _block(self, b, gb, mb, scale, index):
        """The direction of block ``b`` (gradient ``gb``, first moment ``mb``), its statistics updated; ``index``:
        (parameter, block)."""
        o, t = self.o, self.t
        if t == 1:
            self._accumulate(b, gb)
            b["QL"] = torch.linalg.eigh(b["L"])[1].flip(1)
            b["QR"] = torch.linalg.eigh(b["R"])[1].flip(1)
        rotated = b["QL"].T @ gb @ b["QR"]
        b["v"] = o["b2"] * b["v"] + (1 - o["b2"]) * rotated**2
        adam = (b["QL"].T @ mb @ b["QR"]) / (b["v"].sqrt() + o["eps"])
        direction = scale * (b["QL"] @ adam @ b["QR"].T)
        if t > 1:
            self._accumulate(b, gb)
        if t > 1 and t % o["f"] == 0:
            for side, factor in (("QL", "L"), ("QR", "R")):
                q = b[side]
                order = torch.argsort(torch.diag(q.T @ b[factor] @ q), descending=True)
                q = q[:, order]
                b["v"] = b["v"][order, :] if side == "QL" else b["v"][:, order]
                b[side] = torch.linalg.qr(b[factor] @ q)[0]
        return direction
