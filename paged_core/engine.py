"""``LLMEngine``: the synchronous core. ``step()`` = ``schedule`` -> ``pack`` ->
``plan_sampling`` -> ``execute_model`` -> ``update_from_output`` (vLLM's names, plus the
input batch and the plan): schedule; pack the step (its rows and logits layout); let each
request decide what its sampled rows are for (``core.group_decision``); run the forward and
the sampling through the executor (in process or on every tensor-parallel rank; rank 0
samples); then apply the decisions, append (the core's stop conditions), detokenize and
build the outputs (``frontend.output_processor``, whose stop strings end sequences too),
free; with a ``speculative_config`` the proposer then drafts tokens for the next step
(``spec_decode.speculation``).

Not thread-safe: the offline ``LLM`` calls it directly; ``AsyncEngine`` owns
one on its step-loop thread. Requests are validated (and tokenized) by
``make_request`` before they touch any engine state, so a bad request never
disturbs the others; whatever still raises while handling one request's output
fails that request only (``RequestOutput.error``).
"""
from __future__ import annotations

import logging
import time
import weakref
from dataclasses import dataclass, field

import torch

from .beam_search.request import BeamSearchRequest
from .beam_search.params import BeamSearchParams
from .config import EngineConfig
from .core.engine_stats import EngineStats
from .core.group_decision import GroupDecision, SequenceGroup
from .core.kv_cache_manager import KVCacheManager
from .core.scheduler import Scheduler, SchedulerOutput
from .core.sequence import Sequence
from .core.step_pacer import StepPacer
from .executor.devices import resolve_device, resolve_dtype
from .executor.executor import make_executor
from .executor.rank_worker import RankSpec
from .frontend.eos import eos_token_ids
from .exceptions import RequestFailedError
from .frontend.input_processor import InputProcessor
from .frontend.output_processor import OutputProcessor
from .models.model_loader import load_hf_config, load_tokenizer, resolve_model_folder
from .models.registry import model_spec
from .models.spec import check_rope_length
from .models.sharding import ShardPlan
from .outputs import RequestOutput
from .executor.packed_batch import PackedBatch, StepInput, bucketed_num_tokens, pack_batch
from .frontend.prompts import PromptInput
from .request import Request
from .sampling_params import SamplingParams
from .sample.sampling_plan import SamplerOutput, SamplingPlan
from .spec_decode.proposer import TargetModel
from .spec_decode.speculation import Speculation

