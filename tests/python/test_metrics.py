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


def test_a_harmful_treatment_is_stopped_by_its_guardrail():
    """A treatment whose units give thumbs-down 8x as often as control's is stopped by its
    guardrail: the stop is stored with its evidence and shows in /results, /metrics and the
    dashboard, and the variant takes no new units (its bucket is served the control, unrecorded)."""
    from conftest import Server
    from test_adapters import metric
    s = Server("--guardrail-interval", "0.3")
    try:
        exp = {"name": "harsh", "variants": [{"id": "control", "max_tokens": 1}, {"id": "harsh", "max_tokens": 1}],
               "metrics": [{"name": "thumbs_down", "aggregation": "binary", "direction": "lower"}],
               "guardrails": ["thumbs_down", {"metric": "error", "tolerance": 0.5}]}
        status, text = http("POST", s.url + "/experiments", exp)
        assert status in (200, 201), text
        assert json.loads(text)["guardrails"] == [{"metric": "thumbs_down", "tolerance": 0.0},
                                                  {"metric": "error", "tolerance": 0.5}]
        c = openai.OpenAI(base_url=s.url, api_key="unused")
        rng = random.Random(8)

        def visit(u):
            raw = c.chat.completions.with_raw_response.create(
                model="experiment:harsh", messages=[{"role": "user", "content": "Hi"}], user=f"u{u}")
            return raw.headers["x-abserve-variant"]

        events = []
        for u in range(300):
            v = visit(u)
            if rng.random() < (0.4 if v == "harsh" else 0.05):
                events.append({"unit": f"u{u}", "metric": "thumbs_down", "value": 1.0})
        status, text = http("POST", s.url + "/experiments/harsh/events", {"events": events})
        assert status == 200, text
        stopped = None
        for _ in range(100):
            status, text = http("GET", s.url + "/experiments/harsh/results")
            r = {v["id"]: v for v in json.loads(text)["variants"]}
            if r["harsh"]["state"] == "stopped":
                stopped = r["harsh"]["stopped"]
                break
            import time
            time.sleep(0.1)
        assert stopped is not None, r["harsh"]
        assert r["control"]["state"] == "active"
        assert stopped["metric"] == "thumbs_down" and stopped["p_value"] < 0.05 and stopped["ci_low"] > 0, stopped
        assert stopped["units"] == r["control"]["units"] + r["harsh"]["units"] and stopped["at"] > 0
        exposures = r["harsh"]["exposures"]
        # new units: none goes to the stopped variant, and its exposures stay as they were
        assert {visit(u) for u in range(300, 360)} == {"control"}
        status, text = http("GET", s.url + "/experiments/harsh/results")
        after = {v["id"]: v for v in json.loads(text)["variants"]}
        assert after["harsh"]["exposures"] == exposures
        assert metric(s, "abserve_guardrail_stops_total") == 1
        assert metric(s, 'abserve_experiment_variants_stopped{experiment="harsh"}') == 1
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            page = browser.new_page()
            page.goto(s.base + "/#/e/harsh")
            note = page.locator('#performance tr[data-variant="harsh"] .stopped')
            expect(note).to_contain_text(f"stopped by guardrail thumbs_down at {stopped['units']} units")
            expect(page.locator('#performance tr[data-variant="control"] .stopped')).to_have_count(0)
            browser.close()
    finally:
        s.stop()
