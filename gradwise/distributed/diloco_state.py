"""DiLoCo's syncs under way and its checkpoints (``gradwise.distributed.diloco``).

``state_dict()`` has one layout for a configuration from the first step on, so that
``torch.distributed.checkpoint`` can load it into a fresh DiLoCo's: the optimizers' states through
``gradwise.distributed.layout``, one slot per fragment for its sync under way (a fragment has at most one:
an all-reduce applies at most ``sync_every`` steps after it starts, when the next one starts), and every
kind of traffic. A codec's all-gathered bytes are saved decoded and summed (what the outer step will use).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from gradwise.core.collectives import Traffic
from gradwise.distributed.layout import load_optimizer_layout, optimizer_layout
from gradwise.distributed.sharded import flat_of, per_parameter, shard, traffic_from, traffic_state


@dataclass
class Pending:
    """A fragment's sync under way: the summed pseudo-gradients (one buffer per device and dtype, each
    with its parameter indices; with a codec, every worker's encoded bytes, in rank order) and the
    collectives filling them, applied after inner step ``apply_at``."""

    fragment: int
    apply_at: int
    buffers: list[tuple[list[int], Tensor | list[Tensor]]]
    works: list[Any]
    #: eager updates: this worker's own pseudo-gradient in each buffer, as it was sent (before the sum;
    #: with a codec, decoded)
    own: list[Tensor] | None = None

    def wait(self) -> None:
        for work in self.works:
            if work is not None:
                work.wait()
        self.works = [None] * len(self.works)


class DiLoCoState:
    """``state_dict`` and ``load_state_dict`` of ``DiLoCo`` (a mixin: it reads DiLoCo's attributes)."""

    def state_dict(self) -> dict[str, Any]:
        """This worker's state: the inner and outer optimizers' (``gradwise.distributed.layout``), the
        synced copy, the step count, one slot per fragment for its sync under way (``apply_at`` -1 when
        none) and what was sent. One layout from the first step on, so that ``torch.distributed.checkpoint``
        loads it into a fresh DiLoCo's; each worker's is its own (key it by rank under DCP)."""
        for pending in self.pending:
            pending.wait()
        slots = []
        for f in range(len(self.fragments)):
            pending = next((p for p in self.pending if p.fragment == f), None)
            if pending is None:
                first = [self.params[members[0]] for members in self._buckets(f)]
                summed = [torch.zeros(sum(shard(self.params[i]).numel() for i in members), device=p.device,
                                      dtype=self.pseudo_gradient_dtype or p.dtype)
                          for members, p in zip(self._buckets(f), first)]
                slots.append({"apply_at": -1, "summed": summed,
                              "own": [t.clone() for t in summed] if self.eager else None})
            else:
                slots.append({"apply_at": pending.apply_at,
                              "summed": [self._summed(pending, b).clone() if self.codec else summed.clone()
                                         for b, (_, summed) in enumerate(pending.buffers)],
                              "own": None if pending.own is None else [t.clone() for t in pending.own]})
        traffic = self.traffic.state_dict(("all_reduce", "all_gather"))
        if self.sharded:  # what differs between the ranks of a worker group, as DTensors (``sharded``)
            for f, slot in enumerate(slots):
                for key in ("summed", "own"):
                    if slot[key] is not None:
                        slot[key] = [per_parameter(t, [self.params[i] for i in members])
                                     for t, members in zip(slot[key], self._buckets(f))]
            traffic = traffic_state(traffic, self.params[0])
        state = {"inner": optimizer_layout(self.inner), "outer": [optimizer_layout(o) for o in self.outer],
                 "synced": [s.clone() for s in self.synced], "local_step": self.local_step,
                 "sync_every": self.sync_every, "fragments": len(self.fragments), "overlap": self.overlap,
                 "eager": self.eager, "pending": slots, "traffic": traffic, "gaps": [g.clone() for g in self.gaps]}
        if self.powersgd is not None:
            state["powersgd"] = self.powersgd.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from ``state_dict()``: mid-phase too, bit-identically. Checked before anything is written."""
        keys = {"inner", "outer", "synced", "local_step", "sync_every", "fragments", "overlap", "pending", "traffic"}
        missing = keys - set(state)
        if missing:
            raise ValueError(f"DiLoCo.load_state_dict: the state lacks {sorted(missing)}")
        for key, mine in (("sync_every", self.sync_every), ("fragments", len(self.fragments)),
                          ("overlap", self.overlap), ("eager", self.eager)):
            if state.get(key, False) != mine:  # a state saved before eager updates existed has no "eager"
                raise ValueError(f"DiLoCo.load_state_dict: the state has {key}={state.get(key, False)!r}, this DiLoCo"
                                 f" {key}={mine!r}; build it with the same {key}")
        synced = state["synced"]
        if len(synced) != len(self.synced) or any(s.shape != t.shape or s.dtype != t.dtype
                                                  for s, t in zip(synced, self.synced)):
            raise ValueError("DiLoCo.load_state_dict: the synced copy's shapes or dtypes differ from the"
                             " parameters'; load a state saved for this model")
        gaps = state.get("gaps", [])
        if len(gaps) != len(self.gaps) or any(g.shape != s.shape for g, s in zip(gaps, self.gaps)):
            raise ValueError(f"DiLoCo.load_state_dict: the state holds {len(gaps)} staleness gaps, this DiLoCo"
                             f" {len(self.gaps)} (staleness_penalty={self.staleness_penalty}); build it with a"
                             " staleness penalty exactly when the saved one had one")
        if (self.powersgd is None) != ("powersgd" not in state):
            raise ValueError("DiLoCo.load_state_dict: the state was saved with" + (" no" if self.powersgd else "")
                             + " PowerSGD state; build it with the saved pseudo_gradient_codec")
        if self.powersgd is not None:
            self.powersgd.check(state["powersgd"])
        # a slot per fragment (apply_at -1: none under way), or, saved before that layout, a list of the
        # syncs under way, each naming its fragment
        pending = [{"fragment": p.get("fragment", f), "apply_at": p["apply_at"],
                    "summed": [_flat(t) for t in p["summed"]],
                    "own": None if p.get("own") is None else [_flat(t) for t in p["own"]]}
                   for f, p in enumerate(state["pending"]) if p["apply_at"] >= 0]
        for p in pending:
            sizes = [sum(shard(self.params[i]).numel() for i in members) for members in self._buckets(p["fragment"])]
            if any([t.numel() for t in buffers] != sizes for buffers in (p["summed"], p["own"] or p["summed"])):
                raise ValueError(f"DiLoCo.load_state_dict: a pending sync of fragment {p['fragment']} holds"
                                 f" {[t.numel() for t in p['summed']]} elements, this model's {sizes}")
        # a state saved before the layout of gradwise.distributed.layout holds the optimizers' own state_dicts
        layouts = [o if "started" in o else {"state_dict": o, "started": True}
                   for o in (state["inner"], *state["outer"])]
        load_optimizer_layout(self.inner, layouts[0])
        for outer, saved in zip(self.outer, layouts[1:]):
            load_optimizer_layout(outer, saved)
        with torch.no_grad():
            for s, saved in zip(self.synced + self.gaps, synced + gaps):
                s.copy_(saved)
        if self.powersgd is not None:
            self.powersgd.load_state_dict(state["powersgd"])
        self.local_step = int(state["local_step"])
        pending.sort(key=lambda p: (p["apply_at"], p["fragment"]))  # the queue's order: oldest first
        self.pending = [Pending(p["fragment"], p["apply_at"], list(zip(self._buckets(p["fragment"]), p["summed"])),
                                [None] * len(p["summed"]), p["own"]) for p in pending]
        traffic = state["traffic"]
        self.traffic = Traffic.from_state_dict(traffic if isinstance(traffic, dict) else traffic_from(traffic))


def _flat(saved: Tensor | list[Tensor]) -> Tensor:
    """A bucket's saved buffer, flat (saved under FSDP2: one DTensor per parameter)."""
    return flat_of(saved) if isinstance(saved, list) else saved.clone()
