"""Tool-call parsers for ``tool_choice="auto"``: the model's own format -> (content, calls).

``hermes``: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks
(Hermes, Qwen2/2.5/3, SmolLM-style ChatML templates); text outside the blocks
is the content. ``llama3_json``: the whole reply is one or more JSON objects
``{"name": ..., "parameters"|"arguments": {...}}`` separated by ``;``,
optionally after ``<|python_tag|>`` (Llama 3.x). A reply that does not parse as
calls is plain content: a parser never invents a call and never raises.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass


@dataclass
class ParsedToolCall:
    name: str
    arguments: str  # JSON text of an object


def _call(obj: object, args_keys: tuple[str, ...]) -> ParsedToolCall | None:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = next((obj[k] for k in args_keys if k in obj), {})
    if isinstance(args, str):  # some models write the arguments as a JSON string
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return None
    if not isinstance(args, dict):
        return None
    return ParsedToolCall(obj["name"], json.dumps(args, ensure_ascii=False))


class HermesToolParser:
    name = "hermes"
    start_marker = "<tool_call>"
    _BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)

    def extract(self, text: str) -> tuple[str | None, list[ParsedToolCall]]:
        if self.start_marker not in text:
            return text, []
        calls = []
        for match in self._BLOCK.finditer(text):
            try:
                call = _call(json.loads(match.group(1)), ("arguments", "parameters"))
            except json.JSONDecodeError:
                call = None
            if call is None:
                return text, []
            calls.append(call)
        content = text[:text.index(self.start_marker)].strip()
        return content or None, calls

    def may_start_call(self, text: str) -> int:
        """Index from which ``text`` may be (the start of) a call; ``len(text)`` if none."""
        pos = text.find(self.start_marker)
        if pos != -1:
            return pos
        for k in range(len(self.start_marker) - 1, 0, -1):  # a marker cut at the end
            if text.endswith(self.start_marker[:k]):
                return len(text) - k
        return len(text)


class Llama3JsonToolParser:
    name = "llama3_json"
    start_marker = "<|python_tag|>"

    def extract(self, text: str) -> tuple[str | None, list[ParsedToolCall]]:
        body = text.strip()
        if body.startswith(self.start_marker):
            body = body[len(self.start_marker):].lstrip()
        if not body.startswith("{"):
            return text, []
        decoder, calls, pos = json.JSONDecoder(), [], 0
        while pos < len(body):
            try:
                obj, end = decoder.raw_decode(body, pos)
            except json.JSONDecodeError:
                return text, []
            call = _call(obj, ("parameters", "arguments"))
            if call is None:
                return text, []
            calls.append(call)
            pos = end
            while pos < len(body) and body[pos] in " \t\r\n;":
                pos += 1
        return None, calls

    def may_start_call(self, text: str) -> int:
        stripped = text.lstrip()
        if not stripped or stripped[0] == "{" or self.start_marker.startswith(stripped[:14]):
            return 0  # a reply that opens like a call is held until it is complete
        return len(text)


TOOL_PARSERS = {p.name: p for p in (HermesToolParser(), Llama3JsonToolParser())}


def tool_parser_for(chat_template: str | None, setting: str | None):
    """The ``tool_call_parser`` setting if given, else the one the chat template implies
    (``<|python_tag|>`` or ``ipython`` -> ``llama3_json``, else ``hermes``)."""
    if setting:
        return TOOL_PARSERS[setting]
    template = chat_template or ""
    if "<|python_tag|>" in template or "ipython" in template:
        return TOOL_PARSERS["llama3_json"]
    return TOOL_PARSERS["hermes"]
