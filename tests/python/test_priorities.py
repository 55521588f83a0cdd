"""Priority classes through a real server (issue 44): `service_tier` (OpenAI's tiers and
abserve's class names) and vLLM's `priority` accepted with the official openai SDK, unknown values
a 400 naming the field; the class shown in exposures (the request's own, else its experiment's;
in the dashboard's table too, in Chromium) and in /metrics per class; and on a server whose two slots are held by long batch generations, a
live request takes a slot at once (a batch sequence is preempted) and finishes while the batch
answers still run — which end complete and equal to their answers when run alone."""
import json
import re
import threading
import time

import openai
import pytest

from playwright.sync_api import expect, sync_playwright

from conftest import MODEL_ID, Server
from test_adapters import CHROMIUM, http

HI = [{"role": "user", "content": "Hi"}]


def samples(body, name):
    """(labels, value) of every sample of series `name` in a Prometheus text body."""
    out = []
    for line in body.splitlines():
        if line.startswith(name + "{"):
            labels, value = line[len(name) + 1:].rsplit("} ", 1)
            out.append((dict(re.findall(r'(\w+)="([^"]*)"', labels)), float(value)))
    return out


@pytest.fixture(scope="module")
def two_slots():
    s = Server("--max-sequences", "2", "--max-queue", "8")
    yield s
    s.stop()


def test_service_tier_and_priority_are_accepted_and_unknown_values_refused(two_slots):
    c = openai.OpenAI(base_url=two_slots.url, api_key="unused")
    for tier in ("auto", "default", "priority", "flex"):
        r = c.chat.completions.create(model=MODEL_ID, messages=HI, max_tokens=2, service_tier=tier)
        assert r.choices[0].message.content is not None
    for tier in ("interactive", "fanout", "batch"):
        r = c.chat.completions.create(model=MODEL_ID, messages=HI, max_tokens=2,
                                      extra_body={"service_tier": tier, "priority": -3})
        assert r.usage.completion_tokens >= 1
    c.completions.create(model=MODEL_ID, prompt="Hi", max_tokens=2, extra_body={"service_tier": "flex"})
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model=MODEL_ID, messages=HI, max_tokens=2, extra_body={"service_tier": "gold"})
    assert e.value.body["param"] == "service_tier" and "gold" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model=MODEL_ID, messages=HI, max_tokens=2, extra_body={"priority": 2**40})
    assert e.value.body["param"] == "priority"
    with pytest.raises(openai.BadRequestError):
        c.completions.create(model=MODEL_ID, prompt="Hi", max_tokens=2, extra_body={"service_tier": "urgent"})


def test_exposures_and_metrics_name_the_class(two_slots):
    s = two_slots
    exp = {"name": "tiers", "service_tier": "batch",
           "variants": [{"id": "a", "max_tokens": 2}, {"id": "b", "max_tokens": 2}]}
    status, text = http("POST", s.url + "/experiments", exp)
    assert status in (200, 201), text
    status, text = http("POST", s.url + "/experiments", dict(exp, name="bad", service_tier="gold"))
    assert status == 400 and "gold" in text, text
    c = openai.OpenAI(base_url=s.url, api_key="unused")
    c.chat.completions.create(model="experiment:tiers", messages=HI, user="u1")
    c.chat.completions.create(model="experiment:tiers", messages=HI, user="u2", service_tier="priority")
    c.chat.completions.create(model="experiment:tiers", messages=HI, user="u3",
                              extra_body={"service_tier": "fanout"})
    status, text = http("GET", s.url + "/experiments/tiers/exposures")
    assert status == 200, text
    body = json.loads(text)
    rows = body["exposures"] if isinstance(body, dict) else body
    tier = {x["unit"]: x["service_tier"] for x in rows}
    assert tier == {"u1": "batch", "u2": "interactive", "u3": "fanout"}, rows
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = browser.new_page()
        page.goto(s.base + "/#/e/tiers")
        cells = page.locator('#exposures tbody td[data-k="class"]')
        expect(cells).to_have_count(3)
        assert sorted(cells.all_inner_texts()) == ["batch", "fanout", "interactive"]
        browser.close()
    status, text = http("POST", s.url + "/experiments/tiers/fanout", {"input": "Hi", "service_tier": "nope"})
    assert status == 400 and "service_tier" in text, text
    status, text = http("POST", s.url + "/experiments/tiers/fanout", {"input": "Hi"})
    assert status == 200, text
    status, text = http("GET", s.base + "/metrics")
    ttft = samples(text, "abserve_class_time_to_first_token_seconds_count")
    counts = {l["class"]: v for l, v in ttft}
    assert counts.get("batch", 0) >= 1 and counts.get("interactive", 0) >= 1 and counts.get("fanout", 0) >= 3, counts
    for name in ("abserve_class_requests_waiting", "abserve_class_requests_running", "abserve_class_preemptions_total"):
        classes = {l["class"] for l, _ in samples(text, name) if l.get("model") == MODEL_ID}
        assert classes == {"interactive", "fanout", "batch"}, (name, classes)


def long_batch(c, i, out):
    t0 = time.monotonic()
    r = c.chat.completions.create(
        model=MODEL_ID, messages=[{"role": "user", "content": f"Write a long story about ship {i}."}],
        max_tokens=160, temperature=0, service_tier="flex", extra_body={"ignore_eos": True})
    out[i] = (r.choices[0].message.content, r.usage.completion_tokens, time.monotonic() - t0, time.monotonic())


def test_a_live_request_preempts_batch_work_which_still_answers_whole(two_slots):
    s = two_slots
    c = openai.OpenAI(base_url=s.url, api_key="unused")
    alone = {}
    for i in range(2):
        long_batch(c, i, alone)
    preempted_before = sum(v for l, v in samples(http("GET", s.base + "/metrics")[1], "abserve_class_preemptions_total")
                           if l["class"] == "batch")
    out = {}
    threads = [threading.Thread(target=long_batch, args=(c, i, out)) for i in range(2)]
    for t in threads:
        t.start()
    # both batch generations hold both slots
    for _ in range(200):
        running = {l["class"]: v for l, v in samples(http("GET", s.base + "/metrics")[1], "abserve_class_requests_running")
                   if l.get("model") == MODEL_ID}
        if running.get("batch") == 2:
            break
        time.sleep(0.02)
    assert running.get("batch") == 2, running
    live = c.chat.completions.create(model=MODEL_ID, messages=HI, max_tokens=8, temperature=0)
    live_done = time.monotonic()
    for t in threads:
        t.join()
    assert live.usage.completion_tokens >= 1
    text = http("GET", s.base + "/metrics")[1]
    preempted = sum(v for l, v in samples(text, "abserve_class_preemptions_total") if l["class"] == "batch")
    assert preempted >= preempted_before + 1, "a batch sequence gave its slot up"
    for i in range(2):
        assert out[i][1] == 160, "a preempted answer is whole"
        assert out[i][0] == alone[i][0], "and the same as when it ran alone"
    # without classes the live request would wait for a batch answer to end first
    assert live_done < min(o[3] for o in out.values()), "the live answer came while both batch answers still ran"
