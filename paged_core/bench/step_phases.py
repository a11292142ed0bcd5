"""``PhaseTimer``: seconds one ``LLMEngine`` spends in each phase of each step.

Installed on an engine instance (``with PhaseTimer(engine) as timer``), it wraps the
calls that ``LLMEngine.step`` makes and records, per step, how long each phase took:

- ``schedule``: ``Scheduler.schedule``;
- ``prepare``: ``pack`` (packing the batch) and ``execute_model`` less the model's calls
  and the sampler: host to device copies, copy-on-write block copies, the tensor-parallel
  broadcast;
- ``attention``: the attention backend's calls in every layer (``write_kv``, ``attend``);
  where the layers run as one C++ call (``models.cpu_decoder_stack``) attention happens
  inside it and is counted in ``forward``;
- ``forward``: the rest of the model's forward: embedding, projections, MLP, norms, rotary;
- ``logits``: the LM head on the sampled rows (``model.compute_logits``);
- ``sample``: the sampler (penalties, masks, greedy or random draws, log-probabilities),
  run by rank 0's worker inside ``execute_model``;
- ``update``: ``plan_sampling`` (each request's decision, the sampling rows laid out) and
  ``update_from_output`` (applying decisions, appending tokens, detokenizing, stop checks,
  freeing finished sequences, making outputs);
- ``other``: the rest of ``step`` (speculative proposals, the step-cost fit).

Invariant: a step's phases add up to its wall time (``other`` is the remainder). On a
CUDA device the model phases synchronize before they stop their clock, so kernel time is
charged to the phase that launched it. Leaving the ``with`` block restores every wrapped
call.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

_MISSING = object()
PHASES = ("schedule", "prepare", "attention", "forward", "logits", "sample", "update", "other")


@dataclass
class StepRecord:
    """One engine step: its batch and the seconds of each phase."""

    num_seqs: int = 0
    num_decodes: int = 0  # sequences that computed exactly one new token
    num_tokens: int = 0  # new tokens scheduled (prompt chunks + decodes)
    num_rows: int = 0  # rows the model computed (padding of bucketed batches included)
    num_context_tokens: int = 0  # tokens of context the step's attention reads, all sequences
    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))

    @property
    def kind(self) -> str:
        """``decode`` when every sequence decodes one token, else ``mixed`` (prompt chunks)."""
        return "decode" if self.num_decodes == self.num_seqs else "mixed"

    @property
    def total_s(self) -> float:
        return sum(self.seconds.values())

    def as_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "num_seqs": self.num_seqs, "num_tokens": self.num_tokens,
                "num_rows": self.num_rows, "num_context_tokens": self.num_context_tokens,
                "seconds": self.seconds}


class PhaseTimer:
    """Context manager: while active, every ``engine.step()`` appends a ``StepRecord`` to
    ``steps`` (steps that scheduled nothing are left out)."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self.steps: list[StepRecord] = []
        self._current = StepRecord()
        self._sync: Callable[[], None] = (
            torch.cuda.synchronize if engine.core.model.device.type == "cuda" else lambda: None)
        self._patched: list[tuple[Any, str, Any]] = []  # (owner, name, its own attribute)

    def __enter__(self) -> "PhaseTimer":
        engine, core = self.engine, self.engine.core
        model, backend = core.executor.runner.model, core.executor.runner.backend
        self._patch(core.scheduler, "schedule", self._timed_schedule)
        self._patch(core, "pack", self._phase("prepare"))
        self._patch(core, "execute_model", self._phase("prepare"))
        self._patch(model, "forward", self._timed_forward)
        self._patch(backend, "write_kv", self._phase("attention", sync=True))
        self._patch(backend, "attend", self._phase("attention", sync=True))
        self._patch(model, "compute_logits", self._phase("logits", sync=True))
        self._patch(core, "plan_sampling", self._phase("update"))
        self._patch(core, "update_from_output", self._phase("update"))
        self._patch(engine.output_processor, "process_outputs", self._phase("update"))
        self._patch(core.executor.worker.sampler, "launch", self._phase("sample", sync=True))
        self._patch(engine, "step", self._timed_step)
        return self

    def __exit__(self, *exc) -> None:
        for owner, name, own in reversed(self._patched):
            if own is _MISSING:
                delattr(owner, name)  # the class's method shows through again
            else:
                setattr(owner, name, own)
        self._patched.clear()

    def _patch(self, owner: Any, name: str, make: Callable[[Callable], Callable]) -> None:
        self._patched.append((owner, name, vars(owner).get(name, _MISSING)))
        setattr(owner, name, make(getattr(owner, name)))

    def _phase(self, phase: str, sync: bool = False) -> Callable[[Callable], Callable]:
        """Charge a call's time to ``phase``, less what the phases timed inside it took."""
        def make(fn: Callable) -> Callable:
            def timed(*args: Any, **kwargs: Any) -> Any:
                inner_before = self._current.total_s
                start = time.perf_counter()
                try:
                    return fn(*args, **kwargs)
                finally:
                    if sync:
                        self._sync()
                    inner = self._current.total_s - inner_before
                    self._current.seconds[phase] += time.perf_counter() - start - inner
            return timed
        return make

    def _timed_schedule(self, fn: Callable) -> Callable:
        schedule = self._phase("schedule")(fn)

        def timed(*args: Any, **kwargs: Any) -> Any:
            sched = schedule(*args, **kwargs)
            record = self._current
            record.num_seqs = len(sched.scheduled)
            record.num_decodes = sum(item.num_new_tokens == 1 for item in sched.scheduled)
            record.num_tokens = sched.num_tokens
            record.num_context_tokens = sum(item.seq.num_computed_tokens + item.num_new_tokens
                                            for item in sched.scheduled)
            return sched
        return timed

    def _timed_forward(self, fn: Callable) -> Callable:
        forward = self._phase("forward", sync=True)(fn)

        def timed(input_ids: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            self._current.num_rows = input_ids.shape[0]
            return forward(input_ids, *args, **kwargs)
        return timed

    def _timed_step(self, fn: Callable) -> Callable:
        def timed(*args: Any, **kwargs: Any) -> Any:
            self._current = record = StepRecord()
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                record.seconds["other"] = max(0.0, time.perf_counter() - start - record.total_s)
                if record.num_seqs:  # an empty schedule ran nothing
                    self.steps.append(record)
        return timed
