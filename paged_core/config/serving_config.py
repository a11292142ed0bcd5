"""``ServingConfig``: what only servers read (``AsyncEngine``, the OpenAI layer, adapters)."""
from __future__ import annotations

from dataclasses import dataclass

from ..lora.modules import parse_lora_modules
from .setting_values import check_choice, check_positive

_TOOL_CALL_PARSERS = (None, "hermes", "llama3_json")  # None: chosen from the chat template


@dataclass
class ServingConfig:
    """Serving limits (``AsyncEngine`` only; the offline ``LLM`` never refuses):
    ``max_waiting_requests`` requests may wait for their first token at once (``None``: no
    limit); one more is refused with ``EngineOverloadedError`` (HTTP 429).
    ``request_timeout`` is the default deadline of a request in seconds (``None``: none; a
    request's own ``timeout`` wins). On shutdown (SIGTERM) adapters drain: no new request,
    in-flight ones get up to ``drain_timeout`` seconds to finish (under the frameworks' 30 s
    grace periods), then are aborted with an error. ``tool_call_parser`` says how chat
    replies with ``tool_choice`` "auto" are parsed (``None``: from the chat template).
    ``lora_modules`` (vLLM's ``--lora-modules``, with ``enable_lora``) names the LoRA adapters
    served from the start: ``"name=path name2=path2"`` (``paged_core.lora.modules``); a
    request's ``model`` picks one by name. ``allow_runtime_lora_updating`` opens vLLM's
    ``/v1/load_lora_adapter`` and ``/v1/unload_lora_adapter`` routes."""

    tool_call_parser: str | None = None
    max_waiting_requests: int | None = None
    request_timeout: float | None = None
    drain_timeout: float = 20.0
    lora_modules: str | None = None
    allow_runtime_lora_updating: bool = False

    def __post_init__(self) -> None:
        check_choice("tool_call_parser", self.tool_call_parser, _TOOL_CALL_PARSERS)
        if self.max_waiting_requests is not None:
            check_positive("max_waiting_requests", self.max_waiting_requests)
        if self.request_timeout is not None and not self.request_timeout > 0:
            raise ValueError(f"request_timeout must be > 0 seconds, got {self.request_timeout}")
        if not self.drain_timeout >= 0:
            raise ValueError(f"drain_timeout must be >= 0 seconds, got {self.drain_timeout}")
        if self.lora_modules:
            parse_lora_modules(self.lora_modules)
