"""``SchedulingFields``: what the scheduler reads of a request, whatever its kind.

``Request`` (sampling) and ``BeamSearchRequest`` both inherit these fields, so the
waiting queue (``waiting_queue.py``) and the scheduler's choice of preemption
victim read them from any request. They are set once, when ``LLMEngine.make_request``
builds the request (``AsyncEngine.generate`` passes the caller's values there), and
never change afterwards: a sequence's place in the waiting queue is keyed by them.

Invariant: ``priority`` is an ``int`` in ``[-2**31, 2**31]`` (checked on construction).
"""
from __future__ import annotations

from dataclasses import dataclass

from .exceptions import ParamValidationError


@dataclass(kw_only=True, eq=False)  # eq=False: kinds keep their own ==
class SchedulingFields:
    priority: int = 0  # vLLM's: lower is scheduled first (scheduling_policy "priority")
    tenant: str | None = None  # who sent it (the OpenAI ``user``), for tenant_fairness

    def __post_init__(self) -> None:
        priority = self.priority
        if isinstance(priority, bool) or not isinstance(priority, int) or abs(priority) > 2**31:
            raise ParamValidationError(
                f"priority must be an integer in [-2**31, 2**31], got {priority!r}", "priority")
