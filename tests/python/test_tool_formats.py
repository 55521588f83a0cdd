"""A native tool-call format on the real default model: a copy of it whose chat template is
Hermes-style (`templates/hermes-tools.jinja`: tools in `<tools>`, calls as `<tool_call>` blocks,
results as `<tool_response>`, as Hermes and Qwen 2.5/3 write them), written by the `gguf`
package's `gguf_new_metadata` into the ignored models/test/ (never committed). abserve detects
the format from the template, hands `tools` to the template, constrains a required call to the
format's blocks and reads the blocks back into `tool_calls`, streamed as they are written."""
import json
import subprocess
import sys

import jsonschema
import openai
import pytest

from conftest import MODEL, MODEL_ID, ROOT, Server
from test_structured import TIME, WEATHER

TEMPLATE = ROOT / "tests" / "python" / "templates" / "hermes-tools.jinja"


def hermes_model():
    out = ROOT / "models" / "test" / "SmolLM2-135M-Instruct.hermes-tools.gguf"
    if not out.exists() or out.stat().st_mtime < TEMPLATE.stat().st_mtime:
        out.parent.mkdir(parents=True, exist_ok=True)
        part = out.with_suffix(".part")
        subprocess.run(
            [sys.executable, "-m", "gguf.scripts.gguf_new_metadata", str(MODEL), str(part),
             "--chat-template-file", str(TEMPLATE), "--force"],
            check=True, capture_output=True,
        )
        part.rename(out)
    return out


@pytest.fixture(scope="module")
def hermes():
    s = Server(model=hermes_model())
    yield s
    s.stop()


def client(server):
    return openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=120)


ASK = dict(
    model=MODEL_ID, messages=[{"role": "user", "content": "What is the weather in Oslo?"}],
    tools=[WEATHER, TIME], temperature=0, max_tokens=160,
)


def test_the_template_renders_the_tools(hermes):
    c = client(hermes)
    plain = c.chat.completions.create(**{**ASK, "tools": None, "max_tokens": 1})
    with_tools = c.chat.completions.create(**{**ASK, "tool_choice": "required", "max_tokens": 1})
    # the tools' JSON signatures are in the prompt the template wrote
    assert with_tools.usage.prompt_tokens > plain.usage.prompt_tokens + 60


def test_a_required_call_is_written_as_hermes_blocks_and_read_back(hermes):
    c = client(hermes)
    r = c.chat.completions.create(**ASK, tool_choice="required", logprobs=True)
    choice = r.choices[0]
    raw = "".join(t.token for t in choice.logprobs.content)
    assert raw.startswith("<tool_call>\n{\"name\": \""), raw
    assert raw.rstrip().endswith("</tool_call>"), raw
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    calls = choice.message.tool_calls
    assert len(calls) == raw.count("<tool_call>")
    for call in calls:
        tool = {"get_weather": WEATHER, "get_time": TIME}[call.function.name]
        jsonschema.validate(json.loads(call.function.arguments), tool["function"]["parameters"])
        # the arguments are the model's own text
        assert call.function.arguments in raw
    # streamed, the deltas join into the same calls, the arguments in several pieces
    joined, pieces = {}, 0
    for chunk in c.chat.completions.create(stream=True, **ASK, tool_choice="required"):
        for d in chunk.choices[0].delta.tool_calls or []:
            j = joined.setdefault(d.index, ["", ""])
            j[0] += d.function.name or ""
            j[1] += d.function.arguments or ""
            pieces += bool(d.function.arguments)
    assert [tuple(j) for j in joined.values()] == [(t.function.name, t.function.arguments) for t in calls]
    assert pieces > len(joined)
    # one call only when parallel calls are off
    one = c.chat.completions.create(**ASK, tool_choice={"type": "function", "function": {"name": "get_time"}},
                                    parallel_tool_calls=False, logprobs=True)
    raw = "".join(t.token for t in one.choices[0].logprobs.content)
    assert raw.count("<tool_call>") == 1, raw
    assert [t.function.name for t in one.choices[0].message.tool_calls] == ["get_time"]


def test_a_call_and_its_result_in_the_history_go_through_the_template(hermes):
    c = client(hermes)
    first = c.chat.completions.create(**ASK, tool_choice="required")
    call = first.choices[0].message.tool_calls[0]
    history = ASK["messages"] + [
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": "{\"temperature\": 21}"},
    ]
    base = c.chat.completions.create(**{**ASK, "messages": ASK["messages"], "tool_choice": "none", "max_tokens": 1})
    r = c.chat.completions.create(**{**ASK, "messages": history, "tool_choice": "none"})
    assert r.choices[0].finish_reason in ("stop", "length")
    assert r.choices[0].message.tool_calls is None
    # the call and the result are in the prompt
    assert r.usage.prompt_tokens > base.usage.prompt_tokens + 15
