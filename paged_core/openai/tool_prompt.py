"""Chat messages with tools -> what the model's chat template can render.

A template that knows tools (it mentions ``tools`` / ``tool_calls``, as
Hermes, Qwen and Llama 3.1+ templates do) gets them as Hugging Face expects:
``tools=[...]`` and each earlier call's ``arguments`` as an object. A template
that does not (SmolLM2's plain ChatML) would drop them silently, so they are
written into the text in the Hermes format the ``hermes`` parser reads back:
the tool list in the system message, earlier calls as ``<tool_call>`` blocks in
the assistant's content. Tool results (``role: "tool"``) pass through as
messages either way.
"""
from __future__ import annotations

import json
from typing import Any

_HERMES_SYSTEM = (
    "You are a function calling AI model. You may call one or more functions to assist with "
    "the user query. Here are the available tools: <tools>{tools}</tools>\nFor each function "
    "call, return a json object with the function name and arguments within <tool_call></tool_call> "
    "XML tags:\n<tool_call>\n{{\"name\": <function-name>, \"arguments\": <args-json-object>}}\n"
    "</tool_call>")


def _call_text(call: dict[str, Any]) -> str:
    fn = call.get("function") or {}
    args = fn.get("arguments") or "{}"
    args = json.loads(args) if isinstance(args, str) else args
    return "<tool_call>\n" + json.dumps({"name": fn.get("name"), "arguments": args},
                                        ensure_ascii=False) + "\n</tool_call>"


def _with_object_arguments(call: dict[str, Any]) -> dict[str, Any]:
    fn = dict(call.get("function") or {})
    if isinstance(fn.get("arguments"), str):
        try:
            fn["arguments"] = json.loads(fn["arguments"])
        except json.JSONDecodeError:
            raise ValueError("messages: a tool call's function.arguments must be JSON "
                             "text") from None
    return {**call, "function": fn}


def template_inputs(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                    chat_template: str | None) -> tuple[list[dict[str, Any]], list | None]:
    """``(messages, tools)`` to render; ``tools`` is None when written into the messages."""
    template = chat_template or ""
    if "tool" in template:  # the template renders tools and calls itself
        out = [{**m, "tool_calls": [_with_object_arguments(c) for c in m["tool_calls"]]}
               if m.get("tool_calls") else m for m in messages]
        return out, tools
    out = []
    for m in messages:
        if m.get("tool_calls"):
            calls = "\n".join(_call_text(c) for c in m["tool_calls"])
            m = {k: v for k, v in m.items() if k != "tool_calls"}
            m["content"] = (m.get("content") + "\n" if m.get("content") else "") + calls
        out.append(m)
    if tools:
        system = _HERMES_SYSTEM.format(tools=json.dumps(
            [t.get("function", t) for t in tools], ensure_ascii=False))
        if out and out[0]["role"] == "system":
            out[0] = {**out[0], "content": out[0]["content"] + "\n\n" + system}
        else:
            out.insert(0, {"role": "system", "content": system})
    return out, None
