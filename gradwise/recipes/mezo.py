"""MeZO, a memory-efficient zeroth-order optimizer (Malladi et al. 2023, "Fine-Tuning Language Models with
Just Forward Passes", arXiv:2305.17333; LITERATURE.md ¶119), with Sparse-MeZO's mask (Liu et al. 2024,
arXiv:2402.15751) as an option.

At step t, with z ~ N(0, I) drawn from a generator seeded by (seed, t, parameter) and drawn again each
time it is needed, never stored (Algorithm 1, SPSA with n = 1)::

    l+ = L(theta + eps z);   l- = L(theta - eps z);   theta restored to theta + eps z - 2 eps z + eps z
    g  = (l+ - l-) / (2 eps)                          (the projected gradient, one number)
    theta <- theta - lr (g z + weight_decay theta)

``sparsity=s`` perturbs and updates only a fraction 1 - s of each tensor's entries (z <- z * m):
``mask="magnitude"`` (Sparse-MeZO) keeps the entries of smallest |theta| at the start of the step (a
bool mask per tensor, held during the step only); ``mask="random"`` keeps a random fraction drawn from the
step's seed (regenerated like z, nothing held). Weight decay applies to every entry.

A step that fails (the closure raises, or returns a loss that is not a finite number; KeyboardInterrupt
included) puts every parameter back before the error propagates and counts no step: each parameter is moved
back from where it was (a failure inside a perturbation moves back only those it reached) by re-drawing its z,
which is theta to within rounding (about one ulp: (theta + eps z) - eps z is not theta bit for bit in floating
point). ``exact_restore=True`` makes it bit for bit: the step then holds a copy of the parameters it moves during
the two forward passes (twice the parameters' memory; MeZO's point is inference's memory, hence off by default).
"""
from __future__ import annotations

import math
from typing import Any, Callable

import torch

from gradwise.core.hyper import choice, non_negative, non_negative_int, number_in, positive
from gradwise.core.params import DTensor

MASK64 = (1 << 64) - 1
MASKS = ("magnitude", "random")
#: each group hyperparameter and its check; eps and seed span all groups (one estimate per step)
CHECKS = {"lr": non_negative, "eps": positive, "weight_decay": non_negative,
          "sparsity": number_in(0, 1, open_high=True), "mask": choice(MASKS), "seed": non_negative_int,
          "step": non_negative_int}


def perturbation_seed(seed: int, step: int, group: int, index: int, stream: int = 0) -> int:
    """The generator seed of parameter ``index`` of param group ``group`` at ``step`` (``stream`` 1: the
    random mask's): a splitmix64 hash of the four, so neighbouring steps and tensors draw unrelated z."""
    x = (seed * 0x9E3779B97F4A7C15 + step * 0xBF58476D1CE4E5B9 + group * 0x94D049BB133111EB
         + index * 0xD6E8FEB86659FD93 + stream) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return (x ^ (x >> 31)) & ((1 << 63) - 1)


