"""Request models of the OpenAI ``/v1/completions`` and ``/v1/chat/completions`` APIs.

Only the *shape* is checked here (types, required fields); value ranges are
checked once, by ``SamplingParams``, so the allowed ranges live in one place.
Types are strict, as JSON writes them: ``"8"`` or ``true`` is not an integer,
``"yes"`` is not a boolean (an integer is accepted where a number is expected).
Unknown fields are ignored with a warning naming them, as vLLM does; the vLLM
extras (``top_k``, ``min_p``, ``repetition_penalty``, ``min_tokens``,
``ignore_eos``, ``stop_token_ids``, ...) are accepted as top-level fields, and so
are its structured-output extras (``structured_outputs``, ``guided_json``,
``guided_regex``, ``guided_choice``, ``guided_grammar``).
"""
from __future__ import annotations

import logging
from typing import Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, model_validator

logger = logging.getLogger(__name__)


class OpenAIBaseModel(BaseModel):
    """Strict types; with ``extra="ignore"`` the ignored fields are logged (vLLM's message)."""

    model_config = ConfigDict(strict=True, extra="ignore")

    @model_validator(mode="wrap")
    @classmethod
    def _log_ignored_fields(cls, data: Any, handler: Any) -> Any:
        result = handler(data)
        if isinstance(data, dict) and cls.model_config.get("extra") == "ignore":
            ignored = sorted(set(data) - set(cls.model_fields))
            if ignored:
                logger.warning("The following fields were present in the request but ignored: "
                               "%s", ignored)
        return result


class StreamOptions(OpenAIBaseModel):
    include_usage: bool = False


class SamplingFields(OpenAIBaseModel):
    """Fields shared by both endpoints that map onto ``SamplingParams``."""

    model: str | None = None
    n: int = 1
    temperature: float | None = None
    top_p: float | None = None
    stop: Union[str, list[str], None] = None
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    # vLLM extras
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    min_tokens: int | None = None
    ignore_eos: bool | None = None
    stop_token_ids: list[int] | None = None
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] | None = None
    truncate_prompt_tokens: int | None = None  # vLLM's: keep the prompt's last k tokens
    skip_special_tokens: bool | None = None
    include_stop_str_in_output: bool | None = None
    structured_outputs: dict[str, Any] | None = None
    guided_json: Union[str, dict[str, Any], None] = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    use_beam_search: bool = False  # n = beam width (openai/beam_params.py)
    length_penalty: float | None = None
    priority: int = 0  # vLLM's: lower runs first under scheduling_policy "priority"
    cache_salt: str | None = None  # vLLM's: prefix-cache hits only between equal salts
    timeout: float | None = None  # seconds; the server's request_timeout by default


class CompletionRequest(SamplingFields):
    """``POST /v1/completions``: ``prompt`` is text, token ids, or a list of either."""

    prompt: Union[str, list[str], list[int], list[list[int]]]
    max_tokens: int | None = 16
    logprobs: int | None = None
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None


class ContentPart(OpenAIBaseModel):
    model_config = ConfigDict(extra="allow")

    type: str
    text: str | None = None


class ChatMessage(OpenAIBaseModel):
    model_config = ConfigDict(extra="allow")

    role: str
    content: Union[str, list[ContentPart], None] = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None  # an assistant's earlier calls
    tool_call_id: str | None = None  # a tool result answers this call

    def as_template_dict(self) -> dict[str, Any]:
        """The message as the chat template expects it (text parts joined)."""
        content = self.content
        if isinstance(content, list):
            texts = []
            for part in content:
                if part.type != "text":
                    raise ValueError(f"messages: content part type {part.type!r} is not supported "
                                     f"(only 'text')")
                texts.append(part.text or "")
            content = "".join(texts)
        out: dict[str, Any] = {"role": self.role, "content": content or ""}
        if self.name:
            out["name"] = self.name
        if self.tool_calls:
            out["tool_calls"] = self.tool_calls
        if self.tool_call_id:
            out["tool_call_id"] = self.tool_call_id
        return out


class JsonSchemaFormat(OpenAIBaseModel):
    """``response_format.json_schema``: ``schema`` is the JSON schema the reply must follow."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    name: str | None = None
    description: str | None = None
    json_schema: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(OpenAIBaseModel):
    model_config = ConfigDict(extra="allow")

    type: Literal["text", "json_object", "json_schema"] = "text"
    json_schema: JsonSchemaFormat | None = None


class ChatCompletionRequest(SamplingFields):
    """``POST /v1/chat/completions``; ``logprobs`` is a flag, ``top_logprobs`` the count."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    response_format: ResponseFormat | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Union[str, dict[str, Any], None] = None
    parallel_tool_calls: bool = True
