#!/usr/bin/env python3
"""Regenerates crates/ab/tests/fixtures/metric_definitions.json: raw outcome events of units in
two variants, and for metric definitions (`binary`, `sum`, `count`, `mean`, `max`, a percentile
cap, `lower is better`) the answers of GrowthBook's stats engine (gbstats) on the per-unit values
GrowthBook's SQL would make of them: sum, count and binary over every exposed unit (0 without
events), mean and max over units with events, the cap at PERCENTILE_CONT of all units' values
(numpy's linear percentile), ProportionStatistic for binary metrics (a unit converts when one of
its values is not 0: `thumbs_up` has 0s for "no"), `inverse` for lower is
better. crates/ab/tests/metric_definitions.rs loads the events into the store and checks the
results to 1e-6.

    python3 -m venv /tmp/gb && /tmp/gb/bin/pip install gbstats==0.8.0
    /tmp/gb/bin/python scripts/metric_fixtures.py > crates/ab/tests/fixtures/metric_definitions.json
"""
import importlib.metadata
import json
import sys

import numpy as np
from gbstats.bayesian.tests import EffectBayesianABTest, EffectBayesianConfig
from gbstats.frequentist.tests import FrequentistConfig, TwoSidedTTest
from gbstats.models.statistics import ProportionStatistic, SampleMeanStatistic

rng = np.random.default_rng(20261204)

# units per variant; each unit has 0-5 events of "value" (a purchase amount, a wait time)
units = {}
for variant, n, p_any, scale in [("a", 300, 0.55, 20.0), ("b", 320, 0.65, 23.0)]:
    for i in range(n):
        k = int(rng.integers(1, 6)) if rng.random() < p_any else 0
        units[f"{variant}{i}"] = (variant, [float(np.round(rng.lognormal(np.log(scale), 0.9), 3)) for _ in range(k)])

# a thumbs metric from another stream (the one above stays as it was): 0-3 events per unit, each
# 1 ("yes") or 0 ("no", as clients send for a thumbs-down); a unit converts when one of its values
# is not 0, so a unit whose only events are 0s has not converted
trng = np.random.default_rng(20261206)
thumbs = {}
for u, (variant, _) in units.items():
    k = int(trng.integers(0, 4))
    thumbs[u] = [float(trng.random() < (0.3 if variant == "a" else 0.4)) for _ in range(k)]

definitions = [
    {"name": "purchase", "aggregation": "binary", "direction": "higher"},
    {"name": "thumbs_up", "aggregation": "binary", "direction": "higher"},
    {"name": "revenue", "aggregation": "sum", "direction": "higher"},
    {"name": "revenue_capped", "aggregation": "sum", "direction": "higher", "cap": 0.95},
    {"name": "orders", "aggregation": "count", "direction": "higher"},
    {"name": "wait", "aggregation": "mean", "direction": "lower"},
    {"name": "peak", "aggregation": "max", "direction": "lower", "cap": 0.9},
]


def unit_value(agg, xs):
    if agg == "sum":
        return float(sum(xs))
    if agg == "count":
        return float(len(xs))
    if agg == "binary":
        return 1.0 if any(x != 0 for x in xs) else 0.0
    if not xs:
        return None
    return float(np.mean(xs)) if agg == "mean" else float(max(xs))


cases = []
for d in definitions:
    per = {"a": [], "b": []}
    for u, (variant, xs) in units.items():
        if d["name"] == "thumbs_up":
            xs = thumbs[u]
        v = unit_value(d["aggregation"], xs)
        if v is not None:
            per[variant].append(v)
    cap = None
    if "cap" in d:
        cap = float(np.percentile(per["a"] + per["b"], d["cap"] * 100))
        per = {k: [min(x, cap) for x in v] for k, v in per.items()}

    def stat(xs):
        xs = np.asarray(xs)
        if d["aggregation"] == "binary":
            return ProportionStatistic(n=len(xs), sum=float(xs.sum()))
        return SampleMeanStatistic(n=len(xs), sum=float(xs.sum()), sum_squares=float((xs ** 2).sum()))

    sa, sb = stat(per["a"]), stat(per["b"])
    w = TwoSidedTTest(sa, sb, FrequentistConfig(difference_type="absolute")).compute_result()
    inverse = d["direction"] == "lower"
    bz = EffectBayesianABTest(sa, sb, EffectBayesianConfig(inverse=inverse)).compute_result()
    cases.append({"definition": d, "cap_value": cap,
                  "n": [sa.n, sb.n], "mean": [sa.mean, sb.mean], "variance": [sa.variance, sb.variance],
                  "p_value": w.p_value, "ci_low": w.ci[0], "ci_high": w.ci[1],
                  "chance_to_win": bz.chance_to_win, "risk_control": bz.risk[0], "risk_treatment": bz.risk[1]})

events = [{"unit": u, "variant": v, "values": xs} for u, (v, xs) in units.items()]
# the thumbs_up metric's events; every other metric has the values of `events`
thumbs_events = [{"unit": u, "values": xs} for u, xs in thumbs.items() if xs]
json.dump({"versions": {"gbstats": importlib.metadata.version("gbstats")}, "events": events,
           "thumbs_up_events": thumbs_events, "cases": cases},
          sys.stdout, separators=(",", ":"))
print()
