"""NAdamW: NAdam with decoupled weight decay, the AlgoPerf baseline family."""
from __future__ import annotations

from gradwise.core.hyper import boolean
from gradwise.core.optimizer import Optimizer
from gradwise.core.torch_checkpoint import TorchFormat
from gradwise.core.torch_flags import compile_for_torch_flags
from gradwise.core.transform import chain
from gradwise.transforms import add_decayed_weights, scale_by_learning_rate, scale_by_nadam


class NAdamW(Optimizer):
    """NAdam (Dozat, 2016) with decoupled weight decay; equals
    ``torch.optim.NAdam(..., decoupled_weight_decay=True)`` step by step.

    p <- p - lr (nadam(g) + wd p), with ``momentum_decay`` psi scheduling mu_t = b1 (1 - 0.5 * 0.96^(t psi)).
    ``decoupled_weight_decay=False`` is torch.optim.NAdam's default, L2 decay: g <- g + wd p before NAdam.
    torch's ``foreach``, ``capturable`` and ``differentiable`` as in ``gradwise.core.torch_flags``.
    """

    def __init__(self, params, lr=2e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, momentum_decay=4e-3,
                 decoupled_weight_decay=True, *, foreach=None, maximize=False, capturable=False,
                 differentiable=False, skip_nonfinite=False, compile="auto", state=None, param_rounding="nearest"):
        compile = compile_for_torch_flags("NAdamW", compile, foreach=foreach, differentiable=differentiable,
                                          capturable=capturable)
        boolean("decoupled_weight_decay", decoupled_weight_decay)
        self.torch_format = TorchFormat("torch.optim.NAdam", group={"decoupled_weight_decay": decoupled_weight_decay})
        if decoupled_weight_decay:
            transform = chain(scale_by_nadam(), add_decayed_weights(), scale_by_learning_rate())
        else:
            transform = chain(add_decayed_weights(), scale_by_nadam(), scale_by_learning_rate())
        super().__init__(params, transform, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                         momentum_decay=momentum_decay, maximize=maximize, skip_nonfinite=skip_nonfinite,
                         compile=compile, state=state, param_rounding=param_rounding)
