"""Where the arena caches generated or fetched data: ``$GRADWISE_CACHE`` or ``~/.cache/gradwise/arena``."""
from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    path = Path(os.environ.get("GRADWISE_CACHE", Path.home() / ".cache" / "gradwise" / "arena"))
    path.mkdir(parents=True, exist_ok=True)
    return path
