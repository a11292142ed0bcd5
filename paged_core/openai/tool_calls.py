"""Chat ``tools`` / ``tool_choice``: the grammar that forces a call, and calls in replies.

Modes (OpenAI semantics): ``"none"`` (tools are not shown to the model),
``"auto"`` (the model decides; its reply is parsed in its own format by a
``tool_parsers`` parser), ``"required"`` (the grammar forces a JSON array of
one or more ``{"name", "parameters"}`` objects over the declared functions, at
most one unless ``parallel_tool_calls``) and a named function (the grammar
forces that function's arguments object). Invariant: a forced call always
names a declared function and its arguments validate against that function's
``parameters`` schema (the grammar guarantees both); a reply with calls has
``content`` null (or the text before the calls, for ``auto``), ``tool_calls``
with ids ``call_<hex>``, and ``finish_reason`` ``"tool_calls"``.
"""
from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field, replace
from typing import Any

from paged_core.outputs import CompletionOutput
from paged_core.structured_outputs import StructuredOutputsParams

from .errors import OpenAIError
from .tool_parsers import ParsedToolCall, tool_parser_for

_EMPTY_PARAMETERS = {"type": "object", "properties": {}}


def _functions(tools: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Declared functions by name; 400 naming ``tools`` for a malformed declaration."""
    out: dict[str, dict[str, Any]] = {}
    for i, tool in enumerate(tools):
        fn = tool.get("function")
        if tool.get("type") != "function" or not isinstance(fn, dict) \
                or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise OpenAIError(400, f"tools[{i}] must be {{'type': 'function', 'function': "
                                   f"{{'name': ..., 'parameters': {{...}}}}}}", param="tools")
        params = fn.get("parameters") or _EMPTY_PARAMETERS
        if not isinstance(params, dict):
            raise OpenAIError(400, f"tools[{i}].function.parameters must be a JSON schema object",
                              param="tools")
        out[fn["name"]] = {**fn, "parameters": params}
    return out


def tool_choice_mode(tools: list[dict[str, Any]] | None, tool_choice: Any) -> tuple[str, str | None]:
    """``(mode, function_name)``: mode is none / auto / required / named; 400 naming
    ``tools`` / ``tool_choice`` for a malformed declaration or choice."""
    if tools:
        _functions(tools)
    if tool_choice is None:
        return ("auto" if tools else "none"), None
    if isinstance(tool_choice, str):
        if tool_choice not in ("none", "auto", "required"):
            raise OpenAIError(400, f"tool_choice must be 'none', 'auto', 'required' or "
                                   f"{{'type': 'function', 'function': {{'name': ...}}}}, got "
                                   f"{tool_choice!r}", param="tool_choice")
        if tool_choice != "none" and not tools:
            raise OpenAIError(400, f"tool_choice {tool_choice!r} needs tools", param="tool_choice")
        return tool_choice, None
    name = (tool_choice.get("function") or {}).get("name") if isinstance(tool_choice, dict) else None
    if not isinstance(name, str) or (tool_choice.get("type") or "function") != "function":
        raise OpenAIError(400, "tool_choice must name a function: {'type': 'function', "
                               "'function': {'name': ...}}", param="tool_choice")
    if name not in _functions(tools or []):
        raise OpenAIError(400, f"tool_choice names function {name!r}, which is not in tools",
                          param="tool_choice")
    return "named", name


def forced_call_schema(tools: list[dict[str, Any]], mode: str, name: str | None,
                       parallel_tool_calls: bool) -> dict[str, Any]:
    """The JSON schema a ``required`` / named reply must follow."""
    functions = _functions(tools)
    if mode == "named":
        return functions[name]["parameters"]
    call = [{"type": "object", "properties": {"name": {"const": fn_name},
                                              "parameters": fn["parameters"]},
             "required": ["name", "parameters"]} for fn_name, fn in functions.items()]
    schema: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"anyOf": call}}
    if not parallel_tool_calls:
        schema["maxItems"] = 1
    return schema


def forced_call_constraint(tools: list[dict[str, Any]], mode: str, name: str | None,
                           parallel_tool_calls: bool) -> StructuredOutputsParams:
    try:
        return StructuredOutputsParams(json=forced_call_schema(tools, mode, name,
                                                               parallel_tool_calls))
    except ValueError as exc:
        raise OpenAIError(400, f"tools: a function's parameters are not a usable JSON schema "
                               f"({exc})", param="tools") from None


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def _call_dict(call: ParsedToolCall) -> dict[str, Any]:
    return {"id": new_call_id(), "type": "function",
            "function": {"name": call.name, "arguments": call.arguments}}


@dataclass
class ToolCallMode:
    """How one chat request's replies become tool calls (``mode`` is not "none")."""

    mode: str
    function_name: str | None
    parser: Any  # a tool_parsers parser, for "auto"

    def parse(self, text: str) -> tuple[str | None, list[ParsedToolCall]]:
        if self.mode == "named":
            return None, [ParsedToolCall(self.function_name, text)]
        if self.mode == "required":
            return None, [ParsedToolCall(c["name"], json.dumps(c["parameters"], ensure_ascii=False))
                          for c in json.loads(text)]
        return self.parser.extract(text)

    def message(self, comp: CompletionOutput) -> tuple[dict[str, Any], str | None]:
        """The final ``message`` and ``finish_reason`` of one choice."""
        if comp.finish_reason != "stop":  # cut short: whatever was generated, as text
            return {"role": "assistant", "content": comp.text}, comp.finish_reason
        content, calls = self.parse(comp.text)
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if not calls:
            return message, comp.finish_reason
        message["tool_calls"] = [_call_dict(c) for c in calls]
        return message, "tool_calls"

    def stream(self) -> "ToolCallStream":
        return ToolCallStream(self)


@dataclass
class ToolCallStream:
    """Streamed deltas of one choice, in OpenAI's shape.

    Named: the call (id, name) opens with the first text and the argument text
    streams as it is generated. Required / auto: text that cannot be part of a
    call streams as ``content``; the rest is held and sent as whole calls once
    the choice finishes (``auto`` text that turns out not to be a call is sent
    then as content).
    """

    mode: ToolCallMode
    text: str = ""
    sent: int = 0  # characters of ``text`` already sent
    opened: bool = False
    calls: list[dict[str, Any]] = field(default_factory=list)

    def delta(self, comp: CompletionOutput) -> tuple[dict[str, Any], str | None]:
        self.text += comp.delta_text
        finished = comp.finish_reason is not None
        if self.mode.mode == "named":
            reason = "tool_calls" if comp.finish_reason == "stop" else comp.finish_reason
            return self._named_delta(), reason
        if not finished:
            hold_from = (0 if self.mode.mode == "required"
                         else self.mode.parser.may_start_call(self.text))
            return self._content_up_to(max(hold_from, self.sent)), None
        message, finish_reason = self.mode.message(replace(comp, text=self.text))
        if "tool_calls" not in message:
            return self._content_up_to(len(self.text)), finish_reason
        calls = [{"index": i, **call} for i, call in enumerate(message["tool_calls"])]
        return {"tool_calls": calls}, finish_reason

    def _content_up_to(self, end: int) -> dict[str, Any]:
        piece, self.sent = self.text[self.sent:end], max(end, self.sent)
        return {"content": piece} if piece else {}

    def _named_delta(self) -> dict[str, Any]:
        piece, self.sent = self.text[self.sent:], len(self.text)
        if not self.opened:
            if not piece:
                return {}
            self.opened = True
            return {"tool_calls": [{"index": 0, "id": new_call_id(), "type": "function",
                                    "function": {"name": self.mode.function_name,
                                                 "arguments": piece}}]}
        return {"tool_calls": [{"index": 0, "function": {"arguments": piece}}]} if piece else {}


def tool_call_mode(mode: str, name: str | None, chat_template: str | None,
                   parser_setting: str | None) -> ToolCallMode | None:
    if mode == "none":
        return None
    parser = tool_parser_for(chat_template, parser_setting) if mode == "auto" else None
    return ToolCallMode(mode, name, parser)
