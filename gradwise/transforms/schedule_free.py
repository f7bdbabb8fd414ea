"""Schedule-Free optimization (Defazio et al., 2024, "The Road Less Scheduled", arXiv:2405.15682).

Three sequences: z takes plain steps, x is a weighted running average of z, and gradients are taken
at y, an interpolation of the two. With d_t the direction of the links before (for AdamW,
g / (sqrt(v_hat) + eps) + wd y), c_t = w_t / sum_{s<=t} w_s and w_t = t^r lr_max^weight_lr_power:

    y <- (1 - c) y + c z + lr (beta (1 - c) - 1) d;     z <- z - lr d

which updates y without storing x. The model holds y while training and x = (y - (1 - beta) z) / beta
while evaluating: ``Optimizer.eval()`` and ``train()`` move it (``set_mode``). ``lr`` is warmed up
linearly over ``warmup_steps`` (lr * t / warmup_steps), as the ``schedulefree`` package does.
lr_max, the weight sum and c live in each parameter's state (0-d float64), so they are saved with it;
like the step count, they advance on the steps the parameter has a gradient (the package keeps one
set per param group and advances it on every step).
"""
from __future__ import annotations

import operator

import torch
from torch import Tensor

from gradwise.core import lists
from gradwise.core.hyper import Hyper, betas_pair, non_negative, non_negative_int, open_unit_interval, positive
from gradwise.core.transform import Context, Transform, state_dtype


class scale_by_rms(Transform):  # noqa: N801
    """u <- u / (sqrt(v / (1 - b2^t)) + eps),  v <- b2 v + (1 - b2) u^2  (Adam's denominator alone;
    b2 is ``betas[1]``)."""

    name = "rms"
    state = ("exp_avg_sq",)
    hyper = {"betas": Hyper((0.9, 0.999), betas_pair), "eps": Hyper(1e-8, positive)}

    def scalars(self, hyper, step: int) -> dict[str, float]:
        b2 = float(hyper["betas"][1])
        # in double, as schedulefree; its division by 1 - b2^t is a multiplication by the reciprocal here, which
        # costs a compiled CPU step a sixth less (a vector division per element is that slow)
        return {"inv_bias_correction2": 1 / (1 - b2**step), "one_minus_beta2": 1 - b2}

    def update(self, updates: list[Tensor], state, ctx: Context) -> list[Tensor]:
        v = state["exp_avg_sq"]
        lists.mul_(v, ctx["betas"][1])
        lists.addcmul_(v, updates, updates, ctx["one_minus_beta2"])
        denominators = lists.mul(v, ctx["inv_bias_correction2"])
        lists.sqrt_(denominators)
        lists.add_(denominators, ctx["eps"])
        return lists.div(updates, denominators)


