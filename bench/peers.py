#!/usr/bin/env python
"""Agreement with pytorch-optimizer and heavyball (Muon, SOAP): ``python bench/peers.py``.

The logic lives in ``gradwise/bench_peers.py``; ``--help`` lists the options.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from gradwise.bench_peers import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
