"""Ranger21 (Wright & Demeure, 2021, arXiv:2106.13731): AdamW and eight components, as one chain."""
from __future__ import annotations

from gradwise.core.hyper import betas_pair, boolean, choice, closed_unit_interval, number_in, positive, positive_int
from gradwise.core.optimizer import Optimizer
from gradwise.core.transform import chain
from gradwise.schedules import auto_warmup_steps, chebyshev_steps, ranger21_schedule
from gradwise.transforms.gradient_shaping import centralize_gradient, clip_by_agc, normalize_gradient
from gradwise.transforms.learning_rate import scale_by_learning_rate, scale_by_schedule
from gradwise.transforms.lookahead import lookahead
from gradwise.transforms.madgrad import scale_by_madgrad
from gradwise.transforms.pnm import scale_by_pnm_adam
from gradwise.transforms.regularizers import RUNNING_SUM, shrink_like_ranger21, trace_second_moment


class Ranger21(Optimizer):
    """Ranger21 with the authors' argument names and defaults, computed as pytorch-optimizer's
    ``Ranger21`` computes it (which fixes three slips of the authors' package; see README):

        g <- agc(g);  g <- centralize(g);  g <- normalize(g)          (each optional)
        d <- pnm_adam(g)  (positive-negative momentum, AMSGrad max, softplus denominator)
        p <- p (1 - a)(1 - b) - lr f(t) d;  lookahead every k steps
        (a = lr f(t) weight_decay / n: stable weight decay; b: norm loss at p (1 - a))

    with n the square root of the mean bias-corrected second moment over all parameters (stable weight
    decay) and f Ranger21's linear warmup (``num_warmup_iterations``, by default 2 / (1 - beta2)) and
    linear warm-down to ``warmdown_min_lr`` over the last ``1 - warmdown_start_pct`` of the budget.
    The budget is ``num_epochs * num_batches_per_epoch`` or ``num_iterations``. The step count lives
    in the optimizer state, so a checkpoint resumes the schedule and Lookahead exactly.

    Built as a plain chain of its components (``core/phases.py`` runs it in two phases): AGC,
    centralization and normalization on whole tensors; then the step's mean second moment, a
    reduction over every parameter (``scale_by_pnm_adam(second_moment_statistics=True)``); then the
    decay (``shrink_like_ranger21``, which moves the point the core steps from), the core, the
    schedule and Lookahead. ``state=`` encodes its buffers as for any chain.

    Options pytorch-optimizer lacks follow the authors' package (see README for its slips we avoid):
    ``use_madgrad`` replaces the core by MADGRAD (``scale_by_madgrad``: lambda_t = lr f(t) sqrt(t),
    softplus of the cube root, ``momentum``), decays by a = lambda_t weight_decay / n with n the cube
    root of the mean second moment, and starts MADGRAD's average from the decayed point;
    ``use_adabelief`` makes v AdaBelief's belief (g - m_t)^2; ``use_cheb`` multiplies f after the
    warmup by Agarwal et al.'s fractal Chebyshev steps, one per epoch (``num_epochs - 2`` of them);
    ``lookahead_load_at_validation`` makes ``optimizer.eval()`` put the slow weights in the model
    and ``optimizer.train()`` the fast ones back. A gradient holding NaN or inf raises, naming the
    parameter, and changes nothing (one such element would make every parameter NaN, through the
    standard deviation and the mean over all parameters; torch.optim.AdamW poisons that element
    alone); ``skip_nonfinite=True`` skips such steps instead. Not supported (they raise): a ``momentum_type``
    other than "pnm", ``decay_type`` other than "stable", ``warmup_type`` other than "linear".
    """

    def __init__(self, params, lr, lookahead_active=True, lookahead_mergetime=5, lookahead_blending_alpha=0.5,
                 lookahead_load_at_validation=False, use_madgrad=False, use_adabelief=False, softplus=True,
                 beta_softplus=50, using_gc=True, using_normgc=True, gc_conv_only=False, normloss_active=True,
                 normloss_factor=1e-4, use_adaptive_gradient_clipping=True, agc_clipping_value=1e-2, agc_eps=1e-3,
                 betas=(0.9, 0.999), momentum_type="pnm", pnm_momentum_factor=1.0, momentum=0.9, eps=1e-8,
                 num_batches_per_epoch=None, num_epochs=None, use_cheb=False, use_warmup=True,
                 num_warmup_iterations=None, warmdown_active=True, warmdown_start_pct=0.72, warmdown_min_lr=3e-5,
                 weight_decay=1e-4, decay_type="stable", warmup_type="linear", warmup_pct_default=0.22,
                 logging_active=False, *, num_iterations=None, maximize=False, skip_nonfinite=False,
                 compile="auto", state=None, param_rounding="nearest"):
        for name, value, allowed in (("momentum_type", momentum_type, "pnm"), ("decay_type", decay_type, "stable"),
                                     ("warmup_type", warmup_type, "linear")):
            choice((allowed,), note="the one gradwise's Ranger21 supports")(name, value)
        betas_pair("betas", betas)  # before the schedule reads beta2
        for name, value in (("lookahead_active", lookahead_active), ("using_gc", using_gc),
                            ("using_normgc", using_normgc), ("normloss_active", normloss_active),
                            ("use_adaptive_gradient_clipping", use_adaptive_gradient_clipping),
                            ("use_warmup", use_warmup), ("warmdown_active", warmdown_active),
                            ("logging_active", logging_active), ("use_madgrad", use_madgrad),
                            ("use_adabelief", use_adabelief), ("use_cheb", use_cheb),
                            ("lookahead_load_at_validation", lookahead_load_at_validation)):
            boolean(name, value)
        if use_madgrad and use_adabelief:
            raise ValueError("Ranger21: use_adabelief=True changes the Adam core's second moment; it has no"
                             " meaning with use_madgrad=True")
        total = _budget(num_epochs, num_batches_per_epoch, num_iterations)
        # the warm-down's start as each reference rounds it: int(pct * epochs * batches) or int(pct * iterations)
        factors = (num_iterations,) if num_iterations is not None else (num_epochs, num_batches_per_epoch)
        cheb = _chebyshev(num_epochs, num_iterations) if use_cheb else None
        schedule = _schedule(lr, betas, total, factors, use_warmup, num_warmup_iterations, warmup_pct_default,
                             warmdown_active, warmdown_start_pct, warmdown_min_lr, cheb, num_batches_per_epoch)
        hyper = dict(lr=lr, betas=betas, eps=eps, softplus=softplus, beta_softplus=float(beta_softplus),
                     weight_decay=weight_decay, normloss_factor=normloss_factor)
        links = [clip_by_agc()] if use_adaptive_gradient_clipping else []
        links += [centralize_gradient()] if using_gc else []
        links += [normalize_gradient()] if using_normgc else []
        decay = shrink_like_ranger21(schedule, norm_loss=normloss_active, core="madgrad" if use_madgrad else "adam")
        if use_madgrad:  # Adam's second moment still drives stable weight decay
            moments = trace_second_moment()
            links += [moments, decay, scale_by_madgrad(schedule, denominator="softplus", anchor_at_first_step=True)]
            hyper.update(momentum=momentum)
        else:
            moments = scale_by_pnm_adam(renormalize=using_normgc, gc_conv_only=gc_conv_only, belief=use_adabelief,
                                        second_moment_statistics=True, centered=using_gc)
            links += [moments, decay, scale_by_schedule(schedule), scale_by_learning_rate()]
            hyper.update(pnm_momentum_factor=pnm_momentum_factor)
        links += [lookahead(evaluate_slow=lookahead_load_at_validation)] if lookahead_active else []
        if use_adaptive_gradient_clipping:
            hyper.update(agc_clipping_value=agc_clipping_value, agc_eps=agc_eps)
        if using_gc:
            hyper.update(gc_conv_only=gc_conv_only)
        if lookahead_active:
            hyper.update(lookahead_k=lookahead_mergetime, lookahead_alpha=lookahead_blending_alpha)
        self.schedule = schedule
        # a checkpoint from before Ranger21 was a plain chain keeps the running sum of v under its own key
        self.renamed_state = {"ranger21.variance_sum": f"{moments.name}.{RUNNING_SUM}"}
        super().__init__(params, chain(*links), maximize=maximize, skip_nonfinite=skip_nonfinite, compile=compile,
                         state=state, param_rounding=param_rounding, **hyper)


