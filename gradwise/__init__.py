"""gradwise: composable, memory-lean, fast optimizers for PyTorch.

Every optimizer is a short chain of small transforms, run as one fused pass per parameter bucket,
behind a drop-in ``torch.optim.Optimizer``::

    from gradwise import AdamW
    optimizer = AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
"""
from gradwise.core.hyper import Hyper
from gradwise.core.optimizer import Optimizer
from gradwise.core.transform import Chain, Context, Transform, chain
from gradwise.recipes import SGD, Adam, AdamW, Lion, NAdamW
from gradwise.state import StatePolicy
from gradwise.state.estimate import estimate
from gradwise.transforms import (
    add_decayed_weights,
    scale_by_adam,
    scale_by_learning_rate,
    scale_by_lion,
    scale_by_nadam,
    skip_nonfinite,
    trace,
)

__version__ = "0.1.0"

__all__ = [
    "SGD", "Adam", "AdamW", "Chain", "Context", "Hyper", "Lion", "NAdamW", "Optimizer", "StatePolicy", "Transform",
    "add_decayed_weights", "chain", "scale_by_adam", "scale_by_learning_rate", "scale_by_lion",
    "scale_by_nadam", "skip_nonfinite", "trace", "estimate",
]
