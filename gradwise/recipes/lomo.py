"""LOMO and AdaLomo: optimizers meant to update each parameter inside backward (see
``gradwise.fused_backward``), so that neither a full set of gradients nor (LOMO) any state is kept."""
from __future__ import annotations

from gradwise.core.fused_backward import fused_backward as install_fused_backward
from gradwise.core.hyper import Hyper, boolean, positive
from gradwise.core.optimizer import Optimizer
from gradwise.core.transform import chain
from gradwise.transforms.adalomo import EPS, scale_by_adalomo
from gradwise.transforms.clipping import clip_by_value
from gradwise.transforms.factored import clip_by_block_rms, scale_by_param_block_rms
from gradwise.transforms.learning_rate import scale_by_learning_rate
from gradwise.transforms.weight_decay import add_decayed_weights


def _check_guard(name: str, fused_backward, skip_nonfinite) -> None:
    boolean("fused_backward", fused_backward)
    boolean("skip_nonfinite", skip_nonfinite)
    if fused_backward and skip_nonfinite:
        raise ValueError(f"{name}(skip_nonfinite=True) needs fused_backward=False: inside backward each parameter"
                         " steps as soon as its own gradient is complete, before the gradients that decide"
                         " whether to skip the step exist; with fused_backward=False, step() skips a step whose"
                         " gradients hold NaN or inf")


class LOMO(Optimizer):
    """LOMO, LOw-Memory Optimization (Lv et al. 2023, arXiv:2306.09782): SGD inside backward.

        g <- clamp(g, -clip_grad_value, clip_grad_value)  (when clip_grad_value is set);
        p <- p - lr (g + weight_decay p)

    ``fused_backward=True`` (the default) installs ``gradwise.fused_backward`` on construction: each
    parameter steps as soon as its gradient is complete and the gradient is freed; the handle is
    ``optimizer.fused_backward`` (``.remove()`` to stop). LOMO's gradient-norm clipping is not offered:
    the norm of all gradients exists only after the whole backward, so its package runs backward
    twice (once for the norm, once for the update); value clipping needs no second pass. fp16 loss
    scaling is not built either; train bf16 parameters with ``param_rounding="stochastic"`` instead.
    ``skip_nonfinite=True`` needs ``fused_backward=False`` (the skip is decided from every gradient).
    """

    def __init__(self, params, lr=1e-3, clip_grad_value=None, weight_decay=0.0, *, fused_backward=True,
                 maximize=False, skip_nonfinite=False, compile="auto", state=None, param_rounding="nearest"):
        _check_guard(type(self).__name__, fused_backward, skip_nonfinite)
        transform = chain(clip_by_value(), add_decayed_weights(), scale_by_learning_rate())
        super().__init__(params, transform, lr=lr, clip_grad_value=0.0 if clip_grad_value is None else clip_grad_value,
                         weight_decay=weight_decay, maximize=maximize, skip_nonfinite=skip_nonfinite,
                         compile=compile, state=state, param_rounding=param_rounding)
        self.fused_backward = install_fused_backward(self) if fused_backward else None


class AdaLomo(Optimizer):
    """AdaLomo (Lv et al. 2023, "AdaLomo: Low-memory Optimization with Adaptive Learning Rate",
    arXiv:2310.10195), as its package ``lomo-optim`` 0.1.1 computes it, at step t:

        g <- clamp(g, -clip_grad_value, clip_grad_value)  (when clip_grad_value is set);
        u <- g / sqrt(v_hat_t)      (``scale_by_adalomo``: v factored into rows and columns for
                                     tensors of 2+ dimensions, beta_t = 1 - t^decay_rate);
        u <- u / max(1, rms(u) / clip_threshold)    (grouped update normalization);
        p <- p - lr max(eps2, rms(p)) (u + weight_decay p)

    ``fused_backward=True`` (the default) updates each parameter inside backward, as ``LOMO``. The
    package's global gradient-norm clipping (a second backward) and fp16 loss scaling are not built.
    Tensors of more than two dimensions are factored over their last two (the package handles only
    matrices); 0-d and 1-d tensors keep a full second moment.
    """

    def __init__(self, params, lr=1e-3, eps=(1e-30, 1e-3), clip_threshold=1.0, decay_rate=-0.8,
                 clip_grad_value=None, weight_decay=0.0, *, fused_backward=True, maximize=False, skip_nonfinite=False,
                 compile="auto", state=None, param_rounding="nearest"):
        _check_guard(type(self).__name__, fused_backward, skip_nonfinite)
        transform = chain(clip_by_value(), scale_by_adalomo(),
                          clip_by_block_rms("clip_threshold", Hyper(1.0, positive)), add_decayed_weights(),
                          scale_by_param_block_rms(EPS), scale_by_learning_rate())
        super().__init__(params, transform, lr=lr, eps=eps, clip_threshold=clip_threshold, decay_rate=decay_rate,
                         clip_grad_value=0.0 if clip_grad_value is None else clip_grad_value,
                         weight_decay=weight_decay, maximize=maximize, skip_nonfinite=skip_nonfinite,
                         compile=compile, state=state, param_rounding=param_rounding)
        self.fused_backward = install_fused_backward(self) if fused_backward else None
