"""``EngineCore``: the engine's inner loop (vLLM v1's name). It takes ``EngineRequest``s,
runs steps, and reports token ids as ``EngineCoreOutput``s; it never sees text.

One ``step()`` (``launch_step`` up to execute and counting the scheduled tokens as computed,
``finish_step`` from there)::

    schedule    the step's chunks under the token budget; blocks allocated
    pack        the step as the runner reads it: rows, slots, block tables, logits layout
    plan        each request decides what its sampled rows are for (``core.group_decision``)
    execute     the forward and the sampling, on every tensor-parallel rank (rank 0 samples)
    update      decisions applied (forks, frees), tokens appended (drafts verified),
                finished sequences freed, one ``EngineCoreOutput`` per sample that changed
    propose     drafts for the next step (speculative decoding only)

Only the core applies decisions to the KV cache manager and the scheduler; request kinds
decide (``SequenceGroup``), the executor computes. Not thread-safe: one caller at a time.

With ``schedule_ahead`` (vLLM's async scheduler) ``launch_step`` may run while the step
before it is still in flight (``engine.schedule_ahead``).
"""
from __future__ import annotations

import logging
import time
import weakref
from dataclasses import dataclass

import torch

from ..requests.beam_search_request import BeamSearchRequest
from ..config import EngineConfig
from ..core.engine_stats import EngineStats
from ..core.group_decision import GroupDecision, SequenceGroup
from ..core.kv_cache_manager import KVCacheManager
from ..core.lora_slots import LoRASlotTable
from ..core.scheduler import Scheduler, SchedulerOutput
from ..core.sequence import Sequence
from ..core.step_pacer import StepPacer
from ..executor.executor import make_executor
from ..executor.packed_batch import PackedBatch, bucketed_num_tokens, pack_batch
from ..executor.rank_worker import RankSpec
from ..lora.request import LoRARequest
from ..requests.sampling_request import Request
from ..sample.sampling_plan import SamplerOutput, SamplingPlan
from ..spec_decode.proposer import TargetModel
from ..spec_decode.speculation import Speculation
from ..requests.engine_io import EngineCoreOutput, EngineRequest, StopAtString
from .kv_event_sink import kv_event_publisher
from .long_rope import rotate_long
from .schedule_ahead import ScheduleAhead
from .step_calibration import calibration_shapes, calibration_steps
from .step_records import LaunchedStep, StepPlan, step_inputs

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModelPlacement:
    """Where the core runs its model: the resolved checkpoint folder, the context it serves,
    the vocabulary it samples from, device and dtype; and where LongRoPE switches to its
    long factors (``models.spec.long_rope_switch``; ``None``: no LongRoPE)."""

    folder: str
    max_model_len: int
    vocab_size: int
    device: torch.device
    dtype: torch.dtype
    long_rope_switch: int | None = None


