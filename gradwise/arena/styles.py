"""One look per submission across a report: a short name, a color and a line style, assigned once per report
from the set of submissions (in the order of their full names, so the same set gets the same looks in every
run, whatever the scores), and the hyperparameters the short name leaves out, for the report's own table.

A submission run with ``--hyperparameters`` is stored as ``torch.SGD{"lr"=0.1,...}``; its short name is the
optimizer, ``torch.SGD``, numbered (``torch.SGD #1``, ``#2``, in the order of the full names) when another
submission shortens to the same name. Colors are matplotlib's ``tab10``, then ten darker ones; past ten
submissions lines are dashed, past twenty dotted, so curves stay apart where colors repeat.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Iterable

PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
           "#17becf",  # tab10
           "#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173", "#3182bd", "#e6550d", "#31a354", "#756bb1",
           "#636363")  # the darkest of each group in tab20b and tab20c
LINESTYLES = ("-", "--", ":")


@dataclass(frozen=True)
class Look:
    """How one submission appears in every figure and table of a report."""

    short: str
    color: str
    linestyle: str


def _value(v: Any) -> str:
    """A hyperparameter's value: floats to 6 significant digits, the rest as JSON writes them."""
    return f"{v:g}" if isinstance(v, float) else json.dumps(v)


def _point(point: dict[str, Any]) -> str:
    return ", ".join(f"{k}={_value(v)}" for k, v in point.items())


def _space(space: dict[str, dict] | list[dict[str, Any]]) -> str:
    """AlgoPerf's dict form as ranges and sets, its list form as the points."""
    if isinstance(space, list):
        return "points: " + "; ".join(_point(p) for p in space)
    parts = []
    for key, spec in space.items():
        if "feasible_points" in spec:
            parts.append(f"{key} in {{{', '.join(_value(v) for v in spec['feasible_points'])}}}")
        else:
            parts.append(f"{key} in [{_value(spec['min'])}, {_value(spec['max'])}]"
                         f"{' log' if spec.get('scaling') == 'log' else ''}")
    return "; ".join(parts)


def settings(spec: dict[str, Any]) -> str:
    """A study spec's hyperparameters or search space, e.g. ``lr=0.1, momentum=0.9``; a multi-worker study's
    end with its workers and simulated link (its times are measured + link)."""
    if spec.get("space") is not None:
        text = _space(spec["space"])
    elif spec.get("hyperparameters"):
        text = _point(spec["hyperparameters"])
    else:
        text = "the submission's own" if spec.get("module") else "the optimizer's defaults"
    if "workers_per_trial" in spec:
        text += (f"; on {spec['workers_per_trial']} gloo workers, time = measured + simulated link"
                 f" ({spec['link_bandwidth']:.3g} bytes/s, {spec['link_latency']:g} s per collective)")
    return text


def short_names(names: Iterable[str]) -> dict[str, str]:
    """Full name -> short name: the part before ``{``, numbered where two submissions would share one."""
    names = sorted(set(names))
    base = {n: n.split("{", 1)[0] for n in names}
    result, count = {}, {}
    for n in names:
        if n == base[n] or sum(base[m] == base[n] for m in names) == 1:
            result[n] = base[n]
        else:
            count[base[n]] = count.get(base[n], 0) + 1
            result[n] = f"{base[n]} #{count[base[n]]}"
    return result


def looks(names: Iterable[str]) -> dict[str, Look]:
    """Full name -> ``Look`` for every submission of a report, in palette order (sorted full names)."""
    shorts = short_names(names)
    return {n: Look(shorts[n], PALETTE[i % len(PALETTE)], LINESTYLES[i // 10 % len(LINESTYLES)])
            for i, n in enumerate(sorted(shorts))}
