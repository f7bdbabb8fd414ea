"""Shampoo: Kronecker-factored preconditioning per block, with its step size grafted from a diagonal
method (Gupta et al., 2018, arXiv:1802.09568; Anil et al., 2020, arXiv:2002.09018; Shi et al., 2023,
arXiv:2309.06497, Distributed Shampoo)."""
from __future__ import annotations

import math

import torch
from torch import Tensor

from gradwise.core.hyper import (
    Hyper,
    boolean,
    choice,
    either,
    number_in,
    optional,
    positive,
    positive_int,
    sequence_of,
    unit_interval,
)
from gradwise.core.transform import Context, Transform, state_dtype
from gradwise.transforms.blocking import (
    Blocking,
    FactorCounters,
    accumulate_factors,
    block_groups,
    pieces,
    stacked,
    write_back,
)
from gradwise.transforms.matrix_root import inverse_roots

GRAFTINGS = ("adam", "adagrad", "rmsprop", "sgd")
PRECONDITIONER_DTYPES = (torch.float32, torch.float64)


#: beta2 = 1 keeps sums of the factors (AdaGrad-like) instead of running means
BETAS = sequence_of((unit_interval, number_in(0, 1, open_low=True)), ("beta1", "beta2"))
#: the first step that preconditions: None (= precondition_frequency), a step, or math.inf (never)
START = either(optional(positive_int, "= precondition_frequency"), choice((math.inf,)))


