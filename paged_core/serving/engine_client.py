"""``EngineClient``: what the OpenAI layer and the adapters need from an engine.

``AsyncEngine`` implements it; tests implement it with scripted fakes, so the
routes can be checked in milliseconds without a model. Names follow vLLM's
``EngineClient`` where it has them (``generate``, ``abort``, ``is_running``,
``errored``).

Contract of ``generate``: an async iterator of ``RequestOutput`` deltas whose
last one has ``finished`` set; it raises ``ValueError`` (bad input, before any
output), ``EngineOverloadedError`` (refused at admission), ``RequestTimeoutError``,
``RequestFailedError`` or ``EngineDeadError``; closing it early aborts the request.
"""
from __future__ import annotations

from typing import Any, AsyncIterator, Protocol, runtime_checkable

from ..core.engine_stats import EngineStats
from ..outputs import RequestOutput
from ..frontend.prompts import PromptInput
from ..beam_search.params import BeamSearchParams
from ..lora.request import LoRARequest
from ..sampling_params import SamplingParams


@runtime_checkable
class EngineClient(Protocol):
    @property
    def model_name(self) -> str:
        """The name clients use for the model (OpenAI ``model``)."""

    @property
    def max_model_len(self) -> int: ...

    @property
    def tokenizer(self) -> Any: ...

    @property
    def is_running(self) -> bool:
        """True while requests are accepted (readiness)."""

    @property
    def errored(self) -> bool:
        """True once the engine died of an error (not after a clean shutdown or drain)."""

    def stats(self) -> EngineStats:
        """KV-cache, queue and counter gauges (``core.engine_stats``; see ``LLMEngine.stats``)."""

    @property
    def tool_call_parser(self) -> str | None:
        """How replies to chats with ``tool_choice`` "auto" are parsed (``None``: from the template)."""

    def apply_chat_template(self, messages: list[dict], tools: list | None = None) -> list[int]:
        """Prompt token ids of a chat, with the tools' declarations when given (may raise
        ``ValueError`` naming what is wrong)."""

    def generate(self, prompt: PromptInput,
                 sampling_params: SamplingParams | BeamSearchParams | None = None,
                 request_id: str | None = None, *, priority: int = 0,
                 timeout: float | None = None, tenant: str | None = None,
                 lora_request: LoRARequest | None = None
                 ) -> AsyncIterator[RequestOutput]: ...

    @property
    def lora_requests(self) -> list[LoRARequest]:
        """The LoRA adapters served by name (the OpenAI ``model`` picks one)."""

    @property
    def allow_runtime_lora_updating(self) -> bool:
        """Whether adapters may be loaded and unloaded while serving."""

    async def load_lora_adapter(self, lora_name: str, lora_path: str) -> LoRARequest:
        """Serve a PEFT adapter by name (``ParamValidationError`` if refused)."""

    async def unload_lora_adapter(self, lora_name: str) -> bool:
        """Stop serving an adapter; False if unknown or still in use."""

    async def abort(self, request_id: str) -> None: ...
