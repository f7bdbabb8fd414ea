"""BAdam: block coordinate descent around any optimizer (Luo et al. 2024, "BAdam: A Memory Efficient Full
Parameter Optimization Method for Large Language Models", arXiv:2404.02827; LITERATURE.md ¶191).

The parameters are split into blocks B_1..B_D. At step t the active block is B_pi(j), j = floor(t / K)
mod D, for an ordering pi of the blocks (ascending, descending, or a fresh random permutation each pass
of D blocks); only that block is stepped (K steps of the wrapped optimizer, Adam in the paper):

    theta_B <- optimizer.step(theta_B, g_B)  for B active;   theta_B' unchanged for every other block,

and when the block changes, the wrapped optimizer's state of the old block is freed (the paper resets
Adam's state on each switch), so state is held for one block at a time.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from gradwise.core.hyper import boolean, choice, non_negative_int, positive_int

ORDERS = ("ascending", "descending", "random")


def block_order(blocks: int, order: str, seed: int, sweep: int) -> list[int]:
    """The blocks' order in pass ``sweep``: ``range(blocks)``, its reverse, or (``"random"``)
    ``torch.randperm(blocks)`` drawn from a generator seeded with ``seed + sweep``."""
    if order == "random":
        return torch.randperm(blocks, generator=torch.Generator().manual_seed(seed + sweep)).tolist()
    return list(range(blocks))[::-1 if order == "descending" else 1]


class BAdam(torch.optim.Optimizer):
    """Step one block of ``optimizer``'s parameters at a time, ``switch_every`` steps each (the module
    docstring). Wrap a fresh optimizer (gradwise or torch.optim)::

        optimizer = gradwise.BAdam(gradwise.AdamW(layer_groups, lr=1e-5), switch_every=100, order="random")

    Blocks: ``blocks=None`` makes each param group a block (one group per layer is the paper's
    partition); ``blocks=n``, every n consecutive parameters in the groups' order. ``freeze_inactive``
    (the paper's way to save gradient memory) sets ``requires_grad=False`` on every parameter outside
    the active block, so backward computes no gradient for them; without it their gradients are computed
    and dropped at each step. Every parameter of ``optimizer`` is treated as trainable. The wrapper
    shares ``param_groups`` and ``state`` with ``optimizer`` (LR schedulers act on both);
    ``state_dict()`` holds the wrapped optimizer's and the step count, and a load resumes bit-identically.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, switch_every: int = 50, *, blocks: int | None = None,
                 order: str = "ascending", seed: int = 0, freeze_inactive: bool = True):
        if not isinstance(optimizer, torch.optim.Optimizer) or isinstance(optimizer, BAdam):
            raise TypeError(f"invalid optimizer (a {type(optimizer).__name__}): expected a torch.optim.Optimizer"
                            " (gradwise.AdamW, torch.optim.AdamW, ...), not yet stepped")
        positive_int("switch_every", switch_every)
        choice(ORDERS)("order", order)
        non_negative_int("seed", seed)
        boolean("freeze_inactive", freeze_inactive)
        if blocks is not None:
            positive_int("blocks", blocks)
        if any(optimizer.state.values()):
            raise ValueError("invalid optimizer: it has already stepped (it holds state); wrap it before its first"
                             " step")
        params = [p for group in optimizer.param_groups for p in group["params"]]
        if blocks is None:
            self.blocks = [list(group["params"]) for group in optimizer.param_groups if group["params"]]
        else:
            self.blocks = [params[i:i + blocks] for i in range(0, len(params), blocks)]
        super().__init__(params, {})
        self.optimizer, self.switch_every, self.order, self.seed = optimizer, switch_every, order, seed
        self.freeze_inactive, self.steps = freeze_inactive, 0
        self.param_groups, self.state, self.defaults = optimizer.param_groups, optimizer.state, optimizer.defaults
        self._activate(self.active)

    @property
    def active(self) -> int:
        """The index (into ``blocks``) of the block the next step moves."""
        phase = self.steps // self.switch_every
        return block_order(len(self.blocks), self.order, self.seed, phase // len(self.blocks))[phase % len(self.blocks)]

    def _activate(self, active: int) -> None:
        """Free the state of every block but ``active``; with ``freeze_inactive``, only it needs gradients."""
        for index, block in enumerate(self.blocks):
            for p in block:
                if index != active:
                    self.optimizer.state.pop(p, None)
                    p.grad = None
                if self.freeze_inactive:
                    p.requires_grad_(index == active)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        if hasattr(self, "optimizer"):
            raise ValueError("BAdam.add_param_group: the blocks are fixed when BAdam is built; add the group to"
                             " the optimizer before wrapping it")
        super().add_param_group(param_group)

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """``closure`` (with gradients enabled), then one step of the wrapped optimizer on the active block;
        the next block takes over after ``switch_every`` steps."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        active = self.active
        for index, block in enumerate(self.blocks):
            if index != active:
                for p in block:
                    p.grad = None
        self.optimizer.step()
        self.steps += 1
        if self.active != active:
            self._activate(self.active)
        return loss

    def _settings(self) -> dict[str, Any]:
        return {"switch_every": self.switch_every, "order": self.order, "seed": self.seed,
                "blocks": [len(b) for b in self.blocks]}

    def state_dict(self) -> dict[str, Any]:
        return {"optimizer": self.optimizer.state_dict(), "badam": {"steps": self.steps, **self._settings()}}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """The wrapped optimizer's state and the step count; refused, before anything changes, when the
        checkpoint's blocks or schedule differ from this wrapper's."""
        own = state_dict.get("badam") if isinstance(state_dict, dict) else None
        if not isinstance(own, dict) or "optimizer" not in state_dict:
            raise ValueError("invalid state_dict: expected BAdam.state_dict()'s {'optimizer': ..., 'badam': ...}")
        non_negative_int("state_dict['badam']['steps']", own.get("steps"))
        saved = {k: own.get(k) for k in self._settings()}
        if saved != self._settings():
            raise ValueError(f"invalid state_dict: saved with {saved}, this BAdam has {self._settings()}")
        self.optimizer.load_state_dict(state_dict["optimizer"])
        self.steps = own["steps"]
        self._activate(self.active)
