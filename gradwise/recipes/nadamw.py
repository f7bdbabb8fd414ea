"""NAdamW: NAdam with decoupled weight decay, the AlgoPerf baseline family."""
from __future__ import annotations

from gradwise.core.optimizer import Optimizer
from gradwise.core.torch_checkpoint import TorchFormat
from gradwise.core.transform import chain
from gradwise.transforms import add_decayed_weights, scale_by_learning_rate, scale_by_nadam


class NAdamW(Optimizer):
    """NAdam (Dozat, 2016) with decoupled weight decay; equals
    ``torch.optim.NAdam(..., decoupled_weight_decay=True)`` step by step.

    p <- p - lr (nadam(g) + wd p), with ``momentum_decay`` psi scheduling mu_t = b1 (1 - 0.5 * 0.96^(t psi)).
    """

    torch_format = TorchFormat("torch.optim.NAdam", group={"decoupled_weight_decay": True})

    def __init__(self, params, lr=2e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, momentum_decay=4e-3,
                 *, maximize=False, skip_nonfinite=False, compile="auto", state=None,
                 param_rounding="nearest"):
        transform = chain(scale_by_nadam(), add_decayed_weights(), scale_by_learning_rate())
        super().__init__(params, transform, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                         momentum_decay=momentum_decay, maximize=maximize, skip_nonfinite=skip_nonfinite,
                         compile=compile, state=state,
                         param_rounding=param_rounding)
