"""Schedule-Free AdamW and SGD (Defazio et al., 2024): no schedule to set, an average to evaluate."""
from __future__ import annotations

from gradwise.core.optimizer import Optimizer
from gradwise.core.transform import Transform, chain
from gradwise.transforms import add_decayed_weights, scale_by_learning_rate
from gradwise.transforms.schedule_free import scale_by_rms, scale_by_schedule_free


class ScheduleFreeAdamW(Optimizer):
    """Schedule-Free AdamW; equals ``schedulefree.AdamWScheduleFree`` step by step.

    d = g / (sqrt(v / (1 - b2^t)) + eps) + wd y;  y <- (1-c) y + c z + lr (b1 (1-c) - 1) d;  z <- z - lr d.
    Call ``optimizer.eval()`` before evaluating or saving the model for inference and
    ``optimizer.train()`` before training again; both are idempotent and saved in ``state_dict()``.
    ``state=`` stores v smaller; z, a second copy of the weights, stays at the parameters' precision.
    """

    def __init__(self, params, lr=0.0025, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, warmup_steps=0, r=0.0,
                 weight_lr_power=2.0, *, maximize=False, skip_nonfinite=False, compile="auto", state=None,
                 param_rounding="nearest"):
        transform = chain(scale_by_rms(), add_decayed_weights(), scale_by_schedule_free("betas"))
        super().__init__(params, transform, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                         warmup_steps=warmup_steps, r=r, weight_lr_power=weight_lr_power, maximize=maximize,
                         skip_nonfinite=skip_nonfinite, compile=compile, state=state,
                         param_rounding=param_rounding)
        for group in self.param_groups:
            transform.transforms[-1].checked_beta(group)


class ScheduleFreeSGD(Optimizer):
    """Schedule-Free SGD; equals ``schedulefree.SGDScheduleFree`` step by step.

    d = g + wd y;  y <- (1-c) y + c z + lr (momentum (1-c) - 1) d;  z <- z - lr d  (``eval()``/``train()`` as above).
    It keeps no encoded state (``state=None`` only): its one buffer, z, is a second copy of the weights,
    which stays at the parameters' precision (int8 or bf16 rounding of z is rounding of the weights).
    """

    state_refusal = ("its one state buffer, z, is a second copy of the weights, kept at the parameters' precision"
                     " (rounding z to int8 or bf16 would round the weights); there is nothing to store smaller")

    def __init__(self, params, lr=1.0, momentum=0.9, weight_decay=0.0, warmup_steps=0, r=0.0, weight_lr_power=2.0,
                 *, maximize=False, skip_nonfinite=False, compile="auto", state=None,
                 param_rounding="nearest"):
        transform = chain(add_decayed_weights(), scale_by_schedule_free("momentum"))
        super().__init__(params, transform, lr=lr, momentum=momentum, weight_decay=weight_decay,
                         warmup_steps=warmup_steps, r=r, weight_lr_power=weight_lr_power, maximize=maximize,
                         skip_nonfinite=skip_nonfinite, compile=compile, state=state,
                         param_rounding=param_rounding)


def schedule_free(transform: Transform) -> Transform:
    """Any chain made Schedule-Free: its direction (a trailing ``scale_by_learning_rate`` dropped)
    followed by the Schedule-Free step, whose beta is the group entry ``schedule_free_momentum``::

        Optimizer(params, schedule_free(chain(scale_by_lion(), scale_by_learning_rate())),
                  lr=1e-4, schedule_free_momentum=0.9)
    """
    if not isinstance(transform, Transform):
        raise TypeError(f"invalid transform={transform!r}: expected a gradwise Transform")
    links = [t for _, t in transform.links()]
    if isinstance(links[-1], scale_by_learning_rate):
        links = links[:-1]
    return chain(*links, scale_by_schedule_free("schedule_free_momentum"))
