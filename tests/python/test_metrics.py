"""Metric definitions through a real server (issue 30): an experiment created over the API with
`metrics` (aggregation, direction), units routed by real generations, outcome events posted,
and `/results` and the dashboard follow each definition — a wait where lower is better is
called better when it is lower, a purchase counts every exposed unit (0 without events)."""
import json
import random
import time

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


def stopped_by_guardrail(s, experiment, variant):
    """The guardrail stop of `variant` (failing if none comes within 10 s) and the results then,
    by variant id."""
    for _ in range(100):
        status, text = http("GET", s.url + f"/experiments/{experiment}/results")
        r = {v["id"]: v for v in json.loads(text)["variants"]}
        if r[variant]["state"] == "stopped":
            return r[variant]["stopped"], r
        time.sleep(0.1)
    raise AssertionError(f"{variant} was not stopped: {r[variant]}")


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
        stopped, r = stopped_by_guardrail(s, "harsh", "harsh")
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


def test_a_binary_metric_reads_0_as_no():
    """Clients that send 1 or 0 for every unit (a thumbs widget, TensorZero's boolean feedback):
    a unit converts only when one of its values is not 0, so each variant's rate is its share of
    1s and a treatment with 5x control's thumbs-down rate (0.5 against 0.1) is stopped by its
    guardrail. Before (issue 42, item 8) every unit that sent anything read as converted: both
    variants at 1.0, and the treatment was never stopped."""
    from conftest import Server
    s = Server("--guardrail-interval", "0.3")
    try:
        exp = {"name": "zeros", "variants": [{"id": "control", "max_tokens": 1}, {"id": "worse", "max_tokens": 1}],
               "metrics": [{"name": "thumbs_down", "aggregation": "binary", "direction": "lower"}],
               "guardrails": ["thumbs_down"]}
        status, text = http("POST", s.url + "/experiments", exp)
        assert status in (200, 201), text
        c = openai.OpenAI(base_url=s.url, api_key="unused")
        rng = random.Random(42)
        events, downs = [], {"control": [0, 0], "worse": [0, 0]}
        for u in range(300):
            raw = c.chat.completions.with_raw_response.create(
                model="experiment:zeros", messages=[{"role": "user", "content": "Hi"}], user=f"u{u}")
            v = raw.headers["x-abserve-variant"]
            down = rng.random() < (0.5 if v == "worse" else 0.1)
            downs[v][0] += down
            downs[v][1] += 1
            events.append({"unit": f"u{u}", "metric": "thumbs_down", "value": 1.0 if down else 0.0})
        status, text = http("POST", s.url + "/experiments/zeros/events", {"events": events})
        assert status == 200, text
        status, text = http("GET", s.url + "/experiments/zeros/results")
        r = {v["id"]: v for v in json.loads(text)["variants"]}
        for v, (n_down, n) in downs.items():
            summary = r[v]["metrics"]["thumbs_down"]["summary"]
            assert summary["n"] == n, summary
            # a unit whose only event is a 0 has not converted
            assert abs(summary["mean"] - n_down / n) < 1e-9, (v, summary, n_down, n)
        stopped, r = stopped_by_guardrail(s, "zeros", "worse")
        assert stopped["metric"] == "thumbs_down" and stopped["ci_low"] > 0, stopped
        assert r["control"]["state"] == "active"
    finally:
        s.stop()


