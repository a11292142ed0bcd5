"""``LLMEngine``: the synchronous core. ``step()`` = schedule, run, sample, update, free.

Not thread-safe: the offline ``LLM`` calls it directly; ``AsyncEngine`` owns
one on its step-loop thread. Requests are validated (and tokenized) by
``make_request`` before they touch any engine state, so a bad request never
disturbs the others.
"""
from __future__ import annotations

import time
import weakref

import torch

from .block_manager import KVCacheManager
from .config import EngineConfig
from .distributed.executor import make_executor
from .distributed.worker import RankSpec
from .model_loader import load_hf_config, load_tokenizer, resolve_model_folder
from .models.llama import LlamaFamilySpec
from .models.sharding import ShardPlan
from .packed_batch import StepInput, pack_batch
from .outputs import RequestOutput
from .prompts import PromptInput, tokenize_prompt
from .request import Request
from .sampler import Sampler
from .sampling_params import SamplingParams
from .scheduler import Scheduler
from .devices import resolve_device, resolve_dtype
from .eos import eos_token_ids


class LLMEngine:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.device = resolve_device(config.device)
        self.dtype = resolve_dtype(config.dtype, self.device)
        folder = resolve_model_folder(config.model)
        hf_config = load_hf_config(folder)
        self.tokenizer = load_tokenizer(config.tokenizer or folder)
        context = getattr(hf_config, "max_position_embeddings", None) or 2048
        if config.max_model_len is not None and config.max_model_len > context:
            raise ValueError(
                f"max_model_len={config.max_model_len} exceeds the model's context of {context} "
                f"tokens (max_position_embeddings); lower max_model_len")
        self.max_model_len = config.max_model_len or context
        spec = LlamaFamilySpec.from_hf_config(hf_config)
        ShardPlan(spec, 0, config.tensor_parallel_size)  # refuse a bad size before any process starts
        self.vocab_size = spec.vocab_size
        self.executor = make_executor(
            RankSpec(config, folder, self.max_model_len, self.device, self.dtype),
            config.tensor_parallel_size, config.distributed_executor_backend)
        self._finalizer = weakref.finalize(self, self.executor.shutdown)
        self.runner = self.executor.runner  # rank 0's
        num_blocks = self.executor.num_blocks
        self.kv = KVCacheManager(num_blocks, config.block_size, config.enable_prefix_caching)
        self.scheduler = Scheduler(self.kv, config.max_num_seqs, config.max_num_batched_tokens)
        self.sampler = Sampler(torch.Generator().manual_seed(config.seed))  # draws on the CPU
        self.max_total_tokens = min(self.max_model_len, num_blocks * config.block_size)
        self.eos_token_ids = eos_token_ids(folder, hf_config, self.tokenizer)
        self.requests: dict[str, Request] = {}
        self.generated_tokens = 0

    @property
    def attention_backend(self) -> str:
        return self.runner.backend.name

    def make_request(self, request_id: str, prompt: PromptInput,
                     params: SamplingParams | None = None) -> Request:
        """Validate and tokenize; raises ``ValueError`` saying what to change. No side effects."""
        params = params or SamplingParams()
        if not isinstance(params, SamplingParams):
            raise ValueError(f"sampling_params must be a SamplingParams, got {type(params).__name__}")
        if request_id in self.requests:
            raise ValueError(f"request_id {request_id!r} is already in use")
        text, token_ids = tokenize_prompt(prompt, self.tokenizer, self.vocab_size)
        if len(token_ids) >= self.max_total_tokens:
            limit = ("the model's context (max_model_len=%d)" % self.max_model_len
                     if self.max_total_tokens == self.max_model_len else
                     "the KV cache (%d tokens; raise kv_cache_memory or num_kv_blocks)"
                     % self.max_total_tokens)
            raise ValueError(
                f"prompt is too long: {len(token_ids)} tokens, but {limit} leaves room for at most "
                f"{self.max_total_tokens - 1} prompt tokens plus one generated token; shorten the prompt")
        return Request(request_id, text, token_ids, params, self.eos_token_ids,
                       self.max_total_tokens, self.tokenizer)

    def add_request(self, request: Request) -> None:
        if request.request_id in self.requests:
            raise ValueError(f"request_id {request.request_id!r} is already in use")
        self.requests[request.request_id] = request
        self.scheduler.add(request.sequences[0])

    def abort_request(self, request_id: str) -> RequestOutput | None:
        """Finish a request at once, freeing its blocks; returns its final output."""
        request = self.requests.pop(request_id, None)
        if request is None:
            return None
        request.abort()
        for seq in request.sequences:
            if not seq.is_finished:
                self.scheduler.finish(seq)
        out = request.make_output()
        out.finished = True
        return out

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def step(self) -> list[RequestOutput]:
        """Run one iteration; returns outputs of requests that got new tokens (or finished)."""
        sched = self.scheduler.schedule()
        if sched.is_empty:
            return []
        batch = []
        for item in sched.scheduled:
            seq = item.seq
            batch.append(StepInput(
                seq.token_ids, seq.num_computed_tokens, item.num_new_tokens, self.kv.block_ids(seq),
                needs_logits=seq.num_computed_tokens + item.num_new_tokens == seq.num_tokens))
        packed = pack_batch(batch, self.config.block_size,
                            bucketed=self.runner.model.prefers_bucketed_batches)
        logits = self.executor.execute_model(packed, sched.block_copies)
        now = time.monotonic()

        rows, targets, logit_rows = [], [], []
        logit_row = -1
        for item, step_input in zip(sched.scheduled, batch):
            seq = item.seq
            seq.num_computed_tokens += item.num_new_tokens
            request = seq.request
            if request.metrics.first_scheduled_time is None:
                request.metrics.first_scheduled_time = now
            if not step_input.needs_logits:
                continue
            logit_row += 1
            samples = [seq]
            if seq.num_output_tokens == 0 and seq.sample_index == 0:
                request.num_cached_tokens = seq.num_cached_tokens
            if request.needs_fork:
                for child in request.fork():
                    self.kv.fork(seq, child)
                    self.scheduler.add_running(child)
                    samples.append(child)
            for target in samples:
                rows.append(request.sampling_row(target))
                targets.append(target)
                logit_rows.append(logit_row)
        if not rows:
            return []
        if len(logit_rows) != logits.shape[0]:
            logits = logits[torch.tensor(logit_rows, device=logits.device)]
        tokens, logprobs = self.sampler(logits, rows)
        touched: dict[str, Request] = {}
        for seq, token, lp in zip(targets, tokens, logprobs):
            request = seq.request
            if request.append_token(seq, token, lp):
                self.scheduler.finish(seq)
            touched[request.request_id] = request
        self.generated_tokens += len(tokens)
        outputs = []
        for request in touched.values():
            out = request.make_output()
            if out.finished:
                del self.requests[request.request_id]
            outputs.append(out)
        return outputs

    def check_health(self) -> None:
        """Raises if the engine can no longer run steps (e.g. a tensor-parallel worker died)."""
        self.executor.check_health()

    def shutdown(self) -> None:
        """Stop the executor's worker processes (idempotent; also run when the engine is collected)."""
        self._finalizer()

    def reset_prefix_cache(self) -> None:
        """Forget every prefix-cached block that no request holds."""
        self.kv.reset_prefix_cache()

    def stats(self) -> dict[str, float]:
        """KV usage, prefix-cache counters (tokens), queue sizes, preemptions, generated tokens."""
        stats = self.kv.stats()
        stats.update(
            num_running=len(self.scheduler.running),
            num_waiting=len(self.scheduler.waiting),
            num_requests=len(self.requests),
            num_preemptions=self.scheduler.num_preemptions,
            generated_tokens=self.generated_tokens,
        )
        return stats
