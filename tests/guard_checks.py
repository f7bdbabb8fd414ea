"""A log of the compiled steps' guard checks and graph runs, in order, for tests of when a step checks its calls."""
from __future__ import annotations

from gradwise.core.ahead import GuardedGraphs


def log_guard_checks(monkeypatch) -> list[str]:
    """``GuardedGraphs``' guard checks ("check"; "fail" where no kept entry passed) and the runs of the entries that
    passed ("run"), appended in order from now on. A graph compiled or loaded by a call runs unlogged."""
    events, passing = [], GuardedGraphs._passing

    def spying(self, key, frame):
        run = passing(self, key, frame)
        events.append("check" if run is not None else "fail")
        if run is None:
            return None

        def logged(**arguments):
            events.append("run")
            return run(**arguments)
        return logged

    monkeypatch.setattr(GuardedGraphs, "_passing", spying)
    return events
