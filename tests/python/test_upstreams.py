"""Models served elsewhere (issue 43), against real engines: llama.cpp's own server (xllamacpp,
4 slots of 512 tokens, with /props, /tokenize, /slots and /metrics) and a second abserve process
are upstreams of an abserve that also runs its local model; the client is the official openai SDK.

What is shown: both upstreams are listed and answer chats (whole and streamed, with the
upstream's own usage; greedy text identical to asking llama.cpp directly); an experiment with a
local variant and two upstream variants routes units stickily, fans out to all three and
records exposures; under a 64-request burst abserve never has more requests at llama.cpp than
its slots (read from /slots every 50 ms), llama.cpp never defers one, and the excess gets 429
with Retry-After; an upstream driven to saturation by another client holds abserve's work back
until it falls; an upstream killed mid-stream gives the client an error and the variant an
error exposure; API keys appear in no output; fan-out to a priced upstream answers a hash
sample of inputs (`fanout_rate`) and stops at a daily spend cap; /ready reuses a probe for the
upstream's `probe_interval`; the dashboard shows the variants' models and costs."""
import concurrent.futures as cf
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

import openai
import pytest

from conftest import BINARY, MODEL, MODEL_ID, ROOT, Server
from test_adapters import http

sys.path.insert(0, str(ROOT / "bench"))
from before_after import start_peer, stop  # noqa: E402

SLOTS, CTX = 4, 512
AMQP = os.environ.get("ABSERVE_TEST_AMQP", "amqp://guest:guest@127.0.0.1:5672/%2f")
SECRET = "sk-upstream-secret-4711"
LLAMA_SETTINGS = ["p.endpoint_slots = True", "p.endpoint_props = True"]

EXPERIMENT = """
[[experiment]]
name = "where"
[[experiment.variants]]
id = "local"
max_tokens = 4
[[experiment.variants]]
id = "llama"
model = "llama"
max_tokens = 4
[[experiment.variants]]
id = "peer"
model = "peer"
max_tokens = 4

[[experiment]]
name = "spend"
guardrails = [{ metric = "cost", tolerance = 0.2 }]
[[experiment.variants]]
id = "cheap"
model = "cheap"
max_tokens = 2
[[experiment.variants]]
id = "pricey"
model = "pricey"
max_tokens = 2

[[experiment]]
name = "paid"
[[experiment.variants]]
id = "local"
max_tokens = 2
[[experiment.variants]]
id = "sampled"
model = "cheap"
max_tokens = 2
fanout_rate = 0.5
[[experiment.variants]]
id = "capped"
model = "pricey"
max_tokens = 2
daily_spend_cap = 0.003
"""


def get(url):
    with urllib.request.urlopen(url, timeout=30) as r:
        return json.loads(r.read())


def text(url):
    with urllib.request.urlopen(url, timeout=30) as r:
        return r.read().decode()


def metric(body, name):
    for line in body.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return None


def samples(body, name, *labels):
    """The values of every sample of series `name` whose labels contain each of `labels`."""
    return [float(line.rsplit(" ", 1)[1]) for line in body.splitlines()
            if line.startswith(name + "{") and all(x in line for x in labels)]


@pytest.fixture(scope="module")
def env():
    llama, llama_url = start_peer(SLOTS, CTX, LLAMA_SETTINGS)
    peer = Server()
    d = tempfile.mkdtemp(prefix="abserve-up-")
    exp = os.path.join(d, "e.toml")
    with open(exp, "w") as f:
        f.write(EXPERIMENT)
    keys = os.path.join(d, "u.toml")
    with open(keys, "w") as f:
        f.write(f'[[upstream]]\nid = "peer"\nurl = "{peer.url}"\napi_key_env = "ABSERVE_TEST_UPSTREAM_KEY"\n'
                f'[[upstream]]\nid = "claude"\nurl = "{llama_url}"\nprotocol = "anthropic"\nmodel = "m"\n'
                'api_key_env = "ABSERVE_TEST_UPSTREAM_KEY"\n'
                f'[[upstream]]\nid = "cheap"\nurl = "{llama_url}/v1"\ninput_price = 1.5\noutput_price = 3.0\n'
                f'[[upstream]]\nid = "pricey"\nurl = "{llama_url}/v1"\ninput_price = 15.0\noutput_price = 30.0\n')
    os.environ["ABSERVE_TEST_UPSTREAM_KEY"] = SECRET
    main = Server("--upstream", f"llama={llama_url}/v1", "--upstreams", keys, "--experiments", exp,
                  "--queue-timeout", "20", "--guardrail-interval", "0.3", log=os.path.join(d, "log.txt"))
    try:
        yield {"llama": llama_url, "peer": peer, "main": main, "dir": d,
               "client": openai.OpenAI(base_url=main.url, api_key="unused")}
    finally:
        main.stop()
        peer.stop()
        stop(llama)


