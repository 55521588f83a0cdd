"""LoRA adapters through the real server with the official openai SDK (issue 29): requests and
experiment variants name adapters the server loaded (`--lora`), scale 0 is the base model,
sequences under different adapters run side by side with the tokens each gives alone, a prompt
never reuses KV computed under another adapter, and an adapter the server does not have is a 400
naming the field. The adapters are random GGUF LoRA files that scripts/test-lora.py writes into
the ignored models/test/ folder."""
import json
import os
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest
from playwright.sync_api import expect, sync_playwright

from conftest import MODEL, MODEL_ID, ROOT, Server

CHROMIUM = os.environ.get("ABSERVE_CHROMIUM", "/usr/bin/chromium")


def lora(seed):
    out = ROOT / "models" / "test" / f"lora-r8-seed{seed}.gguf"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(f".{os.getpid()}.tmp")
        subprocess.run([sys.executable, str(ROOT / "scripts" / "test-lora.py"), str(MODEL), str(tmp), "--seed", str(seed)],
                       check=True)
        tmp.rename(out)
    return str(out.resolve())


def http(method, url, body=None):
    req = urllib.request.Request(url, method=method, data=json.dumps(body).encode() if body is not None else None,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def metric(server, name):
    status, text = http("GET", server.base + "/metrics")
    assert status == 200
    return sum(float(l.split()[-1]) for l in text.splitlines() if l.startswith(name + " ") or l.startswith(name + "{"))


def two_adapter_server(*extra):
    """A server with adapters 1 and 2 loaded at start and 8 slots, and the two adapters' paths."""
    a, b = lora(1), lora(2)
    s = Server("--lora", a, "--lora", b, "--max-sequences", "8", *extra)
    yield s, a, b
    s.stop()


@pytest.fixture(scope="module")
def lora_server():
    yield from two_adapter_server()


@pytest.fixture(scope="module")
def lanes_server():
    """The same adapters on three adapter lanes (one llama.cpp context per lane on the one
    model): five adapter sets on three lanes, so lanes both run sets side by side and take turns."""
    yield from two_adapter_server("--adapter-lanes", "3")


# the tests that hold on one context whose set changes in turns and on adapter lanes alike
BOTH = pytest.mark.parametrize("setup", ["lora_server", "lanes_server"])


def ask(server, adapters=None, prompt="Tell me about the sea.", max_tokens=16):
    """The greedy answer under `adapters`, its whole prompt computed (`cache_prompt: false`): the
    answers compared here differ by their adapters alone, not by where their KV came from. (A
    prompt's last token computed alone on top of a cached prefix goes through other kernels for
    the adapters' F32 products than inside the whole prompt, and can flip a near-tie.)"""
    c = openai.OpenAI(base_url=server.url, api_key="unused")
    extra = {"cache_prompt": False}
    if adapters is not None:
        extra["adapters"] = adapters
    r = c.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": prompt}],
                                  max_tokens=max_tokens, temperature=0, extra_body=extra)
    return r.choices[0].message.content


def tokens_and_first(server, adapters, prompt, max_tokens=16):
    """The answer's tokens, and its first token's five most likely tokens with their
    log-probabilities (what the prompt alone decides under the adapters)."""
    c = openai.OpenAI(base_url=server.url, api_key="unused")
    extra = {"adapters": adapters} if adapters is not None else {}
    r = c.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": prompt}],
                                  max_tokens=max_tokens, temperature=0, logprobs=True, top_logprobs=5,
                                  extra_body=extra)
    content = r.choices[0].logprobs.content
    return [t.token for t in content], {x.token: x.logprob for x in content[0].top_logprobs}


def distance(p, q):
    """Mean |difference| of two first-token distributions' log-probabilities over the tokens
    either lists (a token one leaves out counts at the lowest listed log-probability)."""
    lo = min(min(p.values()), min(q.values()))
    keys = set(p) | set(q)
    return sum(abs(p.get(k, lo) - q.get(k, lo)) for k in keys) / len(keys)


