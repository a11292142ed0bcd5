"""Tool calling and structured outputs through the ``openai`` client against a real server."""
from __future__ import annotations

import json

import jsonschema

from .openai_checks import MODEL, Served

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 16},
        "unit": {"enum": ["celsius", "fahrenheit"]}}, "required": ["city", "unit"]}}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def _valid_call(call, name: str | None = None) -> dict:
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == (name or "get_weather")
    args = json.loads(call.function.arguments)
    jsonschema.validate(args, WEATHER["function"]["parameters"])
    return args


def forced_tool_calls(served: Served) -> None:
    """``required`` and a named function, streamed and not, then the tool-result round trip."""
    client = served.client()
    for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
        out = client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER],
                                             tool_choice=choice, max_tokens=40, temperature=0)
        assert out.choices[0].finish_reason == "tool_calls"
        call = out.choices[0].message.tool_calls[0]
        args = _valid_call(call)
        stream = client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER],
                                                tool_choice=choice, max_tokens=40,
                                                temperature=0, stream=True)
        name, text, finish = None, "", None
        for chunk in stream:
            delta = chunk.choices[0].delta
            finish = chunk.choices[0].finish_reason or finish
            for d in delta.tool_calls or []:
                name = d.function.name or name
                text += d.function.arguments or ""
        assert finish == "tool_calls" and name == "get_weather" and json.loads(text) == args
    messages = ASK + [
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": "18 degrees and sunny"}]
    reply = client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER],
                                           max_tokens=12, temperature=0)
    assert reply.choices[0].message.content or reply.choices[0].message.tool_calls


def json_schema_response(served: Served) -> None:
    schema = WEATHER["function"]["parameters"]
    out = served.client().chat.completions.create(
        model=MODEL, messages=ASK, max_tokens=40, temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "weather",
                                                                "schema": schema}})
    assert out.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(out.choices[0].message.content), schema)
