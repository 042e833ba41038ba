"""The workers: the worker actor, their executor, warm spares, lost nodes."""