logger = logging.getLogger(__name__)


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
        check_rope_length(hf_config, self.max_model_len)
        spec = model_spec(hf_config)
        ShardPlan(spec, 0, config.tensor_parallel_size)  # refuse a bad size before any process starts
        self.vocab_size = spec.vocab_size
        self.executor = make_executor(
            RankSpec(config, folder, self.max_model_len, self.device, self.dtype),
            config.tensor_parallel_size, config.distributed_executor_backend)
        self.kv_events = _kv_event_publisher(config, self.device)  # None unless configured
        self._finalizer = weakref.finalize(self, _shut_down, self.executor, self.kv_events)
        num_blocks = self.executor.num_blocks
        self.kv = KVCacheManager(num_blocks, config.block_size, config.enable_prefix_caching)
        if self.kv_events is not None:
            self.kv.record_events()
        self.scheduler = Scheduler(self.kv, config.max_num_seqs, config.max_num_batched_tokens,
                                   long_prefill_token_threshold=config.long_prefill_token_threshold,
                                   max_num_partial_prefills=config.max_num_partial_prefills,
                                   policy=config.scheduling_policy,
                                   tenant_fairness=config.tenant_fairness)
        self.max_total_tokens = min(self.max_model_len, num_blocks * config.block_size)
        self.eos_token_ids = eos_token_ids(folder, hf_config, self.tokenizer)
        self.input_processor = InputProcessor(self.tokenizer, self.vocab_size, self.eos_token_ids,
                                              self.max_model_len, self.max_total_tokens,
                                              num_blocks, config.block_size)
        self.output_processor = OutputProcessor(self.tokenizer)
        self.requests: dict[str, Request] = {}
        self.generated_tokens = 0
        self.pacer = StepPacer(config.itl_target_ms, rows_of=(
            bucketed_num_tokens if self.executor.prefers_bucketed_batches else int))
        spec = config.speculative_config
        self.speculation = None if spec is None else Speculation(spec, TargetModel(
            config, self.vocab_size, self.max_total_tokens, num_blocks, self.device, self.dtype))

    @property
    def attention_backend(self) -> str:
        return self.executor.attention_backend

    def make_request(self, request_id: str, prompt: PromptInput,
                     params: SamplingParams | BeamSearchParams | None = None, *,
                     priority: int = 0, tenant: str | None = None
                     ) -> Request | BeamSearchRequest:
        """A validated request for this engine (``InputProcessor.process``), under a
        request_id not in use; raises ``ValueError`` saying what to change. No side
        effects on the engine."""
        if request_id in self.requests:
            raise ValueError(f"request_id {request_id!r} is already in use")
        return self.input_processor.process(request_id, prompt, params, priority=priority,
                                            tenant=tenant)

    def add_request(self, request: Request | BeamSearchRequest) -> None:
        if request.request_id in self.requests:
            raise ValueError(f"request_id {request.request_id!r} is already in use")
        self.requests[request.request_id] = request
        self.output_processor.add_request(request)
        self.scheduler.add(request.sequences[0])

    def abort_request(self, request_id: str) -> RequestOutput | None:
        """Finish a request at once, freeing its blocks; returns its final output."""
        request = self.requests.get(request_id)
        if request is None:
            return None
        self._finish(request, "abort")
        try:
            out = self.output_processor.make_output(request)
        except Exception as exc:
            return self._fail_request(request, exc)
        self.output_processor.forget(request_id)  # final even before all n samples forked
        out.finished = True
        return out

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def step(self) -> list[RequestOutput]:
        """Run one iteration; returns outputs of requests that got new tokens (or finished).

        An exception while handling one request (forking its samples, appending
        a token: detokenizer, stop strings, log-probabilities; making its
        output) fails that request only: its output carries the error (see
        ``_fail_request``). Any other exception (the forward pass, the sampler)
        leaves the whole step in doubt: it is logged with a one-line summary of
        the step (sizes and request ids, never text) and raised.
        """
        start = time.perf_counter()
        sched = self.scheduler.schedule(self.pacer.budget(self.scheduler.num_decodes_in_flight))
        if sched.is_empty:
            return []
        try:
            packed = self.pack(sched)
            plan = self.plan_sampling(sched, packed)
            output = self.execute_model(packed, sched, plan.sampling)
            outputs = self.update_from_output(sched, plan, output)
            self._publish_kv_events()
            if self.speculation is not None:
                self.speculation.propose(self.scheduler.running)
        except Exception:
            logger.error("engine step failed: %s", sched.describe())
            raise
        self.pacer.observe(len(sched.scheduled), sched.num_tokens, time.perf_counter() - start)
        return outputs

    def pack(self, sched: SchedulerOutput) -> PackedBatch:
        """The step as the runner reads it (``pack_batch``): rows, positions, slots, block
        tables and the logits layout."""
        batch = [StepInput(item.seq.token_ids + item.seq.spec_token_ids,
                           item.seq.num_computed_tokens, item.num_new_tokens,
                           self.kv.block_ids(item.seq),
                           needs_logits=_is_sampled(item),
                           num_spec_tokens=len(item.seq.spec_token_ids))
                 for item in sched.scheduled]
        return pack_batch(batch, self.config.block_size,
                          bucketed=self.executor.prefers_bucketed_batches)

    def plan_sampling(self, sched: SchedulerOutput, packed: PackedBatch) -> StepPlan:
        """Ask the request of every sequence that computes its last token this step what its
        logits row is for (``SequenceGroup.plan_sampling``), and lay the answers out: the
        rows to sample, the rows to hand back raw, the decisions to apply after the forward.
        A request that raises here fails alone (after the forward)."""
        plan = StepPlan()
        for item, logit_row in zip(sched.scheduled, packed.first_logits_row.tolist()):
            if logit_row < 0:
                continue
            seq, request = item.seq, item.seq.request
            if any(r is request for r, _ in plan.failed):
                continue
            if seq.num_output_tokens == 0 and seq.sample_index == 0:
                request.num_cached_tokens = seq.num_cached_tokens
            try:
                decision = request.plan_sampling(seq)
            except Exception as exc:
                plan.failed.append((request, exc))
                continue
            plan.decisions.append(decision)
            for target in decision.to_sample:  # only ``seq`` has drafts
                plan.sampling.add(request, target, logit_row)
            if decision.needs_logits:
                plan.sampling.keep_logits(seq, logit_row)
        return plan

    def execute_model(self, packed: PackedBatch, sched: SchedulerOutput,
                      plan: SamplingPlan) -> SamplerOutput:
        """Run the step's forward (on every rank, through the executor) and its sampling
        (rank 0)."""
        return self.executor.execute_model(packed, sched.block_copies, plan)

    def update_from_output(self, sched: SchedulerOutput, plan: StepPlan,
                           output: SamplerOutput) -> list[RequestOutput]:
        """Count the scheduled tokens as computed; apply the planned decisions (forks of
        ``n > 1`` samples); hand kept rows to their requests (beam steps) and apply those
        decisions; append the sampled tokens, verifying any drafts; free the finished.

        Outputs come in this order: requests that failed deciding, requests that a decision
        ended (beam searches), requests that failed appending, then the other requests
        that got tokens."""
        outputs = [self._fail_request(request, exc) for request, exc in plan.failed]
        self._count_computed(sched)
        for decision in plan.decisions:
            self._apply(decision)
        ended = self._hand_back_logits(plan.sampling, output.kept_logits, outputs)
        outputs += self._make_outputs(ended)
        if plan.sampling.rows:
            touched = self._accept_tokens(plan.sampling.targets, output.token_ids,
                                          output.logprobs, outputs)
            outputs += self._make_outputs(touched)
        return outputs

    def _count_computed(self, sched: SchedulerOutput) -> None:
        now = time.monotonic()
        for item in sched.scheduled:
            item.seq.num_computed_tokens += item.num_new_tokens
            metrics = item.seq.request.metrics
            if metrics.first_scheduled_time is None:
                metrics.first_scheduled_time = now

    def _hand_back_logits(self, plan: SamplingPlan, kept_logits: torch.Tensor | None,
                          outputs: list[RequestOutput]) -> dict[str, SequenceGroup]:
        """Each kept row to its request (``take_logits``); apply the decisions. Returns the
        requests whose decision asks for an output now. A request that raises fails alone."""
        ended: dict[str, SequenceGroup] = {}
        for index, seq in enumerate(plan.kept):
            request = seq.request
            if seq.is_finished:  # its request failed on an earlier sequence of this step
                continue
            try:
                decision = request.take_logits(seq, kept_logits[index])
            except Exception as exc:
                outputs.append(self._fail_request(request, exc))
                continue
            self._apply(decision)
            if decision.output_ready:
                ended[request.request_id] = request
        return ended

    def _apply(self, decision: GroupDecision) -> None:
        """Forks first (children share their parents' blocks and computed tokens), then frees."""
        for parent, child in decision.forks:
            child.num_computed_tokens = parent.num_computed_tokens
            self.kv.fork(parent, child)
            self.scheduler.add_running(child)
        for seq in decision.freed:
            self.scheduler.finish(seq)
        self.generated_tokens += decision.num_tokens

    def _accept_tokens(self, targets: list[Sequence], tokens: list[int], logprobs: list,
                       outputs: list[RequestOutput]) -> dict[str, Request]:
        """Append each target's tokens: its one sampled token, or, if it carried drafts, those
        speculative decoding verifies; free the finished. Returns the requests that got tokens."""
        touched: dict[str, Request] = {}
        end = 0
        for seq in targets:
            request, num_drafts = seq.request, len(seq.spec_token_ids)
            start, end = end, end + 1 + num_drafts
            if seq.is_finished:  # its request failed on an earlier sample of this step
                continue
            keep = self.speculation.verify(seq, tokens[start:end]) if num_drafts else 1
            try:
                finished = self._append_tokens(seq, tokens[start:start + keep],
                                               logprobs[start:start + keep])
            except Exception as exc:
                touched.pop(request.request_id, None)
                outputs.append(self._fail_request(request, exc))
                continue
            if finished:
                self.scheduler.finish(seq)
            elif num_drafts:  # the last kept token and the rejected drafts are not in the cache
                seq.num_computed_tokens = seq.num_tokens - 1
                self.kv.free_blocks_past_computed(seq)
            touched[request.request_id] = request
        return touched

    def _make_outputs(self, touched: dict[str, SequenceGroup]) -> list[RequestOutput]:
        """Each request's output delta; a finished request is forgotten."""
        outputs = []
        for request in touched.values():
            try:
                out = self.output_processor.make_output(request)
            except Exception as exc:
                outputs.append(self._fail_request(request, exc))
                continue
            if out.finished:
                del self.requests[request.request_id]
            outputs.append(out)
        return outputs

    def _append_tokens(self, seq: Sequence, tokens: list[int], logprobs: list) -> bool:
        """Append verified tokens one by one until one finishes ``seq`` (the core's stop
        conditions; the rest are dropped), then let the output processor detokenize them;
        a stop string it finds ends ``seq`` there. True once ``seq`` is finished."""
        request, appended, finished = seq.request, 0, False
        while appended < len(tokens) and not finished:
            finished = request.append_token(seq, tokens[appended])
            appended += 1
        stop = self.output_processor.absorb(seq, tokens[:appended], logprobs[:appended])
        if stop is not None:
            num_output_tokens, stop_string = stop
            appended -= seq.num_output_tokens - num_output_tokens
            request.stop_at_string(seq, num_output_tokens, stop_string)
            finished = True
        self.generated_tokens += appended
        return finished

    def check_health(self) -> None:
        """Raises if the engine can no longer run steps (e.g. a tensor-parallel worker died)."""
        self.executor.check_health()

    def shutdown(self) -> None:
        """Stop the executor's worker processes and the KV-event publisher (idempotent; also
        run when the engine is collected)."""
        self._finalizer()

    def _finish(self, request: Request, reason: str) -> None:
        """Forget ``request``; its unfinished samples end with ``reason`` and free their blocks."""
        self.requests.pop(request.request_id, None)
        request.abort(reason)
        for seq in request.sequences:
            if not seq.is_finished:
                self.scheduler.finish(seq)

    def _fail_request(self, request: Request, exc: Exception) -> RequestOutput:
        """Fail ``request`` after ``exc`` was raised handling it; no other request is touched.

        Logs the traceback, frees the request's blocks and returns its final
        output: finished, no completions, ``error`` a ``RequestFailedError``
        whose ``__cause__`` is ``exc``.
        """
        logger.error("request %s failed; the engine goes on with the other requests",
                     request.request_id, exc_info=exc)
        self._finish(request, "error")
        self.output_processor.forget(request.request_id)
        error = RequestFailedError(
            request.request_id, f"request {request.request_id} failed inside the engine "
                                f"({type(exc).__name__}: {exc}); the engine goes on serving other requests")
        error.__cause__ = exc
        return RequestOutput(request.request_id, request.prompt, request.prompt_token_ids, [],
                             True, request.metrics, request.num_cached_tokens, error=error)

    def reset_prefix_cache(self) -> None:
        """Forget every prefix-cached block that no request holds."""
        self.kv.reset_prefix_cache()
        self._publish_kv_events()

    def _publish_kv_events(self) -> None:
        """Hand the prefix cache's events since the last call to the publisher, as one batch."""
        if self.kv_events is not None:
            events = self.kv.take_events()
            if events:
                self.kv_events.publish(events)

    def stats(self) -> EngineStats:
        """KV usage, prefix-cache counters (tokens), queue sizes, preemptions, generated tokens,
        and speculative decoding's counters if it is on (``core.engine_stats``)."""
        return EngineStats(
            kv=self.kv.stats(),
            num_running=len(self.scheduler.running),
            num_waiting=len(self.scheduler.waiting),
            num_requests=len(self.requests),
            num_preemptions=self.scheduler.num_preemptions,
            generated_tokens=self.generated_tokens,
            spec_decode=None if self.speculation is None else self.speculation.stats(),
            kv_events=None if self.kv_events is None else self.kv_events.stats(),
        )


