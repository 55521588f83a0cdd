#!/usr/bin/env python3
"""Regenerates crates/statistics/tests/fixtures/gbstats.json: samples with the answers of GrowthBook's
own stats engine (gbstats), confseq and statsmodels, which the Rust statistics must match to
1e-6 (crates/statistics/tests/gbstats_fixtures.rs):

- sequential: gbstats SequentialTwoSidedTTest (absolute difference) — confidence sequence and
  always-valid p-value — and confseq's two-sided normal mixture bound for the same width;
- bayesian: gbstats EffectBayesianABTest (relative uplift, default flat prior) — chance to
  win, uplift, credible interval, risk;
- ratio: gbstats RatioStatistic (delta method) — ratio and variance — then TwoSidedTTest on it;
- welch: gbstats TwoSidedTTest (absolute), the same test as scipy's Welch;
- adjust: statsmodels multipletests, holm and fdr_bh.

confseq has no wheel for Python 3.11; it builds from source with Boost's headers and a newer
pybind11 than it pins:

    apt-get install libboost-dev
    python3 -m venv /tmp/gb && /tmp/gb/bin/pip install gbstats==0.8.0 scipy statsmodels ninja \
        "pybind11<2.12" scikit-build cmake setuptools wheel
    PATH=/tmp/gb/bin:$PATH /tmp/gb/bin/pip install --no-build-isolation confseq==0.0.11
    /tmp/gb/bin/python scripts/gbstats_fixtures.py > crates/statistics/tests/fixtures/gbstats.json
"""
import importlib.metadata
import json
import sys

import numpy as np
import confseq.boundaries as cb
from gbstats.bayesian.tests import EffectBayesianABTest, EffectBayesianConfig
from gbstats.frequentist.tests import (FrequentistConfig, SequentialConfig, SequentialTwoSidedTTest,
                                       TwoSidedTTest)
from gbstats.models.statistics import RatioStatistic, SampleMeanStatistic
from statsmodels.stats.multitest import multipletests

rng = np.random.default_rng(20261201)


def stat(xs):
    xs = np.asarray(xs)
    return SampleMeanStatistic(n=len(xs), sum=float(xs.sum()), sum_squares=float((xs ** 2).sum()))


def sample(n, mu, sd):
    return rng.normal(mu, sd, n).round(4).tolist()


means = []
for n_a, n_b, mu_a, mu_b, sd_a, sd_b, tuning in [
    (40, 45, 10.0, 10.0, 2.0, 2.0, 5000.0),
    (300, 280, 5.0, 5.4, 1.0, 2.5, 5000.0),
    (1500, 1600, 100.0, 101.0, 15.0, 14.0, 5000.0),
    (200, 220, 0.3, 0.35, 0.5, 0.5, 1000.0),
    (2500, 2500, 20.0, 19.2, 6.0, 7.0, 20000.0),
]:
    a, b = sample(n_a, mu_a, sd_a), sample(n_b, mu_b, sd_b)
    sa, sb = stat(a), stat(b)
    s = SequentialTwoSidedTTest(sa, sb, SequentialConfig(difference_type="absolute", sequential_tuning_parameter=tuning)).compute_result()
    n = n_a + n_b
    var = sa.variance / n_a + sb.variance / n_b
    # confseq's two-sided normal mixture in units of the per-unit sd, at intrinsic time N
    width = float(cb.normal_mixture_bound(float(n), 0.05, tuning, 0.05, False)) / n * np.sqrt(var * n)
    case = {"control": a, "treatment": b, "tuning": tuning,
            "sequential": {"ci_low": s.ci[0], "ci_high": s.ci[1], "p_value": s.p_value, "confseq_half_width": width}}
    r = EffectBayesianABTest(sa, sb, EffectBayesianConfig()).compute_result()
    case["bayesian"] = ({"chance_to_win": r.chance_to_win, "uplift": r.expected,
                     "uplift_sd": r.uplift.stddev, "ci_low": r.ci[0], "ci_high": r.ci[1],
                     "risk_control": r.risk[0], "risk_treatment": r.risk[1]})
    w = TwoSidedTTest(sa, sb, FrequentistConfig(difference_type="absolute")).compute_result()
    case["welch"] = {"p_value": w.p_value, "ci_low": w.ci[0], "ci_high": w.ci[1]}
    means.append(case)


def ratio_stat(pairs):
    x = np.array([p[0] for p in pairs])
    y = np.array([p[1] for p in pairs])
    return RatioStatistic(n=len(pairs), m_statistic=SampleMeanStatistic(n=len(x), sum=float(x.sum()), sum_squares=float((x ** 2).sum())),
                          d_statistic=SampleMeanStatistic(n=len(y), sum=float(y.sum()), sum_squares=float((y ** 2).sum())),
                          m_d_sum_of_products=float((x * y).sum()))


ratio = []
for n_a, n_b, tokens_a, tokens_b, p_a, p_b in [(400, 420, 120.0, 100.0, 0.6, 0.62), (150, 160, 80.0, 95.0, 0.3, 0.45)]:
    def units(n, tokens, p):
        # per unit: output tokens over a few requests (numerator), successes (denominator)
        k = rng.integers(1, 4, n)
        return [(float(np.round(rng.gamma(4.0, tokens / 4.0, kk).sum(), 3)), float(rng.binomial(kk, p))) for kk in k]
    a, b = units(n_a, tokens_a, p_a), units(n_b, tokens_b, p_b)
    ra, rb = ratio_stat(a), ratio_stat(b)
    w = TwoSidedTTest(ra, rb, FrequentistConfig(difference_type="absolute")).compute_result()
    s = SequentialTwoSidedTTest(ra, rb, SequentialConfig(difference_type="absolute")).compute_result()
    bz = EffectBayesianABTest(ra, rb, EffectBayesianConfig()).compute_result()
    ratio.append({"control": a, "treatment": b, "control_ratio": ra.mean, "control_variance": ra.variance,
                  "treatment_ratio": rb.mean, "treatment_variance": rb.variance,
                  "p_value": w.p_value, "ci_low": w.ci[0], "ci_high": w.ci[1],
                  "sequential_ci_low": s.ci[0], "sequential_ci_high": s.ci[1], "sequential_p_value": s.p_value,
                  "chance_to_win": bz.chance_to_win, "risk_treatment": bz.risk[1]})

adjust = []
for p in [[0.01, 0.04, 0.03, 0.2], [0.001, 0.5, 0.049, 0.049, 0.02, 0.9, 0.0001], [0.3, 0.6]]:
    adjust.append({"p": p, "holm": multipletests(p, method="holm")[1].tolist(),
                   "bh": multipletests(p, method="fdr_bh")[1].tolist()})

versions = {k: importlib.metadata.version(k) for k in ["gbstats", "confseq", "statsmodels", "scipy"]}
json.dump({"versions": versions, "means": means, "ratio": ratio, "adjust": adjust}, sys.stdout, separators=(",", ":"))
print()