class scale_by_schedule_free(Transform):  # noqa: N801
    """The Schedule-Free step (module docstring); the last link of a chain, in place of
    ``scale_by_learning_rate``. ``beta`` names the group entry holding beta: ``"betas"`` (its first
    element, as AdamW) or a number entry such as ``"momentum"`` (as SGD)."""

    name = "schedule_free"
    state = ("z", "lr_max", "weight_sum", "ckp1")
    weights_like = ("z",)
    advance_only = ("lr_max", "weight_sum")

    def __init__(self, beta: str = "momentum"):
        self.beta = beta
        spec = Hyper((0.9, 0.999), betas_pair) if beta == "betas" else Hyper(0.9, open_unit_interval)
        self.hyper = {
            "lr": Hyper(1e-3, non_negative),
            beta: spec,
            "warmup_steps": Hyper(0, non_negative_int),
            "r": Hyper(0.0, non_negative),
            "weight_lr_power": Hyper(2.0, non_negative),
        }

    def checked_beta(self, group) -> float:
        """The group's beta (``betas[0]``, or ``momentum``), refused unless it is positive."""
        value = group[self.beta]
        beta = float(value[0] if self.beta == "betas" else value)
        if beta <= 0:
            raise ValueError(f"invalid {self.beta}={value!r}: Schedule-Free needs beta in (0, 1)")
        return beta

    def init(self, param: Tensor, group) -> dict[str, Tensor]:
        scalar = dict(dtype=torch.float64, device=param.device)
        return {
            "z": param.detach().to(state_dtype(param), copy=True),
            "lr_max": torch.full((), -1.0, **scalar),
            "weight_sum": torch.zeros((), **scalar),
            "ckp1": torch.zeros((), **scalar),
        }

    def scalars(self, hyper, step: int) -> dict[str, float]:
        self.checked_beta(hyper)
        warmup = hyper["warmup_steps"]
        schedule = step / warmup if step - 1 < warmup else 1.0
        return {"scheduled_lr": float(hyper["lr"]) * schedule, "step_weight": float(step) ** hyper["r"]}

    def advance(self, state, hyper, scalars) -> None:
        lr_max, weight_sum = state["lr_max"], state["weight_sum"]
        lr_max.clamp_(min=scalars["scheduled_lr"])
        weight = scalars["step_weight"] * lr_max ** hyper["weight_lr_power"]
        weight_sum.add_(weight)
        state["ckp1"].copy_(torch.where(weight_sum > 0, weight / weight_sum, 0.0))

    def advance_many(self, states, hyper, scalars) -> None:
        """``advance`` on every state of a bucket, bit for bit, in a few ops on stacked copies of the 0-d
        state and one foreach copy back, instead of a few ops per parameter."""
        if len(states) < 2:
            super().advance_many(states, hyper, scalars)
            return
        tensors = [st[k] for k in _ADVANCED for st in states]
        old = torch.stack(tensors[:2 * len(states)]).view(2, len(states))  # (ckp1 is not read)
        new = old.new_empty((len(_ADVANCED), len(states)))
        self._advanced(old, new, hyper, scalars)
        torch._foreach_copy_(tensors, list(new.view(-1).unbind()))

    def advancer(self, states):
        """``advance_many`` on the same bucket step after step, its 0-d state kept stacked (``StackedAdvance``)."""
        if len(states) < 2 or len({(st[k].dtype, st[k].device) for st in states for k in _ADVANCED}) != 1:
            return super().advancer(states)
        return StackedAdvance(self, states)

    def _advanced(self, old: Tensor, new: Tensor, hyper, scalars) -> None:
        """``new``'s rows lr_max, weight sum and ckp1 after ``advance``, from ``old``'s lr_max and weight sum before
        it (one column per parameter): ``advance``'s ops, one per row."""
        torch.clamp(old[0], min=scalars["scheduled_lr"], out=new[0])
        weight = scalars["step_weight"] * _pow_each(new[0], hyper["weight_lr_power"])
        torch.add(old[1], weight, out=new[1])
        new[2].copy_(torch.where(new[1] > 0, weight / new[1], 0.0))

    def update(self, updates: list[Tensor], state, ctx: Context) -> list[Tensor]:
        """Per tensor, (z - y) c + d lr (beta (1 - c) - 1) and z <- z - d lr, as list ops (``core/lists.py``): the
        change of y, for parameters below the update's precision (``apply`` writes y itself)."""
        c, coefficients = self._coefficients(state, ctx, updates[0].dtype)
        out = lists.sub(state["z"], ctx.params)
        lists.mul_(out, c)
        lists.add_(out, lists.mul(updates, coefficients))
        lists.sub_(state["z"], updates, ctx["scheduled_lr"])
        return out

    def apply(self, updates: list[Tensor], state, ctx: Context) -> None:
        """The step written into y eagerly in the ``schedulefree`` package's op order: y.lerp_(z, c), y += coefficient
        d, z -= lr d, one list op each (three foreach calls, where ``update`` and its addition take six). Traced,
        ``update``'s summed form, added: the same arithmetic per element, in the loop measured fastest."""
        if torch.compiler.is_compiling():
            lists.add_(ctx.params, self.update(updates, state, ctx))
            return
        c, coefficients = self._coefficients(state, ctx, updates[0].dtype)
        lists.lerp_small_(ctx.params, state["z"], c)
        lists.addcmul_(ctx.params, updates, coefficients)
        lists.sub_(state["z"], updates, ctx["scheduled_lr"])

    def _coefficients(self, state, ctx: Context, dtype: torch.dtype) -> tuple[list[Tensor], list[Tensor]]:
        """Each parameter's c and lr (beta (1 - c) - 1), 0-d tensors of ``dtype``: computed stacked, one op each,
        with the bits of each parameter's own 0-d ops; compiled, once per call (``Context.once``)."""
        beta = ctx[self.beta][0] if self.beta == "betas" else ctx[self.beta]
        c = ctx.once(torch.stack(state["ckp1"]).to(dtype))
        return list(c.unbind()), list(ctx.once(ctx["scheduled_lr"] * (beta * (1 - c) - 1)).unbind())

    def set_mode(self, mode: str, param: Tensor, state, group) -> None:
        beta = self.checked_beta(group)
        weight = 1 - 1 / beta if mode == "eval" else 1 - beta
        z = state["z"]
        if param.dtype == z.dtype:
            param.lerp_(z, weight)
        else:
            param.copy_(param.to(z.dtype).lerp_(z, weight))

    def __repr__(self) -> str:
        return f"scale_by_schedule_free(beta={self.beta!r})"