@dataclass
class StepPlan:
    """What ``plan_sampling`` laid out for one step: the sampling plan the executor runs, the
    decisions the engine applies after the forward, and the requests that failed deciding."""

    sampling: SamplingPlan = field(default_factory=SamplingPlan)
    decisions: list[GroupDecision] = field(default_factory=list)
    failed: list[tuple[SequenceGroup, Exception]] = field(default_factory=list)


def _is_sampled(item) -> bool:
    """Whether this step computes the last known token of the sequence (so it samples the next;
    with draft tokens, also one token after each draft)."""
    return item.seq.num_computed_tokens + item.num_new_tokens >= item.seq.num_tokens


def _kv_event_publisher(config: EngineConfig, device: torch.device):
    """The publisher ``kv_events_config`` asks for (``kv_events.publisher``), else ``None``."""
    events = config.kv_events_config
    if events is None or not events.publishes:
        return None
    try:
        from .kv_events.publisher import ZmqEventPublisher
        return ZmqEventPublisher(events, medium="GPU" if device.type == "cuda" else "CPU")
    except ImportError as exc:
        raise ValueError(f"kv_events_config with publisher 'zmq' needs pyzmq and msgspec "
                         f"(pip install 'paged-core[kv-events]'): {exc}") from None


def _shut_down(executor, kv_events) -> None:
    executor.shutdown()
    if kv_events is not None:
        kv_events.shutdown()
