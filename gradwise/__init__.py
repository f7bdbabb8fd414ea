"""gradwise: composable, memory-lean, fast optimizers for PyTorch.

Every optimizer is a short chain of small transforms, run as one fused pass per parameter bucket,
behind a drop-in ``torch.optim.Optimizer``::

    from gradwise import AdamW
    optimizer = AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)

or by name, from a config: ``gradwise.create("adamw", model, lr=3e-4, weight_decay_exclude=True)``.

The public names below are imported on first use (PEP 562), so that importing one layer
(``gradwise.core.transform``) loads that layer only; subpackages (``gradwise.recipes``) load the same way.
"""
from __future__ import annotations

import importlib
from typing import Any

from gradwise.core.storage import register_storage

__version__ = "0.1.0"

#: the module each public name is imported from.
_EXPORTS = {
    "gradwise.by_name": ("create", "optimizer_class", "optimizer_names"),
    "gradwise.core.fused_backward": ("fused_backward",),
    "gradwise.distributed": ("DeMo", "DiLoCo"),
    "gradwise.core.hyper": ("Hyper",),
    "gradwise.core.optimizer": ("Optimizer",),
    "gradwise.core.transform": ("Chain", "Context", "Transform", "chain"),
    "gradwise.recipes": ("CAME", "LOMO", "SGD", "SOAP", "Adafactor", "AdaLomo", "Adam", "AdamMini", "AdamW", "Lion",
                         "Lookahead", "Muon", "NAdamW", "Ranger21", "ScheduleFreeAdamW", "ScheduleFreeSGD", "Shampoo",
                         "schedule_free"),
    "gradwise.recipes.adopt": ("ADOPT",),
    "gradwise.recipes.ademamix": ("AdEMAMix",),
    "gradwise.recipes.mars": ("MARS",),
    "gradwise.recipes.normuon": ("NorMuon",),
    "gradwise.recipes.spam": ("SPAM",),
    "gradwise.recipes.adamc": ("AdamC",),
    "gradwise.recipes.apollo": ("APOLLO", "APOLLOMini"),
    "gradwise.recipes.galore": ("GaLoreAdamW",),
    "gradwise.recipes.mezo": ("MeZO",),
    "gradwise.recipes.frugal": ("FRUGAL",),
    "gradwise.recipes.subset_norm": ("SubsetNorm",),
    "gradwise.recipes.micro_adam": ("MicroAdam",),
    "gradwise.recipes.badam": ("BAdam",),
    "gradwise.recipes.psgd_kron": ("PSGDKron",),
    "gradwise.qk_clip": ("qk_clip",),
    "gradwise.recipes.kl_shampoo": ("KLShampoo", "KLSOAP"),
    "gradwise.state": ("StatePolicy",),
    "gradwise.state.estimate": ("estimate",),
    "gradwise.state.sharded_estimate": ("estimate_sharded",),
    "gradwise.transforms": ("add_decayed_weights", "lookahead", "orthogonalize_by_newton_schulz", "route",
                            "scale_by_adam", "scale_by_learning_rate", "scale_by_lion", "scale_by_madgrad",
                            "scale_by_nadam", "scale_by_rms", "scale_by_schedule_free", "scale_by_shampoo",
                            "scale_by_shape", "scale_by_soap", "skip_nonfinite", "trace", "trace_ema"),
    "gradwise.transforms.apollo": ("scale_by_apollo",),
    "gradwise.transforms.low_rank": ("project_low_rank",),
    "gradwise.transforms.normuon": ("scale_by_neuron_second_moment",),
    "gradwise.transforms.kl_shampoo": ("scale_by_kl_shampoo",),
    "gradwise.transforms.kl_soap": ("scale_by_kl_soap",),
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}

__all__ = [
    "LOMO", "SGD", "SOAP", "AdaLomo", "Adam", "AdamW", "Chain", "Context", "Hyper", "Lion", "Lookahead", "Muon",
    "NAdamW", "Optimizer", "StatePolicy",
    "Ranger21", "ScheduleFreeAdamW", "ScheduleFreeSGD", "Shampoo", "Transform",
    "add_decayed_weights", "chain", "estimate", "fused_backward", "lookahead", "orthogonalize_by_newton_schulz",
    "route", "scale_by_adam",
    "scale_by_learning_rate", "scale_by_lion", "scale_by_madgrad", "scale_by_nadam", "scale_by_rms",
    "scale_by_schedule_free",
    "scale_by_shampoo", "scale_by_shape", "scale_by_soap", "schedule_free", "skip_nonfinite", "trace", "trace_ema",
]
__all__ += ["create", "optimizer_class", "optimizer_names"]
__all__ += ["estimate_sharded"]
__all__ += ["APOLLO", "APOLLOMini", "CAME", "Adafactor", "AdamMini", "GaLoreAdamW", "project_low_rank",
            "scale_by_apollo"]
__all__ += ["ADOPT", "MARS", "AdEMAMix"]
__all__ += ["NorMuon", "scale_by_neuron_second_moment"]
__all__ += ["SPAM", "AdamC"]
__all__ += ["KLShampoo", "KLSOAP", "scale_by_kl_shampoo", "scale_by_kl_soap"]
__all__ += ["BAdam", "MeZO"]
__all__ += ["FRUGAL", "SubsetNorm"]
__all__ += ["DeMo", "DiLoCo"]
__all__ += ["PSGDKron", "qk_clip"]
__all__ += ["MicroAdam"]


def __getattr__(name: str) -> Any:
    """A public name, or a submodule, imported on first use and kept."""
    if name in _MODULE_OF:
        value = getattr(importlib.import_module(_MODULE_OF[name]), name)
        globals()[name] = value
        return value
    if not name.startswith("__"):
        try:
            return importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as error:
            if error.name != f"{__name__}.{name}":
                raise
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


def _encoded_storage(state: Any, transform: Any) -> Any:
    """``Optimizer(state=...)``'s storage: ``gradwise.state``'s encoded one. Registered here, in the
    package above every layer, and imported when first asked for: core, the bottom layer, never
    imports state."""
    from gradwise.state.engine import EncodedState

    return EncodedState.from_argument(state, transform)


def _recipes_taking_state() -> list[str]:
    from gradwise.recipes import takes_state

    return takes_state()


register_storage(_encoded_storage, _recipes_taking_state)
