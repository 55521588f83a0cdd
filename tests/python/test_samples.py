"""Sampled conversations (issue 45) on a real `abserve serve`, on SQLite and on PostgreSQL,
called with the official openai SDK: an experiment sampling 50% of units keeps exactly the
units GrowthBook's hash samples (each sample's answer id is its exposure's), redacted before it is
written (a planted e-mail, phone and card number never reach the database: the SQLite file and
the PostgreSQL table are read directly), erased for one unit on request, deleted by the retention
sweep; a fan-out's variants share an input id; the export runs through `abserve eval` without
edits.
"""
import json
import os
import re
import sqlite3
import subprocess
import tempfile
import time
from pathlib import Path

import httpx2 as httpx
import openai
import pytest

from conftest import BINARY, MODEL, MODEL_ID, Server

PG = os.environ.get("ABSERVE_TEST_POSTGRES", "postgres://postgres@127.0.0.1:5432/test")
PLANTED = ("I am jane.roe@example.com, call me on +44 20 7946 0958, my card is 4111-1111-1111-1111, "
           "account ACCT-55120. What is the capital of France?")
SECRETS = ["jane.roe@example.com", "7946", "4111", "ACCT-55120"]
EXPERIMENTS = """
[[experiment]]
name = "support"
[experiment.samples]
rate = 0.5
retention_days = 30
redact = ['ACCT-\\d+']
[[experiment.variants]]
id = "terse"
system = "Answer in one word."
temperature = 0
max_tokens = 6
[[experiment.variants]]
id = "warm"
system = "Answer warmly."
temperature = 0
max_tokens = 6

[[experiment]]
name = "brief"
[experiment.samples]
rate = 1.0
retention_days = 0.00005
[[experiment.variants]]
id = "a"
max_tokens = 2
[[experiment.variants]]
id = "b"
max_tokens = 2
"""


def fnv1a32(text):
    h = 0x811C9DC5
    for ch in text:  # ASCII: one UTF-16 unit each
        h = ((h ^ ord(ch)) * 0x01000193) & 0xFFFFFFFF
    return h


def sampled(experiment, unit, rate=0.5):
    """GrowthBook's hash v2 with the seed samples:<experiment> (crates/ab/src/samples.rs)."""
    return (fnv1a32(str(fnv1a32(f"samples:{experiment}" + unit))) % 10000) / 10000 < rate


def psql(url, sql):
    r = subprocess.run(["psql", url, "-At", "-v", "ON_ERROR_STOP=1", "-c", sql], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def srv(request):
    d = tempfile.mkdtemp(prefix="abserve-samples-")
    exp = os.path.join(d, "experiments.toml")
    Path(exp).write_text(EXPERIMENTS)
    extra = ["--experiments", exp, "--guardrail-interval", "1"]
    db_url = None
    if request.param == "postgres":
        db = f"abserve_py_samples_{os.getpid()}"
        psql(PG, f"DROP DATABASE IF EXISTS {db}")
        psql(PG, f"CREATE DATABASE {db}")
        db_url = PG.rsplit("/", 1)[0] + "/" + db
        extra += ["--store", db_url]
    s = Server(*extra, context=1024)
    s.backend, s.db_url, s.dir = request.param, db_url, d
    yield s
    s.stop()
    if db_url:
        psql(PG, f"DROP DATABASE IF EXISTS {db_url.rsplit('/', 1)[1]}")


def api(s, method, path, **kw):
    return httpx.request(method, s.base + path, timeout=120, **kw)


def written(s):
    m = httpx.get(s.base + "/metrics", timeout=30).text
    found = re.search(r'^abserve_samples_total\{outcome="written"\} (\d+)', m, re.M)
    return int(found.group(1))


def wait_written(s, n):
    deadline = time.time() + 30
    while written(s) < n and time.time() < deadline:
        time.sleep(0.1)
    assert written(s) >= n, f"{written(s)} of {n} written"


def stored_text(s):
    """Every sample row as the database holds it, read around abserve."""
    if s.backend == "sqlite":
        db = sqlite3.connect(os.path.join(s.data_dir, "abserve.db"))
        rows = db.execute("SELECT request, response, COALESCE(error, '') FROM samples").fetchall()
        db.close()
        return "\n".join(" ".join(r) for r in rows)
    return psql(s.db_url, "SELECT request || response || COALESCE(error, '') FROM samples")


def test_exactly_the_sampled_units_are_kept_redacted_and_erased_on_request(srv):
    before = written(srv)
    client = openai.OpenAI(base_url=srv.url, api_key="none", max_retries=0)
    units = [f"customer-{i}" for i in range(24)]
    ids = {}
    for i, u in enumerate(units):
        kw = dict(model="experiment:support", user=u, messages=[{"role": "user", "content": PLANTED}])
        if i % 2:
            text = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(stream=True, **kw) if c.choices)
            ids[u] = None
        else:
            r = client.chat.completions.create(**kw)
            ids[u], text = r.id, r.choices[0].message.content
    want = sorted(u for u in units if sampled("support", u))
    assert 4 <= len(want) <= 20, want
    wait_written(srv, before + len(want))
    samples = api(srv, "GET", "/v1/experiments/support/samples?limit=500").json()["data"]
    assert sorted(s["unit"] for s in samples) == want
    exposures = api(srv, "GET", "/v1/experiments/support/exposures?limit=500").json()["exposures"]
    by_id = {x["request_id"]: x for x in exposures}
    for s in samples:
        x = by_id[s["request_id"]]
        assert (x["unit"], x["variant"]) == (s["unit"], s["variant"])
        if ids[s["unit"]]:
            assert s["request_id"] == ids[s["unit"]], "the answer's id is the sample's"
        user = s["request"]["messages"][-1]["content"]
        assert "[email]" in user and "[phone]" in user and "[card]" in user and "[redacted]" in user, user
        assert s["request"]["messages"][0]["role"] == "system"
        assert s["response"]["text"], s
        assert s["finish_reason"] in ("stop", "length")
    dump = stored_text(srv)
    assert dump.count("[email]") >= len(want)
    for secret in SECRETS:
        assert secret not in dump, f"{secret} reached the {srv.backend} database"

    unit = want[0]
    r = api(srv, "POST", "/v1/experiments/support/events", json={"events": [{"unit": unit, "metric": "thumbs_up", "value": 1}]})
    assert r.status_code == 200, r.text
    erased = api(srv, "DELETE", f"/v1/units/{unit}").json()
    assert erased == {"unit": unit, "samples": 1, "exposures": 1, "events": 1, "eval_runs": 0}, erased
    assert api(srv, "GET", f"/v1/experiments/support/samples?unit={unit}").json()["data"] == []
    # a sampled unit is sampled again; an unsampled one never
    again = want[1]
    client.chat.completions.create(model="experiment:support", user=again, messages=[{"role": "user", "content": "Hi"}])
    other = next(u for u in units if u not in want)
    client.chat.completions.create(model="experiment:support", user=other, messages=[{"role": "user", "content": "Hi"}])
    wait_written(srv, before + len(want) + 1)
    time.sleep(0.5)
    mine = api(srv, "GET", f"/v1/experiments/support/samples?unit={again}").json()["data"]
    assert len(mine) == 2
    assert api(srv, "GET", f"/v1/experiments/support/samples?unit={other}").json()["data"] == []


