"""The experiment dashboard in a real headless browser (Debian's Chromium driven by Playwright),
against a real `abserve serve` with an API key: the key is asked for once, the seeded
experiments are listed, an experiment's page shows the numbers the results API gives, an
experiment made through the form takes a routed request, the KV gauge moves while requests run,
there are no console errors, and the data routes refuse requests without the key.

Screenshots at phone and desktop width go to $ABSERVE_DASHBOARD_SHOTS (docs/ when refreshing the
committed ones), else to a temporary folder.
"""
import os
import random
import re
import tempfile
import threading
import time
from pathlib import Path

import httpx2 as httpx
import openai
import pytest
from playwright.sync_api import expect, sync_playwright

from conftest import MODEL_ID, Server

KEY = "dash-key"
CHROMIUM = os.environ.get("ABSERVE_CHROMIUM", "/usr/bin/chromium")


@pytest.fixture(scope="module")
def srv():
    s = Server("--api-key", KEY, context=1024)
    yield s
    s.stop()


def api(s, method, path, **kw):
    r = httpx.request(method, s.base + path, headers={"Authorization": f"Bearer {KEY}"}, timeout=120, **kw)
    return r


def seed(s):
    """Two experiments with traffic through the openai SDK and outcome events through the API."""
    for name, shift in [("tone", 1.0), ("length", 0.0)]:
        r = api(s, "POST", "/v1/experiments", json={"name": name, "variants": [
            {"id": "terse", "system": "Answer in one word.", "temperature": 0, "max_tokens": 2},
            {"id": "warm", "system": "Answer warmly in one word.", "temperature": 0, "max_tokens": 2}]})
        assert r.status_code == 201, r.text
        client = openai.OpenAI(base_url=s.url, api_key=KEY)
        rng = random.Random(7)
        events = []

        def one(unit):
            resp = client.chat.completions.with_raw_response.create(
                model=f"experiment:{name}", user=unit, messages=[{"role": "user", "content": "Capital of France?"}])
            return unit, resp.headers["x-abserve-variant"]

        units = [f"{name}-user-{i}" for i in range(60)]
        results = []
        threads = []
        for chunk in range(0, len(units), 12):
            batch = units[chunk:chunk + 12]
            out = [None] * len(batch)

            def run(i, u):
                out[i] = one(u)
            threads = [threading.Thread(target=run, args=(i, u)) for i, u in enumerate(batch)]
            [t.start() for t in threads]
            [t.join() for t in threads]
            results += out
        for unit, variant in results:
            events.append({"unit": unit, "metric": "satisfaction", "value": rng.gauss(5, 1) + (shift if variant == "warm" else 0)})
        r = api(s, "POST", f"/v1/experiments/{name}/events", json={"events": events, "batch_id": f"{name}-1"})
        assert r.status_code == 200, r.text


def close(shown: str, want: float, rel=2e-3):
    """A number as the page shows it (4 significant digits, maybe a % or a sign) against the API's."""
    text = shown.replace("%", "").replace("+", "").replace("−", "-").strip()
    got = float(text)
    if shown.strip().endswith("%"):
        got /= 100
    return abs(got - want) <= rel * max(abs(want), 1e-3)


