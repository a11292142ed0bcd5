"""The offline systems under test, each behind ``warmup()`` and ``run(requests) -> RunResult``.

- ``PagedCore``: ``paged_core.LLM.generate`` (continuous batching, paged KV cache);
- ``HFStatic``: naive ``transformers`` static batching: consecutive requests in
  padded batches (left padding) that run until their longest request finishes
  (``max_new_tokens == min_new_tokens ==`` the longest output of the batch);
- ``HFContinuous``: ``transformers``' own continuous batching (the manager behind
  ``model.generate_batch``), with per-request ``max_new_tokens``.

All decode greedily and produce exactly each request's ``output_len`` useful tokens.
``output_tokens`` counts those useful tokens only; ``computed_tokens`` adds the
padding rows and overrun a static batch computes and throws away. A system that
can time its decode phase adds ``decode_seconds`` and ``decode_steps`` to its
result: the time from each request's first output token to its last, and the
tokens generated in it (``output_len - 1`` per request); served one request at
a time, their ratio is the decode step time of a lone sequence.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch

from .workload import WARMUP, BenchRequest


@dataclass
class RunResult:
    system: str
    seconds: float
    prompt_tokens: int
    output_tokens: int
    computed_tokens: int
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def output_tok_s(self) -> float:
        return self.output_tokens / self.seconds

    @property
    def total_tok_s(self) -> float:
        return (self.prompt_tokens + self.output_tokens) / self.seconds

    def as_dict(self) -> dict[str, Any]:
        return {"system": self.system, "seconds": self.seconds, "prompt_tokens": self.prompt_tokens,
                "output_tokens": self.output_tokens, "computed_tokens": self.computed_tokens,
                "output_tok_s": self.output_tok_s, "total_tok_s": self.total_tok_s, **self.extra}


def make_result(system: str, seconds: float, requests: list[BenchRequest],
            computed_tokens: int | None = None, **extra: Any) -> RunResult:
    output_tokens = sum(r.output_len for r in requests)
    return RunResult(system, seconds, sum(r.prompt_len for r in requests), output_tokens,
                     output_tokens if computed_tokens is None else computed_tokens, extra)


def torch_dtype(name: str) -> torch.dtype:
    return {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[name]


def kv_bytes_per_token(hf_config, dtype: torch.dtype) -> int:
    """K and V of one token across every layer."""
    heads = getattr(hf_config, "num_key_value_heads", None) or hf_config.num_attention_heads
    head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // hf_config.num_attention_heads
    return 2 * hf_config.num_hidden_layers * heads * head_dim * dtype.itemsize


def load_hf_model(dtype: str):
    from transformers import AutoModelForCausalLM

    from paged_core.models.embedded_model import embedded_model_folder

    model = AutoModelForCausalLM.from_pretrained(embedded_model_folder(), dtype=torch_dtype(dtype))
    return model.eval()


class PagedCore:
    def __init__(self, dtype: str, kv_cache_memory: int, progress: bool = True,
                 name: str = "paged-core", **engine_args: Any):
        from paged_core import LLM

        self.name = name
        self.llm = LLM(dtype=dtype, kv_cache_memory=kv_cache_memory, **engine_args)
        self.progress = progress

    def warmup(self) -> None:
        self._generate(WARMUP, progress=False)

    def run(self, requests: list[BenchRequest]) -> RunResult:
        self.llm.reset_prefix_cache()  # a repeat must not hit on the previous repeat's prompts
        start = time.perf_counter()
        outputs = self._generate(requests, self.progress)
        seconds = time.perf_counter() - start
        decode_seconds = sum(o.metrics.finished_time - o.metrics.first_token_time for o in outputs)
        return make_result(self.name, seconds, requests,
                           num_preemptions=self.llm.stats()["num_preemptions"],
                           decode_seconds=decode_seconds,
                           decode_steps=sum(r.output_len - 1 for r in requests))

    def _generate(self, requests: list[BenchRequest], progress: bool) -> list:
        from paged_core import SamplingParams

        params = [SamplingParams(max_tokens=r.output_len, ignore_eos=True, temperature=0)
                  for r in requests]
        outputs = self.llm.generate([{"prompt_token_ids": r.prompt_token_ids} for r in requests],
                                    params, use_tqdm=progress)
        for out, r in zip(outputs, requests):
            assert len(out.outputs[0].token_ids) == r.output_len, "paged-core output length mismatch"
        return outputs


class HFStatic:
    name = "hf-static"

    def __init__(self, dtype: str, batch_size: int):
        self.model = load_hf_model(dtype)
        self.batch_size = batch_size
        self.pad_id = self.model.config.eos_token_id
        if isinstance(self.pad_id, list):
            self.pad_id = self.pad_id[0]

    def warmup(self) -> None:
        self._batch(WARMUP)

    def run(self, requests: list[BenchRequest]) -> RunResult:
        start, computed = time.perf_counter(), 0
        for i in range(0, len(requests), self.batch_size):
            computed += self._batch(requests[i:i + self.batch_size])
        return make_result(self.name, time.perf_counter() - start, requests, computed,
                       batch_size=self.batch_size)

    @torch.inference_mode()
    def _batch(self, batch: list[BenchRequest]) -> int:
        """Run one padded batch to its longest output; returns the output tokens computed."""
        width = max(r.prompt_len for r in batch)
        steps = max(r.output_len for r in batch)
        ids = torch.tensor([[self.pad_id] * (width - r.prompt_len) + r.prompt_token_ids for r in batch])
        mask = torch.tensor([[0] * (width - r.prompt_len) + [1] * r.prompt_len for r in batch])
        out = self.model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=steps,
                                  min_new_tokens=steps, do_sample=False, pad_token_id=self.pad_id)
        assert out.shape[1] == width + steps, "hf-static stopped early"
        return len(batch) * steps


class HFContinuous:
    name = "hf-generate_batch"

    def __init__(self, dtype: str, kv_cache_memory: int, max_batch_tokens: int, max_seqs: int):
        from transformers import GenerationConfig
        from transformers.generation.configuration_utils import ContinuousBatchingConfig

        self.model = load_hf_model(dtype)
        page_size = ContinuousBatchingConfig.page_size
        per_block = page_size * kv_bytes_per_token(self.model.config, torch_dtype(dtype))
        # Sized explicitly: left to itself it reserves 60% of host RAM on CPU.
        self.cb_config = ContinuousBatchingConfig(
            num_blocks=max(1, kv_cache_memory // per_block), max_batch_tokens=max_batch_tokens,
            max_requests_per_batch=max_seqs)
        self.gen_config = GenerationConfig(do_sample=False, eos_token_id=-1, max_new_tokens=16)

    def warmup(self) -> None:
        self._generate(WARMUP)

    def run(self, requests: list[BenchRequest]) -> RunResult:
        return make_result(self.name, self._generate(requests), requests)

    def _generate(self, requests: list[BenchRequest]) -> float:
        """Per-request ``max_new_tokens`` through the manager that ``generate_batch`` uses.

        Returns the seconds from the first request in to the last result out (the
        manager's start-up, which allocates its cache, is not timed).
        """
        with self.model.continuous_batching_context_manager(
                generation_config=self.gen_config, continuous_batching_config=self.cb_config,
                warmup=False) as manager:
            start = time.perf_counter()
            ids = [manager.add_request(r.prompt_token_ids, max_new_tokens=r.output_len, eos_token_id=-1)
                   for r in requests]
            results: dict[str, Any] = {}
            while len(results) < len(ids):
                result = manager.get_result(timeout=1)
                if result is not None and result.is_finished():
                    results[result.request_id] = result
                elif result is None and not manager.is_running():
                    raise RuntimeError("transformers' continuous batching loop stopped early")
            seconds = time.perf_counter() - start
        for request_id, r in zip(ids, requests):
            got = results[request_id]
            if got.error is not None or len(got.generated_tokens) != r.output_len:
                raise RuntimeError(f"hf-generate_batch request failed: {got.error}")
        return seconds
