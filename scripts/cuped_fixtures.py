#!/usr/bin/env python3
"""Regenerates crates/ab/tests/fixtures/cuped.json: units of two variants with outcome events
before their first exposure (some inside the 14-day lookback window, some older) and after it,
and for CUPED metric definitions (`sum`, `binary`, `count`, `mean` with lower is better, a capped
`sum`) the answers of GrowthBook's stats engine (gbstats) with regression adjustment:
`RegressionAdjustedStatistic` per variant (post = the unit's events from its exposure on, pre =
its events in the window before, 0 without any; binary metrics as `ProportionStatistic`; caps
at the pooled percentile of post and of pre values separately), θ from `compute_theta`,
`TwoSidedTTest` (absolute) and `EffectBayesianABTest`. crates/ab/tests/cuped.rs loads the events
into the store (pre events timestamped days before the exposures) and checks the results to
1e-6.

    python3 -m venv /tmp/gb && /tmp/gb/bin/pip install gbstats==0.8.0
    /tmp/gb/bin/python scripts/cuped_fixtures.py > crates/ab/tests/fixtures/cuped.json
"""
import importlib.metadata
import json
import sys

import numpy as np
from gbstats.bayesian.tests import EffectBayesianABTest, EffectBayesianConfig
from gbstats.frequentist.tests import FrequentistConfig, TwoSidedTTest
from gbstats.models.statistics import (ProportionStatistic, RegressionAdjustedStatistic, SampleMeanStatistic,
                                       compute_theta)

rng = np.random.default_rng(20261205)

# each unit has a level; its events before and after exposure scatter around it
units = []
for variant, n, lift in [("a", 300, 1.0), ("b", 320, 1.1)]:
    for i in range(n):
        level = float(rng.lognormal(np.log(20.0), 0.6))
        active = rng.random() < 0.8

        def draw(k, mult):
            return [float(np.round(rng.lognormal(np.log(level * mult), 0.3), 3)) for _ in range(k)]

        pre = [(float(np.round(rng.uniform(0.5, 13.5), 3)), v) for v in draw(int(rng.integers(0, 4)) if active else 0, 1.0)]
        old = [(float(np.round(rng.uniform(20, 40), 3)), v) for v in draw(int(rng.integers(0, 3)), 1.0)]
        post = draw(int(rng.integers(0, 4)) if active else 0, lift)
        units.append({"unit": f"{variant}{i}", "variant": variant, "pre": pre + old, "post": post})

definitions = [
    {"name": "revenue", "aggregation": "sum", "direction": "higher"},
    {"name": "purchase", "aggregation": "binary", "direction": "higher"},
    {"name": "orders", "aggregation": "count", "direction": "higher"},
    {"name": "wait", "aggregation": "mean", "direction": "lower"},
    {"name": "revenue_capped", "aggregation": "sum", "direction": "higher", "cap": 0.95},
]
LOOKBACK = 14.0


def unit_value(agg, xs):
    if agg == "sum":
        return float(sum(xs))
    if agg == "count":
        return float(len(xs))
    if agg == "binary":
        return 1.0 if xs else 0.0
    if not xs:
        return None
    return float(np.mean(xs)) if agg == "mean" else float(max(xs))


def capped(pairs, p):
    """Caps post and pre values at their own pooled percentile."""
    ys = [y for _, y, _ in pairs]
    xs = [x for _, _, x in pairs]
    cy, cx = float(np.percentile(ys, p * 100)), float(np.percentile(xs, p * 100))
    return [(v, min(y, cy), min(x, cx)) for v, y, x in pairs], cy


cases = []
for d in definitions:
    agg = d["aggregation"]
    pairs = []  # (variant, post, pre)
    for u in units:
        y = unit_value(agg, u["post"])
        if y is None:
            continue
        x = unit_value(agg, [v for days, v in u["pre"] if days <= LOOKBACK])
        pairs.append((u["variant"], y, 0.0 if x is None else x))
    cap = None
    if "cap" in d:
        pairs, cap = capped(pairs, d["cap"])

    def stat(variant, adjusted=True):
        ys = np.array([y for v, y, _ in pairs if v == variant])
        xs = np.array([x for v, _, x in pairs if v == variant])

        def one(vals):
            if agg == "binary":
                return ProportionStatistic(n=len(vals), sum=float(vals.sum()))
            return SampleMeanStatistic(n=len(vals), sum=float(vals.sum()), sum_squares=float((vals ** 2).sum()))

        if not adjusted:
            return one(ys)
        return RegressionAdjustedStatistic(n=len(ys), post_statistic=one(ys), pre_statistic=one(xs),
                                           post_pre_sum_of_products=float((xs * ys).sum()), theta=0)

    theta = compute_theta(stat("a"), stat("b"))
    sa, sb = stat("a"), stat("b")
    w = TwoSidedTTest(sa, sb, FrequentistConfig(difference_type="absolute"))
    wr = w.compute_result()
    ua, ub = stat("a", False), stat("b", False)
    unadjusted = TwoSidedTTest(ua, ub, FrequentistConfig(difference_type="absolute"))
    bz = EffectBayesianABTest(stat("a"), stat("b"), EffectBayesianConfig(inverse=d["direction"] == "lower")).compute_result()
    cases.append({"definition": {**d, "cuped": True}, "cap_value": cap, "theta": theta,
                  "n": [sa.n, sb.n], "post_mean": [ua.mean, ub.mean], "pre_mean": [sa.pre_statistic.mean, sb.pre_statistic.mean],
                  "adjusted_mean": [w.stat_a.mean, w.stat_b.mean],
                  "variance_reduction": 1 - w.variance / unadjusted.variance,
                  "p_value": wr.p_value, "ci_low": wr.ci[0], "ci_high": wr.ci[1],
                  "unadjusted_p_value": unadjusted.compute_result().p_value,
                  "chance_to_win": bz.chance_to_win, "risk_control": bz.risk[0], "risk_treatment": bz.risk[1]})

json.dump({"versions": {"gbstats": importlib.metadata.version("gbstats")}, "lookback_days": LOOKBACK,
           "units": units, "cases": cases}, sys.stdout, separators=(",", ":"))
print()
