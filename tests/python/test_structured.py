"""Structured outputs and tool calls on the default model through the official openai SDK:
every answer that finishes with `stop` is checked by an independent validator (Python's
`jsonschema` with its format checker, `re`, `json`)."""
import json
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import urllib.error
import urllib.request
import jsonschema
import openai
import pytest
from pydantic import BaseModel

from conftest import MODEL_ID, Server

ADDRESS = {
    "type": "object",
    "properties": {"street": {"type": "string", "maxLength": 40}, "city": {"type": "string", "maxLength": 30}},
    "required": ["street", "city"],
    "additionalProperties": False,
}

SCHEMAS = {
    "nested": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 30},
            "address": ADDRESS,
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
        },
        "required": ["name", "address", "age"],
        "additionalProperties": False,
    },
    "array_bounds": {
        "type": "object",
        "properties": {"tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "minItems": 2, "maxItems": 4}},
        "required": ["tags"],
        "additionalProperties": False,
    },
    "enum": {
        "type": "object",
        "properties": {"sentiment": {"enum": ["positive", "negative", "neutral"]}, "score": {"type": "number", "minimum": 0, "maximum": 1}},
        "required": ["sentiment", "score"],
        "additionalProperties": False,
    },
    "one_of": {
        "type": "object",
        "properties": {
            "shape": {
                "oneOf": [
                    {"type": "object", "properties": {"kind": {"const": "circle"}, "radius": {"type": "integer", "minimum": 1, "maximum": 99}}, "required": ["kind", "radius"], "additionalProperties": False},
                    {"type": "object", "properties": {"kind": {"const": "square"}, "side": {"type": "integer", "minimum": 1, "maximum": 99}}, "required": ["kind", "side"], "additionalProperties": False},
                ]
            }
        },
        "required": ["shape"],
        "additionalProperties": False,
    },
    "any_of": {
        "type": "object",
        "properties": {"value": {"anyOf": [{"type": "integer", "minimum": -50, "maximum": 50}, {"type": "boolean"}, {"type": "null"}]}},
        "required": ["value"],
        "additionalProperties": False,
    },
    "formats": {
        "type": "object",
        "properties": {"date": {"type": "string", "format": "date"}, "email": {"type": "string", "format": "email", "maxLength": 40}},
        "required": ["date", "email"],
        "additionalProperties": False,
    },
    "pattern": {
        "type": "object",
        "properties": {"code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"}, "phone": {"type": "string", "pattern": "^\\+[0-9]{7,12}$"}},
        "required": ["code", "phone"],
        "additionalProperties": False,
    },
    "ref": {
        "$defs": {"address": ADDRESS},
        "type": "object",
        "properties": {"home": {"$ref": "#/$defs/address"}, "work": {"$ref": "#/$defs/address"}},
        "required": ["home", "work"],
        "additionalProperties": False,
    },
}