class scale_by_shampoo(FactorCounters, Transform):  # noqa: N801 - transforms are named like functions (optax grammar)
    """Blocked Shampoo with grafting, for parameters of two or more dimensions (seen as matrices
    (d0, d1 * ...), cut into blocks of at most ``max_preconditioner_dim`` per side); parameters of
    fewer dimensions (biases, scalars) take the grafting method's direction alone.

    Every step t, per block G:  L <- b2 L + (1-b2) G G^T,  R <- b2 R + (1-b2) G^T G  (b2 = 1: sums);
    graft state:  v <- bg v + (1-bg) g^2 (adam, rmsprop) or v <- v + g^2 (adagrad);
    m <- b1 m + (1-b1) g,  m_hat = m / (1-b1^t);  D_graft = m_hat / (sqrt(v_hat) + eps_g) (sgd: m_hat),
    v_hat = v / (1-bg^t) for adam, v otherwise.
    At steps start, start + f, start + 2f, ... (f = ``precondition_frequency``, start =
    ``start_preconditioning_step``, default f) the inverse roots are recomputed by eigendecomposition
    in ``preconditioner_dtype``:  P_L = (L_hat + eps I)^(-1/4), P_R = (R_hat + eps I)^(-1/4), with
    L_hat = L / (1-b2^t). From step ``start`` on, each block's direction is
    D = P_L m_hat P_R * ||D_graft|| / ||P_L m_hat P_R||  (Frobenius norms per block); before, D_graft.
    A block whose eigendecomposition fails keeps its previous roots (a warning; ``eigh_failures``
    counts them); a factor update that would make a factor NaN or inf (an overflowing or non-finite
    gradient) is skipped, keeping the factor (a warning at the next refresh; ``factor_skips``).
    Blocks of one shape, across all parameters, go through one batched matmul and one batched
    ``eigh`` (``batch_blocks=False``: one block at a time, for comparison).
    """

    name = "shampoo"
    state = ("factor_left", "factor_right", "root_left", "root_right", "exp_avg", "graft_sq")
    elementwise = False
    reads_params = False
    batched = True
    hyper = {
        "betas": Hyper((0.9, 0.999), BETAS),
        "epsilon": Hyper(1e-12, positive),
        "max_preconditioner_dim": Hyper(8192, positive_int, static=True),
        "precondition_frequency": Hyper(100, positive_int, static=True),
        "start_preconditioning_step": Hyper(None, START, static=True),
        "grafting": Hyper("adam", choice(GRAFTINGS), static=True),
        "grafting_beta2": Hyper(0.999, unit_interval),
        "grafting_epsilon": Hyper(1e-8, positive),
        "use_bias_correction": Hyper(True, boolean, static=True),
        "preconditioner_dtype": Hyper(torch.float32, choice(PRECONDITIONER_DTYPES), static=True),
        "batch_blocks": Hyper(True, boolean, static=True),
    }

    def init(self, param: Tensor, group) -> dict[str, Tensor]:
        dtype = state_dtype(param)
        out = {"exp_avg": torch.zeros_like(param, dtype=dtype),
               "graft_sq": torch.zeros_like(param, dtype=dtype) if group["grafting"] != "sgd"
               else torch.zeros(0, dtype=dtype, device=param.device)}
        n, r, c = 0, 0, 0
        if param.dim() >= 2 and param.numel() > 0:
            b = Blocking.of(param.shape, group["max_preconditioner_dim"])
            n, r, c = b.count, b.block_rows, b.block_cols
        for side, size in (("left", r), ("right", c)):
            out[f"factor_{side}"] = torch.zeros(n, size, size, dtype=dtype, device=param.device)
            out[f"root_{side}"] = torch.zeros(n, size, size, dtype=dtype, device=param.device)
        return out

    def scalars(self, hyper, step: int) -> dict[str, float]:
        b1, b2 = map(float, hyper["betas"])
        bg = float(hyper["grafting_beta2"])
        frequency = hyper["precondition_frequency"]
        start = hyper["start_preconditioning_step"] or frequency
        correct = hyper["use_bias_correction"]
        return {
            "one_minus_beta1": 1 - b1,
            "one_minus_beta2": 1 - b2,
            "one_minus_graft_beta2": 1 - bg,
            "sum_factors": float(b2 == 1),
            "inv_bias1": 1 / (1 - b1**step) if correct else 1.0,
            "inv_bias2": 1 / (1 - b2**step) if correct and b2 < 1 else 1.0,
            "inv_graft_bias2_sqrt": 1 / math.sqrt(1 - bg**step) if hyper["grafting"] == "adam" else 1.0,
            "recompute": float(step >= start and (step - start) % frequency == 0),
            "precondition": float(step >= start),
        }

    def update(self, updates: list[Tensor], state, ctx: Context) -> list[Tensor]:
        directions = [_graft(u, m, v, ctx) for u, m, v in zip(updates, state["exp_avg"], state["graft_sq"])]
        matrices = [i for i, f in enumerate(state["factor_left"]) if f.numel() > 0]
        if not matrices:
            return directions
        blockings = {i: Blocking.of(updates[i].shape, ctx["max_preconditioner_dim"]) for i in matrices}
        grads = {i: blockings[i].split(updates[i]) for i in matrices}
        recompute, precondition = bool(ctx["recompute"]), bool(ctx["precondition"])
        if precondition:
            m_hat = {i: blockings[i].split(state["exp_avg"][i] * ctx["inv_bias1"]) for i in matrices}
            graft = {i: blockings[i].split(directions[i]) for i in matrices}
            out = {i: torch.empty_like(graft[i]) for i in matrices}
        for members in block_groups(matrices, blockings, ctx["batch_blocks"]):
            self.factor_skips.add(accumulate_factors(
                stacked([grads[i][k] for i, k in members]), members, state,
                None if ctx["sum_factors"] else ctx["one_minus_beta2"]))
            if recompute:
                self._refresh_roots(members, state, ctx)
            if not precondition:
                continue
            left, right = (stacked([state[f"root_{side}"][i][k] for i, k in members]) for side in ("left", "right"))
            shampoo = left @ stacked([m_hat[i][k] for i, k in members]) @ right
            g = stacked([graft[i][k] for i, k in members])
            norm = torch.linalg.vector_norm(shampoo, dim=(-2, -1), keepdim=True)
            graft_norm = torch.linalg.vector_norm(g, dim=(-2, -1), keepdim=True)
            blocks = torch.where(norm > 0, shampoo * (graft_norm / norm), g)
            for (i, k), piece in zip(members, pieces(blocks, members)):
                out[i][k] = piece
        if precondition:
            for i in matrices:
                directions[i] = blockings[i].merge(out[i])
        return directions

    def _refresh_roots(self, members, state, ctx: Context) -> None:
        self.factor_skips.flush()
        for side in ("left", "right"):
            factors = stacked([state[f"factor_{side}"][i][k] for i, k in members]) * ctx["inv_bias2"]
            previous = stacked([state[f"root_{side}"][i][k] for i, k in members])
            dtype = torch.promote_types(factors.dtype, ctx["preconditioner_dtype"])
            roots, failed = inverse_roots(factors, 4, ctx["epsilon"], dtype, previous)
            self.eigh_failures += failed
            write_back(roots, members, state[f"root_{side}"])


def _graft(u: Tensor, m: Tensor, v: Tensor, ctx: Context) -> Tensor:
    """The grafting method's direction for one parameter; updates its first moment and graft state."""
    m.lerp_(u, ctx["one_minus_beta1"])
    m_hat = m * ctx["inv_bias1"]
    grafting = ctx["grafting"]
    if grafting == "sgd":
        return m_hat
    if grafting == "adagrad":
        v.add_(u * u)
    else:
        bg = ctx["grafting_beta2"]
        v.mul_(bg).add_(u * u * ctx["one_minus_graft_beta2"])
    return m_hat / (v.sqrt() * ctx["inv_graft_bias2_sqrt"] + ctx["grafting_epsilon"])