@BOTH
def test_requests_name_their_adapter_and_run_side_by_side(setup, request):
    s, a, b = request.getfixturevalue(setup)
    base = ask(s)
    assert ask(s, [{"path": a, "scale": 0}]) == base
    under_a, under_b = ask(s, [{"path": a}]), ask(s, [{"path": b, "scale": 1.0}])
    assert under_a != base and under_b != base and under_a != under_b
    # a set of two adapters applied together: neither alone, and one set however it is spelled
    both = ask(s, [{"path": a}, {"path": b, "scale": 1.0}])
    assert both not in (base, under_a, under_b)
    assert ask(s, [{"path": b}, {"path": a}]) == both
    sets = [None, [{"path": a}], [{"path": b}], [{"path": a, "scale": 0.5}], [{"path": a}, {"path": b}]]
    prompts = ["Tell me about the sea.", "List three fruits.", "Write to a customer."]
    alone = [tokens_and_first(s, st, p) for st in sets for p in prompts]
    with ThreadPoolExecutor(len(sets) * len(prompts)) as ex:
        together = list(ex.map(lambda sp: tokens_and_first(s, *sp), [(st, p) for st in sets for p in prompts]))
    # Under these random adapters llama.cpp's CPU kernels give a sequence computed beside others
    # other log-probabilities than alone (the adapters' F32 products take other kernels by the
    # number of rows; measured 2026-12-06: up to 0.15 nats at the first decode of two identical
    # requests, the base model bit-identical), so an answer may part from its solo run even where
    # the solo run was sure (a gap of 0.53 nats seen, on one context and on lanes alike). A crossed
    # adapter is told apart by the first token's distribution instead: it must be nearer the
    # sequence's own set's solo distribution than any other set's for the same prompt (measured:
    # at most 0.13 from its own, at least 0.20 from any other).
    identical = 0
    for i, ((t, first), (a1, _)) in enumerate(zip(together, alone)):
        own = distance(first, alone[i][1])
        others = [distance(first, alone[j][1]) for j in range(len(alone)) if j % len(prompts) == i % len(prompts) and j != i]
        assert own < min(others), f"sequence {i} looks like another adapter set's: {own} from its own, {min(others)} from another"
        identical += t == a1
    # how many near-ties flip depends on how the requests happened to be batched (CI saw 9 of 12
    # once); the check that tells a crossed adapter from rounding is the gap above, this one only
    # guards against every sequence parting
    assert identical * 2 >= len(alone), identical


@BOTH
def test_a_prompt_never_reuses_kv_computed_under_another_adapter(setup, request):
    s, a, b = request.getfixturevalue(setup)
    # a plain completion (no chat template, whose opening every chat shares) of a prompt no
    # other test sends: the only KV there is for it is what the first request computes
    c = openai.OpenAI(base_url=s.url, api_key="unused")
    prompt = "The history of the lighthouse keepers of the north coast. " * 6

    def complete(adapter):
        r = c.completions.create(model=MODEL_ID, prompt=prompt, max_tokens=4, temperature=0,
                                 extra_body={"adapters": [{"path": adapter}]})
        return r.usage.prompt_tokens_details.cached_tokens if r.usage.prompt_tokens_details else 0

    reused = lambda: metric(s, "abserve_prompt_tokens_reused_total")  # noqa: E731
    complete(a)
    before = reused()
    assert complete(b) == 0 and reused() == before, "the prompt under b reused KV computed under a"
    assert complete(a) > 0 and reused() > before, "the prompt under a again should reuse its own KV"


def labelled(server, name, label):
    """The value of `name{adapters="label"}` in /metrics (0 when absent)."""
    status, text = http("GET", server.base + "/metrics")
    assert status == 200
    want = f'{name}{{adapters="{label}"}} '
    return sum(float(l.split()[-1]) for l in text.splitlines() if l.startswith(want))


