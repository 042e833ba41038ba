"""Ray's exceptions mapped once onto cmdare's error tree: which part of the run a failure hit.

* a worker's actor or node died (``RayActorError`` that is not a task error) -> :class:`WorkerLostError`
* an error raised inside a live worker while it talked to a shard (``RayTaskError``: the worker's
  push or pull failed because the shard died) -> :class:`ShardLostError`
* a call that did not answer in time (``GetTimeoutError``) -> :class:`TransientError` (retryable)
* a mistake in the user's code on a worker (a ``RayTaskError`` whose cause is a ``UserInputError``: its data,
  model, loss or metric raised) -> :func:`user_mistake` gives its one line; the run ends with it
* anything else -> final: re-raised as it is
"""

from __future__ import annotations

from cmdare.errors import ShardLostError, TransientError, UserInputError, WorkerLostError

__all__ = ["classify", "user_mistake"]


def user_mistake(err: BaseException) -> str | None:
    """The one line of a user's mistake a worker's call raised (its data, model, loss or metric failed:
    :meth:`~cmdare.tasks.Task.step_loss`), or None when the failure is no such mistake."""
    cause = getattr(err, "cause", None)
    return str(cause) if isinstance(cause, UserInputError) else None


def classify(err: BaseException, worker_id: int = -1) -> TransientError | None:
    """The cmdare error for a Ray failure of a call to worker ``worker_id``, or None when it is final."""
    import ray

    if isinstance(err, ray.exceptions.RayTaskError) and user_mistake(err) is None:  # a shard the worker used died
        return ShardLostError(-1, f"worker {worker_id}'s call failed inside the worker ({type(err).__name__})")
    if isinstance(err, ray.exceptions.RayActorError):  # the worker's actor or its node is gone
        return WorkerLostError(worker_id, type(err).__name__)
    if isinstance(err, ray.exceptions.GetTimeoutError):
        return TransientError(f"worker {worker_id} did not answer in time")
    return None
