"""``bench throughput --concurrency 1``: every system serves one request at a time.

The lone-user comparison: ``run_one_at_a_time`` hands a system its requests one
per ``run`` call, in order, each finished before the next is handed over, so no
system can batch. The same driver serves every system (paged-core, the
``transformers`` baselines, vLLM, llama.cpp), so they all see the same sequence.

The result's ``seconds`` is the sum of the system's own timings of its single
requests (set-up a system does around a call, such as paged-core's prefix-cache
reset or vLLM's line protocol, is not timed, as in a full run). Its extras are
the last call's (constants, running totals) with the per-call amounts summed.
"""
from __future__ import annotations

from .systems import RunResult, make_result
from .workload import BenchRequest

# Extras that measure one call, so a run's value is the sum over its calls.
PER_CALL_EXTRAS = ("decode_seconds", "decode_steps", "server_seconds")


def run_one_at_a_time(system, requests: list[BenchRequest]) -> RunResult:
    """``system.run([r])`` for each request in turn, combined into one ``RunResult``."""
    parts = [system.run([request]) for request in requests]
    extra = dict(parts[-1].extra)
    extra.update({key: sum(p.extra[key] for p in parts) for key in PER_CALL_EXTRAS if key in extra})
    return make_result(system.name, sum(p.seconds for p in parts), requests,
                       sum(p.computed_tokens for p in parts), **extra)
