"""Metric definitions through a real server (issue 30): an experiment created over the API with
`metrics` (aggregation, direction), units routed by real generations, outcome events posted,
and `/results` and the dashboard follow each definition — a wait where lower is better is
called better when it is lower, a purchase counts every exposed unit (0 without events)."""
import json
import random

import openai
from playwright.sync_api import expect, sync_playwright

from conftest import MODEL_ID
from test_adapters import CHROMIUM, http


def test_definitions_set_aggregation_and_direction(server):
    s = server
    exp = {"name": "waits", "variants": [{"id": "a", "max_tokens": 1}, {"id": "b", "max_tokens": 1}],
           "metrics": [{"name": "wait", "aggregation": "mean", "direction": "lower"},
                       {"name": "bought", "aggregation": "binary"}]}
    status, text = http("POST", s.url + "/experiments", exp)
    assert status in (200, 201), text
    bad = dict(exp, name="bad", metrics=[{"name": "wait", "aggregation": "median"}])
    status, text = http("POST", s.url + "/experiments", bad)
    assert status == 400 and "median" in text, text
    c = openai.OpenAI(base_url=s.url, api_key="unused")
    rng = random.Random(30)
    variant_of, events = {}, []
    for u in range(60):
        raw = c.chat.completions.with_raw_response.create(
            model="experiment:waits", messages=[{"role": "user", "content": "Hi"}], user=f"u{u}")
        v = raw.headers["x-abserve-variant"]
        variant_of[f"u{u}"] = v
        # b's waits are shorter; only some units buy (the rest count 0)
        events += [{"unit": f"u{u}", "metric": "wait", "value": rng.gauss(3.0 if v == "b" else 6.0, 1.0)}
                   for _ in range(rng.randint(1, 3))]
        if rng.random() < 0.5:
            events.append({"unit": f"u{u}", "metric": "bought", "value": 1.0})
    assert set(variant_of.values()) == {"a", "b"}
    status, text = http("POST", s.url + "/experiments/waits/events", {"events": events})
    assert status == 200, text
    status, text = http("GET", s.url + "/experiments/waits/results")
    assert status == 200, text
    r = {v["id"]: v for v in json.loads(text)["variants"]}
    wait = r["b"]["metrics"]["wait"]
    assert wait["definition"]["direction"] == "lower"
    assert wait["summary"]["mean"] < r["a"]["metrics"]["wait"]["summary"]["mean"]
    # lower is better: b's lower wait is a high chance to beat control, little risk
    assert wait["bayesian"]["chance_to_beat_control"] > 0.99, wait["bayesian"]
    assert wait["bayesian"]["risk_treatment"] < wait["bayesian"]["risk_control"]
    # binary over every exposed unit
    for v in ("a", "b"):
        assert r[v]["metrics"]["bought"]["summary"]["n"] == r[v]["units"]
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = browser.new_page()
        page.goto(s.base + "/#/e/waits")
        page.select_option("#metric", "wait")
        verdict = page.locator('#metric .compare[data-variant="b"] [data-k="verdict"]')
        expect(verdict).to_have_text("lower than control (better, lower is better)")
        expect(verdict).to_have_class("win")
        browser.close()
