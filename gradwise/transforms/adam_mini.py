"""Adam-mini: one second-moment scalar per block of a parameter (Zhang et al., 2024, arXiv:2406.16793,
"Adam-mini: Use Fewer Learning Rates To Gain More")."""
from __future__ import annotations

from typing import Any, Callable

import torch
from torch import Tensor

from gradwise.core.hyper import Hyper, betas_pair, choice, either, int_in, positive
from gradwise.core.transform import Context, Transform, state_dtype

#: how a parameter is cut into blocks that share one second moment: ``"element"`` (Adam), ``"row"``
#: (one block per index of the first dimension: an output neuron of a linear layer, a token's row of an
#: embedding or head), ``"tensor"`` (one block), or an int n: consecutive runs of n elements in
#: row-major order (attention heads: n = dim * dim / n_heads).
BLOCKS = ("element", "row", "tensor")

#: ``rule(name, param) -> blocks``; ``name`` is None unless the parameters are named.
Rule = Callable[[str | None, Tensor], Any]


def by_shape(name: str | None, param: Tensor) -> Any:
    """The rule that works on any model: a row per block for two or more dimensions, else one block."""
    return "row" if param.dim() >= 2 else "tensor"


#: what ``group["blocks"]`` (and a rule) may say: a kind of block, ``"auto"``, or a block's size
BLOCKS_CHECK = either(choice(BLOCKS), choice(("auto",), "by shape"), int_in(1, note="elements per block"))


def block_count(param: Tensor, blocks: Any) -> int:
    """The number of blocks ``param`` is cut into; ``param.numel()`` when every element is its own."""
    if blocks == "auto":
        blocks = by_shape(None, param)
    if blocks == "element" or param.numel() == 0:
        return param.numel()
    if blocks == "row":
        return param.shape[0] if param.dim() else 1
    if blocks == "tensor":
        return 1
    return param.numel() // blocks


class scale_by_adam_mini(Transform):  # noqa: N801 - transforms are named like functions (optax grammar)
    """Adam with one second moment per block B of each parameter (``group["blocks"]``):

    m <- b1 m + (1-b1) u;  v_B <- b2 v_B + (1-b2) mean_{i in B} u_i^2;
    u_i <- (m_i / (1-b1^t)) / (sqrt(v_B) / sqrt(1-b2^t) + eps)  for i in B.

    ``rule(name, param)`` picks each parameter's blocks when the optimizer is built: a param group is
    split into one group per kind of block (``group["blocks"]``); a group that already says
    ``"blocks"`` is kept whole. ``no_decay(name)`` True puts a named parameter in a group with
    ``weight_decay=0``. Blocks of a row or more need the whole tensor, so the transform is not
    elementwise (under FSDP2 it raises, as the matrix optimizers do).
    """

    name = "adam_mini"
    state = ("exp_avg", "exp_avg_sq")
    nonnegative = ("exp_avg_sq",)
    elementwise = False
    hyper = {"betas": Hyper((0.9, 0.999), betas_pair), "eps": Hyper(1e-8, positive),
             "blocks": Hyper("auto", BLOCKS_CHECK, static=True)}

    def __init__(self, rule: Rule = by_shape, no_decay: Callable[[str], bool] | None = None):
        if not callable(rule):
            raise TypeError(f"invalid rule={rule!r}: expected a callable rule(name, param) -> blocks")
        self.rule, self.no_decay = rule, no_decay

    def split_group(self, group: dict[str, Any]) -> list[dict[str, Any]]:
        if "blocks" in group:
            return [group]
        members: dict[tuple[Any, bool], list[Any]] = {}
        for j, item in enumerate(group["params"]):
            name, p = item if isinstance(item, tuple) else (None, item)
            blocks = self.rule(name, p)
            label = f"parameter {name!r}" if name else f"params[{j}]"
            BLOCKS_CHECK(f"blocks for {label}", blocks)
            if not isinstance(blocks, str) and p.numel() % blocks:
                raise ValueError(f"invalid blocks={blocks} for {label} of shape {tuple(p.shape)}: its {p.numel()}"
                                 " elements do not divide into blocks of that size (check dim and n_heads)")
            decays = not (name is not None and self.no_decay is not None and self.no_decay(name))
            members.setdefault((blocks, decays), []).append(item)
        options = {k: v for k, v in group.items() if k != "params"}
        return [{**options, "params": items, "blocks": blocks, **({} if decays else {"weight_decay": 0.0})}
                for (blocks, decays), items in members.items()] or [group]

    def init(self, param: Tensor, group) -> dict[str, Tensor]:
        dtype = state_dtype(param)
        k = block_count(param, group["blocks"])
        second = torch.zeros_like(param, dtype=dtype) if k == param.numel() and param.numel() \
            else torch.zeros(k, dtype=dtype, device=param.device)
        return {"exp_avg": torch.zeros_like(param, dtype=dtype), "exp_avg_sq": second}

    def scalars(self, hyper, step: int) -> dict[str, float]:
        b1, b2 = hyper["betas"]
        # 1 - beta in double, as adam-mini computes it (1 - float32(0.999) is 1.3e-5 off)
        return {"inv_bias1": 1 / (1 - b1**step), "inv_bias2_sqrt": 1 / (1 - b2**step) ** 0.5,
                "one_minus_beta1": 1 - b1, "one_minus_beta2": 1 - b2}

    def update(self, updates: list[Tensor], state, ctx: Context) -> list[Tensor]:
        b2 = ctx["betas"][1]
        one_minus_b1, one_minus_b2 = ctx["one_minus_beta1"], ctx["one_minus_beta2"]
        eps, inv_bias1, inv_bias2_sqrt = ctx["eps"], ctx["inv_bias1"], ctx["inv_bias2_sqrt"]
        out = []
        for u, m, v in zip(updates, state["exp_avg"], state["exp_avg_sq"]):
            m.lerp_(u, one_minus_b1)
            if u.numel() == 0:
                out.append(m.clone())
                continue
            if v.shape == u.shape:  # every element its own block: Adam
                v.mul_(b2).add_(u * u * one_minus_b2)
                out.append(m * inv_bias1 / (v.sqrt() * inv_bias2_sqrt + eps))
                continue
            k = v.shape[0]
            v.mul_(b2).add_((u * u).reshape(k, -1).mean(dim=1) * one_minus_b2)
            scale = inv_bias1 / (v.sqrt() * inv_bias2_sqrt + eps)
            out.append((m.reshape(k, -1) * scale[:, None]).reshape(u.shape))
        return out

    def __repr__(self) -> str:
        return f"scale_by_adam_mini(rule={getattr(self.rule, '__name__', self.rule)!r})"
