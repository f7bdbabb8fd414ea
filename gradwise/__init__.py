"""gradwise: composable, memory-lean, fast optimizers for PyTorch.

Every optimizer is a short chain of small transforms, run as one fused pass per parameter bucket,
behind a drop-in ``torch.optim.Optimizer``::

    from gradwise import AdamW
    optimizer = AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)

or by name, from a config: ``gradwise.create("adamw", model, lr=3e-4, weight_decay_exclude=True)``.
"""
from gradwise.by_name import create, optimizer_class, optimizer_names
from gradwise.core.fused_backward import fused_backward
from gradwise.core.hyper import Hyper
from gradwise.core.optimizer import Optimizer
from gradwise.core.transform import Chain, Context, Transform, chain
from gradwise.recipes import (
    CAME,
    LOMO,
    SGD,
    SOAP,
    Adafactor,
    AdaLomo,
    Adam,
    AdamMini,
    AdamW,
    Lion,
    Lookahead,
    Muon,
    NAdamW,
    Ranger21,
    ScheduleFreeAdamW,
    ScheduleFreeSGD,
    Shampoo,
    schedule_free,
)
from gradwise.recipes.apollo import APOLLO, APOLLOMini
from gradwise.recipes.galore import GaLoreAdamW
from gradwise.state import StatePolicy
from gradwise.state.estimate import estimate
from gradwise.transforms import (
    add_decayed_weights,
    lookahead,
    orthogonalize_by_newton_schulz,
    route,
    scale_by_adam,
    scale_by_learning_rate,
    scale_by_lion,
    scale_by_madgrad,
    scale_by_nadam,
    scale_by_rms,
    scale_by_schedule_free,
    scale_by_shampoo,
    scale_by_shape,
    scale_by_soap,
    skip_nonfinite,
    trace,
    trace_ema,
)
from gradwise.transforms.apollo import scale_by_apollo
from gradwise.transforms.low_rank import project_low_rank

__version__ = "0.1.0"

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
__all__ += ["APOLLO", "APOLLOMini", "CAME", "Adafactor", "AdamMini", "GaLoreAdamW", "project_low_rank",
            "scale_by_apollo"]