def test_metrics_count_requests_and_tokens_per_adapter_set(lora_server):
    s, a, b = lora_server
    c = openai.OpenAI(base_url=s.url, api_key="unused")
    sets = {"lora-r8-seed1.gguf×1": [{"path": a}], "base": None,
            "lora-r8-seed1.gguf×1+lora-r8-seed2.gguf×0.5": [{"path": b, "scale": 0.5}, {"path": a}]}
    names = ["abserve_adapter_requests_total", "abserve_adapter_prompt_tokens_total",
             "abserve_adapter_generated_tokens_total"]
    # the context starts this test under the first set: one change to base, one to the pair
    c.completions.create(model=MODEL_ID, prompt="Name a colour:", max_tokens=1, temperature=0,
                         extra_body={"adapters": sets["lora-r8-seed1.gguf×1"]})
    changes = lambda: metric(s, "abserve_model_adapter_set_changes_total")  # noqa: E731
    before = {(n, l): labelled(s, n, l) for n in names for l in sets}
    changes_before = changes()
    used = {l: [0, 0, 0] for l in sets}
    for label, adapters in sets.items():
        for _ in range(2):
            r = c.completions.create(model=MODEL_ID, prompt="Name a colour:", max_tokens=5, temperature=0,
                                     extra_body={"adapters": adapters} if adapters else {})
            used[label] = [used[label][0] + 1, used[label][1] + r.usage.prompt_tokens,
                           used[label][2] + r.usage.completion_tokens]
    for label in sets:
        got = [labelled(s, n, label) - before[(n, label)] for n in names]
        assert got == used[label], (label, got, used[label])
    assert changes() - changes_before == 2


def test_an_adapter_the_server_does_not_have_is_a_400(lora_server):
    s, a, _ = lora_server
    with pytest.raises(openai.BadRequestError) as e:
        ask(s, [{"path": str(MODEL)}])
    assert e.value.body["param"] == "adapters[0].path", e.value.body
    with pytest.raises(openai.BadRequestError) as e:
        ask(s, [{"path": a, "scale": -1e39}])
    assert "adapters" in e.value.body["param"], e.value.body
    with pytest.raises(openai.BadRequestError) as e:
        ask(s, [{"path": a, "weight": 1}])
    assert "weight" in e.value.body["message"], e.value.body


def test_an_experiment_of_prompt_and_adapter_variants(lora_server):
    s, a, b = lora_server
    variants = [
        {"id": "control", "temperature": 0, "max_tokens": 16},
        {"id": "prompt", "system": "You are a pirate.", "temperature": 0, "max_tokens": 16},
        {"id": "tuned-a", "temperature": 0, "max_tokens": 16, "adapters": [{"path": a, "scale": 1.0}]},
        {"id": "tuned-b", "system": "You are a pirate.", "temperature": 0, "max_tokens": 16, "adapters": [{"path": b}]},
    ]
    status, text = http("POST", s.url + "/experiments", {"name": "tunes", "variants": variants})
    assert status in (200, 201), text
    stored = json.loads(text)
    assert [v.get("adapters") for v in stored["variants"]] == [None, None, [{"path": a, "scale": 1.0}],
                                                                [{"path": b, "scale": 1.0}]]
    msg = "Tell me about the sea."
    status, text = http("POST", s.url + "/experiments/tunes/fanout", {"input": msg})
    assert status == 200, text
    by = {r["variant"]: r["output"] for r in json.loads(text)["results"]}
    assert by["control"] == ask(s, None, msg)
    assert by["tuned-a"] == ask(s, [{"path": a}], msg)
    assert len(set(by.values())) == 4, by
    # routed traffic: each unit's answer is its variant's, and the exposures say which variant
    c = openai.OpenAI(base_url=s.url, api_key="unused")
    for v in ["control", "tuned-a"]:
        raw = c.chat.completions.with_raw_response.create(
            model="experiment:tunes", messages=[{"role": "user", "content": msg}], user=f"unit-{v}",
            extra_headers={"X-Abserve-Variant": v})
        assert raw.headers["x-abserve-variant"] == v
        assert raw.parse().choices[0].message.content == by[v]
    # the results and the dashboard name each variant's adapters
    status, text = http("GET", s.url + "/experiments/tunes/results")
    assert status == 200, text
    named = {v["id"]: v.get("adapters") for v in json.loads(text)["variants"]}
    assert named == {"control": None, "prompt": None, "tuned-a": [{"path": a, "scale": 1.0}],
                     "tuned-b": [{"path": b, "scale": 1.0}]}, named
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = browser.new_page()
        page.goto(s.base + "/#/e/tunes")
        row = page.locator('#performance tr[data-variant="tuned-b"]')
        expect(row.locator(".adapters")).to_have_text(" (adapters: lora-r8-seed2.gguf)")
        expect(page.locator('#performance tr[data-variant="control"] .adapters')).to_have_count(0)
        browser.close()
    # a variant naming an adapter the server was not started with is refused at creation
    status, text = http("POST", s.url + "/experiments", {
        "name": "unknown", "variants": [{"id": "a"}, {"id": "b", "adapters": [{"path": "/nowhere/x.gguf"}]}]})
    assert status == 400, text
    assert json.loads(text)["error"]["param"] == "variants.b.adapters[0].path", text


