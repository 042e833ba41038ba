"""Spot lifetime models checked on data held out (issue 32): each bundled preemption trace split in time, the model
chosen by held-out likelihood fitted on the first half, and the second half's observed preemptions per server-hour
against that fit's expectation and against the catalog's assumed interruption rate (AWS 5-10%: 7.5%/month,
GCE Spot 12%/month).

Run: ``python bench/spot_heldout.py``; prints a table and, as its last line, one JSON object."""

from __future__ import annotations

import json

from cmdare.cloud.catalog_model import parse_interruption_rate
from cmdare.measure.lifetime_markets import ASSUMED_RATES
from cmdare.measure.spot_fits import SHIPPED_KEYS
from cmdare.measure.spot_traces import BUNDLED_TRACES, load_bundled_trace
from cmdare.measure.survival import heldout_check, select_by_heldout
from cmdare.measure.weibull import SpotLifetime


def main() -> None:
    out = {}
    print(f"{'trace':<22} {'model (1st half)':<18} {'2nd half: server-h':>18} {'observed/h':>11} "
          f"{'fitted/h':>9} {'z':>6} {'assumed/h':>10} {'z':>8}")
    for key in SHIPPED_KEYS:
        spans = load_bundled_trace(key).spans
        fit = select_by_heldout(spans)
        assumed = SpotLifetime.from_rate(*parse_interruption_rate(ASSUMED_RATES[BUNDLED_TRACES[key].cloud]))
        check = heldout_check(spans, fit.first_half_model, assumed)
        out[key] = {"chosen": fit.chosen, "first_half_params": fit.first_half_model.params(),
                    "heldout_server_hours": round(check["server_hours"], 1), "observed": check["observed"],
                    "observed_per_server_hour": round(check["observed_per_server_hour"], 4),
                    "fitted_per_server_hour": round(check["fitted_per_server_hour"], 4),
                    "fitted_z": round(check["fitted_z"], 1),
                    "assumption": ASSUMED_RATES[BUNDLED_TRACES[key].cloud],
                    "assumption_per_server_hour": round(check["assumption_per_server_hour"], 6),
                    "assumption_z": round(check["assumption_z"], 1)}
        r = out[key]
        print(f"{key:<22} {fit.chosen:<18} {r['heldout_server_hours']:>18} {r['observed_per_server_hour']:>11} "
              f"{r['fitted_per_server_hour']:>9} {r['fitted_z']:>6} {r['assumption_per_server_hour']:>10} "
              f"{r['assumption_z']:>8}")
    print(json.dumps({"spot_heldout": out}))


if __name__ == "__main__":
    main()
