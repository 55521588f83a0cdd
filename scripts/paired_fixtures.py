#!/usr/bin/env python3
"""Regenerates crates/statistics/tests/fixtures/paired_stats.json: paired samples with the answers of
scipy.stats.ttest_rel (paired t-test), statsmodels' exact McNemar test and scipy's binomtest
(sign test), which the Rust paired statistics must match to 1e-6.

    .venv/bin/pip install scipy statsmodels
    .venv/bin/python scripts/paired_fixtures.py > crates/statistics/tests/fixtures/paired_stats.json
"""
import json
import sys

import numpy as np
import scipy
import statsmodels
from scipy import stats
from statsmodels.stats.contingency_tables import mcnemar

rng = np.random.default_rng(20261130)
ttest = []
for n, shift, sd in [(50, 0.0, 1.0), (50, 0.3, 1.0), (8, 2.0, 3.0), (400, -0.05, 0.5), (3, 1.0, 1.0)]:
    c = rng.normal(10.0, 2.0, n)
    t = (c + rng.normal(shift, sd, n)).round(6)
    c = c.round(6)
    r = stats.ttest_rel(t, c)
    ci = r.confidence_interval(0.95)
    ttest.append({"control": c.tolist(), "treatment": t.tolist(), "t": float(r.statistic), "p_value": float(r.pvalue),
                  "df": float(r.df), "ci_low": float(ci.low), "ci_high": float(ci.high)})
mc = []
for n, p_c, p_t in [(50, 0.6, 0.6), (50, 0.4, 0.7), (200, 0.5, 0.55), (12, 0.5, 0.9)]:
    c = rng.random(n) < p_c
    t = rng.random(n) < p_t
    table = [[int(np.sum(c & t)), int(np.sum(c & ~t))], [int(np.sum(~c & t)), int(np.sum(~c & ~t))]]
    r = mcnemar(table, exact=True)
    mc.append({"control": c.tolist(), "treatment": t.tolist(), "p_value": float(r.pvalue)})
sign = []
for wins, losses, ties in [(30, 20, 5), (45, 5, 0), (10, 10, 3), (0, 7, 1), (1, 0, 0)]:
    r = stats.binomtest(wins, wins + losses, 0.5)
    sign.append({"wins": wins, "losses": losses, "ties": ties, "p_value": float(r.pvalue)})
json.dump({"scipy": scipy.__version__, "statsmodels": statsmodels.__version__, "ttest_rel": ttest, "mcnemar": mc,
           "sign": sign}, sys.stdout, indent=1)
print()
