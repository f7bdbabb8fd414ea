"""Ranger21 (Wright & Demeure, 2021, arXiv:2106.13731): AdamW and eight components, as a whole-tensor
prologue (``ranger21_prologue``) followed by an elementwise chain."""
from __future__ import annotations

import math

import torch

from gradwise.core.hyper import boolean
from gradwise.core.optimizer import Optimizer
from gradwise.core.params import DTensor, param_label
from gradwise.core.transform import chain, state_dtype
from gradwise.recipes.ranger21_prologue import VARIANCE_SUM, ranger21_prologue, shape_gradient, shrink
from gradwise.schedules import auto_warmup_steps, chebyshev_steps, ranger21_schedule
from gradwise.transforms.gradient_shaping import unit_norm
from gradwise.transforms.learning_rate import scale_by_learning_rate, scale_by_schedule
from gradwise.transforms.lookahead import lookahead
from gradwise.transforms.madgrad import scale_by_madgrad
from gradwise.transforms.pnm import scale_by_pnm_adam
from gradwise.transforms.regularizers import trace_second_moment


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

    The parts that read whole tensors (shaping, n, the shrink) run as a prologue before an elementwise
    chain (``ranger21_prologue``), which runs in cache-sized pieces or compiles once for any length;
    with ``use_madgrad`` or ``use_adabelief`` the whole chain runs on whole tensors.

    Options pytorch-optimizer lacks follow the authors' package (see README for its slips we avoid):
    ``use_madgrad`` replaces the core by MADGRAD (``scale_by_madgrad``: lambda_t = lr f(t) sqrt(t),
    softplus of the cube root, ``momentum``), decays by a = lambda_t weight_decay / n with n the cube
    root of the mean second moment, and carries the shrink into MADGRAD's average;
    ``use_adabelief`` makes v AdaBelief's belief (g - m_t)^2; ``use_cheb`` multiplies f after the
    warmup by Agarwal et al.'s fractal Chebyshev steps, one per epoch (``num_epochs - 2`` of them);
    ``lookahead_load_at_validation`` makes ``optimizer.eval()`` put the slow weights in the model
    and ``optimizer.train()`` the fast ones back. A gradient holding NaN or inf raises, naming the
    parameter, and changes nothing (one such element would make every parameter NaN, through the
    standard deviation and the mean over all parameters; torch.optim.AdamW poisons that element
    alone); ``skip_nonfinite=True`` skips such steps instead. Not supported (they raise): a ``momentum_type``
    other than "pnm", ``decay_type`` other than "stable", ``warmup_type`` other than "linear",
    ``param_rounding="stochastic"`` (the prologue's shrink writes each parameter rounded to nearest).
    """

    state_refusal = ("its step() shapes every gradient and reads its moments by name before the chain runs,"
                     " while encoded state decodes each parameter's buffers inside the chain's step")

    #: a state key outside the chain's: the running sum of v (0-d float64), made at the first step
    extra_state = {VARIANCE_SUM: (torch.Size([]), torch.float64)}

    def __init__(self, params, lr, lookahead_active=True, lookahead_mergetime=5, lookahead_blending_alpha=0.5,
                 lookahead_load_at_validation=False, use_madgrad=False, use_adabelief=False, softplus=True,
                 beta_softplus=50, using_gc=True, using_normgc=True, gc_conv_only=False, normloss_active=True,
                 normloss_factor=1e-4, use_adaptive_gradient_clipping=True, agc_clipping_value=1e-2, agc_eps=1e-3,
                 betas=(0.9, 0.999), momentum_type="pnm", pnm_momentum_factor=1.0, momentum=0.9, eps=1e-8,
                 num_batches_per_epoch=None, num_epochs=None, use_cheb=False, use_warmup=True,
                 num_warmup_iterations=None, warmdown_active=True, warmdown_start_pct=0.72, warmdown_min_lr=3e-5,
                 weight_decay=1e-4, decay_type="stable", warmup_type="linear", warmup_pct_default=0.22,
                 logging_active=False, *, num_iterations=None, maximize=False, skip_nonfinite=False,
                 compile="auto", param_rounding="nearest"):
        for name, value, allowed in (("momentum_type", momentum_type, "pnm"), ("decay_type", decay_type, "stable"),
                                     ("warmup_type", warmup_type, "linear")):
            if value != allowed:
                raise ValueError(f"invalid {name}={value!r}: gradwise's Ranger21 supports {allowed!r}")
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
                     weight_decay=weight_decay)
        # the prologue shapes the gradient and shrinks p (``ranger21_prologue``); the rest is elementwise
        links = [ranger21_prologue(agc=use_adaptive_gradient_clipping, gc=using_gc)]
        if use_madgrad:  # Adam's second moment still drives stable weight decay
            self._core = trace_second_moment()
            links += [self._core, scale_by_madgrad(schedule, denominator="softplus")]
            hyper.update(momentum=momentum)
        else:
            self._core = scale_by_pnm_adam(prescaled=True, belief=use_adabelief)
            links += [self._core, scale_by_schedule(schedule), scale_by_learning_rate()]
            hyper.update(pnm_momentum_factor=pnm_momentum_factor)
        links += [lookahead(evaluate_slow=lookahead_load_at_validation)] if lookahead_active else []
        if use_adaptive_gradient_clipping:
            hyper.update(agc_clipping_value=agc_clipping_value, agc_eps=agc_eps)
        if using_gc:
            hyper.update(gc_conv_only=gc_conv_only)
        hyper.update(normloss_factor=normloss_factor if normloss_active else 0.0)
        if lookahead_active:
            hyper.update(lookahead_k=lookahead_mergetime, lookahead_alpha=lookahead_blending_alpha)
        self.schedule = schedule
        self.use_madgrad = use_madgrad
        self._options = dict(agc=use_adaptive_gradient_clipping, gc=using_gc, gn=using_normgc,
                             norm_loss=normloss_active)
        self._shaped: dict[torch.Tensor, torch.Tensor] = {}  # the prologue's g', one scratch tensor per parameter
        super().__init__(params, chain(*links), maximize=maximize, skip_nonfinite=skip_nonfinite, compile=compile,
                         param_rounding=param_rounding, **hyper)
        if any(group["param_rounding"] == "stochastic" for group in self.param_groups):
            raise ValueError("invalid param_rounding='stochastic' for Ranger21: its prologue shrinks each parameter"
                             " in place before the chain (stable weight decay and norm loss), a write that stochastic"
                             " rounding does not cover, so a bfloat16 parameter would lose it; keep float32"
                             " parameters, or param_rounding='nearest'")

    @torch.no_grad()
    def step(self, closure=None):
        """One Ranger21 step: the prologue over whole tensors, then the elementwise chain."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._check_inputs()  # before the prologue reads any gradient
        if any(isinstance(p, DTensor) for group in self.param_groups for p in group["params"]):
            raise NotImplementedError("Ranger21 needs whole tensors (the standard deviation of each gradient and a"
                                      " mean over every parameter), and gradwise does not yet gather DTensor shards;"
                                      " use an elementwise recipe (SGD, Adam, AdamW, NAdamW, Lion) with FSDP2")
        self._step_with_prologue()
        return loss

    def _gradient(self, p: torch.Tensor) -> torch.Tensor:
        return self._shaped[p]

    def _step_with_prologue(self) -> None:
        """Shape every gradient (``ranger21_prologue.shape_gradient``), find n, shrink every parameter,
        then run the elementwise chain on the shaped gradients."""
        work = [(group, [p for p in group["params"] if p.grad is not None]) for group in self.param_groups]
        if self.mode == "eval" and self._has_modes():
            return super().step()  # raises, changing nothing
        if self._must_skip(work):
            self.skipped_steps += 1
            return None
        options, pending, sums, count, added = self._options, [], [], 0, []
        variance = f"{self._core.name}.variance_ma"
        for index, (group, params) in enumerate(work):
            b1, b2 = group["betas"]
            for p in params:
                added.append((p, p not in self.state, VARIANCE_SUM not in self.state.get(p, {}), group, index))
                state = self._state_for(p, group)
                if p not in self._shaped:
                    self._shaped[p] = torch.empty_like(p, dtype=state_dtype(p))
                shaped = self._shaped[p]
                norm = unit_norm(p.to(shaped.dtype)) if options["agc"] or options["norm_loss"] else None
                squares, scale = shape_gradient(p.grad, norm if options["agc"] else None, shaped, group,
                                                options["gc"], options["gn"])
                step = int(state["step"]) + 1
                if getattr(self._core, "belief", False):  # v averages (g' - m_t)^2: one more pass
                    fed = state["pnm.grad_ma" if step % 2 == 1 else "pnm.neg_grad_ma"]
                    residual = shaped - fed.lerp(shaped * scale, 1 - b1 * b1)
                    squares = (residual * residual).sum(dtype=torch.float64)
                if VARIANCE_SUM not in state:
                    state[VARIANCE_SUM] = state[variance].sum(dtype=torch.float64)
                variance_sum = state[VARIANCE_SUM] * b2 + squares.to(state[VARIANCE_SUM].device) * (1 - b2)
                sums.append(variance_sum / (1 - b2**step))
                count += p.numel()
                pending.append((group, p, norm, step, variance_sum, scale))
        # one sync: the total, and each parameter's sum to name one that is not finite
        stacked = torch.stack([s.to(sums[0].device) for s in sums]) if sums else torch.zeros(0, dtype=torch.float64)
        total, *each = torch.cat([stacked.sum().view(1), stacked]).tolist()
        if not math.isfinite(total):
            self._refuse_nonfinite(added, each)
        normalizer = _normalizer(total, count, self.use_madgrad)
        for _, p, _, _, _, scale in pending:
            if "pnm.momentum_scale" in self.state[p]:
                self.state[p]["pnm.momentum_scale"].copy_(scale)
        for group, p, norm, step, _, _ in pending:
            group["variance_normalizer"] = normalizer
            lr_t = group["lr"] * self.schedule(step - 1)
            decay_t = lr_t * math.sqrt(step) if self.use_madgrad else lr_t  # MADGRAD's lambda_t
            shrink(p, norm if options["norm_loss"] else None, decay_t * group["weight_decay"] / normalizer, lr_t, group)
            if self.use_madgrad and step == 1:  # MADGRAD starts from the shrunk point, as Ranger21 creates x0
                self.state[p]["madgrad.x0"].copy_(p)
        super().step()
        for _, p, _, _, variance_sum, _ in pending:
            self.state[p][VARIANCE_SUM] = variance_sum

    def _refuse_nonfinite(self, added, sums) -> None:
        """Raise for the first parameter whose second-moment sum is not finite, after removing the state
        this step created: parameters and state are left as they were."""
        bad = next((i for i, value in enumerate(sums) if not math.isfinite(value)), 0)
        for p, fresh, new_sum, _, _ in added:
            if fresh:
                del self.state[p]
            elif new_sum:
                del self.state[p][VARIANCE_SUM]
        _, _, _, group, index = added[bad]
        raise ValueError(f"Ranger21: {param_label(group, added[bad][0], index)} has NaN or inf in its gradient (or"
                         " its value); Ranger21 divides each gradient by its standard deviation and decays every"
                         " parameter by a mean over all of them, so one such element would make every parameter NaN."
                         " Nothing was changed; pass skip_nonfinite=True to skip such steps (counted in"
                         " skipped_steps)")


def _normalizer(total: float, count: int, madgrad: bool) -> float:
    """Stable weight decay's n from the sum of the bias-corrected second moment over ``count`` elements:
    sqrt((1 + total) / count) (the 1 is pytorch-optimizer's), or (total / count)^(1/3) with MADGRAD (the
    authors' package)."""
    if not count:
        return 1.0
    return (total / count) ** (1 / 3) if madgrad else math.sqrt((1 + total) / count)


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
        for name, value in (("num_epochs", num_epochs), ("num_batches_per_epoch", num_batches_per_epoch)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"invalid {name}={value!r}: expected an integer >= 1")
        total, name = num_epochs * num_batches_per_epoch, "num_epochs * num_batches_per_epoch"
    if isinstance(total, bool) or not isinstance(total, int) or total < 1:
        raise ValueError(f"invalid {name}={total!r}: expected an integer >= 1")
    return total


def _schedule(lr, betas, total, factors, use_warmup, num_warmup_iterations, warmup_pct_default, warmdown_active,
              warmdown_start_pct, warmdown_min_lr, cheb, epoch_steps):
    if not isinstance(lr, (int, float)) or isinstance(lr, bool) or not math.isfinite(lr) or lr <= 0:
        raise ValueError(f"invalid lr={lr!r}: expected a finite number > 0")
    warmup = 0
    if use_warmup:
        warmup = auto_warmup_steps(betas[1], total, warmup_pct_default) if num_warmup_iterations is None \
            else num_warmup_iterations
    warmdown = 0
    if warmdown_active:
        if not isinstance(warmdown_start_pct, (int, float)) or not 0.0 <= warmdown_start_pct <= 1.0:
            raise ValueError(f"invalid warmdown_start_pct={warmdown_start_pct!r}: expected a number in [0, 1]")
        start = warmdown_start_pct
        for factor in factors:
            start *= factor
        warmdown = total - int(start)
    if not isinstance(warmdown_min_lr, (int, float)) or not 0.0 <= warmdown_min_lr <= lr:
        raise ValueError(f"invalid warmdown_min_lr={warmdown_min_lr!r}: expected a number in [0, lr={lr!r}]")
    return ranger21_schedule(total, warmup, warmdown, warmdown_min_lr / lr, cheb=cheb, epoch_steps=epoch_steps or 1)
