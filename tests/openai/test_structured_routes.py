"""Structured outputs and tool calls through the in-process OpenAI app (real fp32 engine)."""
from __future__ import annotations

import json
import re
import threading

import jsonschema
import pytest

from paged_core.openai.tool_parsers import TOOL_PARSERS, tool_parser_for
from paged_core.openai.tool_prompt import template_inputs

MODEL = "SmolLM2-135M-Instruct"
PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "age": {"type": "integer", "minimum": 0,
                                                   "maximum": 120}},
          "required": ["name", "age"]}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 16},
        "unit": {"enum": ["celsius", "fahrenheit"]}}, "required": ["city", "unit"]}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "parameters": {"type": "object", "properties": {
        "timezone": {"type": "string", "maxLength": 12}}, "required": ["timezone"]}}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def _chat(**extra):
    return {"model": MODEL, "messages": ASK, "max_tokens": 60, "temperature": 0, **extra}


async def test_response_format_json_schema_and_json_object(client):
    r = await client.post("/v1/chat/completions", json=_chat(
        messages=[{"role": "user", "content": "Describe a person."}],
        response_format={"type": "json_schema", "json_schema": {
            "name": "person", "schema": PERSON, "strict": True}}))
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "stop"
    jsonschema.validate(json.loads(choice["message"]["content"]), PERSON)
    r = await client.post("/v1/chat/completions", json=_chat(
        messages=[{"role": "user", "content": "Reply with a JSON object {\"ok\": true}."}],
        response_format={"type": "json_object"}, max_tokens=30))
    choice = r.json()["choices"][0]
    assert choice["message"]["content"].startswith("{")
    if choice["finish_reason"] == "stop":  # a small model may ramble past max_tokens
        assert isinstance(json.loads(choice["message"]["content"]), dict)


async def test_vllm_guided_extras_on_completions(client):
    body = {"model": MODEL, "prompt": "My phone number is", "max_tokens": 20, "temperature": 0}
    r = await client.post("/v1/completions", json={**body, "guided_regex": r"\d{3}-\d{4}"})
    assert re.fullmatch(r"\d{3}-\d{4}", r.json()["choices"][0]["text"]), r.text
    r = await client.post("/v1/completions", json={**body, "guided_choice": ["yes", "no"]})
    assert r.json()["choices"][0]["text"] in ("yes", "no")
    r = await client.post("/v1/completions", json={**body, "structured_outputs": {
        "grammar": 'root ::= "A" | "B"'}})
    assert r.json()["choices"][0]["text"] in ("A", "B")
    r = await client.post("/v1/completions", json={**body, "guided_json": PERSON})
    jsonschema.validate(json.loads(r.json()["choices"][0]["text"]), PERSON)


@pytest.mark.parametrize("extra, param", [
    ({"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "nonsense"}}}}, "response_format"),
    ({"response_format": {"type": "json_schema"}}, "response_format"),
    ({"guided_regex": "(unclosed"}, "guided_regex"),
    ({"guided_choice": []}, "guided_choice"),
    ({"guided_grammar": "root ::= nowhere"}, "guided_grammar"),
    ({"structured_outputs": {"regex": "a", "json": {}}}, "structured_outputs"),
    ({"guided_regex": "a", "guided_choice": ["a"]}, "guided_regex"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [{"type": "function"}], "tool_choice": "required"}, "tools"),
    ({"tools": [WEATHER], "tool_choice": "required", "guided_regex": "a"}, "tool_choice"),
])
async def test_bad_constraints_are_400_naming_the_field(client, extra, param):
    r = await client.post("/v1/chat/completions", json=_chat(**extra))
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


async def test_grammars_compile_off_the_step_loop_thread(client, engine, monkeypatch):
    compiler = engine.engine.input_processor.grammar_compiler
    threads, compile = [], compiler.compile
    monkeypatch.setattr(compiler, "compile",
                        lambda p: threads.append(threading.current_thread().name) or compile(p))
    r = await client.post("/v1/completions", json={
        "model": MODEL, "prompt": "Pick:", "max_tokens": 4, "guided_choice": ["x", "y"]})
    assert r.status_code == 200 and threads and "paged-core-engine" not in threads


def _check_call(call: dict, tools: list[dict]) -> None:
    assert call["type"] == "function" and call["id"].startswith("call_")
    declared = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    assert call["function"]["name"] in declared
    jsonschema.validate(json.loads(call["function"]["arguments"]),
                        declared[call["function"]["name"]])


@pytest.mark.parametrize("tool_choice", ["required", {"type": "function",
                                                      "function": {"name": "get_weather"}}])
async def test_forced_tool_calls_in_replies_and_streams(client, tool_choice):
    tools = [WEATHER, TIME]
    body = _chat(tools=tools, tool_choice=tool_choice, parallel_tool_calls=False)
    r = await client.post("/v1/chat/completions", json=body)
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls", r.text
    assert choice["message"]["content"] is None and len(choice["message"]["tool_calls"]) == 1
    _check_call(choice["message"]["tool_calls"][0], tools)
    if isinstance(tool_choice, dict):
        assert choice["message"]["tool_calls"][0]["function"]["name"] == "get_weather"
    calls: dict[int, dict] = {}
    finish = None
    async with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as s:
        async for line in s.aiter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])["choices"][0]
            finish = chunk["finish_reason"] or finish
            for delta in chunk["delta"].get("tool_calls", []):
                call = calls.setdefault(delta["index"], {"function": {"arguments": ""}})
                call.update({k: v for k, v in delta.items() if k in ("id", "type")})
                call["function"]["name"] = delta["function"].get("name") or \
                    call["function"].get("name")
                call["function"]["arguments"] += delta["function"].get("arguments", "")
    assert finish == "tool_calls" and len(calls) == 1
    _check_call(calls[0], tools)
    assert calls[0]["function"] == {k: choice["message"]["tool_calls"][0]["function"][k]
                                    for k in ("name", "arguments")}


