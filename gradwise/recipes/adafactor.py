"""Adafactor, as torch.optim.Adafactor computes it."""
from __future__ import annotations

from gradwise.core.optimizer import Optimizer
from gradwise.core.torch_checkpoint import TorchFormat
from gradwise.core.torch_flags import compile_for_torch_flags
from gradwise.core.transform import chain
from gradwise.transforms.factored import (
    clip_by_block_rms,
    scale_by_factored_rms,
    scale_by_param_block_rms,
    scale_by_relative_step,
)
from gradwise.transforms.weight_decay import add_decayed_weights


class Adafactor(Optimizer):
    """Adafactor (Shazeer & Stern, 2018, arXiv:1804.04235) with torch.optim.Adafactor's arguments,
    defaults and numbers: a factored second moment for tensors of two or more dimensions (row and
    column means over the last two), a full one for the others.

    At step t:  U = g / max(sqrt(V_t), eps1)  (``scale_by_factored_rms``, decay 1 - t^beta2_decay);
    U <- U / max(1, rms(U) / d)  (``clip_by_block_rms``);
    p <- p - min(lr, 1/sqrt(t)) max(eps2, rms(p)) U - lr wd p.
    ``foreach`` is accepted and has no effect (``gradwise.core.torch_flags``).
    """

    torch_format = TorchFormat("torch.optim.Adafactor")

    def __init__(self, params, lr=1e-2, beta2_decay=-0.8, eps=(None, 1e-3), d=1.0, weight_decay=0.0, *,
                 foreach=None, maximize=False, skip_nonfinite=False, compile="auto", state=None,
                 param_rounding="nearest"):
        compile = compile_for_torch_flags("Adafactor", compile, foreach=foreach)
        transform = chain(scale_by_factored_rms(), clip_by_block_rms("d"), scale_by_param_block_rms(),
                          scale_by_relative_step(), add_decayed_weights(after_lr=True))
        super().__init__(params, transform, lr=lr, beta2_decay=beta2_decay, eps=tuple(eps) if isinstance(eps, list)
                         else eps, d=d, weight_decay=weight_decay, maximize=maximize,
                         skip_nonfinite=skip_nonfinite, compile=compile, state=state,
                         param_rounding=param_rounding)
