"""``LLMEngine``: the synchronous engine, vLLM v1's split in one process::

    prompt + params ──InputProcessor──► EngineRequest ──► EngineCore.step()
                                                              │ EngineCoreOutput (token ids)
    RequestOutput ◄──OutputProcessor (text, stop strings) ◄───┘
                                      └── StopAtString ──► EngineCore

The front end (``frontend/``) owns the tokenizer, text and stop strings; the core
(``EngineCore``) schedules, executes and updates, and never sees text. Both run on the
caller's thread, one step at a time: a stop string found after a step ends its sample in
the core before the next step is scheduled, so no token is computed past it.

With ``async_scheduling`` (vLLM's name; on by default for one CUDA device, off on the CPU:
``config.scheduler_config``) the host's text work overlaps the GPU's: each ``step()``
launches the next core step, then runs the front end over the previous step's outputs while
the GPU computes, then finishes the launched step. With ``schedule_ahead`` as well (on by
default where ``async_scheduling`` is, for one CUDA device without speculative decoding), it
finishes the step launched by the call before instead, so a step is scheduled and launched
while the one before it still runs (``engine_core``). Outputs
therefore reach the caller one step later, and a stop string (or a front-end failure) ends
its sample one step late: the token the core computed past it is dropped, never reported.
Invariant in both modes: every token the core reports reaches the front end exactly once,
in order (an abort folds in the outputs still waiting), and a request counts as unfinished
until its final output was returned.

Not thread-safe: the offline ``LLM`` calls it directly; ``AsyncEngine`` owns one on its
step-loop thread. Requests are validated (and tokenized) by ``make_request`` before they
touch any engine state, so a bad request never disturbs the others; whatever still raises
while handling one request's output fails that request only (``RequestOutput.error``).
"""
from __future__ import annotations

import dataclasses

from ..beam_search.params import BeamSearchParams
from ..config import (EngineConfig, batch_limits, resolved_async_scheduling,
                      resolved_schedule_ahead)
from ..core.engine_stats import EngineStats
from ..executor.devices import device_memory, resolve_device, resolve_dtype
from ..frontend.eos import eos_token_ids
from ..frontend.input_processor import InputProcessor
from ..frontend.output_processor import OutputProcessor
from ..frontend.prompts import PromptInput
from ..models.model_loader import load_hf_config, load_tokenizer, resolve_model_folder
from ..models.registry import model_spec
from ..models.sharding import ShardPlan
from ..models.spec import long_rope_switch
from ..outputs import RequestOutput
from ..sampling_params import SamplingParams
from ..requests.engine_io import EngineCoreOutput, EngineRequest
from ..exceptions import ParamValidationError
from ..lora.peft_checkpoint import load_adapter
from ..lora.request import LoRARequest
from .engine_core import EngineCore, ModelPlacement
from .step_records import LaunchedStep
from .gc_heap import freeze_startup_heap


