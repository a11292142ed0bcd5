"""The scheduler's waiting queue: which waiting sequence is admitted next (no torch).

Order, from the outside in:

1. priority level: under ``policy="priority"`` the lowest ``request.priority``
   first (vLLM's rule); under ``"fcfs"`` every sequence is on one level;
2. tenant: with ``fair=True`` the tenants of a level (``request.tenant``) take
   turns, one admission each (round robin), so one client's burst cannot starve
   the others; without it every sequence belongs to one tenant;
3. within a tenant: arrival order (FCFS), except that a preempted sequence goes
   back to the front (``appendleft``) and its tenant to the front of the turn.

Layout: ``{level: OrderedDict{tenant: deque[Sequence]}}``; the first tenant
of a level's ``OrderedDict`` has the turn. Empty deques and levels are removed
at once, so ``peek``/``popleft`` are O(number of levels).

``__iter__`` yields the sequences in admission order (the order ``popleft``
would give if nothing changed). ``priority`` and ``tenant`` are the request's
``EngineRequest``'s: every request kind has them (sampling and beam search alike).
"""
from __future__ import annotations

from collections import OrderedDict, deque
from typing import Iterator

from .sequence import Sequence

POLICIES = ("fcfs", "priority")


class WaitingQueue:
    def __init__(self, policy: str = "fcfs", fair: bool = False) -> None:
        if policy not in POLICIES:
            raise ValueError(f"scheduling_policy must be one of {POLICIES}, got {policy!r}")
        self.policy = policy
        self.fair = fair
        self._levels: dict[int, OrderedDict[object, deque[Sequence]]] = {}
        self._size = 0

    def _key(self, seq: Sequence) -> tuple[int, object]:
        level = seq.request.priority if self.policy == "priority" else 0
        tenant = seq.request.tenant if self.fair else None
        return level, tenant

    def _tenant_queue(self, seq: Sequence) -> tuple[OrderedDict, object, deque[Sequence]]:
        level, tenant = self._key(seq)
        tenants = self._levels.setdefault(level, OrderedDict())
        if tenant not in tenants:
            tenants[tenant] = deque()
        return tenants, tenant, tenants[tenant]

    def append(self, seq: Sequence) -> None:
        """A new arrival: last of its tenant (a new tenant takes the last turn)."""
        _, _, queue = self._tenant_queue(seq)
        queue.append(seq)
        self._size += 1

    def appendleft(self, seq: Sequence) -> None:
        """A preempted sequence: first of its tenant, whose turn comes first in its level."""
        tenants, tenant, queue = self._tenant_queue(seq)
        queue.appendleft(seq)
        tenants.move_to_end(tenant, last=False)
        self._size += 1

    def peek(self) -> Sequence:
        """The sequence ``popleft`` would return (``IndexError`` if empty)."""
        if not self._size:
            raise IndexError("peek from an empty WaitingQueue")
        tenants = self._levels[min(self._levels)]
        return next(iter(tenants.values()))[0]

    def popleft(self) -> Sequence:
        """Take the next sequence; its tenant's turn moves to the end of its level."""
        level = min(self._levels)
        tenants = self._levels[level]
        tenant, queue = next(iter(tenants.items()))
        seq = queue.popleft()
        tenants.move_to_end(tenant)
        self._forget_if_empty(level, tenant)
        self._size -= 1
        return seq

    def remove(self, seq: Sequence) -> None:
        """Remove ``seq`` wherever it waits (``ValueError`` if it does not)."""
        level, tenant = self._key(seq)
        tenants = self._levels.get(level)
        if tenants is None or tenant not in tenants:
            raise ValueError(f"{seq!r} is not waiting")
        tenants[tenant].remove(seq)
        self._forget_if_empty(level, tenant)
        self._size -= 1

    def _forget_if_empty(self, level: int, tenant: object) -> None:
        tenants = self._levels[level]
        if not tenants[tenant]:
            del tenants[tenant]
            if not tenants:
                del self._levels[level]

    def __len__(self) -> int:
        return self._size

    def __iter__(self) -> Iterator[Sequence]:
        for level in sorted(self._levels):
            queues = [deque(q) for q in self._levels[level].values()]
            while queues:  # round robin, as popleft takes them
                queue = queues.pop(0)
                yield queue.popleft()
                if queue:
                    queues.append(queue)
