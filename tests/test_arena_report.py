"""The arena report's figures show the data they are given (axes chosen from the values, not from the metric's
name alone)."""
from __future__ import annotations

import matplotlib.figure
import pytest

from gradwise.arena.report import plot_curves


@pytest.mark.parametrize("metric,values,target,log", [
    ("loss", [2.5, 2.3, 2.1, 2.05], 2.08, False),      # a narrow loss range: linear, every point inside
    ("mse", [1.0, 0.1, 0.01, 0.002], 0.001, True),     # spans decades: log
    ("accuracy", [0.5, 0.9, 0.97, 0.985], 0.98, False),  # zoomed on the approach to the target
])
def test_curves_axes_hold_the_curve_and_target(tmp_path, monkeypatch, metric, values, target, log):
    seen = []
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", lambda fig, *a, **k: seen.extend(fig.axes))
    curve = [{"step": 10 * i, "time": float(i), metric: v} for i, v in enumerate(values, 1)]
    record = {"study_index": 0, "time_to_target": None, "best_metric": values[-1], "curve": curve}
    plot_curves({"records": {("A", "w"): [record]}}, {"w": (target, metric)}, tmp_path / "c.png")
    [ax] = seen
    low, high = ax.get_ylim()
    assert (ax.get_yscale() == "log") == log
    assert low <= target <= high and low <= values[-1] <= high
    if metric != "accuracy":
        assert low <= min(values) and max(values) <= high
