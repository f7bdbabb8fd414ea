"""PSGD Kron: SGD preconditioned by a Kronecker-factored whitening preconditioner fitted online on a Lie
group (Li, 2018, arXiv:1512.04202, arXiv:1809.10232; as pytorch-optimizer's ``Kron`` and heavyball's
``PSGDKron``, after Evan Walters' kron_torch)."""
from __future__ import annotations

import math

import torch
from torch import Tensor

from gradwise.core.hyper import (
    Hyper,
    boolean,
    choice,
    closed_unit_interval,
    non_negative_int,
    positive,
    positive_int,
    unit_interval,
)
from gradwise.core.transform import Context, Transform, state_dtype
from gradwise.transforms.blocking import BATCH_ELEMENTS, stacked, write_back
from gradwise.transforms.kron_factors import balance, diagonal_sides, fit_factors, matrix_view, precondition
from gradwise.transforms.kron_schedule import PROBABILITY, FittingSteps, balances, noise_seed

MEMORY_SAVE_MODES = (None, "one_diag", "smart_one_diag", "all_diag")
#: pytorch-optimizer's floor in the factor fit: bfloat16's smallest normal number
EPS = torch.finfo(torch.bfloat16).tiny


class scale_by_psgd_kron(Transform):  # noqa: N801 - transforms are named like functions (optax grammar)
    """PSGD Kron on each parameter, seen as a matrix G (d0, d1 * ...) (a vector: one diagonal factor):

    m <- mu m + (1-mu) g;  m_hat = m / (1 - mu^t);
    at fitting steps (``pre_conditioner_update_probability`` p(t); default: 1 for 500 steps, then decaying
    to 0.03), with V ~ N(0, I): first, with probability ``balance_prob``, the factors are rescaled to equal
    largest entries; then Q_L, Q_R take one step of ``precondition_lr`` on the whitening fit of (m_hat (g
    if not ``momentum_into_precondition_update``), V) (``kron_factors.fit_factors``);
    u = P m_hat = Q_L^T Q_L m_hat Q_R^T Q_R;  u <- u min(1, 1.1 / (rms(u) + 1e-6)).
    A side is triangular, Q = s I at the start (s = ``precondition_init_scale`` ^ (1/#factors)), unless its length
    is 1 or above ``max_size_triangular``, the parameter has fewer than ``min_ndim_triangular`` dimensions, or
    ``memory_save_mode`` makes it diagonal ("one_diag": the longer side; "smart_one_diag": the longer side
    when strictly longer; "all_diag"). Q is kept in ``precondition_dtype`` (None: the state's).
    Fitting steps follow pytorch-optimizer's counter (``kron_schedule.fitting_steps``) on each parameter's
    step count; V and the balancing draw come from seeds of the step (one V for all parameters of a shape: each
    fit needs only V ~ N(0, I)), so runs, ranks and resumes agree. Same-shaped parameters share each batched
    matmul and triangular solve.
    """

    name = "psgd_kron"
    state = ("momentum_buffer", "q_left", "q_right")
    elementwise = False
    reads_params = False
    batched = True
    hyper = {
        "momentum": Hyper(0.9, unit_interval),
        "pre_conditioner_update_probability": Hyper(None, PROBABILITY, static=True),
        "max_size_triangular": Hyper(8192, positive_int, static=True),
        "min_ndim_triangular": Hyper(2, non_negative_int, static=True),
        "memory_save_mode": Hyper(None, choice(MEMORY_SAVE_MODES), static=True),
        "momentum_into_precondition_update": Hyper(True, boolean, static=True),
        "precondition_lr": Hyper(0.1, positive),
        "precondition_init_scale": Hyper(1.0, positive),
        "precondition_dtype": Hyper(torch.float32, choice((None, torch.float32, torch.float64)), static=True),
        "balance_prob": Hyper(0.01, closed_unit_interval),
    }

    def __init__(self) -> None:
        self.fits = FittingSteps()

    def init(self, param: Tensor, group) -> dict[str, Tensor]:
        dtype, device = state_dtype(param), param.device
        out = {"momentum_buffer": torch.zeros_like(param, dtype=dtype)}
        q_dtype = group["precondition_dtype"] or dtype
        sides = matrix_view(param.shape)[: 1 if param.dim() < 2 else 2] if param.numel() else ()
        scale = float(group["precondition_init_scale"]) ** (1 / max(len(sides), 1))
        for side, size, diag in zip(("left", "right"), sides, diagonal_sides(sides, param.dim(), group)):
            q = torch.ones(1, 1, size) if diag else torch.eye(size).unsqueeze(0)
            out[f"q_{side}"] = (scale * q).to(device=device, dtype=q_dtype)
        for side in ("left", "right")[len(sides):]:
            out[f"q_{side}"] = torch.zeros(0, dtype=q_dtype, device=device)
        return out

    def scalars(self, hyper, step: int) -> dict[str, float]:
        mu, fit = float(hyper["momentum"]), self.fits(hyper["pre_conditioner_update_probability"], step)
        return {"one_minus_momentum": 1 - mu, "bias1": 1 - math.pow(mu, step), "fit": float(fit),
                "balance": float(fit and balances(step, hyper["balance_prob"])), "noise_seed": float(noise_seed(step))}

    def update(self, updates: list[Tensor], state, ctx: Context) -> list[Tensor]:
        out = list(updates)
        for u, m in zip(updates, state["momentum_buffer"]):
            m.lerp_(u, ctx["one_minus_momentum"])
        members = [i for i, q in enumerate(state["q_left"]) if q.numel() > 0]
        if not members:
            return out
        fit, rebalance, noise = torch.stack([ctx["fit"], ctx["balance"], ctx["noise_seed"]]).to(torch.int64).tolist()
        for group in _batches(members, updates, state):
            views, slots = [matrix_view(updates[i].shape) for i in group], [(i, slice(0, 1)) for i in group]
            left = stacked([state["q_left"][i] for i in group])
            right = stacked([state["q_right"][i] for i in group]) if state["q_right"][group[0]].numel() else None
            m_hat = stacked([(state["momentum_buffer"][i] / ctx["bias1"]).to(left.dtype).reshape(1, *v)
                             for i, v in zip(group, views)])
            if rebalance and right is not None:
                balance(left, right)
            if fit:
                g = m_hat if ctx["momentum_into_precondition_update"] else \
                    stacked([updates[i].to(left.dtype).reshape(1, *v) for i, v in zip(group, views)])
                v = _noise(updates[group[0]].shape, noise, left).reshape(1, *views[0])
                fit_factors(left, right, g, v, ctx["precondition_lr"], EPS)
            if fit or rebalance:
                write_back(left, slots, state["q_left"])
                if right is not None:
                    write_back(right, slots, state["q_right"])
            direction = precondition(left, right, m_hat).to(updates[group[0]].dtype)
            rms = direction.square().mean(dim=(-2, -1), keepdim=True).sqrt()
            direction = direction * torch.clamp(1.1 / (rms + 1e-6), max=1.0)
            for i, piece in zip(group, direction):
                out[i] = piece.reshape(updates[i].shape)
        return out


def _noise(shape: torch.Size, generator_seed: int, like: Tensor) -> Tensor:
    """V ~ N(0, I) of ``shape``, drawn from ``generator_seed`` in ``like``'s dtype, on its device."""
    generator = torch.Generator(like.device).manual_seed(generator_seed)
    return torch.randn(shape, generator=generator, dtype=like.dtype, device=like.device)


def _batches(members: list[int], updates: list[Tensor], state) -> list[list[int]]:
    """The parameters whose factors go through one batched call: same view and factor shapes, at most
    ``BATCH_ELEMENTS`` per stacked operand."""
    groups: dict[tuple, list[int]] = {}
    for i in members:
        key = (matrix_view(updates[i].shape), state["q_left"][i].shape, state["q_right"][i].shape)
        groups.setdefault(key, []).append(i)
    out = []
    for (view, *_), group in groups.items():
        per = max(1, BATCH_ELEMENTS // max(view) ** 2)
        out += [group[k:k + per] for k in range(0, len(group), per)]
    return out
