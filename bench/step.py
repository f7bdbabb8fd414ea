#!/usr/bin/env python
"""Optimizer step benchmark: ``python bench/step.py --size 124m`` (same as ``gradwise bench step``).

The logic lives in ``gradwise/bench_step.py``; ``--help`` lists the options.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from gradwise.bench_step import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