class MeZO(torch.optim.Optimizer):
    """Zeroth-order SGD from two forward passes: ``step(closure)``, where ``closure()`` runs the forward
    pass and returns the loss (no backward: it runs under ``torch.no_grad``). See the module docstring for
    the update rule. The only state is the seed and the step count, kept in every param group, so a
    ``state_dict()`` resumes bit-identically. Parameters with ``requires_grad=False`` are left alone.
    ``step`` returns the loss at theta + eps z. Memory: one tensor the size of the largest parameter
    (its z) besides the model, and with ``mask="magnitude"`` a bool per entry during the step;
    ``exact_restore=True`` adds a copy of the moved parameters during the step (a failed step then leaves
    them bit for bit as they were; see the module docstring)."""

    def __init__(self, params, lr: float = 1e-6, eps: float = 1e-3, weight_decay: float = 0.0, *,
                 sparsity: float = 0.0, mask: str = "magnitude", seed: int = 0, exact_restore: bool = False):
        defaults = dict(lr=lr, eps=eps, weight_decay=weight_decay, sparsity=sparsity, mask=mask, seed=seed, step=0)
        for key, value in defaults.items():
            CHECKS[key](key, value)
        if not isinstance(exact_restore, bool):
            raise TypeError(f"invalid exact_restore={exact_restore!r}: expected True (a failed step restores the"
                            " parameters bit for bit from a copy) or False (from the seed, to within rounding)")
        super().__init__(params, defaults)
        self.exact_restore = exact_restore

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """torch's, after checking the group's settings and refusing DTensor parameters (FSDP2's shards)."""
        for key in CHECKS:
            if key in param_group:
                CHECKS[key](key, param_group[key])
        params = param_group["params"]
        if not isinstance(params, (torch.Tensor, set)):
            param_group["params"] = params = list(params)
        for index, p in enumerate([params] if isinstance(params, torch.Tensor) else params):
            if isinstance(p, DTensor):
                raise NotImplementedError(
                    f"MeZO: params[{index}] is a DTensor placed {p.placements} (an FSDP2 shard): MeZO draws z over"
                    " whole tensors and takes one loss difference for all parameters, which on shards would need"
                    " each rank's slice of z and the ranks' losses averaged; not implemented. Use MeZO on"
                    " unsharded parameters")
        super().add_param_group(param_group)

    def _checked_groups(self) -> tuple[float, int]:
        """Every group's settings, checked before anything is written; the eps, seed and step they share."""
        for index, group in enumerate(self.param_groups):
            for key, check in CHECKS.items():
                check(f"param_groups[{index}]['{key}']", group[key])
        shared = {key: {g[key] for g in self.param_groups} for key in ("eps", "seed", "step")}
        for key, values in shared.items():
            if len(values) > 1:
                raise ValueError(f"invalid {key}: the param groups hold {sorted(values)}; MeZO needs one {key}"
                                 " for every group (one two-sided estimate spans all parameters)")
        return float(self.param_groups[0]["eps"]), int(self.param_groups[0]["seed"])

    def _work(self, seed: int) -> list[tuple[torch.Tensor, dict[str, Any], int, torch.Tensor | None]]:
        """(parameter, group, generator seed, mask or None) for every parameter the step moves."""
        work = []
        for g, group in enumerate(self.param_groups):
            for i, p in enumerate(group["params"]):
                if not p.requires_grad or not p.numel():
                    continue
                keep, mask = 1.0 - group["sparsity"], None
                if keep < 1.0 and group["mask"] == "magnitude":
                    magnitude = p.detach().abs().flatten()
                    k = max(1, math.ceil(keep * magnitude.numel()))
                    mask = p.detach().abs() <= magnitude.kthvalue(k).values
                elif keep < 1.0:
                    generator = torch.Generator(p.device).manual_seed(
                        perturbation_seed(seed, group["step"], g, i, stream=1))
                    mask = torch.rand(p.shape, generator=generator, device=p.device) < keep
                work.append((p, group, perturbation_seed(seed, group["step"], g, i), mask))
        return work

    @staticmethod
    def _z(p: torch.Tensor, seed: int, mask: torch.Tensor | None) -> torch.Tensor:
        z = torch.randn(p.shape, generator=torch.Generator(p.device).manual_seed(seed), device=p.device,
                        dtype=p.dtype)
        return z if mask is None else z.mul_(mask)

    def _perturb(self, work, offsets: list[float], to: float, eps: float) -> None:
        """Move each parameter from ``offsets[i]`` to ``to`` (in units of eps z), recording each as it lands."""
        for i, (p, _, seed, mask) in enumerate(work):
            if offsets[i] != to:
                p.add_(self._z(p, seed, mask), alpha=(to - offsets[i]) * eps)
                offsets[i] = to

    @staticmethod
    def _loss(closure: Callable[[], Any], where: str) -> tuple[Any, float]:
        loss = closure()
        value = loss.item() if isinstance(loss, torch.Tensor) and loss.numel() == 1 else loss
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ValueError(f"invalid loss={loss!r} at {where}: MeZO's closure must return a finite number or a"
                             " one-element tensor (the parameters were put back; nothing was updated)")
        return loss, float(value)

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """One MeZO step (the module docstring); ``closure`` is required."""
        if closure is None:
            raise ValueError("invalid closure=None: MeZO.step() needs closure=, a function that runs the forward"
                             " pass and returns the loss (no backward), e.g. lambda: loss_fn(model(x), y)")
        eps, seed = self._checked_groups()
        work = self._work(seed)
        saved = [p.detach().clone() for p, *_ in work] if self.exact_restore else None
        offsets = [0.0] * len(work)  # how far each parameter is from theta, in units of eps z
        try:
            self._perturb(work, offsets, 1.0, eps)
            loss, plus = self._loss(closure, "theta + eps z")
            self._perturb(work, offsets, -1.0, eps)
            _, minus = self._loss(closure, "theta - eps z")
            self._perturb(work, offsets, 0.0, eps)
        except BaseException:
            if saved is None:
                self._perturb(work, offsets, 0.0, eps)
            else:
                for (p, *_), copy in zip(work, saved):
                    p.copy_(copy)
            raise
        projected = (plus - minus) / (2 * eps)
        for p, group, p_seed, mask in work:
            if group["weight_decay"]:
                p.mul_(1 - group["lr"] * group["weight_decay"])
            p.add_(self._z(p, p_seed, mask), alpha=-group["lr"] * projected)
        for group in self.param_groups:
            group["step"] += 1
        return loss
