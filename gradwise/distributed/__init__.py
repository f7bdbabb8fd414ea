"""Low-communication training across workers: DiLoCo (``diloco.py``; CO2's released outer step,
``co2.py``), DeMo (``demo.py``) and PowerSGD: torch's DDP hook with its bytes counted (``powersgd.py``), and in place
of FSDP2's gradient reduce-scatter (``powersgd_fsdp.py``)."""
from gradwise.distributed.co2 import CO2OuterMomentum
from gradwise.distributed.demo import DeMo
from gradwise.distributed.diloco import DiLoCo, outer_nesterov

__all__ = ["CO2OuterMomentum", "DeMo", "DiLoCo", "outer_nesterov"]