def test_cuped_adjusts_with_events_from_before_the_first_exposure(server):
    """Units' spend last week (events timestamped before their first exposure) predicts their
    spend now: with `cuped = true` the results carry the adjusted read-out beside the plain one,
    with a narrower interval, the variance reduction and θ; the CLI-facing JSON and the
    dashboard show it; events older than the lookback window are left out."""
    s = server
    exp = {"name": "spend", "variants": [{"id": "a", "max_tokens": 1}, {"id": "b", "max_tokens": 1}],
           "metrics": [{"name": "spend", "aggregation": "sum", "cuped": True, "lookback_days": 7}]}
    status, text = http("POST", s.url + "/experiments", exp)
    assert status == 201, text
    assert json.loads(text)["metrics"][0]["cuped"] is True
    status, text = http("POST", s.url + "/experiments", dict(exp, name="bad", metrics=[{"name": "error", "cuped": True}]))
    assert status == 400 and "automatic metric" in text, text
    c = openai.OpenAI(base_url=s.url, api_key="unused")
    rng = random.Random(5)
    start = time.time()
    pre, post = [], []
    for u in range(80):
        raw = c.chat.completions.with_raw_response.create(
            model="experiment:spend", messages=[{"role": "user", "content": "Hi"}], user=f"s{u}")
        v = raw.headers["x-abserve-variant"]
        level = rng.gauss(50, 15)
        pre.append({"unit": f"s{u}", "metric": "spend", "value": level + rng.gauss(0, 4),
                    "timestamp": start - 3 * 86400})
        # a month ago: outside the 7-day window, must not count
        pre.append({"unit": f"s{u}", "metric": "spend", "value": 1000.0, "timestamp": start - 30 * 86400})
        post.append({"unit": f"s{u}", "metric": "spend", "value": level + rng.gauss(0, 4) + (3 if v == "b" else 0)})
    for batch in (pre, post):
        status, text = http("POST", s.url + "/experiments/spend/events", {"events": batch})
        assert status == 200, text
    status, text = http("GET", s.url + "/experiments/spend/results")
    assert status == 200, text
    b = {v["id"]: v for v in json.loads(text)["variants"]}["b"]["metrics"]["spend"]
    cu = b["cuped"]
    assert 0.8 < cu["theta"] < 1.2, cu
    assert cu["pre_mean"] < 100, cu  # the month-old 1000s are outside the window
    assert cu["variance_reduction"] > 0.5, cu
    plain, adjusted = b["vs_control"], cu["vs_control"]
    assert adjusted["ci_high"] - adjusted["ci_low"] < 0.7 * (plain["ci_high"] - plain["ci_low"])
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = browser.new_page()
        page.goto(s.base + "/#/e/spend")
        page.select_option("#metric", "spend")
        card = page.locator('#metric .compare[data-variant="b"]')
        expect(card.locator('[data-k="cuped-reduction"]')).to_contain_text("θ = ")
        expect(card.locator('[data-k="cuped-ci"]')).to_have_count(1)
        browser.close()


TOML = """
[[experiment]]
name = "from-file"
guardrails = ["error", { metric = "thumbs_down", tolerance = 0.05 }]
[[experiment.metrics]]
name = "spend"
aggregation = "sum"
cuped = true
lookback_days = 7
[[experiment.metrics]]
name = "thumbs_down"
aggregation = "binary"
direction = "lower"
cap = 0.99
[[experiment.variants]]
id = "a"
[[experiment.variants]]
id = "b"
system = "Be brief."
"""


def test_the_cli_creates_experiments_from_toml_with_every_field(server, tmp_path):
    """`abserve experiments create FILE` takes what the API takes: metric definitions (CUPED,
    caps, directions) and guardrails, through a server (`--url`, which checks the variants) or
    straight into a store; `delete` removes one."""
    import subprocess
    from conftest import BINARY
    f = tmp_path / "e.toml"
    f.write_text(TOML)
    run = lambda *a: subprocess.run([str(BINARY), "experiments", *a], capture_output=True, text=True, timeout=60)
    r = run("create", str(f), "--url", server.base)
    assert r.returncode == 0 and "created from-file" in r.stdout, r.stderr
    status, text = http("GET", server.url + "/experiments/from-file")
    e = json.loads(text)
    assert e["metrics"][0]["cuped"] is True and e["metrics"][0]["lookback_days"] == 7, e
    assert e["metrics"][1]["direction"] == "lower" and e["metrics"][1]["cap"] == 0.99, e
    assert {"metric": "thumbs_down", "tolerance": 0.05} in e["guardrails"], e
    r = run("create", str(f), "--url", server.base)
    assert r.returncode != 0 and "409" in r.stderr, r.stderr
    assert run("create", str(f), "--url", server.base, "--replace").returncode == 0
    # a variant the model cannot serve is refused by the server, with the API's message
    bad = tmp_path / "bad.toml"
    bad.write_text(TOML.replace('system = "Be brief."', 'max_tokens = 100000'))
    r = run("create", str(bad), "--url", server.base, "--replace")
    assert r.returncode != 0 and "variants.b.max_tokens" in r.stderr, r.stderr
    # straight into a store, then read back and deleted
    d = str(tmp_path / "store")
    r = run("create", str(f), "--data-dir", d)
    assert r.returncode == 0, r.stderr
    assert "from-file" in run("list", "--data-dir", d).stdout
    r = run("results", "from-file", "--data-dir", d)
    assert r.returncode == 0 and "CUPED" in r.stdout, r.stdout + r.stderr
    assert run("create", str(f), "--data-dir", d).returncode != 0
    assert run("delete", "from-file", "--data-dir", d).returncode == 0
    assert "from-file" not in run("list", "--data-dir", d).stdout
