"""Time/cost Pareto front (both minimized)."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["dominates", "pareto_front"]


def dominates(a: tuple[float, float], b: tuple[float, float]) -> bool:
    """True if ``a`` is no worse than ``b`` in both coordinates and better in one."""
    return a[0] <= b[0] and a[1] <= b[1] and (a[0] < b[0] or a[1] < b[1])


def pareto_front(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the non-dominated points, sorted by the first coordinate (time).

    Ties (equal points) keep the first one. O(n log n): sort by time, then cost, and keep each point
    cheaper than every faster one.
    """
    order = sorted(range(len(points)), key=lambda i: (points[i][0], points[i][1], i))
    front: list[int] = []
    best_cost = float("inf")
    for i in order:
        if points[i][1] < best_cost:
            front.append(i)
            best_cost = points[i][1]
    return front