def test_the_retention_sweep_deletes_samples_past_their_days(srv):
    before = written(srv)
    client = openai.OpenAI(base_url=srv.url, api_key="none", max_retries=0)
    for u in ("p", "q"):
        client.chat.completions.create(model="experiment:brief", user=u, messages=[{"role": "user", "content": "Hi"}])
    wait_written(srv, before + 2)
    deadline = time.time() + 30
    # retention_days = 0.00005 (4.3 s); the sweep runs every --guardrail-interval (1 s)
    while api(srv, "GET", "/v1/experiments/brief/samples").json()["data"] and time.time() < deadline:
        time.sleep(0.5)
    assert api(srv, "GET", "/v1/experiments/brief/samples").json()["data"] == []
    assert api(srv, "GET", "/v1/experiments/brief/exposures").json()["exposures"], "exposures stay"


def test_fanout_variants_share_an_input_id_and_the_export_runs_through_eval(srv):
    inputs = [f"Name a colour, please ({i})" for i in range(12)]
    picked = [x for x in inputs if sampled("support", x)]
    before = written(srv)
    ids = {}
    for x in inputs:
        r = api(srv, "POST", "/v1/experiments/support/fanout", json={"input": x})
        assert r.status_code == 200, r.text
        ids[x] = r.json().get("input_id")
    assert {x for x in inputs if ids[x]} == set(picked)
    wait_written(srv, before + 2 * len(picked))
    for x in picked:
        rows = api(srv, "GET", f"/v1/experiments/support/samples?input_id={ids[x]}").json()["data"]
        assert sorted(r["variant"] for r in rows) == ["terse", "warm"]
        assert all(r["request"]["input"] == x for r in rows)

    export = api(srv, "GET", "/v1/experiments/support/samples/export")
    assert export.headers["content-type"].startswith("application/x-ndjson")
    rows = [json.loads(line) for line in export.text.splitlines()]
    assert rows and all(r["input"] and r["id"] for r in rows)
    out = Path(srv.dir) / "export.jsonl"
    store = ["--store", srv.db_url] if srv.db_url else ["--data-dir", srv.data_dir]
    r = subprocess.run([str(BINARY), "experiments", "samples", "support", "--out", str(out), *store],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert [json.loads(line) for line in out.read_text().splitlines()] == rows
    exp = Path(srv.dir) / "replay.toml"
    exp.write_text('[[experiment]]\nname = "replay"\n[[experiment.variants]]\nid = "old"\nmax_tokens = 4\ntemperature = 0.0\n'
                   '[[experiment.variants]]\nid = "new"\nsystem = "Be brief."\nmax_tokens = 4\ntemperature = 0.0\n')
    r = subprocess.run([str(BINARY), "eval", str(exp), "--dataset", str(out), "--out", str(Path(srv.dir) / "eval"),
                        "--model", str(MODEL), "--memory-budget", "1GiB", "--context", "1024", "--threads", "2"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    results = [json.loads(line) for line in (Path(srv.dir) / "eval" / "results.jsonl").read_text().splitlines()]
    assert sorted({x["row"] for x in results}) == sorted(r["id"] for r in rows)
    assert all(x["error"] is None for x in results), results
