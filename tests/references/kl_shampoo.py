"""KL-Shampoo and KL-SOAP written from the paper (Lin et al., 2025, arXiv:2509.03378: the factors of the
KL minimization, each whitened by the other's inverse, eigenvalues tracked in the eigenbasis, bases
refreshed by one power iteration and QR, as the authors' code does) one block at a time in float64,
without padding: an independent reference for ``gradwise.KLShampoo`` and ``gradwise.KLSOAP``."""
from __future__ import annotations

import torch

from tests.references.soap import SOAPReference


class KLShampooReference(SOAPReference):
    soap = False

    def __init__(self, params, lr, betas=(0.9, 0.98), shampoo_beta=None, eps=1e-8, weight_decay=0.01,
                 precondition_frequency=10, max_precond_dim=10000, init_factor=0.1, max_clamp_value=4000,
                 first_bases=None):
        """SOAP's blocks, moments and options; ``first_bases``: for each parameter, the (Q_L, Q_R) of each of its
        blocks at step 1, used instead of ``eigh``'s (a rectangular block's larger factor is singular there,
        its null space's basis arbitrary)."""
        super().__init__(params, lr, betas, shampoo_beta, eps, weight_decay, precondition_frequency, max_precond_dim)
        self.o.update(init=init_factor, clamp=max_clamp_value)
        self.first_bases = first_bases
        for blocks in self.blocks:
            for b in blocks:
                b["m"] = torch.zeros_like(b["v"])

    def _first(self, b, g, given):
        o, (r, c) = self.o, g.shape
        b["L"], b["R"] = (1 - o["s"]) * g @ g.T / c, (1 - o["s"]) * g.T @ g / r
        b["QL"], b["QR"] = given or (torch.linalg.eigh(b["L"])[1].flip(1), torch.linalg.eigh(b["R"])[1].flip(1))
        b["dL"], b["dR"] = torch.full((r,), o["init"], dtype=g.dtype), torch.full((c,), o["init"], dtype=g.dtype)

    def _estimate(self, b, g):
        """The KL factor and eigenvalue updates, all from the previous bases and eigenvalues."""
        o, (r, c) = self.o, g.shape
        s = o["s"]
        inv_r = b["QR"] @ torch.diag(1 / b["dR"]) @ b["QR"].T  # S_R^-1 as the basis and eigenvalues give it
        inv_l = b["QL"] @ torch.diag(1 / b["dL"]) @ b["QL"].T
        a = b["QL"].T @ g @ b["QR"]
        diag_l = torch.diag(a @ torch.diag(1 / b["dR"]) @ a.T) / c  # diag(Q_L^T G S_R^-1 G^T Q_L) / c
        diag_r = torch.diag(a.T @ torch.diag(1 / b["dL"]) @ a) / r
        b["L"] = s * b["L"] + (1 - s) * g @ inv_r @ g.T / c
        b["R"] = s * b["R"] + (1 - s) * g.T @ inv_l @ g / r
        b["dL"] = torch.clamp(s * b["dL"] + (1 - s) * diag_l, min=max(10, min(r, o["clamp"])) ** -2.0)
        b["dR"] = torch.clamp(s * b["dR"] + (1 - s) * diag_r, min=max(10, min(c, o["clamp"])) ** -2.0)

    def _direction(self, b, g, m):
        o = self.o
        if not self.soap:
            scale = torch.outer(b["dL"], b["dR"]).sqrt() + o["eps"]
            return b["QL"] @ ((b["QL"].T @ m @ b["QR"]) / scale) @ b["QR"].T
        rotated = b["QL"].T @ g @ b["QR"]
        b["m"] = o["b1"] * b["m"] + (1 - o["b1"]) * rotated
        b["v"] = o["b2"] * b["v"] + (1 - o["b2"]) * rotated**2
        return b["QL"] @ (b["m"] / (b["v"].sqrt() + o["eps"])) @ b["QR"].T

    def _refresh(self, b):
        moment = b["QL"] @ b["m"] @ b["QR"].T
        b["QL"], b["QR"] = torch.linalg.qr(b["L"] @ b["QL"])[0], torch.linalg.qr(b["R"] @ b["QR"])[0]
        b["m"] = b["QL"].T @ moment @ b["QR"]

    def _block(self, b, gb, mb, scale, index):
        """SOAP's walk over the blocks, with the KL updates; ``scale`` (SOAP's bias correction) is not used."""
        t = self.t
        if t == 1:
            self._first(b, gb, self.first_bases and self.first_bases[index[0]][index[1]])
        direction = self._direction(b, gb, mb)
        if t > 1:
            self._estimate(b, gb)
        if t > 1 and t % self.o["f"] == 0:
            self._refresh(b)
        return direction


class KLSOAPReference(KLShampooReference):
    soap = True
