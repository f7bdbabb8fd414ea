"""Ranger21 (Wright & Demeure, 2021, arXiv:2106.13731): AdamW and eight components in one chain."""
from __future__ import annotations

import math

import torch

from gradwise.core.hyper import boolean
from gradwise.core.optimizer import Optimizer
from gradwise.core.params import DTensor, local
from gradwise.core.transform import Context, chain, state_dtype
from gradwise.recipes.ranger21_prologue import VARIANCE_SUM, ranger21_prologue, shape_gradient, shrink
from gradwise.schedules import auto_warmup_steps, chebyshev_steps, ranger21_schedule
from gradwise.transforms.gradient_shaping import centralize_gradient, clip_by_agc, normalize_gradient, unit_norm
from gradwise.transforms.learning_rate import scale_by_learning_rate, scale_by_schedule
from gradwise.transforms.lookahead import lookahead
from gradwise.transforms.pnm import scale_by_pnm_adam
from gradwise.transforms.regularizers import madgrad_like_ranger21, shrink_like_ranger21, trace_second_moment


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
    and ``optimizer.train()`` the fast ones back. Not supported (they raise): a ``momentum_type``
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
                 compile="auto"):
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
        shaping = [clip_by_agc()] if use_adaptive_gradient_clipping else []
        shaping += [centralize_gradient()] if using_gc else []
        shaping += [normalize_gradient()] if using_normgc else []
        hyper = dict(lr=lr, betas=betas, eps=eps, softplus=softplus, beta_softplus=float(beta_softplus),
                     weight_decay=weight_decay)
        if use_madgrad:
            # Adam's second moment still drives stable weight decay; MADGRAD's gradient is centralized again
            self._core = trace_second_moment()
            links = shaping + [self._core] + ([centralize_gradient()] if using_gc else [])
            links += [madgrad_like_ranger21(schedule, norm_loss=normloss_active)]
            hyper.update(momentum=momentum)
        elif use_adabelief:
            self._core = scale_by_pnm_adam(recentralize=using_gc, renormalize=using_normgc, gc_conv_only=gc_conv_only,
                                            belief=True)
            links = shaping + [self._core, scale_by_schedule(schedule), scale_by_learning_rate(),
                               shrink_like_ranger21(schedule, norm_loss=normloss_active)]
            hyper.update(pnm_momentum_factor=pnm_momentum_factor)
        else:  # the prologue shapes the gradient and shrinks p; the rest is elementwise
            self._core = scale_by_pnm_adam(prescaled=True)
            links = [ranger21_prologue(agc=use_adaptive_gradient_clipping, gc=using_gc), self._core,
                     scale_by_schedule(schedule), scale_by_learning_rate()]
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
        self._shaping = chain(*shaping) if shaping else None
        self._prologue = not (use_madgrad or use_adabelief)
        self._options = dict(agc=use_adaptive_gradient_clipping, gc=using_gc, gn=using_normgc,
                             norm_loss=normloss_active)
        self._shaped: dict[torch.Tensor, torch.Tensor] = {}  # the prologue's g', one scratch tensor per parameter
        super().__init__(params, chain(*links), maximize=maximize, skip_nonfinite=skip_nonfinite, compile=compile,
                         **hyper)

    @torch.no_grad()
    def step(self, closure=None):
        """One Ranger21 step: the prologue, then the elementwise chain (or, with MADGRAD or AdaBelief,
        every group's ``variance_normalizer``, stable weight decay's n, then the whole chain)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._check_inputs()  # before the normalizer's pass reads any gradient
        if any(isinstance(p, DTensor) for group in self.param_groups for p in group["params"]):
            raise NotImplementedError("Ranger21 needs whole tensors (the standard deviation of each gradient and a"
                                      " mean over every parameter), and gradwise does not yet gather DTensor shards;"
                                      " use an elementwise recipe (SGD, Adam, AdamW, NAdamW, Lion) with FSDP2")
        if self._prologue:
            self._step_with_prologue()
            return loss
        normalizer = self._variance_normalizer() if any(g["weight_decay"] for g in self.param_groups) else 1.0
        if math.isfinite(normalizer) and normalizer > 0:  # else the step is skipped (skip_nonfinite) or fails
            for group in self.param_groups:
                group["variance_normalizer"] = normalizer
        super().step()
        return loss

    def _gradient(self, p: torch.Tensor) -> torch.Tensor:
        return self._shaped[p] if self._prologue else p.grad

    def _step_with_prologue(self) -> None:
        """Shape every gradient (``ranger21_prologue.shape_gradient``), find n, shrink every parameter,
        then run the elementwise chain on the shaped gradients."""
        work = [(group, [p for p in group["params"] if p.grad is not None]) for group in self.param_groups]
        if self.mode == "eval" and self._has_modes():
            return super().step()  # raises, changing nothing
        if self._must_skip(work):
            self.skipped_steps += 1
            return None
        options, pending, sums, count = self._options, [], [], 0
        for group, params in work:
            b2 = group["betas"][1]
            for p in params:
                state = self._state_for(p, group)
                if p not in self._shaped:
                    self._shaped[p] = torch.empty_like(p, dtype=state_dtype(p))
                x = p.to(state_dtype(p))
                norm = unit_norm(x) if options["agc"] or options["norm_loss"] else None
                squares, scale = shape_gradient(p.grad, norm if options["agc"] else None, self._shaped[p], group,
                                                options["gc"], options["gn"])
                if VARIANCE_SUM not in state:
                    state[VARIANCE_SUM] = state["pnm.variance_ma"].sum(dtype=torch.float64)
                step = int(state["step"]) + 1
                variance_sum = state[VARIANCE_SUM] * b2 + squares.to(state[VARIANCE_SUM].device) * (1 - b2)
                sums.append(variance_sum / (1 - b2**step))
                count += p.numel()
                state["pnm.momentum_scale"].copy_(scale)
                pending.append((group, p, norm, step, variance_sum))
        total = float(torch.stack([s.to(sums[0].device) for s in sums]).sum()) if sums else 0.0  # one sync
        normalizer = math.sqrt((1 + total) / count) if count else 1.0
        for group, p, norm, step, _ in pending:
            group["variance_normalizer"] = normalizer
            lr_t = group["lr"] * self.schedule(step - 1)
            shrink(p, norm if options["norm_loss"] else None, lr_t * group["weight_decay"] / normalizer, lr_t, group)
        super().step()
        for _, p, _, _, variance_sum in pending:
            self.state[p][VARIANCE_SUM] = variance_sum

    def _variance_normalizer(self) -> float:
        """n from the mean m of the bias-corrected second moment v after this step over every element:
        sqrt(m + 1 / elements) (the 1 is pytorch-optimizer's), or m^(1/3) with MADGRAD (the authors'
        package); v <- b2 v + (1 - b2) x^2 with x the shaped gradient (or, with AdaBelief, its distance
        to the momentum this step feeds), v the second moment before this step."""
        total, count = torch.zeros((), dtype=torch.float64), 0
        core = self._core.name
        for group in self.param_groups:
            b2 = group["betas"][1]
            params = [p for p in group["params"] if p.grad is not None]
            for p in params:
                g = local(p.grad).neg() if group["maximize"] else local(p.grad)
                g = g.to(state_dtype(local(p)))
                if self._shaping is not None:
                    hyper = {k: torch.tensor(float(group[k]), dtype=g.dtype, device=g.device)
                             for k in ("agc_clipping_value", "agc_eps") if k in group}
                    static = {"gc_conv_only": group.get("gc_conv_only", False)}
                    g = self._shaping.update([g], {}, Context([local(p)], [g], hyper, static))[0]
                state = self.state.get(p, {})
                step = int(state["step"]) + 1 if "step" in state else 1
                if getattr(self._core, "belief", False):
                    fed = state.get("pnm.grad_ma" if step % 2 == 1 else "pnm.neg_grad_ma")
                    fed = torch.zeros_like(g) if fed is None else local(fed)
                    g = self._core.variance_input(g, self._core.momentum_input(g), fed, 1 - group["betas"][0] ** 2)
                v = g * g * (1 - b2)
                if f"{core}.variance_ma" in state:
                    v = local(state[f"{core}.variance_ma"]) * b2 + v
                total += (v / (1 - b2**step)).sum().double().cpu()
                count += p.numel()
        if not count:
            return 1.0
        if self.use_madgrad:
            return (float(total) / count) ** (1 / 3)
        return math.sqrt((1 + float(total)) / count)


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