def test_models_lists_the_upstreams_with_their_engines(env):
    models = {m.id: m.owned_by for m in env["client"].models.list().data}
    assert models == {MODEL_ID: "abserve", "llama": "llama.cpp", "peer": "abserve", "claude": "llama.cpp",
                      "cheap": "llama.cpp", "pricey": "llama.cpp"}


def test_a_chat_is_relayed_with_the_upstreams_usage(env):
    msgs = [{"role": "user", "content": "What is the capital of France?"}]
    direct = openai.OpenAI(base_url=env["llama"] + "/v1", api_key="none").chat.completions.create(
        model="m", messages=msgs, max_tokens=12, temperature=0)
    r = env["client"].chat.completions.create(model="llama", messages=msgs, max_tokens=12, temperature=0)
    assert r.model == "llama"
    assert r.choices[0].message.content == direct.choices[0].message.content
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (direct.usage.prompt_tokens, direct.usage.completion_tokens)
    chunks = list(env["client"].chat.completions.create(
        model="llama", messages=msgs, max_tokens=12, temperature=0, stream=True, stream_options={"include_usage": True}))
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == direct.choices[0].message.content
    assert len([c for c in chunks if c.choices and c.choices[0].delta.content]) > 1, "relayed as it arrives"
    assert chunks[-1].usage.completion_tokens == direct.usage.completion_tokens
    # the second abserve answers through its API key
    r = env["client"].chat.completions.create(model="peer", messages=msgs, max_tokens=3)
    assert r.usage.completion_tokens == 3 and r.model == "peer"


