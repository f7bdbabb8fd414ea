"""Adam with L2 weight decay, and AdamW with decoupled weight decay, with torch.optim's keywords."""
from __future__ import annotations

from gradwise.core.hyper import boolean
from gradwise.core.optimizer import Optimizer
from gradwise.core.torch_checkpoint import TorchFormat
from gradwise.core.torch_flags import compile_for_torch_flags, fused_kernels
from gradwise.core.transform import Chain, Transform, chain
from gradwise.transforms import add_decayed_weights, scale_by_adam, scale_by_learning_rate


def decayed_chain(core: Transform, decoupled: bool, argument: str = "decoupled_weight_decay") -> Chain:
    """``core`` then the step size, with weight decay before ``core`` (L2) or after it (decoupled, AdamW's);
    ``argument`` names the recipe's flag in the error a non-boolean gets."""
    boolean(argument, decoupled)
    if decoupled:
        return chain(core, add_decayed_weights(), scale_by_learning_rate())
    return chain(add_decayed_weights(), core, scale_by_learning_rate())


def adam_chain(decoupled_weight_decay: bool) -> Chain:
    """Adam's chain: weight decay before the preconditioner (L2) or after it (decoupled, AdamW)."""
    return decayed_chain(scale_by_adam(), decoupled_weight_decay)


class Adam(Optimizer):
    """Adam (Kingma & Ba, 2015): g <- g + wd p, then p <- p - lr m_hat / (sqrt(v_hat) + eps).

    torch.optim.Adam's arguments and defaults: ``amsgrad`` (AMSGrad's max of v, a param-group entry),
    ``decoupled_weight_decay=True`` (AdamW's decay), ``foreach``, ``fused``, ``capturable``,
    ``differentiable`` (``gradwise.core.torch_flags``: ``fused=True`` runs torch's fused kernel on CPU float
    parameters, else the compiled step).
    """

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, amsgrad=False, *,
                 foreach=None, maximize=False, capturable=False, differentiable=False, fused=None,
                 decoupled_weight_decay=False, skip_nonfinite=False, compile="auto", state=None,
                 param_rounding="nearest"):
        compile = compile_for_torch_flags("Adam", compile, foreach=foreach, fused=fused,
                                          differentiable=differentiable, capturable=capturable)
        transform = adam_chain(decoupled_weight_decay)
        self.torch_format = TorchFormat("torch.optim.Adam", group={"decoupled_weight_decay": decoupled_weight_decay})
        super().__init__(params, transform, lr=lr, betas=betas, eps=eps,
                         weight_decay=weight_decay, amsgrad=amsgrad, maximize=maximize,
                         skip_nonfinite=skip_nonfinite, compile=compile, state=state, param_rounding=param_rounding)
        fused_kernels(self, fused)


class AdamW(Optimizer):
    """AdamW (Loshchilov & Hutter, 2019): p <- p - lr (m_hat / (sqrt(v_hat) + eps) + wd p).

    torch.optim.AdamW's arguments and defaults, ``amsgrad`` and torch's implementation keywords as for ``Adam``.
    """

    torch_format = TorchFormat("torch.optim.AdamW", group={"decoupled_weight_decay": True})

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, amsgrad=False, *,
                 maximize=False, foreach=None, capturable=False, differentiable=False, fused=None,
                 skip_nonfinite=False, compile="auto", state=None, param_rounding="nearest"):
        compile = compile_for_torch_flags("AdamW", compile, foreach=foreach, fused=fused,
                                          differentiable=differentiable, capturable=capturable)
        super().__init__(params, adam_chain(True), lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                         amsgrad=amsgrad, maximize=maximize, skip_nonfinite=skip_nonfinite, compile=compile,
                         state=state, param_rounding=param_rounding)
        fused_kernels(self, fused)