#: the 0-d state ``advance`` writes, in the order of the stacked rows
_ADVANCED = ("lr_max", "weight_sum", "ckp1")
_VERSION = operator.attrgetter("_version")


class StackedAdvance:
    """Schedule-Free's ``advance_many`` on one bucket's states, step after step (``Transform.advancer``).

    ``advance_many`` stacks the 0-d state at every call and copies the result back through views it makes anew.
    This keeps it stacked between calls, in two buffers (one row per key, one column per parameter) with each
    element's 0-d view made once. A call computes the new rows from the buffer holding the values now into the
    other, copies them into every parameter's tensors in one foreach copy, and leaves the old rows as the roll
    back's copy (``saved``), where ``advance_many`` stacks them again. Whenever a tensor was written or moved since
    the last call (its ``_version``, its ``data_ptr``: a roll back, a user's write, ``.data`` set), the buffer is
    read from the state again first. Bit for bit ``advance_many``: the same ops on the same stacked values.
    """

    def __init__(self, link: scale_by_schedule_free, states) -> None:
        self.link = link
        self.tensors = [st[k] for k in _ADVANCED for st in states]
        self.buffers = self.tensors[0].new_empty((2, len(_ADVANCED), len(states)))
        self.views = [list(b.view(-1).unbind()) for b in self.buffers]
        self.current = 0  # the buffer that holds the state's values after the last call
        self.marks: tuple[list[int], list[int]] | None = None

    def _marks(self) -> tuple[list[int], list[int]]:
        return list(map(_VERSION, self.tensors)), list(map(Tensor.data_ptr, self.tensors))

    def __call__(self, hyper, scalars, saved: list) -> None:
        old, new = self.current, 1 - self.current
        if self._marks() != self.marks:
            torch._foreach_copy_(self.views[old], self.tensors)
        saved.append((self.tensors, self.buffers[old].view(-1)))
        self.link._advanced(self.buffers[old], self.buffers[new], hyper, scalars)
        torch._foreach_copy_(self.tensors, self.views[new])
        self.current = new
        self.marks = self._marks()


#: exponents torch's pow computes by the same formula for a vector as for one element (x x, sqrt, 1 / x, ...)
_EXACT_POWERS = frozenset({0.0, 1.0, 2.0, 3.0, 0.5, -0.5, -1.0, -2.0})


def _pow_each(x: Tensor, exponent: float) -> Tensor:
    """``x ** exponent`` whose every element has the bits of its own 0-d ``x[i] ** exponent``: the CPU's vector
    pow (SLEEF's) rounds some elements otherwise, so there each is its own op (a foreach call), except for the
    exponents torch computes alike either way (``weight_lr_power=2``, the default); CUDA's kernel computes every
    element alike."""
    if x.device.type == "cuda" or float(exponent) in _EXACT_POWERS:
        return x**exponent
    return torch.stack(torch._foreach_pow(list(x.unbind()), exponent))
