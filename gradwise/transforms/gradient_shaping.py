"""Reshaping the gradient before the preconditioner: adaptive clipping, centralization, normalization.

None of them is elementwise: each reads a norm, mean or standard deviation of a whole tensor (or of
its rows), so a chain holding one runs on whole tensors (``elementwise = False``).

- ``clip_by_agc`` (Brock et al., 2021, "High-performance large-scale image recognition without
  normalization", arXiv:2102.06171): per unit (row), if ||g|| > c max(||p||, eps_p) then
  g <- g c max(||p||, eps_p) / max(||g||, 1e-6). Units: the whole tensor for 0-d and 1-d tensors,
  dim 1 for 2-d and 3-d ones, every dim but the first beyond (``unit_norm``).
- ``centralize_gradient`` (Yong et al., 2020, "Gradient Centralization", arXiv:2004.01461):
  g <- g - mean(g over every dim but the first), for tensors of 2 or more dims (with
  ``gc_conv_only``, of 4 or more).
- ``normalize_gradient`` (Ranger21, Wright & Demeure, 2021, arXiv:2106.13731):
  g <- g / (std(g) + 1e-8) (unbiased std over the whole tensor) for tensors of more than 2 elements.

All three are ``shape_gradient`` with one stage on; the engine runs adjacent ones as one link.
"""
from __future__ import annotations

import torch
from torch import Tensor

from gradwise.core.hyper import Hyper, boolean, non_negative
from gradwise.core.transform import Context, Transform

#: the floor of a gradient's unit norm in adaptive clipping, and the normalizer's epsilon (both references')
AGC_GRAD_EPS = 1e-6
NORMALIZE_EPS = 1e-8


def unit_norm(x: Tensor) -> Tensor:
    """The L2 norm of each unit of ``x``: all of it (0-d, 1-d), its rows (2-d, 3-d: over dim 1), or
    over every dim but the first (4-d and more); reduced dims kept for tensors of 2 or more dims."""
    if x.dim() <= 1:
        return x.norm(p=2.0)
    dim = 1 if x.dim() in (2, 3) else tuple(range(1, x.dim()))
    return x.norm(p=2.0, dim=dim, keepdim=True)


def centralized(g: Tensor, conv_only: bool = False) -> Tensor:
    if g.dim() > (3 if conv_only else 1):
        return g - g.mean(dim=tuple(range(1, g.dim())), keepdim=True)
    return g


def normalized(g: Tensor) -> Tensor:
    return g / (g.std() + NORMALIZE_EPS) if g.numel() > 2 else g


#: the stages of ``shape_gradient``, in the order they apply
STAGES = ("agc", "gc", "gn")


class shape_gradient(Transform):  # noqa: N801
    """Any of adaptive clipping, centralization and normalization, in that order (module docstring), in
    as few passes as the three allow together: with centralization and normalization over the same
    units the standard deviation of the centralized gradient follows from the unit norms and means
    already read (its mean is 0), so g' = (s g - mean_unit(s g)) / (sigma + 1e-8) is one write. The
    engine fuses adjacent shaping links into one (``fuse``), so a chain of ``clip_by_agc()``,
    ``centralize_gradient()`` and ``normalize_gradient()`` (Ranger21's) reads g three times, p once."""

    name = "shape"
    elementwise = False
    #: the stages a configuration of it (``clip_by_agc``...) always has
    always: tuple[str, ...] = ()

    def __init__(self, agc: bool = False, gc: bool = False, gn: bool = False):
        self.agc, self.gc, self.gn = (on or stage in self.always for stage, on in zip(STAGES, (agc, gc, gn)))
        self.hyper = {**(AGC_HYPER if self.agc else {}), **(GC_HYPER if self.gc else {})}

    def stages(self) -> tuple[str, ...]:
        return tuple(stage for stage in STAGES if getattr(self, stage))

    def fuse(self, other: Transform) -> Transform | None:
        """This link and ``other`` right after it as one, when ``other`` only shapes further."""
        if not isinstance(other, shape_gradient) or STAGES.index(other.stages()[0]) <= STAGES.index(self.stages()[-1]):
            return None
        return shape_gradient(**{stage: True for stage in (*self.stages(), *other.stages())})

    def update(self, updates: list[Tensor], state, ctx: Context) -> list[Tensor]:
        outs = ctx.out if ctx.out is not None else [None] * len(updates)
        return [self.shaped(u, p, ctx, out) for u, p, out in zip(updates, ctx.params, outs)]

    def shaped(self, g: Tensor, p: Tensor, ctx: Context, out: Tensor | None = None) -> Tensor:
        n = g.numel()
        centralize = self.gc and g.dim() > (3 if ctx["gc_conv_only"] else 1)
        normalize = self.gn and n > 2
        same_units = g.dim() != 3  # AGC's units are centralization's, except for 3-d tensors (fibres)
        g_norm = unit_norm(g) if self.agc or (centralize and normalize and same_units) else None
        scale = None
        if self.agc:
            max_norm = unit_norm(p.to(g.dtype)).clamp_min(ctx["agc_eps"]) * ctx["agc_clipping_value"]
            clamped = g_norm.clamp_min(AGC_GRAD_EPS)
            scale = torch.where(clamped > max_norm, max_norm / clamped, torch.ones_like(clamped))
        if centralize and normalize and same_units:
            # each unit's centred sum of squares is s^2 (||g||^2 - n_unit mean^2): sigma of g_c without a pass
            mean = g.mean(dim=tuple(range(1, g.dim())), keepdim=True)
            squares = (g_norm**2 - (n // mean.numel()) * mean**2).clamp_min(0)
            factor = 1 / ((squares * (1 if scale is None else scale**2)).sum() / (n - 1)).sqrt().add(NORMALIZE_EPS)
            factor = factor if scale is None else scale * factor
            return torch.addcmul(-(mean * factor), g, factor, out=out)  # (out: Context.out, when given)
        shaped = g if scale is None else g * scale
        shaped = centralized(shaped, ctx["gc_conv_only"]) if self.gc else shaped
        return normalized(shaped) if self.gn else shaped

    def __repr__(self) -> str:
        if self.always:
            return f"{type(self).__name__}()"
        return f"shape_gradient({', '.join(f'{stage}=True' for stage in self.stages())})"


AGC_HYPER = {"agc_clipping_value": Hyper(1e-2, non_negative), "agc_eps": Hyper(1e-3, non_negative)}
GC_HYPER = {"gc_conv_only": Hyper(False, boolean, static=True)}


class clip_by_agc(shape_gradient):  # noqa: N801
    """Adaptive gradient clipping (module docstring): ``agc_clipping_value`` c, ``agc_eps`` eps_p."""

    name = "agc"
    always = ("agc",)


class centralize_gradient(shape_gradient):  # noqa: N801
    """Gradient centralization (module docstring); ``gc_conv_only`` limits it to 4-d and larger tensors."""

    name = "gc"
    always = ("gc",)


class normalize_gradient(shape_gradient):  # noqa: N801
    """Gradient normalization by the tensor's standard deviation (module docstring)."""

    name = "gn"
    always = ("gn",)
