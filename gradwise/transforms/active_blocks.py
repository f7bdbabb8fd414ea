"""FRUGAL's block-style subspace (Zmushko et al. 2024, arXiv:2411.07837; LITERATURE.md ¶86): a stateful rule on
the blocks (parameter tensors) of the active set, a state-free rule on the others, the set shifting every T steps."""
from __future__ import annotations

import torch
from torch import Tensor

from gradwise.core.hyper import Hyper, choice, int_in, non_negative, optional, positive_int
from gradwise.core.transform import Context, Transform
from gradwise.transforms.low_rank import inner_chain
from gradwise.transforms.low_rank_rest import RESTS


class project_active_blocks(Transform):  # noqa: N801 - transforms are named like functions (optax grammar)
    """``inner`` on the active blocks, ``rest`` on the others, for the parameters of a group with ``block_stride``
    n (T = ``update_proj_gap``; i the parameter's index in the optimizer, in group order; period j = (t-1) // T):

        active:  i = j (mod n);  u <- inner(u), its state zeroed at the period's first step, t - jT its step
        others:  u <- rest_scale rest(u),  rest = sign (``"sign"``: FRUGAL's signSGD) or the identity (``"sgd"``)

    so each block is stateful for one period in n, in ascending order, its moments fresh when it becomes active
    (FRUGAL resets the state of the blocks it activates). Parameters of groups with ``block_stride=None`` get
    ``inner`` alone, always (the paper keeps embeddings, norms and the head on Adam). ``inner`` runs on every
    block of a strided group and its state is kept for all of them (what an inactive block accumulates is zeroed
    before it is read): the method's arithmetic, not yet its memory, which would free the inactive blocks' state.
    Elementwise when ``inner`` is: the choice is one 0-d factor per tensor.
    """

    name = "blocks"

    def __init__(self, inner: Transform, rest: str = "sign"):
        self.inner = inner_chain(inner, "project_active_blocks")
        self.rest = choice(RESTS)("rest", rest)
        own = {"block_stride": Hyper(None, optional(positive_int, "always stateful"), static=True),
               "update_proj_gap": Hyper(200, int_in(1, note="steps between switches of the active blocks"),
                                        static=True),
               "rest_scale": Hyper(1.0, non_negative)}
        clash = sorted(set(own) & set(self.inner.hyper))
        if clash:
            raise ValueError(f"project_active_blocks(): inner declares {clash}, which it reads itself")
        self.hyper = {**self.inner.hyper, **own}
        self.state = ("block_index", *self.inner.state)
        self.nonnegative, self.reductions = self.inner.nonnegative, self.inner.reductions
        self.elementwise, self.batched = self.inner.elementwise, self.inner.batched
        self.resets = tuple(self.inner.state)

    def wrapped(self, group=None) -> list[tuple[str, Transform]]:
        return [("", self.inner)]

    def init(self, param: Tensor, group) -> dict[str, Tensor]:
        return {"block_index": torch.zeros((), dtype=torch.int64, device=param.device), **self.inner.init(param, group)}

    def seed(self, state, index: int) -> None:
        state["block_index"].fill_(index)
        super().seed(state, index)

    def scalars(self, hyper, step: int) -> dict[str, float]:
        if hyper["block_stride"] is None:
            return {"keep": 1.0, "period": 0.0, **self.inner.scalars(hyper, step)}
        gap = hyper["update_proj_gap"]
        return {"keep": float((step - 1) % gap != 0), "period": float((step - 1) // gap),
                **self.inner.scalars(hyper, (step - 1) % gap + 1)}

    def update(self, updates: list[Tensor], state, ctx: Context) -> list[Tensor]:
        stride = ctx["block_stride"]
        if stride is not None:
            for key in self.resets:
                for buffer in state[key]:
                    buffer.mul_(ctx["keep"])
        out = self.inner.update(updates, {k: state[k] for k in self.inner.state}, ctx)
        if stride is None:
            return out
        chosen = []
        for o, u, index in zip(out, updates, state["block_index"]):
            active = torch.remainder(index - ctx["period"], stride) == 0
            chosen.append(torch.where(active, o, (u.sign() if self.rest == "sign" else u) * ctx["rest_scale"]))
        return chosen

    def __repr__(self) -> str:
        return f"project_active_blocks({self.inner!r}, rest={self.rest!r})"
