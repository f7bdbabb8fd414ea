"""Low-communication training across workers: DiLoCo (``diloco.py``), DeMo (``demo.py``) and PowerSGD's
DDP hook with its bytes counted (``powersgd.py``)."""
from gradwise.distributed.demo import DeMo
from gradwise.distributed.diloco import DiLoCo, outer_nesterov

__all__ = ["DeMo", "DiLoCo", "outer_nesterov"]
