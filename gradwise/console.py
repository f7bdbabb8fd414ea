"""The rich console that ``gradwise``'s commands and the benchmarks print their tables and progress on."""
from __future__ import annotations


def console(stderr: bool = False):
    """A rich console (the caller has checked ``gradwise.extras.require(..., "cli")``); 160 columns
    wide when the output is not a terminal."""
    from rich.console import Console

    out = Console(stderr=stderr, log_path=False)  # progress lines without the source location
    return out if out.is_terminal else Console(stderr=stderr, width=160, log_path=False)
