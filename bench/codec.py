#!/usr/bin/env python
"""What the integer codecs cost against a torch AdamW step: ``python bench/codec.py``.

The logic lives in ``gradwise/bench_codec.py``; ``--help`` lists the options.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from gradwise.bench_codec import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
