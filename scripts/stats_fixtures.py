#!/usr/bin/env python3
"""Regenerates crates/statistics/tests/fixtures/scipy_stats.json: samples with scipy's answers for
Welch's t-test (ttest_ind, equal_var=False) and the chi-squared goodness-of-fit test, which the
Rust statistics must match to 1e-6.

    .venv/bin/pip install scipy
    .venv/bin/python scripts/stats_fixtures.py > crates/statistics/tests/fixtures/scipy_stats.json
"""
import json
import sys

import numpy as np
import scipy
from scipy import stats

rng = np.random.default_rng(20261129)
welch = []
for n_a, n_b, mu_a, mu_b, sd_a, sd_b in [
    (30, 30, 10.0, 10.0, 2.0, 2.0),
    (50, 80, 5.0, 5.6, 1.0, 2.5),
    (12, 200, 0.3, 0.1, 0.5, 0.2),
    (1000, 1000, 100.0, 100.5, 15.0, 15.0),
    (5, 7, -3.0, 4.0, 10.0, 1.0),
]:
    a = rng.normal(mu_a, sd_a, n_a).round(6).tolist()
    b = rng.normal(mu_b, sd_b, n_b).round(6).tolist()
    r = stats.ttest_ind(b, a, equal_var=False)
    ci = r.confidence_interval(0.95)
    welch.append({"control": a, "treatment": b, "t": float(r.statistic), "p_value": float(r.pvalue),
                  "df": float(r.df), "ci_low": float(ci.low), "ci_high": float(ci.high)})
chi = []
for observed, weights in [([5000, 5050], [0.5, 0.5]), ([5000, 5600], [0.5, 0.5]),
                          ([1900, 3100, 5000], [0.2, 0.3, 0.5]), ([120, 80, 100, 101], [0.25] * 4)]:
    total = sum(observed)
    r = stats.chisquare(observed, [total * w for w in weights])
    chi.append({"observed": observed, "weights": weights, "chi2": float(r.statistic), "p_value": float(r.pvalue)})
json.dump({"scipy": scipy.__version__, "welch": welch, "chisquare": chi}, sys.stdout, indent=1)
print()
