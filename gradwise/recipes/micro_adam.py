"""MicroAdam: AdamW's step from a window of Top-K sparse gradients with 4-bit error feedback (Modoranu et al.
2024, arXiv:2405.15593; LITERATURE.md ¶64)."""
from __future__ import annotations

from gradwise.core.optimizer import Optimizer
from gradwise.core.transform import chain
from gradwise.transforms.learning_rate import scale_by_learning_rate
from gradwise.transforms.micro_adam import scale_by_micro_adam
from gradwise.transforms.weight_decay import add_decayed_weights


class MicroAdam(Optimizer):
    """MicroAdam, with the authors' arguments (``ista_daslab_optimizers.MicroAdam``: window ``m``, Top-K density
    ``k_init``, ``quant_block_size``) and defaults: u = ``scale_by_micro_adam`` (Adam's moments from the last m
    sparse gradients, the rest of each gradient fed back in 4 bits), p <- p (1 - lr wd) - lr u. State per
    parameter of d elements: 4 m k bytes of window (k = ceil(k_init d)), d / 2 bytes of error, 2 floats per
    quantization block; ~0.9 bytes per element at the defaults, against AdamW's 8.
    """

    state_refusal = "its window and error feedback are already compressed, and not shaped like the parameter"

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, m=10, k_init=0.01,
                 quant_block_size=100_000, *, maximize=False, skip_nonfinite=False, compile="auto", state=None,
                 param_rounding="nearest"):
        transform = chain(scale_by_micro_adam(), add_decayed_weights(), scale_by_learning_rate())
        super().__init__(params, transform, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, m=m,
                         k_init=k_init, quant_block_size=quant_block_size, maximize=maximize,
                         skip_nonfinite=skip_nonfinite, compile=compile, state=state, param_rounding=param_rounding)
