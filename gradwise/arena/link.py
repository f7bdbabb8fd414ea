"""A simulated network link: what the collectives a worker ran would cost on a slower network than loopback.

The model (alpha-beta, one latency per collective): every collective a worker starts costs
``latency + wire_bytes / bandwidth`` seconds, where ``wire_bytes`` is what a ring algorithm puts on this
worker's link for the payload ``gradwise.core.collectives.Traffic`` counts (``N`` workers):

* all-reduce of ``s`` bytes: a ring reduce-scatter then all-gather sends ``2 (N - 1) / N x s``;
* all-gather of this worker's ``s`` bytes: the ring forwards ``N - 1`` chunks of ``s``: ``(N - 1) x s``;
* all-to-all: the chunks addressed to the others, sent once (Traffic counts them so): ``1 x s``.

So a trial's simulated time is its measured training time plus, summed over every collective it ran,
``latency + wire_bytes / bandwidth``: the communication is taken as not overlapped with compute (an upper
bound for DiLoCo's overlapped variants), and the ring's ``2 (N - 1)`` hops are charged one latency, not
``2 (N - 1)`` (a lower bound where latency dominates). The measured time already holds the collectives' cost on
loopback gloo, which the simulated link adds to rather than replaces.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from gradwise.core.collectives import Traffic

#: a 1 Gbit/s link in bytes per second
GIGABIT = 1e9 / 8


def wire_factor(kind: str, workers: int) -> float:
    """The bytes a ring puts on a worker's link per byte of payload ``Traffic`` counts for ``kind``."""
    factors = {"all_reduce": 2 * (workers - 1) / workers, "all_gather": workers - 1.0, "all_to_all": 1.0}
    if kind not in factors:
        raise ValueError(f"invalid collective kind={kind!r}: expected one of {sorted(factors)}")
    return factors[kind]


@dataclass(frozen=True)
class Link:
    """``bandwidth`` in bytes per second (> 0; default 1 Gbit/s), ``latency`` in seconds per collective (>= 0)."""

    bandwidth: float = GIGABIT
    latency: float = 1e-4

    def __post_init__(self) -> None:
        if isinstance(self.bandwidth, bool) or not isinstance(self.bandwidth, (int, float)) \
                or not 0 < self.bandwidth < math.inf:
            raise ValueError(f"invalid link bandwidth={self.bandwidth!r}: expected a finite number > 0 (bytes/s)")
        if isinstance(self.latency, bool) or not isinstance(self.latency, (int, float)) \
                or not 0 <= self.latency < math.inf:
            raise ValueError(f"invalid link latency={self.latency!r}: expected a finite number >= 0 (seconds)")

    def wire_bytes(self, traffic: Traffic, workers: int) -> float:
        """What the ring puts on this worker's link for everything ``traffic`` counted."""
        return sum(wire_factor(kind, workers) * n for kind, n in traffic.bytes_sent.items())

    def seconds(self, traffic: Traffic, workers: int) -> float:
        """The link's cost of ``traffic``: ``collectives x latency + wire_bytes / bandwidth``."""
        return sum(traffic.calls.values()) * self.latency + self.wire_bytes(traffic, workers) / self.bandwidth

    def describe(self) -> dict[str, float | str]:
        return {"bandwidth": float(self.bandwidth), "latency": float(self.latency),
                "model": "measured + sum over collectives of (latency + wire_bytes / bandwidth); ring all-reduce"
                         " 2(N-1)/N x size, all-gather (N-1) x size"}