def test_dashboard_end_to_end(srv):
    seed(srv)
    shots = Path(os.environ.get("ABSERVE_DASHBOARD_SHOTS") or tempfile.mkdtemp(prefix="abserve-shots-"))
    shots.mkdir(parents=True, exist_ok=True)
    errors = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.on("console", lambda m: errors.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(f"page error: {e}"))

        # the key is asked for once and kept for the tab
        page.goto(srv.base + "/")
        page.fill("#api-key", KEY)
        page.click("#key-form button")
        rows = page.locator("#experiments tbody tr")
        expect(rows).to_have_count(2)  # tone, length
        expect(page.locator('tr[data-experiment="tone"] td[data-k="units"]')).to_have_text("60")
        page.screenshot(path=str(shots / "dashboard-list-desktop.png"), full_page=True)

        # an experiment's page shows what the results API says
        page.click('a[href="#/e/tone"]')
        expect(page.locator("#metric-table")).to_have_attribute("data-metric", "satisfaction")
        results = api(srv, "GET", "/v1/experiments/tone/results").json()
        for v in results["variants"]:
            m = v["metrics"]["satisfaction"]
            row = page.locator(f'#metric-table tr[data-variant="{v["id"]}"]')
            card = page.locator(f'#metric .compare[data-variant="{v["id"]}"]')
            assert close(row.locator('[data-k="mean"]').inner_text(), m["summary"]["mean"])
            assert float(row.locator('[data-k="mean"]').get_attribute("data-value")) == pytest.approx(m["summary"]["mean"], rel=1e-12)
            assert row.locator('[data-k="units"]').inner_text() == str(v["units"])
            if v["is_control"]:
                continue
            seq = m["sequential"]
            cs = card.locator('[data-k="seq"]')
            assert float(cs.get_attribute("data-low")) == pytest.approx(seq["ci_low"], rel=1e-12)
            lo, hi = re.findall(r"-?[\d.]+(?:e-?\d+)?", cs.inner_text())
            assert close(lo, seq["ci_low"]) and close(hi, seq["ci_high"])
            assert close(card.locator('[data-k="seq-p"]').inner_text(), seq["p_value"])
            assert close(card.locator('[data-k="p"]').inner_text(), m["vs_control"]["p_value"])
            assert close(card.locator('[data-k="ctw"]').inner_text(), m["bayesian"]["chance_to_beat_control"])
            assert close(card.locator('[data-k="risk"]').inner_text(), m["bayesian"]["risk_treatment"])
            assert close(card.locator('[data-k="holm"]').inner_text(), m["adjusted"]["holm"])
            assert close(card.locator('[data-k="bh"]').inner_text(), m["adjusted"]["bh"])
            assert float(card.locator('[data-k="uplift"]').get_attribute("data-value")) == pytest.approx(m["bayesian"]["uplift"], rel=1e-12)
            called = seq["ci_low"] > 0 or seq["ci_high"] < 0
            assert ("no difference" in card.locator('[data-k="verdict"]').inner_text()) != called
        expect(page.locator("#srm")).to_contain_text("ok")
        expect(page.locator("#chart svg")).to_be_visible()
        expect(page.locator("#exposures tbody tr")).to_have_count(20)
        perf = page.locator('#performance tr[data-variant="terse"] [data-k="exposures"]')
        assert perf.inner_text() == str(results["variants"][0]["exposures"])
        page.screenshot(path=str(shots / "dashboard-experiment-desktop.png"), full_page=True)
        page.set_viewport_size({"width": 390, "height": 844})
        page.reload()
        expect(page.locator("#chart svg")).to_be_visible()
        page.screenshot(path=str(shots / "dashboard-experiment-phone.png"), full_page=True)
        # nothing wider than the phone's screen but the scrolling tables
        overflow = page.evaluate("document.documentElement.scrollWidth")
        assert overflow <= 390, f"page is {overflow}px wide at phone width"
        page.set_viewport_size({"width": 1280, "height": 900})

        # pause and resume from the page, as an operator would
        page.click("#actions button:has-text('Pause')")
        expect(page.locator("#status")).to_have_text("paused")
        assert api(srv, "GET", "/v1/experiments/tone").json()["status"] == "paused"
        page.click("#actions button:has-text('Resume')")
        expect(page.locator("#status")).to_have_text("running")
        # weights are edited behind a warning that it biases results
        expect(page.locator("#weights")).to_contain_text("biases results")
        page.fill('#weights input[data-variant="warm"]', "3")
        page.click("#weights button")
        expect(page.locator("#weights")).to_contain_text("Weights saved")
        assert [v["weight"] for v in api(srv, "GET", "/v1/experiments/tone").json()["variants"]] == [1, 3]

        # create an experiment through the form, keyboard only for the name, then route to it
        page.goto(srv.base + "/#/new")
        page.focus('input[name="name"]')
        page.keyboard.type("from-form")
        page.fill('input[name="v0.system"]', "Be brief.")
        page.fill('input[name="v1.system"]', "Be kind.")
        page.fill('input[name="v0.max_tokens"]', "3")
        page.fill('input[name="v1.max_tokens"]', "3")
        page.fill('input[name="max_kv_share"]', "0.5")
        page.click("#create-form button[type=submit]")
        expect(page.locator("h1")).to_contain_text("from-form")
        # its KV share is shown against the quota from its definition, before anything runs
        expect(page.locator("#kv-share")).to_contain_text("quota 2048 cells (max_kv_share 0.5)")
        client = openai.OpenAI(base_url=srv.url, api_key=KEY)
        r = client.chat.completions.with_raw_response.create(model="experiment:from-form", user="u-form", messages=[{"role": "user", "content": "Hi"}])
        assert r.headers["x-abserve-experiment"] == "from-form"
        page.reload()
        expect(page.locator("#exposures tbody tr")).to_have_count(1)
        expect(page.locator("#exposures tbody tr")).to_contain_text("u-form")
        # a pasted TOML definition, as in experiments files
        page.goto(srv.base + "/#/new")
        page.fill("#definition", 'name = "pasted"\n[[variants]]\nid = "a"\n[[variants]]\nid = "b"\nweight = 2\n')
        page.click("#paste-form button")
        expect(page.locator("h1")).to_contain_text("pasted")
        assert [v["weight"] for v in api(srv, "GET", "/v1/experiments/pasted").json()["variants"]] == [1, 2]
        # a bad definition gets the API's reason on the page
        page.goto(srv.base + "/#/new")
        page.fill("#definition", '{"name": "bad", "variants": [{"id": "only"}]}')
        page.click("#paste-form button")
        expect(page.locator("#create-result")).to_contain_text("at least two variants")
        errors[:] = [e for e in errors if "status of 400" not in e]  # the browser logs the refused POST itself

        # the KV gauge moves while requests run
        page.goto(srv.base + "/#/")
        stop = threading.Event()

        def load():
            c = openai.OpenAI(base_url=srv.url, api_key=KEY)
            while not stop.is_set():
                c.chat.completions.create(model=MODEL_ID, max_tokens=200, temperature=0,
                                          messages=[{"role": "user", "content": "Write a long story about a lighthouse."}])
        workers = [threading.Thread(target=load) for _ in range(4)]
        [w.start() for w in workers]
        seen = 0
        deadline = time.time() + 60
        while time.time() < deadline and seen == 0:
            used = page.locator("#g-kv b").get_attribute("data-used")
            seen = int(used or 0)
            time.sleep(0.2)
        page.screenshot(path=str(shots / "dashboard-live-desktop.png"))
        stop.set()
        [w.join() for w in workers]
        assert seen > 0, "the KV gauge never showed cells in use while requests ran"
        browser.close()
    assert errors == [], errors


def test_data_routes_refuse_requests_without_the_key(srv):
    api(srv, "POST", "/v1/experiments", json={"name": "locked", "variants": [{"id": "a"}, {"id": "b"}]})
    for path in ["/v1/engine", "/v1/experiments", "/v1/experiments/locked", "/v1/experiments/locked/results",
                 "/v1/experiments/locked/history", "/v1/experiments/locked/exposures"]:
        assert httpx.get(srv.base + path).status_code == 401, path
        assert httpx.get(srv.base + path, headers={"Authorization": "Bearer wrong"}).status_code == 401, path
        assert api(srv, "GET", path).status_code == 200, path
    # the page and its assets carry no data; they load without a key and say a key is needed
    assert httpx.get(srv.base + "/").status_code == 200
    assert httpx.get(srv.base + "/dashboard/app.js").status_code == 200
    assert httpx.get(srv.base + "/dashboard/config.json").json() == {"auth_required": True}