async def test_tool_result_round_trip_renders(client, engine):
    messages = ASK + [
        {"role": "assistant", "content": None, "tool_calls": [{
            "id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18 degrees and sunny"}]
    r = await client.post("/v1/chat/completions", json=_chat(
        messages=messages, tools=[WEATHER], max_tokens=8))
    assert r.status_code == 200, r.text
    rendered, tools = template_inputs(messages, [WEATHER], engine.tokenizer.chat_template)
    text = engine.tokenizer.decode(engine.apply_chat_template(rendered, tools))
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}' in text
    assert "<|im_start|>tool\n18 degrees and sunny<|im_end|>" in text
    assert "<tools>" in text and "get_weather" in text.split("<tools>")[1]


def test_auto_parsers_read_the_models_own_format():
    hermes, llama = TOOL_PARSERS["hermes"], TOOL_PARSERS["llama3_json"]
    content, calls = hermes.extract('Let me check.<tool_call>\n{"name": "f", "arguments": '
                                    '{"a": 1}}\n</tool_call>\n<tool_call>{"name": "g", '
                                    '"arguments": {}}</tool_call>')
    assert content == "Let me check." and [(c.name, c.arguments) for c in calls] == [
        ("f", '{"a": 1}'), ("g", "{}")]
    assert hermes.extract("no call here") == ("no call here", [])
    assert hermes.extract("<tool_call>{broken</tool_call>")[1] == []
    assert hermes.may_start_call("Sure <tool_") == len("Sure ")
    content, calls = llama.extract('<|python_tag|>{"name": "f", "parameters": {"x": "y"}}; '
                                   '{"name": "g", "parameters": {}}')
    assert content is None and [c.name for c in calls] == ["f", "g"]
    assert llama.extract("Paris is sunny.") == ("Paris is sunny.", [])
    assert tool_parser_for("{{ '<|python_tag|>' }}", None).name == "llama3_json"
    assert tool_parser_for("<|im_start|>", None).name == "hermes"
    assert tool_parser_for("<|im_start|>", "llama3_json").name == "llama3_json"


def test_auto_mode_streams_content_and_holds_calls_until_the_end():
    from paged_core.outputs import CompletionOutput
    from paged_core.openai.tool_calls import tool_call_mode

    stream = tool_call_mode("auto", None, "<|im_start|>", None).stream()
    pieces = ["Let me ", "check. <tool", '_call>{"name": "f", ', '"arguments": {"a": 1}}',
              "</tool_call>"]
    deltas = []
    for i, piece in enumerate(pieces):
        last = i == len(pieces) - 1
        deltas.append(stream.delta(CompletionOutput(0, "", [], delta_text=piece,
                                                    finish_reason="stop" if last else None)))
    content = "".join(d.get("content", "") for d, _ in deltas)
    assert content == "Let me check. " and deltas[1][0] == {"content": "check. "}
    final, reason = deltas[-1]
    assert reason == "tool_calls" and final["tool_calls"][0]["index"] == 0
    assert final["tool_calls"][0]["function"] == {"name": "f", "arguments": '{"a": 1}'}
    plain = tool_call_mode("auto", None, "<|im_start|>", None).stream()
    assert plain.delta(CompletionOutput(0, "", [], delta_text="Hello <",
                                        finish_reason=None)) == ({"content": "Hello "}, None)
    assert plain.delta(CompletionOutput(0, "", [], delta_text="3", finish_reason="stop")) == (
        {"content": "<3"}, "stop")