def test_anthropics_messages_api_is_spoken_both_ways(env):
    """llama.cpp's server also serves Anthropic's /v1/messages: the same greedy answer comes back
    through the translation, whole and streamed, with the usage the Messages API reported."""
    msgs = [{"role": "system", "content": "You answer briefly."}, {"role": "user", "content": "Name a fruit."}]
    direct = openai.OpenAI(base_url=env["llama"] + "/v1", api_key="none").chat.completions.create(
        model="m", messages=msgs, max_tokens=10, temperature=0)
    r = env["client"].chat.completions.create(model="claude", messages=msgs, max_tokens=10, temperature=0)
    assert r.choices[0].message.content == direct.choices[0].message.content
    assert r.choices[0].finish_reason == direct.choices[0].finish_reason
    assert r.usage.prompt_tokens == direct.usage.prompt_tokens
    assert r.usage.completion_tokens == direct.usage.completion_tokens
    chunks = list(env["client"].chat.completions.create(
        model="claude", messages=msgs, max_tokens=10, temperature=0, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == direct.choices[0].message.content
    # a field the Messages API has no place for is refused by name, not dropped
    with pytest.raises(openai.BadRequestError) as e:
        env["client"].chat.completions.create(model="claude", messages=msgs, max_tokens=4, seed=3)
    assert "seed" in str(e.value)


def test_eval_in_process_and_a_worker_run_upstream_variants(env):
    d = tempfile.mkdtemp(prefix="abserve-up-eval-")
    exp = os.path.join(d, "exp.toml")
    with open(exp, "w") as f:
        f.write('[[experiment]]\nname = "offline"\n[[experiment.variants]]\nid = "local"\nmax_tokens = 4\n'
                'temperature = 0.0\n[[experiment.variants]]\nid = "remote"\nmodel = "llama"\nmax_tokens = 4\n'
                'temperature = 0.0\n[[scorer]]\ntype = "length"\n')
    rows = os.path.join(d, "rows.jsonl")
    with open(rows, "w") as f:
        for i in range(3):
            f.write(json.dumps({"id": f"r{i}", "input": f"What is {i} plus {i}?"}) + "\n")
    common = ["--memory-budget", "1GiB", "--context", "512", "--threads", "2", "--upstream", f"llama={env['llama']}/v1"]
    out = subprocess.run([str(BINARY), "eval", exp, "--dataset", rows, "--out", os.path.join(d, "in"), *common],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    res = [json.loads(line) for line in open(os.path.join(d, "in", "results.jsonl"))]
    assert sorted((r["variant"], r["row"]) for r in res if not r.get("error")) == sorted(
        (v, f"r{i}") for v in ("local", "remote") for i in range(3)), res
    # the same experiment over the queue, answered by a worker that serves the upstream
    queue = f"abserve.test.upstream.{os.getpid()}"
    worker = subprocess.Popen([str(BINARY), "worker", "--amqp", AMQP, "--queue", queue, *common],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        out = subprocess.run([str(BINARY), "eval", exp, "--dataset", rows, "--out", os.path.join(d, "queued"),
                              "--amqp", AMQP, "--queue", queue], capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-2000:]
    finally:
        worker.terminate()
        worker.wait(30)
    res = [json.loads(line) for line in open(os.path.join(d, "queued", "results.jsonl"))]
    remote = [r for r in res if r["variant"] == "remote"]
    assert len(remote) == 3 and all(not r.get("error") and r["output"] for r in remote), remote


def test_what_the_upstream_cannot_hold_is_refused_before_it_is_sent(env):
    long = "word " * 600
    with pytest.raises(openai.BadRequestError) as e:
        env["client"].chat.completions.create(model="llama", messages=[{"role": "user", "content": long}], max_tokens=4)
    assert "llama" in str(e.value) and str(CTX) in str(e.value)
    with pytest.raises(openai.BadRequestError) as e:
        env["client"].chat.completions.create(model="llama", messages=[{"role": "user", "content": "hi"}],
                                              extra_body={"adapters": [{"path": "x.gguf"}]})
    assert "adapters" in str(e.value)


def test_an_experiment_routes_units_and_fans_out_across_local_and_upstream_variants(env):
    c = env["client"]
    seen = {}
    for u in range(24):
        raw = c.chat.completions.with_raw_response.create(
            model="experiment:where", messages=[{"role": "user", "content": "Hi"}], user=f"u{u}")
        v = raw.headers["x-abserve-variant"]
        seen[f"u{u}"] = v
        r = raw.parse()
        assert r.usage.completion_tokens <= 4
    assert set(seen.values()) == {"local", "llama", "peer"}
    for u in list(seen)[:6]:
        raw = c.chat.completions.with_raw_response.create(
            model="experiment:where", messages=[{"role": "user", "content": "Again"}], user=u)
        assert raw.headers["x-abserve-variant"] == seen[u], "sticky"
    status, body = http("POST", env["main"].url + "/experiments/where/fanout", {"input": "Name a colour."})
    assert status == 200, body
    res = {r["variant"]: r for r in json.loads(body)["results"]}
    assert {v: r["model"] for v, r in res.items()} == {"local": MODEL_ID, "llama": "llama", "peer": "peer"}
    for r in res.values():
        assert r["error"] is None and r["output"] and 0 < r["completion_tokens"] <= 4 and r["ttft_ms"] > 0
    status, body = http("GET", env["main"].url + "/experiments/where/results")
    assert status == 200, body
    variants = {v["id"]: v for v in json.loads(body)["variants"]}
    for v in ("local", "llama", "peer"):
        assert variants[v]["exposures"] >= 1
    status, body = http("GET", env["main"].url + "/experiments/where/exposures")
    assert status == 200, body
    ex = [e for e in json.loads(body)["exposures"] if e["variant"] == "llama"]
    assert ex and all(e["output_tokens"] and e["latency_ms"] > 0 and e["ttft_ms"] > 0 for e in ex)


def test_cost_is_recorded_per_exposure_analysed_and_guarded(env):
    """With prices configured every exposure records its cost from the upstream's usage; cost is
    an automatic metric in /results, /metrics counts the spend, and a guardrail on cost stops a
    variant that costs more than 20% over control."""
    c = env["client"]
    before = metric(text(env["main"].base + "/metrics"), 'abserve_upstream_spend_total{model="pricey"}') or 0.0
    for u in range(60):
        try:
            # prompts of several lengths: a cost that never varies has no interval to compare
            c.chat.completions.create(model="experiment:spend", user=f"s{u}",
                                      messages=[{"role": "user", "content": "Hi" + " there" * (u % 5)}])
        except openai.APIStatusError as e:
            assert e.status_code == 429, e
    from test_metrics import stopped_by_guardrail
    stopped, r = stopped_by_guardrail(env["main"], "spend", "pricey")
    assert stopped["metric"] == "cost"
    assert r["cheap"]["metrics"]["cost"]["summary"]["mean"] > 0
    assert r["pricey"]["metrics"]["cost"]["summary"]["mean"] > 5 * r["cheap"]["metrics"]["cost"]["summary"]["mean"]
    status, body = http("GET", env["main"].url + "/experiments/spend/exposures?limit=500")
    ex = [e for e in json.loads(body)["exposures"] if e["variant"] == "cheap"]
    assert ex
    for e in ex:
        assert e["cost"] == pytest.approx((e["prompt_tokens"] * 1.5 + e["output_tokens"] * 3.0) / 1e6)
    # every answer of the stopped variant was an exposure (after the stop its units get control's
    # answer, unrecorded): its spend is the sum of its exposures' costs
    pricey = [e for e in json.loads(body)["exposures"] if e["variant"] == "pricey"]
    spent = metric(text(env["main"].base + "/metrics"), 'abserve_upstream_spend_total{model="pricey"}') - before
    assert spent == pytest.approx(sum(e["cost"] for e in pricey), rel=1e-6)


def test_a_burst_never_puts_more_requests_at_llama_cpp_than_its_slots(env):
    """64 requests at once at a 4-slot llama.cpp through abserve: every 50 ms, llama.cpp's /slots
    holds at most 4 requests and at most its 4 × 512 tokens (each busy slot's prompt + answer so
    far + what remains of its max_tokens), and abserve's own reservation there stays within the
    capacity it read; llama.cpp defers nothing; the excess gets 429 + Retry-After."""
    busiest, most_tokens, most_reserved = [0], [0], [0.0]
    stop_poll = threading.Event()

    def poll():
        while not stop_poll.is_set():
            slots = [s for s in get(env["llama"] + "/slots") if s["is_processing"]]
            busiest[0] = max(busiest[0], len(slots))
            held = sum(s.get("n_prompt_tokens", 0) + sum(t["n_decoded"] + t["n_remain"] for t in s.get("next_token", []))
                       for s in slots)
            most_tokens[0] = max(most_tokens[0], held)
            m = text(env["main"].base + "/metrics")
            reserved = samples(m, "abserve_upstream_tokens_reserved", 'model="llama"')
            most_reserved[0] = max([most_reserved[0], *reserved])
            time.sleep(0.05)

    poller = threading.Thread(target=poll)
    poller.start()
    c = openai.OpenAI(base_url=env["main"].url, api_key="unused", max_retries=0)

    def one(i):
        try:
            r = c.chat.completions.with_raw_response.create(
                model="llama", messages=[{"role": "user", "content": f"Count to {i}."}], max_tokens=48,
                extra_body={"ignore_eos": True})
            return 200, r.parse().usage.completion_tokens
        except openai.RateLimitError as e:
            return 429, e.response.headers.get("retry-after")
        except openai.APIStatusError as e:
            return e.status_code, e.message

    try:
        with cf.ThreadPoolExecutor(64) as pool:
            out = list(pool.map(one, range(64)))
    finally:
        stop_poll.set()
        poller.join()
    codes = [o[0] for o in out]
    assert set(codes) <= {200, 429}, out
    assert codes.count(200) >= SLOTS
    assert all(o[1] == 48 for o in out if o[0] == 200)
    assert all(o[1] and int(o[1]) >= 1 for o in out if o[0] == 429), "429 carries Retry-After"
    assert 0 < busiest[0] <= SLOTS
    assert 0 < most_tokens[0] <= SLOTS * CTX, most_tokens
    capacity = samples(text(env["main"].base + "/metrics"), "abserve_upstream_token_capacity", 'model="llama"')
    assert capacity == [SLOTS * CTX] and 0 < most_reserved[0] <= SLOTS * CTX, (capacity, most_reserved)
    assert metric(text(env["llama"] + "/metrics"), "llamacpp:requests_deferred") == 0


def test_a_saturated_upstream_holds_new_work_back_until_it_falls(env):
    direct = openai.OpenAI(base_url=env["llama"] + "/v1", api_key="none")
    msgs = [{"role": "user", "content": "Tell a long story."}]
    # another client fills every slot of llama.cpp
    with cf.ThreadPoolExecutor(SLOTS + 1) as pool:
        others = [pool.submit(direct.chat.completions.create, model="m", messages=msgs, max_tokens=160,
                              extra_body={"ignore_eos": True}) for _ in range(SLOTS)]
        deadline = time.time() + 20
        while sum(1 for s in get(env["llama"] + "/slots") if s["is_processing"]) < SLOTS:
            assert time.time() < deadline
            time.sleep(0.05)
        time.sleep(1.5)  # a scrape of its /metrics
        ours = pool.submit(env["client"].chat.completions.create, model="llama", messages=msgs, max_tokens=2)
        time.sleep(1.0)
        m = text(env["main"].base + "/metrics")
        assert metric(m, 'abserve_model_requests_waiting{model="llama"}') == 1, "held back in abserve's queue"
        assert not ours.done()
        for o in others:
            o.result()
        assert ours.result(timeout=30).usage.completion_tokens == 2
    assert metric(text(env["llama"] + "/metrics"), "llamacpp:requests_deferred") == 0


def test_keys_appear_in_no_output(env):
    main = env["main"]
    outs = [text(main.base + "/metrics"), json.dumps(get(main.url + "/models")),
            http("GET", main.url + "/experiments")[1], http("GET", main.url + "/experiments/where/exposures")[1],
            text(main.base + "/ready"), text(main.base + "/")]
    with open(os.path.join(env["dir"], "log.txt")) as f:
        outs.append(f.read())
    for o in outs:
        assert SECRET not in o


def test_an_upstream_killed_mid_stream_is_an_error_for_the_client_and_the_variant():
    llama, url = start_peer(1, CTX, LLAMA_SETTINGS)
    d = tempfile.mkdtemp(prefix="abserve-up-")
    exp = os.path.join(d, "e.toml")
    with open(exp, "w") as f:
        f.write('[[experiment]]\nname = "dies"\nguardrails = ["error"]\n'
                '[[experiment.variants]]\nid = "local"\nmax_tokens = 1\n'
                '[[experiment.variants]]\nid = "gone"\nmodel = "llama"\n')
    s = Server("--upstream", f"llama={url}", "--experiments", exp, "--guardrail-interval", "0.3")
    try:
        c = openai.OpenAI(base_url=s.url, api_key="unused", max_retries=0)
        gone = next(f"u{u}" for u in range(100) if c.chat.completions.with_raw_response.create(
            model="experiment:dies", messages=[{"role": "user", "content": "Hi"}], user=f"u{u}", max_tokens=1,
        ).headers["x-abserve-variant"] == "gone")
        stream = c.chat.completions.create(model="experiment:dies", user=gone, stream=True, max_tokens=400,
                                           messages=[{"role": "user", "content": "Tell a long story."}],
                                           extra_body={"ignore_eos": True})
        got = []
        with pytest.raises(openai.APIError) as e:
            for ch in stream:
                if ch.choices and ch.choices[0].delta.content:
                    got.append(ch.choices[0].delta.content)
                    if len(got) == 3:
                        llama.kill()
        assert len(got) >= 3
        assert "llama" in str(e.value)
        deadline = time.time() + 10
        while True:
            status, body = http("GET", s.url + "/experiments/dies/exposures")
            ex = json.loads(body)["exposures"]
            if any(e["error"] for e in ex) or time.time() > deadline:
                break
            time.sleep(0.2)
        errors = [e for e in ex if e["error"]]
        assert [e["variant"] for e in errors] == ["gone"] and "llama" in errors[0]["error"]
        # the upstream stays down: the guardrail on `error` stops its variant, the control goes on
        for u in range(100, 160):
            try:
                c.chat.completions.create(model="experiment:dies", messages=[{"role": "user", "content": "Hi"}],
                                          user=f"u{u}", max_tokens=1)
            except openai.APIStatusError as e:
                assert e.status_code == 503 and "llama" in e.message
        from test_metrics import stopped_by_guardrail
        stopped, r = stopped_by_guardrail(s, "dies", "gone")
        assert stopped["metric"] == "error" and r["local"]["state"] == "active"
    finally:
        s.stop()
        stop(llama)


class FaultProxy:
    """A fault in front of the real engine: every request is passed to llama.cpp's server, except
    chat requests while `mode` says otherwise: `429` (answered 429 with Retry-After: 1, `left`
    times), `stall` (never answers), `garbage` (a 200 stream of what is not JSON), `500`."""

    def __init__(self, target):
        import http.server
        proxy = self
        self.mode, self.left, self.chats = "pass", 0, 0

        class H(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def relay(self, method):
                n = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(n) if n else None
                if self.path.endswith("/chat/completions"):
                    proxy.chats += 1
                    mode = proxy.mode
                    if mode == "429" and proxy.left > 0:
                        proxy.left -= 1
                        return self.answer(429, b'{"error": {"message": "slow down"}}', {"Retry-After": "1"})
                    if mode == "stall":
                        time.sleep(30)
                        return
                    if mode == "garbage":
                        return self.answer(200, b"data: {this is not json\n\n", {"Content-Type": "text/event-stream"})
                    if mode == "500":
                        return self.answer(500, b'{"error": {"message": "internal"}}', {})
                req = urllib.request.Request(target + self.path, data=body, method=method,
                                             headers={"Content-Type": "application/json"})
                try:
                    with urllib.request.urlopen(req, timeout=60) as r:
                        self.answer(r.status, r.read(), {"Content-Type": r.headers.get("content-type", "")})
                except urllib.error.HTTPError as e:
                    self.answer(e.code, e.read(), {})

            def answer(self, status, data, headers):
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                try:
                    self.wfile.write(data)
                except OSError:
                    pass

            def do_GET(self):
                self.relay("GET")

            def do_POST(self):
                self.relay("POST")

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self):
        self.server.shutdown()


def test_faults_are_retried_timed_out_reported_and_broken_off(env):
    proxy = FaultProxy(env["llama"])
    d = env["dir"]
    conf = os.path.join(d, "faulty.toml")
    with open(conf, "w") as f:
        f.write(f'[[upstream]]\nid = "faulty"\nurl = "{proxy.url}/v1"\nfirst_token_timeout = 2\n'
                'total_timeout = 6\nretries = 2\nbreaker_failures = 3\nbreaker_cooldown = 2\n')
    s = Server("--upstreams", conf, "--queue-timeout", "10")
    try:
        c = openai.OpenAI(base_url=s.url, api_key="unused", max_retries=0)
        msgs = [{"role": "user", "content": "Hi"}]
        m0 = text(s.base + "/metrics")
        # 429 with Retry-After twice: retried after it, then answered by the engine
        proxy.mode, proxy.left, proxy.chats = "429", 2, 0
        t0 = time.time()
        r = c.chat.completions.create(model="faulty", messages=msgs, max_tokens=3)
        assert r.usage.completion_tokens == 3 and proxy.chats == 3
        assert time.time() - t0 >= 2.0, "Retry-After honoured"
        assert metric(text(s.base + "/metrics"), 'abserve_upstream_retries_total{model="faulty"}') == 2
        # a malformed body: 502 naming the upstream
        proxy.mode = "garbage"
        with pytest.raises(openai.APIStatusError) as e:
            c.chat.completions.create(model="faulty", messages=msgs, max_tokens=3)
        assert e.value.status_code == 502 and "faulty" in e.value.message
        # a stalled upstream: 504 within the total timeout, nothing left running
        proxy.mode = "stall"
        t0 = time.time()
        with pytest.raises(openai.APIStatusError) as e:
            c.chat.completions.create(model="faulty", messages=msgs, max_tokens=3)
        assert e.value.status_code == 504 and "faulty" in e.value.message, e.value.message
        assert time.time() - t0 < 10
        m = text(s.base + "/metrics")
        assert metric(m, 'abserve_upstream_requests_in_flight{model="faulty",url="' + proxy.url + '/v1"}') == 0
        # three failures in a row opened the breaker: /ready says so, requests fail fast with 503
        assert metric(m, 'abserve_upstream_breaker_state{model="faulty",url="' + proxy.url + '/v1"}') == 1, m
        status, body = http("GET", s.base + "/ready")
        assert status == 503 and "breaker" in body, body
        proxy.mode = "pass"
        chats = proxy.chats
        with pytest.raises(openai.APIStatusError) as e:
            c.chat.completions.create(model="faulty", messages=msgs, max_tokens=3)
        assert e.value.status_code == 503 and "breaker" in e.value.message
        assert proxy.chats == chats, "nothing sent while open"
        # after the cooldown one probe goes through; its success closes the breaker
        time.sleep(2.5)
        r = c.chat.completions.create(model="faulty", messages=msgs, max_tokens=3)
        assert r.usage.completion_tokens == 3
        m = text(s.base + "/metrics")
        assert metric(m, 'abserve_upstream_breaker_state{model="faulty",url="' + proxy.url + '/v1"}') == 0
        assert metric(m, 'abserve_upstream_errors_total{class="bad_answer",model="faulty"}') == 1, m
        status, _ = http("GET", s.base + "/ready")
        assert status == 200
        assert m0 is not None
    finally:
        s.stop()
        proxy.stop()


def fnv1a32(text):
    h = 0x811C9DC5
    for unit in text.encode("utf-16-le").decode("latin-1")[::2]:  # ASCII inputs: one unit each
        h = ((h ^ ord(unit)) * 0x01000193) & 0xFFFFFFFF
    return h


def growthbook_hash(seed, value):
    """GrowthBook's hash, version 2 (its SDKs' fixtures pin abserve's Rust copy)."""
    return (fnv1a32(str(fnv1a32(seed + value))) % 10000) / 10000


def test_fanout_samples_inputs_by_rate_and_stops_a_variant_at_its_daily_spend_cap(env):
    """`sampled` (fanout_rate 0.5) answers exactly the inputs GrowthBook's hash samples, the
    same ones when asked again; `capped` (daily_spend_cap 0.003 at 15/30 per million tokens)
    answers until the next answer could pass the cap, then is refused with the day's numbers
    while the other variants go on; what it spent never passes the cap."""
    url = env["main"].url + "/experiments/paid/fanout"
    inputs = [f"Name colour number {i}." for i in range(10)]
    want = {i for i in inputs if growthbook_hash("paid/fanout/sampled/", i) < 0.5}
    assert 0 < len(want) < len(inputs), "the inputs should fall on both sides"
    spent, refusals = 0.0, []
    for rnd in range(2):
        for i in inputs:
            status, body = http("POST", url, {"input": i})
            assert status == 200, body
            res = {r["variant"]: r for r in json.loads(body)["results"]}
            assert res["local"]["error"] is None and res["local"]["output"] is not None
            s = res["sampled"]
            if i in want:
                assert "skipped" not in s and s["error"] is None and s["cost"] > 0, s
            else:
                assert s["skipped"] == "fanout_rate 0.5 left this input out", s
                assert s["output"] is None and "cost" not in s
            c = res["capped"]
            if c["error"] is None:
                assert not refusals, "answered again after a refusal on the same day"
                spent += c["cost"]
            else:
                refusals.append(c["error"])
    assert spent <= 0.003
    assert refusals, "the cap of 0.003 should be reached within 20 fan-outs"
    first = refusals[0]
    assert "variant 'capped' reached its daily fan-out spend cap of 0.003" in first, first
    assert "00:00 UTC" in first
    said = float(first.split(": ", 1)[1].split(" spent today")[0])
    assert said == pytest.approx(spent, abs=1e-6), first


def test_ready_reuses_an_upstreams_probe_for_its_probe_interval(env):
    """Each /ready past the server's own 2 s cache asks every upstream for a 1-token answer
    unless its last successful probe is younger than its `probe_interval`: with 3600 s llama.cpp
    predicts no token for the second /ready; with 0.5 s it does."""
    def predicted():
        return metric(text(env["llama"] + "/metrics"), "llamacpp:tokens_predicted_total")

    for interval, asked in ((3600, False), (0.5, True)):
        f = os.path.join(env["dir"], f"probe-{interval}.toml")
        with open(f, "w") as out:
            out.write(f'[[upstream]]\nid = "p"\nurl = "{env["llama"]}/v1"\nprobe_interval = {interval}\n')
        s = Server("--upstreams", f)
        try:
            assert get(s.base + "/ready")["status"] == "ready"
            before = predicted()
            time.sleep(2.5)
            assert get(s.base + "/ready")["status"] == "ready"
            assert (predicted() > before) == asked, (interval, before, predicted())
        finally:
            s.stop()


def test_the_dashboard_shows_each_variants_model_exposures_and_cost(env):
    """In Chromium: the page of an experiment over a local and two upstream variants names each
    variant's model and shows the exposures /results counts; the priced experiment's cost column
    equals /results' mean cost."""
    from playwright.sync_api import expect, sync_playwright
    from test_dashboard import CHROMIUM

    main = env["main"]
    errors = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.on("pageerror", lambda e: errors.append(f"page error: {e}"))
        for name, models in (("where", {"local": "default", "llama": "llama", "peer": "peer"}),
                             ("spend", {"cheap": "cheap", "pricey": "pricey"})):
            results = get(main.url + f"/experiments/{name}/results")
            page.goto(main.base + f"/#/e/{name}")
            for v in results["variants"]:
                row = page.locator(f'#performance tr[data-variant="{v["id"]}"]')
                expect(row.locator('[data-k="model"]')).to_have_text(models[v["id"]])
                expect(row.locator('[data-k="exposures"]')).to_have_text(str(v["exposures"]))
                if name == "spend":
                    cost = v["metrics"]["cost"]["summary"]["mean"]
                    cell = row.locator('[data-k="cost"]')
                    assert float(cell.get_attribute("data-value")) == pytest.approx(cost, rel=1e-12)
                    assert float(cell.inner_text()) == pytest.approx(cost, rel=0.01)
        browser.close()
    assert not errors, errors


def test_replicas_share_the_load_keep_a_prompts_affinity_and_cover_for_a_dead_one(env):
    """Two real llama.cpp servers as replicas of one upstream id: requests with one system
    prompt go to one replica while it is not busier than the other (its prefix cache holds the
    prompt), a burst spills over to both, and when one replica is killed its requests are
    retried at once on the other (answered, not failed), its breaker opens, and /ready stays
    ready while the other replica serves."""
    second, second_url = start_peer(SLOTS, CTX, LLAMA_SETTINGS)
    f = os.path.join(env["dir"], "pair.toml")
    with open(f, "w") as out:
        out.write(f'[[upstream]]\nid = "pair"\nurls = ["{env["llama"]}/v1", "{second_url}/v1"]\n'
                  'breaker_failures = 2\nbreaker_cooldown = 60\n')
    s = Server("--upstreams", f)
    urls = [env["llama"], second_url]

    def predicted():
        return [metric(text(u + "/metrics"), "llamacpp:tokens_predicted_total") or 0.0 for u in urls]

    def ask(system, max_tokens=2):
        return http("POST", s.url + "/chat/completions", {
            "model": "pair", "max_tokens": max_tokens, "temperature": 0,
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": "Hi"}]})

    try:
        homes = {}
        for p in range(6):
            system = f"You are assistant number {p}. Answer briefly."
            before = predicted()
            for _ in range(3):
                status, body = ask(system)
                assert status == 200, body
            grew = [a - b > 0 for a, b in zip(predicted(), before)]
            assert grew.count(True) == 1, f"prompt {p} went to both replicas one by one: {grew}"
            homes[system] = grew.index(True)
        assert set(homes.values()) == {0, 1}, "six prompts should not all hash to one replica"
        before = predicted()
        with cf.ThreadPoolExecutor(8) as ex:
            outs = list(ex.map(lambda _: ask("You are assistant number 0. Answer briefly.", 24), range(8)))
        assert all(st == 200 for st, _ in outs), outs
        assert all(a > b for a, b in zip(predicted(), before)), "a burst should spill over to both"
        stop(second)
        second = None
        on_dead = [p for p, home in homes.items() if home == 1]
        for system in on_dead * 2:
            status, body = ask(system)
            assert status == 200, f"a dead replica's request was not covered by the live one: {body}"
        m = text(s.base + "/metrics")
        state = samples(m, "abserve_upstream_breaker_state", 'model="pair"', second_url)
        assert state == [1.0], m
        assert metric(m, 'abserve_upstream_retries_total{model="pair"}') >= 2
        # the other replica serves: the upstream is not down, so neither is readiness
        assert get(s.base + "/ready")["status"] == "ready"
    finally:
        s.stop()
        if second is not None:
            stop(second)


def make_certificates(d):
    """A CA and a certificate for 127.0.0.1 and localhost signed by it (openssl)."""
    def run(*args):
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=d)

    run("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "2",
        "-subj", "/CN=abserve test CA", "-keyout", "ca.key", "-out", "ca.pem")
    run("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
        "-subj", "/CN=localhost", "-keyout", "leaf.key", "-out", "leaf.csr")
    with open(os.path.join(d, "ext.cnf"), "w") as f:
        f.write("subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\n")
    run("x509", "-req", "-in", "leaf.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
        "-days", "2", "-extfile", "ext.cnf", "-out", "leaf.pem")
    return os.path.join(d, "ca.pem"), os.path.join(d, "leaf.pem"), os.path.join(d, "leaf.key")


class TlsProxy:
    """TLS in front of a plain HTTP server (as a load balancer terminating https would be):
    bytes pass both ways unchanged."""

    def __init__(self, target, cert, key):
        import asyncio
        import ssl
        host, port = target.split("//")[1].split(":")
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(cert, key)
        self.loop = asyncio.new_event_loop()

        async def pipe(r, w):
            try:
                while data := await r.read(65536):
                    w.write(data)
                    await w.drain()
            except (ConnectionError, asyncio.IncompleteReadError):
                pass
            finally:
                w.close()

        async def handle(cr, cw):
            ur, uw = await asyncio.open_connection(host, int(port))
            await asyncio.gather(pipe(cr, uw), pipe(ur, cw))

        async def start():
            return await asyncio.start_server(handle, "127.0.0.1", 0, ssl=ctx)

        self.server = self.loop.run_until_complete(start())
        self.port = self.server.sockets[0].getsockname()[1]
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def stop(self):
        self.loop.call_soon_threadsafe(self.server.close)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


def test_an_https_upstream_is_verified_against_the_systems_roots(env):
    """An https upstream whose certificate chains to none of the system's roots is refused at
    start, naming the certificate; one whose CA the system trusts answers (rustls-native-certs
    reads SSL_CERT_FILE as the system's roots, as OpenSSL does)."""
    ca, cert, key = make_certificates(env["dir"])
    proxy = TlsProxy(env["llama"], cert, key)
    try:
        url = f"https://localhost:{proxy.port}/v1"
        untrusted = subprocess.run(
            [str(BINARY), "serve", "--model", str(MODEL),
             "--port", "0", "--data-dir", tempfile.mkdtemp(prefix="abserve-tls-"), "--upstream", f"tls={url}"],
            capture_output=True, text=True, timeout=120,
            env={k: v for k, v in os.environ.items() if k != "SSL_CERT_FILE"})
        assert untrusted.returncode != 0
        assert "certificate" in untrusted.stderr.lower(), untrusted.stderr[-2000:]
        os.environ["SSL_CERT_FILE"] = ca
        try:
            s = Server("--upstream", f"tls={url}")
        finally:
            del os.environ["SSL_CERT_FILE"]
        try:
            status, body = http("POST", s.url + "/chat/completions", {
                "model": "tls", "max_tokens": 3, "temperature": 0, "messages": [{"role": "user", "content": "Hi"}]})
            assert status == 200, body
            assert json.loads(body)["usage"]["completion_tokens"] <= 3
        finally:
            s.stop()
    finally:
        proxy.stop()
