"""KL-Shampoo and KL-SOAP: Shampoo's and SOAP's factors estimated by KL minimization."""
from __future__ import annotations

from gradwise.core.optimizer import Optimizer
from gradwise.core.transform import chain
from gradwise.transforms import add_decayed_weights, scale_by_learning_rate
from gradwise.transforms.kl_shampoo import KLFactors, scale_by_kl_shampoo
from gradwise.transforms.kl_soap import scale_by_kl_soap


class KLShampoo(Optimizer):
    """KL-Shampoo (Lin et al., 2025, arXiv:2509.03378), with the defaults of the authors' code (lr=1e-4 is its
    placeholder; the paper tunes lr): p <- p - lr (kl_shampoo(g) + wd p). See ``scale_by_kl_shampoo`` and
    ``KLFactors`` for the update and the differences from the authors' code. No Adam and no grafting state
    for matrices: a first moment, two factors, two bases and two eigenvalue vectors per block.
    ``eigh_failures`` and ``skipped_factor_updates`` count as in ``gradwise.SOAP``.
    """

    core: type[KLFactors] = scale_by_kl_shampoo

    def __init__(self, params, lr=1e-4, betas=(0.9, 0.98), shampoo_beta=None, eps=1e-8, weight_decay=0.01,
                 precondition_frequency=10, max_precond_dim=10000, init_factor=0.1, max_clamp_value=4000,
                 batch_blocks=True, *, maximize=False, skip_nonfinite=False, compile="auto", state=None,
                 param_rounding="nearest"):
        self._core = self.core()
        super().__init__(
            params, chain(self._core, add_decayed_weights(), scale_by_learning_rate()), lr=lr, betas=betas,
            shampoo_beta=shampoo_beta, eps=eps, weight_decay=weight_decay,
            precondition_frequency=precondition_frequency, max_precond_dim=max_precond_dim, init_factor=init_factor,
            max_clamp_value=max_clamp_value, batch_blocks=batch_blocks, maximize=maximize,
            skip_nonfinite=skip_nonfinite, compile=compile, state=state, param_rounding=param_rounding)

    @property
    def eigh_failures(self) -> int:
        return self._core.eigh_failures

    @property
    def skipped_factor_updates(self) -> int:
        """Factor updates skipped because they would have made a factor NaN or inf."""
        return self._core.skipped_factor_updates


class KLSOAP(KLShampoo):
    """KL-SOAP (Lin et al., 2025, arXiv:2509.03378): KL-Shampoo's factors, Adam in their eigenbasis (see
    ``scale_by_kl_soap``), with the same arguments and defaults as ``KLShampoo`` (those of the authors' code,
    which runs both)."""

    core = scale_by_kl_soap
