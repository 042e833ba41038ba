"""Cluster training speed (global steps/s) of asynchronous parameter-server training.

All models take ``X`` with :data:`CLUSTER_COLUMNS`: the single-GPU step time of the workers'
GPU type (s, measured with one worker and one PS), the model's #parameters and #tensors, the
number of workers and the number of parameter servers.

``PSQueueModel`` (cmdare) treats the cluster as a closed queueing network: each worker spends
``Z`` seconds on its own (forward/backward, its share of the network) and then needs the PS for
``S = s0 + s1 * params + s2 * tensors`` seconds (apply the gradient, serve the parameters), queueing
behind other workers. Exact mean-value analysis (MVA) gives the throughput: linear in workers while
the PS is idle, flattening at ``1 / S`` when it saturates (P100 with 1 PS flattens at 4-5
workers). With ``p`` PS the load of each comes from the placement (:mod:`cmdare.predict.ps_load`:
``round-robin`` over whole tensors by default, as TensorFlow placed them in CM-DARE's runs):
PS ``j`` holding ``params_j`` parameters in ``blocks_j`` blocks needs
``S_j = s0 + s1 * params_j + s2 * blocks_j`` per update, a worker talks to all of them in parallel,
and the busiest one (``max_j S_j``) limits the cluster. The three costs are fitted on the 1-PS data
only; ``psld`` (balanced load) gives ``s0 + (s1 * params + s2 * tensors) / p``.
``Z = t_single - S`` comes from each worker's single-GPU step time, so mixed GPU types are classes
of one multi-class MVA (:meth:`PSQueueModel.predict_mixed`).

Baselines: ``SumOfWorkers`` (w / t_single) and ``OptimusModel``, the Optimus (EuroSys'18) form
``f(p, w) = w / (t0 + t1 w / p + t2 w + t3 p)`` fitted per workload (needs measurements of the
workload itself, which cmdare's model does not).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np
from scipy.optimize import least_squares, nnls
from sklearn.base import BaseEstimator, RegressorMixin
from sklearn.utils.validation import check_is_fitted, validate_data

from cmdare.predict.features import fixed_width

__all__ = ["CLUSTER_COLUMNS", "OptimusModel", "PSQueueModel", "SumOfWorkers", "mva_throughput"]

_EXACT_MVA_MAX_POPULATIONS = 20_000  # beyond this many population vectors use Schweitzer's MVA
CLUSTER_COLUMNS = ("Single Step Time (s)", "Number of Parameters", "Number of Tensors", "Workers", "PS")


def mva_throughput(think_s: Sequence[float], counts: Sequence[int], demand_s: float) -> float:
    """Exact multi-class MVA of workers (delay ``think_s`` per class) sharing one PS queue.

    With several PS a worker talks to all of them in parallel; they are symmetric, so the network
    is approximated by one queue whose demand is one PS's share (the fork-join sync is ignored).

    Args:
        think_s: time each class of worker spends away from the PS per step.
        counts: number of workers of each class.
        demand_s: service time of one update at one PS.

    Returns:
        Total steps per second of all workers together.
    """
    think = [max(float(z), 0.0) for z in think_s]
    counts = [int(n) for n in counts]
    if sum(counts) == 0:
        return 0.0
    if int(np.prod([n + 1 for n in counts])) > _EXACT_MVA_MAX_POPULATIONS:
        return _schweitzer_throughput(think, counts, demand_s)
    queue: dict[tuple[int, ...], float] = {}  # mean queue length at one station, per population
    total = 0.0
    for pop in itertools.product(*(range(n + 1) for n in counts)):
        if sum(pop) == 0:
            queue[pop] = 0.0
            continue
        q = 0.0
        total = 0.0
        for k, n_k in enumerate(pop):
            if n_k == 0:
                continue
            less = tuple(n - (j == k) for j, n in enumerate(pop))
            resp = demand_s * (1.0 + queue[less])
            x_k = n_k / (think[k] + resp)
            q += x_k * resp
            total += x_k
        queue[pop] = q
    return total


def _schweitzer_throughput(think: list[float], counts: list[int], demand_s: float, iters: int = 2000) -> float:
    """Bard-Schweitzer approximate MVA (for many classes x many workers, where exact MVA is slow)."""
    active = [(z, n) for z, n in zip(think, counts, strict=True) if n > 0]
    q = np.array([n / 2.0 for _, n in active])
    z = np.array([t for t, _ in active])
    n = np.array([c for _, c in active], dtype=float)
    x = np.zeros_like(q)
    for _ in range(iters):
        resp = demand_s * (1.0 + q.sum() - q / n)
        x = n / (z + resp)
        new_q = x * resp
        if np.max(np.abs(new_q - q)) < 1e-10:
            break
        q = 0.5 * q + 0.5 * new_q
    return float(x.sum())


class PSQueueModel(RegressorMixin, BaseEstimator):
    """cmdare's cluster-speed model: closed queueing network with PS capacity (module docstring).

    Args:
        loss: robust loss of ``scipy.optimize.least_squares`` on log speed.
        f_scale: scale of that loss (log units; 0.05 ~ 5%).
        placement: how tensors are placed on several PS (:data:`~cmdare.predict.ps_load.PLACEMENT_NAMES`).
    """

    def __init__(self, loss: str = "soft_l1", f_scale: float = 0.05, placement: str = "round-robin"):
        self.loss = loss
        self.f_scale = f_scale
        self.placement = placement

    def _demand(
        self, theta: np.ndarray, params: np.ndarray, tensors: np.ndarray, ps: np.ndarray, placement: str | None = None
    ) -> np.ndarray:
        """Service time of one update at the busiest PS, per row."""
        from cmdare.predict.ps_load import BALANCED, ps_loads

        s0, s1, s2 = theta
        placement = placement or self.placement
        out = s0 + (s1 * params / 1e6 + s2 * tensors / 100.0) / ps  # balanced load (and any 1-PS cluster)
        if placement != BALANCED:
            for i in np.flatnonzero(np.asarray(ps) > 1):
                loads = ps_loads(float(params[i]), float(tensors[i]), int(ps[i]), placement)
                out[i] = max(s0 + s1 * pj / 1e6 + s2 * bj / 100.0 for pj, bj in loads)
        return out

    def _predict_rows(self, theta: np.ndarray, X: np.ndarray) -> np.ndarray:
        ps = np.maximum(np.round(np.abs(X[:, 4])), 1)
        d1 = self._demand(theta, X[:, 1], X[:, 2], np.ones(len(X)))
        dp = self._demand(theta, X[:, 1], X[:, 2], ps)
        out = np.empty(len(X))
        for i, row in enumerate(X):
            think = max(abs(row[0]) - d1[i], 1e-6)
            workers = int(max(round(abs(row[3])), 1))
            out[i] = mva_throughput([think], [workers], dp[i])
        return out

    def fit(self, X, y):
        """Fit the three PS cost coefficients on log speed; returns self."""
        X, y = validate_data(self, X, y, y_numeric=True)
        X = fixed_width(X, 5)
        y_log = np.log(np.maximum(np.abs(y), 1e-9))

        def resid(log_theta):
            return np.log(np.maximum(self._predict_rows(np.exp(log_theta), X), 1e-12)) - y_log

        best = None
        for start in ([1e-3, 5e-3, 1e-3], [5e-3, 1e-3, 5e-3]):
            res = least_squares(
                resid,
                np.log(start),
                loss=self.loss,
                f_scale=self.f_scale,
                bounds=(np.log(1e-7), np.log(10.0)),
            )
            if best is None or res.cost < best.cost:
                best = res
        self.ps_cost_s_ = np.exp(best.x)  # s0 (s/update), s1 (s per M params), s2 (s per 100 tensors)
        return self

    def predict(self, X):
        """Global steps per second for each row."""
        check_is_fitted(self, "ps_cost_s_")
        X = fixed_width(validate_data(self, X, reset=False), 5)
        return self._predict_rows(self.ps_cost_s_, X)

    def ps_update_s(self, num_params: float, num_tensors: float, ps: int = 1, placement: str | None = None) -> float:
        """Seconds the busiest PS spends on one update (1 / the cluster's capacity in steps/s)."""
        check_is_fitted(self, "ps_cost_s_")
        return float(
            self._demand(
                self.ps_cost_s_, np.array([num_params]), np.array([num_tensors]), np.array([ps]), placement
            )[0]
        )

    def predict_mixed(
        self,
        single_step_s: Sequence[float],
        counts: Sequence[int],
        num_params: float,
        num_tensors: float,
        ps: int = 1,
        placement: str | None = None,
        demand_scale: float = 1.0,
    ) -> float:
        """Steps/s of a cluster with ``counts[k]`` workers whose single-GPU step time is
        ``single_step_s[k]`` (one entry per GPU type), sharing ``ps`` parameter servers placed by
        ``placement`` (default: the model's); ``demand_scale`` multiplies the PS service time (a
        machine's own PS / host capacity, :mod:`cmdare.predict.refine`)."""
        check_is_fitted(self, "ps_cost_s_")
        d1 = self.ps_update_s(num_params, num_tensors, 1) * demand_scale
        dp = self.ps_update_s(num_params, num_tensors, ps, placement) * demand_scale
        think = [max(t - d1, 1e-6) for t in single_step_s]
        return mva_throughput(think, counts, dp)


class SumOfWorkers(RegressorMixin, BaseEstimator):
    """Baseline: cluster speed is the sum of the workers' single-GPU speeds (no PS limit)."""

    def fit(self, X, y):
        """Nothing to learn; records the input shape. Returns self."""
        validate_data(self, X, y, y_numeric=True)
        self.fitted_ = True
        return self

    def predict(self, X):
        """``workers / single step time``."""
        check_is_fitted(self, "fitted_")
        X = fixed_width(validate_data(self, X, reset=False), 5)
        return np.maximum(np.round(np.abs(X[:, 3])), 1) / np.maximum(np.abs(X[:, 0]), 1e-9)


class OptimusModel(RegressorMixin, BaseEstimator):
    """Baseline: Optimus's ``f(p, w) = w / (t0 + t1 w/p + t2 w + t3 p)``, NNLS per workload.

    A workload is a distinct (single step time, #params) pair; one never seen in training falls
    back to sum-of-workers.
    """

    def fit(self, X, y):
        """Fit t0..t3 per workload on ``w / f``; returns self."""
        X, y = validate_data(self, X, y, y_numeric=True)
        X = fixed_width(X, 5)
        self.groups_ = []
        self.coef_ = []
        for key in sorted({(round(r[0], 9), round(r[1])) for r in X}):
            rows = (np.round(X[:, 0], 9) == key[0]) & (np.round(X[:, 1]) == key[1])
            A = self._design(X[rows])
            target = np.maximum(np.round(np.abs(X[rows, 3])), 1) / np.maximum(np.abs(y[rows]), 1e-9)
            w = 1 / np.maximum(target, 1e-9)
            coef, _ = nnls(A * w[:, None], target * w)
            self.groups_.append(key)
            self.coef_.append(coef)
        self.coef_ = np.array(self.coef_)
        return self

    @staticmethod
    def _design(X: np.ndarray) -> np.ndarray:
        w = np.maximum(np.round(np.abs(X[:, 3])), 1)
        p = np.maximum(np.round(np.abs(X[:, 4])), 1)
        return np.column_stack([np.ones(len(X)), w / p, w, p])

    def predict(self, X):
        """Steps per second."""
        check_is_fitted(self, "coef_")
        X = fixed_width(validate_data(self, X, reset=False), 5)
        out = np.maximum(np.round(np.abs(X[:, 3])), 1) / np.maximum(np.abs(X[:, 0]), 1e-9)
        index = {g: k for k, g in enumerate(self.groups_)}
        A = self._design(X)
        for i, r in enumerate(X):
            k = index.get((round(r[0], 9), round(r[1])))
            if k is not None:
                denom = A[i] @ self.coef_[k]
                if denom > 0:
                    out[i] = A[i, 1] * np.maximum(np.round(abs(r[4])), 1) / denom
        return out
