#!/usr/bin/env python
"""Convergence sweep on rotated ill-conditioned least squares: ``python bench/convergence.py``.

The logic lives in ``gradwise/bench_convergence.py``; ``--help`` lists the options.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from gradwise.bench_convergence import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