class EngineCore:
    def __init__(self, config: EngineConfig, model: ModelPlacement) -> None:
        self.config = config
        self.model = model
        self.executor = make_executor(
            RankSpec(config, model.folder, model.max_model_len, model.device, model.dtype),
            config.tensor_parallel_size, config.distributed_executor_backend)
        self.kv_events = kv_event_publisher(config)  # None unless configured
        self._finalizer = weakref.finalize(self, _shut_down, self.executor, self.kv_events)
        num_blocks = self.executor.num_blocks
        self.kv = KVCacheManager(num_blocks, config.block_size, config.enable_prefix_caching)
        if self.kv_events is not None:
            self.kv.record_events()
        # LoRA adapters by id (registered by the front end) and which of them hold slots
        self.loras: dict[int, LoRARequest] = {}
        self.lora_slots = LoRASlotTable(config.max_loras) if config.enable_lora else None
        self.scheduler = Scheduler(self.kv, config.max_num_seqs, config.max_num_batched_tokens,
                                   long_prefill_token_threshold=config.long_prefill_token_threshold,
                                   max_num_partial_prefills=config.max_num_partial_prefills,
                                   policy=config.scheduling_policy,
                                   tenant_fairness=config.tenant_fairness,
                                   lora_slots=self.lora_slots)
        self.max_total_tokens = min(model.max_model_len, num_blocks * config.block_size)
        self.requests: dict[str, Request | BeamSearchRequest] = {}
        self.generated_tokens = 0
        self.pacer = StepPacer(config.itl_target_ms, rows_of=(
            bucketed_num_tokens if self.executor.prefers_bucketed_batches else int))
        if self.pacer.target_s and model.device.type == "cpu":
            self._calibrate_pacer()
        spec = config.speculative_config
        self.speculation = None if spec is None else Speculation(spec, TargetModel(
            config, model.vocab_size, self.max_total_tokens, num_blocks, model.device, model.dtype))
        # schedule_ahead (LongRoPE models, which recompute a sequence crossing the switch,
        # schedule one step at a time)
        self.ahead = (ScheduleAhead() if config.schedule_ahead and model.long_rope_switch is None
                      else None)

    def _calibrate_pacer(self) -> None:
        """Time a few steps of known shape before the first request, so that the latency
        target's first budgets rest on them (``step_calibration``)."""
        shapes = calibration_shapes(self.config.max_num_seqs, self.config.max_num_batched_tokens,
                                    self.max_total_tokens)
        steps = calibration_steps(lambda packed: self.executor.execute_model(packed, [], None),
                                  shapes, self.config.block_size,
                                  self.executor.prefers_bucketed_batches)
        self.pacer.calibrate(steps, self.executor.last_team)

    # -- requests in and out ---------------------------------------------------------
    def add_request(self, source: EngineRequest) -> None:
        """Queue ``source`` (its first sequence waits for the scheduler)."""
        if source.request_id in self.requests:
            raise ValueError(f"request_id {source.request_id!r} is already in use")
        request = (BeamSearchRequest(source) if source.is_beam_search
                   else Request(source, self.max_total_tokens))
        self.requests[source.request_id] = request
        switch = self.model.long_rope_switch
        request.sequences[0].rotated_long = switch is not None and len(source.prompt_token_ids) > switch
        self.scheduler.add(request.sequences[0])

    def abort_request(self, request_id: str, reason: str = "abort"
                      ) -> list[EngineCoreOutput] | None:
        """End a request at once with ``reason``, freeing its blocks; returns its final outputs
        (``None`` if the core does not hold it)."""
        request = self.requests.get(request_id)
        if request is None:
            return None
        self._finish(request, reason)
        return request.final_outputs()

    def stop_at_string(self, stop: StopAtString) -> None:
        """End a sample where the output processor found a stop string (its tokens past that
        point dropped), freeing its blocks; the request is forgotten once complete. The sample
        may have ended on a token of the same step (``max_tokens``): the string wins."""
        self.generated_tokens -= stop.num_dropped
        request = self.requests.get(stop.request_id)
        if request is None:  # that token completed the request
            return
        seq = request.samples[stop.index].seq
        request.stop_at_string(seq, stop.num_output_tokens, stop.stop)
        if not seq.is_finished:
            self.scheduler.finish(seq)
        if request.is_complete:
            del self.requests[request.request_id]

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    # -- one step --------------------------------------------------------------------
    def step(self) -> list[EngineCoreOutput]:
        """Run one iteration; returns an output per sample that got tokens or finished.

        An exception while handling one request (forking its samples, appending a token,
        a beam step) fails that request only: its output carries the error. Any other
        exception (the forward pass, the sampler) leaves the whole step in doubt: it is
        logged with a one-line summary of the step (sizes and request ids, never text) and
        raised.
        """
        return self.finish_step(self.launch_step())

    def launch_step(self) -> LaunchedStep | None:
        """``step``'s first half: schedule, pack, plan and start the forward and sampling;
        on a GPU it returns while they still run (``None``: nothing to run). The caller may
        do host work (``LLMEngine``'s ``async_scheduling``), then must ``finish_step`` it
        before anything else changes the core's state but ``stop_at_string`` and
        ``abort_request``, whose samples' tokens of this step are then dropped."""
        start = time.perf_counter()
        if self.model.long_rope_switch is not None:
            rotate_long(self.scheduler.running, self.kv, self.model.long_rope_switch)
        sched = self.scheduler.schedule(self.pacer.budget(self.scheduler.num_decodes_in_flight,
                                                          self.executor.next_team()))
        if sched.is_empty:
            return None
        # As vLLM's scheduler does: the blocks this step caches (and evicts) go out before the
        # forward, so routers learn where a prefix lives while it is still being computed.
        self.publish_kv_events()
        try:
            packed = self.pack(sched)
            plan = self.plan_sampling(sched, packed)
            output = self.execute_model(packed, sched, plan.sampling)
        except Exception:
            logger.error("engine step failed: %s", sched.describe())
            raise
        self._count_computed(sched)
        if self.ahead is not None:
            self.ahead.hold_places(plan, output)
        return LaunchedStep(sched, plan, output, start)

    def finish_step(self, launched: LaunchedStep | None) -> list[EngineCoreOutput]:
        """``step``'s second half: wait for the sampled tokens and update from them."""
        if launched is None:
            return []
        sched = launched.sched
        try:
            outputs = self.update_from_output(launched.plan, launched.output.wait())
            self.publish_kv_events()
            if self.speculation is not None:
                self.speculation.propose(self.scheduler.running)
        except Exception:
            logger.error("engine step failed: %s", sched.describe())
            raise
        self.pacer.observe(len(sched.scheduled), sched.num_tokens,
                           time.perf_counter() - launched.started, self.executor.last_team)
        return outputs

    def pack(self, sched: SchedulerOutput) -> PackedBatch:
        """The step as the runner reads it (``pack_batch``): rows, positions, slots, block
        tables and the logits layout."""
        batch = step_inputs(sched, self.kv, self._lora_slot)
        long_rows = 0 if self.model.long_rope_switch is None else self.model.max_model_len
        packed = pack_batch(batch, self.config.block_size,
                            bucketed=self.executor.prefers_bucketed_batches,
                            long_rope_rows=long_rows)
        if self.lora_slots is not None:
            packed.lora_loads = tuple((slot, self.loras[lora_id])
                                      for slot, lora_id in self.lora_slots.take_loads())
        if self.ahead is not None:
            packed.ahead = self.ahead.tokens_for(sched, packed)
        return packed

    def _lora_slot(self, lora_id: int | None) -> int:
        return -1 if self.lora_slots is None else self.lora_slots.slot(lora_id)

    # -- LoRA adapters (the front end checks them first: ``LLMEngine.add_lora``) ----------
    def add_lora(self, request: LoRARequest) -> None:
        self.loras[request.lora_int_id] = request
        if self.kv_events is not None:
            self.kv_events.name_lora(request.lora_int_id, request.lora_name)

    def remove_lora(self, lora_id: int) -> bool:
        """Forget adapter ``lora_id`` unless a request still runs or waits under it."""
        if lora_id not in self.loras or any(r.lora_id == lora_id for r in self.requests.values()):
            return False
        del self.loras[lora_id]
        self.lora_slots.release(lora_id)
        return True

    def plan_sampling(self, sched: SchedulerOutput, packed: PackedBatch) -> StepPlan:
        """Ask the request of every sequence that computes its last token this step what its
        logits row is for (``SequenceGroup.plan_sampling``), and lay the answers out: the
        rows to sample, the rows to hand back raw, the decisions to apply after the forward.
        A request that raises here fails alone (after the forward)."""
        plan = StepPlan()
        for item, logit_row in zip(sched.scheduled, packed.first_logits_row.tolist()):
            seq, request = item.seq, item.seq.request
            if logit_row < 0 or request.request_id in plan.failed:
                continue
            if seq.num_output_tokens == 0 and seq.sample_index == 0:
                request.num_cached_tokens = seq.num_cached_tokens
            try:
                decision = request.plan_sampling(seq)
            except Exception as exc:
                plan.failed[request.request_id] = (request, exc)
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

    def update_from_output(self, plan: StepPlan, output: SamplerOutput) -> list[EngineCoreOutput]:
        """Apply the planned decisions (forks of ``n > 1`` samples); hand kept rows to their
        requests (beam steps) and apply those decisions; append the sampled tokens (into
        their placeholders, under ``schedule_ahead``), verifying any drafts; free the finished.

        Outputs come in this order: requests that failed deciding, beam searches that a
        decision ended, then the samples that got tokens (or failed appending them)."""
        outputs = [self._fail_request(request, exc) for request, exc in plan.failed.values()]
        for decision in plan.decisions:
            self._apply(decision)
        outputs += self._hand_back_logits(plan.sampling, output.kept_logits)
        if plan.sampling.rows:
            outputs += self._accept_tokens(plan.sampling.targets, output.token_ids,
                                           output.logprobs)
        return outputs

    def _count_computed(self, sched: SchedulerOutput) -> None:
        now = time.monotonic()
        for item in sched.scheduled:
            item.seq.num_computed_tokens += item.num_new_tokens
            request = item.seq.request
            if request.first_scheduled_time is None:
                request.first_scheduled_time = now

    def _hand_back_logits(self, plan: SamplingPlan,
                          kept_logits: torch.Tensor | None) -> list[EngineCoreOutput]:
        """Each kept row to its request (``take_logits``); apply the decisions. Returns the
        final outputs of the searches a decision ended, and of requests that raised."""
        outputs = []
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
                del self.requests[request.request_id]
                outputs += request.final_outputs()
        return outputs

    def _apply(self, decision: GroupDecision) -> None:
        """Forks first (children share their parents' blocks and computed tokens), then frees."""
        for parent, child in decision.forks:
            child.num_computed_tokens = parent.num_computed_tokens
            self.kv.fork(parent, child)
            self.scheduler.add_running(child)
        for seq in decision.freed:
            self.scheduler.finish(seq)
        self.generated_tokens += decision.num_tokens

    def _accept_tokens(self, targets: list[Sequence], tokens: list[int],
                       logprobs: list) -> list[EngineCoreOutput]:
        """Append each target's tokens: its one sampled token, or, if it carried drafts, those
        speculative decoding verifies; free the finished and forget complete requests."""
        outputs = []
        end = 0
        for seq in targets:
            request, num_drafts = seq.request, len(seq.spec_token_ids)
            start, end = end, end + 1 + num_drafts
            if seq.is_finished:  # its request failed on an earlier sample of this step
                continue
            keep = self.speculation.verify(seq, tokens[start:end]) if num_drafts else 1
            try:
                appended = self._append_tokens(seq, tokens[start:start + keep])
            except Exception as exc:
                outputs.append(self._fail_request(request, exc))
                continue
            outputs.append(request.core_output(
                seq.sample_index, new_token_ids=appended,
                new_logprobs=logprobs[start:start + len(appended)],
                finish_reason=seq.finish_reason, stop_reason=seq.stop_reason))
            if seq.finish_reason is not None:
                self.scheduler.finish(seq)
                if request.is_complete:
                    del self.requests[request.request_id]
            elif num_drafts:  # the last kept token and the rejected drafts are not in the cache
                seq.num_computed_tokens = seq.num_tokens - 1
                self.kv.free_blocks_past_computed(seq)
        return outputs

    def _append_tokens(self, seq: Sequence, tokens: list[int]) -> list[int]:
        """Append verified tokens one by one until one finishes ``seq`` (the core's stop
        conditions); returns those appended (the rest are dropped)."""
        request, appended = seq.request, 0
        while appended < len(tokens):
            appended += 1
            if request.append_token(seq, tokens[appended - 1]):
                break
        self.generated_tokens += appended
        return tokens[:appended]

    def _finish(self, request: SequenceGroup, reason: str) -> None:
        """Forget ``request``; its unfinished samples end with ``reason`` and free their blocks."""
        self.requests.pop(request.request_id, None)
        request.abort(reason)
        for seq in request.sequences:
            if not seq.is_finished:
                self.scheduler.finish(seq)

    def _fail_request(self, request: SequenceGroup, exc: Exception) -> EngineCoreOutput:
        """Fail ``request`` after ``exc`` was raised handling it; no other request is touched.
        Logs the traceback, frees its blocks; its output carries ``exc``."""
        logger.error("request %s failed; the engine goes on with the other requests",
                     request.request_id, exc_info=exc)
        self._finish(request, "error")
        return request.core_output(finish_reason="error", error=exc)

    # -- the rest of the engine's life -----------------------------------------------
    def reset_prefix_cache(self) -> None:
        """Forget every prefix-cached block that no request holds."""
        self.kv.reset_prefix_cache()
        self.publish_kv_events()

    def publish_kv_events(self) -> None:
        """Hand the prefix cache's events since the last call to the publisher, as one batch
        (a step publishes after scheduling and, if updating it made more, at its end)."""
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

    def check_health(self) -> None:
        """Raises if the core can no longer run steps (e.g. a tensor-parallel worker died)."""
        self.executor.check_health()

    def look_while_idle(self) -> None:
        """Between requests: let the executor keep its view of the machine current."""
        self.executor.next_team()

    def shutdown(self) -> None:
        """Stop the executor's worker processes and the KV-event publisher (idempotent; also
        run when the core is collected)."""
        self._finalizer()


def _shut_down(executor, kv_events) -> None:
    executor.shutdown()
    if kv_events is not None:
        kv_events.shutdown()
