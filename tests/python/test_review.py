"""The review page (issue 45) in a real headless Chromium (Playwright) against a real
`abserve serve` with keys: a reviewer opens an experiment's sampled conversations, moves with the
keyboard and rates one (thumbs up, a score, a label) — the rating appears in `/results` as event
metrics of the sample's unit; fan-out inputs are shown side by side, one column per variant; the
text filter narrows the list; desktop and phone widths, no console errors.

Screenshots go to $ABSERVE_DASHBOARD_SHOTS (docs/screenshots when refreshing the committed ones),
else to a temporary folder.
"""
import os
import tempfile
import time
from pathlib import Path

import httpx2 as httpx
import openai
import pytest
from playwright.sync_api import expect, sync_playwright

from conftest import Server

CHROMIUM = os.environ.get("ABSERVE_CHROMIUM", "/usr/bin/chromium")
REVIEWER, ADMIN = "sk-review-31", "sk-admin-77"
EXPERIMENTS = """
[[experiment]]
name = "tone"
[experiment.samples]
rate = 1.0
labels = ["wrong_language", "rude"]
[[experiment.variants]]
id = "terse"
system = "Answer in one word."
temperature = 0
max_tokens = 8
[[experiment.variants]]
id = "warm"
system = "Answer warmly, in one sentence."
temperature = 0
max_tokens = 8
"""


@pytest.fixture(scope="module")
def srv():
    d = tempfile.mkdtemp(prefix="abserve-review-")
    keys = Path(d) / "keys.toml"
    keys.write_text(f'[[key]]\nname = "rita"\nrole = "reviewer"\nkey = "{REVIEWER}"\n\n'
                    f'[[key]]\nname = "ops"\nrole = "admin"\nkey = "{ADMIN}"\n')
    exp = Path(d) / "experiments.toml"
    exp.write_text(EXPERIMENTS)
    s = Server("--keys", str(keys), "--experiments", str(exp), context=1024)
    yield s
    s.stop()


def api(s, method, path, key=ADMIN, **kw):
    return httpx.request(method, s.base + path, headers={"Authorization": f"Bearer {key}"}, timeout=120, **kw)


def seed(s):
    client = openai.OpenAI(base_url=s.url, api_key=ADMIN, max_retries=0)
    questions = ["What is the capital of France?", "Name a fruit.", "What colour is the sky?"]
    for i, q in enumerate(questions):
        client.chat.completions.create(model="experiment:tone", user=f"reader-{i}", messages=[{"role": "user", "content": q}])
    for q in ["Say hello.", "Name a river."]:
        r = api(s, "POST", "/v1/experiments/tone/fanout", json={"input": q})
        assert r.status_code == 200 and r.json()["input_id"], r.text
    deadline = time.time() + 30
    while len(api(s, "GET", "/v1/experiments/tone/samples").json()["data"]) < 7 and time.time() < deadline:
        time.sleep(0.2)
    assert len(api(s, "GET", "/v1/experiments/tone/samples").json()["data"]) == 7


def test_a_reviewer_rates_by_keyboard_and_the_rating_is_a_metric(srv):
    seed(srv)
    shots = Path(os.environ.get("ABSERVE_DASHBOARD_SHOTS") or tempfile.mkdtemp(prefix="abserve-shots-"))
    shots.mkdir(parents=True, exist_ok=True)
    errors = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.goto(srv.base + "/#/e/tone")
        page.fill("#api-key", REVIEWER)
        page.click("#key-form button[type=submit]")
        page.click("#review-link")
        cards = page.locator("article.sample")
        expect(cards).to_have_count(7)
        # the newest live sample first: fan-out samples were written last, skip past them
        live = page.locator("article.sample[data-unit^=reader-]")
        expect(live).to_have_count(3)
        page.locator("body").click()
        page.keyboard.press("j")
        for _ in range(10):
            if page.evaluate("document.activeElement.dataset.unit || ''").startswith("reader-"):
                break
            page.keyboard.press("j")
        unit = page.evaluate("document.activeElement.dataset.unit")
        variant = page.evaluate("document.activeElement.dataset.variant")
        assert unit.startswith("reader-")
        page.keyboard.press("u")
        page.keyboard.press("4")
        focused = page.locator(f"article.sample[data-unit={unit}]")
        expect(focused.locator("[data-k=review]")).to_contain_text("4/5")
        expect(focused.locator("[data-k=review]")).to_contain_text("▲ up")
        expect(focused.locator("[data-k=review]")).to_contain_text("rita")
        page.keyboard.press("l")
        focused.locator("[data-k=label]").select_option("wrong_language")
        expect(focused.locator("[data-k=review]")).to_contain_text("wrong_language")
        page.screenshot(path=str(shots / "review-desktop.png"), full_page=True)

        # the text filter
        page.fill("#review-q", "capital")
        page.click("#review-filters button[type=submit]")
        expect(cards).to_have_count(1)
        page.fill("#review-q", "")
        # fan-out inputs side by side
        page.check("input[name=matrix]")
        page.click("#review-filters button[type=submit]")
        expect(page.locator("#matrix thead th[data-variant]")).to_have_count(2)
        expect(page.locator("#matrix tbody tr")).to_have_count(2)
        expect(page.locator("#matrix tbody tr").first.locator("td[data-variant]")).to_have_count(2)
        page.set_viewport_size({"width": 390, "height": 844})
        page.screenshot(path=str(shots / "review-phone.png"), full_page=True)
        browser.close()
    assert not errors, errors

    # the rating is the unit's events, so the results have it as metrics of its variant
    r = api(srv, "GET", "/v1/experiments/tone/results", key=REVIEWER).json()
    by_variant = {v["id"]: v["metrics"] for v in r["variants"]}
    assert by_variant[variant]["review_thumbs_up"]["summary"]["n"] == 1
    assert by_variant[variant]["review_score"]["summary"]["mean"] == 4
    assert by_variant[variant]["review_label_wrong_language"]["summary"]["n"] == 1
    rated = api(srv, "GET", "/v1/experiments/tone/samples?reviewed=true", key=REVIEWER).json()["data"]
    assert [(x["unit"], x["review"]["score"], x["review"]["label"], x["review"]["by"]) for x in rated] == [
        (unit, 4, "wrong_language", "rita")]
