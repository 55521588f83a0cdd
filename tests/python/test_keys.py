"""Keys with roles (issue 45) on a real `abserve serve --keys FILE`, called with the official
openai SDK and httpx: each role reaches only its routes (403 in OpenAI's error shape naming the
role needed, which the SDK raises as PermissionDeniedError), a key taken out of the file fails on
its next request, SIGHUP re-reads the file without stopping the server, admin actions land in the
audit log (read through the API and straight from the SQLite file, with no key in it), and the
dashboard in Chromium shows each role only what it may see.
"""
import hashlib
import os
import signal
import sqlite3
import tempfile
import time
from pathlib import Path

import httpx2 as httpx
import openai
import pytest
from playwright.sync_api import expect, sync_playwright

from conftest import MODEL_ID, Server

CHROMIUM = os.environ.get("ABSERVE_CHROMIUM", "/usr/bin/chromium")
INFERENCE, REVIEWER, ADMIN, BATCH = "sk-app-7f3e", "sk-rater-51c9", "sk-ops-90ab", "sk-nightly-2d44"


def keys_file(path, with_inference=True):
    reviewer_hash = hashlib.sha256(REVIEWER.encode()).hexdigest()
    text = ""
    if with_inference:
        text += f'[[key]]\nname = "app"\nrole = "inference"\nkey = "{INFERENCE}"\n\n'
    text += f'[[key]]\nname = "rater"\nrole = "reviewer"\nsha256 = "{reviewer_hash}"\n\n'
    text += f'[[key]]\nname = "ops"\nrole = "admin"\nkey = "{ADMIN}"\n\n'
    text += f'[[key]]\nname = "nightly"\nrole = "inference"\nkey = "{BATCH}"\nservice_tier = "flex"\n'
    Path(path).write_text(text)


@pytest.fixture(scope="module")
def srv():
    d = tempfile.mkdtemp(prefix="abserve-keys-")
    path = os.path.join(d, "keys.toml")
    keys_file(path)
    log = os.path.join(d, "server.log")
    s = Server("--keys", path, context=1024, log=log)
    s.keys_path, s.log = path, log
    yield s
    s.stop()


def call(s, key, method, path, **kw):
    return httpx.request(method, s.base + path, headers={"Authorization": f"Bearer {key}"}, timeout=120, **kw)


def chat(s, key, **kw):
    c = openai.OpenAI(base_url=s.url, api_key=key, max_retries=0)
    return c.chat.completions.create(model=MODEL_ID, max_tokens=2, temperature=0,
                                     messages=[{"role": "user", "content": "Hi"}], **kw)


def test_each_role_reaches_only_its_routes(srv):
    assert chat(srv, INFERENCE).choices[0].message.content is not None
    with pytest.raises(openai.PermissionDeniedError) as e:
        chat(srv, REVIEWER)
    assert e.value.status_code == 403
    body = e.value.body
    assert body["type"] == "permission_error" and "it needs the role inference or admin" in body["message"], body
    with pytest.raises(openai.AuthenticationError):
        chat(srv, "sk-nobody")

    definition = {"name": "tone", "variants": [{"id": "a", "max_tokens": 2}, {"id": "b", "max_tokens": 2}]}
    r = call(srv, REVIEWER, "POST", "/v1/experiments", json=definition)
    assert r.status_code == 403 and "needs the role admin" in r.json()["error"]["message"], r.text
    r = call(srv, INFERENCE, "POST", "/v1/experiments", json=definition)
    assert r.status_code == 403, r.text
    r = call(srv, ADMIN, "POST", "/v1/experiments", json=definition)
    assert r.status_code == 201, r.text
    # inference calls the experiment and posts its outcome; it may not read results
    c = openai.OpenAI(base_url=srv.url, api_key=INFERENCE, max_retries=0)
    c.chat.completions.create(model="experiment:tone", user="u1", messages=[{"role": "user", "content": "Hi"}])
    r = call(srv, INFERENCE, "POST", "/v1/experiments/tone/events", json={"events": [{"unit": "u1", "metric": "thumbs_up", "value": 1}]})
    assert r.status_code == 200, r.text
    assert call(srv, INFERENCE, "GET", "/v1/experiments/tone/results").status_code == 403
    r = call(srv, REVIEWER, "GET", "/v1/experiments/tone/results")
    assert r.status_code == 200 and r.json()["variants"], r.text
    assert call(srv, REVIEWER, "GET", "/v1/audit").status_code == 403
    assert call(srv, REVIEWER, "GET", "/v1/me").json() == {"name": "rater", "role": "reviewer", "service_tier": None}
    # the nightly key's requests run as batch work, as its exposures record
    c = openai.OpenAI(base_url=srv.url, api_key=BATCH, max_retries=0)
    c.chat.completions.create(model="experiment:tone", user="u2", messages=[{"role": "user", "content": "Hi"}])
    exposures = call(srv, ADMIN, "GET", "/v1/experiments/tone/exposures").json()["exposures"]
    tiers = {x["unit"]: x["service_tier"] for x in exposures}
    assert tiers == {"u1": "interactive", "u2": "batch"}, tiers
    # an inference key posts events only for the units its own requests were served for
    r = call(srv, INFERENCE, "POST", "/v1/experiments/tone/events", json={"events": [{"unit": "u2", "metric": "thumbs_up", "value": 1}]})
    assert r.status_code == 403 and r.json()["error"]["code"] == "not_own_unit", r.text
    r = call(srv, BATCH, "POST", "/v1/experiments/tone/events", json={"events": [{"unit": "u2", "metric": "thumbs_up", "value": 1}]})
    assert r.status_code == 200, r.text
    assert {x["unit"]: x["caller"] for x in exposures} == {"u1": "app", "u2": "nightly"}, exposures


