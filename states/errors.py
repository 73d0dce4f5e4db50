"""Errors `states/` raises for a model that cannot run as asked (torch-free, so the
front door can catch them without importing torch)."""


class ModelLoadError(ValueError):
    """The model directory cannot be used as asked; the message says why and what to do."""


class UnclassifiedModelError(ValueError):
    """The config and the model's declarations do not say how to run it."""
