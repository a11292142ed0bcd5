"""paged-core: a paged-attention LLM generation engine that serving frameworks host.

Public API (vLLM-style names)::

    from paged_core import LLM, SamplingParams
    llm = LLM()  # embedded SmolLM2-135M-Instruct
    outs = llm.generate(["The capital of France is"], SamplingParams(max_tokens=32, temperature=0))

    from paged_core import AsyncEngine, EngineConfig
    engine = AsyncEngine(EngineConfig())
    async for out in engine.generate("Hello", SamplingParams(max_tokens=8), request_id="r1"): ...
"""
from .cpu.openmp_spin import keep_threads_awake_between_ops

keep_threads_awake_between_ops()  # before anything imports torch

from .async_engine import AsyncEngine  # noqa: E402
from .beam_search.results import BeamSearchOutput, BeamSearchSequence
from .beam_search.params import BeamSearchParams
from .config import EngineConfig
from .core.engine_stats import EngineStats
from .engine.llm_engine import LLMEngine
from .serving.engine_client import EngineClient
from .exceptions import (EngineDeadError, EngineOverloadedError, ParamValidationError,
                         RequestFailedError, RequestTimeoutError)
from .llm import LLM
from .lora.request import LoRARequest
from .outputs import CompletionOutput, Logprob, RequestMetrics, RequestOutput
from .sampling_params import SamplingParams
from .structured_outputs import StructuredOutputsParams

__all__ = [
    "LLM", "LLMEngine", "AsyncEngine", "EngineClient", "EngineConfig", "SamplingParams",
    "StructuredOutputsParams", "EngineDeadError", "EngineOverloadedError", "ParamValidationError",
    "RequestFailedError", "RequestTimeoutError", "RequestOutput", "CompletionOutput", "Logprob",
    "RequestMetrics", "BeamSearchParams", "BeamSearchOutput", "BeamSearchSequence", "EngineStats",
    "LoRARequest",
]
__version__ = "0.1.0"