def test_a_key_taken_out_of_the_file_fails_at_once_and_sighup_keeps_serving(srv):
    assert chat(srv, INFERENCE).choices
    keys_file(srv.keys_path, with_inference=False)
    with pytest.raises(openai.AuthenticationError):
        chat(srv, INFERENCE)
    assert chat(srv, BATCH).choices, "the other keys still pass"
    keys_file(srv.keys_path, with_inference=True)
    reads = Path(srv.log).read_text().count("keys: read 4 keys")
    srv.proc.send_signal(signal.SIGHUP)
    deadline = time.time() + 10
    while Path(srv.log).read_text().count("keys: read 4 keys") == reads and time.time() < deadline:
        time.sleep(0.05)
    assert Path(srv.log).read_text().count("keys: read 4 keys") == reads + 1, "SIGHUP read the file again"
    assert srv.proc.poll() is None, "SIGHUP does not stop the server"
    assert chat(srv, INFERENCE).choices


def test_admin_actions_are_audited_with_who_did_them(srv):
    d = {"name": "audited", "variants": [{"id": "a"}, {"id": "b"}]}
    assert call(srv, ADMIN, "POST", "/v1/experiments", json=d).status_code == 201
    d["variants"][1]["weight"] = 2
    assert call(srv, ADMIN, "PUT", "/v1/experiments/audited", json=d).status_code == 200
    assert call(srv, REVIEWER, "DELETE", "/v1/experiments/audited").status_code == 403
    assert call(srv, ADMIN, "DELETE", "/v1/experiments/audited").status_code == 200
    log = call(srv, ADMIN, "GET", "/v1/audit?limit=3").json()["data"]
    assert [(e["who"], e["method"], e["path"], e["status"]) for e in log] == [
        ("ops", "DELETE", "/v1/experiments/audited", 200),
        ("ops", "PUT", "/v1/experiments/audited", 200),
        ("ops", "POST", "/v1/experiments", 201),
    ], log
    db = sqlite3.connect(os.path.join(srv.data_dir, "abserve.db"))
    rows = db.execute("SELECT who, role, method, path, status FROM audit WHERE path LIKE '%audited%' ORDER BY id").fetchall()
    dump = "\n".join(db.iterdump())
    db.close()
    assert rows == [("ops", "admin", "PUT", "/v1/experiments/audited", 200),
                    ("ops", "admin", "DELETE", "/v1/experiments/audited", 200)], rows
    for key in (INFERENCE, REVIEWER, ADMIN, BATCH):
        assert key not in dump and key not in Path(srv.log).read_text()


def test_the_dashboard_shows_each_role_what_it_may_see(srv):
    call(srv, ADMIN, "POST", "/v1/experiments", json={"name": "page", "variants": [{"id": "a"}, {"id": "b"}]})
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM)
        errors = []
        for key, role in [(REVIEWER, "reviewer"), (INFERENCE, "inference"), (ADMIN, "admin")]:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(srv.base + "/")
            page.fill("#api-key", key)
            page.click("#key-form button[type=submit]")
            expect(page.locator(f"#who [data-role={role}]")).to_be_visible()
            if role == "inference":
                expect(page.locator("#no-access")).to_contain_text("role inference")
                expect(page.locator("#experiments")).to_have_count(0)
            else:
                expect(page.locator("#experiments tr[data-experiment=page]")).to_be_visible()
                page.goto(srv.base + "/#/e/page")
                expect(page.locator("#srm")).to_be_visible()
                expect(page.locator("#weights")).to_have_count(1 if role == "admin" else 0)
                expect(page.locator("#actions")).to_have_count(1 if role == "admin" else 0)
                expect(page.locator("#new-link")).to_be_visible() if role == "admin" else expect(page.locator("#new-link")).to_be_hidden()
            page.close()
        browser.close()
    assert not errors, errors