def fresh(server, adapter):
    """The greedy answer under `adapter` with the prompt computed afresh: an answer whose prompt
    came from the prefix cache is not bit-identical to a full prefill, and a near tie may then
    fork (what this test compares is the adapter, loaded again)."""
    c = openai.OpenAI(base_url=server.url, api_key="unused")
    r = c.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": "Tell me about the sea."}],
                                  max_tokens=16, temperature=0,
                                  extra_body={"adapters": [{"path": adapter}], "cache_prompt": False})
    return r.choices[0].message.content


def test_adapters_are_loaded_on_demand_and_unloaded_when_nothing_references_them(tmp_path):
    """A folder of two adapters with room for one: an adapter nothing references (no running
    request, no experiment) is unloaded when the other needs its room; one a running request
    holds is a 429 for the other, one an experiment names is a 400 until the experiment is gone."""
    a, b = lora(1), lora(2)
    for src, name in [(a, "a.gguf"), (b, "b.gguf")]:
        shutil.copy(src, tmp_path / name)
    s = Server("--adapter-dir", str(tmp_path), "--adapter-memory", str(os.path.getsize(a)))
    try:
        c = openai.OpenAI(base_url=s.url, api_key="unused", max_retries=0)
        under_a = fresh(s, "a.gguf")
        assert metric(s, "abserve_adapters_loaded") == 1
        assert metric(s, "abserve_adapter_bytes_admitted") <= metric(s, "abserve_adapter_bytes_reserved")
        # while a request under a runs (no end of text: 400 tokens), b has no room: 429
        stream = c.chat.completions.create(
            model=MODEL_ID, messages=[{"role": "user", "content": "Count to one hundred."}], max_tokens=400,
            stream=True, logit_bias={"0": -100, "2": -100}, extra_body={"adapters": [{"path": "a.gguf"}]})
        chunks = iter(stream)
        next(chunks)
        with pytest.raises(openai.RateLimitError) as e:
            c.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": "Hi"}], max_tokens=4,
                                      extra_body={"adapters": [{"path": "b.gguf"}]})
        assert e.value.body["param"] == "adapters[0].path", e.value.body
        assert "1 that running requests use" in e.value.body["message"], e.value.body
        assert e.value.response.headers["retry-after"] == "1"
        for _ in chunks:
            pass
        # a has finished: b takes its room, and a comes back with the same answer
        under_b = fresh(s, "b.gguf")
        assert under_b != under_a
        assert metric(s, "abserve_adapter_unloads_total") == 1
        assert metric(s, "abserve_adapters_loaded") == 1
        assert fresh(s, "a.gguf") == under_a
        assert metric(s, "abserve_adapter_unloads_total") == 2
        # an experiment names b: it stays loaded, and a is refused for good while it exists
        status, text = http("POST", s.url + "/experiments", {
            "name": "pins", "variants": [{"id": "control"}, {"id": "tuned", "adapters": [{"path": "b.gguf"}]}]})
        assert status == 201, text
        with pytest.raises(openai.BadRequestError) as e:
            fresh(s, "a.gguf")
        assert "1 that experiments name" in e.value.body["message"], e.value.body
        assert fresh(s, "b.gguf") == under_b
        status, text = http("DELETE", s.url + "/experiments/pins")
        assert status == 200, text
        assert fresh(s, "a.gguf") == under_a
        assert metric(s, "abserve_adapter_unloads_total") == 4
    finally:
        s.stop()
