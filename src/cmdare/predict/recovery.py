"""Time to finish a training run after a worker is revoked and replaced.

Published (CM-DARE): while the replacement starts (overhead ``o`` seconds) the remaining cluster
keeps training at ``v_cur`` steps/s; afterwards it runs at ``v_new``:

    T = o + (S - s) / v_new - o * v_cur / v_new

cmdare's refinement (:func:`recovery_time_s`) adds what the formula leaves out: (1) the run may
finish before the replacement arrives, (2) a revoked chief costs a checkpoint restore before the
survivors continue, (3) the new worker's first steps are slow (graph build, warm-up; visible in the
TensorBoard exports as the first samples at 40-60% speed), modelled as ``warmup_s`` seconds at
``warmup_fraction`` of the gain it brings.
"""

from __future__ import annotations

from cmdare.errors import UserInputError

__all__ = ["recovery_time_published_s", "recovery_time_s"]


def _check(total_steps: float, done_steps: float, v_cur: float, v_new: float, overhead_s: float) -> None:
    if total_steps < 0 or done_steps < 0 or done_steps > total_steps:
        raise UserInputError(f"need 0 <= done steps ({done_steps}) <= total steps ({total_steps})")
    if v_new <= 0 or v_cur < 0 or overhead_s < 0:
        raise UserInputError(f"need v_new > 0, v_cur >= 0, overhead >= 0 (got {v_new}, {v_cur}, {overhead_s})")


def recovery_time_published_s(
    total_steps: float, done_steps: float, v_cur: float, v_new: float, overhead_s: float
) -> float:
    """CM-DARE's ``T = o + (S - s)/v_new - o * v_cur / v_new`` in seconds."""
    _check(total_steps, done_steps, v_cur, v_new, overhead_s)
    return overhead_s + (total_steps - done_steps) / v_new - overhead_s * v_cur / v_new


def recovery_time_s(
    total_steps: float,
    done_steps: float,
    v_cur: float,
    v_new: float,
    overhead_s: float,
    *,
    restore_s: float = 0.0,
    warmup_s: float = 30.0,
    warmup_fraction: float = 0.5,
) -> float:
    """Seconds to finish ``total_steps`` from ``done_steps`` after a revocation (cmdare's model).

    Args:
        total_steps: steps of the whole run (S).
        done_steps: steps done when the worker was revoked (s).
        v_cur: steps/s of the surviving cluster while the replacement starts.
        v_new: steps/s once the replacement works at full speed.
        overhead_s: seconds until the replacement joins (startup + framework start).
        restore_s: seconds the survivors stall first (checkpoint restore when the chief was lost).
        warmup_s: seconds the new worker needs to reach full speed.
        warmup_fraction: share of the speed gain the new worker delivers during its warm-up.
    """
    _check(total_steps, done_steps, v_cur, v_new, overhead_s)
    remaining = total_steps - done_steps
    if v_cur > 0 and remaining <= v_cur * overhead_s:  # finishes before the replacement arrives
        return restore_s + remaining / v_cur
    remaining -= v_cur * overhead_s
    v_warm = v_cur + warmup_fraction * (v_new - v_cur)
    if v_warm > 0 and remaining <= v_warm * warmup_s:
        return restore_s + overhead_s + remaining / v_warm
    remaining -= v_warm * warmup_s
    return restore_s + overhead_s + warmup_s + remaining / v_new