def http(method, url, body=None, timeout=120):
    """(status, text) of a plain HTTP request (no client library: what any harness sends)."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


PROMPT = "Answer with JSON for a short made-up example record."


def client(server):
    return openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0)


def ask_schema(c, name, schema, temperature, seed):
    return c.chat.completions.create(
        model=MODEL_ID,
        messages=[{"role": "user", "content": f"{PROMPT} ({name})"}],
        response_format={"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}},
        temperature=temperature,
        seed=seed,
        max_tokens=220,
    )


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_every_stopped_answer_validates_against_its_schema(server, temperature):
    c = client(server)
    jobs = [(name, schema, seed) for name, schema in SCHEMAS.items() for seed in (1, 2)]
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda j: (j[0], j[1], ask_schema(c, j[0], j[1], temperature, j[2])), jobs))
    stopped = 0
    for name, schema, r in answers:
        choice = r.choices[0]
        if choice.finish_reason != "stop":
            assert choice.finish_reason == "length", (name, choice.finish_reason)
            continue
        stopped += 1
        value = json.loads(choice.message.content)
        jsonschema.validate(value, schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
    # the schemas are small: nearly every answer finishes inside max_tokens
    assert stopped >= len(jobs) - 2, f"only {stopped} of {len(jobs)} answers finished"


def test_json_object_regex_and_lark_are_obeyed(server):
    c = client(server)
    for seed in range(3):
        r = c.chat.completions.create(
            model=MODEL_ID, messages=[{"role": "user", "content": "Describe a cat as JSON."}],
            response_format={"type": "json_object"}, temperature=1.0, seed=seed, max_tokens=200,
        )
        if r.choices[0].finish_reason == "stop":
            assert isinstance(json.loads(r.choices[0].message.content), dict)
    rx = r"(yes|no), because [a-z ]{1,40}\."
    for seed in range(3):
        r = c.chat.completions.create(
            model=MODEL_ID, messages=[{"role": "user", "content": "Is the sky blue?"}],
            response_format={"type": "regex", "regex": rx}, temperature=1.0, seed=seed, max_tokens=60,
        )
        assert r.choices[0].finish_reason == "stop"
        assert re.fullmatch(rx, r.choices[0].message.content), r.choices[0].message.content
    lark = 'start: "The answer is " NUMBER "."\nNUMBER: /[0-9]{1,4}/'
    r = c.chat.completions.create(
        model=MODEL_ID, messages=[{"role": "user", "content": "What is 12 + 30?"}],
        response_format={"type": "lark", "lark": lark}, temperature=0, max_tokens=20,
    )
    assert r.choices[0].finish_reason == "stop"
    assert re.fullmatch(r"The answer is [0-9]{1,4}\.", r.choices[0].message.content)


class City(BaseModel):
    name: str
    country: str
    population_millions: float


def test_sdk_parse_returns_a_parsed_pydantic_object(server):
    r = client(server).chat.completions.parse(
        model=MODEL_ID, messages=[{"role": "user", "content": "Tell me about Paris."}],
        response_format=City, temperature=0, max_tokens=120,
    )
    city = r.choices[0].message.parsed
    assert isinstance(city, City), r.choices[0].message
    assert city.name


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 40}, "unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
TIME = {
    "type": "function",
    "function": {"name": "get_time", "parameters": {"type": "object", "properties": {"zone": {"type": "string", "maxLength": 20}}, "required": ["zone"], "additionalProperties": False}},
}


def test_a_required_tool_call_validates_and_streams_into_the_same_call(server):
    c = client(server)
    ask = dict(
        model=MODEL_ID, messages=[{"role": "user", "content": "What is the weather in Oslo?"}],
        tools=[WEATHER, TIME], tool_choice="required", temperature=0, max_tokens=120,
    )
    r = c.chat.completions.create(**ask)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    calls = choice.message.tool_calls
    assert calls and all(call.id.startswith("call_") for call in calls)
    for call in calls:
        tool = {"get_weather": WEATHER, "get_time": TIME}[call.function.name]
        jsonschema.validate(json.loads(call.function.arguments), tool["function"]["parameters"])
    # streamed: the deltas of each index join into the same call
    joined = {}
    finish = None
    pieces = 0
    for chunk in c.chat.completions.create(stream=True, **ask):
        for ch in chunk.choices:
            for d in ch.delta.tool_calls or []:
                j = joined.setdefault(d.index, {"id": None, "name": "", "arguments": ""})
                j["id"] = j["id"] or d.id
                j["name"] += d.function.name or ""
                j["arguments"] += d.function.arguments or ""
                pieces += bool(d.function.arguments)
            finish = ch.finish_reason or finish
    assert finish == "tool_calls"
    # the arguments arrive as the model writes them, not in one piece at the end
    assert pieces > len(joined), pieces
    assert [(j["name"], j["arguments"]) for j in joined.values()] == [
        (call.function.name, call.function.arguments) for call in calls
    ]
    # a named function is the one called; with parallel_tool_calls off, exactly one call
    r = c.chat.completions.create(**{**ask, "tool_choice": {"type": "function", "function": {"name": "get_time"}}, "parallel_tool_calls": False})
    assert [t.function.name for t in r.choices[0].message.tool_calls] == ["get_time"]


def test_a_tool_result_in_the_history_is_accepted(server):
    c = client(server)
    first = c.chat.completions.create(
        model=MODEL_ID, messages=[{"role": "user", "content": "Weather in Rome?"}],
        tools=[WEATHER], tool_choice="required", temperature=0, max_tokens=120,
    ).choices[0].message
    call = first.tool_calls[0]
    r = c.chat.completions.create(
        model=MODEL_ID,
        messages=[
            {"role": "user", "content": "Weather in Rome?"},
            {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
            {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 21, "sky": "clear"}'},
        ],
        tools=[WEATHER], temperature=0, max_tokens=80,
    )
    m = r.choices[0].message
    # auto: either a direct answer or another call, never raw format text
    assert (m.content and not m.content.lstrip().startswith('{"response"')) or m.tool_calls


@pytest.mark.parametrize("field,value", [
    ("functions", [{"name": "f", "parameters": {}}]),
    ("audio", {"voice": "alloy", "format": "wav"}),
    ("prediction", {"type": "content", "content": "x"}),
    ("guided_json", {"type": "object"}),
])
def test_unsupported_fields_are_400_naming_them(server, field, value):
    with pytest.raises(openai.BadRequestError) as e:
        client(server).chat.completions.create(
            model=MODEL_ID, messages=[{"role": "user", "content": "hi"}], max_tokens=4, extra_body={field: value},
        )
    assert e.value.body["param"] == field


def test_hostile_schemas_are_refused_or_bounded_while_health_and_streams_go_on():
    # a body limit large enough for an enum of 100,000 values (llguidance's lexer fuel refuses it)
    server = Server("--body-limit", "8000000", context=1024)
    try:
        hostile_schemas(server)
    finally:
        server.stop()


def hostile_schemas(server):
    deep = {"type": "string"}
    for _ in range(100):
        deep = {"type": "array", "items": deep}
    hostile = [
        deep,
        {"enum": [f"value-{i}" for i in range(30_000)]},
        {"enum": [f"value-{i}" for i in range(100_000)]},
        {"type": "object", "properties": {"p": {"type": "string", "pattern": "^(a+)+(b+)+(c+)+$"}}, "required": ["p"]},
        {"type": "object", "properties": {f"k{i}": {"type": "string", "pattern": f"^[a-z]{{{i % 50 + 1},{i % 50 + 60}}}x[0-9]{{3}}$"} for i in range(400)}},
    ]
    got = []
    stop = threading.Event()

    def stream():
        s = client(server).chat.completions.create(
            model=MODEL_ID, messages=[{"role": "user", "content": "Count slowly from one to one hundred."}],
            max_tokens=900, temperature=0, stream=True, extra_body={"ignore_eos": True},
        )
        for chunk in s:
            got.append(time.monotonic())
            if stop.is_set():
                break

    t = threading.Thread(target=stream)
    t.start()
    time.sleep(1.0)
    health = []

    def probe():
        while not stop.is_set():
            t0 = time.monotonic()
            http("GET", server.base + "/health", timeout=10)
            health.append(time.monotonic() - t0)
            time.sleep(0.1)

    p = threading.Thread(target=probe)
    p.start()
    statuses = []
    # deeper than any JSON body the server parses (serde_json's limit of 128): a 400 before a grammar
    deeper = '{"type": "array", "items": ' * 3000 + '{"type": "string"}' + "}" * 3000
    body = '{"model": "%s", "messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_schema", "json_schema": {"name": "h", "schema": %s}}}' % (MODEL_ID, deeper)
    req = urllib.request.Request(server.url + "/chat/completions", data=body.encode(), headers={"content-type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=60)
    assert e.value.code == 400
    for schema in hostile:
        status, text = http("POST", server.url + "/chat/completions", {
            "model": MODEL_ID, "messages": [{"role": "user", "content": "x"}], "max_tokens": 8,
            "response_format": {"type": "json_schema", "json_schema": {"name": "h", "schema": schema}},
        })
        statuses.append(status)
        if status == 400:
            assert json.loads(text)["error"]["param"] == "response_format", text
        else:
            assert status == 200, text
    n_before = len(got)
    time.sleep(1.0)
    stop.set()
    t.join(60)
    p.join(30)
    assert 400 in statuses, statuses
    assert len(got) > n_before, "the running stream stalled behind the hostile schemas"
    assert max(health) < 1.0, f"/health took {max(health):.2f} s"


def test_fast_forward_on_and_off_give_the_same_tokens(server):
    off = Server("--fast-forward", "off")
    try:
        ask = dict(
            model=MODEL_ID, messages=[{"role": "user", "content": "A record, please."}], temperature=0, max_tokens=200,
            logprobs=True, top_logprobs=2, response_format={"type": "json_schema", "json_schema": {"name": "n", "schema": SCHEMAS["nested"]}},
        )
        a = client(server).chat.completions.create(**ask).choices[0]
        b = client(off).chat.completions.create(**ask).choices[0]
        assert a.message.content == b.message.content
        assert [t.token for t in a.logprobs.content] == [t.token for t in b.logprobs.content]
        assert [t.logprob for t in a.logprobs.content] == pytest.approx([t.logprob for t in b.logprobs.content], abs=1e-3)
        metrics = http("GET", server.base + "/metrics")[1]
        forced = [l for l in metrics.splitlines() if l.startswith("abserve_forced_tokens_total")]
        assert forced and float(forced[0].split()[-1]) > 0
    finally:
        off.stop()


def test_a_variant_with_a_schema_and_one_without_each_answer_in_their_own_format(server):
    ticket = {
        "type": "object",
        "properties": {"category": {"enum": ["billing", "shipping", "other"]}, "urgent": {"type": "boolean"}},
        "required": ["category", "urgent"],
        "additionalProperties": False,
    }
    status, text = http("POST", server.url + "/experiments", {
        "name": "triage", "variants": [
            {"id": "free", "system": "You triage support tickets.", "temperature": 0, "max_tokens": 40},
            {"id": "schema", "system": "You triage support tickets.", "temperature": 0, "max_tokens": 60,
             "response_format": {"type": "json_schema", "json_schema": {"name": "ticket", "schema": ticket}}},
            {"id": "tool", "system": "You triage support tickets.", "temperature": 0, "max_tokens": 80,
             "tools": [WEATHER], "tool_choice": "required"},
        ],
    })
    assert status in (200, 201), text
    c = client(server)
    msg = [{"role": "user", "content": "My parcel has not arrived after two weeks!"}]
    answers = {}
    for v in ["free", "schema", "tool"]:
        raw = c.chat.completions.with_raw_response.create(
            model="experiment:triage", messages=msg, user=f"unit-{v}", extra_headers={"X-Abserve-Variant": v},
        )
        assert raw.headers["x-abserve-variant"] == v
        answers[v] = raw.parse().choices[0]
    jsonschema.validate(json.loads(answers["schema"].message.content), ticket)
    assert answers["tool"].finish_reason == "tool_calls"
    assert answers["tool"].message.tool_calls[0].function.name == "get_weather"
    free = answers["free"].message.content
    assert answers["free"].finish_reason in ("stop", "length") and free
    # the exposures say which answers were constrained and finished inside their grammar
    status, text = http("GET", server.url + "/experiments/triage/exposures")
    assert status == 200, text
    body = json.loads(text)
    xs = {x["variant"]: x for x in body["exposures"]}
    assert (xs["schema"]["constrained"], xs["schema"]["grammar_complete"]) == (True, True)
    assert (xs["tool"]["constrained"], xs["tool"]["grammar_complete"]) == (True, True)
    assert (xs["free"]["constrained"], xs["free"]["grammar_complete"]) == (False, None)
    # the fan-out runs all three side by side, each in its own format
    status, text = http("POST", server.url + "/experiments/triage/fanout", {"input": msg[0]["content"]})
    assert status == 200, text
    by = {r["variant"]: r for r in json.loads(text)["results"]}
    jsonschema.validate(json.loads(by["schema"]["output"]), ticket)
    assert by["schema"]["grammar_complete"] is True
    assert by["tool"]["tool_calls"][0]["function"]["name"] == "get_weather"
    assert "grammar_complete" not in by["free"] and "tool_calls" not in by["free"]
    # a variant whose schema does not compile is refused when the experiment is created
    status, text = http("POST", server.url + "/experiments", {
        "name": "broken", "variants": [{"id": "a"}, {"id": "b", "response_format": {"type": "regex", "regex": "("}}],
    })
    assert status == 400 and json.loads(text)["error"]["param"].startswith("variants.b."), text


def test_a_cached_prefix_is_shared_across_schemas(server):
    c = client(server)
    system = "You are a data assistant. " + " ".join(f"Rule {i}: keep field {i} short." for i in range(20))
    msgs = [{"role": "system", "content": system}, {"role": "user", "content": "One record, please."}]
    used = []
    for name in ["enum", "array_bounds", "pattern"]:
        r = c.chat.completions.create(
            model=MODEL_ID, messages=msgs, temperature=0, max_tokens=80,
            response_format={"type": "json_schema", "json_schema": {"name": name, "schema": SCHEMAS[name]}},
        )
        used.append(r.usage.prompt_tokens_details.cached_tokens)
    # the same prompt under another schema reuses the first answer's prompt KV
    assert used[1] > 0 and used[2] > 0, used
