"""Bandits through a real server (issue 30): an experiment with `mode = "bandit"` routes units by
the weights the server's loop sets from the decision metric's outcome events (Thompson sampling
after an exploration period, a floor per arm), keeps each unit on its first variant when the
weights change, and, once the leader beats every other arm under the always-valid test (Holm),
names it the `winner` in /results and sends every unit to it."""
import json
import random
import subprocess
import time

import openai
from playwright.sync_api import expect, sync_playwright

from conftest import BINARY, Server
from test_adapters import CHROMIUM, http


def route(c, experiment, unit):
    raw = c.chat.completions.with_raw_response.create(
        model=f"experiment:{experiment}", messages=[{"role": "user", "content": "Hi"}], user=unit)
    return raw.headers["x-abserve-variant"]


def reward(rng, variant, best, effect):
    return rng.gauss(effect if variant == best else 0.0, 0.5)


def results(s, name):
    status, text = http("GET", s.url + f"/experiments/{name}/results")
    assert status == 200, text
    return json.loads(text)


def wait_for(s, name, cond, timeout=20):
    deadline = time.time() + timeout
    while time.time() < deadline:
        r = results(s, name)
        if cond(r):
            return r
        time.sleep(0.2)
    raise AssertionError(f"{name}: {json.dumps(r.get('bandit'))}")


def test_a_bandit_moves_traffic_keeps_units_and_names_its_winner():
    s = Server("--guardrail-interval", "0.2")
    try:
        c = openai.OpenAI(base_url=s.url, api_key="unused")
        rng = random.Random(4)
        variants = [{"id": v, "max_tokens": 1} for v in ("a", "b", "c")]
        bandit = {"exploration_units": 15, "update_seconds": 0.5, "floor": 0.02}
        exp = {"name": "arms", "mode": "bandit", "decision_metric": "reward", "bandit": bandit,
               "guardrails": [], "variants": variants}
        status, text = http("POST", s.url + "/experiments", exp)
        assert status == 201, text
        bad = dict(exp, name="bad", decision_metric="latency_ms")
        status, text = http("POST", s.url + "/experiments", bad)
        assert status == 400 and "outcome events" in text, text

        # exploration: equal weights until every arm has 15 units with a reward
        first = {}
        for u in range(75):
            first[f"u{u}"] = v = route(c, "arms", f"u{u}")
            http("POST", s.url + "/experiments/arms/events",
                 {"unit": f"u{u}", "metric": "reward", "value": reward(rng, v, "c", 0.6)})
        assert set(first.values()) == {"a", "b", "c"}
        r = wait_for(s, "arms", lambda r: r["bandit"]["arms"][2]["weight"] > 0.5)
        arms = {a["variant"]: a for a in r["bandit"]["arms"]}
        assert arms["c"]["chance_best"] > 0.9 and arms["a"]["weight"] >= 0.02, arms
        assert abs(sum(a["weight"] for a in arms.values()) - 1) < 1e-9
        assert "winner" not in r["bandit"], r["bandit"]
        assert r["srm"] is None
        # the weights changed: the first units keep their variants, new ones go mostly to c
        for u, v in first.items():
            assert route(c, "arms", u) == v, u
        new = [route(c, "arms", f"n{u}") for u in range(40)]
        assert new.count("c") > 20, new
    finally:
        s.stop()


def test_a_clear_winner_is_named_and_takes_every_unit():
    s = Server("--guardrail-interval", "0.2")
    try:
        c = openai.OpenAI(base_url=s.url, api_key="unused")
        rng = random.Random(5)
        exp = {"name": "clear", "mode": "bandit", "decision_metric": "reward", "sequential_tuning": 100,
               "bandit": {"exploration_units": 15, "update_seconds": 0.3}, "guardrails": [],
               "variants": [{"id": v, "max_tokens": 1} for v in ("a", "b", "c")]}
        status, text = http("POST", s.url + "/experiments", exp)
        assert status == 201, text
        for u in range(90):
            v = route(c, "clear", f"u{u}")
            http("POST", s.url + "/experiments/clear/events",
                 {"unit": f"u{u}", "metric": "reward", "value": reward(rng, v, "b", 3.0)})
        r = wait_for(s, "clear", lambda r: "winner" in r["bandit"])
        w = r["bandit"]["winner"]
        assert w["variant"] == "b" and w["units"] >= 45, w
        assert all(p < 0.05 for _, p in w["p_values"]), w
        assert [a["weight"] for a in r["bandit"]["arms"]] == [0.0, 1.0, 0.0]
        assert {route(c, "clear", f"late{u}") for u in range(10)} == {"b"}
        # the CLI reads the same from the store
        out = subprocess.run([str(BINARY), "experiments", "results", "clear", "--data-dir", s.data_dir],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0 and "winner b at" in out.stdout, out.stdout + out.stderr
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            page = browser.new_page()
            page.goto(s.base + "/#/e/clear")
            expect(page.locator("#bandit-winner")).to_have_attribute("data-variant", "b")
            expect(page.locator('#bandit tr[data-variant="b"] [data-k="weight"]')).to_have_text("100%")
            browser.close()
    finally:
        s.stop()
