"""Muon for matrices, AdamW for everything else, in one optimizer."""
from __future__ import annotations

import torch

from gradwise.core.optimizer import Optimizer
from gradwise.core.torch_checkpoint import TorchFormat
from gradwise.core.transform import chain
from gradwise.transforms import add_decayed_weights, scale_by_adam, scale_by_learning_rate
from gradwise.transforms.momentum import trace_ema
from gradwise.transforms.newton_schulz import (
    MUON_COEFFICIENTS,
    orthogonalize_by_newton_schulz,
    scale_by_shape,
)
from gradwise.transforms.polar_express import as_schedule
from gradwise.transforms.route import matrices, route


class Muon(Optimizer):
    """Muon (Jordan et al., 2024; https://kellerjordan.github.io/posts/muon/), a drop-in for
    ``torch.optim.Muon``: the same arguments and defaults for the matrices, and step by step the same
    result on them. Unlike torch's, it accepts every parameter: ``rule(name, param)`` (default
    ``route.matrices``: 2-D parameters except embeddings and heads, by name) sends each one to
    ``"matrix"`` (Muon) or ``"other"`` (AdamW with the ``adamw_*`` hyperparameters).

    Matrices:  B <- mu B + (1-mu) G;  U <- (1-mu) G + mu B (nesterov) or B;
    O <- NS_5(U) (quintic Newton-Schulz in ``ns_dtype``, same-shaped matrices batched; ``ns_coefficients``
    one (a, b, c), a schedule of them, one per iteration, or ``"polar_express"``: Amsel et al., 2025);
    W <- W - lr (s O + wd W), with s = sqrt(max(1, A/B)) for an A x B matrix (``adjust_lr_fn``).
    Others: AdamW with ``adamw_lr`` and ``adamw_betas``, ``adamw_eps``, ``adamw_weight_decay``.
    LR schedulers that cycle momentum (OneCycleLR, CyclicLR) cycle ``momentum``, as for torch.optim.Muon.
    ``state``: the storage of the momentum buffer and AdamW's moments (``"bf16"``, ``"int8"``, ...),
    as for AdamW; each parameter is decoded, stepped by its route's chain and encoded again.
    """

    #: torch.optim.Muon for the matrices, torch.optim.AdamW for the rest (torch keeps them in two optimizers)
    torch_format = {"matrix": TorchFormat("torch.optim.Muon", counts_steps=False),
                    "other": TorchFormat("torch.optim.AdamW", group={"decoupled_weight_decay": True})}

    def __init__(self, params, lr=1e-3, weight_decay=0.1, momentum=0.95, nesterov=True,
                 ns_coefficients=MUON_COEFFICIENTS, eps=1e-7, ns_steps=5, adjust_lr_fn=None, *,
                 adamw_lr=3e-4, adamw_betas=(0.9, 0.95), adamw_eps=1e-8, adamw_weight_decay=0.0,
                 ns_dtype=torch.bfloat16, rule=matrices, maximize=False, skip_nonfinite=False, compile="auto",
                 state=None, param_rounding="nearest"):
        muon = chain(trace_ema(), orthogonalize_by_newton_schulz(), scale_by_shape(), add_decayed_weights(),
                     scale_by_learning_rate())
        adamw = chain(scale_by_adam(), add_decayed_weights(), scale_by_learning_rate())
        transform = route(
            rule,
            matrix=(muon, dict(lr=lr, weight_decay=weight_decay, momentum=momentum, nesterov=nesterov,
                               ns_coefficients=as_schedule(ns_coefficients), eps=eps, ns_steps=ns_steps,
                               adjust_lr_fn=adjust_lr_fn, ns_dtype=ns_dtype)),
            other=(adamw, dict(lr=adamw_lr, betas=adamw_betas, eps=adamw_eps, weight_decay=adamw_weight_decay)),
        )
        super().__init__(params, transform, maximize=maximize, skip_nonfinite=skip_nonfinite, compile=compile,
                         state=state, param_rounding=param_rounding)
        # torch's schedulers cycle defaults' "betas" if it is there, else "momentum": with the AdamW
        # route's betas (which live in its own groups) out of the defaults, they cycle the matrices'
        # momentum, as they do torch.optim.Muon's
        del self.defaults["betas"]
