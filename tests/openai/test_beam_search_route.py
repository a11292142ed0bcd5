"""vLLM's ``use_beam_search`` extra on the OpenAI routes: ``n`` beams, best first, as the
engine's own beam search returns them; field errors are 400s naming the request field."""
from __future__ import annotations

import pytest

from paged_core import BeamSearchParams
from paged_core.openai.errors import OpenAIError
from paged_core.openai.params import chat_params, completion_params
from paged_core.openai.protocol import ChatCompletionRequest, CompletionRequest

from .conftest import MODEL
from .test_routes import sse_events

PROMPT = "The capital of France is"
BEAMS = {"model": MODEL, "prompt": PROMPT, "use_beam_search": True, "n": 3, "max_tokens": 4,
         "ignore_eos": True}


def test_request_maps_to_beam_search_params():
    p = completion_params(CompletionRequest(prompt="x", use_beam_search=True, n=4, max_tokens=9,
                                            length_penalty=0.5, ignore_eos=True))
    assert p == BeamSearchParams(beam_width=4, max_tokens=9, length_penalty=0.5, ignore_eos=True)
    chat = chat_params(ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}],
                                             use_beam_search=True, n=2, max_completion_tokens=3))
    assert (chat.beam_width, chat.max_tokens) == (2, 3)


@pytest.mark.parametrize("fields, param", [
    ({"n": 0}, "n"), ({"length_penalty": float("inf")}, "length_penalty"),
    ({"max_tokens": 0}, "max_tokens"), ({"temperature": -1.0}, "temperature"),
])
def test_bad_values_name_the_request_field(fields, param):
    with pytest.raises(OpenAIError) as info:
        completion_params(CompletionRequest(prompt="x", use_beam_search=True,
                                            **{"max_tokens": 4, **fields}))
    assert (info.value.status, info.value.param) == (400, param)


def test_chat_beam_search_needs_max_tokens():
    with pytest.raises(OpenAIError) as info:
        chat_params(ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}],
                                          use_beam_search=True))
    assert (info.value.status, info.value.param) == (400, "max_tokens")


async def test_completion_returns_the_engine_beams_best_first(client, engine):
    params = BeamSearchParams(beam_width=3, max_tokens=4, ignore_eos=True)
    (expected,) = [out async for out in engine.beam_search(PROMPT, None, params)]
    body = (await client.post("/v1/completions", json=BEAMS)).json()
    assert [c["index"] for c in body["choices"]] == [0, 1, 2]
    assert [c["text"] for c in body["choices"]] == [c.text for c in expected.outputs]
    assert all(c["finish_reason"] == "length" for c in body["choices"])
    assert body["usage"]["completion_tokens"] == 12

    events = sse_events((await client.post("/v1/completions", json={**BEAMS, "stream": True})).text)
    streamed = {e["choices"][0]["index"]: e["choices"][0]["text"] for e in events}
    assert streamed == {c["index"]: c["text"] for c in body["choices"]}


async def test_a_group_too_large_for_the_cache_is_a_400_naming_n(client):
    r = await client.post("/v1/completions", json={**BEAMS, "n": 100, "max_tokens": 100})
    assert r.status_code == 400 and r.json()["error"]["param"] == "n"


@pytest.mark.parametrize("extra, field", [
    ({"guided_regex": "[a-z]+"}, "guided_regex"),
    ({"structured_outputs": {"choice": ["a", "b"]}}, "structured_outputs")])
def test_beam_search_with_a_constraint_is_refused_naming_it(extra, field):
    req = CompletionRequest(model="m", prompt="hi", n=2, max_tokens=4, use_beam_search=True, **extra)
    with pytest.raises(OpenAIError) as info:
        completion_params(req)
    assert info.value.status == 400 and info.value.param == field
