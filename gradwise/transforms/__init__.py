"""The vocabulary of update transforms. ``scale_by_*`` rescales, ``add_*`` adds a term, ``trace`` keeps momentum."""
from gradwise.transforms.adam import scale_by_adam, scale_by_nadam
from gradwise.transforms.gradient_shaping import centralize_gradient, clip_by_agc, normalize_gradient
from gradwise.transforms.learning_rate import scale_by_learning_rate, scale_by_schedule
from gradwise.transforms.lookahead import lookahead
from gradwise.transforms.momentum import trace
from gradwise.transforms.nonfinite import skip_nonfinite
from gradwise.transforms.pnm import scale_by_pnm_adam
from gradwise.transforms.regularizers import add_norm_loss, add_stable_weight_decay, shrink_like_ranger21
from gradwise.transforms.schedule_free import scale_by_rms, scale_by_schedule_free
from gradwise.transforms.sign import scale_by_lion
from gradwise.transforms.weight_decay import add_decayed_weights

__all__ = [
    "add_decayed_weights",
    "add_norm_loss",
    "add_stable_weight_decay",
    "centralize_gradient",
    "clip_by_agc",
    "lookahead",
    "normalize_gradient",
    "scale_by_adam",
    "scale_by_learning_rate",
    "scale_by_lion",
    "scale_by_nadam",
    "scale_by_pnm_adam",
    "scale_by_rms",
    "scale_by_schedule",
    "scale_by_schedule_free",
    "shrink_like_ranger21",
    "skip_nonfinite",
    "trace",
]
