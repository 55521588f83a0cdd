"""The review page (issue 45) in a real headless Chromium (Playwright) against a real
`abserve serve` with keys: a reviewer opens an experiment's sampled conversations, moves with the
keyboard and rates one (thumbs up, a score, a label) — the rating appears in `/results` as event
metrics of the sample's unit; fan-out inputs are shown side by side, one column per variant; the
text filter narrows the list; desktop and phone widths, no console errors. An eval run started from
the page over the filtered samples replays them over every variant in the server, judged in both
orders by the served model, and its report opens from the page.

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


@pytest.fixture(scope="module")
def seeded(srv):
    seed(srv)
    return srv


def test_a_reviewer_rates_by_keyboard_and_the_rating_is_a_metric(seeded):
    srv = seeded
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


def test_an_eval_run_started_from_the_page_replays_the_filtered_samples(seeded):
    srv = seeded
    shots = Path(os.environ.get("ABSERVE_DASHBOARD_SHOTS") or tempfile.mkdtemp(prefix="abserve-shots-"))
    shots.mkdir(parents=True, exist_ok=True)
    model = api(srv, "GET", "/v1/models").json()["data"][0]["id"]
    errors = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.goto(srv.base + "/#/review/tone")
        page.fill("#api-key", REVIEWER)
        page.click("#key-form button[type=submit]")
        # "Name a fruit." (a live sample) and "Name a river." (a fan-out input, both variants)
        page.fill("#review-q", "Name a")
        page.click("#review-filters button[type=submit]")
        expect(page.locator("article.sample")).to_have_count(3)
        page.fill("#eval-form input[name=limit]", "10")
        page.select_option("#eval-form select[name=judge]", model)
        page.click("#eval-form button[type=submit]")
        expect(page.locator("#eval-note")).to_contain_text("over 3 samples")
        done = page.locator("#eval-runs tr[data-status=done]")
        expect(done).to_have_count(1, timeout=180_000)
        expect(done).to_contain_text("terse: 3 answered")
        expect(done).to_contain_text("warm: 3 answered")
        expect(done).to_contain_text("judge agreed with itself across orders")
        page.screenshot(path=str(shots / "review-eval.png"), full_page=True)
        with page.expect_popup() as pop:
            done.locator("button").click()
        report = pop.value
        report.wait_for_load_state()
        assert "Name a fruit." in report.content() and "Name a river." in report.content()
        browser.close()
    assert not errors, errors

    runs = api(srv, "GET", "/v1/experiments/tone/evals", key=REVIEWER).json()["data"]
    run = runs[0]
    assert (run["status"], run["rows"], run["who"]) == ("done", 3, "rita"), run
    assert run["request"]["filter"] == {"limit": 10, "q": "Name a"} and run["request"]["judge"] == model, run
    s = run["summary"]
    assert s["rows"] == 3 and {v["id"]: v["answered"] for v in s["variants"]} == {"terse": 3, "warm": 3}, s
    assert s["judge_agreement"] is not None, s
    # starting a run and reading its report are audited; an inference-free reviewer may do both
    audit = api(srv, "GET", "/v1/audit").json()["data"]
    assert {(a["who"], a["method"], a["path"]) for a in audit} >= {
        ("rita", "POST", "/v1/experiments/tone/evals"),
        ("rita", "GET", f"/v1/experiments/tone/evals/{run['id']}/report")}, audit