class LLMEngine:
    def __init__(self, config: EngineConfig, *, usage: str = "llm") -> None:
        """``usage`` is ``"llm"`` (offline batches) or ``"server"`` (``AsyncEngine``): it picks
        the defaults of the settings left ``None`` that depend on it (``batch_limits``).
        ``config`` keeps every setting resolved for this device."""
        device = resolve_device(config.device)
        overlap = resolved_async_scheduling(config.async_scheduling, device.type,
                                            config.tensor_parallel_size)
        if config.schedule_ahead and not overlap:
            raise ValueError("schedule_ahead needs async_scheduling (on by default for one CUDA "
                             "device; async_scheduling=True elsewhere)")
        ahead = resolved_schedule_ahead(config.schedule_ahead, device.type, overlap,
                                        config.tensor_parallel_size,
                                        config.speculative_config is not None)
        seqs, tokens = batch_limits(device.type, *device_memory(device), usage)
        self.config = config = dataclasses.replace(
            config, async_scheduling=overlap, schedule_ahead=ahead,
            max_num_seqs=seqs if config.max_num_seqs is None else config.max_num_seqs,
            max_num_batched_tokens=(tokens if config.max_num_batched_tokens is None
                                    else config.max_num_batched_tokens))
        folder = resolve_model_folder(config.model)
        hf_config = load_hf_config(folder)
        self.tokenizer = load_tokenizer(config.tokenizer or folder)
        self.max_model_len = _max_model_len(config, hf_config)
        self.model_spec = spec = model_spec(hf_config)
        ShardPlan(spec, 0, config.tensor_parallel_size)  # refuse a bad size before any process starts
        self.core = EngineCore(config, ModelPlacement(
            folder, self.max_model_len, spec.vocab_size, device, resolve_dtype(config.dtype, device),
            long_rope_switch(hf_config)))
        self.input_processor = InputProcessor(
            self.tokenizer, spec.vocab_size, eos_token_ids(folder, hf_config, self.tokenizer),
            self.max_model_len, self.core.max_total_tokens, self.core.executor.num_blocks,
            config.block_size)
        self.output_processor = OutputProcessor(self.tokenizer)
        # async_scheduling: the core's outputs of the last step, not yet through the front end
        self._unprocessed: list[EngineCoreOutput] = []
        # schedule_ahead: the step launched by the last call, finished by the next
        self._in_flight: LaunchedStep | None = None
        freeze_startup_heap()

    # -- requests --------------------------------------------------------------------
    def make_request(self, request_id: str, prompt: PromptInput,
                     params: SamplingParams | BeamSearchParams | None = None, *,
                     priority: int = 0, tenant: str | None = None,
                     deadline: float | None = None,
                     lora_request: LoRARequest | None = None) -> EngineRequest:
        """A validated ``EngineRequest`` for this engine (``InputProcessor.process``), under
        a request_id not in use; raises ``ValueError`` saying what to change. Its only side
        effect: a ``lora_request`` the engine does not know yet is added (``add_lora``)."""
        if self.has_request(request_id):
            raise ValueError(f"request_id {request_id!r} is already in use")
        if lora_request is not None:
            self.add_lora(lora_request)
        return self.input_processor.process(
            request_id, prompt, params, priority=priority, tenant=tenant, deadline=deadline,
            lora_id=None if lora_request is None else lora_request.lora_int_id)

    # -- LoRA adapters (vLLM's add_lora / remove_lora / list_loras) ---------------------
    def add_lora(self, request: LoRARequest) -> bool:
        """Register a PEFT adapter after reading and checking it against the model (raises a
        ``ParamValidationError`` naming ``lora_request`` when it does not fit); True if it is
        new. Its weights reach a device slot when a request first runs under it."""
        if not isinstance(request, LoRARequest):
            raise ParamValidationError(f"lora_request must be a LoRARequest, got "
                                       f"{type(request).__name__}", "lora_request")
        if not self.config.enable_lora:
            raise ParamValidationError("this engine serves no LoRA adapters: start it with "
                                       "enable_lora=True", "lora_request")
        known = self.core.loras.get(request.lora_int_id)
        if known == request:
            return False
        if known is not None:
            raise ParamValidationError(
                f"lora_int_id {request.lora_int_id} is already adapter {known.lora_name!r} "
                f"({known.lora_path}); remove it first or use another id", "lora_request")
        load_adapter(request, self.model_spec, self.config.max_lora_rank)
        self.core.add_lora(request)
        return True

    def remove_lora(self, lora_id: int) -> bool:
        """Forget adapter ``lora_id``; False if unknown or a request still uses it."""
        return self.core.remove_lora(lora_id)

    def list_loras(self) -> set[int]:
        return set(self.core.loras)

    def add_request(self, request: EngineRequest) -> None:
        if request.request_id in self.output_processor:  # its final output is still due
            raise ValueError(f"request_id {request.request_id!r} is already in use")
        self.core.add_request(request)
        self.output_processor.add_request(request)

    def abort_request(self, request_id: str) -> RequestOutput | None:
        """Finish a request at once, freeing its blocks; returns its final output (``None``
        if the core no longer runs it: a final output still due comes from ``step``)."""
        outputs = self.core.abort_request(request_id)
        if outputs is None:
            return None
        waiting = [out for out in self._unprocessed if out.request_id == request_id]
        if waiting:
            self._unprocessed = [out for out in self._unprocessed if out.request_id != request_id]
        return self.output_processor.finish(request_id, waiting + outputs)

    def has_request(self, request_id: str) -> bool:
        """Whether ``request_id`` is here: running, or its final output not yet returned."""
        return request_id in self.core.requests or request_id in self.output_processor

    def holds(self, request: EngineRequest) -> bool:
        """Whether this very request (not a later one under its id) is still running here."""
        held = self.core.requests.get(request.request_id)
        return held is not None and held.source is request

    def has_unfinished_requests(self) -> bool:
        return (self.core.has_unfinished_requests() or bool(self._unprocessed)
                or self._in_flight is not None)

    @property
    def request_ids(self) -> list[str]:
        return list(self.core.requests)

    # -- steps -----------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Run one core step; returns the outputs of requests that got new tokens (or
        finished). Stop strings found in them end their samples in the core at once. With
        ``async_scheduling``, the outputs are the previous step's, made while the GPU ran
        this one."""
        if not self.config.async_scheduling:
            return self._process(self.core.step())
        launched = self.core.launch_step()
        if self.core.ahead is not None:  # schedule_ahead: finish the step launched last time
            launched, self._in_flight = self._in_flight, launched
        outputs = self._process(self._unprocessed)
        self._unprocessed = self.core.finish_step(launched)
        return outputs

    def _process(self, core_outputs: list[EngineCoreOutput]) -> list[RequestOutput]:
        """The front end's work on core outputs: ``RequestOutput``s; the stop strings and
        failures it found go back to the core."""
        processed = self.output_processor.process_outputs(core_outputs)
        for stop in processed.stops:
            self.core.stop_at_string(stop)
        for request_id in processed.failed:
            self.core.abort_request(request_id, "error")
        return processed.request_outputs

    # -- the rest --------------------------------------------------------------------
    @property
    def generated_tokens(self) -> int:
        return self.core.generated_tokens

    @property
    def attention_backend(self) -> str:
        return self.core.executor.attention_backend

    def stats(self) -> EngineStats:
        return self.core.stats()

    def reset_prefix_cache(self) -> None:
        """Forget every prefix-cached block that no request holds."""
        self.core.reset_prefix_cache()

    def check_health(self) -> None:
        """Raises if the engine can no longer run steps (e.g. a tensor-parallel worker died)."""
        self.core.check_health()

    def look_while_idle(self) -> None:
        """Called by a server's loop while it has no request: a CPU engine's adaptive OpenMP
        team keeps its look at the free cores current (``cpu.adaptive_threads``)."""
        self.core.look_while_idle()

    def shutdown(self) -> None:
        """Stop the core's worker processes and its KV-event publisher (idempotent)."""
        self.core.shutdown()


def _max_model_len(config: EngineConfig, hf_config) -> int:
    """``max_model_len``, or the model's context when unset; refused past that context."""
    context = getattr(hf_config, "max_position_embeddings", None) or 2048
    if config.max_model_len is not None and config.max_model_len > context:
        raise ValueError(
            f"max_model_len={config.max_model_len} exceeds the model's context of {context} "
            f"tokens (max_position_embeddings); lower max_model_len")
    return config.max_model_len or context
