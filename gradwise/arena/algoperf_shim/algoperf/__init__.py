"""The part of AlgoPerf's ``algoperf`` package a PyTorch submission imports, for gradwise's arena: ``spec`` (the
submission API's enums, types and ``Workload`` base) and ``pytorch_utils.pytorch_setup``. Not AlgoPerf itself:
mlcommons/algorithmic-efficiency (v0.6) is the reference; this copies its names, not its code."""

__version__ = "0.6.0+gradwise.arena"
