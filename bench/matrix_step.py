#!/usr/bin/env python
"""Matrix optimizers: plain, recomputing and amortized step times: ``python bench/matrix_step.py --size 25m``.

The logic lives in ``gradwise/bench_matrix.py``; ``--help`` lists the options.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from gradwise.bench_matrix import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
