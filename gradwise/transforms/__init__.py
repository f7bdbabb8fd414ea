"""The vocabulary of update transforms. ``scale_by_*`` rescales, ``add_*`` adds a term, ``clip_*`` bounds,
``trace*`` keeps momentum, ``route`` dispatches parameters to sub-chains."""
from gradwise.transforms.active_blocks import project_active_blocks
from gradwise.transforms.adalomo import scale_by_adalomo
from gradwise.transforms.adam import scale_by_adam, scale_by_adam_moments, scale_by_bias_correction
from gradwise.transforms.adam_mini import scale_by_adam_mini
from gradwise.transforms.ademamix import scale_by_ademamix
from gradwise.transforms.adopt import scale_by_adopt
from gradwise.transforms.apollo import scale_by_apollo
from gradwise.transforms.came import scale_by_came_rms, scale_by_confidence
from gradwise.transforms.cautious import cautious
from gradwise.transforms.clipping import clip_by_global_norm, clip_by_value
from gradwise.transforms.factored import (
    clip_by_block_rms,
    scale_by_factored_rms,
    scale_by_param_block_rms,
    scale_by_relative_step,
)
from gradwise.transforms.gradient_shaping import centralize_gradient, clip_by_agc, normalize_gradient
from gradwise.transforms.kl_shampoo import scale_by_kl_shampoo
from gradwise.transforms.kl_soap import scale_by_kl_soap
from gradwise.transforms.learning_rate import scale_by_learning_rate, scale_by_schedule
from gradwise.transforms.lookahead import lookahead
from gradwise.transforms.low_rank import project_low_rank
from gradwise.transforms.low_rank_rest import project_low_rank_with_rest
from gradwise.transforms.madgrad import scale_by_madgrad
from gradwise.transforms.mars import mars_correction
from gradwise.transforms.micro_adam import scale_by_micro_adam
from gradwise.transforms.momentum import trace, trace_ema
from gradwise.transforms.nadam import scale_by_nadam
from gradwise.transforms.newton_schulz import orthogonalize_by_newton_schulz, scale_by_shape
from gradwise.transforms.nonfinite import skip_nonfinite
from gradwise.transforms.normuon import scale_by_neuron_second_moment
from gradwise.transforms.pnm import scale_by_pnm_adam
from gradwise.transforms.psgd_kron import scale_by_psgd_kron
from gradwise.transforms.regularizers import (
    add_norm_loss,
    add_stable_weight_decay,
    shrink_like_ranger21,
    trace_second_moment,
)
from gradwise.transforms.route import route
from gradwise.transforms.schedule_free import scale_by_rms, scale_by_schedule_free
from gradwise.transforms.shampoo import scale_by_shampoo
from gradwise.transforms.sign import scale_by_lion
from gradwise.transforms.soap import scale_by_soap
from gradwise.transforms.spam import spam
from gradwise.transforms.subset_norm import scale_by_subset_norm
from gradwise.transforms.weight_decay import (
    add_corrected_decayed_weights,
    add_decayed_weights,
    cautious_weight_decay,
    decay_stepped_weights,
)

__all__ = [
    "add_corrected_decayed_weights",
    "add_decayed_weights",
    "add_norm_loss",
    "add_stable_weight_decay",
    "cautious",
    "cautious_weight_decay",
    "centralize_gradient",
    "clip_by_agc",
    "clip_by_block_rms",
    "clip_by_global_norm",
    "clip_by_value",
    "decay_stepped_weights",
    "lookahead",
    "mars_correction",
    "normalize_gradient",
    "orthogonalize_by_newton_schulz",
    "project_active_blocks",
    "project_low_rank",
    "project_low_rank_with_rest",
    "route",
    "scale_by_adalomo",
    "scale_by_adam",
    "scale_by_adam_mini",
    "scale_by_adam_moments",
    "scale_by_ademamix",
    "scale_by_adopt",
    "scale_by_apollo",
    "scale_by_bias_correction",
    "scale_by_came_rms",
    "scale_by_confidence",
    "scale_by_factored_rms",
    "scale_by_learning_rate",
    "scale_by_kl_shampoo",
    "scale_by_kl_soap",
    "scale_by_lion",
    "scale_by_madgrad",
    "scale_by_micro_adam",
    "scale_by_nadam",
    "scale_by_neuron_second_moment",
    "scale_by_param_block_rms",
    "scale_by_pnm_adam",
    "scale_by_psgd_kron",
    "scale_by_relative_step",
    "scale_by_rms",
    "scale_by_schedule",
    "scale_by_schedule_free",
    "scale_by_shampoo",
    "scale_by_subset_norm",
    "scale_by_shape",
    "scale_by_soap",
    "shrink_like_ranger21",
    "skip_nonfinite",
    "spam",
    "trace",
    "trace_second_moment",
    "trace_ema",
]
