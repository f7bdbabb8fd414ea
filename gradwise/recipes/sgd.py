"""SGD with momentum, dampening, Nesterov momentum and L2 weight decay (torch.optim.SGD's semantics)."""
from __future__ import annotations

from gradwise.core.optimizer import Optimizer
from gradwise.core.torch_checkpoint import TorchFormat
from gradwise.core.torch_flags import compile_for_torch_flags, fused_kernels
from gradwise.core.transform import chain
from gradwise.transforms import add_decayed_weights, scale_by_learning_rate, trace


class SGD(Optimizer):
    """Stochastic gradient descent (Robbins & Monro, 1951; Nesterov momentum: Sutskever et al., 2013).

    g <- g + wd p;  b <- mu b + (1 - dampening) g (b <- g at the first step);
    p <- p - lr (g + mu b)  (nesterov)  or  p <- p - lr b.
    torch's ``foreach``, ``fused`` and ``differentiable`` as in ``gradwise.core.torch_flags``.
    """

    torch_format = TorchFormat("torch.optim.SGD", counts_steps=False)

    def __init__(self, params, lr=1e-3, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False, *,
                 maximize=False, foreach=None, differentiable=False, fused=None, skip_nonfinite=False,
                 compile="auto", state=None, param_rounding="nearest"):
        compile = compile_for_torch_flags("SGD", compile, foreach=foreach, fused=fused, differentiable=differentiable)
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError(
                f"invalid nesterov=True with momentum={momentum!r}, dampening={dampening!r}:"
                " Nesterov momentum needs momentum > 0 and dampening = 0"
            )
        transform = chain(add_decayed_weights(), trace(), scale_by_learning_rate())
        super().__init__(params, transform, lr=lr, momentum=momentum, dampening=dampening,
                         weight_decay=weight_decay, nesterov=nesterov, maximize=maximize,
                         skip_nonfinite=skip_nonfinite, compile=compile, state=state,
                         param_rounding=param_rounding)
        fused_kernels(self, fused)
