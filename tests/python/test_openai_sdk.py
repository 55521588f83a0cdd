"""The official openai SDK against abserve: only base_url changes."""
import asyncio

import openai
import pytest

from conftest import MODEL_ID


def client(server, key="unused"):
    return openai.OpenAI(base_url=server.url, api_key=key, max_retries=0)


def aclient(server, key="unused"):
    return openai.AsyncOpenAI(base_url=server.url, api_key=key, max_retries=0)


def test_sync_chat_and_models(server):
    c = client(server)
    assert [m.id for m in c.models.list()] == [MODEL_ID]
    r = c.chat.completions.create(
        model=MODEL_ID, messages=[{"role": "user", "content": "Say hello."}], max_tokens=12, temperature=0
    )
    assert r.object == "chat.completion"
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_completions_and_stop(server):
    r = client(server).completions.create(
        model=MODEL_ID, prompt="The capital of France is", max_tokens=20, temperature=0, stop=["."]
    )
    assert r.choices[0].text == " Paris"
    assert r.choices[0].finish_reason == "stop"


def test_eight_concurrent_async_chats_like_the_harness(server):
    """The problem statement's harness: asyncio.gather over prompt variants."""
    variants = [f"You are assistant variant {i}. Answer briefly." for i in range(8)]

    async def run():
        c = aclient(server)
        tasks = [
            c.chat.completions.create(
                model=MODEL_ID,
                messages=[{"role": "system", "content": v}, {"role": "user", "content": "What is a prompt?"}],
                max_tokens=24,
            )
            for v in variants
        ]
        return await asyncio.gather(*tasks)

    results = asyncio.run(run())
    assert len(results) == 8
    assert all(r.choices[0].message.content for r in results)


def test_streaming_with_usage(server):
    stream = client(server).chat.completions.create(
        model=MODEL_ID,
        messages=[{"role": "user", "content": "Count to three."}],
        max_tokens=10,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["length"]
    assert chunks[-1].usage.completion_tokens == 10
    assert chunks[-1].choices == []


def test_async_streaming(server):
    async def run():
        c = aclient(server)
        s = await c.completions.create(model=MODEL_ID, prompt="Once upon a time", max_tokens=8, stream=True, temperature=0)
        return "".join([ch.choices[0].text async for ch in s if ch.choices])

    assert asyncio.run(run())


def test_seed_gives_the_same_text_twice(server):
    c = client(server)
    kw = dict(model=MODEL_ID, messages=[{"role": "user", "content": "Invent a word."}], max_tokens=16, temperature=1.2, seed=1234)
    a = c.chat.completions.create(**kw).choices[0].message.content
    b = c.chat.completions.create(**kw).choices[0].message.content
    assert a == b


def test_errors_map_to_sdk_exceptions(server, keyed_server):
    c = client(server)
    with pytest.raises(openai.BadRequestError):
        c.chat.completions.create(model=MODEL_ID, messages=[], max_tokens=4)
    with pytest.raises(openai.BadRequestError):
        c.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": "x"}], temperature=9)
    with pytest.raises(openai.NotFoundError):
        c.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "x"}])
    with pytest.raises(openai.AuthenticationError):
        client(keyed_server, "wrong-key").models.list()
    assert client(keyed_server, "test-key").models.list().data[0].id == MODEL_ID


def test_overload_raises_rate_limit_error(tiny_server):
    async def run():
        c = aclient(tiny_server)
        tasks = [
            c.completions.create(model=MODEL_ID, prompt=f"Story {i}:", max_tokens=32, extra_body={"ignore_eos": True})
            for i in range(12)
        ]
        return await asyncio.gather(*tasks, return_exceptions=True)

    results = asyncio.run(run())
    limited = [r for r in results if isinstance(r, openai.RateLimitError)]
    ok = [r for r in results if not isinstance(r, Exception)]
    others = [r for r in results if isinstance(r, Exception) and not isinstance(r, openai.RateLimitError)]
    assert not others, others
    assert limited and ok
    assert all(int(e.response.headers["retry-after"]) >= 1 for e in limited)


def test_a_tool_message_must_answer_an_earlier_call(server):
    """As OpenAI's API: a `tool` message needs a `tool_call_id`, must follow an assistant
    message with `tool_calls` (other tool messages between), and must answer one of them."""
    c = client(server)
    call = {"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": "{}"}}
    asked = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
    ]
    bad = [
        # no tool_call_id
        ("messages[2].tool_call_id", asked + [{"role": "tool", "content": "21 C"}]),
        # answers a call nobody made
        ("messages[2].tool_call_id", asked + [{"role": "tool", "tool_call_id": "call_9", "content": "21 C"}]),
        # follows no assistant message with tool_calls
        ("messages[1].role", [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "tool", "tool_call_id": "call_1", "content": "21 C"},
        ]),
    ]
    for param, messages in bad:
        with pytest.raises(openai.BadRequestError) as e:
            c.chat.completions.create(model=MODEL_ID, messages=messages, max_tokens=4)
        assert e.value.status_code == 400
        assert e.value.body["param"] == param, e.value.body
    ok = c.chat.completions.create(
        model=MODEL_ID,
        messages=asked + [{"role": "tool", "tool_call_id": "call_1", "content": "21 C"}],
        max_tokens=4,
    )
    assert ok.choices[0].message.role == "assistant"


def test_streamed_usage_says_what_was_cached_as_a_whole_answer_does(server):
    c = client(server)
    kw = dict(
        model=MODEL_ID,
        messages=[
            {"role": "system", "content": "You are a terse assistant who answers in one short sentence. " * 6},
            {"role": "user", "content": "Name a colour."},
        ],
        max_tokens=6,
        temperature=0,
    )
    whole = c.chat.completions.create(**kw).usage
    chunks = list(c.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True}))
    streamed = chunks[-1].usage
    again = c.chat.completions.create(**kw).usage
    assert streamed.prompt_tokens == whole.prompt_tokens
    # the second and third asks reuse the first's prompt: both say so, alike
    assert streamed.prompt_tokens_details is not None, streamed
    assert streamed.prompt_tokens_details.cached_tokens > 0
    assert streamed.prompt_tokens_details.cached_tokens == again.prompt_tokens_details.cached_tokens
