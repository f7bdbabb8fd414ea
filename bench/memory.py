#!/usr/bin/env python
"""Optimizer state memory and quality benchmark: ``python bench/memory.py [--measure]``.

The logic lives in ``gradwise/bench_memory.py``; ``--help`` lists the options.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from gradwise.bench_memory import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
