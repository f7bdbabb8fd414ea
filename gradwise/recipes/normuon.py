"""NorMuon: Muon with a second moment per neuron for matrices, AdamW for everything else."""
from __future__ import annotations

import torch

from gradwise.core.optimizer import Optimizer
from gradwise.core.transform import chain
from gradwise.transforms import add_decayed_weights, scale_by_adam, scale_by_learning_rate
from gradwise.transforms.momentum import trace_ema
from gradwise.transforms.newton_schulz import MUON_COEFFICIENTS, orthogonalize_by_newton_schulz
from gradwise.transforms.normuon import scale_by_neuron_second_moment
from gradwise.transforms.polar_express import as_schedule
from gradwise.transforms.route import matrices, route


class NorMuon(Optimizer):
    """NorMuon (Li et al., 2025, arXiv:2510.05491); equals ``pytorch_optimizer.NorMuon``, with its arguments
    and defaults, and routes by ``rule`` (default ``route.matrices``) instead of ``use_muon`` groups.

    Matrices:  B <- mu B + (1-mu) G;  U <- (1-mu) G + mu B (nesterov) or B;  O <- NS_5(U) (in ``ns_dtype``);
    P <- scale_by_neuron_second_moment(O) (v per row, ``beta2``, ``eps``, ``update_scale``);  W <- W - lr (P + wd W).
    Others: AdamW with ``adamw_lr``, ``adamw_betas``, ``adamw_eps``, ``adamw_wd``. ``ns_coeffs``: one (a, b, c),
    a schedule, or ``"polar_express"`` (the paper's Algorithm 1; pytorch-optimizer's preset of that name is
    another derivation). The paper's Algorithm 1 is ``update_scale="match_rms", nesterov=False``.
    pytorch-optimizer's ``weight_decouple=False`` (L2 decay) and ``foreach`` are not offered.
    """

    def __init__(self, params, lr=2e-2, momentum=0.95, beta2=0.95, weight_decay=0.0, nesterov=True, ns_steps=5,
                 ns_coeffs=MUON_COEFFICIENTS, update_scale="preserve_norm", use_adjusted_lr=False, adamw_lr=3e-4,
                 adamw_betas=(0.9, 0.95), adamw_wd=0.0, adamw_eps=1e-10, eps=1e-10, *, ns_dtype=torch.bfloat16,
                 rule=matrices, maximize=False, skip_nonfinite=False, compile="auto", state=None,
                 param_rounding="nearest"):
        normuon = chain(trace_ema(), orthogonalize_by_newton_schulz(eps="ns_eps"), scale_by_neuron_second_moment(),
                        add_decayed_weights(), scale_by_learning_rate())
        adamw = chain(scale_by_adam(), add_decayed_weights(), scale_by_learning_rate())
        transform = route(
            rule,
            matrix=(normuon, dict(lr=lr, momentum=momentum, beta2=beta2, weight_decay=weight_decay, nesterov=nesterov,
                                  ns_steps=ns_steps, ns_coefficients=as_schedule(ns_coeffs), update_scale=update_scale,
                                  use_adjusted_lr=use_adjusted_lr, eps=eps, ns_dtype=ns_dtype)),
            other=(adamw, dict(lr=adamw_lr, betas=adamw_betas, eps=adamw_eps, weight_decay=adamw_wd)),
        )
        super().__init__(params, transform, maximize=maximize, skip_nonfinite=skip_nonfinite, compile=compile,
                         state=state, param_rounding=param_rounding)
        del self.defaults["betas"]  # so that schedulers that cycle momentum cycle the matrices' (as for Muon)
