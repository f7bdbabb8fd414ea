"""The engine: transforms, chains, hyperparameter specs, the executors and the Optimizer class."""
