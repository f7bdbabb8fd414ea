"""The arena: AlgoPerf-style time-to-result for training algorithms on CPU-sized workloads.

``workloads``: the tasks (data, model, loss, evaluation, target); ``submissions``: what is entered (a recipe
plus hyperparameters, a search space, or a self-tuning default); ``runner``: one timed trial; ``rulesets``:
external tuning and self-tuning; ``store``: every trial in an Optuna RDB storage (SQLite or PostgreSQL);
``scoring``: ratios, profiles, the benchmark score; ``report``: Markdown and HTML with figures.
"""
