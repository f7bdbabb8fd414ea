"""The arena's workloads, by name."""
from __future__ import annotations

from gradwise.arena.workloads.base import Data, Workload
from gradwise.arena.workloads.digits import DigitsCNN
from gradwise.arena.workloads.lstsq import LstsqIllConditioned
from gradwise.arena.workloads.mnist1d_cnn import MNIST1DCNN
from gradwise.arena.workloads.shakespeare import ShakespeareCharLM
from gradwise.arena.workloads.shakespeare_gpt import ShakespeareGPT
from gradwise.arena.workloads.teacher_student import TeacherStudent

WORKLOADS: dict[str, type[Workload]] = {w.name: w for w in (
    DigitsCNN, LstsqIllConditioned, TeacherStudent, MNIST1DCNN, ShakespeareCharLM, ShakespeareGPT)}


def get_workload(name: str) -> Workload:
    """A fresh workload by name, its target taken from the committed ``targets.json`` when set there."""
    if name not in WORKLOADS:
        raise ValueError(f"unknown workload {name!r}; valid workloads: {sorted(WORKLOADS)}")
    workload = WORKLOADS[name]()
    from gradwise.arena.targets import committed_target

    target = committed_target(name)
    if target is not None:
        workload.target = target
    return workload


__all__ = ["WORKLOADS", "Data", "Workload", "get_workload"]
