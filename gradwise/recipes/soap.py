"""SOAP: Adam in Shampoo's eigenbasis."""
from __future__ import annotations

from gradwise.core.optimizer import Optimizer
from gradwise.core.transform import chain
from gradwise.transforms import add_decayed_weights, scale_by_learning_rate
from gradwise.transforms.soap import scale_by_soap


class SOAP(Optimizer):
    """SOAP (Vyas et al., 2024, arXiv:2409.11321), with the defaults of the authors' implementation:
    p <- p - lr (soap(g) + wd p). See ``scale_by_soap`` for the update.

    Differences from the authors' implementation: the first step is taken (with the eigenbasis of the
    first gradient's factors) rather than skipped; dimensions above ``max_precond_dim`` are cut into
    blocks rather than left unrotated; weight decay is p <- p - lr wd p on the pre-step parameter.
    ``eigh_failures`` counts the bases whose ``eigh`` or QR refresh failed and kept their old value;
    ``skipped_factor_updates`` the factor updates skipped because they would have made a factor NaN
    or inf (a gradient entry of 1e30 squares past float32), each with a warning.
    """

    def __init__(self, params, lr=3e-3, betas=(0.95, 0.95), shampoo_beta=None, eps=1e-8, weight_decay=0.01,
                 precondition_frequency=10, max_precond_dim=10000, batch_blocks=True, *,
                 maximize=False, skip_nonfinite=False, compile="auto", state=None,
                 param_rounding="nearest"):
        self._soap = scale_by_soap()
        super().__init__(
            params, chain(self._soap, add_decayed_weights(), scale_by_learning_rate()), lr=lr, betas=betas,
            shampoo_beta=shampoo_beta, eps=eps, weight_decay=weight_decay,
            precondition_frequency=precondition_frequency, max_precond_dim=max_precond_dim,
            batch_blocks=batch_blocks, maximize=maximize, skip_nonfinite=skip_nonfinite, compile=compile,
            state=state, param_rounding=param_rounding)

    @property
    def eigh_failures(self) -> int:
        return self._soap.eigh_failures

    @property
    def skipped_factor_updates(self) -> int:
        """Factor updates skipped because they would have made a factor NaN or inf."""
        return self._soap.skipped_factor_updates
