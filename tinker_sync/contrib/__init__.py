"""Adapters between tinker_sync and other libraries (each imports its library on use only).

- :mod:`tinker_sync.contrib.ray`: :class:`~tinker_sync.contrib.ray.RayExecutor`, a
  ``concurrent.futures.Executor`` that runs each call as a Ray task (for the cookbook's
  ``set_rollout_executor`` and any code written against executors).
"""

__all__: list[str] = []
