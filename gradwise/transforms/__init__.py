"""The vocabulary of update transforms. ``scale_by_*`` rescales, ``add_*`` adds a term, ``trace`` keeps momentum."""
from gradwise.transforms.adam import scale_by_adam, scale_by_nadam
from gradwise.transforms.learning_rate import scale_by_learning_rate
from gradwise.transforms.momentum import trace, trace_ema
from gradwise.transforms.newton_schulz import orthogonalize_by_newton_schulz, scale_by_shape
from gradwise.transforms.nonfinite import skip_nonfinite
from gradwise.transforms.route import route
from gradwise.transforms.shampoo import scale_by_shampoo
from gradwise.transforms.sign import scale_by_lion
from gradwise.transforms.soap import scale_by_soap
from gradwise.transforms.weight_decay import add_decayed_weights

__all__ = [
    "add_decayed_weights",
    "orthogonalize_by_newton_schulz",
    "route",
    "scale_by_adam",
    "scale_by_learning_rate",
    "scale_by_lion",
    "scale_by_nadam",
    "scale_by_shampoo",
    "scale_by_shape",
    "scale_by_soap",
    "skip_nonfinite",
    "trace",
    "trace_ema",
]