def _chebyshev(num_epochs, num_iterations) -> list[float]:
    """Ranger21's ``use_cheb`` factors: ``chebyshev_steps(num_epochs - 2)``, one per epoch."""
    if num_iterations is not None:
        raise ValueError("Ranger21(use_cheb=True) steps its Chebyshev schedule once per epoch: give num_epochs and"
                         " num_batches_per_epoch, not num_iterations")
    count = num_epochs - 2
    if count < 1 or count & (count - 1):
        raise ValueError(f"invalid num_epochs={num_epochs!r} with use_cheb=True: num_epochs - 2 must be a power of"
                         " two >= 1 (3, 4, 6, 10, 18, ...), the lengths the fractal Chebyshev order is defined for")
    return chebyshev_steps(count)


def _budget(num_epochs, num_batches_per_epoch, num_iterations) -> int:
    if num_iterations is not None:
        if num_epochs is not None or num_batches_per_epoch is not None:
            raise ValueError("Ranger21: give either num_iterations or num_epochs and num_batches_per_epoch, not both")
        total = num_iterations
        name = "num_iterations"
    else:
        if num_epochs is None or num_batches_per_epoch is None:
            raise ValueError("Ranger21 needs its step budget: num_epochs and num_batches_per_epoch (or"
                             f" num_iterations); got num_epochs={num_epochs!r},"
                             f" num_batches_per_epoch={num_batches_per_epoch!r}")
        positive_int("num_epochs", num_epochs)
        positive_int("num_batches_per_epoch", num_batches_per_epoch)
        total, name = num_epochs * num_batches_per_epoch, "num_epochs * num_batches_per_epoch"
    positive_int(name, total)
    return int(total)


def _schedule(lr, betas, total, factors, use_warmup, num_warmup_iterations, warmup_pct_default, warmdown_active,
              warmdown_start_pct, warmdown_min_lr, cheb, epoch_steps):
    positive("lr", lr)
    warmup = 0
    if use_warmup:
        warmup = auto_warmup_steps(betas[1], total, warmup_pct_default) if num_warmup_iterations is None \
            else num_warmup_iterations
    warmdown = 0
    if warmdown_active:
        closed_unit_interval("warmdown_start_pct", warmdown_start_pct)
        start = warmdown_start_pct
        for factor in factors:
            start *= factor
        warmdown = total - int(start)
    number_in(0.0, lr, note=f"at most lr={lr!r}")("warmdown_min_lr", warmdown_min_lr)
    return ranger21_schedule(total, warmup, warmdown, warmdown_min_lr / lr, cheb=cheb, epoch_steps=epoch_steps or 1)
