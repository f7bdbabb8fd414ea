"""Adam with L2 weight decay, and AdamW with decoupled weight decay."""
from __future__ import annotations

from gradwise.core.optimizer import Optimizer
from gradwise.core.torch_checkpoint import TorchFormat
from gradwise.core.transform import chain
from gradwise.transforms import add_decayed_weights, scale_by_adam, scale_by_learning_rate


class Adam(Optimizer):
    """Adam (Kingma & Ba, 2015): g <- g + wd p, then p <- p - lr m_hat / (sqrt(v_hat) + eps)."""

    torch_format = TorchFormat("torch.optim.Adam", group={"amsgrad": False, "decoupled_weight_decay": False})

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, *,
                 maximize=False, skip_nonfinite=False, compile="auto", state=None,
                 param_rounding="nearest"):
        transform = chain(add_decayed_weights(), scale_by_adam(), scale_by_learning_rate())
        super().__init__(params, transform, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                         maximize=maximize, skip_nonfinite=skip_nonfinite, compile=compile, state=state,
                         param_rounding=param_rounding)


class AdamW(Optimizer):
    """AdamW (Loshchilov & Hutter, 2019): p <- p - lr (m_hat / (sqrt(v_hat) + eps) + wd p)."""

    torch_format = TorchFormat("torch.optim.AdamW", group={"amsgrad": False, "decoupled_weight_decay": True})

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, *,
                 maximize=False, skip_nonfinite=False, compile="auto", state=None,
                 param_rounding="nearest"):
        transform = chain(scale_by_adam(), add_decayed_weights(), scale_by_learning_rate())
        super().__init__(params, transform, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                         maximize=maximize, skip_nonfinite=skip_nonfinite, compile=compile, state=state,
                         param_rounding=param_rounding)
