"""Low-communication training across workers: DiLoCo (``diloco.py``)."""
from gradwise.distributed.diloco import DiLoCo, outer_nesterov

__all__ = ["DiLoCo", "outer_nesterov"]
