"""The folder ``gradwise arena run --submission`` puts first on ``sys.path`` for the run, so that a module written
against AlgoPerf's PyTorch submission interface imports ``algoperf.spec`` and ``algoperf.pytorch_utils`` as it
would inside AlgoPerf (``gradwise/arena/algoperf_submission.py``). Nothing imports it under its gradwise name."""
